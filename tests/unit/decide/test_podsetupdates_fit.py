"""Pod set updates: the conflict message names the kind of field, and fitting to a pod drops
annotations it already carries (as it does labels)."""

from __future__ import annotations

import pytest

from tests.unit.builders import pod
from ungater._decide.podsetupdates import PodChanges, fit_to_pod, merge_updates
from ungater._model.views import PodSetUpdate, parse_pod


@pytest.mark.parametrize(
    ("attr", "word"),
    [("labels", "label"), ("annotations", "annotation"), ("node_selector", "node selector")],
)
def test_a_conflict_names_the_kind_of_field(attr: str, word: str) -> None:
    updates = [
        PodSetUpdate("a", "main", **{attr: {"k": "1"}}),
        PodSetUpdate("b", "main", **{attr: {"k": "2"}}),
    ]
    _, conflict = merge_updates(updates, "main")
    assert conflict.startswith(f"admission checks disagree on {word} 'k': ")


def test_fit_drops_annotations_the_pod_already_has() -> None:
    raw = pod("p")
    raw["metadata"].setdefault("annotations", {})["have"] = "1"
    fitted, conflict = fit_to_pod(
        PodChanges(annotations={"have": "1", "want": "2"}), parse_pod(raw)
    )
    assert conflict == ""
    assert fitted == PodChanges(annotations={"want": "2"})
