"""Each releaser alone (bench/kueue_run.py, bench/kueue_policy.py): the two sides' summaries
merged into one case, and the shipped policy bound to ungater's namespaces only."""

from __future__ import annotations

import math

from bench.kueue_policy import POLICY_FILE, RELEASER_LABEL, bound_policy
from bench.kueue_run import merged_summary
from bench.kueue_waits import Waits
from bench.stats import summarize


def test_each_sides_summary_merges_with_the_ratio_of_both() -> None:
    kueue = {"kueue": summarize([0.4, 0.6], "s"), "stalls": {"kueue": 1}, "missing": {"kueue": 0}}
    ours = {
        "ungater": summarize([0.1, 0.3], "s"),
        "stalls": {"ungater": 0},
        "missing": {"ungater": 2},
    }
    m = merged_summary([kueue, ours])
    assert m["stalls"] == {"kueue": 1, "ungater": 0}
    assert m["missing"] == {"kueue": 0, "ungater": 2}
    assert math.isclose(m["ratio_median"], 0.5 / 0.2)
    assert math.isclose(m["ratio_p95"], m["kueue"]["p95"] / m["ungater"]["p95"])


def test_a_side_without_samples_gives_no_ratio() -> None:
    empty = Waits({"ungater": "g"}).summary()
    m = merged_summary([{"kueue": summarize([0.4], "s"), "stalls": {"kueue": 0}}, empty])
    assert "ratio_median" not in m and m["ungater"]["n"] == 0


def test_the_shipped_policy_is_bound_to_ungaters_namespaces_and_otherwise_unchanged() -> None:
    import yaml

    shipped = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    bound = bound_policy(POLICY_FILE.read_text())
    kinds = {d["kind"]: d for d in bound}
    policy, binding = kinds["ValidatingAdmissionPolicy"], kinds["ValidatingAdmissionPolicyBinding"]
    assert policy == next(d for d in shipped if d["kind"] == policy["kind"])
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {"matchLabels": {RELEASER_LABEL: "ungater"}}
    shipped_binding = next(d for d in shipped if d["kind"] == binding["kind"])
    assert {k: v for k, v in binding["spec"].items() if k != "matchResources"} == shipped_binding[
        "spec"
    ]
