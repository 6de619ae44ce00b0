"""The dev cluster's choice of Kueue and its sources: the pin table, the source archive (found,
verified, kept in the cache), the fallback, and the webhook kustomization's ``replacements``."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ungater_devtools.devcluster import peerbuild, versions
from ungater_devtools.devcluster.peers.render import render_webhooks


def test_kueue_is_chosen_by_argument_then_environment_then_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(versions.KUEUE_VERSION_ENV, raising=False)
    assert versions.kueue_pin().version == versions.KUEUE_VERSION
    monkeypatch.setenv(versions.KUEUE_VERSION_ENV, "0.17.1")
    assert versions.kueue_pin().version == "v0.17.1"
    assert versions.kueue_pin("v0.19.2").version == "v0.19.2"
    with pytest.raises(ValueError, match=r"unknown Kueue version .v0\.18\.0."):
        versions.kueue_pin("v0.18.0")
    chosen = versions.peers_for("v0.19.2")
    assert [p.name for p in chosen] == [p.name for p in versions.PEERS]
    assert chosen[0].archive is not None and chosen[0].fallback == "v0.17.1"


def _pin(tmp_path: Path, content: bytes) -> versions.Peer:
    return versions.Peer(
        name="toy",
        module="example.com/toy",
        version="v1.0.0",
        package=".",
        binary="toy",
        version_ldflags=(),
        archive=versions.SourceArchive(
            file="toy-v1.0.0.tar.gz", sha256=hashlib.sha256(content).hexdigest(), top="toy"
        ),
    )


def test_a_source_archive_is_verified_and_kept_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNGATER_CACHE_DIR", str(tmp_path / "cache"))
    pin = _pin(tmp_path, b"the real sources")
    wrong, right = tmp_path / "wrong", tmp_path / "right"
    for directory, content in ((wrong, b"something else"), (right, b"the real sources")):
        directory.mkdir()
        (directory / "toy-v1.0.0.tar.gz").write_bytes(content)
    said: list[str] = []
    monkeypatch.setenv(peerbuild.PEER_SOURCES_ENV, str(wrong))
    assert peerbuild.find_archive(pin, said.append) is None
    assert said and "ignoring" in said[0] and pin.archive and pin.archive.sha256 in said[0]
    monkeypatch.setenv(peerbuild.PEER_SOURCES_ENV, f"{wrong}:{right / 'toy-v1.0.0.tar.gz'}")
    kept = peerbuild.find_archive(pin)
    assert kept == peerbuild.sources_dir() / "toy-v1.0.0.tar.gz"
    assert kept.read_bytes() == b"the real sources"
    # a later checkout without the shared directory finds the kept copy
    monkeypatch.delenv(peerbuild.PEER_SOURCES_ENV)
    (right / "toy-v1.0.0.tar.gz").unlink()
    assert peerbuild.find_archive(pin) == kept
    kept.write_bytes(b"tampered")
    assert peerbuild.find_archive(pin) is None


@pytest.fixture
def nothing_gives_the_default(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The default is v0.19.2, and it is not built, not in an archive, not served."""
    monkeypatch.setattr(versions, "KUEUE_VERSION", "v0.19.2")
    monkeypatch.delenv(versions.KUEUE_VERSION_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(peerbuild, "_is_complete", lambda peer: False)
    monkeypatch.setattr(peerbuild, "find_archive", lambda peer, log=None: None)
    asked: list[str] = []

    def available(peer: versions.Peer) -> bool:
        asked.append(peer.version)
        return False

    monkeypatch.setattr(peerbuild, "_module_available", available)
    return asked


def test_a_default_kueue_nobody_gives_falls_back_with_one_line(
    nothing_gives_the_default: list[str],
) -> None:
    said: list[str] = []
    chosen = peerbuild.select_peers(log=said.append)
    assert chosen[0].name == "kueue" and chosen[0].version == "v0.17.1"
    assert len(said) == 1 and "using Kueue v0.17.1 instead" in said[0], said
    assert nothing_gives_the_default == ["v0.19.2"]


def test_no_fallback_under_ci_or_for_a_version_asked_for(
    nothing_gives_the_default: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(peerbuild.PeersUnavailable, match=r"Kueue v0\.19\.2: no source archive"):
        peerbuild.select_peers("v0.19.2")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(peerbuild.PeersUnavailable, match="module proxy does not serve it"):
        peerbuild.select_peers()


def test_a_kueue_built_or_in_an_archive_is_used_as_asked(
    nothing_gives_the_default: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(peerbuild, "find_archive", lambda peer, log=None: tmp_path)
    assert peerbuild.select_peers()[0].version == "v0.19.2"
    assert nothing_gives_the_default == [], "no module look-up when the archive is there"


def _webhook_tree(tmp_path: Path, replacements: str) -> Path:
    (tmp_path / "manifests.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: admissionregistration.k8s.io/v1
            kind: MutatingWebhookConfiguration
            metadata: {name: mutating-webhook-configuration}
            webhooks:
            - name: mjob.kb.io
              clientConfig: {service: {name: webhook-service, namespace: system, path: /mjob}}
            - name: mworkload.kb.io
              clientConfig: {service: {name: webhook-service, namespace: system, path: /mwl}}
            ---
            apiVersion: admissionregistration.k8s.io/v1
            kind: ValidatingWebhookConfiguration
            metadata: {name: validating-webhook-configuration}
            webhooks:
            - name: vpod.kb.io
              clientConfig: {service: {name: webhook-service, namespace: system, path: /vpod}}
            - name: vjob.kb.io
              namespaceSelector: {matchLabels: {old: selector}}
              clientConfig: {service: {name: webhook-service, namespace: system, path: /vjob}}
            """
        )
    )
    (tmp_path / "kustomization.yaml").write_text(
        textwrap.dedent(
            """\
            resources: [manifests.yaml]
            patches:
            - patch: |-
                apiVersion: admissionregistration.k8s.io/v1
                kind: ValidatingWebhookConfiguration
                metadata: {name: validating-webhook-configuration}
                webhooks:
                - name: vpod.kb.io
                  namespaceSelector:
                    matchExpressions:
                    - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system]}
            """
        )
        + replacements
    )
    return tmp_path


_REPLACEMENTS = """\
replacements:
- source:
    kind: ValidatingWebhookConfiguration
    name: validating-webhook-configuration
    fieldPath: webhooks.[name=vpod.kb.io].namespaceSelector
  targets:
  - select: {kind: MutatingWebhookConfiguration, name: mutating-webhook-configuration}
    fieldPaths:
    - webhooks.[name=mjob.kb.io].namespaceSelector
    options: {create: true}
  - select: {kind: ValidatingWebhookConfiguration, name: validating-webhook-configuration}
    fieldPaths:
    - webhooks.[name=vjob.kb.io].namespaceSelector
"""


def _selectors(configs: list[dict[str, Any]]) -> dict[str, Any]:
    return {h["name"]: h.get("namespaceSelector") for c in configs for h in c["webhooks"]}


def test_the_webhook_replacements_copy_the_pod_webhooks_namespace_selector(
    tmp_path: Path,
) -> None:
    configs = render_webhooks(
        _webhook_tree(tmp_path, _REPLACEMENTS), prefix="kueue-", port=9443, ca_bundle=b"ca"
    )
    selector = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
        ]
    }
    assert _selectors(configs) == {
        "mjob.kb.io": selector,  # created (options.create)
        "mworkload.kb.io": None,  # not a target
        "vpod.kb.io": selector,  # the patched source
        "vjob.kb.io": selector,  # replaced
    }
    assert [c["metadata"]["name"] for c in configs] == [
        "kueue-mutating-webhook-configuration",
        "kueue-validating-webhook-configuration",
    ]
    urls = [h["clientConfig"]["url"] for c in configs for h in c["webhooks"]]
    assert urls[0] == "https://127.0.0.1:9443/mjob"


def test_a_replacement_naming_a_missing_webhook_is_an_error(tmp_path: Path) -> None:
    broken = _REPLACEMENTS.replace("name=vjob.kb.io", "name=vgone.kb.io")
    with pytest.raises(ValueError, match=r"has no webhook vgone\.kb\.io"):
        render_webhooks(_webhook_tree(tmp_path, broken), prefix="", port=1, ca_bundle=b"")


def test_rbac_resource_names_of_renamed_webhook_configurations_follow_the_prefix(
    tmp_path: Path,
) -> None:
    """Kueue v0.19's manager may update its webhook configurations only by name: the rendered
    role names them with the prefix, as config/default's name reference makes kustomize do."""
    from ungater_devtools.devcluster.peers.render import render_rbac

    (tmp_path / "kustomization.yaml").write_text("resources: [role.yaml]\n")
    (tmp_path / "role.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: rbac.authorization.k8s.io/v1
            kind: ClusterRole
            metadata: {name: manager-role}
            rules:
            - apiGroups: [admissionregistration.k8s.io]
              resources: [mutatingwebhookconfigurations]
              resourceNames: [mutating-webhook-configuration]
              verbs: [get, update]
            - apiGroups: [apiextensions.k8s.io]
              resources: [customresourcedefinitions]
              resourceNames: [workloads.kueue.x-k8s.io]
              verbs: [update]
            """
        )
    )
    renamed = {"mutating-webhook-configuration": "kueue-mutating-webhook-configuration"}
    [role] = render_rbac(tmp_path, prefix="kueue-", namespace="ns", renamed=renamed)
    assert role["metadata"]["name"] == "kueue-manager-role"
    assert [r["resourceNames"] for r in role["rules"]] == [
        ["kueue-mutating-webhook-configuration"],
        ["workloads.kueue.x-k8s.io"],
    ]
