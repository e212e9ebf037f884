"""The state of the director's loop that its parts share: :class:`Runtime`, what every part reads
that a config reload replaces (the config, the plugins, the failing cache with its expiries; the
director updates that one object in place), and :class:`Iteration`, one iteration's state,
shared by its submission and status threads."""

from __future__ import annotations

import functools
import getpass
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pluggy

from gridgate.core.clock import Clock
from gridgate.core.config import Config
from gridgate.core.credential_names import CredentialChoice
from gridgate.core.endpoint_state import EndpointState
from gridgate.core.engine.limits import PilotRoom
from gridgate.core.engine.retry import ResubmitPolicy
from gridgate.core.engine.section import DirectorSettings
from gridgate.core.failing import FailingCache
from gridgate.core.model import (
    AccountingRecord,
    Availability,
    BackendInfo,
    CredentialStatus,
    Endpoint,
    FailureReport,
    IterationInfo,
    Notification,
    PilotReport,
    PollReport,
    RetryReport,
    SubmitRequest,
)
from gridgate.core.state import StateStore

#: The state store's accounting table: one row per submission attempt.
ACCOUNTING = "accounting"
#: The state store's failures of servers that were no submission (a status poll, aborting
#: pilots, a cancel): one row each, counted by `gridgate report` beside the failed submissions
#: of ``ACCOUNTING``, which has one row per submission attempt and so cannot hold them.
FAILURES = "failures"
#: The state store's episodes that are no failure of a server: an endpoint's availability
#: starting, changing or ending, a credential becoming unusable or usable again; one row each
#: (``what``, ``subject``, ``state``, ``source``, ``reason``), for `gridgate report`.
EPISODES = "episodes"


class Broadcast(Protocol):
    """Calls every implementation of a broadcast hook, each on its own (``Director.broadcast``),
    and gives back each one's answer that was not None, as (plugin name, answer)."""

    def __call__(
        self, hook_name: str, role: str, what: str = "", **kwargs: Any
    ) -> list[tuple[str, Any]]: ...


@dataclass
class Runtime:
    """What an iteration and its collaborators read: the store, the clock, how to tell people
    and plugins, and what a config reload replaces (``config``, ``pm``, ``failing``). The
    director owns it and updates it in place, so no collaborator keeps a stale config."""

    config: Config
    pm: pluggy.PluginManager
    failing: FailingCache
    state: StateStore
    clock: Clock
    notify: Callable[[Notification], None]
    broadcast: Broadcast
    #: the config the settings below were built from, and those settings
    _parsed: tuple[Config, DirectorSettings] | None = field(default=None, repr=False)

    @property
    def settings(self) -> DirectorSettings:
        """The config's ``director`` section, typed: built once per config in force (a reload
        replaces ``config``; the next read builds the new one's)."""
        parsed = self._parsed
        if parsed is None or parsed[0] is not self.config:
            parsed = self._parsed = (self.config, DirectorSettings.of_config(self.config))
        return parsed[1]

    @property
    def user(self) -> str:
        """Who the director says it is to admission control: ``director.user``, else the login
        of its uid."""
        return self.settings.user or _login()

    def timeout(self, info: BackendInfo) -> float:
        """The deadline of one of ``info``'s commands, in seconds."""
        return float(info.command_timeout or self.settings.command_timeout)


