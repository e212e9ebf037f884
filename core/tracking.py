"""Closes the director's loop: it polls the pilots it submitted, bounds what waits, cancels what
waited too long, and takes out of rotation an endpoint whose pilots abort.

At the start of each iteration, after the demand hooks and before anything is submitted, the
:class:`PilotTracker` polls each endpoint that is due (``status_interval``) with one
``gridgate_job_status`` call carrying every non-terminal pilot of that endpoint, under an
admission grant of category ``query`` and the command deadline. A failed query is a failure of
that server, classified and escalated like a failed submission; its pilots keep their last
state. Then the demand is trimmed to ``max_waiting`` and ``max_waiting_cores`` (per endpoint)
and ``max_total`` (per backend), and each submission reserves room on the endpoint it goes to.
"""

from __future__ import annotations

import getpass
import json
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from gridgate.core.model import (
    PILOT_STATES,
    AccountingRecord,
    AdmissionRequest,
    BackendInfo,
    DemandRegistry,
    Endpoint,
    Failure,
    PilotReport,
    PollReport,
    Refusal,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.pilots import Counts, Pilot, PilotRegistry
from gridgate.core.state import StateError

if TYPE_CHECKING:
    from gridgate.core.iteration import FailurePath, Iteration, Runtime

#: Where the time of an endpoint's last ``aborted`` verdict is kept: the next verdict counts
#: only pilots that finished after it.
VERDICT = "aborted-verdict/"
#: An endpoint's last poll (its time, with status_interval as TTL) in the shared state store:
#: of several directors on one store, one polls an endpoint per interval.
POLLED = "pilots-polled/"
#: When this director first saw pilots of an endpoint that is no longer configured (a retired
#: server or partition): they leave the limits at once, with a notice, and go ``lost`` when the
#: backend cannot say what became of them ``lost_after`` seconds after that.
RETIRED = "pilots-retired/"
#: When the backend last answered for a retired endpoint's pilots: ``lost_after`` counts from it.
RETIRED_OK = "pilots-retired-ok/"
#: Under ``director.state_dir``: the last counts read from the registry and the pilots the store
#: could not take, so that a director restarted while the store is still down keeps the limits
#: closed, and writes those pilots back when the store returns.
PENDING_FILE = "pilots-pending.json"
#: States whose share decides whether an endpoint's pilots abort (``cancelled`` was our own
#: doing, ``lost`` says nothing of how the pilot ended).
DECIDING = ("done", "failed")

#: The defaults of the limits that bound what waits (docs/pilots.md says why these): DIRAC's
#: SiteDirector keeps at most 10 pilots waiting per CE queue unless told otherwise, and an
#: endpoint here is a CE, a WMS or a partition serving a few such queues; Harvester gives up
#: on a worker queued for two days (workerQueueTimeLimit). ``null`` in the config: no limit.
DEFAULT_MAX_WAITING = 20
DEFAULT_MAX_WAIT_TIME = 2 * 86400
#: The largest a count of cores may be in a limit: far beyond any site (a million cores).
MAX_CORES_LIMIT = 10_000_000

_LIMITS: dict[str, Any] = {
    "status_interval": {
        "maximum": 86400,
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "description": "Seconds between two status polls of an endpoint "
        "(null: poll at every iteration).",
    },
    "max_waiting": {
        "type": ["integer", "null"],
        "minimum": 0,
        "description": "At most this many pilots waiting on each endpoint: demand "
        "beyond it is trimmed (null: no limit).",
    },
    "max_waiting_cores": {
        "type": ["integer", "null"],
        "minimum": 0,
        "maximum": MAX_CORES_LIMIT,
        "description": "At most this many cores of pilots waiting on each endpoint (a pilot "
        "counts its resources.cores): demand beyond it is trimmed (null: no limit).",
    },
    "max_total": {
        "type": ["integer", "null"],
        "minimum": 0,
        "description": "At most this many non-terminal pilots per backend (null: no limit).",
    },
    "max_wait_time": {
        "maximum": 365 * 86400,
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "description": "Pilots waiting longer than this many seconds are cancelled (null: never).",
    },
}

_DEFAULTS: dict[str, Any] = {
    "max_waiting": DEFAULT_MAX_WAITING,
    "max_wait_time": DEFAULT_MAX_WAIT_TIME,
}
#: The limits an endpoint of a backend may set for itself.
_PER_ENDPOINT = ("max_waiting", "max_waiting_cores", "max_wait_time")

PILOTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "default": {},
    "description": "Tracking submitted pilots: status polling, limits on what waits, aborted "
    "pilots (docs/pilots.md).",
    "properties": {
        "track": {
            "type": "boolean",
            "default": True,
            "description": "Record every submitted pilot and poll its state.",
        },
        **{k: {**v, "default": _DEFAULTS.get(k)} for k, v in _LIMITS.items()},
        "lost_after": {
            "maximum": 365 * 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 3600,
            "description": "A pilot the backend has not known (state unknown) for this "
            "many seconds becomes lost (terminal).",
        },
        "keep_finished": {
            "maximum": 365 * 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 7 * 86400,
            "description": "Terminal pilots are kept this many seconds for the "
            "accounting, then pruned.",
        },
        "abort_window": {
            "type": "integer",
            "minimum": 1,
            "maximum": 10000,
            "default": 20,
            "description": "The verdict on an endpoint's pilots looks at its last "
            "this many finished (done or failed) pilots.",
        },
        "abort_min_finished": {
            "type": "integer",
            "minimum": 1,
            "default": 10,
            "description": "No verdict on fewer finished pilots than this.",
        },
        "abort_threshold": {
            "type": "number",
            "minimum": 0,
            "exclusiveMaximum": 1,
            "default": 0.5,
            "description": "An endpoint whose failed share of those pilots is "
            "above this fails with kind aborted.",
        },
        "abort_sample": {
            "type": "integer",
            "minimum": 0,
            "default": 5,
            "description": "How many native reasons the notification quotes.",
        },
        "backends": {
            "type": "object",
            "default": {},
            "description": "Per backend (by entry-point name): overrides of the settings above.",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    **_LIMITS,
                    "endpoints": {
                        "type": "object",
                        "description": "Per endpoint name: max_waiting, max_waiting_cores and "
                        "max_wait_time overrides.",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {k: _LIMITS[k] for k in _PER_ENDPOINT},
                            "additionalProperties": False,
                        },
                    },
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class PilotSettings:
    """The ``director.pilots`` section, resolved per backend and endpoint: a limit a backend
    (or an endpoint of it) sets, ``null`` included (no limit), wins over the one above it; a
    limit it does not name is the one above it."""

    section: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.section.get(key, PILOTS_SCHEMA["properties"][key].get("default"))

    def _backend(self, backend: str) -> Mapping[str, Any]:
        return (self.section.get("backends") or {}).get(backend) or {}

    def for_backend(self, backend: str, key: str) -> Any:
        own = self._backend(backend)
        return own[key] if key in own else self[key]

    def for_endpoint(self, endpoint: Endpoint, key: str) -> Any:
        own = (self._backend(endpoint.backend).get("endpoints") or {}).get(endpoint.name) or {}
        return own[key] if key in own else self.for_backend(endpoint.backend, key)


def _user(configured: str) -> str:
    try:
        return configured or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


class Limits:
    """Room left this iteration under ``max_waiting`` and ``max_waiting_cores`` (per endpoint)
    and ``max_total`` (per backend), shared by the submission threads: each submission
    reserves what it takes (its pilots, and their cores: ``count x resources.cores``).

    ``waiting_cores`` is the cores of the pilots waiting on each endpoint (by endpoint key);
    an endpoint not in it counts one core per waiting pilot (what every pilot was before
    pilots had cores)."""

    def __init__(
        self,
        settings: PilotSettings,
        counts: Counts,
        infos: Mapping[str, BackendInfo],
        blind: Iterable[str] = (),
        retired: Iterable[str] = (),
        waiting_cores: Mapping[str, int] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self.endpoint_room: dict[str, int | None] = {}
        #: cores left under max_waiting_cores per endpoint key (None: no limit)
        self.cores_room: dict[str, int | None] = {}
        self.backend_room: dict[str, int | None] = {}
        self.trimmed: dict[str, dict[str, int]] = {}
        waiting: dict[str, int] = {}
        active: dict[str, int] = {}
        gone = set(retired)  # keys of endpoints no longer configured: they hold no room
        for (backend, endpoint, state), n in counts.items():
            if f"{backend}/{endpoint}" in gone:
                continue
            if state == "waiting":
                key = f"{backend}/{endpoint}"
                waiting[key] = waiting.get(key, 0) + n
            if state not in ("done", "failed", "cancelled", "lost"):
                active[backend] = active.get(backend, 0) + n
        for backend, info in infos.items():
            if backend in blind:  # it cannot say when pilots start: a limit would only block
                self.backend_room[backend] = None
                self.endpoint_room.update((e.key, None) for e in info.endpoints)
                self.cores_room.update((e.key, None) for e in info.endpoints)
                continue
            total = settings.for_backend(backend, "max_total")
            self.backend_room[backend] = (
                None if total is None else max(0, total - active.get(backend, 0))
            )
            for server in info.endpoints:
                limit = settings.for_endpoint(server, "max_waiting")
                self.endpoint_room[server.key] = (
                    None if limit is None else max(0, limit - waiting.get(server.key, 0))
                )
                cores = settings.for_endpoint(server, "max_waiting_cores")
                used = (waiting_cores or {}).get(server.key, waiting.get(server.key, 0))
                self.cores_room[server.key] = None if cores is None else max(0, cores - used)

    def _count(self, backend: str, limit: str, n: int) -> None:
        if n > 0:
            mine = self.trimmed.setdefault(backend, {})
            mine[limit] = mine.get(limit, 0) + n

    def trim(
        self, requests: Sequence[SubmitRequest], usable: Mapping[str, Sequence[Endpoint]]
    ) -> tuple[list[SubmitRequest], list[tuple[SubmitRequest, str, int]]]:
        """Cut ``requests`` (in order) to what fits; returns the kept requests and, per cut,
        (request, limit, pilots cut)."""
        left: dict[str, tuple[float, float, float]] = {}
        kept: list[SubmitRequest] = []
        cuts: list[tuple[SubmitRequest, str, int]] = []
        for request in requests:
            backend = request.backend
            if backend not in self.backend_room:  # not configured: the director says so later
                kept.append(request)
                continue
            if backend not in left:
                servers = usable.get(backend, ())
                # no server in rotation: not a limit's doing (the director reports no_endpoint)
                room = self.backend_room[backend]
                left[backend] = (
                    _summed([self.endpoint_room.get(e.key) for e in servers]),
                    math.inf if room is None else float(room),
                    _summed([self.cores_room.get(e.key) for e in servers]),
                )
            per_endpoint, total, cores = left[backend]
            size = _cores_of(request)
            by_cores = cores if math.isinf(cores) else float(int(cores // size))
            take = int(min(request.count, per_endpoint, total, by_cores))
            if take < request.count:
                # the tightest limit names the cut; on a tie, max_waiting first, then cores
                limit = min(
                    (per_endpoint, 0, "max_waiting"),
                    (by_cores, 1, "max_waiting_cores"),
                    (total, 2, "max_total"),
                )[2]
                cuts.append((request, limit, request.count - take))
                self._count(backend, limit, request.count - take)
            if take > 0:
                kept.append(replace(request, count=take))
            left[backend] = (per_endpoint - take, total - take, cores - take * size)
        return kept, cuts

    def skipped(self, backend: str, n: int) -> None:
        """``n`` pilots found no server with room when they were to be sent."""
        with self._lock:
            self._count(backend, "max_waiting", n)

    def with_room(self, candidates: Iterable[Endpoint], cores: int = 1) -> list[Endpoint]:
        """The candidates that can still take a pilot (of ``cores`` cores)."""
        with self._lock:
            return [
                e
                for e in candidates
                if self.backend_room.get(e.backend) != 0
                and self.endpoint_room.get(e.key) != 0
                and (self.cores_room.get(e.key) is None or self.cores_room[e.key] >= cores)  # type: ignore[operator]
            ]

    def reserve(self, endpoint: Endpoint, request: SubmitRequest) -> SubmitRequest | None:
        """Take room on ``endpoint`` for ``request``: the request as it fits (maybe smaller:
        the caller sends the rest elsewhere), or None when another thread took the last of it
        (the caller may try another server). The caller says :meth:`skipped` for what no
        server had room for."""
        size = _cores_of(request)
        with self._lock:
            cores = self.cores_room.get(endpoint.key)
            rooms = [
                r
                for r in (
                    self.endpoint_room.get(endpoint.key),
                    self.backend_room.get(endpoint.backend),
                    None if cores is None else cores // size,
                )
                if r is not None
            ]
            take = min([request.count, *rooms])
            if take <= 0:
                return None
            if self.endpoint_room.get(endpoint.key) is not None:
                self.endpoint_room[endpoint.key] -= take  # type: ignore[operator]
            if self.backend_room.get(endpoint.backend) is not None:
                self.backend_room[endpoint.backend] -= take  # type: ignore[operator]
            if cores is not None:
                self.cores_room[endpoint.key] = cores - take * size
            if take < request.count:
                return replace(request, count=take)
            return request


def _cores_of(request: SubmitRequest) -> int:
    """The cores of one pilot of ``request`` (1 when it asks no resources)."""
    return request.resources.cores if request.resources is not None else 1


def _summed(rooms: Sequence[int | None]) -> float:
    """The room of several endpoints together: infinite when there are none or one has no
    limit."""
    if not rooms or any(r is None for r in rooms):
        return math.inf
    return float(sum(r for r in rooms if r is not None))


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
class _Poll:
    """What polling one endpoint did, for the iteration's ``pilots`` report."""

    endpoint: Endpoint
    pilots: int
    outcome: str  # ok, failed, refused, unsupported, skipped
    commands: int = 0
    changed: int = 0
    active: list[Pilot] = field(default_factory=list)


class PilotTracker:
    """The director's pilot bookkeeping; one per director, called from its iteration."""

    def __init__(
        self,
        runtime: Runtime,
        failures: FailurePath,
        on_stuck: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        self.runtime = runtime
        #: where a failed poll, aborting pilots or a cancel this machine cannot run go
        self.failures = failures
        #: told which backends' limits have been stuck (the director's stall watch)
        self.on_stuck = on_stuck
        #: last poll per endpoint, used only while the state store cannot say (see _claim)
        self._last_poll: dict[str, float] = {}
        self._last_prune: float | None = None
        self._lock = threading.Lock()
        #: this iteration's pilots by endpoint and state, kept current as submissions succeed
        self._states: dict[str, dict[str, int]] = {}
        #: backends that answered no status query (no gridgate_job_status): no limits for them
        self._blind: set[str] = set()
        self._blind_pm: object = None
        #: the registry's counts at the last iteration that could read them, and the pilots
        #: submitted since that the store could not take: while the store is down the limits
        #: apply to these (fail closed), and the pilots are written back when it returns
        self._known: Counts = {}
        #: the cores of the waiting pilots per endpoint key, read and kept as _known is
        self._known_cores: dict[str, int] = {}
        self._unrecorded: list[Pilot] = []
        #: (backend, group) -> cores of one pilot, from this iteration's demand: what a
        #: submission's pilots are recorded with
        self._group_cores: dict[tuple[str, str], int] = {}
        #: per backend: (iterations, clock time) of the last change of state of its pilots
        self._last_change: dict[str, tuple[int, float]] = {}
        #: backend -> the iteration of its last status poll that answered
        self._last_ok_poll: dict[str, int] = {}
        self._iterations = 0
        self._pending_loaded = False
        self._pending_saved: str | None = None
        self._pending_failed = False
        self._save_lock = threading.Lock()

    # --- settings and the registry ----------------------------------------------------------

    @property
    def settings(self) -> PilotSettings:
        return PilotSettings(self.runtime.config.director.get("pilots") or {})

    def _registry(self, quiet: bool = False) -> PilotRegistry | None:
        """The store's registry; None while the store is down (the director runs on its local
        view then, and every call to the store would wait for it to time out)."""
        if getattr(self.runtime.state, "degraded", False):
            if not quiet:
                logger.error(
                    "state store unavailable: pilots are not polled, limited or tracked "
                    "this iteration"
                )
            return None
        try:
            return self.runtime.state.pilot_registry()
        except StateError as exc:
            if not quiet:
                logger.error(
                    "pilot registry unavailable, pilots are not tracked this iteration: {}", exc
                )
            return None

    # --- submissions --------------------------------------------------------------------------

    def submitted(self, record: AccountingRecord) -> None:
        """Track the pilots of a successful submission (one per job id)."""
        if not record.job_ids or not self.settings["track"]:
            return
        pilots = [
            Pilot(
                job_id=job,
                backend=record.backend,
                endpoint=record.endpoint,
                group=record.group,
                submitted=record.time,
                state="waiting",
                changed=record.time,
                cores=self._group_cores.get((record.backend, record.group), 1),
            )
            for job in record.job_ids
        ]
        registry = self._registry(quiet=True)
        try:
            if registry is None:
                raise StateError("the state store is unavailable")
            registry.put(pilots)
        except StateError as exc:
            logger.error(
                "{} submitted pilot(s) on {} kept in memory until the state store "
                "answers (they count against the limits meanwhile): {}",
                len(pilots),
                record.endpoint,
                exc,
            )
            with self._lock:
                self._unrecorded.extend(pilots)
                row = self._states.setdefault(
                    f"{record.backend}/{record.endpoint}", dict.fromkeys(PILOT_STATES, 0)
                )
                row["waiting"] += len(pilots)
            self._save_pending()
            return
        with self._lock:
            row = self._states.setdefault(
                f"{record.backend}/{record.endpoint}", dict.fromkeys(PILOT_STATES, 0)
            )
            row["waiting"] += len(pilots)
            where = (record.backend, record.endpoint, "waiting")  # the last known counts too
            self._known[where] = self._known.get(where, 0) + len(pilots)
            key = f"{record.backend}/{record.endpoint}"
            self._known_cores[key] = self._known_cores.get(key, 0) + sum(p.cores for p in pilots)
        self._save_pending()

    # --- the start of an iteration -------------------------------------------------------------

    def prepare(self, demand: DemandRegistry, it: Iteration) -> DemandRegistry:
        """Poll what is due, cancel what waited too long, and return the demand trimmed to the
        limits; ``it.limits`` and ``it.pilots`` are set for the submissions and the summary.
        A bug here (or in a plugin it calls) costs the polling of one iteration, never the
        iteration, and never the limits: the demand is then trimmed to the last known counts."""
        try:
            return self._prepare(demand, it)
        except Exception as exc:
            logger.opt(exception=exc).error(
                "pilot tracking failed; the limits apply to the last known counts this iteration"
            )
            try:
                return self._prepare_blind(demand, it, self.settings, "pilot tracking failed")
            except Exception as again:  # the limits themselves failed: nothing left to apply
                logger.opt(exception=again).error(
                    "pilot limits failed; this iteration's demand is not trimmed"
                )
                it.limits = None
                return demand

    def _prepare(self, demand: DemandRegistry, it: Iteration) -> DemandRegistry:
        settings = self.settings
        self._states = {}
        if not settings["track"]:
            return demand
        self._group_cores = {(r.backend, r.group): _cores_of(r) for r in demand.requests}
        self._iterations += 1
        self._load_pending()
        runtime = self.runtime
        hook = runtime.pm.hook
        registry = self._registry()
        counts: Counts | None = None
        if registry is not None:
            try:
                self._write_back(registry)
                counts = registry.counts()
            except StateError as exc:
                logger.error("pilot registry unreadable: {}", exc)
        if registry is None or counts is None:
            return self._prepare_blind(demand, it, settings)
        # configured backends, those with demand, and those (extra plugins) with tracked pilots
        backends = list(
            dict.fromkeys(
                [
                    *(runtime.config.get("backends") or {}),
                    *(r.backend for r in demand.requests),
                    *(b for b, _e, _s in counts),
                ]
            )
        )
        infos: dict[str, BackendInfo] = {}
        for backend in backends:
            info = hook.gridgate_backend_info(backend=backend)
            if info is not None:
                infos[backend] = info
        now = runtime.clock.time()
        report = PilotReportDraft()
        retired = self._retired(counts, infos, it, now)
        moved_in: dict[str, int] = {}
        try:
            polls = self._poll(registry, infos, it, settings, now, retired)
            polled_ok = {p.endpoint.key for p in polls if p.outcome == "ok"}
            ttl = float(settings["keep_finished"])
            for endpoints in retired.values():
                for endpoint in endpoints:
                    if endpoint.key in polled_ok:
                        try:
                            runtime.state.set(RETIRED_OK + endpoint.key, repr(now), ttl=ttl)
                        except StateError:
                            pass  # lost_after then counts from the notice: sooner, not never
                    else:
                        gone = self._retired_lost(registry, endpoint, settings, now)
                        if gone:
                            report.changed += gone
                            moved_in[endpoint.backend] = moved_in.get(endpoint.backend, 0) + gone
            for poll in polls:
                moved_in[poll.endpoint.backend] = (
                    moved_in.get(poll.endpoint.backend, 0) + poll.changed
                )
                report.polls.append(
                    PollReport(
                        backend=poll.endpoint.backend,
                        endpoint=poll.endpoint.name,
                        pilots=poll.pilots,
                        outcome=poll.outcome,
                        commands=poll.commands,
                        changed=poll.changed,
                    )
                )
                report.changed += poll.changed
                if poll.outcome == "ok":
                    self._last_ok_poll[poll.endpoint.backend] = self._iterations
                    cancelled = self._cancel_old(
                        registry, poll, infos[poll.endpoint.backend], settings, now, it
                    )
                    if cancelled:
                        report.cancelled[poll.endpoint.key] = cancelled
                        moved_in[poll.endpoint.backend] = (
                            moved_in.get(poll.endpoint.backend, 0) + cancelled
                        )
                    if poll.endpoint.backend in retired and any(
                        poll.endpoint == e for e in retired[poll.endpoint.backend]
                    ):
                        continue  # no verdict on a server that is no longer in the config
                    if poll.changed and self._aborting(registry, poll.endpoint, it, settings, now):
                        report.aborted.append(poll.endpoint.key)
            moved = report.changed or report.cancelled
            if self._prune(registry, settings, now) or moved:
                counts = registry.counts()
        except StateError as exc:
            logger.error(
                "pilot registry failed, the limits apply to the last known counts: {}", exc
            )
            it.pilots = report
            return self._prepare_blind(demand, it, settings)
        for backend in infos:
            if moved_in.get(backend) or backend not in self._last_change:
                self._last_change[backend] = (self._iterations, now)
        cores = self._waiting_cores(registry, settings, counts)
        with self._lock:
            self._known = dict(counts)
            if cores is not None:
                self._known_cores = dict(cores)
        retired_keys = {e.key for endpoints in retired.values() for e in endpoints}
        return self._trim(demand, it, settings, counts, infos, report, retired_keys, cores)

    def _waiting_cores(
        self, registry: PilotRegistry, settings: PilotSettings, counts: Counts
    ) -> dict[str, int] | None:
        """The cores of the pilots waiting on each endpoint, when a limit counts them (None
        otherwise: nothing to read); an unreadable registry counts the last known cores."""
        if not self._counts_cores(settings):
            return None
        try:
            cores: dict[str, int] = {}
            for (backend, endpoint, _group), (_n, c) in registry.waiting().items():
                key = f"{backend}/{endpoint}"
                cores[key] = cores.get(key, 0) + c
            return cores
        except StateError as exc:
            logger.error(
                "pilot registry: cannot read the waiting cores, using the last known: {}", exc
            )
            return self._local_cores()

    @staticmethod
    def _counts_cores(settings: PilotSettings) -> bool:
        if settings["max_waiting_cores"] is not None:
            return True
        for section in (settings.section.get("backends") or {}).values():
            if (section or {}).get("max_waiting_cores") is not None:
                return True
            for own in ((section or {}).get("endpoints") or {}).values():
                if (own or {}).get("max_waiting_cores") is not None:
                    return True
        return False

    def _local_cores(self) -> dict[str, int]:
        """The last known waiting cores plus those of this process's unrecorded pilots."""
        with self._lock:
            cores = dict(self._known_cores)
            for pilot in self._unrecorded:
                if pilot.state == "waiting":
                    cores[pilot.endpoint_key] = cores.get(pilot.endpoint_key, 0) + pilot.cores
        return cores

    def _trim(
        self,
        demand: DemandRegistry,
        it: Iteration,
        settings: PilotSettings,
        counts: Counts,
        infos: Mapping[str, BackendInfo],
        report: PilotReportDraft,
        retired: Iterable[str] = (),
        waiting_cores: Mapping[str, int] | None = None,
    ) -> DemandRegistry:
        blind = set(self._blind)
        if not self.runtime.pm.hook.gridgate_job_status.get_hookimpls():
            # no plugin at all can report a pilot's state: the limits would only block (what a
            # first poll would find out, one iteration late, with the finite defaults applied)
            blind.update(infos)
        limits = Limits(settings, counts, infos, blind, retired, waiting_cores)
        usable = {b: it.usable(info.endpoints) for b, info in infos.items()}
        kept, cuts = limits.trim(demand.requests, usable)
        for request, limit, pilots in cuts:
            self.failures.account(it, request, None, "skipped", pilots, failure_kind=limit)
        self._stuck(settings, infos, kept, cuts, counts)
        self._save_pending()
        it.limits = limits
        # the same dicts the submissions update (room taken, pilots waiting): the summary says
        # what they are after the iteration's submissions
        report.states = self._states = state_counts(counts)
        report.trimmed = limits.trimmed
        it.pilots = report
        trimmed = DemandRegistry()
        for request in kept:
            trimmed.add(request)
        return trimmed

    # --- the store down: fail closed ----------------------------------------------------------------

    def _local_counts(self) -> Counts:
        """The last counts read from the registry plus this process's pilots it could not
        take (as ``waiting``)."""
        with self._lock:
            counts = dict(self._known)
            for pilot in self._unrecorded:
                where = (pilot.backend, pilot.endpoint, pilot.state)
                counts[where] = counts.get(where, 0) + 1
        return counts

    def _prepare_blind(
        self,
        demand: DemandRegistry,
        it: Iteration,
        settings: PilotSettings,
        why: str = "pilot registry unavailable",
    ) -> DemandRegistry:
        """No registry this iteration: nothing is polled, and the demand is trimmed to the
        limits on the last known counts and this process's own submissions since."""
        hook = self.runtime.pm.hook
        counts = self._local_counts()
        backends = list(
            dict.fromkeys(
                [
                    *(self.runtime.config.get("backends") or {}),
                    *(r.backend for r in demand.requests),
                ]
            )
        )
        infos = {b: i for b in backends if (i := hook.gridgate_backend_info(backend=b)) is not None}
        report = PilotReportDraft(blind=why)
        logger.error(
            "{}: the limits apply to the last known counts plus {} pilot(s) submitted "
            "since; nothing is polled",
            why,
            len(self._unrecorded),
        )
        cores = self._local_cores() if self._counts_cores(settings) else None
        return self._trim(demand, it, settings, counts, infos, report, (), cores)

    def _pending_path(self) -> Path | None:
        folder = self.runtime.config.director.get("state_dir")
        return Path(folder) / PENDING_FILE if folder else None

    def _load_pending(self) -> None:
        """Once per process: what a previous director on this state folder left in
        :data:`PENDING_FILE` (its last counts, the pilots its store did not take)."""
        if self._pending_loaded:
            return
        self._pending_loaded = True
        path = self._pending_path()
        if path is None:
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            known = {(str(b), str(e), str(st)): int(n) for b, e, st, n in data.get("known", [])}
            known_cores = {str(k): int(n) for k, n in (data.get("known_cores") or {}).items()}
            pilots = [Pilot.from_dict(p) for p in data.get("unrecorded", [])]
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError) as exc:
            logger.error("{} unreadable, the pilots it kept are not known: {}", path, exc)
            return
        with self._lock:
            if not self._known:
                self._known = known
                self._known_cores = known_cores
            self._unrecorded[:0] = pilots
        if pilots:
            logger.warning(
                "{} pilot(s) submitted while the state store was down found in {}; "
                "they are written back when it answers",
                len(pilots),
                path,
            )

    def _save_pending(self) -> None:
        """Keep the last known counts and the unrecorded pilots in :data:`PENDING_FILE`
        (written only when they changed; a write that fails is said once)."""
        path = self._pending_path()
        if path is None:
            return
        with self._save_lock:
            with self._lock:
                text = json.dumps(
                    {
                        "known": sorted([*k, n] for k, n in self._known.items()),
                        "known_cores": self._known_cores,
                        "unrecorded": [p.as_dict() for p in self._unrecorded],
                    },
                    sort_keys=True,
                )
                durable = bool(self._unrecorded)
            if text == self._pending_saved:
                return
            try:
                from gridgate.core.files import atomic_write

                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                atomic_write(path, text.encode("utf-8"), durable=durable)
            except OSError as exc:
                if not self._pending_failed:
                    logger.error(
                        "cannot keep the pilot counts in {}: {} (a director restarted "
                        "while the state store is down would not know them)",
                        path,
                        exc,
                    )
                self._pending_failed = True
                return
            self._pending_saved, self._pending_failed = text, False

    def _write_back(self, registry: PilotRegistry) -> None:
        """Write into the registry the pilots submitted while it could not take them."""
        with self._lock:
            pending, self._unrecorded = self._unrecorded, []
        if not pending:
            return
        try:
            registry.put(pending)
        except StateError:
            with self._lock:
                self._unrecorded[:0] = pending
            raise
        logger.warning(
            "{} pilot(s) submitted while the state store was down written back to it", len(pending)
        )

    # --- limits that do not move ------------------------------------------------------------------

    def _stuck(
        self,
        settings: PilotSettings,
        infos: Mapping[str, BackendInfo],
        kept: Sequence[SubmitRequest],
        cuts: Sequence[tuple[SubmitRequest, str, int]],
        counts: Counts,
    ) -> None:
        """Tell the stall watch which backends had their demand trimmed to zero by limits whose
        pilots changed no state for ``stall_iterations`` polls (the polls fail, the backend is
        paused, the store is down, or nothing starts): a trim that never ends is a stall.

        A full site is not one: when the backend's polls answer and some of its pilots run,
        the waiting ones wait for the slots those hold (long pilots change no state for hours),
        and the limit is doing its job."""
        limit = int(self.runtime.config.director.get("stall_iterations", 3))
        now = self.runtime.clock.time()
        served = {r.backend for r in kept}
        stuck: dict[str, str] = {}
        for request, _limit, _n in cuts:
            backend = request.backend
            if backend in served or backend in stuck or backend not in infos:
                continue
            running = sum(
                n for (b, _e, state), n in counts.items() if b == backend and state == "running"
            )
            last_ok = self._last_ok_poll.get(backend)
            if running and last_ok is not None and self._iterations - last_ok < limit:
                continue
            # a director that never read the registry (the store down since it started)
            # counts from its first iteration
            since_it, since = self._last_change.setdefault(backend, (self._iterations, now))
            interval = settings.for_backend(backend, "status_interval")
            polls = self._iterations - since_it
            if polls >= limit and (interval is None or now - since >= limit * float(interval)):
                stuck[backend] = (
                    f"demand trimmed to zero by the pilot limits, and no pilot of "
                    f"{backend} changed state for {polls} iteration(s)"
                )
        if self.on_stuck is not None:
            self.on_stuck(stuck)

    # --- endpoints no longer configured -------------------------------------------------------------

    def _retired(
        self, counts: Counts, infos: Mapping[str, BackendInfo], it: Iteration, now: float
    ) -> dict[str, list[Endpoint]]:
        """Endpoints of configured backends that still hold non-terminal pilots but are no
        longer in the config. The first time one is seen, a notice names it: its pilots leave
        the limits (they still count in ``gridgate pilots``), are still polled, and go
        ``lost`` when the backend cannot say what became of them."""
        out: dict[str, list[Endpoint]] = {}
        held: dict[str, int] = {}
        for (backend, name, state), n in counts.items():
            info = infos.get(backend)
            if info is None or state in ("done", "failed", "cancelled", "lost") or n <= 0:
                continue
            if any(e.name == name for e in info.endpoints):
                continue
            key = f"{backend}/{name}"
            if key not in held:
                out.setdefault(backend, []).append(Endpoint(backend, name))
            held[key] = held.get(key, 0) + n
        ttl = float(self.settings["keep_finished"])
        for endpoints in out.values():
            for endpoint in endpoints:
                try:
                    first = self.runtime.state.add_if_absent(
                        RETIRED + endpoint.key, repr(now), ttl=ttl
                    )
                except StateError:
                    first = False
                if first:
                    self._retired_notice(endpoint, held[endpoint.key], it, now)
        return out

    def _retired_notice(self, endpoint: Endpoint, n: int, it: Iteration, now: float) -> None:
        from gridgate.core.model import Notification

        lost_after = float(self.settings["lost_after"])
        body = (
            f"{n} non-terminal pilot(s) of {endpoint.key} are tracked, but {endpoint.name} is "
            f"no longer in the config of backend {endpoint.backend}.\n"
            f"They no longer count against max_waiting / max_total. They are still polled "
            f"while the backend can say what became of them; if it cannot, they become lost "
            f"{lost_after:.0f} s (lost_after) from now.\n"
            f"To cancel them: gridgate pilots cancel --all --endpoint {endpoint.name}\n"
        )
        note = Notification(
            level="info",
            subject=f"gridgate: {n} pilot(s) of {endpoint.key}, "
            "no longer configured, leave the limits",
            body=body,
            created=now,
            endpoint=endpoint,
            key=f"{RETIRED}{endpoint.key}/{now:.0f}",
        )
        logger.warning("{}", note.subject)
        self.failures.tell(it, note)

    def _retired_lost(
        self, registry: PilotRegistry, endpoint: Endpoint, settings: PilotSettings, now: float
    ) -> int:
        """Pilots of a retired endpoint that the backend has not answered for: ``lost`` once
        ``lost_after`` has passed since the endpoint was first seen retired and since the
        backend last answered for it (a poll not due yet is no silence)."""
        try:
            since = (
                max(
                    float(self.runtime.state.get(key) or 0.0)
                    for key in (RETIRED + endpoint.key, RETIRED_OK + endpoint.key)
                )
                or now
            )
        except (StateError, ValueError):
            return 0
        lost_after = float(settings["lost_after"])
        if now - since < lost_after:
            return 0
        active = registry.active(endpoint.backend, endpoint.name)
        reason = (
            f"endpoint no longer configured, and the backend has not said what became of "
            f"the pilot for {now - since:.0f} s"
        )
        registry.put(p.moved("lost", now, p.native, reason) for p in active)
        if active:
            logger.warning(
                "{} pilot(s) of {} (no longer configured) are lost: {}",
                len(active),
                endpoint.key,
                reason,
            )
        return len(active)

    # --- polling ---------------------------------------------------------------------------------

    def _poll(
        self,
        registry: PilotRegistry,
        infos: Mapping[str, BackendInfo],
        it: Iteration,
        settings: PilotSettings,
        now: float,
        retired: Mapping[str, Sequence[Endpoint]] | None = None,
    ) -> list[_Poll]:
        due: list[tuple[Endpoint, float, float | None]] = []
        gone = {e.key for endpoints in (retired or {}).values() for e in endpoints}
        for backend, info in infos.items():
            if it.paused(info):  # its credential is unusable (see Iteration.paused): not asked
                continue
            interval = settings.for_backend(backend, "status_interval")
            timeout = float(info.command_timeout or self.runtime.config.director["command_timeout"])
            # a server out of rotation is not asked (nor a banned one its backend cannot ask);
            # one no longer configured still is
            for endpoint in [*it.pollable(info), *(retired or {}).get(backend, ())]:
                due.append((endpoint, timeout, None if interval is None else float(interval)))
        if not due:
            return []
        threads = min(int(self.runtime.config.director["max_threads"]), len(due))
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="status") as pool:
            futures = [
                pool.submit(
                    self._poll_one,
                    registry,
                    endpoint,
                    timeout,
                    interval,
                    it,
                    settings,
                    now,
                    endpoint.key in gone,
                )
                for endpoint, timeout, interval in due
            ]
            return [p for p in (f.result() for f in futures) if p is not None]

    def _due(self, endpoint: Endpoint, interval: float, now: float) -> bool:
        """Whether ``endpoint``'s last poll is ``interval`` seconds old or more (a read only;
        :meth:`_claim` decides among directors)."""
        try:
            held = self.runtime.state.get(POLLED + endpoint.key)
            return held is None or now - float(held) >= interval
        except (StateError, ValueError):
            with self._lock:
                last = self._last_poll.get(endpoint.key)
            return last is None or now - last >= interval

    def _claim(self, endpoint: Endpoint, interval: float, now: float) -> bool:
        """Whether this director polls ``endpoint`` now: its last poll (by any director on this
        store) is ``interval`` seconds old or more. The add is atomic, so of several directors
        one wins; a shortened interval takes effect at once."""
        key = POLLED + endpoint.key
        state = self.runtime.state
        try:
            if state.add_if_absent(key, repr(now), ttl=interval):
                return True
            held = state.get(key)
            if held is not None and now - float(held) < interval:
                return False
            state.delete(key)
            return state.add_if_absent(key, repr(now), ttl=interval)
        except (StateError, ValueError):  # no shared view: this process's own memory decides
            with self._lock:
                last = self._last_poll.get(endpoint.key)
                if last is not None and now - last < interval:
                    return False
                self._last_poll[endpoint.key] = now
                return True

    def _unclaim(self, endpoint: Endpoint, interval: float | None) -> None:
        if interval is None:
            return
        try:
            self.runtime.state.delete(POLLED + endpoint.key)
        except StateError:
            pass  # the claim was written with ttl=interval: it lapses by itself
        with self._lock:
            self._last_poll.pop(endpoint.key, None)

    def _poll_one(
        self,
        registry: PilotRegistry,
        endpoint: Endpoint,
        timeout: float,
        interval: float | None,
        it: Iteration,
        settings: PilotSettings,
        now: float,
        retired: bool = False,
    ) -> _Poll | None:
        with self._lock:
            if self._blind_pm is not self.runtime.pm:  # plugins rebuilt: ask every backend again
                self._blind_pm, self._blind = self.runtime.pm, set()
            if endpoint.backend in self._blind:  # it said it cannot: no need to read its pilots
                return None
        if interval is not None and not self._due(endpoint, interval, now):
            return None  # polled recently (by any director): its pilots are not even read
        active = registry.active(endpoint.backend, endpoint.name)
        if not active:
            return None
        if interval is not None and not self._claim(endpoint, interval, now):
            return None
        hook = self.runtime.pm.hook
        ids = [p.job_id for p in active]
        answer = hook.gridgate_admit(
            request=AdmissionRequest(
                category="query",
                opcode="JOB_STATUS",
                size=len(ids),
                endpoint=endpoint,
                user=_user(str(self.runtime.config.director.get("user") or "")),
            )
        )
        if isinstance(answer, Refusal):
            logger.info(
                "status poll of {} refused by admission control: {}", endpoint.key, answer.reason
            )
            self._unclaim(endpoint, interval)  # not polled: due again at the next iteration
            return _Poll(endpoint, len(ids), "refused", active=active)
        try:
            result = hook.gridgate_job_status(endpoint=endpoint, job_ids=ids, timeout=timeout)
        except Exception as exc:  # a plugin bug must not stop the iteration
            logger.opt(exception=exc).error("status poll of {} crashed in a plugin", endpoint.key)
            return _Poll(endpoint, len(ids), "plugin_error", active=active)
        finally:
            if answer is not None:
                hook.gridgate_release(grant=answer)
        if result is None and retired:
            # the backend no longer knows this endpoint (an ARC CE leaves with its config):
            # that says nothing of its other endpoints, so the backend is not made blind
            return _Poll(endpoint, len(ids), "unsupported", active=active)
        if result is None:
            with self._lock:
                first = endpoint.backend not in self._blind
                self._blind.add(endpoint.backend)
            if first:
                logger.warning(
                    "backend {} reports no pilot states: its pilots stay as submitted, "
                    "and max_waiting / max_total are not applied to it",
                    endpoint.backend,
                )
            return _Poll(endpoint, len(ids), "unsupported", active=active)
        command = result.command
        if command is not None and command.stdout_truncated and not command.timed_out:
            # gridgate's own cap cut the answer (of any backend): the ids past the cut would
            # look unknown, then lost, and the server did nothing wrong. A fault of this
            # machine's settings: no server blamed, one error per failing_expiry.
            why = (
                f"the output of {command.argv[0] if command.argv else 'the status command'} "
                f"passed gridgate's own output cap (director.max_output_bytes = "
                f"{self.runtime.config.director.get('max_output_bytes')}) and was cut by "
                "gridgate, not by the server; raise director.max_output_bytes"
            )
            if not retired:
                failed = SubmitResult(
                    endpoint=endpoint,
                    ok=False,
                    command=command,
                    operation=result.operation or "Job Status",
                    message=why,
                    local_fault=why,
                )
                self.failures.server_failed(
                    endpoint,
                    failed,
                    it,
                    Failure(
                        kind="output_cap",
                        exclude=False,
                        notify=True,
                        transient=False,
                        local=True,
                        reason=why,
                    ),
                )
            return _Poll(endpoint, len(ids), "output_cap", result.commands, active=active)
        if not result.ok and retired:  # no server to blame: it left the config
            logger.warning(
                "status poll of {} (no longer configured) failed: {}",
                endpoint.key,
                result.local_fault or result.message or "no message",
            )
            return _Poll(endpoint, len(ids), "failed", result.commands, active=active)
        if not result.ok:
            # a fault of this machine (an id file it cannot write, gridgate's own output cap)
            # goes through the same path with local_fault set: kind local_io, the backend
            # paused, one error per failing_expiry, no server blamed
            local = getattr(result, "local_fault", "") or ""
            failed = SubmitResult(
                endpoint=endpoint,
                ok=False,
                command=result.command,
                operation=result.operation or "Job Status",
                message=result.message,
                local_fault=local,
            )
            self.failures.server_failed(endpoint, failed, it)
            return _Poll(
                endpoint,
                len(ids),
                "local_fault" if local else "failed",
                result.commands,
                active=active,
            )
        lost_after = float(settings["lost_after"])
        changes: list[Pilot] = []
        for pilot in active:
            status = result.statuses.get(pilot.job_id)
            if status is None:
                new = pilot.moved("unknown", now, pilot.native, "no longer known to the backend")
            else:
                new = pilot.moved(status.state, now, status.native, status.reason)
            if (
                new.state == "unknown"
                and pilot.state == "unknown"
                and now - pilot.changed >= lost_after
            ):
                new = pilot.moved(
                    "lost",
                    now,
                    new.native,
                    f"unknown to the backend for {now - pilot.changed:.0f} s",
                )
            if new != pilot:
                changes.append(new)
        registry.put(changes)
        changed = {p.job_id: p for p in changes}
        still = [changed.get(p.job_id, p) for p in active]
        return _Poll(
            endpoint,
            len(ids),
            "ok",
            result.commands,
            len(changes),
            active=[p for p in still if not p.terminal],
        )

    # --- waiting too long --------------------------------------------------------------------------

    def _cancel_old(
        self,
        registry: PilotRegistry,
        poll: _Poll,
        info: BackendInfo,
        settings: PilotSettings,
        now: float,
        it: Iteration | None = None,
    ) -> int:
        limit = settings.for_endpoint(poll.endpoint, "max_wait_time")
        if limit is None:
            return 0
        old = [p for p in poll.active if p.state == "waiting" and now - p.submitted > float(limit)]
        if not old:
            return 0
        timeout = float(info.command_timeout or self.runtime.config.director["command_timeout"])
        reason = f"waited over max_wait_time ({float(limit):.0f} s); cancelled by gridgate"
        done, problem = cancel_pilots(
            self.runtime, registry, poll.endpoint, old, timeout, reason, it, self.failures
        )
        if problem:
            logger.error("cancelling {} pilot(s) on {}: {}", len(old), poll.endpoint.key, problem)
        return len(done)

    # --- aborted pilots ------------------------------------------------------------------------------

    def _aborting(
        self,
        registry: PilotRegistry,
        endpoint: Endpoint,
        it: Iteration,
        settings: PilotSettings,
        now: float,
    ) -> bool:
        """Whether the endpoint's last finished pilots failed too often; if so it fails with kind
        ``aborted`` through the director's failure path (failing cache, error, alarm)."""
        state = self.runtime.state
        try:
            after = float(state.get(VERDICT + endpoint.key) or 0.0)
        except (StateError, ValueError):
            after = 0.0
        window = int(settings["abort_window"])
        finished = [
            p
            for p in registry.last_finished(endpoint.backend, endpoint.name, 3 * window, after)
            if p.state in DECIDING
        ][:window]
        failed = [p for p in finished if p.state == "failed"]
        if len(finished) < int(settings["abort_min_finished"]):
            return False
        if len(failed) / len(finished) <= float(settings["abort_threshold"]):
            return False
        try:
            state.set(VERDICT + endpoint.key, repr(now), ttl=float(settings["keep_finished"]))
        except StateError as exc:
            logger.error("aborted verdict on {} not kept: {}", endpoint.key, exc)
        sample: list[str] = []
        for pilot in failed:
            text = " - ".join(t for t in (pilot.native, pilot.reason) if t) or "(no reason given)"
            if text not in sample:
                sample.append(text)
        sample = sample[: int(settings["abort_sample"])]
        reason = f"{len(failed)} of its last {len(finished)} finished pilots failed"
        lines = [
            f"Pilots: {len(failed)} failed, {len(finished) - len(failed)} done, of the last "
            f"{len(finished)} that finished on {endpoint.name} "
            f"(threshold: more than {float(settings['abort_threshold']):.0%} failed)"
        ]
        if sample:
            lines += ["Reasons given by the backend (a sample):", *(f"  {s}" for s in sample)]
        result = SubmitResult(
            endpoint=endpoint, ok=False, operation="Pilot Jobs", message="\n".join(lines)
        )
        self.failures.server_failed(endpoint, result, it, Failure(kind="aborted", reason=reason))
        logger.warning("{}: {}; out of rotation", endpoint.key, reason)
        return True

    def _prune(self, registry: PilotRegistry, settings: PilotSettings, now: float) -> int:
        keep = float(settings["keep_finished"])
        every = min(3600.0, keep / 10)
        if self._last_prune is not None and now - self._last_prune < every:
            return 0
        self._last_prune = now
        gone = registry.prune(before=now - keep)
        if gone:
            logger.info("forgot {} pilot(s) finished over {:.0f} s ago", gone, keep)
        return gone


def cancel_pilots(
    runtime: Runtime,
    registry: PilotRegistry,
    endpoint: Endpoint,
    pilots: Sequence[Pilot],
    timeout: float,
    reason: str,
    it: Iteration | None = None,
    failures: FailurePath | None = None,
) -> tuple[list[str], str]:
    """Cancel ``pilots`` of ``endpoint`` with one ``gridgate_cancel`` call under an admission
    grant of category ``other``, and record those cancelled (with ``reason``). A cancel that
    this machine could not even run (``local_fault``: a file it cannot write) is, within an
    iteration ``it``, a local fault through its ``failures`` path (told once per
    ``failing_expiry``).

    :return: the ids cancelled, and what went wrong ('' when nothing did).
    """
    hook = runtime.pm.hook
    answer = hook.gridgate_admit(
        request=AdmissionRequest(
            category="other",
            opcode="JOB_CANCEL",
            size=len(pilots),
            endpoint=endpoint,
            user=_user(str(runtime.config.director.get("user") or "")),
        )
    )
    if isinstance(answer, Refusal):
        return [], f"refused by admission control: {answer.reason}"
    try:
        result = hook.gridgate_cancel(
            endpoint=endpoint, job_ids=[p.job_id for p in pilots], timeout=timeout
        )
    except Exception as exc:  # a plugin bug must not stop the iteration
        logger.opt(exception=exc).error("cancelling on {} crashed in a plugin", endpoint.key)
        return [], f"the backend plugin crashed: {type(exc).__name__}: {exc}"
    finally:
        if answer is not None:
            hook.gridgate_release(grant=answer)
    if result is None:
        return [], f"backend {endpoint.backend} cannot cancel"
    local = getattr(result, "local_fault", "") or ""
    if local and it is not None and failures is not None:
        failures.server_failed(
            endpoint,
            SubmitResult(
                endpoint=endpoint,
                ok=False,
                command=result.command,
                operation=result.operation or "Job Cancel",
                message=result.message,
                local_fault=local,
            ),
            it,
        )
    wanted = {p.job_id for p in pilots}
    done = sorted(wanted & set(result.cancelled))
    now = runtime.clock.time()
    registry.put(
        p.moved("cancelled", now, p.native, reason) for p in pilots if p.job_id in set(done)
    )
    problem = ""
    if not result.ok or len(done) < len(pilots):
        why = result.message or (result.command.describe() if result.command else "")
        problem = f"{len(pilots) - len(done)} not cancelled" + (f": {why}" if why else "")
    return done, problem


def state_counts(counts: Counts) -> dict[str, dict[str, int]]:
    """``{"backend/endpoint": {state: n}}`` with every state present (0 when none)."""
    out: dict[str, dict[str, int]] = {}
    for (backend, endpoint, state), n in counts.items():
        out.setdefault(f"{backend}/{endpoint}", dict.fromkeys(PILOT_STATES, 0))[state] = n
    return dict(sorted(out.items()))
