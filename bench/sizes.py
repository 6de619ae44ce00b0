"""How big and how often: the full run and the ``--quick`` smoke run."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FULL", "QUICK", "Sizes"]


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
)
