"""The example third-party distribution is found through the entry point, like any plugin."""

from __future__ import annotations

import importlib.metadata

from ungater._model.views import Kind
from ungater._plugins.registry import ENTRY_POINT_GROUP, PluginRegistry


def test_example_distribution_is_installed_with_its_entry_point() -> None:
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert "leaderworkerset" in eps, (
        "examples/ungater-leaderworkerset is not installed; `make install` installs it"
    )
    assert eps["leaderworkerset"].dist is not None
    assert eps["leaderworkerset"].dist.metadata["Name"] == "ungater-leaderworkerset"


def test_core_discovers_and_serves_the_third_party_kind() -> None:
    registry = PluginRegistry.discover()
    info = registry.plugins["leaderworkerset"]
    assert not info.error
    assert info.distribution == "ungater-leaderworkerset"
    handler = registry.handler(Kind("leaderworkerset.x-k8s.io", "LeaderWorkerSet"))
    assert handler.plugin.name == "leaderworkerset"
    assert set(registry.all_kinds()) >= {
        Kind("batch", "Job"),
        Kind("jobset.x-k8s.io", "JobSet"),
        Kind("ray.io", "RayCluster"),
    }


def test_allowlist_limits_what_loads(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UNGATER_PLUGINS", "job")
    registry = PluginRegistry.discover()
    assert list(registry.plugins) == ["job"]
