"""The config file: defaults, YAML loading, and errors that name the file and the key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pydantic
import pytest
import yaml

from ungater._cli.configfile import ConfigError, load_config
from ungater._model.config import DEFAULT_GATE, Config, KindConfig

BUILTIN = {("batch", "Job"), ("jobset.x-k8s.io", "JobSet"), ("ray.io", "RayCluster")}


def _write(tmp_path: Path, text: str, name: str = "ungater.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


def _error(tmp_path: Path, text: str) -> str:
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    msg = str(info.value)
    assert str(p) in msg  # every error names the file
    return msg


# -- defaults -----------------------------------------------------------------------------------


def test_defaults() -> None:
    c = load_config(None)
    assert c == Config()
    assert DEFAULT_GATE == "kueue.x-k8s.io/elastic-job"
    assert c.gate == DEFAULT_GATE
    assert {(k.group, k.kind) for k in c.kinds} == BUILTIN
    assert len(c.kinds) == 3
    assert all(k.plugin is None and k.gate is None for k in c.kinds)
    assert all(c.gate_for(k) == DEFAULT_GATE for k in c.kinds)
    assert c.namespaces == []  # all namespaces
    assert c.require_elastic_annotation is True
    assert c.workload_api_versions == ["v1beta2", "v1beta1"]  # prefer v1beta2
    assert c.workers >= 1 and c.expectations_timeout_seconds > 0
    assert c.plugins.allow is None and c.plugins.fail_on_error is False
    assert c.logging.level == "INFO"
    # auto: release Kueue's own gate only behind an admission policy (ungater._controller.modes)
    assert c.mode == "auto" and all(k.mode is None for k in c.kinds)
    assert all(c.mode_for(k) == "auto" for k in c.kinds)


@pytest.mark.parametrize("mode", ["auto", "release", "audit"])
def test_each_mode_is_accepted_at_the_top_and_per_kind(tmp_path: Path, mode: str) -> None:
    text = f"mode: {mode}\nkinds: [{{group: batch, kind: Job, mode: {mode}}}, {{group: ray.io, kind: RayCluster}}]\n"
    c = load_config(_write(tmp_path, text))
    job, ray = c.kinds
    assert c.mode == job.mode == mode and ray.mode is None
    assert c.mode_for(job) == c.mode_for(ray) == mode
    assert c.patches_pods is (mode != "audit")  # auto may release: it needs pods/patch


def test_a_kind_without_a_mode_falls_back_to_the_top_level_one(tmp_path: Path) -> None:
    text = "kinds: [{group: batch, kind: Job, mode: release}, {group: ray.io, kind: RayCluster}]\n"
    c = load_config(_write(tmp_path, text))
    job, ray = c.kinds
    assert (c.mode_for(job), c.mode_for(ray)) == ("release", "auto")


def test_defaults_are_not_shared_between_instances() -> None:
    a, b = Config(), Config()
    assert a.kinds == b.kinds and a.kinds is not b.kinds


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing here\n", "---\n", "~\n"])
def test_empty_file_gives_defaults(tmp_path: Path, text: str) -> None:
    assert load_config(_write(tmp_path, text)) == Config()


# -- loading ----------------------------------------------------------------------------------


FULL = """\
gate: example.com/elastic
kinds:
  - group: batch
    kind: Job
    gate: kueue.x-k8s.io/elastic-job
  - group: leaderworkerset.x-k8s.io
    kind: LeaderWorkerSet
    plugin: lws
namespaces: [team-a, team-b]
requireElasticAnnotation: false
workloadApiVersions: [v1beta1]
workers: 8
expectationsTimeoutSeconds: 12.5
client:
  qps: 50
  burst: 100
  patchConcurrency: 4
  requestTimeoutSeconds: 5
watch:
  timeoutSeconds: 60
  silenceSeconds: 30
  backoffInitialSeconds: 0.1
  backoffMaxSeconds: 5
plugins:
  allow: [job, lws]
  failOnError: true
logging:
  level: debug
  format: json
