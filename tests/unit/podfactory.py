"""Realistic API objects for unit tests: owners, intermediates, pods and Workloads as raw dicts.

Every builder returns the camelCase JSON the API server would serve, shaped as the real
controller writes it (the labels and annotations it sets, controller ownerReferences with
``blockOwnerDeletion``, ``generateName``-style names, scheduling gates, creation timestamps),
so tests exercise ``parse_pod``/``parse_object``/``parse_workload`` and the plugins on the same
shapes a cluster produces. UIDs and name suffixes are derived from names, so runs repeat.

Sources of the shapes (checked against upstream, see docs/plugins/builtin-kinds.md): the Kubernetes Job
controller, JobSet v0.9+ (``labelAndAnnotateObject``), KubeRay v1.6+ with multi-host indexing,
Kueue's jobframework (pod set label, slice annotation).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ungater._decide.assess import pod_facts
from ungater._decide.decision import PodFacts
from ungater._model.views import ObjectView, parse_object, parse_pod
from ungater._plugins.registry import KindHandler

# ownerReferences, the owner as hooks get it and reproducible UIDs: the plugin kit's builders
from ungater.testing import new_uid, owner_ref, ref_of

Obj = dict[str, Any]

GATE = "kueue.x-k8s.io/elastic-job"
TAS_GATE = "kueue.x-k8s.io/topology"
NAMESPACE = "team-a"
QUEUE = "user-queue"
PODSET_LABEL = "kueue.x-k8s.io/podset"
SLICE_NAME = "kueue.x-k8s.io/workload-slice-name"
ELASTIC = "kueue.x-k8s.io/elastic-job"
_EPOCH = datetime(2026, 3, 2, 9, 30, 0, tzinfo=UTC)
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the API server's generateName alphabet


# -- identity, names, time -------------------------------------------------------------------


def ts(seconds: float = 0) -> str:
    """An RFC 3339 creation timestamp ``seconds`` after a fixed epoch (second resolution)."""
    return (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def suffix(*parts: str, length: int = 5) -> str:
    """A random-looking but reproducible generateName suffix."""
    digest = hashlib.sha256("/".join(parts).encode()).digest()
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:length])


def _meta(kind: str, name: str, namespace: str, created: float, **extra: Any) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": new_uid(kind, namespace, name),
        "resourceVersion": str(1000 + int(created * 10)),
        "generation": 1,
        "creationTimestamp": ts(created),
    }
    meta.update(extra)
    return meta


# -- pods ------------------------------------------------------------------------------------


def _pod(
    *,
    generate_name: str,
    namespace: str,
    owner: Mapping[str, Any],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    created: float,
    gates: Sequence[str],
    phase: str,
    container: str,
    spec_extra: Mapping[str, Any] | None = None,
    finalizers: Sequence[str] = (),
    seed: str = "",
) -> Obj:
    name = generate_name + suffix(generate_name, seed, str(created))
    meta = _meta(
        "Pod",
        name,
        namespace,
        created,
        generateName=generate_name,
        labels=dict(labels),
        annotations=dict(annotations),
        ownerReferences=[owner_ref(owner)],
    )
    del meta["generation"]
    if finalizers:
        meta["finalizers"] = list(finalizers)
    spec: Obj = {
        "containers": [
            {
                "name": container,
                "image": "registry.example.com/train:1.4",
                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": True,
        "priority": 0,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    }
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    spec.update(spec_extra or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": _status(phase, bool(gates), created),
    }


def _status(phase: str, gated: bool, created: float) -> Obj:
    if phase == "Pending" and gated:
        return {
            "phase": "Pending",
            "qosClass": "Burstable",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "SchedulingGated",
                    "message": "Scheduling is blocked due to non-empty scheduling gates",
                    "lastProbeTime": None,
                    "lastTransitionTime": ts(created),
                }
            ],
        }
    status: Obj = {"phase": phase, "qosClass": "Burstable", "startTime": ts(created + 2)}
    status["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(created + 1)}
    ]
    return status


def release(pod: Mapping[str, Any], phase: str = "Running") -> Obj:
    """The same pod after its gate was removed and it was scheduled (or finished)."""
    out = copy.deepcopy(dict(pod))
    out["spec"].pop("schedulingGates", None)
    out["status"] = _status(phase, gated=False, created=0)
    return out


def deleting(pod: Mapping[str, Any]) -> Obj:
    out = copy.deepcopy(dict(pod))
    out["metadata"]["deletionTimestamp"] = ts(3600)
    out["metadata"]["deletionGracePeriodSeconds"] = 30
    return out


def strip_owner(pod: Mapping[str, Any]) -> Obj:
    """A foreign pod: same labels and annotations, but created by hand (no ownerReferences)."""
    out = copy.deepcopy(dict(pod))
    meta = out["metadata"]
    meta.pop("ownerReferences", None)
    meta["name"] = "impostor-" + meta["name"]
    meta["uid"] = new_uid("impostor", meta["name"])
    return out


def reown(pod: Mapping[str, Any], owner: Mapping[str, Any]) -> Obj:
    """The same pod with its controller reference pointing at ``owner`` instead."""
    out = copy.deepcopy(dict(pod))
    out["metadata"]["ownerReferences"] = [owner_ref(owner)]
    out["metadata"]["uid"] = new_uid("reowned", out["metadata"]["name"])
    return out


# -- batch/v1 Job ----------------------------------------------------------------------------


def job(
    name: str,
    *,
    namespace: str = NAMESPACE,
    indexed: bool = True,
    parallelism: int = 2,
    completions: int | None = None,
    pod_set: str | None = "main",
    elastic: bool = True,
    owner: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    template_labels: Mapping[str, str] | None = None,
    template_annotations: Mapping[str, str] | None = None,
    created: float = 0,
) -> Obj:
    """A Job as stored after API defaulting (generated selector) and Kueue's admission
    (pod set label and, for elastic jobs, the slice name stamped on the pod template)."""
    job_labels = {"kueue.x-k8s.io/queue-name": QUEUE, **(labels or {})}
    job_annotations = dict(annotations or {})
    if elastic:
        job_annotations[ELASTIC] = "true"
    meta = _meta("Job", name, namespace, created, labels=job_labels, annotations=job_annotations)
    if owner is not None:
        meta["ownerReferences"] = [owner_ref(owner)]
    uid = meta["uid"]
    selector = {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    }
    tpl_labels = {**(template_labels or {}), **selector}
    tpl_annotations = dict(template_annotations or {})
    if pod_set is not None:
        tpl_labels[PODSET_LABEL] = pod_set
        if elastic:
            tpl_annotations[SLICE_NAME] = f"job-{name}-{suffix(name, 'wl')}"
    spec: Obj = {
        "parallelism": parallelism,
        "completions": completions if completions is not None else parallelism,
        "completionMode": "Indexed" if indexed else "NonIndexed",
        "backoffLimit": 6,
        "suspend": False,
        "manualSelector": False,
        "podReplacementPolicy": "TerminatingOrFailed",
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
        "template": {
            "metadata": {"labels": tpl_labels, "annotations": tpl_annotations},
            "spec": {
                "containers": [{"name": "worker", "image": "registry.example.com/train:1.4"}],
                "restartPolicy": "Never",
                "schedulingGates": [{"name": GATE}],
            },
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": spec,
        "status": {"active": 0, "ready": 0, "terminating": 0},
    }


def job_pod(
    owner_job: Mapping[str, Any],
    *,
    index: int | None = None,
    created: float = 1,
    gates: Sequence[str] = (GATE,),
    phase: str = "Pending",
    index_label: bool = True,
    seed: str = "",
) -> Obj:
    """A pod as the Job controller creates it from the Job's template.

    Indexed Jobs: ``generateName`` is ``<job>-<index>-``, the index is an annotation (always)
    and a label (``index_label``, the PodIndexLabel feature, on by default since 1.28), the
    hostname is ``<job>-<index>`` and ``JOB_COMPLETION_INDEX`` reads the annotation.
    """
    name = owner_job["metadata"]["name"]
    template = owner_job["spec"]["template"]
    labels = dict(template["metadata"].get("labels") or {})
    annotations = dict(template["metadata"].get("annotations") or {})
    generate_name = f"{name}-"
    extra: Obj = {}
    if index is not None:
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
        if index_label:
            labels["batch.kubernetes.io/job-completion-index"] = str(index)
        generate_name = f"{name}-{index}-"
        extra["hostname"] = f"{name}-{index}"
    pod = _pod(
        generate_name=generate_name,
        namespace=owner_job["metadata"]["namespace"],
        owner=owner_job,
        labels=labels,
        annotations=annotations,
        created=created,
        gates=gates,
        phase=phase,
        container="worker",
        spec_extra=extra,
        finalizers=["batch.kubernetes.io/job-tracking"],
        seed=seed,
    )
    if index is not None:
        pod["spec"]["containers"][0]["env"] = [
            {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "apiVersion": "v1",
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
                    }
                },
            }
        ]
    return pod


# -- JobSet ----------------------------------------------------------------------------------


def jobset(
    name: str,
    replicated_jobs: Mapping[str, int],
    *,
    namespace: str = NAMESPACE,
    created: float = 0,
) -> Obj:
    """A JobSet; ``replicated_jobs`` maps each replicatedJob name to its replicas."""
    meta = _meta(
        "JobSet",
        name,
        namespace,
        created,
        labels={"kueue.x-k8s.io/queue-name": QUEUE},
        annotations={},
    )
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": meta,
        "spec": {
            "replicatedJobs": [
                {"name": rj, "replicas": replicas, "template": {"spec": {}}}
                for rj, replicas in replicated_jobs.items()
            ],
            "suspend": False,
        },
    }


def jobset_child_job(
    owner_jobset: Mapping[str, Any],
    replicated_job: str,
    job_index: int,
    *,
    parallelism: int = 2,
    indexed: bool = True,
    pod_set: str | None = "",
) -> Obj:
    """A child Job named ``<jobset>-<replicatedJob>-<index>``, labelled and annotated by the
    JobSet controller (the same keys on the Job and on its pod template) and owned by it.
    ``pod_set=""`` stamps Kueue's label with the replicatedJob name; None leaves it out."""
    js_meta = owner_jobset["metadata"]
    js_name = js_meta["name"]
    replicas = next(
        rj["replicas"]
        for rj in owner_jobset["spec"]["replicatedJobs"]
        if rj["name"] == replicated_job
    )
    job_name = f"{js_name}-{replicated_job}-{job_index}"
    keys = {
        "jobset.sigs.k8s.io/jobset-name": js_name,
        "jobset.sigs.k8s.io/jobset-uid": js_meta["uid"],
        "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
        "jobset.sigs.k8s.io/restart-attempt": "0",
        "jobset.sigs.k8s.io/global-replicas": str(
            sum(rj["replicas"] for rj in owner_jobset["spec"]["replicatedJobs"])
        ),
        "jobset.sigs.k8s.io/job-index": str(job_index),
        "jobset.sigs.k8s.io/job-global-index": str(job_index),
        "jobset.sigs.k8s.io/job-key": hashlib.sha1(
            f"{js_meta['namespace']}/{job_name}".encode()
        ).hexdigest(),
        "jobset.sigs.k8s.io/group-name": "default",
        "jobset.sigs.k8s.io/group-replicas": str(replicas),
        "jobset.sigs.k8s.io/job-group-index": str(job_index),
    }
    template_labels = dict(keys)
    if pod_set is not None:
        template_labels[PODSET_LABEL] = pod_set or replicated_job
    return job(
        job_name,
        namespace=js_meta["namespace"],
        indexed=indexed,
        parallelism=parallelism,
        pod_set=None,
        elastic=False,
        owner=owner_jobset,
        labels=keys,
        annotations=keys,
        template_labels=template_labels,
        template_annotations=keys,
    )


