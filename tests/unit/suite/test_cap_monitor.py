"""The integration tests' cap monitor (``tests/integration/monitor.py``) on the fake API server:
a failure of its own code fails the test at once, while a cut watch is relisted and the checks
go on."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.integration.k8s import Kube
from tests.integration.monitor import MonitorBroken, monitoring
from tests.objects import PODS, job_pod
from tests.polling import eventually
from tests.unit.podfactory import NAMESPACE, job

SELECTOR = "job-name=train"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def setup() -> tuple[FakeKube, Kube, dict[str, Any]]:
    fake = FakeKube()
    return fake, Kube(fake), job("train", parallelism=3, completions=3)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_failure_of_the_monitor_itself_fails_the_test() -> None:
    """Before, the monitor took its own KeyError for an API server restart, relisted, failed
    again, and the test went on with no cap checked and passed."""
    fake, kube, owner = setup()

    def owner_of(pod: dict[str, Any]) -> str:
        raise KeyError("a bug in the monitor's grouping")

    waited = anyio.Event()
    with pytest.raises(ExceptionGroup) as caught:
        async with monitoring(kube, NAMESPACE, SELECTOR, {"uid": 1}, owner_of=owner_of):
            fake.put(PODS, job_pod(owner, 0, gates=[]))  # released: the check groups it
            with anyio.move_on_after(3):
                await anyio.sleep_forever()
            waited.set()
    broken = caught.value.subgroup(MonitorBroken)
    assert broken is not None, caught.value
    (err,) = broken.exceptions
    assert isinstance(err.__cause__, KeyError), err
    assert not waited.is_set(), "the test body was let run on without checks"


@pytest.mark.anyio
async def test_a_cut_watch_is_relisted_and_the_checks_go_on() -> None:
    fake, kube, owner = setup()
    with pytest.raises(AssertionError, match=r"2 released > cap 1"):
        async with monitoring(kube, NAMESPACE, SELECTOR, 1) as mon:
            fake.put(PODS, job_pod(owner, 0, gates=[]))
            await eventually(lambda: mon.events == 1, what="the first pod seen")
            assert fake.cut_watches("pods") == 1
            await eventually(lambda: mon.relists == 2, what="a relist after the cut")
            fake.put(PODS, job_pod(owner, 1, gates=[]))  # over the cap, after the cut
            await eventually(lambda: mon.violations, what="the violation seen")
