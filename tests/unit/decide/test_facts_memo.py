"""The facts memo (ungater/_decide/assess.py, ``FactsMemo``): a decision asks the plugin again
only about pods whose view changed, and about every pod once anything else the answers are made
from changed: the owner, the owner's facts, the cached objects between."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ungater_plugins import job as job_plugin
from ungater_plugins import jobset as jobset_plugin
from ungater_plugins import rayjob as rayjob_plugin

from tests.unit.podfactory import job, job_pod, jobset, jobset_child_job
from ungater._decide.assess import FactsMemo, owner_facts_of, pod_facts
from ungater._decide.decision import Ownership
from ungater._decide.indexes import ObjectIndex
from ungater._model.views import Kind, parse_object, parse_pod
from ungater._plugins.registry import KindHandler, PluginRegistry
from ungater.plugin_api import VIA_FACTS
from ungater.testing import ref_of


def _counted(kind: Kind, module: Any) -> tuple[KindHandler, list[str]]:
    """The kind's handler, with every pod its plugin is asked about (``pod_set``) noted."""
    handler = PluginRegistry.from_modules({"p": module}).handler(kind)
    asked: list[str] = []
    inner: Callable[..., Any] = handler._pod_set

    def pod_set(**kwargs: Any) -> Any:
        asked.append(kwargs["pod"].name)
        return inner(**kwargs)

    handler._pod_set = pod_set
    return handler, asked


def test_only_pods_whose_view_changed_are_asked_about_again() -> None:
    handler, asked = _counted(Kind("batch", "Job"), job_plugin)
    j = job("train", parallelism=3)
    owner = ref_of(j)
    pods = [parse_pod(job_pod(j, index=i)) for i in range(3)]
    memo = FactsMemo()
    first = pod_facts(handler, owner, pods, {}, None, (memo, 0))
    assert len(asked) == 3
    again = pod_facts(handler, owner, pods, {}, None, (memo, 0))
    assert len(asked) == 3 and all(a is b for a, b in zip(first, again, strict=True))
    changed = [pods[0], parse_pod(job_pod(j, index=1)), pods[2]]  # the same pod, a new view
    pod_facts(handler, owner, changed, {}, None, (memo, 0))
    assert asked[3:] == [changed[1].name]
    # anything else the answers are made from: every pod asked again
    pod_facts(handler, owner, changed, {}, {"parallelism": 2}, (memo, 0))
    assert len(asked) == 3 + 1 + 3
    pod_facts(handler, owner, changed, {}, {"parallelism": 2}, (memo, 0))  # equal facts: kept
    assert len(asked) == 3 + 1 + 3
    pod_facts(handler, owner, changed, {}, {"parallelism": 2}, (memo, 1))
    assert len(asked) == 3 + 1 + 3 + 3
    other = ref_of(job("other", parallelism=3))
    pod_facts(handler, other, changed, {}, {"parallelism": 2}, (memo, 1))
    assert len(asked) == 3 + 1 + 3 + 3 + 3
    # no memo: asked every time, as explain does
    pod_facts(handler, owner, pods, {}, None)
    pod_facts(handler, owner, pods, {}, None)
    assert len(asked) == 13 + 6


def test_the_memo_keeps_the_last_owners_only_and_forgets_an_owner_gone() -> None:
    handler, asked = _counted(Kind("batch", "Job"), job_plugin)
    a, b = job("a", parallelism=1), job("b", parallelism=1)
    pa, pb = [parse_pod(job_pod(a, index=0))], [parse_pod(job_pod(b, index=0))]
    memo = FactsMemo(owners=1)
    pod_facts(handler, ref_of(a), pa, {}, None, (memo, 0))
    pod_facts(handler, ref_of(b), pb, {}, None, (memo, 0))  # a's facts make room for b's
    pod_facts(handler, ref_of(b), pb, {}, None, (memo, 0))  # the one owner it holds: b's
    assert len(asked) == 2
    pod_facts(handler, ref_of(a), pa, {}, None, (memo, 0))
    assert len(asked) == 3
    memo.forget(a["metadata"]["uid"])
    pod_facts(handler, ref_of(a), pa, {}, None, (memo, 0))
    assert len(asked) == 4


