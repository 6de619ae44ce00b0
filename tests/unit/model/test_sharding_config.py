"""leaderElection.shardByNamespace: a shard's Lease comes from its gates and namespaces."""

from __future__ import annotations

from typing import Any

import pytest

from ungater._model.config import Config, default_lease_name, shard_lease_name


def config(namespaces: list[str], **le: Any) -> Config:
    raw = {"namespaces": namespaces, "leaderElection": {"shardByNamespace": True, **le}}
    return Config.model_validate(raw)


def test_replicas_of_one_shard_meet_whatever_the_order_of_its_namespaces() -> None:
    assert config(["b", "a"]).lease_name == config(["a", "b"]).lease_name


def test_different_namespace_sets_and_gates_get_different_leases() -> None:
    names = {
        config(["a"]).lease_name,
        config(["b"]).lease_name,
        config(["a", "b"]).lease_name,
        config(["a"], enabled=True).lease_name,
        Config.model_validate(
            {
                "gate": "example.com/other",
                "namespaces": ["a"],
                "leaderElection": {"shardByNamespace": True},
            }
        ).lease_name,
    }
    assert len(names) == 4  # the enabled=True one is the same shard as ["a"]


def test_a_shard_never_shares_the_unsharded_lease() -> None:
    gates = ["kueue.x-k8s.io/elastic-job"]
    unsharded = Config.model_validate({"namespaces": ["a"]}).lease_name
    assert unsharded == default_lease_name(gates)
    assert config(["a"]).lease_name == shard_lease_name(gates, ["a"]) != unsharded
    assert config(["a"]).lease_name.startswith(unsharded + "-a-")


def test_names_stay_valid_for_many_long_namespaces() -> None:
    many = [f"team-{i:02d}-" + "x" * 50 for i in range(40)]
    name = config(many).lease_name
    assert len(name) <= 253
    assert Config.model_validate({"leaderElection": {"leaseName": name}}).lease_name == name


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"leaderElection": {"shardByNamespace": True}}, "needs `namespaces`"),
        (
            {"namespaces": ["a"], "leaderElection": {"shardByNamespace": True, "leaseName": "x"}},
            "leave leaseName unset",
        ),
    ],
)
def test_a_shard_without_namespaces_or_with_a_typed_lease_name_is_refused(
    raw: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ValueError, match=needle):
        Config.model_validate(raw)


def test_what_check_config_prints_for_a_shard_loads_again_as_the_same_shard(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check-config` prints the derived leaseName; fed back, that file is the same shard."""
    from ungater._cli.main import main

    src = tmp_path / "shard.yaml"
    src.write_text("namespaces: [b, a]\nleaderElection: {shardByNamespace: true}\n")
    assert main(["check-config", str(src)]) == 0
    printed = capsys.readouterr().out
    again = tmp_path / "again.yaml"
    again.write_text(printed)
    assert main(["check-config", str(again)]) == 0
    assert capsys.readouterr().out == printed
    assert config(["a", "b"]).lease_name in printed