# -- RayCluster ------------------------------------------------------------------------------


def raycluster(
    name: str,
    worker_groups: Mapping[str, tuple[int, int]],
    *,
    namespace: str = NAMESPACE,
    owner: Mapping[str, Any] | None = None,
    created: float = 0,
) -> Obj:
    """A RayCluster; ``worker_groups`` maps groupName to (replicas, numOfHosts)."""
    meta = _meta(
        "RayCluster",
        name,
        namespace,
        created,
        labels={"kueue.x-k8s.io/queue-name": QUEUE},
        annotations={ELASTIC: "true"},
    )
    if owner is not None:
        meta["ownerReferences"] = [owner_ref(owner)]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": meta,
        "spec": {
            "rayVersion": "2.46.0",
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {}}},
            "workerGroupSpecs": [
                {
                    "groupName": group,
                    "replicas": replicas,
                    "minReplicas": 0,
                    "maxReplicas": 16,
                    "numOfHosts": hosts,
                    "rayStartParams": {},
                    "template": {"spec": {}},
                }
                for group, (replicas, hosts) in worker_groups.items()
            ],
        },
    }


def _ray_labels(cluster: str, node_type: str, group: str) -> dict[str, str]:
    return {
        "ray.io/is-ray-node": "yes",
        "ray.io/cluster": cluster,
        "ray.io/node-type": node_type,
        "ray.io/group": group,
        "ray.io/identifier": f"{cluster}-{node_type}",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }


