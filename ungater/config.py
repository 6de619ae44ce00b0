"""The config file: a pydantic model loaded from YAML, with errors that name file, key and need.

Every key has a default, so ``ungater run`` with no file releases all built-in kinds'
``kueue.x-k8s.io/elastic-job`` gate in all namespaces. Unknown keys are errors: a typo must not
silently fall back to a default on a production cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = ["DEFAULT_GATE", "Config", "ConfigError", "KindConfig", "load_config"]

DEFAULT_GATE = "kueue.x-k8s.io/elastic-job"
WorkloadVersion = Literal["v1beta2", "v1beta1"]
_WORKLOAD_VERSIONS: tuple[WorkloadVersion, ...] = ("v1beta2", "v1beta1")
_BUILTIN_KINDS = (("batch", "Job"), ("jobset.x-k8s.io", "JobSet"), ("ray.io", "RayCluster"))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class KindConfig(_Model):
    """One elastic owner kind."""

    group: str = Field(description="API group of the owner kind; empty for the core group.")
    kind: str = Field(min_length=1)
    plugin: str | None = Field(
        default=None, description="Plugin that serves the kind; needed only if several do."
    )
    gate: str | None = Field(
        default=None, min_length=1, description="Gate to remove; defaults to `gate`."
    )


class PluginsConfig(_Model):
    allow: list[str] | None = Field(
        default=None, description="Only load these entry point names (None: all installed)."
    )
    fail_on_error: bool = Field(default=False, alias="failOnError")


class WatchConfig(_Model):
    timeout_seconds: int = Field(default=300, ge=10, le=3600, alias="timeoutSeconds")
    silence_seconds: float = Field(default=90.0, gt=0, alias="silenceSeconds")
    backoff_initial_seconds: float = Field(default=0.5, gt=0, alias="backoffInitialSeconds")
    backoff_max_seconds: float = Field(default=30.0, gt=0, alias="backoffMaxSeconds")


class ClientConfig(_Model):
    qps: float = Field(default=200.0, gt=0)
    burst: int = Field(default=400, ge=1)
    patch_concurrency: int = Field(default=32, ge=1, le=1024, alias="patchConcurrency")
    request_timeout_seconds: float = Field(default=30.0, gt=0, alias="requestTimeoutSeconds")


class LeaderElectionConfig(_Model):
    """A coordination.k8s.io/v1 Lease decides which replica acts; the others keep warm caches."""

    enabled: bool = True
    namespace: str | None = Field(
        default=None,
        description="Lease namespace; null: $POD_NAMESPACE, the service account's, else default.",
    )
    lease_name: str = Field(default="ungater", min_length=1, alias="leaseName")
    identity: str | None = Field(default=None, description="null: $POD_NAME or host, + suffix.")
    lease_duration_seconds: float = Field(default=15.0, gt=0, alias="leaseDurationSeconds")
    renew_deadline_seconds: float = Field(default=10.0, gt=0, alias="renewDeadlineSeconds")
    retry_period_seconds: float = Field(default=2.0, gt=0, alias="retryPeriodSeconds")

    @model_validator(mode="after")
    def _timings(self) -> LeaderElectionConfig:
        if self.renew_deadline_seconds >= self.lease_duration_seconds:
            raise ValueError("renewDeadlineSeconds must be less than leaseDurationSeconds")
        if self.renew_deadline_seconds <= 1.2 * self.retry_period_seconds:
            raise ValueError("renewDeadlineSeconds must exceed 1.2 x retryPeriodSeconds")
        return self


class ServerConfig(_Model):
    address: str = Field(
        default=":8080", description="host:port of /metrics, /healthz, /readyz; empty: off."
    )

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if v:
            _host, sep, port = v.rpartition(":")
            if not sep or not port.isdigit() or int(port) > 65535:
                raise ValueError(f"expected [host]:port (or empty to disable), got {v!r}")
        return v


class EventsConfig(_Model):
    enabled: bool = True
    per_object_burst: int = Field(default=25, ge=1, alias="perObjectBurst")
    per_object_interval_seconds: float = Field(
        default=300.0, gt=0, alias="perObjectIntervalSeconds"
    )
    qps: float = Field(default=10.0, gt=0)
    burst: int = Field(default=100, ge=1)
    queue_size: int = Field(default=1000, ge=1, alias="queueSize")


class LoggingConfig(_Model):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


class Config(_Model):
    """The whole config file. Keys are camelCase in YAML."""

    gate: str = Field(default=DEFAULT_GATE, min_length=1)
    kinds: list[KindConfig] = Field(
        default_factory=lambda: [KindConfig(group=g, kind=k) for g, k in _BUILTIN_KINDS]
    )
    namespaces: list[str] = Field(default_factory=list, description="Empty: all namespaces.")
    require_elastic_annotation: bool = Field(default=True, alias="requireElasticAnnotation")
    workload_api_versions: list[WorkloadVersion] = Field(
        default_factory=lambda: list(_WORKLOAD_VERSIONS), alias="workloadApiVersions", min_length=1
    )
    apply_pod_set_updates: bool = Field(default=True, alias="applyPodSetUpdates")
    workers: int = Field(default=4, ge=1, le=256)
    expectations_timeout_seconds: float = Field(
        default=30.0, gt=0, alias="expectationsTimeoutSeconds"
    )
    client: ClientConfig = Field(default_factory=ClientConfig)
    watch: WatchConfig = Field(default_factory=WatchConfig)
    plugins: PluginsConfig = Field(default_factory=PluginsConfig)
    leader_election: LeaderElectionConfig = Field(
        default_factory=LeaderElectionConfig, alias="leaderElection"
    )
    server: ServerConfig = Field(default_factory=ServerConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _unique_kinds(self) -> Config:
        seen: set[tuple[str, str]] = set()
        for k in self.kinds:
            if (k.group, k.kind) in seen:
                raise ValueError(f"kind {k.kind}.{k.group} is listed twice")
            seen.add((k.group, k.kind))
        if len(set(self.namespaces)) != len(self.namespaces):
            raise ValueError("namespaces must not repeat")
        return self

    def gate_for(self, kind: KindConfig) -> str:
        return kind.gate or self.gate

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and the key."""


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_config(path: str | Path | None) -> Config:
    """Load and validate a config file; None gives the built-in defaults."""
    if path is None:
        return Config()
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = _location(tuple(err["loc"]))
            what = err["msg"]
            if err["type"] == "extra_forbidden":
                what = "unknown key"
            lines.append(f"{p}: {where}: {what}")
        raise ConfigError("\n".join(lines)) from exc