@functools.cache
def _login() -> str:
    """The login of the director's uid, looked up once a process (1.2 ms a call through NSS
    here, and it was asked for each submission; the uid does not change)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@dataclass
class Iteration:
    """One iteration's state, shared by its submission and status threads (under ``lock``): what
    it accounted, excluded, told and retried, the backends it paused, the pilot limits."""

    info: IterationInfo
    failing: set[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    excluded: list[str] = field(default_factory=list)
    records: list[AccountingRecord] = field(default_factory=list)
    notifications: list[Notification] = field(default_factory=list)
    failures: list[FailureReport] = field(default_factory=list)
    #: backends whose commands cannot run on this machine: paused for the rest of the iteration
    local_faults: set[str] = field(default_factory=set)
    retry: ResubmitPolicy = field(default_factory=lambda: ResubmitPolicy(0, 0.0))
    retries: list[RetryReport] = field(default_factory=list)
    #: room under max_waiting / max_total, None when not tracking
    limits: PilotRoom | None = None
    #: what the pilot tracker did this iteration, for the summary (None: not tracking)
    pilots: PilotReportDraft | None = None
    #: what each credential plugin reported before anything was polled or submitted
    credentials: tuple[CredentialStatus, ...] = ()
    #: the credentials unusable this iteration, by name
    unusable: dict[str, CredentialStatus] = field(default_factory=dict)
    #: what uses each unusable credential, by name (backends, endpoints, demand groups)
    credential_users: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: which named credential each backend, endpoint and demand group uses (from the config)
    choice: CredentialChoice = field(default_factory=CredentialChoice)
    #: why the credential check itself failed (a plugin raised): nothing needing one submits
    credential_crash: str = ""
    #: the endpoints not fully available this iteration, by key (merged answers of
    #: gridgate_endpoint_availability); an endpoint not in it is available
    availability: dict[str, Availability] = field(default_factory=dict)
    #: what each backend with endpoints said of itself when availability was asked (the plan
    #: reuses it, so a backend is asked once for the plan and once by the tracker)
    infos: dict[str, BackendInfo | None] = field(default_factory=dict)
    #: endpoint keys not searched yet for the pilots of a store that came back empty: they
    #: get no pilot this iteration
    unsearched: set[str] = field(default_factory=set)
    #: endpoint keys with an open failure episode or cleared by hand, not yet seen answering
    #: this iteration (:meth:`FailingCache.troubled`): a success of theirs may be a recovery
    troubled: set[str] = field(default_factory=set)
    #: what each endpoint's queue said of itself this iteration, by key
    #: (``gridgate_endpoint_state``; :mod:`gridgate.core.engine.queue_state`)
    queues: dict[str, EndpointState] = field(default_factory=dict)

    def credential_block(
        self, info: BackendInfo, endpoint: Endpoint | None = None, credential: str = ""
    ) -> str:
        """Why ``info``'s backend may not use its credentials this iteration (on ``endpoint``,
        for a demand group naming ``credential``): ``credential`` (one it would use is
        unusable), ``plugin_error`` (the check crashed), '' when it may."""
        if not info.credentials:
            return ""
        if self.credential_crash:
            return "plugin_error"
        return "credential" if self.waits_for(info, endpoint, credential) else ""

    def waits_for(
        self, info: BackendInfo, endpoint: Endpoint | None = None, credential: str = ""
    ) -> list[str]:
        """The unusable credentials, by name, that ``info``'s backend would use (on
        ``endpoint``, for a demand group naming ``credential``)."""
        where = None if endpoint is None else endpoint.name
        names = self.choice.names(info.backend, info.credentials, where, credential)
        return sorted({name for name in names.values() if name in self.unusable})

    def credentials_of(self, endpoint: Endpoint) -> dict[str, str]:
        """kind -> name of the credentials ``endpoint``'s polls and cancels use (its own, else
        its backend's, else the first of each kind its backend needs), whoever's pilots."""
        info = self.infos.get(endpoint.backend)
        needs = info.credentials if info is not None else ()
        return self.choice.names(endpoint.backend, needs, endpoint.name)

    def blocked_everywhere(self, info: BackendInfo, credential: str = "") -> str:
        """Why ``info``'s backend may use no endpoint for its credentials this iteration (for
        a demand group naming ``credential``; without one, for polling): every endpoint's
        :meth:`credential_block` says ``credential``, or the check crashed; '' when one may."""
        if not info.credentials:
            return ""
        if self.credential_crash:
            return "plugin_error"
        if not info.endpoints:
            return self.credential_block(info, None, credential)
        blocked = {self.credential_block(info, e, credential) for e in info.endpoints}
        return "credential" if blocked == {"credential"} else ""

    def paused(self, info: BackendInfo) -> bool:
        """Whether ``info``'s backend is paused this iteration (a local fault, or the
        credential of every endpoint is unusable): none of its pilots is polled."""
        with self.lock:
            if info.backend in self.local_faults:
                return True
        return bool(self.blocked_everywhere(info))

    def exclude(self, endpoint: Endpoint) -> None:
        """Take ``endpoint`` out of rotation for the rest of the iteration."""
        with self.lock:
            if endpoint.key not in self.excluded:
                self.excluded.append(endpoint.key)

    def usable(self, endpoints: Iterable[Endpoint]) -> list[Endpoint]:
        """``endpoints`` in rotation: neither excluded this iteration nor in the failing cache
        when it began."""
        with self.lock:
            gone = set(self.excluded) | self.failing
        return [e for e in endpoints if e.key not in gone]

    def submittable(self, endpoints: Iterable[Endpoint]) -> list[Endpoint]:
        """``endpoints`` that may get new pilots: usable, neither drained nor banned, and
        searched for the pilots of a store that came back empty."""
        return [
            e
            for e in self.usable(endpoints)
            if not self.withdrawn(e) and e.key not in self.unsearched
        ]

    def withdrawn(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint`` is drained or banned this iteration (no new pilots)."""
        state = self.availability.get(endpoint.key)
        return state is not None and state.state in ("drained", "banned")

    def pollable(self, info: BackendInfo) -> list[Endpoint]:
        """``info``'s endpoints whose pilots are polled: usable, their credential usable, and
        not banned when the backend says a banned server cannot be asked (``BackendInfo.poll_banned`` False)."""
        # an endpoint whose credential is unusable is not asked (it would only be refused)
        endpoints = [e for e in self.usable(info.endpoints) if not self.credential_block(info, e)]
        if info.poll_banned:
            return endpoints
        return [e for e in endpoints if self.state_of(e) != "banned"]

    def state_of(self, endpoint: Endpoint) -> str:
        """``endpoint``'s availability state this iteration."""
        state = self.availability.get(endpoint.key)
        return "available" if state is None else state.state

    def in_downtime(self, endpoint: Endpoint) -> Availability | None:
        """What GOCDB says of ``endpoint`` when it is in a downtime (banned or degraded with
        ``gocdb`` among the merged answer's sources); None otherwise."""
        state = self.availability.get(endpoint.key)
        if state is None or "gocdb" not in state.source.split(","):
            return None
        return state


