"""The config file's schema: a pydantic model (``_cli/configfile.py`` reads the YAML into it).

Every key has a default, so ``ungater run`` with no file releases all built-in kinds'
``kueue.x-k8s.io/elastic-job`` gate in all namespaces. Unknown keys are errors: a typo must not
silently fall back to a default on a production cluster. So is everything that can never work:
types are strict (no ``"true"`` for a boolean, no ``2.5`` or ``true`` for an integer), a key
given twice is an error, gate names must be Kubernetes qualified names and namespaces DNS
labels, and every duration has a sane range.

The leader-election Lease has a default location that does not depend on where the process
runs (``kube-system``, a name derived from the gates served), so ``ungater run`` on a laptop
and the in-cluster Deployment share one Lease and never lead at once. Sharding by namespace is
opt-in (``leaderElection.shardByNamespace``): a shard's Lease is then derived from the gates
*and* its namespaces, never typed by hand, so the replicas of one shard always meet on one Lease.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

__all__ = [
    "DEFAULT_GATE",
    "DEFAULT_LEASE_NAMESPACE",
    "Config",
    "KindConfig",
    "default_lease_name",
    "shard_lease_name",
]

DEFAULT_GATE = "kueue.x-k8s.io/elastic-job"
#: Where the Lease lives unless configured: a namespace every cluster has, where the control
#: plane's own leader-election Leases live too. Never the process's own namespace: a laptop and
#: a pod must find the same Lease.
DEFAULT_LEASE_NAMESPACE = "kube-system"
WorkloadVersion = Literal["v1beta2", "v1beta1"]
#: ``release``: remove the gate as far as admitted. ``audit``: watch and decide the same way,
#: never patch, and report what the gate's real releaser does against the admitted counts.
#: ``auto`` (the default): release, except a gate Kueue releases itself, which it releases only
#: while an admission policy guards it and audits otherwise (``ungater._controller.modes``).
Mode = Literal["auto", "release", "audit"]
_WORKLOAD_VERSIONS: tuple[WorkloadVersion, ...] = ("v1beta2", "v1beta1")
_BUILTIN_KINDS = (("batch", "Job"), ("jobset.x-k8s.io", "JobSet"), ("ray.io", "RayCluster"))

# Kubernetes' validation rules (k8s.io/apimachinery/pkg/util/validation).
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a DNS-1123 label (at most 63 lower-case letters, digits and "
            "'-', starting and ending with a letter or digit), so no namespace can have it"
        )
    return value


def _dns_subdomain(value: str, what: str) -> str:
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        raise ValueError(
            f"{value!r} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', "
            f"at most 253), so no {what} can have it"
        )
    return value


def _qualified_name(value: str) -> str:
    """A Kubernetes qualified name (what the API server accepts as a scheduling gate)."""
    prefix, slash, name = value.rpartition("/")
    problem = ""
    if slash and not prefix:
        problem = "the prefix before '/' is empty"
    elif prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        problem = f"the prefix {prefix!r} is not a DNS-1123 subdomain"
    elif not name:
        problem = "the name is empty"
    elif len(name) > 63:
        problem = f"the name is {len(name)} characters long (at most 63)"
    elif not _QUALIFIED_NAME_PART.match(name):
        problem = (
            f"the name {name!r} must consist of letters, digits, '-', '_' or '.' and start and "
            "end with a letter or digit"
        )
    if problem:
        raise ValueError(
            f"{value!r} is not a qualified name ([prefix/]name): {problem}; "
            "the API server accepts no such scheduling gate"
        )
    return value


def default_lease_name(gates: Iterable[str]) -> str:
    """The Lease name for a set of gates: ``ungater-<readable gates>-<8 hex of their hash>``.

    Derived from the gates alone (sorted, without repeats), so every instance releasing the
    same gates meets on the same Lease, wherever it runs and whatever kinds or namespaces it
    lists. The Helm chart computes the same name (``ungater.defaultLeaseName`` in
    ``_helpers.tpl``); a test renders both and compares them.
    """
    joined = ",".join(sorted(set(gates)))
    digest = hashlib.sha256(joined.encode()).hexdigest()[:8]
    readable = re.sub(r"[^a-z0-9]+", "-", joined.lower()).strip("-")[:30].rstrip("-")
    return f"ungater-{readable}-{digest}" if readable else f"ungater-{digest}"


def shard_lease_name(gates: Iterable[str], namespaces: Iterable[str]) -> str:
    """A shard's Lease: ``<default_lease_name(gates)>-<readable namespaces>-<8 hex>``.

    The hash covers the sorted gates and the sorted namespaces, so instances with the same
    gates and the same namespace *set* (in any order) meet on one Lease, and a shard never
    shares the unsharded Lease (which would leave its namespaces unserved while another shard
    leads). The Helm chart computes the same name (``ungater.shardLeaseName``).
    """
    gates_joined = ",".join(sorted(set(gates)))
    ns_joined = ",".join(sorted(set(namespaces)))
    digest = hashlib.sha256(f"{gates_joined}|{ns_joined}".encode()).hexdigest()[:8]
    readable = re.sub(r"[^a-z0-9]+", "-", ns_joined).strip("-")[:30].rstrip("-")
    return f"{default_lease_name(gates)}-{readable}-{digest}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, strict=True)


class KindConfig(_Model):
    """One elastic owner kind."""

    group: str = Field(description="API group of the owner kind; empty for the core group.")
    kind: str = Field(min_length=1)
    plugin: str | None = Field(
        default=None,
        min_length=1,
        description="Plugin that serves the kind; needed only if several do.",
    )
    gate: str | None = Field(
        default=None, min_length=1, description="Gate to remove; defaults to `gate`."
    )
    mode: Mode | None = Field(default=None, description="null: the top-level `mode`.")

    @field_validator("group")
    @classmethod
    def _group(cls, v: str) -> str:
        return _dns_subdomain(v, "API group") if v else v

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        # a CRD's kind must be a DNS-1035 label once lower-cased (apiextensions validation)
        if len(v) > 63 or not _DNS1035_LABEL.match(v.lower()):
            raise ValueError(
                f"{v!r} is not a Kubernetes kind name (a letter, then letters, digits or '-'; "
                "at most 63), so no object can have it"
            )
        return v

    @field_validator("gate")
    @classmethod
    def _gate(cls, v: str | None) -> str | None:
        return _qualified_name(v) if v else v


class PluginsConfig(_Model):
    allow: list[str] | None = Field(
        default=None, description="Only load these entry point names (None: all installed)."
    )
    fail_on_error: bool = Field(default=False, alias="failOnError")


class WatchConfig(_Model):
    timeout_seconds: int = Field(default=300, ge=10, le=3600, alias="timeoutSeconds")
    silence_seconds: float = Field(default=90.0, gt=0, le=3600, alias="silenceSeconds")
    backoff_initial_seconds: float = Field(default=0.5, gt=0, le=60, alias="backoffInitialSeconds")
    backoff_max_seconds: float = Field(default=30.0, gt=0, le=600, alias="backoffMaxSeconds")

    @model_validator(mode="after")
    def _backoff(self) -> WatchConfig:
        if self.backoff_initial_seconds > self.backoff_max_seconds:
            raise ValueError(
                f"backoffInitialSeconds ({self.backoff_initial_seconds:g}) must not exceed "
                f"backoffMaxSeconds ({self.backoff_max_seconds:g})"
            )
        return self


class ClientConfig(_Model):
    qps: float = Field(default=200.0, gt=0, le=100_000)
    burst: int = Field(default=400, ge=1, le=1_000_000)
    patch_concurrency: int = Field(default=32, ge=1, le=1024, alias="patchConcurrency")
    request_timeout_seconds: float = Field(
        default=30.0, gt=0, le=600, alias="requestTimeoutSeconds"
    )


class LeaderElectionConfig(_Model):
    """A coordination.k8s.io/v1 Lease decides which replica acts; the others keep warm caches."""

    enabled: bool = True
    namespace: str | None = Field(
        default=None,
        description=f"Lease namespace; null: {DEFAULT_LEASE_NAMESPACE}, wherever ungater runs.",
    )
    lease_name: str | None = Field(
        default=None,
        alias="leaseName",
        description="Lease name; null: derived from the gates (see default_lease_name).",
    )
    shard_by_namespace: bool = Field(
        default=False,
        alias="shardByNamespace",
        description="One Lease per namespace set (needs `namespaces`, derives the name).",
    )
    identity: str | None = Field(
        default=None, min_length=1, description="null: $POD_NAME or host, + suffix."
    )
    lease_duration_seconds: float = Field(default=15.0, ge=1, le=600, alias="leaseDurationSeconds")
    renew_deadline_seconds: float = Field(default=10.0, gt=0, le=600, alias="renewDeadlineSeconds")
    retry_period_seconds: float = Field(default=2.0, gt=0, le=60, alias="retryPeriodSeconds")

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        return _dns_label(v) if v is not None else v

    @field_validator("lease_name")
    @classmethod
    def _lease_name(cls, v: str | None) -> str | None:
        return _dns_subdomain(v, "Lease") if v is not None else v

    @model_validator(mode="after")
    def _timings(self) -> LeaderElectionConfig:
        # the same rules as LeaderElector's (and JITTER there is 1.2)
        if self.renew_deadline_seconds >= self.lease_duration_seconds:
            raise ValueError(
                f"renewDeadlineSeconds ({self.renew_deadline_seconds:g}) must be less than "
                f"leaseDurationSeconds ({self.lease_duration_seconds:g}): a leader must stop "
                "before its Lease can expire"
            )
        if self.renew_deadline_seconds <= 1.2 * self.retry_period_seconds:
            raise ValueError(
                f"renewDeadlineSeconds ({self.renew_deadline_seconds:g}) must exceed 1.2 x "
                f"retryPeriodSeconds ({self.retry_period_seconds:g}), or one slow retry loses "
                "the Lease"
            )
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

    @property
    def loopback(self) -> bool:
        """Bound to a loopback address: a kubelet's probes cannot reach it."""
        host = self.address.rpartition(":")[0].strip("[]").lower()
        return host == "localhost" or host == "::1" or host.startswith("127.")


