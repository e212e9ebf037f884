"""The pilot registry: every pilot the director submitted, with its last known state.

It lives in the state store (each driver provides one through ``StateStore.pilot_registry()``:
in memory, in the SQLite file beside the caches, or in Redis), so a restarted director keeps
tracking what it submitted and ``gridgate pilots`` reads it from another process. Rows are keyed
by (backend, endpoint, job id) and indexed by endpoint and state: the director's questions ---
the non-terminal pilots of one endpoint, counts by state, the last finished pilots of an
endpoint --- never scan the terminal rows kept for accounting. Writes come in bulk, one
transaction per call.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from gridgate.core.model import PILOT_STATES, TERMINAL_STATES

if TYPE_CHECKING:
    from gridgate.core.state import SqliteState

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


class PilotRegistry(ABC):
    """What every driver's registry answers. Safe for many threads; the sqlite and redis
    registries are shared by every process using the same store."""

    @abstractmethod
    def put(self, pilots: Iterable[Pilot]) -> None:
        """Insert or replace these pilots, all in one transaction."""

    @abstractmethod
    def active(self, backend: str, endpoint: str) -> list[Pilot]:
        """The non-terminal pilots of one endpoint, oldest submission first."""

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

    @abstractmethod
    def prune(self, before: float) -> int:
        """Forget terminal pilots whose state changed before ``before``; how many went."""

    def get(self, backend: str, endpoint: str, job_id: str) -> Pilot | None:
        """One pilot, or None."""
        for pilot in self.query(backend, endpoint):
            if pilot.job_id == job_id:
                return pilot
        return None


def _order(pilot: Pilot) -> tuple[str, str, float, str]:
    return (pilot.backend, pilot.endpoint, pilot.submitted, pilot.job_id)


# ---------------------------------------------------------------------------------------------
# memory


class MemoryPilots(PilotRegistry):
    """Dicts behind a lock, indexed by endpoint and by terminal-ness."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, str], Pilot] = {}
        #: (backend, endpoint) -> job ids of its non-terminal pilots
        self._active: dict[tuple[str, str], dict[str, None]] = {}
        self._counts: Counts = {}

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
            for pilot in pilots:
                key = (pilot.backend, pilot.endpoint, pilot.job_id)
                self._drop(key)
                self._rows[key] = pilot
                where = (pilot.backend, pilot.endpoint, pilot.state)
                self._counts[where] = self._counts.get(where, 0) + 1
                if not pilot.terminal:
                    self._active.setdefault((pilot.backend, pilot.endpoint), {})[pilot.job_id] = (
                        None
                    )

    def active(self, backend: str, endpoint: str) -> list[Pilot]:
        with self._lock:
            ids = list(self._active.get((backend, endpoint), {}))
            pilots = [self._rows[(backend, endpoint, job)] for job in ids]
        return sorted(pilots, key=_order)

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
        rows.sort(key=_order)
        return rows if limit is None else rows[:limit]

    def prune(self, before: float) -> int:
        with self._lock:
            old = [k for k, p in self._rows.items() if p.terminal and p.changed < before]
            for key in old:
                self._drop(key)
        return len(old)


