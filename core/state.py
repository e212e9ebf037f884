"""The shared state store: expiring keys with atomic add-if-absent, an append-only accounting
log, and the pilot registry kept beside them.

The failing and tickets caches, the list-match cache, escalation history, notification
de-duplication, the per-submission accounting rows and every submitted pilot live here. This
module holds what a plugin sees of it (:class:`StateStore`, ``context.state``; :class:`Pilot` and
:class:`PilotRegistry`, ``context.state.pilot_registry()``) and what a driver needs; the drivers
themselves (memory, sqlite, redis, postgresql) are in :mod:`gridgate.core.stores`, found
through the ``gridgate.state`` entry-point group, and every one passes the same contract tests
(tests/core/stores/test_state_contract.py).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from gridgate.core._moved import moved_names
from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.model import PILOT_STATES, TERMINAL_STATES

__all__ = [
    "Counts",
    "FinishedSlot",
    "LiveStates",
    "Pilot",
    "PilotRegistry",
    "RecordGroup",
    "RoomClaim",
    "StateError",
    "StateStore",
    "Waiting",
    "open_state",
]


#: The entry-point group of the state drivers (``state.driver`` names one).
STATE_GROUP = "gridgate.state"


def open_state(config: Mapping[str, Any], clock: Clock = SYSTEM_CLOCK) -> StateStore:
    """Open the state store a config names: the driver ``state.driver`` (found through the
    ``gridgate.state`` entry points) made with the rest of that section.

    :param config: a config (a loaded one, or a mapping) with a ``state:`` section; none means
        ``{driver: sqlite}``.
    :param clock: the store's clock, on which expiries are measured.
    :raises StateError: when no installed driver has that name, or it does not import (a
        loaded config has been checked for both).
    """
    section = dict(config.get("state") or {"driver": "sqlite"})
    driver = section.pop("driver", "sqlite")
    return _driver_class(str(driver))(section, clock=clock)


def _driver_class(driver: str) -> type[StateStore]:
    # read from the installed metadata, as the plugin loader does (gridgate.core.plugins, which
    # imports this module for its types, so it is not asked here)
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=STATE_GROUP)}
    if driver not in found:
        raise StateError(
            f"state driver {driver!r} is not installed (installed: {', '.join(sorted(found))})"
        )
    try:
        cls: type[StateStore] = found[driver].load()
    except Exception as exc:  # a broken driver is named, whatever it raised
        raise StateError(
            f"state driver {driver!r}: import failed: {type(exc).__name__}: {exc}"
        ) from None
    return cls


class StateError(Exception):
    """The state store cannot be read or written (disk full, read-only, server gone)."""


class StateStore(ABC):
    """Contract every state driver implements.

    Values are strings (callers encode JSON). ``ttl`` is in seconds, None for no expiry;
    expiry is measured on the injected clock's wall time, so it survives restarts.
    All methods are safe to call from many threads; drivers that share state between
    processes (sqlite, redis, postgresql) are safe across processes too.
    """

    config_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}
    # made on first use by pilot_registry(), one per store
    _pilot_registry: PilotRegistry | None = None

    def __init__(
        self, config: Mapping[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.config = dict(config or {})
        self.clock = clock

    @abstractmethod
    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        """Store ``value`` under ``key`` only if no live value is there. Atomic: of many
        concurrent callers exactly one gets True."""

    @abstractmethod
    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        """Store ``value`` under ``key``, replacing any value and its expiry."""

    @abstractmethod
    def get(self, key: str) -> str | None:
        """The live value under ``key``, or None (absent or expired)."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove ``key``; True if a live value was removed."""

    @abstractmethod
    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        """Live (key, value) pairs whose key starts with ``prefix``, sorted by key."""

    def renew(self, key: str, value: str, ttl: float | None) -> bool:
        """If ``key`` holds ``value`` (live), give it ``ttl`` from now and answer True; else
        leave it and answer False (API 1.10). Atomic: the holder of a lease taken with
        :meth:`add_if_absent` keeps it, and never renews one another director took after
        it lapsed. A driver that cannot do it atomically raises :class:`StateError`."""
        raise StateError(f"state driver {type(self).__name__} cannot renew a lease")

    def delete_if(self, key: str, value: str) -> bool:
        """Remove ``key`` only if it holds ``value`` (live); whether it did (API 1.10).
        Atomic: a holder hands back its own lease, never another's."""
        raise StateError(f"state driver {type(self).__name__} cannot hand back a lease")

    @abstractmethod
    def ttl(self, key: str) -> float | None:
        """Seconds until ``key`` expires; None when absent or without expiry."""

    @abstractmethod
    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        """Append a JSON-serialisable record (must hold a float ``time``) to ``stream``.

        Idempotent: a record identical to one the stream holds (the same JSON text, keys
        sorted) is not appended again, so an append retried after a store stall whose first
        try did land leaves one row. Records that must both be kept differ in a field."""

    @abstractmethod
    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        """Records of ``stream`` whose ``time`` >= ``since``, oldest first."""

    def record_groups(
        self, stream: str, fields: Sequence[str], bucket: float, since: float = 0.0
    ) -> list[RecordGroup]:
        """The records of ``stream`` whose ``time`` >= ``since``, counted in groups that share
        a slot of ``bucket`` seconds (``time // bucket``) and the values of ``fields``
        (API 1.11): what a report over a long history reads instead of every record. Each
        group's ``record`` holds those fields (None where a record lacks one) and its earliest
        ``time``; oldest group first.

        This default groups :meth:`records`; the SQL drivers group in the database, so that
        a year of records reaches the caller as groups, not rows. A record that is not one is
        skipped and logged, as :meth:`records` does."""
        return group_records(self.records(stream, since), fields, bucket)

    def increment(self, key: str, by: int = 1) -> int:
        """Add ``by`` to the whole number under ``key`` (absent or expired: 0), keep the sum
        without expiry and return it: the director numbers its iterations with it, so that
        separate runs (``gridgate run --once`` from cron) and directors sharing a store count
        on instead of each starting at 1. Atomic: of concurrent callers, each gets its own
        number.

        This default serialises the callers of this process only (a lock around :meth:`get`
        and :meth:`set`); a driver whose store several processes share overrides it, as every
        built-in one does.

        :raises ValueError: when the live value under ``key`` is not a whole number.
        """
        check_key(key)
        with _INCREMENT_LOCK:
            total = parse_count(key, self.get(key)) + int(by)
            self.set(key, str(total))
            return total

    def prune_records(self, stream: str, before: float) -> int:
        """Delete the records of ``stream`` whose ``time`` < ``before``; return how many.

        A driver that keeps records overrides this (every built-in one does): without it
        accounting grows for ever. The default keeps everything and says so by returning 0."""
        return 0

    def pilot_registry(self) -> PilotRegistry:
        """The pilot registry kept in this store (:class:`PilotRegistry`).

        A driver that does not override this keeps pilots in this process only."""
        with _REGISTRY_LOCK:
            registry = self._pilot_registry
            if registry is None:
                registry = self._pilot_registry = MemoryPilots()
            return registry

    def close(self) -> None:
        """Release connections and files."""


