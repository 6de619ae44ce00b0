"""One throughput run summarized: the controller against the raw baseline on the same pods.

Wall-clock ratios swing on a shared machine; CPU per release does not, so each run reports
both: medians and their ratio, the spread of each side's repeats ((max - min) / median), and
the CPU seconds each process spent per 1000 released pods in its timed windows
(``/proc/PID/stat`` utime + stime, from :class:`bench.machine.CpuMeter`), with the number of
windows that had no reading of the process (``missing``: it had exited, say).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from bench.release import Release
from bench.stats import summarize

__all__ = ["cpu_per_1000", "cpu_seconds_per_1000", "spread", "throughput_run"]


def spread(samples: Sequence[float]) -> float:
    """(max - min) / median: 0 when every repeat agrees."""
    if not samples:
        return math.nan
    mid = statistics.median(samples)
    return (max(samples) - min(samples)) / mid if mid else math.nan


def cpu_seconds_per_1000(window: dict[str, float], process: str, pods: int) -> float | None:
    """CPU seconds ``process`` spent in a metered window (``CpuMeter.stop``), per 1000 pods
    released in it."""
    cores = window.get(process)
    wall = window.get("wall_seconds")
    if cores is None or wall is None or not pods:
        return None
    return cores * wall / pods * 1000


def cpu_per_1000(r: Release, process: str) -> float | None:
    """CPU seconds ``process`` spent in the release's window, per 1000 pods released in it."""
    return cpu_seconds_per_1000(r.cpu, process, r.pods)


def _cpu(samples: Sequence[Release], process: str) -> dict[str, Any]:
    values = [v for r in samples if (v := cpu_per_1000(r, process)) is not None]
    out = summarize(values, "CPU-s")
    out["missing"] = len(samples) - len(values)  # windows without a reading: counted, not lost
    return out


def throughput_run(
    ours: Sequence[Release], theirs: Sequence[Release], watching: Sequence[Release]
) -> dict[str, Any]:
    controller = summarize([r.pods_per_second for r in ours], "pods/s")
    baseline = summarize([r.pods_per_second for r in theirs], "pods/s")
    with_watch = summarize([r.pods_per_second for r in watching], "pods/s")
    cpu_ctl = _cpu(ours, "controller")
    cpu_raw = _cpu(theirs, "bench.raw")
    return {
        "controller": controller,
        "baseline": baseline,
        "baseline_with_watch": with_watch,
        "ratio": controller["median"] / baseline["median"],
        "ratio_to_baseline_with_watch": controller["median"] / with_watch["median"],
        "spread_controller": spread(controller["samples"]),
        "spread_baseline": spread(baseline["samples"]),
        "cpu_per_1000_controller": cpu_ctl,
        "cpu_per_1000_baseline": cpu_raw,
        "cpu_per_1000_baseline_with_watch": _cpu(watching, "bench.raw"),
        # nan, not a crash, when the raw loop's median is 0: /proc counts CPU in ticks, and a
        # short window on busy cores can register none for a process that ran
        "cpu_ratio": (
            cpu_ctl["median"] / cpu_raw["median"]
            if cpu_ctl["n"] and cpu_raw["n"] and cpu_raw["median"]
            else math.nan
        ),
    }