# ---------------------------------------------------------------------------------------------
# sqlite: a table in the state file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pilots (
    backend TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    job_id TEXT NOT NULL,
    grp TEXT NOT NULL,
    submitted REAL NOT NULL,
    state TEXT NOT NULL,
    changed REAL NOT NULL,
    native TEXT NOT NULL,
    reason TEXT NOT NULL,
    terminal INTEGER NOT NULL,
    cores INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (backend, endpoint, job_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS pilots_by_state ON pilots (backend, endpoint, state);
CREATE INDEX IF NOT EXISTS pilots_finished ON pilots (backend, endpoint, terminal, changed);
CREATE INDEX IF NOT EXISTS pilots_age ON pilots (terminal, changed);
CREATE TABLE IF NOT EXISTS pilot_counts (
    backend TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    state TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (backend, endpoint, state)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS pilots_counted_in AFTER INSERT ON pilots BEGIN
    INSERT INTO pilot_counts VALUES (NEW.backend, NEW.endpoint, NEW.state, 1)
        ON CONFLICT (backend, endpoint, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS pilots_counted_out AFTER DELETE ON pilots BEGIN
    UPDATE pilot_counts SET n = n - 1
        WHERE backend = OLD.backend AND endpoint = OLD.endpoint AND state = OLD.state;
END;
CREATE TRIGGER IF NOT EXISTS pilots_counted_moved AFTER UPDATE OF state ON pilots
    WHEN OLD.state <> NEW.state BEGIN
    UPDATE pilot_counts SET n = n - 1
        WHERE backend = OLD.backend AND endpoint = OLD.endpoint AND state = OLD.state;
    INSERT INTO pilot_counts VALUES (NEW.backend, NEW.endpoint, NEW.state, 1)
        ON CONFLICT (backend, endpoint, state) DO UPDATE SET n = n + 1;
END
"""
#: Made after the migration (a file from before has no ``cores`` to index): the waiting pilots
#: by group with their cores, read without touching the table (a covering index).
_WAITING_INDEX = (
    "CREATE INDEX IF NOT EXISTS pilots_waiting ON pilots (state, backend, endpoint, grp, cores)"
)
_COLUMNS = "job_id, backend, endpoint, grp, submitted, state, changed, native, reason, cores"
# An upsert, not INSERT OR REPLACE: a replace deletes without firing the delete trigger, so the
# counts kept by the triggers would drift.
_UPSERT = f"""
INSERT INTO pilots ({_COLUMNS}, terminal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (backend, endpoint, job_id) DO UPDATE SET
    grp = excluded.grp, submitted = excluded.submitted, state = excluded.state,
    changed = excluded.changed, native = excluded.native, reason = excluded.reason,
    cores = excluded.cores, terminal = excluded.terminal
"""


def _row(pilot: Pilot) -> tuple[Any, ...]:
    return (
        pilot.job_id,
        pilot.backend,
        pilot.endpoint,
        pilot.group,
        pilot.submitted,
        pilot.state,
        pilot.changed,
        pilot.native,
        pilot.reason,
        pilot.cores,
        1 if pilot.terminal else 0,
    )


def _pilot(row: Sequence[Any]) -> Pilot:
    return Pilot(*row)


class SqlitePilots(PilotRegistry):
    """The ``pilots`` table of a :class:`~gridgate.core.state.SqliteState` file, on its
    connection and lock (so its errors are the store's :class:`StateError`). Triggers keep
    ``pilot_counts`` (pilots per backend, endpoint and state) in step with every write, so the
    counts the director reads at each iteration cost one small table, not a scan.

    A file written before pilots had ``cores`` (API 1.2) is migrated when it is opened: the
    column is added, every pilot already there counted as one core (all pilots were)."""

    def __init__(self, store: SqliteState) -> None:
        self.store = store
        with store.transaction("create the pilots table") as conn:
            for statement in _statements(_SCHEMA):
                conn.execute(statement)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(pilots)")}
            if "cores" not in columns:
                conn.execute("ALTER TABLE pilots ADD COLUMN cores INTEGER NOT NULL DEFAULT 1")
            conn.execute(_WAITING_INDEX)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self.store.transaction("read pilots", write=False) as conn:
            return conn.execute(sql, params).fetchall()

    def put(self, pilots: Iterable[Pilot]) -> None:
        rows = [_row(p) for p in pilots]
        if not rows:
            return
        with self.store.transaction("write pilots") as conn:
            conn.executemany(_UPSERT, rows)

    def active(self, backend: str, endpoint: str) -> list[Pilot]:
        rows = self._read(
            f"SELECT {_COLUMNS} FROM pilots WHERE backend = ? AND endpoint = ? AND terminal = 0",
            (backend, endpoint),
        )
        return sorted((_pilot(r) for r in rows), key=_order)

    def counts(self) -> Counts:
        rows = self._read("SELECT backend, endpoint, state, n FROM pilot_counts WHERE n > 0")
        return {(b, e, s): n for b, e, s, n in rows}

    def waiting(self) -> Waiting:
        rows = self._read(
            "SELECT backend, endpoint, grp, COUNT(*), SUM(cores) FROM pilots "
            "WHERE state = 'waiting' GROUP BY backend, endpoint, grp"
        )
        return {(b, e, g): (int(n), int(c)) for b, e, g, n, c in rows}

    def last_finished(self, backend: str, endpoint: str, n: int, after: float = 0.0) -> list[Pilot]:
        rows = self._read(
            f"SELECT {_COLUMNS} FROM pilots WHERE backend = ? AND endpoint = ? "
            "AND terminal = 1 AND changed > ? ORDER BY changed DESC, job_id DESC "
            "LIMIT ?",
            (backend, endpoint, after, int(n)),
        )
        return [_pilot(r) for r in rows]

    def query(
        self,
        backend: str | None = None,
        endpoint: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Pilot]:
        where, params = ["1"], []
        if backend is not None:
            where.append("backend = ?")
            params.append(backend)
        if endpoint is not None:
            where.append("endpoint = ?")
            params.append(endpoint)
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            params.extend(states)
        sql = (
            f"SELECT {_COLUMNS} FROM pilots WHERE {' AND '.join(where)} "
            "ORDER BY backend, endpoint, submitted, job_id"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_pilot(r) for r in self._read(sql, params)]

    def get(self, backend: str, endpoint: str, job_id: str) -> Pilot | None:
        rows = self._read(
            f"SELECT {_COLUMNS} FROM pilots WHERE backend = ? AND endpoint = ? AND job_id = ?",
            (backend, endpoint, job_id),
        )
        return _pilot(rows[0]) if rows else None

    def prune(self, before: float) -> int:
        with self.store.transaction("prune pilots") as conn:
            return conn.execute(
                "DELETE FROM pilots WHERE terminal = 1 AND changed < ?", (before,)
            ).rowcount


def _statements(script: str) -> list[str]:
    """The statements of ``script``; a trigger's body (BEGIN ... END) stays whole."""
    out: list[str] = []
    current = ""
    for part in script.split(";"):
        current += part + ";"
        if sqlite3.complete_statement(current):
            if current.strip(" \n;"):
                out.append(current.strip())
            current = ""
    return out


def encode(pilot: Pilot) -> str:
    """The JSON text of a pilot (the Redis registry's value)."""
    return json.dumps(pilot.as_dict(), sort_keys=True)


def decode(text: str) -> Pilot:
    return Pilot.from_dict(json.loads(text))
