"""Planted bugs the oracles must catch, in the plugins the controller runs with (never in the
oracles' own: ``oracles.truth_registry`` keeps the real plugins). A plugin is the one part
of the controller whose contract is the same whatever mechanism decides, so each plant works
against any commit's ``ungater/``.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from unittest import mock

from tests.explore import world as world_module
from tests.explore.kinds import KINDS
from ungater.plugin_api import hookimpl


def _module(kind: str, **hooks: Callable[..., Any]) -> types.ModuleType:
    """A copy of ``kind``'s plugin module with some hooks replaced."""
    real = KINDS[kind].module
    copy = types.ModuleType(f"planted_{real.__name__.rsplit('.', 1)[-1]}")
    for name, value in vars(real).items():
        if name.startswith("ungater_"):
            setattr(copy, name, value)
    for name, fn in hooks.items():
        setattr(copy, name, hookimpl(fn))
    return copy


def _plugin_name(kind: str) -> str:
    return str(KINDS[kind].module.__name__.rsplit(".", 1)[-1])


@contextmanager
def plant(kind: str, **hooks: Callable[..., Any]) -> Iterator[None]:
    """The controller runs with ``kind``'s plugin changed by ``hooks`` for the block."""
    planted = world_module.registry(**{_plugin_name(kind): _module(kind, **hooks)})
    with mock.patch.object(world_module, "REGISTRY", planted):
        yield


def oversized(kind: str) -> Any:
    """The owner's size read one too high: a controller that releases over it."""
    real = KINDS[kind].module.ungater_desired_counts

    def ungater_desired_counts(owner_facts: Mapping[str, Any]) -> Mapping[str, int] | None:
        counts = real(owner_facts)
        return None if counts is None else {k: v + 1 for k, v in counts.items()}

    return plant(kind, ungater_desired_counts=ungater_desired_counts)


def stalled(kind: str, index: int = 1) -> Any:
    """A stall: pods at completion (replica) index ``index`` or above are never mapped to a
    pod set, so no reconcile releases them, whatever the slice admits."""
    real = KINDS[kind].module.ungater_pod_set

    def ungater_pod_set(pod: Any) -> str | None:
        labels = pod.labels
        for key in (
            "batch.kubernetes.io/job-completion-index",
            "ray.io/worker-group-replica-index",
        ):
            if key in labels and int(labels[key]) >= index:
                return None
        return real(pod)  # type: ignore[no-any-return]

    return plant(kind, ungater_pod_set=ungater_pod_set)