_REGISTRY_LOCK = threading.Lock()
_INCREMENT_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------
# Helpers shared by the drivers


def check_key(key: str) -> str:
    """``key`` if it is a non-empty string (every driver checks its keys with this)."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"state keys are non-empty strings, got {key!r}")
    return key


def check_value(value: str) -> str:
    """``value`` if it is a string: drivers store text, callers encode JSON."""
    if not isinstance(value, str):
        raise TypeError(f"state values are strings (encode JSON first), got {type(value).__name__}")
    return value


def parse_count(key: str, value: str | None) -> int:
    """The whole number a counter ``key`` holds (None: 0), for :meth:`StateStore.increment`.

    :raises ValueError: when ``value`` is not one.
    """
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"state key {key!r} holds {value[:40]!r}, not a count") from None


def _check_ttl(ttl: float | None) -> float | None:
    if ttl is None:
        return None
    number = isinstance(ttl, (int, float)) and not isinstance(ttl, bool)
    if not number or not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
    return float(ttl)


def expires_at(clock: Clock, ttl: float | None) -> float | None:
    """The clock time at which a value written now with ``ttl`` expires (None: never).

    :raises ValueError: for a ttl that is not a positive finite number.
    """
    ttl = _check_ttl(ttl)
    return None if ttl is None else clock.time() + ttl


def encode_record(record: Mapping[str, Any]) -> tuple[float, str]:
    """Check a record for :meth:`StateStore.append_record` and return (time, JSON text)."""
    if not isinstance(record, Mapping):
        raise TypeError(f"a record is a mapping, got {type(record).__name__}")
    when = record.get("time")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        raise ValueError(f"a record needs a numeric 'time', got {when!r}")
    try:
        text = json.dumps(dict(record), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"record is not JSON-serialisable: {exc}") from exc
    return float(when), text


def prefix_successor(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix`` (code-point
    order, which is also UTF-8 byte order); None when there is none."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            nxt = last + 1
            if 0xD800 <= nxt <= 0xDFFF:  # surrogates cannot be encoded; skip past them
                nxt = 0xE000
            return "".join(chars) + chr(nxt)
    return None


# ---------------------------------------------------------------------------------------------
# The pilot registry: every pilot the director submitted, with its last known state.
#
# Each driver keeps one (``StateStore.pilot_registry()``: in memory, in the SQLite file beside
# the caches, or in Redis), so a restarted director keeps tracking what it submitted and
# ``gridgate pilots`` reads it from another process. Rows are keyed by (backend, endpoint, job
# id) and indexed by endpoint and state: the director's questions (the non-terminal pilots of
# one endpoint, counts by state, the last finished pilots of an endpoint) never scan the
# terminal rows kept for accounting. Writes come in bulk, one transaction per call.

#: (backend, endpoint, state) -> number of pilots
Counts = dict[tuple[str, str, str], int]


@dataclass(frozen=True)
class Pilot:
    """One tracked pilot job.

    ``endpoint`` is the endpoint's name (``Endpoint.name``), ``group`` the demand group it was
    submitted for; ``submitted`` and ``changed`` are clock times (``changed``: when ``state``
    last changed); ``native`` and ``reason`` are the backend's own words, for people;
    ``cores`` the CPUs it asked for (its demand group's ``resources.cores``), which
    ``max_waiting_cores`` counts.
    """

    job_id: str
    backend: str
    endpoint: str
    group: str = "default"
    submitted: float = 0.0
    state: str = "waiting"
    changed: float = 0.0
    native: str = ""
    reason: str = ""
    cores: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise ValueError(f"a pilot's cores is an integer >= 1, got {self.cores!r}")
        if self.state not in PILOT_STATES:
            raise ValueError(f"pilot state must be one of {PILOT_STATES}, got {self.state!r}")
        if not self.job_id or not self.backend or not self.endpoint:
            raise ValueError("a pilot needs a job id, a backend and an endpoint")

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def endpoint_key(self) -> str:
        """``backend/endpoint``, as ``Endpoint.key``."""
        return f"{self.backend}/{self.endpoint}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pilot:
        return cls(**{k: data[k] for k in _FIELDS if k in data})

    def moved(self, state: str, now: float, native: str = "", reason: str = "") -> Pilot:
        """This pilot in ``state``; ``changed`` moves only when the state does (and the same
        pilot comes back when nothing changed: most pilots, most polls)."""
        if state == self.state and native == self.native and reason == self.reason:
            return self
        changed = self.changed if state == self.state else now
        return replace(self, state=state, changed=changed, native=native, reason=reason)


_FIELDS = (
    "job_id",
    "backend",
    "endpoint",
    "group",
    "submitted",
    "state",
    "changed",
    "native",
    "reason",
    "cores",
)

#: (backend, endpoint, group) -> (pilots waiting, their cores)
Waiting = dict[tuple[str, str, str], tuple[int, int]]


@dataclass(frozen=True)
class RoomClaim:
    """Room one submission wants on one endpoint, under the limits (API 1.10): ``count``
    pilots of ``cores`` cores each, against ``max_waiting`` and ``max_waiting_cores`` on the
    endpoint and ``max_total`` on the backend (None: no such limit). ``holder`` names the
    reservation (unique); it lapses at ``expires`` (the store's clock) if never settled."""

    holder: str
    backend: str
    endpoint: str
    count: int
    expires: float
    cores: int = 1
    max_waiting: int | None = None
    max_waiting_cores: int | None = None
    max_total: int | None = None

    def room(
        self,
        waiting: int,
        waiting_cores: int,
        active: int,
        reserved: tuple[int, int],
        reserved_backend: int,
    ) -> int:
        """How many of ``count`` fit, given the endpoint's ``waiting`` pilots and their
        cores, the backend's ``active`` (non-terminal) pilots, and the live reservations of
        others: (pilots, cores) on the endpoint, pilots on the backend."""
        take = self.count
        if self.max_waiting is not None:
            take = min(take, self.max_waiting - waiting - reserved[0])
        if self.max_waiting_cores is not None:
            left = self.max_waiting_cores - waiting_cores - reserved[1]
            take = min(take, left // max(1, self.cores))
        if self.max_total is not None:
            take = min(take, self.max_total - active - reserved_backend)
        return max(0, take)


@dataclass(frozen=True)
class RecordGroup:
    """Records of one stream that share a time slot and the values of some fields
    (:meth:`StateStore.record_groups`, API 1.11)."""

    #: the grouped fields' values (None where the records lack one) and ``time``, the
    #: earliest of the group
    record: dict[str, Any]
    #: how many records the group counts
    count: int


@dataclass(frozen=True)
class FinishedSlot:
    """Pilots that reached one terminal state in one time slot
    (:meth:`PilotRegistry.finished_per_slot`, API 1.11)."""

    #: the earliest change of state among them (clock time)
    changed: float
    state: str
    count: int


def check_bucket(bucket: float) -> float:
    """``bucket`` if it is a positive number of seconds (the slot of a grouped read)."""
    if not bucket > 0:
        raise ValueError(f"a slot is a positive number of seconds, not {bucket!r}")
    return float(bucket)


def group_records(
    records: Iterable[Mapping[str, Any]], fields: Sequence[str], bucket: float
) -> list[RecordGroup]:
    """``records`` counted as :meth:`StateStore.record_groups` counts them (in Python: the
    default, and the SQL drivers' answer for a stream they cannot group in SQL)."""
    check_bucket(bucket)
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for record in records:
        when = float(record["time"])
        values = [record.get(f) for f in fields]
        # a value of the wrong type (a list where text was written) still groups: its JSON
        key = (when // bucket, *(json.dumps(v, sort_keys=True) for v in values))
        group = groups.get(key)
        if group is None:
            groups[key] = [when, values, 1]
        else:
            group[0] = min(group[0], when)
            group[2] += 1
    return [
        RecordGroup({**dict(zip(fields, values, strict=True)), "time": when}, count)
        for when, values, count in sorted(groups.values(), key=lambda g: g[0])
    ]


def finished_slots(
    pilots: Iterable[Pilot], bucket: float, since: float = 0.0
) -> list[FinishedSlot]:
    """The terminal ``pilots`` whose state changed at or after ``since``, counted as
    :meth:`PilotRegistry.finished_per_slot` counts them."""
    check_bucket(bucket)
    slots: dict[tuple[float, str], list[Any]] = {}
    for pilot in pilots:
        if not pilot.terminal or pilot.changed < since:
            continue
        key = (pilot.changed // bucket, pilot.state)
        slot = slots.get(key)
        if slot is None:
            slots[key] = [pilot.changed, 1]
        else:
            slot[0] = min(slot[0], pilot.changed)
            slot[1] += 1
    return sorted(
        (FinishedSlot(first, state, n) for (_, state), (first, n) in slots.items()),
        key=lambda s: (s.changed, s.state),
    )


@dataclass(frozen=True)
class LiveStates:
    """What a status poll reads of one endpoint's non-terminal pilots
    (:meth:`PilotRegistry.live_states`): each one's state and submission time by job id, both
    oldest submission first. Two flat dicts rather than a value a pilot, so that reading and
    comparing the states of 100,000 pilots makes no object for the garbage collector to scan."""

    #: job id -> state
    states: dict[str, str] = field(default_factory=dict)
    #: job id -> submission time (clock time)
    submitted: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.states)

    @classmethod
    def of(cls, pilots: Iterable[Pilot]) -> LiveStates:
        """The live states of these pilots, in their order."""
        rows = list(pilots)
        return cls({p.job_id: p.state for p in rows}, {p.job_id: p.submitted for p in rows})


class PilotRegistry(ABC):
    """What every driver's registry answers. Safe for many threads; the sqlite, redis and
    postgresql registries are shared by every process using the same store."""

    @abstractmethod
    def put(self, pilots: Iterable[Pilot]) -> None:
        """Insert or replace these pilots, all in one transaction."""

    @abstractmethod
    def active(self, backend: str, endpoint: str) -> list[Pilot]:
        """The non-terminal pilots of one endpoint, oldest submission first."""

    def live_states(self, backend: str, endpoint: str) -> LiveStates:
        """Each non-terminal pilot's state and submission time, in the order of ``active``.

        What a status poll reads of one endpoint (oldest submission first); it reads whole rows
        (:meth:`get_many`) only for the pilots whose state changed.

        This default reads :meth:`active`; the built-in drivers read the two values alone,
        which costs a fraction of building every row."""
        return LiveStates.of(self.active(backend, endpoint))

    def get_many(self, backend: str, endpoint: str, job_ids: Iterable[str]) -> list[Pilot]:
        """The pilots of one endpoint with these job ids, in the order asked.

        An id the registry does not hold is left out, and one asked twice comes once.

        This default asks :meth:`get` for each; the built-in drivers read them at once."""
        found = (self.get(backend, endpoint, job) for job in dict.fromkeys(job_ids))
        return [p for p in found if p is not None]

    @abstractmethod
    def counts(self) -> Counts:
        """How many pilots each (backend, endpoint, state) holds; absent means 0."""

    @abstractmethod
    def waiting(self) -> Waiting:
        """The ``waiting`` pilots by (backend, endpoint, group): how many, and their cores
        summed; absent means none. What the queue demand subtracts per group and
        ``max_waiting_cores`` counts per endpoint; it never scans terminal rows."""

    @abstractmethod
    def last_finished(self, backend: str, endpoint: str, n: int, after: float = 0.0) -> list[Pilot]:
        """Up to ``n`` terminal pilots of one endpoint whose state changed after ``after``,
        the most recently finished first."""

    @abstractmethod
    def query(
        self,
        backend: str | None = None,
        endpoint: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Pilot]:
        """Pilots matching every filter given, by backend, endpoint and submission time."""

    def finished_per_slot(self, bucket: float, since: float = 0.0) -> list[FinishedSlot]:
        """How many pilots reached each terminal state in each slot of ``bucket`` seconds
        (``changed // bucket``), of those whose state changed at or after ``since``; oldest
        slot first (API 1.11). What a report reads of a long history instead of every
        finished pilot.

        This default reads :meth:`query`; the SQL drivers count in the database."""
        return finished_slots(self.query(states=sorted(TERMINAL_STATES)), bucket, since)

    @abstractmethod
    def prune(self, before: float) -> int:
        """Forget terminal pilots whose state changed before ``before``; how many went."""

    def get(self, backend: str, endpoint: str, job_id: str) -> Pilot | None:
        """One pilot, or None."""
        for pilot in self.query(backend, endpoint):
            if pilot.job_id == job_id:
                return pilot
        return None

    def reserve(self, claim: RoomClaim, now: float) -> int:
        """Take room for up to ``claim.count`` pilots on its endpoint (API 1.10): in one atomic
        step, count the endpoint's waiting pilots and their cores, the backend's non-terminal
        pilots and every live reservation of any director, keep a reservation of what fits
        and answer how many (0: none; nothing is kept). Settled with :meth:`settle` once the
        pilots are :meth:`put` (or the submission failed); lapses at ``claim.expires``.

        :raises StateError: the store failed, or the driver cannot reserve atomically."""
        raise StateError(f"pilot registry {type(self).__name__} cannot reserve room")

    def settle(self, holder: str) -> None:
        """Drop the reservation ``holder`` (its pilots are in the registry now, or none were
        made); nothing when it is gone already."""
        raise StateError(f"pilot registry {type(self).__name__} cannot settle a reservation")

    def put_reserved(self, pilots: Iterable[Pilot], holder: str) -> None:
        """:meth:`put` the pilots of the reservation ``holder`` and :meth:`settle` it, in one
        atomic step where the driver can (API 1.10): in between, another director's
        reservation would count them twice and find no room that is there."""
        self.put(pilots)
        self.settle(holder)


def pilot_order(pilot: Pilot) -> tuple[str, str, float, str]:
    return (pilot.backend, pilot.endpoint, pilot.submitted, pilot.job_id)


def _age(pilot: Pilot) -> tuple[float, str]:
    return (pilot.submitted, pilot.job_id)


# ---------------------------------------------------------------------------------------------
# memory: the registry of a driver that keeps none of its own (this process only)


class MemoryPilots(PilotRegistry):
    """Dicts behind a lock, indexed by endpoint and by terminal-ness."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, str], Pilot] = {}
        #: (backend, endpoint) -> job ids of its non-terminal pilots
        self._active: dict[tuple[str, str], dict[str, None]] = {}
        self._counts: Counts = {}
        #: holder -> its claim, as granted
        self._reserved: dict[str, RoomClaim] = {}

    def _drop(self, key: tuple[str, str, str]) -> None:
        old = self._rows.pop(key, None)
        if old is None:
            return
        where = (old.backend, old.endpoint, old.state)
        self._counts[where] -= 1
        if not self._counts[where]:
            del self._counts[where]
        if not old.terminal:
            self._active[(old.backend, old.endpoint)].pop(old.job_id, None)

    def put(self, pilots: Iterable[Pilot]) -> None:
        with self._lock:
            self._put(pilots)

    def put_reserved(self, pilots: Iterable[Pilot], holder: str) -> None:
        with self._lock:
            self._put(pilots)
            self._reserved.pop(holder, None)

    def _put(self, pilots: Iterable[Pilot]) -> None:
        """Insert or replace (the caller holds the lock)."""
        for pilot in pilots:
            key = (pilot.backend, pilot.endpoint, pilot.job_id)
            self._drop(key)
            self._rows[key] = pilot
            where = (pilot.backend, pilot.endpoint, pilot.state)
            self._counts[where] = self._counts.get(where, 0) + 1
            if not pilot.terminal:
                self._active.setdefault((pilot.backend, pilot.endpoint), {})[pilot.job_id] = None

    def active(self, backend: str, endpoint: str) -> list[Pilot]:
        with self._lock:
            ids = list(self._active.get((backend, endpoint), {}))
            pilots = [self._rows[(backend, endpoint, job)] for job in ids]
        return sorted(pilots, key=pilot_order)

    def live_states(self, backend: str, endpoint: str) -> LiveStates:
        with self._lock:
            rows = [
                self._rows[(backend, endpoint, job)]
                for job in self._active.get((backend, endpoint), {})
            ]
        rows.sort(key=_age)
        return LiveStates.of(rows)

    def get_many(self, backend: str, endpoint: str, job_ids: Iterable[str]) -> list[Pilot]:
        with self._lock:
            found = (self._rows.get((backend, endpoint, job)) for job in dict.fromkeys(job_ids))
            return [p for p in found if p is not None]

    def counts(self) -> Counts:
        with self._lock:
            return dict(self._counts)

    def waiting(self) -> Waiting:
        out: Waiting = {}
        with self._lock:
            for (backend, endpoint), ids in self._active.items():
                for job in ids:
                    pilot = self._rows[(backend, endpoint, job)]
                    if pilot.state == "waiting":
                        key = (backend, endpoint, pilot.group)
                        n, cores = out.get(key, (0, 0))
                        out[key] = (n + 1, cores + pilot.cores)
        return out

    def last_finished(self, backend: str, endpoint: str, n: int, after: float = 0.0) -> list[Pilot]:
        with self._lock:
            done = [
                p
                for (b, e, _j), p in self._rows.items()
                if b == backend and e == endpoint and p.terminal and p.changed > after
            ]
        done.sort(key=lambda p: (p.changed, p.job_id), reverse=True)
        return done[:n]

    def query(
        self,
        backend: str | None = None,
        endpoint: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Pilot]:
        wanted = set(states) if states else None
        with self._lock:
            rows = [
                p
                for p in self._rows.values()
                if (backend is None or p.backend == backend)
                and (endpoint is None or p.endpoint == endpoint)
                and (wanted is None or p.state in wanted)
            ]
        rows.sort(key=pilot_order)
        return rows if limit is None else rows[:limit]

    def prune(self, before: float) -> int:
        with self._lock:
            old = [k for k, p in self._rows.items() if p.terminal and p.changed < before]
            for key in old:
                self._drop(key)
        return len(old)

    def reserve(self, claim: RoomClaim, now: float) -> int:
        with self._lock:
            self._reserved = {h: c for h, c in self._reserved.items() if c.expires > now}
            waiting = self._counts.get((claim.backend, claim.endpoint, "waiting"), 0)
            cores = sum(
                self._rows[(claim.backend, claim.endpoint, job)].cores
                for job in self._active.get((claim.backend, claim.endpoint), {})
                if self._rows[(claim.backend, claim.endpoint, job)].state == "waiting"
            )
            active = sum(
                n
                for (b, _e, state), n in self._counts.items()
                if b == claim.backend and state not in TERMINAL_STATES
            )
            others = [c for h, c in self._reserved.items() if h != claim.holder]
            here = [c for c in others if (c.backend, c.endpoint) == (claim.backend, claim.endpoint)]
            take = claim.room(
                waiting,
                cores,
                active,
                (sum(c.count for c in here), sum(c.count * c.cores for c in here)),
                sum(c.count for c in others if c.backend == claim.backend),
            )
            if take > 0:
                self._reserved[claim.holder] = replace(claim, count=take)
            return take

    def settle(self, holder: str) -> None:
        with self._lock:
            self._reserved.pop(holder, None)


def encode(pilot: Pilot) -> str:
    """The JSON text of a pilot (the Redis registry's value)."""
    return json.dumps(pilot.as_dict(), sort_keys=True)


#: names of API 1.4 that moved into the sub-packages (a DeprecationWarning says where)
__getattr__ = moved_names(__name__)
