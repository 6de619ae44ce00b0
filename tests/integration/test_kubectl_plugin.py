"""``kubectl ungater``, run by the real kubectl (built from the control plane's Kubernetes
module), which finds ``kubectl-ungater`` on ``PATH`` and hands it the rest of its command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.integration.jobs import make_job, released_indexes
from tests.integration.k8s import Kube
from tests.integration.support import admit, create_workload, running_controller
from tests.polling import equals, eventually
from ungater._model.config import Config
from ungater_devtools.ci import in_ci

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture(scope="module")
def kubectl(control_plane: Any) -> Path:
    from ungater_devtools.devcluster.build import ControlPlaneUnavailable
    from ungater_devtools.devcluster.kubectlbuild import ensure_kubectl

    try:
        return ensure_kubectl()
    except ControlPlaneUnavailable as exc:
        if in_ci():
            pytest.fail(f"kubectl cannot be built under CI=true: {exc}", pytrace=False)
        pytest.skip(f"kubectl cannot be built here: {exc}")


def plugin_path() -> str:
    script = shutil.which("kubectl-ungater", path=str(Path(sys.executable).parent))
    assert script, "kubectl-ungater is not installed next to this Python (pip install -e .)"
    return str(Path(script).parent)


def run_kubectl(
    kubectl: Path, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["PATH"] = os.pathsep.join([plugin_path(), "/usr/bin", "/bin"])
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [str(kubectl), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def with_context_namespace(source: Path, dest: Path, namespace: str) -> Path:
    """The admin kubeconfig with a second context, current, whose namespace is ``namespace``."""
    doc = yaml.safe_load(source.read_text())
    base = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])
    doc["contexts"].append(
        {"name": "in-ns", "context": {**base["context"], "namespace": namespace}}
    )
    doc["current-context"] = "in-ns"
    dest.write_text(yaml.safe_dump(doc))
    return dest


async def test_kubectl_ungater_explain_and_plugins_with_kubectl_conventions(
    kubectl: Path, control_plane: Any, kube: Kube, kube_namespace: str, tmp_path: Path
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "kplug", 3)
    await create_workload(kube, job, "job-kplug-a", {"main": 3})
    await admit(kube, ns, "job-kplug-a", {"main": 2})
    config = Config.model_validate({"namespaces": [ns], "mode": "release"})  # plays Kueue
    async with running_controller(control_plane.kubeconfig_path, config):
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1]), timeout=30)

    admin = control_plane.kubeconfig_path
    in_ns = with_context_namespace(admin, tmp_path / "kubeconfig", ns)
    expected = "pod set main: cap 2 (spec 3, admitted 2, owner 3), released 2"
    runs = {
        "-n and --kubeconfig": (
            "ungater",
            "explain",
            "job-kplug-a",
            "-n",
            ns,
            "--kubeconfig",
            str(admin),
        ),
        "NS/NAME, $KUBECONFIG": ("ungater", "explain", f"{ns}/job-kplug-a"),
        "the context's namespace": ("ungater", "explain", "job-kplug-a", "--context", "in-ns"),
    }
    for what, args in runs.items():
        kc = None if "--kubeconfig" in args else (in_ns if "--context" in args else admin)
        proc = await anyio.to_thread.run_sync(
            lambda a=args, k=kc: run_kubectl(kubectl, *a, kubeconfig=k)
        )
        assert proc.returncode == 0, f"{what}: {proc.stderr}"
        assert expected in proc.stdout, f"{what}: {proc.stdout}"
    # the current context's namespace (in-ns) is the default, as for kubectl get
    proc = await anyio.to_thread.run_sync(
        lambda: run_kubectl(kubectl, "ungater", "explain", "job-kplug-a", kubeconfig=in_ns)
    )
    assert proc.returncode == 0 and expected in proc.stdout, proc.stderr
    # ... and without it, `default`, where there is no such Workload: a one-line error
    proc = await anyio.to_thread.run_sync(
        lambda: run_kubectl(kubectl, "ungater", "explain", "job-kplug-a", kubeconfig=admin)
    )
    assert proc.returncode == 1 and "default" in proc.stderr and "Traceback" not in proc.stderr, (
        proc.stderr
    )

    # audit follows the context's namespace too, and -A lifts it
    audit = await anyio.to_thread.run_sync(
        lambda: run_kubectl(kubectl, "ungater", "audit", "--json", kubeconfig=in_ns)
    )
    assert audit.returncode == 0, audit.stderr
    assert json.loads(audit.stdout)["namespaces"] == [ns]
    everywhere = await anyio.to_thread.run_sync(
        lambda: run_kubectl(
            kubectl, "ungater", "audit", "-A", "--json", "--exit-zero", kubeconfig=in_ns
        )
    )
    assert everywhere.returncode == 0, everywhere.stderr
    assert json.loads(everywhere.stdout)["namespaces"] == ["(all)"]

    listed = await anyio.to_thread.run_sync(lambda: run_kubectl(kubectl, "ungater", "plugins"))
    assert listed.returncode == 0 and "Job.batch" in listed.stdout, listed.stderr
    # kubectl itself lists the plugin it found on PATH
    found = await anyio.to_thread.run_sync(lambda: run_kubectl(kubectl, "plugin", "list"))
    assert "kubectl-ungater" in found.stdout, found.stdout + found.stderr