def ray_head_pod(
    cluster: Mapping[str, Any],
    *,
    created: float = 1,
    gates: Sequence[str] = (GATE,),
    phase: str = "Pending",
    pod_set: str | None = "head",
) -> Obj:
    name = cluster["metadata"]["name"]
    labels = _ray_labels(name, "head", "headgroup")
    if pod_set is not None:
        labels[PODSET_LABEL] = pod_set
    return _pod(
        generate_name=f"{name}-head-",
        namespace=cluster["metadata"]["namespace"],
        owner=cluster,
        labels=labels,
        annotations={"ray.io/ft-enabled": "false"},
        created=created,
        gates=gates,
        phase=phase,
        container="ray-head",
        spec_extra={"restartPolicy": "Always"},
    )


def ray_replica_name(group: str, seed: str) -> str:
    """``GenerateRayWorkerReplicaGroupName``: the group name and five random characters."""
    return f"{group}-{suffix(group, seed)}"


def ray_worker_pod(
    cluster: Mapping[str, Any],
    group: str,
    *,
    replica_index: int | None = 0,
    replica_name: str | None = None,
    host_index: int | None = None,
    created: float = 2,
    gates: Sequence[str] = (GATE,),
    phase: str = "Pending",
    pod_set: str | None = "",
    seed: str = "",
) -> Obj:
    """A worker pod. With multi-host indexing (KubeRay v1.6+ default) every worker has the
    replica index; multi-host ones also the replica name and host index. ``pod_set=""`` stamps
    Kueue's label with the lowercased group name; None leaves it out."""
    name = cluster["metadata"]["name"]
    labels = _ray_labels(name, "worker", group)
    if replica_index is not None:
        labels["ray.io/worker-group-replica-index"] = str(replica_index)
    if replica_name is not None:
        labels["ray.io/worker-group-replica-name"] = replica_name
    if host_index is not None:
        labels["ray.io/replica-host-index"] = str(host_index)
    if pod_set is not None:
        labels[PODSET_LABEL] = pod_set or group.lower()
    return _pod(
        generate_name=f"{name}-{group}-worker-",
        namespace=cluster["metadata"]["namespace"],
        owner=cluster,
        labels=labels,
        annotations={},
        created=created,
        gates=gates,
        phase=phase,
        container="ray-worker",
        spec_extra={"restartPolicy": "Always"},
        seed=seed or f"{replica_name}/{replica_index}/{host_index}",
    )


