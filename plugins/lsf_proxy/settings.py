"""The ``proxyd:`` section typed: :class:`ProxydSettings`, built once from the section (its
defaults are the schema's, in config.py, and nowhere else), and the typed parts each
collaborator of the daemon is handed: the policy's limits, the rate limits, the hosts and
heartbeats, the connection pools, the bypass audit and the adaptive limits.

The cross-key rules live here too: a key whose effect needs another key that is missing is a
config error naming both (``gridgate config validate`` shows it as FILE:LINE), never a block that
is accepted and then does nothing.

Apart from config.py, which the gate's shims read without the settings machinery.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gridgate.core.settings import Settings
from gridgate.plugins.lsf_proxy.commands import COMMAND_OPCODES
from gridgate.plugins.lsf_proxy.config import (
    ADAPTIVE_ENTRY,
    ADAPTIVE_SOURCES,
    BYPASS_COSTS,
    BYPASS_SCHEMA,
    CATEGORIES,
    SCHEDULER_ONLY,
    SECTION_SCHEMA,
    Limits,
    PolicyError,
    absolute_address,
    duration,
    parse_tcp,
    resolve_policies,
    resolve_socket,
)

__all__ = [
    "AdaptiveEntries",
    "AdaptiveSettings",
    "AuditSettings",
    "BypassSettings",
    "CategoryNames",
    "HostSettings",
    "ProxydSettings",
    "RateLimitSettings",
    "RateLimits",
]

_Problems = list[tuple[tuple[str | int, ...], str]]


def _given(block: Any) -> dict[str, Any]:
    """The categories a per-category block gives a value for (a field per category)."""
    out = {c: getattr(block, c) for c in CATEGORIES}
    return {c: value for c, value in out.items() if value is not None}


@dataclass(frozen=True)
class HostSettings(Settings):
    """One daemon of ``proxyd.hosts``."""

    name: str
    address: str

    @property
    def unix(self) -> bool:
        return self.address.startswith("/")


@dataclass(frozen=True)
class RateLimitSettings(Settings):
    """One category's ``proxyd.rate_limit`` entry (Slurm's ``rl_*``)."""

    enable: bool
    bucket_size: float
    refill_rate: float
    refill_period: float


@dataclass(frozen=True)
class RateLimits(Settings):
    """``proxyd.rate_limit``: a bucket shape per category, None where none is given."""

    query: RateLimitSettings | None
    submission: RateLimitSettings | None
    other: RateLimitSettings | None

    def enabled(self) -> dict[str, RateLimitSettings]:
        """The categories with a rate limit switched on."""
        return {c: spec for c, spec in _given(self).items() if spec.enable}


@dataclass(frozen=True)
class CategoryNames(Settings):
    """``proxyd.categories``: extra command/opcode names per category."""

    query: tuple[str, ...] | None
    submission: tuple[str, ...] | None
    other: tuple[str, ...] | None

    def extra(self) -> dict[str, tuple[str, ...]]:
        """The names given, per category (for :func:`~gridgate.plugins.lsf_proxy.commands.category_map`)."""
        return _given(self)


@dataclass(frozen=True)
class AdaptiveSettings(Settings):
    """One category's ``proxyd.adaptive`` entry."""

    section_schema: ClassVar[Mapping[str, Any]] = ADAPTIVE_ENTRY

    source: str
    target_ms: float
    min: int
    max: int
    interval: float
    rpc_types: tuple[str, ...]
    min_requests: int
    backoff: float
    grow_after: int
    reserve: int
    light_window: float | None
    max_server_threads: int | None
    max_agent_queue: int | None

    @property
    def low(self) -> int:
        """The lowest max."""
        return self.min

    @property
    def high(self) -> int:
        """The highest max (never above the category's max in ``policies``)."""
        return self.max

    @property
    def reads_scheduler(self) -> bool:
        """The signal is read from a scheduler (``sdiag``), not the daemon's own tokens."""
        return bool(ADAPTIVE_SOURCES[self.source])

    def cross_rules(self) -> _Problems:
        problems: _Problems = []
        if self.min > self.max:
            problems.append((("min",), f"min ({self.min}) must not exceed max ({self.max})"))
        if self.reads_scheduler and self.light_window is not None:
            problems.append(
                (
                    ("light_window",),
                    "light_window watches the tokens' hold times; source "
                    f"{self.source} reads the scheduler (use source: tokens)",
                )
            )
        if not self.reads_scheduler:
            for name in SCHEDULER_ONLY:
                if getattr(self, name) not in (None, ()):
                    problems.append(
                        (
                            (name,),
                            f"{name} is read from the scheduler; source {self.source} "
                            "measures the tokens' hold times (use source: sdiag)",
                        )
                    )
        return problems


