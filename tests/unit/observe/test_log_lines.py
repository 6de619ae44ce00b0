"""Log lines name owners as a person does (kind, namespace, name), not by UID."""

from __future__ import annotations

import logging
import types

import pytest
import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from tests.objects import WORKLOADS, workload
from tests.polling import eventually
from tests.unit.controller.fake_jobs import make_config, setup_job
from tests.unit.harness import running
from ungater.plugin_api import hookimpl


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_plugin_error_names_the_owner_by_kind_and_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = types.ModuleType("broken_job")
    for name in dir(job_plugin):
        if name.startswith("ungater_"):
            setattr(broken, name, getattr(job_plugin, name))
    broken.ungater_sort_key = hookimpl(lambda owner, pod: {"not": "a tuple"})  # type: ignore[attr-defined]
    fake = FakeKube()
    owner = setup_job(fake, 2)
    fake.put(WORKLOADS, workload(owner, "train-a", count=2, admitted=2))
    async with running(fake, make_config(), plugins={"job": broken}) as ctl:
        await eventually(lambda: ctl.stats.plugin_errors >= 1, what="the plugin error")
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(m.startswith("Job.batch team-a/train: skipped: plugin job") for m in lines), lines
    assert not any(owner["metadata"]["uid"] in m for m in lines), lines