# -- Kueue Workload --------------------------------------------------------------------------


def workload(
    owner: Mapping[str, Any],
    pod_sets: Mapping[str, int],
    *,
    admitted: Mapping[str, int] | None = None,
    created: float = 0,
    finished: bool = False,
    evicted: bool = False,
    replacement_for: str | None = None,
    seed: str = "",
) -> Obj:
    """A v1beta2 Workload slice for ``owner``. ``admitted`` None: pending (no admission)."""
    meta_owner = owner["metadata"]
    kind = owner["kind"].lower()
    name = f"{kind}-{meta_owner['name']}-{suffix(meta_owner['uid'], seed)}"
    first = f"{kind}-{meta_owner['name']}-{suffix(meta_owner['uid'], '')}"
    annotations = {ELASTIC: "true", SLICE_NAME: first}
    if replacement_for:
        annotations["kueue.x-k8s.io/workload-slice-replacement-for"] = replacement_for
    meta = _meta(
        "Workload",
        name,
        meta_owner["namespace"],
        created,
        labels={"kueue.x-k8s.io/job-uid": meta_owner["uid"]},
        annotations=annotations,
        ownerReferences=[owner_ref(owner)],
    )
    conditions: list[Obj] = []
    status: Obj = {"conditions": conditions}
    if admitted is not None:
        status["admission"] = {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [
                {"name": ps, "count": count, "flavors": {"cpu": "default-flavor"}}
                for ps, count in admitted.items()
            ],
        }
        for ctype in ("QuotaReserved", "Admitted"):
            conditions.append(
                {
                    "type": ctype,
                    "status": "True",
                    "reason": ctype,
                    "message": "",
                    "lastTransitionTime": ts(created + 1),
                }
            )
    if finished:
        conditions.append({"type": "Finished", "status": "True", "reason": "WorkloadSliceReplaced"})
    if evicted:
        conditions.append({"type": "Evicted", "status": "True", "reason": "Preempted"})
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": meta,
        "spec": {
            "queueName": QUEUE,
            "podSets": [
                {"name": ps, "count": count, "template": {"spec": {}}}
                for ps, count in pod_sets.items()
            ],
        },
        "status": status,
    }