@dataclass(frozen=True)
class AdaptiveEntries(Settings):
    """``proxyd.adaptive``: an entry per category that follows the scheduler, None where not."""

    query: AdaptiveSettings | None
    submission: AdaptiveSettings | None
    other: AdaptiveSettings | None

    def entries(self) -> dict[str, AdaptiveSettings]:
        """The categories that have an entry."""
        return _given(self)

    def read_sources(self) -> list[str]:
        """The scheduler-read sources in use, sorted (``tokens`` needs none)."""
        return sorted({e.source for e in self.entries().values() if e.reads_scheduler})


@dataclass(frozen=True)
class AuditSettings(Settings):
    """``proxyd.bypass.audit``: how the scheduler's counters are read and judged."""

    interval: float
    costs: Mapping[str, float]
    default_cost: float
    tolerance: int
    timeout: float


@dataclass(frozen=True)
class BypassSettings(Settings):
    """``proxyd.bypass``: the audit of who went around the gate. The audit runs only when
    ``scheduler`` names a plugin (:attr:`ProxydSettings.bypass_audit`)."""

    section_schema: ClassVar[Mapping[str, Any]] = BYPASS_SCHEMA

    scheduler: str | None
    scheduler_options: Mapping[str, Any]
    audit: AuditSettings
    action: str
    for_: float | str
    notify_after: int
    exempt: frozenset[str]

    @property
    def plugin(self) -> str:
        """The scheduler plugin audited ("" when none is named: no audit)."""
        return self.scheduler or ""

    @property
    def options(self) -> Mapping[str, Any]:
        """The scheduler plugin's own settings."""
        return self.scheduler_options

    @property
    def interval(self) -> float:
        return self.audit.interval

    @property
    def default_cost(self) -> float:
        return self.audit.default_cost

    @property
    def tolerance(self) -> float:
        return self.audit.tolerance

    @property
    def timeout(self) -> float:
        return self.audit.timeout

    @property
    def hold(self) -> float:
        """Seconds ``block`` and ``deny_partition`` last (``for``)."""
        return duration(self.for_)

    @functools.cached_property
    def costs(self) -> Mapping[str, float]:
        """RPCs one token covers per opcode: the built-in bounds, then ``audit.costs`` (a
        command names its opcode)."""
        costs = dict(BYPASS_COSTS)
        for name, cost in self.audit.costs.items():
            costs[COMMAND_OPCODES.get(name, name)] = float(cost)
        return costs

    def cost(self, opcode: str) -> float:
        return self.costs.get(opcode, self.default_cost)


#: ``proxyd.bypass`` as the schema fills it: what a key set away from it asks for
_BYPASS_DEFAULT = BypassSettings.of(None)