class EventsConfig(_Model):
    enabled: bool = True
    per_object_burst: int = Field(default=25, ge=1, le=10_000, alias="perObjectBurst")
    per_object_interval_seconds: float = Field(
        default=300.0, gt=0, le=86_400, alias="perObjectIntervalSeconds"
    )
    qps: float = Field(default=10.0, gt=0, le=10_000)
    burst: int = Field(default=100, ge=1, le=100_000)
    queue_size: int = Field(default=1000, ge=1, le=1_000_000, alias="queueSize")


class AuditConfig(_Model):
    """What audit mode (and ``ungater audit``) reports, and when."""

    stall_seconds: float = Field(default=30.0, gt=0, le=86_400, alias="stallSeconds")
    report_after_seconds: float = Field(default=2.0, ge=0, le=3600, alias="reportAfterSeconds")


class StandDownConfig(_Model):
    """What a releasing kind does when another writer keeps removing its gate."""

    action: Literal["audit", "exit", "keepReleasing"] = "audit"
    foreign_releases: int = Field(default=3, ge=1, le=10_000, alias="foreignReleases")
    window_seconds: float = Field(default=300.0, gt=0, le=86_400, alias="windowSeconds")
    #: A kind stood down to audit releases again once no other writer has removed its gate
    #: for this long (a stand-down on a false alarm must not hold gates for good); 0: never.
    resume_after_seconds: float = Field(
        default=900.0, ge=0, le=7 * 86_400, alias="resumeAfterSeconds"
    )