def test_a_child_job_gone_from_the_cache_unproves_its_pods_though_their_views_are_the_same() -> (
    None
):
    handler = PluginRegistry.from_modules({"jobset": jobset_plugin}).handler(
        Kind("jobset.x-k8s.io", "JobSet")
    )
    js = jobset("llm", {"workers": 1})
    child = jobset_child_job(js, "workers", 0)
    pods = [parse_pod(job_pod(child, index=0))]
    index, memo = ObjectIndex(), FactsMemo()
    index.keep(parse_object(child))
    [f] = pod_facts(handler, ref_of(js), pods, index.by_uid, None, (memo, index.version))
    assert f.ownership is Ownership.PROVEN
    index.forget(parse_object(child))  # the chain can no longer be proven
    [f] = pod_facts(handler, ref_of(js), pods, index.by_uid, None, (memo, index.version))
    assert f.ownership is not Ownership.PROVEN
    index.keep(parse_object(child))
    [f] = pod_facts(handler, ref_of(js), pods, index.by_uid, None, (memo, index.version))
    assert f.ownership is Ownership.PROVEN


def test_each_hook_is_asked_about_the_pod_with_its_owner() -> None:
    """The memo's answers are the hooks' for that very (owner, pod): a hook given another
    pod or no owner would give answers the memo then reuses."""
    handler = PluginRegistry.from_modules({"p": job_plugin}).handler(Kind("batch", "Job"))
    calls: list[tuple[str, Any, str]] = []
    for hook in ("_owns_pod", "_pod_set", "_sort_key", "_release_group"):
        inner: Callable[..., Any] = getattr(handler, hook)

        def record(hook: str = hook, inner: Callable[..., Any] = inner, **kw: Any) -> Any:
            calls.append((hook, kw["owner"], kw["pod"].name))
            return inner(**kw)

        setattr(handler, hook, record)
    j = job("train", parallelism=2)
    pods = [parse_pod(job_pod(j, index=i)) for i in range(2)]
    pod_facts(handler, ref_of(j), pods, {}, None, (FactsMemo(), 0))
    hooks = ("_owns_pod", "_pod_set", "_sort_key", "_release_group")
    assert sorted(calls, key=str) == sorted(
        [(h, ref_of(j), p.name) for h in hooks for p in pods], key=str
    )


def test_a_select_via_owners_facts_are_none_only_while_nothing_is_known() -> None:
    handler = PluginRegistry.from_modules({"rayjob": rayjob_plugin}).handler(
        Kind("ray.io", "RayJob")
    )
    assert owner_facts_of(handler, None, ()) is None
    assert owner_facts_of(handler, {}, ()) is None
    assert owner_facts_of(handler, {"suspend": False}, ()) == {"suspend": False, VIA_FACTS: {}}


def test_every_change_of_the_cached_objects_gives_a_version_never_seen_before() -> None:
    """The memo keys the answers on the objects index's version: a child Job arriving proves
    its pods, and a child Job gone then another object arriving never brings back a version
    the answers were kept under."""
    handler = PluginRegistry.from_modules({"jobset": jobset_plugin}).handler(
        Kind("jobset.x-k8s.io", "JobSet")
    )
    js = jobset("llm", {"workers": 1})
    child = parse_object(jobset_child_job(js, "workers", 0))
    unrelated = parse_object(jobset_child_job(jobset("other", {"workers": 1}), "workers", 0))
    pods = [parse_pod(job_pod(jobset_child_job(js, "workers", 0), index=0))]
    index, memo = ObjectIndex(), FactsMemo()

    def ownership() -> Ownership:
        [f] = pod_facts(handler, ref_of(js), pods, index.by_uid, None, (memo, index.version))
        return f.ownership

    index.keep(unrelated)
    assert ownership() is Ownership.UNRESOLVED  # the child Job not cached yet
    index.keep(child)
    assert ownership() is Ownership.PROVEN
    index.forget(child)
    index.keep(parse_object(jobset_child_job(jobset("third", {"workers": 1}), "workers", 0)))
    assert ownership() is not Ownership.PROVEN
