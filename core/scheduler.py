"""What a scheduler's controller tells the token daemon about itself: the RPCs it served (the
bypass audit and the adaptive limits), the requests it logged, and whether a user was refused
or admitted again. A backend plugin that can read them answers the scheduler hooks of
:mod:`gridgate.core.hookspecs` (``gridgate_scheduler_rpcs``, ``gridgate_scheduler_requests``,
``gridgate_scheduler_deny``) with these values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gridgate.core.model import CommandResult

__all__ = [
    "RpcCount",
    "SchedulerChange",
    "SchedulerRPCs",
    "SchedulerRequest",
    "SchedulerRequests",
]


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class RpcCount:
    """One row of a scheduler's RPC statistics: how many requests and their total time."""

    count: int
    total_ms: float = 0.0

    @property
    def average_ms(self) -> float:
        return self.total_ms / self.count if self.count else 0.0


@dataclass(frozen=True)
class SchedulerRPCs:
    """What a scheduler's controller says it has served, for the token daemon's bypass audit
    and adaptive limits (:func:`gridgate.core.hookspecs.gridgate_scheduler_rpcs`).

    The counters are cumulative since ``since`` (epoch seconds): when ``since`` changes or a
    counter drops (a restart, ``sdiag --reset``), the reader starts a new baseline. ``by_user``
    is RPCs per user name, ``by_type`` per request type (Slurm's ``REQUEST_JOB_INFO``), ``load``
    the controller's own gauges (``server_threads``, ``agent_queue``). ``ok`` False (with
    ``message``) when the statistics could not be read; ``command`` is what was run.
    """

    scheduler: str
    ok: bool
    taken: float = 0.0
    since: float = 0.0
    by_user: Mapping[str, int] = field(default_factory=dict)
    by_type: Mapping[str, RpcCount] = field(default_factory=dict)
    load: Mapping[str, float] = field(default_factory=dict)
    message: str = ""
    command: CommandResult | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_user", _frozen_mapping(self.by_user))
        object.__setattr__(self, "by_type", _frozen_mapping(self.by_type))
        object.__setattr__(self, "load", _frozen_mapping(self.load))


@dataclass(frozen=True)
class SchedulerChange:
    """The answer of :func:`gridgate.core.hookspecs.gridgate_scheduler_deny`: whether the
    scheduler now refuses (or again admits) the user, what was changed, or why not."""

    scheduler: str
    ok: bool
    message: str = ""
    changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class SchedulerRequest:
    """One request the scheduler's controller logged: when (epoch seconds), from which user
    and host, of which type (Slurm's ``REQUEST_JOB_INFO``)."""

    at: float
    user: str
    opcode: str
    host: str


@dataclass(frozen=True)
class SchedulerRequests:
    """The answer of :func:`gridgate.core.hookspecs.gridgate_scheduler_requests`: the requests
    logged since the last call while the trace is on, or why they could not be read."""

    scheduler: str
    ok: bool
    requests: tuple[SchedulerRequest, ...] = ()
    message: str = ""
