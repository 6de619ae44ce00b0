"""ungater.testing, the plugin authors' kit, on the built-in Job plugin: it runs the real
ownership proof, hooks and cap, and refuses a plugin the registry refuses."""

from __future__ import annotations

import types

import pytest
import ungater_plugins.job as job_plugin

from tests.objects import job_pod
from ungater._plugins.registry import PluginError
from ungater.plugin_api import hookimpl
from ungater.testing import PluginUnderTest, new_uid, owner_ref, slice_workload

JOB = ("batch", "Job")


def module(**hooks: object) -> types.ModuleType:
    """A plugin module made on the fly."""
    made = types.ModuleType("made_up_plugin")
    for name, fn in hooks.items():
        setattr(made, name, fn)
    return made


def job(parallelism: int) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml", "uid": new_uid("job", "train")},
        "spec": {"parallelism": parallelism, "completions": 6, "completionMode": "Indexed"},
    }


def test_decide_releases_the_admitted_count_in_the_plugins_order() -> None:
    owner = job(4)
    pods = [job_pod(owner, i, uid=new_uid("pod", str(i))) for i in (3, 0, 2, 1)]
    plugin = PluginUnderTest.from_module(job_plugin, JOB)
    outcome = plugin.decide(owner, pods, [slice_workload(owner, {"main": 4}, {"main": 2})])
    assert outcome.released == [pods[1]["metadata"]["name"], pods[3]["metadata"]["name"]]
    assert outcome.caps == {"main": 2}
    assert len(outcome.waiting) == 2 and "cap" in outcome.text()
    # not admitted: nothing
    pending = plugin.decide(owner, pods, [slice_workload(owner, {"main": 4})])
    assert pending.released == [] and pending.active_slice is None


def test_the_owners_own_size_bounds_the_cap_unless_asked_not_to() -> None:
    owner = job(1)
    pods = [job_pod(owner, i, uid=new_uid("pod", str(i))) for i in range(3)]
    plugin = PluginUnderTest.from_module(job_plugin, JOB)
    admitted = [slice_workload(owner, {"main": 3}, {"main": 3})]
    assert plugin.decide(owner, pods, admitted).caps == {"main": 1}
    assert plugin.decide(owner, pods, admitted, owner_size=False).caps == {"main": 3}
    assert plugin.desired_counts(owner) == {"main": 1}


def test_ownership_is_proven_by_uid_not_by_labels() -> None:
    owner = job(2)
    real = job_pod(owner, 0, uid=new_uid("pod", "0"))
    copied = job_pod(owner, 1, uid=new_uid("pod", "1"))
    copied["metadata"]["ownerReferences"] = [
        {**owner_ref(owner), "uid": new_uid("someone", "else")}
    ]
    plugin = PluginUnderTest.from_module(job_plugin, JOB)
    assert plugin.ownership(owner, [real, copied]) == ["proven", "foreign"]


def test_a_hook_answering_the_wrong_type_fails_as_in_production() -> None:
    hooks = {n: getattr(job_plugin, n) for n in dir(job_plugin) if n.startswith("ungater_")}
    hooks["ungater_pod_set"] = hookimpl(lambda owner, pod: 7)
    plugin = PluginUnderTest.from_module(module(**hooks), JOB)
    owner = job(1)
    with pytest.raises(PluginError, match="ungater_pod_set"):
        plugin.pod_set(owner, job_pod(owner, 0, uid=new_uid("pod", "0")))


def test_a_plugin_the_registry_rejects_is_an_assertion_error() -> None:
    bad = module(ungater_kinds=hookimpl(lambda: ["not a KindSpec"]))
    with pytest.raises(AssertionError, match="rejected"):
        PluginUnderTest.from_module(bad, JOB)
