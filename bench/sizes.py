"""How big and how often: the full run and the ``--quick`` smoke run."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["FULL", "PRESETS", "QUICK", "Sizes", "with_kueue_burst", "with_scale"]


@dataclass(frozen=True)
class Sizes:
    latency_repeats: dict[int, int]  # pods per pod set -> repeats
    throughput_pods: int  # a key of latency_repeats: that size is timed against the baseline
    freed_cap: int
    freed_samples: int
    arrival_rounds: int
    arrival_batch: int
    churn_workloads: int
    churn_from: int
    churn_to: int
    churn_repeats: int
    scale_workloads: int
    scale_pods_each: int
    scale_restarts: int
    reconcile_others: tuple[int, ...]
    reconcile_repeats: int
    default_config: bool = True  # also measure the default client config
    #: one owner's own pods, for the cost of deciding on it again (reconcile_cost.owner_size_cost)
    owner_sizes: tuple[int, ...] = (100, 1000, 10_000)
    kueue_pods: int = 2  # pods per Job of the side-by-side lifecycle (bench/kueue.py)
    kueue_repeats: int = 1  # lifecycles (initial, scale-up, succeeded, recreated)
    kueue_pending_repeats: int = 1  # freed slot while a scale-up is pending; the shrink race
    kueue_pending_pods: int = 2  # admitted pods (the whole quota) before that scale-up
    kueue_pending_gated: int = 2  # the pods the scale-up adds (gated: a partial wave of 1)
    kueue_shrink: tuple[int, int, int] = (4, 12, 8)  # admitted, scaled beyond quota, shrunk to
    kueue_workloads: int = 3  # Jobs admitted at once (the burst)
    kueue_workload_pods: int = 2  # pods of each
    kueue_stall_s: float = 30.0  # gated this long while releasable: a stall


FULL = Sizes(
    latency_repeats={1: 15, 10: 15, 100: 10, 1000: 8},
    throughput_pods=1000,
    freed_cap=5,
    freed_samples=20,
    arrival_rounds=20,
    arrival_batch=5,
    churn_workloads=100,
    churn_from=10,
    churn_to=20,
    churn_repeats=3,
    scale_workloads=1000,
    scale_pods_each=10,
    scale_restarts=3,
    reconcile_others=(1000, 5000, 10000, 50000),
    reconcile_repeats=300,
    kueue_pods=10,
    kueue_repeats=10,
    kueue_pending_repeats=5,
    kueue_pending_pods=7,
    kueue_pending_gated=6,
    kueue_workloads=100,
    kueue_workload_pods=10,
)

QUICK = Sizes(
    latency_repeats={1: 1, 10: 1},
    throughput_pods=10,
    freed_cap=2,
    freed_samples=2,
    arrival_rounds=2,
    arrival_batch=2,
    churn_workloads=3,
    churn_from=2,
    churn_to=4,
    churn_repeats=1,
    scale_workloads=10,
    scale_pods_each=5,
    scale_restarts=1,
    reconcile_others=(100, 1000),
    reconcile_repeats=20,
    owner_sizes=(100,),
)


def with_kueue_burst(sizes: Sizes, workloads: int | None) -> Sizes:
    """``sizes`` with ``workloads`` Jobs in the Kueue burst (kept when None)."""
    return replace(sizes, kueue_workloads=workloads) if workloads else sizes


def with_scale(sizes: Sizes, pods: int | None, workloads: int | None) -> Sizes:
    """``sizes`` with the scale case at ``pods`` pods over ``workloads`` Jobs (either kept)."""
    w = workloads or sizes.scale_workloads
    total = pods or sizes.scale_workloads * sizes.scale_pods_each
    if total % w:
        raise ValueError(f"--scale-pods {total} is not a multiple of --scale-workloads {w}")
    return replace(sizes, scale_workloads=w, scale_pods_each=total // w)


#: ``--preset 100k``: the scale case at 100k pods over 10k Jobs and the in-process reconcile
#: cost up to 100k cached pods; everything else as the full run.
PRESETS = {
    "100k": replace(
        FULL,
        scale_workloads=10_000,
        scale_pods_each=10,
        reconcile_others=(1000, 10_000, 50_000, 100_000),
    ),
}