@dataclass
class PilotReportDraft:
    """The iteration's pilot report while it is being made: the tracker fills it before the
    submissions, and they update ``trimmed`` (room they found taken) and ``states`` (pilots
    they submitted); the summary is :meth:`freeze`'s."""

    polls: list[PollReport] = field(default_factory=list)
    changed: int = 0
    cancelled: dict[str, int] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    trimmed: dict[str, dict[str, int]] = field(default_factory=dict)
    states: dict[str, dict[str, int]] = field(default_factory=dict)
    blind: str = ""

    def freeze(self) -> PilotReport:
        return PilotReport(
            polls=tuple(self.polls),
            changed=self.changed,
            cancelled=dict(self.cancelled),
            aborted=tuple(self.aborted),
            trimmed=self.trimmed,
            states=self.states,
            blind=self.blind,
        )


@dataclass
class Sending:
    """One demand request on its way to a server: its backend and iteration, the servers it was
    tried on, and the parts left over when a server had room for only some of its pilots."""

    info: BackendInfo
    it: Iteration
    request: SubmitRequest
    tried: list[Endpoint] = field(default_factory=list)
    leftover: list[SubmitRequest] = field(default_factory=list)
    #: the room this attempt holds in the store (a reservation's holder), settled after it
    reservation: str = ""
    #: whether the tracker may settle it with the pilots (it knows the submission's name)
    reservation_named: bool = False