class ReleaseBlockedConfig(_Model):
    """Per-pod backoff after the API server refused a release for good."""

    initial_backoff_seconds: float = Field(
        default=5.0, gt=0, le=3600, alias="initialBackoffSeconds"
    )
    max_backoff_seconds: float = Field(default=900.0, gt=0, le=86_400, alias="maxBackoffSeconds")

    @model_validator(mode="after")
    def _order(self) -> ReleaseBlockedConfig:
        if self.initial_backoff_seconds > self.max_backoff_seconds:
            raise ValueError(
                f"initialBackoffSeconds ({self.initial_backoff_seconds:g}) must not exceed "
                f"maxBackoffSeconds ({self.max_backoff_seconds:g})"
            )
        return self


class LoggingConfig(_Model):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"
    trace: bool = Field(
        default=False,
        description="One TRACE line per step of each owner's path (ungater._observe.trace).",
    )

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


class Config(_Model):
    """The whole config file. Keys are camelCase in YAML."""

    gate: str = Field(default=DEFAULT_GATE, min_length=1)
    mode: Mode = "auto"
    kinds: list[KindConfig] = Field(
        default_factory=lambda: [KindConfig(group=g, kind=k) for g, k in _BUILTIN_KINDS],
        min_length=1,
    )
    namespaces: list[Annotated[str, AfterValidator(_dns_label)]] = Field(
        default_factory=list, description="Empty: all namespaces."
    )
    require_elastic_annotation: bool = Field(default=True, alias="requireElasticAnnotation")
    workload_api_versions: list[WorkloadVersion] = Field(
        default_factory=lambda: list(_WORKLOAD_VERSIONS), alias="workloadApiVersions", min_length=1
    )
    apply_pod_set_updates: bool = Field(default=True, alias="applyPodSetUpdates")
    workers: int = Field(default=4, ge=1, le=256)
    expectations_timeout_seconds: float = Field(
        default=30.0, gt=0, le=3600, alias="expectationsTimeoutSeconds"
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
    audit: AuditConfig = Field(default_factory=AuditConfig)
    stand_down: StandDownConfig = Field(default_factory=StandDownConfig, alias="standDown")
    release_blocked: ReleaseBlockedConfig = Field(
        default_factory=ReleaseBlockedConfig, alias="releaseBlocked"
    )
    slice_handover_grace_seconds: float = Field(
        default=2.0, ge=0, le=600, alias="sliceHandoverGraceSeconds"
    )
    policy_check_interval_seconds: float = Field(
        default=300.0,
        ge=0,
        le=86_400,
        alias="policyCheckIntervalSeconds",
        description="How often to look for an admission policy guarding the gate; 0: never.",
    )

    @field_validator("gate")
    @classmethod
    def _gate(cls, v: str) -> str:
        return _qualified_name(v)

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

    @model_validator(mode="after")
    def _shard(self) -> Config:
        le = self.leader_election
        if le.shard_by_namespace and not self.namespaces:
            raise ValueError(
                "leaderElection.shardByNamespace needs `namespaces`: a shard of all namespaces "
                "would overlap every other shard"
            )
        derived = shard_lease_name(self.gates, self.namespaces) if le.shard_by_namespace else ""
        if le.shard_by_namespace and le.lease_name and le.lease_name != derived:
            # the derived name itself is accepted: what `check-config` prints must load again
            raise ValueError(
                "leaderElection.shardByNamespace derives the Lease name from the gates and "
                f"namespaces ({derived}); leave leaseName unset, so no two shards can share or "
                "mistype one"
            )
        return self

    def gate_for(self, kind: KindConfig) -> str:
        return kind.gate or self.gate

    def mode_for(self, kind: KindConfig) -> Mode:
        return kind.mode or self.mode

    @property
    def patches_pods(self) -> bool:
        """Some kind may release (``release`` or ``auto``: needs ``pods/patch``); all-audit
        needs only reads."""
        return any(self.mode_for(k) != "audit" for k in self.kinds)

    @property
    def gates(self) -> list[str]:
        """Every gate this config releases, sorted, without repeats."""
        return sorted({self.gate_for(k) for k in self.kinds})

    @property
    def lease_namespace(self) -> str:
        """The Lease's namespace: configured, else ``kube-system`` (never where we run)."""
        return self.leader_election.namespace or DEFAULT_LEASE_NAMESPACE

    @property
    def lease_name(self) -> str:
        """The Lease's name: configured, else derived from the gates (and, for a shard, from
        its namespaces)."""
        if self.leader_election.shard_by_namespace:
            return shard_lease_name(self.gates, self.namespaces)
        return self.leader_election.lease_name or default_lease_name(self.gates)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
