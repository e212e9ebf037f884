"""The limits on what waits: ``director.pilots`` and its schema, resolved per backend and
endpoint (:class:`PilotSettings`), and the room they leave this iteration, shared by the
submission threads (:class:`PilotRoom`)."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from gridgate.core.model import TERMINAL_STATES, BackendInfo, Endpoint, SubmitRequest
from gridgate.core.settings import Settings
from gridgate.core.state import Counts

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
        "description": "Seconds between two status polls of an endpoint, by any director "
        "of the store (null: at every iteration; with director.demand_lock, half a cycle).",
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
        # director-wide, each limit has a default (a backend's own has none: it inherits)
        **{k: {**v, "default": None} for k, v in _LIMITS.items()},
        "max_waiting": {**_LIMITS["max_waiting"], "default": DEFAULT_MAX_WAITING},
        "max_wait_time": {**_LIMITS["max_wait_time"], "default": DEFAULT_MAX_WAIT_TIME},
        "lost_after": {
            "maximum": 365 * 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 3600,
            "description": "A pilot the backend has not known (state unknown) for this "
            "many seconds becomes lost (terminal).",
        },
        "reconcile_for": {
            "maximum": 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 300,
            "description": "A submission whose answer never came (its director killed while "
            "it was sent, a lost answer, a command killed at its deadline) is looked for on its "
            "CE by name, counted against the limits meanwhile; one the CE has answered without "
            "for this many seconds is given up with a log line. A CE "
            "that cannot be asked keeps them unsettled until it answers, for at most a day "
            "(docs/pilots.md).",
        },
        "keep_output": {
            "type": "integer",
            "minimum": 0,
            "maximum": 1000000,
            "default": 0,
            "description": "Keep the stdout and stderr (1 MiB each at most) of one done "
            "pilot in this many per endpoint in STATE_DIR/pilot-output, for gridgate pilots "
            "output after the CE cleaned it up; 0: none (docs/operations.md).",
        },
        "keep_output_last": {
            "type": "integer",
            "minimum": 1,
            "maximum": 10000,
            "default": 5,
            "description": "With keep_output: the newest pilots kept per endpoint.",
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
class PilotSettings(Settings):
    """The ``director.pilots`` section, typed, resolved per backend and endpoint: a limit a
    backend (or an endpoint of it) sets, ``null`` included (no limit), wins over the one above
    it; a limit it does not name is the one above it (so ``backends`` keeps each override
    block as written: a key it does not name is not a ``null``)."""

    section_schema: ClassVar[Mapping[str, Any]] = PILOTS_SCHEMA

    track: bool
    status_interval: float | None
    max_waiting: int | None
    max_waiting_cores: int | None
    max_total: int | None
    max_wait_time: float | None
    lost_after: float
    reconcile_for: float
    keep_finished: float
    keep_output: int
    keep_output_last: int
    abort_window: int
    abort_min_finished: int
    abort_threshold: float
    abort_sample: int
    #: per backend: its overrides of the limits, and ``endpoints`` (per endpoint name: its own)
    backends: Mapping[str, Mapping[str, Any]]

    @functools.cached_property
    def counts_cores(self) -> bool:
        """Whether ``max_waiting_cores`` is set anywhere (the waiting cores are then read)."""
        if self.max_waiting_cores is not None:
            return True
        for own in self.backends.values():
            if own.get("max_waiting_cores") is not None:
                return True
            named = own["endpoints"] if "endpoints" in own else {}
            if any(e.get("max_waiting_cores") is not None for e in named.values()):
                return True
        return False

    def __getitem__(self, key: str) -> Any:
        """The director-wide value of ``key`` (``settings["max_waiting"]``)."""
        if key not in _LIMITS and key not in _OWN:
            raise KeyError(key)
        return getattr(self, key)

    def _backend(self, backend: str) -> Mapping[str, Any]:
        return self.backends[backend] if backend in self.backends else {}

    def for_backend(self, backend: str, key: str) -> Any:
        """The limit ``key`` in force for ``backend``."""
        own = self._backend(backend)
        return own[key] if key in own else self[key]

    def for_endpoint(self, endpoint: Endpoint, key: str) -> Any:
        """The limit ``key`` in force for ``endpoint``."""
        endpoints = self._backend(endpoint.backend)
        named = endpoints["endpoints"] if "endpoints" in endpoints else {}
        own = named[endpoint.name] if endpoint.name in named else {}
        return own[key] if key in own else self.for_backend(endpoint.backend, key)


#: The settings of ``director.pilots`` that are no limit (read director-wide only).
_OWN = frozenset(PILOTS_SCHEMA["properties"]) - frozenset(_LIMITS) - {"backends"}


class PilotRoom:
    """Room left this iteration under ``max_waiting`` and ``max_waiting_cores`` (per endpoint)
    and ``max_total`` (per backend), shared by the submission threads: each submission
    reserves what it takes (its pilots, and their cores: ``count x resources.cores``).

    ``waiting_cores`` is the cores of the pilots waiting on each endpoint (by endpoint key);
    an endpoint not in it counts one core per waiting pilot (what every pilot was before
    pilots had cores). ``reported`` is the jobs each endpoint's queue says wait there, of
    every user (``gridgate_endpoint_state``, by key): ``max_waiting`` counts the larger of
    that and gridgate's own pilots waiting there."""

    def __init__(
        self,
        settings: PilotSettings,
        counts: Counts,
        infos: Mapping[str, BackendInfo],
        blind: Iterable[str] = (),
        retired: Iterable[str] = (),
        waiting_cores: Mapping[str, int] | None = None,
        reported: Mapping[str, int] | None = None,
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
        #: backends with pilots on such endpoints: the store's max_total would count them
        self.retired_backends = {key.split("/", 1)[0] for key in gone}
        for (backend, endpoint, state), n in counts.items():
            if f"{backend}/{endpoint}" in gone:
                continue
            if state == "waiting":
                key = f"{backend}/{endpoint}"
                waiting[key] = waiting.get(key, 0) + n
            if state not in TERMINAL_STATES:
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
                held = max(waiting.get(server.key, 0), (reported or {}).get(server.key, 0))
                self.endpoint_room[server.key] = None if limit is None else max(0, limit - held)
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
            size = cores_of(request)
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
        size = cores_of(request)
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

    def limited(self, endpoint: Endpoint) -> bool:
        """Whether any limit applies to ``endpoint`` (not a blind backend's, not a retired one)."""
        with self._lock:
            return any(
                room is not None
                for room in (
                    self.endpoint_room.get(endpoint.key),
                    self.cores_room.get(endpoint.key),
                    self.backend_room.get(endpoint.backend),
                )
            )

    def give_back(self, endpoint: Endpoint, n: int, cores: int, full: bool = False) -> None:
        """Return ``n`` pilots of ``cores`` each that :meth:`reserve` took on ``endpoint`` and
        the store did not grant; ``full``: the store has no room there at all (this
        iteration's view of it is stale), so no other request tries it again."""
        with self._lock:
            room = self.endpoint_room.get(endpoint.key)
            if room is not None:
                self.endpoint_room[endpoint.key] = 0 if full else room + n
            total = self.backend_room.get(endpoint.backend)
            if total is not None:
                self.backend_room[endpoint.backend] = total + n
            left = self.cores_room.get(endpoint.key)
            if left is not None:
                self.cores_room[endpoint.key] = left + n * cores


def cores_of(request: SubmitRequest) -> int:
    """The cores of one pilot of ``request`` (1 when it asks no resources)."""
    return request.resources.cores if request.resources is not None else 1


def _summed(rooms: Sequence[int | None]) -> float:
    """The room of several endpoints together: infinite when there are none or one has no
    limit."""
    if not rooms or any(r is None for r in rooms):
        return math.inf
    return float(sum(r for r in rooms if r is not None))