"""


def test_full_yaml(tmp_path: Path) -> None:
    c = load_config(_write(tmp_path, FULL))
    assert c.gate == "example.com/elastic"
    job, lws = c.kinds
    assert (job.group, job.kind, job.gate, job.plugin) == ("batch", "Job", DEFAULT_GATE, None)
    assert c.gate_for(job) == DEFAULT_GATE
    assert (lws.group, lws.kind, lws.plugin) == (
        "leaderworkerset.x-k8s.io",
        "LeaderWorkerSet",
        "lws",
    )
    assert c.gate_for(lws) == "example.com/elastic"
    assert c.namespaces == ["team-a", "team-b"]
    assert c.require_elastic_annotation is False
    assert c.workload_api_versions == ["v1beta1"]
    assert (c.workers, c.expectations_timeout_seconds) == (8, 12.5)
    assert (c.client.qps, c.client.burst, c.client.patch_concurrency) == (50, 100, 4)
    assert c.client.request_timeout_seconds == 5
    assert (c.watch.timeout_seconds, c.watch.silence_seconds) == (60, 30)
    assert (c.watch.backoff_initial_seconds, c.watch.backoff_max_seconds) == (0.1, 5)
    assert c.plugins.allow == ["job", "lws"] and c.plugins.fail_on_error is True
    assert (c.logging.level, c.logging.format) == ("DEBUG", "json")


def test_dump_round_trips(tmp_path: Path) -> None:
    c = load_config(_write(tmp_path, FULL))
    dumped = c.dump()
    assert "requireElasticAnnotation" in dumped and "require_elastic_annotation" not in dumped
    again = load_config(_write(tmp_path, yaml.safe_dump(dumped), "again.yaml"))
    assert again == c
    assert load_config(_write(tmp_path, yaml.safe_dump(Config().dump()), "d.yaml")) == Config()


def test_partial_file_keeps_other_defaults(tmp_path: Path) -> None:
    c = load_config(_write(tmp_path, "namespaces: [ml]\nwatch: {silenceSeconds: 10}\n"))
    assert c.namespaces == ["ml"]
    assert (
        c.watch.silence_seconds == 10 and c.watch.timeout_seconds == Config().watch.timeout_seconds
    )
    assert {(k.group, k.kind) for k in c.kinds} == BUILTIN


def test_core_group_kind(tmp_path: Path) -> None:
    c = load_config(_write(tmp_path, 'kinds: [{group: "", kind: Pod}]\n'))
    assert [(k.group, k.kind) for k in c.kinds] == [("", "Pod")]


def test_path_may_be_a_string(tmp_path: Path) -> None:
    assert load_config(str(_write(tmp_path, "workers: 2\n"))).workers == 2


def test_config_is_frozen() -> None:
    c = Config()
    with pytest.raises(pydantic.ValidationError):
        c.workers = 9  # type: ignore[misc]


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param("gates: x\n", "gates", id="top-level-typo"),
        pytest.param("watch:\n  timeoutSecond: 60\n", "watch.timeoutSecond", id="nested"),
        pytest.param(
            "kinds:\n  - group: batch\n    kind: Job\n    gat: x\n", "kinds[0].gat", id="in-list"
        ),
        pytest.param(
            "kinds:\n  - {group: batch, kind: Job}\n  - {group: ray.io, kind: RayCluster, colour: red}\n",
            "kinds[1].colour",
            id="second-list-item",
        ),
        pytest.param("logging: {level: INFO, colour: true}\n", "logging.colour", id="logging"),
    ],
)
def test_unknown_keys_rejected_with_path(tmp_path: Path, text: str, where: str) -> None:
    msg = _error(tmp_path, text)
    assert f": {where}: unknown key" in msg


def test_every_error_is_listed(tmp_path: Path) -> None:
    msg = _error(tmp_path, "bogus: 1\nworkers: 0\nwatch: {nope: 2}\n")
    lines = msg.splitlines()
    assert len(lines) == 3
    assert any(": bogus: unknown key" in ln for ln in lines)
    assert any(": watch.nope: unknown key" in ln for ln in lines)
    assert any(": workers: " in ln and "greater than or equal to 1" in ln for ln in lines)


@pytest.mark.parametrize(
    ("text", "where", "need"),
    [
        pytest.param("workers: four\n", "workers", "valid integer", id="workers-string"),
        pytest.param("workers: 0\n", "workers", "greater than or equal to 1", id="workers-zero"),
        pytest.param("workers: 2.5\n", "workers", "integer", id="workers-fraction"),
        pytest.param("gate: ''\n", "gate", "at least 1 character", id="gate-empty"),
        pytest.param("gate: 5\n", "gate", "valid string", id="gate-int"),
        pytest.param("namespaces: ml\n", "namespaces", "valid list", id="namespaces-string"),
        pytest.param("kinds: {group: batch}\n", "kinds", "valid list", id="kinds-map"),
        pytest.param(
            "kinds: [{kind: Job}]\n", "kinds[0].group", "Field required", id="kind-no-group"
        ),
        pytest.param(
            "kinds: [{group: batch, kind: ''}]\n", "kinds[0].kind", "at least 1", id="kind-empty"
        ),
        pytest.param("client: {qps: -1}\n", "client.qps", "greater than 0", id="qps-negative"),
        pytest.param(
            "client: {patchConcurrency: 5000}\n",
            "client.patchConcurrency",
            "less than",
            id="pc-big",
        ),
        pytest.param(
            "watch: {timeoutSeconds: 5}\n", "watch.timeoutSeconds", "greater than", id="watch-short"
        ),
        pytest.param("logging: {level: verbose}\n", "logging.level", "DEBUG", id="level"),
        pytest.param("logging: {format: xml}\n", "logging.format", "text", id="format"),
        pytest.param(
            "workloadApiVersions: [v1]\n", "workloadApiVersions[0]", "v1beta2", id="version"
        ),
        pytest.param(
            "workloadApiVersions: []\n", "workloadApiVersions", "at least 1", id="versions-empty"
        ),
        pytest.param("plugins: {allow: job}\n", "plugins.allow", "valid list", id="allow-string"),
        pytest.param(
            "expectationsTimeoutSeconds: 0\n",
            "expectationsTimeoutSeconds",
            "greater than 0",
            id="exp-zero",
        ),
        pytest.param("client: 3\n", "client", "valid dictionary", id="section-not-a-map"),
        pytest.param("mode: relase\n", "mode", "'auto', 'release' or 'audit'", id="mode-typo"),
        pytest.param(
            "kinds: [{group: batch, kind: Job, mode: on}]\n",
            "kinds[0].mode",
            "'auto', 'release' or 'audit'",
            id="kind-mode",
        ),
    ],
)
def test_bad_values(tmp_path: Path, text: str, where: str, need: str) -> None:
    msg = _error(tmp_path, text)
    assert f": {where}: " in msg and need in msg, msg


def test_duplicate_kinds(tmp_path: Path) -> None:
    msg = _error(
        tmp_path,
        "kinds:\n  - {group: batch, kind: Job}\n  - {group: batch, kind: Job, plugin: other}\n",
    )
    assert "kind Job.batch is listed twice" in msg


def test_same_kind_name_in_other_group_is_not_a_duplicate(tmp_path: Path) -> None:
    c = load_config(
        _write(tmp_path, "kinds: [{group: batch, kind: Job}, {group: x.io, kind: Job}]\n")
    )
    assert len(c.kinds) == 2


def test_duplicate_namespaces(tmp_path: Path) -> None:
    assert "namespaces must not repeat" in _error(tmp_path, "namespaces: [a, b, a]\n")


def test_duplicate_kinds_in_code() -> None:
    with pytest.raises(pydantic.ValidationError, match="listed twice"):
        Config(kinds=[KindConfig(group="batch", kind="Job"), KindConfig(group="batch", kind="Job")])


@pytest.mark.parametrize(
    ("text", "got"),
    [
        pytest.param("- gate: x\n", "list", id="list"),
        pytest.param("hello\n", "str", id="scalar"),
        pytest.param("42\n", "int", id="int"),
    ],
)
def test_non_mapping_top_level(tmp_path: Path, text: str, got: str) -> None:
    msg = _error(tmp_path, text)
    assert f"expected a mapping at the top level, got {got}" in msg


def test_invalid_yaml(tmp_path: Path) -> None:
    assert "not valid YAML" in _error(tmp_path, "kinds: [\n")


def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="cannot read") as info:
        load_config(p)
    assert str(p) in str(info.value)
    assert "No such file" in str(info.value)


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read") as info:
        load_config(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    p = tmp_path / "latin1.yaml"
    p.write_bytes("gate: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert str(p) in str(info.value)


def test_empty_kind_gate_is_rejected(tmp_path: Path) -> None:
    msg = _error(tmp_path, "kinds: [{group: batch, kind: Job, gate: ''}]\n")
    assert "kinds[0].gate" in msg


def test_level_is_case_insensitive(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "logging: {level: warning}\n")).logging.level == "WARNING"


# -- what can never work is refused -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where", "need"),
    [
        pytest.param("gate: 'two words'\n", "gate", "not a qualified name", id="gate-space"),
        pytest.param("gate: a/b/c\n", "gate", "not a DNS-1123 subdomain", id="gate-two-slashes"),
        pytest.param("gate: /hold\n", "gate", "prefix before '/' is empty", id="gate-no-prefix"),
        pytest.param("gate: example.com/\n", "gate", "the name is empty", id="gate-no-name"),
        pytest.param(f"gate: x/{'a' * 64}\n", "gate", "at most 63", id="gate-long"),
        pytest.param(
            "kinds: [{group: batch, kind: Job, gate: 'x/-bad'}]\n",
            "kinds[0].gate",
            "start and end with a letter or digit",
            id="kind-gate",
        ),
        pytest.param("namespaces: [Team-A]\n", "namespaces[0]", "DNS-1123 label", id="ns-upper"),
        pytest.param(
            f"namespaces: [{'a' * 64}]\n", "namespaces[0]", "DNS-1123 label", id="ns-long"
        ),
        pytest.param(
            "kinds: [{group: Batch_Group, kind: Job}]\n",
            "kinds[0].group",
            "DNS-1123 subdomain",
            id="group",
        ),
        pytest.param(
            "kinds: [{group: batch, kind: '9Job'}]\n", "kinds[0].kind", "kind name", id="kind"
        ),
        pytest.param(
            "requireElasticAnnotation: 'true'\n",
            "requireElasticAnnotation",
            "valid boolean",
            id="bool-string",
        ),
        pytest.param(
            "requireElasticAnnotation: yes\n",
            "requireElasticAnnotation",
            "valid boolean",
            id="bool-yaml11-yes",
        ),
        pytest.param("workers: true\n", "workers", "valid integer", id="int-bool"),
        pytest.param("workers: '4'\n", "workers", "valid integer", id="int-string"),
        pytest.param(
            "expectationsTimeoutSeconds: 86400\n",
            "expectationsTimeoutSeconds",
            "less than or equal to 3600",
            id="timeout-absurd",
        ),
        pytest.param(
            "leaderElection: {leaseName: Not_A_Name}\n",
            "leaderElection.leaseName",
            "DNS-1123 subdomain",
            id="lease-name",
        ),
        pytest.param(
            "leaderElection: {namespace: 'kube system'}\n",
            "leaderElection.namespace",
            "DNS-1123 label",
            id="lease-namespace",
        ),
    ],
)
def test_what_can_never_match_is_refused(tmp_path: Path, text: str, where: str, need: str) -> None:
    msg = _error(tmp_path, text)
    assert f": {where}: " in msg and need in msg, msg


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    msg = _error(tmp_path, "workers: 2\nclient:\n  qps: 5\n  qps: 50\nworkers: 3\n")
    assert "workers: given twice (lines 1 and 5)" in msg, msg
    assert "client.qps: given twice (lines 3 and 4)" in msg, msg


def test_yaml_1_1_words_stay_strings_where_strings_are_wanted(tmp_path: Path) -> None:
    """`on`, `no`, `y` are names (a namespace called `no`), not booleans."""
    c = load_config(_write(tmp_path, "namespaces: [on, no, y]\n"))
    assert c.namespaces == ["on", "no", "y"]
    assert (
        load_config(
            _write(tmp_path, "requireElasticAnnotation: false\n")
        ).require_elastic_annotation
        is False
    )


def test_valid_names_pass(tmp_path: Path) -> None:
    c = load_config(
        _write(
            tmp_path,
            """\
            gate: example.com/My_Gate.v2
            namespaces: [team-a, "0ml"]
            kinds: [{group: "", kind: Pod}, {group: batch, kind: Job, gate: plain-name}]
            """,
        )
    )
    assert c.gate == "example.com/My_Gate.v2"
    assert c.gates == ["example.com/My_Gate.v2", "plain-name"]


def test_lease_location_does_not_depend_on_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A laptop and a pod (POD_NAMESPACE set) compute the same Lease for the same gates; other
    gates get another Lease, a configured one wins."""
    from ungater._controller.manager import lease_name, lease_namespace
    from ungater._model.config import default_lease_name

    laptop = (lease_namespace(Config()), lease_name(Config()))
    monkeypatch.setenv("POD_NAMESPACE", "ungater-system")
    assert (lease_namespace(Config()), lease_name(Config())) == laptop
    assert laptop == ("kube-system", default_lease_name([DEFAULT_GATE]))
    assert laptop[1].startswith("ungater-kueue-x-k8s-io-elastic-job-")
    assert len(laptop[1]) <= 63
    other = Config(gate="example.com/hold")
    assert lease_name(other) != laptop[1]
    same_gates = Config(kinds=[KindConfig(group="batch", kind="Job")])
    assert lease_name(same_gates) == laptop[1]  # the gates decide, not the kinds
    mine = Config.model_validate({"leaderElection": {"namespace": "ops", "leaseName": "mine"}})
    assert (lease_namespace(mine), lease_name(mine)) == ("ops", "mine")
