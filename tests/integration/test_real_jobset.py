"""JobSets under the real JobSet controller v0.12.0 (``ElasticJobSet`` on) and the real Kueue.

Kueue v0.17.0 makes slices for an elastic JobSet and releases its own gate from their pods,
but its JobSet webhook does not add that gate: the template carries both gates here.  The pods
belong to child Jobs (pod -> Job -> JobSet); each replicated Job is one pod set of
replicas x min(parallelism, completions).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.k8s import JOBSETS, Kube
from tests.integration.realjobset import jobset, jobset_sizes, jobset_uid, n_pods, scale_jobset
from tests.integration.realpeers import UNGATER_GATE, kueue_pod_set, slice_watch
from tests.integration.support import config_for, running_controller
from tests.polling import eventually

# elastic JobSets: Kueue v0.19.2 refuses them (HTTP 403 "elastic job is not supported")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.kueue_version("v0.17.1"),
]


@pytest.mark.kueue_quota(cpu=8)
async def test_elastic_jobset_parallelism_within_the_real_quota(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str
) -> None:
    ns = kueue_namespace
    async with running_controller(kueue_cluster.kubeconfig_path, config_for(ns, gate=UNGATER_GATE)):
        js = await kueue_kube.create(JOBSETS, ns, jobset("js", 2, 2))
        async with slice_watch(
            kueue_kube,
            ns,
            JOBSETS,
            js,
            size_of=jobset_sizes,
            pod_set_of=kueue_pod_set,
            owner_of_pod=jobset_uid,
        ) as w:
            await w.settle("2 replicas x parallelism 2", expect={"workers": 4})
            await scale_jobset(kueue_kube, ns, "js", 3)
            await w.settle("parallelism 3", expect={"workers": 6})
            # 2 x 6 = 12 CPUs > 8: the slice waits, the new pods stay gated
            await scale_jobset(kueue_kube, ns, "js", 6)
            await eventually(lambda: n_pods(kueue_kube, ns, "js", 12), timeout=30, what="12 pods")
            await w.settle("parallelism 6, beyond quota", expect={"workers": 6})
            await scale_jobset(kueue_kube, ns, "js", 1)
            await eventually(lambda: n_pods(kueue_kube, ns, "js", 2), timeout=30, what="2 pods")
            await w.settle("parallelism 1", expect={"workers": 2})