@dataclass(frozen=True)
class ProxydSettings(Settings):
    """The ``proxyd:`` section, parsed once; each collaborator of the daemon takes its part."""

    section_schema: ClassVar[Mapping[str, Any]] = SECTION_SCHEMA

    socket: str
    socket_mode: str
    policies: str | Mapping[str, Any]
    max_concurrent_query: int | None
    token_wait_time: float
    queue_limit_per_user: int
    lease_time: float
    hold_limits: Mapping[str, float]
    busy_after: int | None
    busy_nice: int
    nice_caller: bool
    start_only: Mapping[str, tuple[str, ...]]
    start_hold: float
    sample_period: float
    admins: frozenset[str]
    privileged: frozenset[str] | None
    addon_hosts: frozenset[str]
    hosts: tuple[HostSettings, ...]
    heartbeat_interval: float
    heartbeat_via: str
    rate_limit: RateLimits
    name: str
    tcp: str | None
    key: Mapping[str, str] | None
    max_clock_skew: float
    diagnose: bool
    diagnose_file: str
    persist_blocklist: bool
    blocklist_file: str
    max_line_bytes: int
    line_timeout: float
    max_connections: int | None
    admin_reserve: int | None
    tcp_max_unauthenticated: int | None
    tcp_max_per_peer: int
    tcp_auth_timeout: float
    max_connections_per_user: int
    categories: CategoryNames
    metrics_port: int | None
    metrics_address: str
    notoken_ntries: int | None
    when_unavailable: str
    client_timeout: float
    bypass: BypassSettings
    adaptive: AdaptiveEntries

    @functools.cached_property
    def limits(self) -> dict[str, Limits]:
        """Every category's limits from ``policies`` and ``max_concurrent_query``.

        :raises PolicyError: naming the field inside ``policies``.
        """
        return resolve_policies(self.policies, self.max_concurrent_query)

    @property
    def host_names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def daemon_socket(self, option: str | None, name: str) -> str:
        """Where daemon ``name`` listens: ``--socket``, ``proxyd.socket``, its own Unix address
        in ``proxyd.hosts``, then as the clients look (environment, runtime directory)."""
        if option:
            return absolute_address(option)
        if self.socket:
            return self.socket
        for host in self.hosts:
            if host.name == name and host.unix:
                return host.address
        return resolve_socket(None)

    @property
    def bypass_audit(self) -> BypassSettings | None:
        """``proxyd.bypass`` when it audits (a scheduler is named), else None."""
        return self.bypass if self.bypass.scheduler else None

    @property
    def adaptive_scheduler(self) -> str:
        """The scheduler plugin the adaptive limits read: ``bypass.scheduler``, or the one
        of their source (``slurm`` for ``sdiag``); "" when none reads one."""
        read = self.adaptive.read_sources()
        return self.bypass.scheduler or (ADAPTIVE_SOURCES[read[0]] if read else "")

    def cross_rules(self) -> _Problems:
        return [
            *self._policy_problems(),
            *self._host_problems(),
            *self._tcp_problems(),
            *self._bypass_problems(),
        ]

    def _policy_problems(self) -> _Problems:
        try:
            self.limits  # noqa: B018 (resolved here to report the error)
        except PolicyError as exc:
            return [(("policies", *exc.path), str(exc))]
        return []

    def _host_problems(self) -> _Problems:
        problems: _Problems = []
        names = self.host_names
        for index, name in enumerate(names):
            if names.index(name) != index:
                problems.append((("hosts", index, "name"), f"host name {name!r} is listed twice"))
        for index, host in enumerate(self.hosts):
            if host.unix:
                continue
            if not parse_tcp(host.address):
                problems.append(
                    (
                        ("hosts", index, "address"),
                        f"{host.address!r} is neither an absolute socket path nor host:port",
                    )
                )
            elif not self.key:
                problems.append(
                    (
                        ("hosts", index, "address"),
                        "a TCP address needs the shared key: key: {env: NAME} or {file: PATH}",
                    )
                )
        return problems

    def _tcp_problems(self) -> _Problems:
        if not self.tcp:
            return []
        if not parse_tcp(self.tcp):
            return [(("tcp",), f"{self.tcp!r} is not host:port")]
        if not self.key:
            return [(("tcp",), "TCP needs a shared key: key: {env: NAME} or {file: PATH}")]
        return []

    def _bypass_problems(self) -> _Problems:
        """``proxyd.bypass`` keys set with no ``bypass.scheduler``: the audit they configure
        never runs. ``scheduler_options`` and ``audit.timeout`` also serve the adaptive limits
        of ``source: sdiag``, so they are fine where one reads the scheduler."""
        if self.bypass.scheduler:
            return []
        adaptive = bool(self.adaptive.read_sources())
        problems: _Problems = []
        for path, value, default in _bypass_keys(self.bypass):
            shared = path in _SHARED_WITH_ADAPTIVE
            if value == default or (shared and adaptive):
                continue
            also = " (or a proxyd.adaptive entry with source: sdiag)" if shared else ""
            problems.append(
                (
                    ("bypass", *path),
                    f"set, but proxyd.bypass.scheduler{also} is not: nothing reads it (name "
                    "the scheduler plugin, e.g. scheduler: slurm, or leave the key out)",
                )
            )
        return problems


#: the ``proxyd.bypass`` keys the adaptive limits read too (the scheduler plugin's options,
#: the time a reading may take)
_SHARED_WITH_ADAPTIVE = {("scheduler_options",), ("audit", "timeout")}


def _bypass_keys(bypass: BypassSettings) -> list[tuple[tuple[str, ...], Any, Any]]:
    """Each key of ``proxyd.bypass`` but ``scheduler`` (those of ``audit`` one by one), with its
    value and its schema default."""
    out: list[tuple[tuple[str, ...], Any, Any]] = []
    for f in dataclasses.fields(bypass):
        name = f.name.rstrip("_")
        if name == "scheduler":
            continue
        if name == "audit":
            for sub in dataclasses.fields(bypass.audit):
                out.append(
                    (
                        ("audit", sub.name),
                        getattr(bypass.audit, sub.name),
                        getattr(_BYPASS_DEFAULT.audit, sub.name),
                    )
                )
            continue
        out.append(((name,), getattr(bypass, f.name), getattr(_BYPASS_DEFAULT, f.name)))
    return out
