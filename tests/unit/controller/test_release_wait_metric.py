"""The user-facing wait measured by the controller on the in-memory API server
(``ungater_release_wait_seconds``): a freed slot is timed from the freeing. The pure clock is
tested in tests/unit/decide/test_release_wait.py."""

from __future__ import annotations

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakekube import FakeKube
from tests.objects import GATE, PODS, WORKLOADS, job_pod, with_phase, workload
from tests.polling import eventually
from tests.unit.controller.fake_jobs import NS, make_config, released_indexes, setup_job
from tests.unit.harness import running
from ungater._observe.metrics import Metrics


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.anyio
async def test_a_freed_slot_is_timed_from_the_freeing_not_from_the_admission() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 3)
    fake.put(WORKLOADS, workload(owner, "train-a", count=3, admitted=2))
    async with running(fake, make_config(), observed=True) as ctl:
        metrics = ctl.metrics
        assert metrics is not None
        await eventually(lambda: released_indexes(fake) == [0, 1])
        kind = (("kind", "Job.batch"),)
        assert samples(metrics, "ungater_release_wait_seconds_count")[kind] == 2
        assert ctl.gated_pods() == {("Job.batch", GATE, "capacity"): 1}
        gauge = samples(metrics, "ungater_gated_pods")
        assert gauge == {(("gate", GATE), ("kind", "Job.batch"), ("reason", "capacity")): 1.0}
        await anyio.sleep(0.8)  # pod 2 sits gated, for want of room, all this time
        first = fake.read(PODS, NS, job_pod(owner, 0)["metadata"]["name"])
        assert first is not None
        fake.put(PODS, with_phase(first, "Succeeded"))
        await eventually(lambda: released_indexes(fake) == [0, 1, 2])
        count = samples(metrics, "ungater_release_wait_seconds_count")[kind]
        total = samples(metrics, "ungater_release_wait_seconds_sum")[kind]
        assert count == 3
        assert total < 0.5, f"the freed slot's pod counted its time without room: {total:.2f}s"
        await eventually(lambda: ctl.gated_pods() == {})
