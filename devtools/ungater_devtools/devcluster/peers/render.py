"""The peers' manifests rendered the way their kustomizations would render them (name prefix,
namespace, the webhook patches and ``replacements``), except that each webhook's
``clientConfig`` points at ``https://127.0.0.1:<port><path>`` with a CA made for this cluster.
Pure: files in, objects out."""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "collection_path",
    "crd_conversion_targets",
    "load_all",
    "render_rbac",
    "render_webhooks",
]


def load_all(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def _kustomization(directory: Path) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return data if isinstance(data, dict) else {}


_NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "Secret", "Service"}


def render_rbac(
    directory: Path,
    *,
    prefix: str,
    namespace: str,
    renamed: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The RBAC objects of a kustomization directory, with its name prefix and namespace.

    Only what ``resources`` lists is read, the way kustomize would; names, role references and
    service-account subjects get the prefix, namespaced objects and subjects the namespace.
    ``renamed`` maps other objects' old names to their rendered ones in the rules'
    ``resourceNames`` (Kueue v0.19's ``config/default`` teaches kustomize that for its webhook
    configurations, which its cert rotator may update only by name).
    """
    objects: list[dict[str, Any]] = []
    for resource in _kustomization(directory).get("resources") or ():
        for doc in load_all(directory / str(resource)):
            obj = copy.deepcopy(doc)
            meta = obj.setdefault("metadata", {})
            meta["name"] = prefix + meta["name"]
            if obj.get("kind") in _NAMESPACED:
                meta["namespace"] = namespace
            ref = obj.get("roleRef")
            if isinstance(ref, dict):
                ref["name"] = prefix + ref["name"]
            for subject in obj.get("subjects") or ():
                if subject.get("kind") == "ServiceAccount":
                    subject["name"] = prefix + subject["name"]
                    subject["namespace"] = namespace
            for rule in obj.get("rules") or ():
                if rule.get("resourceNames") and renamed:
                    rule["resourceNames"] = [renamed.get(n, n) for n in rule["resourceNames"]]
            objects.append(obj)
    return objects


def _apply_webhook_patch(configs: dict[str, dict[str, Any]], patch: dict[str, Any]) -> None:
    """A strategic-merge patch of a webhook configuration: webhooks merged by name."""
    target = configs.get(patch.get("metadata", {}).get("name", ""))
    if target is None:
        return
    by_name = {w["name"]: w for w in target.get("webhooks") or ()}
    for change in patch.get("webhooks") or ():
        hook = by_name.get(change.get("name"))
        if hook is not None:
            hook.update({k: v for k, v in change.items() if k != "name"})


def _apply_json6902(config: dict[str, Any], ops: Iterable[dict[str, Any]]) -> None:
    """The ``replace``/``add`` operations on ``/webhooks/<i>`` that the peers' patches use."""
    for op in ops:
        parts = str(op["path"]).strip("/").split("/")
        if len(parts) != 2 or parts[0] != "webhooks" or op["op"] not in ("replace", "add"):
            raise ValueError(f"unsupported webhook patch operation {op}")
        hooks = config.setdefault("webhooks", [])
        index = len(hooks) if parts[1] == "-" else int(parts[1])
        if op["op"] == "replace":
            hooks[index] = copy.deepcopy(op["value"])
        else:
            hooks.insert(index, copy.deepcopy(op["value"]))


def _webhook_field(config: dict[str, Any], field_path: str) -> tuple[Any, str]:
    """The webhook and key a ``webhooks.[name=<hook>].<key>`` field path names."""
    head, _, rest = field_path.partition(".[name=")
    hook_name, _, key = rest.partition("].")
    if head != "webhooks" or not hook_name or not key or "." in key:
        raise ValueError(f"unsupported replacement field path {field_path!r}")
    for hook in config.get("webhooks") or ():
        if hook.get("name") == hook_name:
            return hook, key
    raise ValueError(f"{config['metadata']['name']} has no webhook {hook_name} ({field_path})")


def _apply_replacements(
    configs: dict[str, dict[str, Any]], replacements: Iterable[dict[str, Any]]
) -> None:
    """Kustomize ``replacements`` between webhook configurations: copy one webhook's field
    (e.g. Kueue v0.19's pod webhook ``namespaceSelector``) onto the named webhooks."""

    def config_of(ref: dict[str, Any]) -> dict[str, Any]:
        config = configs.get(str(ref.get("name")))
        if config is None or config.get("kind") != ref.get("kind"):
            raise ValueError(f"replacement names no webhook configuration here: {ref}")
        return config

    for replacement in replacements:
        source = replacement["source"]
        hook, key = _webhook_field(config_of(source), source["fieldPath"])
        if key not in hook:
            raise ValueError(f"replacement source {source} has no value")
        for target in replacement.get("targets") or ():
            config = config_of(target["select"])
            for field_path in target.get("fieldPaths") or ():
                create = bool((target.get("options") or {}).get("create"))
                dest, dest_key = _webhook_field(config, field_path)
                if dest_key in dest or create:
                    dest[dest_key] = copy.deepcopy(hook[key])


def render_webhooks(
    directory: Path, *, prefix: str, port: int, ca_bundle: bytes
) -> list[dict[str, Any]]:
    """A peer's webhook configurations as its kustomization renders them, served by URL.

    Each webhook's ``clientConfig.service`` (name, namespace, path) becomes
    ``url: https://127.0.0.1:<port><path>`` with the given CA bundle.
    """
    import yaml

    configs = {d["metadata"]["name"]: d for d in load_all(directory / "manifests.yaml")}
    kustomization = _kustomization(directory)
    for entry in kustomization.get("patches") or ():
        if "patch" in entry:
            _apply_webhook_patch(configs, yaml.safe_load(entry["patch"]))
        elif "path" in entry:
            data = yaml.safe_load((directory / entry["path"]).read_text())
            target = (entry.get("target") or {}).get("name")
            if isinstance(data, list) and target in configs:
                _apply_json6902(configs[target], data)
            elif isinstance(data, dict):
                _apply_webhook_patch(configs, data)
    _apply_replacements(configs, kustomization.get("replacements") or ())
    bundle = base64.b64encode(ca_bundle).decode()
    rendered = []
    for name, config in configs.items():
        config["metadata"] = {"name": prefix + name}
        for hook in config.get("webhooks") or ():
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path", "/")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
        rendered.append(config)
    return rendered


def crd_conversion_targets(crd_dir: Path) -> set[str]:
    """The CRDs whose kustomization turns on a conversion webhook (``webhook_in_*`` patches)."""
    names: set[str] = set()
    for entry in _kustomization(crd_dir).get("patches") or ():
        path = str(entry.get("path", "")) if isinstance(entry, dict) else ""
        if "webhook_in_" in path:
            for doc in load_all(crd_dir / path):
                names.add(doc["metadata"]["name"])
    return names


def collection_path(obj: dict[str, Any]) -> str:
    api_version = str(obj["apiVersion"])
    kind = str(obj["kind"])
    plural = {
        "ServiceAccount": "serviceaccounts",
        "Secret": "secrets",
        "Namespace": "namespaces",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
        "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
        "ResourceFlavor": "resourceflavors",
        "ClusterQueue": "clusterqueues",
        "LocalQueue": "localqueues",
    }[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = obj["metadata"].get("namespace")
    if ns and kind not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
        return f"{prefix}/namespaces/{ns}/{plural}"
    return f"{prefix}/{plural}"