# -- feeding the core ------------------------------------------------------------------------


def objects(*objs: Mapping[str, Any]) -> dict[str, ObjectView]:
    """Intermediate owners as the core caches them, by UID."""
    views = (parse_object(o) for o in objs)
    return {v.uid: v for v in views}


def facts(
    handler: KindHandler,
    owner: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    intermediates: Iterable[Mapping[str, Any]] = (),
) -> list[PodFacts]:
    """What the controller computes for one reconcile: the plugin's answers for every pod."""
    return pod_facts(handler, ref_of(owner), [parse_pod(p) for p in pods], objects(*intermediates))


def names(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def ray_owner(kind: str, name: str, workers: int = 2) -> dict[str, Any]:
    """A RayJob or RayService as Kueue's webhook leaves it: queued, elastic, autoscaling."""
    cluster_spec = raycluster("x", {"workers": (workers, 1)})["spec"]
    cluster_spec["enableInTreeAutoscaling"] = True
    return {
        "apiVersion": "ray.io/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": new_uid(kind, NAMESPACE, name),
            "resourceVersion": "900",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
            "annotations": {"kueue.x-k8s.io/elastic-job": "true"},
        },
        "spec": {"rayClusterSpec": cluster_spec, "shutdownAfterJobFinishes": True},
    }


def cluster_of(owner: dict[str, Any], name: str, groups: dict[str, tuple[int, int]]) -> Any:
    """The RayCluster KubeRay creates for ``owner``: a generated name, a controller reference
    to it, the originated-from labels (on the RayCluster only, never on its pods)."""
    rc = raycluster(name, groups, owner=owner)
    rc["metadata"]["labels"].update(
        {
            "ray.io/originated-from-cr-name": owner["metadata"]["name"],
            "ray.io/originated-from-crd": owner["kind"],
        }
    )
    return rc
