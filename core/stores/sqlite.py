"""The ``sqlite`` state driver, the embedded default: one file shared by threads and
processes, holding the keys, the accounting records and the pilot registry."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.model import TERMINAL_STATES
from gridgate.core.settings import Settings, settings_from
from gridgate.core.state import (
    Counts,
    FinishedSlot,
    LiveStates,
    Pilot,
    PilotRegistry,
    RecordGroup,
    RoomClaim,
    StateError,
    StateStore,
    Waiting,
    check_bucket,
    check_key,
    check_value,
    encode_record,
    expires_at,
    group_records,
    parse_count,
    pilot_order,
    prefix_successor,
)
from gridgate.core.stores.records import (
    group_query,
    groups_of,
    pilot_from_row,
    readable,
    stream_record,
)

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    expires REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_expires ON kv (expires) WHERE expires IS NOT NULL;
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stream TEXT NOT NULL,
    time REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_stream_time ON records (stream, time, id);
"""

# One statement, so one implicit transaction: the row is written when absent or expired, and
# the change count says whether this caller won.
_SQL_ADD = """
INSERT INTO kv (key, value, expires) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires = excluded.expires
WHERE kv.expires IS NOT NULL AND kv.expires <= ?
"""
_SQL_SET = """
INSERT INTO kv (key, value, expires) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires = excluded.expires
"""
_LIVE = "(expires IS NULL OR expires > ?)"
# A record already there (same stream, time and JSON text: an append retried after a stall
# whose first try did land) is not written twice; records_stream_time finds its peers.
_SQL_APPEND = """
INSERT INTO records (stream, time, data) SELECT ?, ?, ?
WHERE NOT EXISTS (SELECT 1 FROM records WHERE stream = ? AND time = ? AND data = ?)
"""


SQLITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Embedded state in one SQLite file on this host.",
    "properties": {
        "path": {
            "type": "string",
            "minLength": 1,
            "default": "./gridgate-state/state.db",
            "x-gridgate-path": True,
            "description": "The database file. Created 0600 in a 0700 directory; its "
            "folder is director.state_dir's default.",
        },
        "busy_timeout": {
            "maximum": 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 30,
            "description": "Seconds to wait for another process holding the write lock.",
        },
        "prune_interval": {
            "maximum": 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 300,
            "description": "Seconds (clock time) between sweeps of expired keys.",
        },
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class SqliteSettings(Settings):
    """The ``state:`` section of the sqlite driver, typed."""

    section_schema: ClassVar[Mapping[str, Any]] = SQLITE_SCHEMA

    path: str
    busy_timeout: float
    prune_interval: float


class SqliteState(StateStore):
    """State in one SQLite file (WAL mode): safe for many threads and several processes on one
    host, and expiries are absolute clock times, so a restart keeps them."""

    config_schema: ClassVar[dict[str, Any]] = SQLITE_SCHEMA

    def __init__(
        self, config: Mapping[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        super().__init__(config, clock)
        #: the section, typed (defaults from the schema; a store made in code may name less)
        self.settings = settings_from(SQLITE_SCHEMA, self.config, SqliteSettings, validate=False)
        self.path = Path(self.settings.path)
        self.busy_timeout = self.settings.busy_timeout
        self.prune_interval = self.settings.prune_interval
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._last_prune = clock.time()
        self._closed = False
        self._prepare_file()
        with self._lock:
            self._connect()

    def _prepare_file(self) -> None:
        try:
            if not self.path.parent.exists():
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Created here (not by sqlite, which follows the umask) so it is private from the
            # first byte; sqlite gives its -wal and -shm files the same mode.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise StateError(f"cannot create state file {self.path}: {reason}") from exc

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,  # autocommit: each statement is its own transaction
                check_same_thread=False,  # guarded by self._lock
            )
        except sqlite3.Error as exc:
            raise StateError(f"cannot open state file {self.path}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StateError(f"state file {self.path}: cannot use WAL mode (got {mode})")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(_SQLITE_SCHEMA)
        except sqlite3.Error as exc:
            conn.close()
            raise StateError(self._explain(exc, "open")) from exc
        except StateError:
            conn.close()
            raise
        self._conn = conn
        self._pid = os.getpid()
        return conn

    def _explain(self, exc: sqlite3.Error, what: str) -> str:
        text = str(exc)
        low = text.lower()
        if "readonly" in low or "read-only" in low:
            hint = "the file or its directory is read-only"
        elif "full" in low:
            hint = "the disk is full"
        elif "disk i/o" in low:
            # EFBIG (a file size limit) and EIO reach sqlite as SQLITE_IOERR, not SQLITE_FULL.
            hint = "the disk could not be written (full, over a file size limit, or failing)"
        elif "not a database" in low or "malformed" in low:
            hint = "the file is not a gridgate state database or is damaged"
        elif "locked" in low or "busy" in low:
            hint = f"another process held the lock longer than busy_timeout={self.busy_timeout}s"
        elif "unable to open" in low:
            hint = "the path cannot be opened as a file"
        else:
            hint = "database error"
        code = getattr(exc, "sqlite_errorname", "")
        return (
            f"state file {self.path}: cannot {what}: {hint} ({text}{', ' + code if code else ''})"
        )

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StateError(f"state file {self.path}: the store is closed")
        conn = self._conn
        if conn is None or self._pid != os.getpid():
            # A forked child must not share the parent's connection.
            conn = self._connect()
        return conn

    def _execute(self, what: str, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement under the lock (caller holds ``self._lock``); its row count."""
        conn = self._connection()
        try:
            return conn.execute(sql, params).rowcount
        except sqlite3.Error as exc:
            raise StateError(self._explain(exc, what)) from exc

    def _fetch(self, what: str, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one statement, read whole under the lock (caller holds ``self._lock``):
        a step of the cursor can fail as the statement can (a full disk under ``DELETE ...
        RETURNING``, a read that must grow the WAL index), so it is read inside the
        conversion to :class:`StateError`."""
        conn = self._connection()
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StateError(self._explain(exc, what)) from exc

    @contextmanager
    def transaction(self, what: str, write: bool = True) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, inside one transaction (``BEGIN IMMEDIATE`` when
        ``write``) that commits when the block ends and rolls back when it raises; sqlite
        errors become :class:`StateError` naming ``what``."""
        with self._lock:
            self._execute(what, "BEGIN IMMEDIATE" if write else "BEGIN")
            conn = self._conn
            assert conn is not None
            try:
                yield conn
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(conn)
                raise StateError(self._explain(exc, what)) from exc
            except BaseException:
                _rollback(conn)
                raise

    def pilot_registry(self) -> PilotRegistry:
        """The ``pilots`` table of this file."""
        with self._lock:
            registry = self._pilot_registry
            if registry is None:
                registry = self._pilot_registry = SqlitePilots(self)
            return registry

    def _maybe_prune(self, now: float) -> None:
        if now - self._last_prune < self.prune_interval:
            return
        self._last_prune = now
        self._execute("prune", "DELETE FROM kv WHERE expires IS NOT NULL AND expires <= ?", (now,))

    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        with self._lock:
            now = self.clock.time()
            self._maybe_prune(now)
            return self._execute("write", _SQL_ADD, (key, value, expires, now)) == 1

    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        with self._lock:
            self._maybe_prune(self.clock.time())
            self._execute("write", _SQL_SET, (key, value, expires))

    def get(self, key: str) -> str | None:
        with self._lock:
            rows = self._fetch(
                "read", f"SELECT value FROM kv WHERE key = ? AND {_LIVE}", (key, self.clock.time())
            )
        return rows[0][0] if rows else None

    def increment(self, key: str, by: int = 1) -> int:
        check_key(key)
        # read and write in one BEGIN IMMEDIATE transaction: the write lock is taken first,
        # so two processes on one file never read the same count
        with self.transaction("count") as conn:
            row = conn.execute(
                f"SELECT value FROM kv WHERE key = ? AND {_LIVE}", (key, self.clock.time())
            ).fetchone()
            total = parse_count(key, None if row is None else row[0]) + int(by)
            conn.execute(_SQL_SET, (key, str(total), None))
        return total

    def delete(self, key: str) -> bool:
        with self._lock:
            rows = self._fetch("write", "DELETE FROM kv WHERE key = ? RETURNING expires", (key,))
            now = self.clock.time()
        return any(exp is None or exp > now for (exp,) in rows)

    def renew(self, key: str, value: str, ttl: float | None) -> bool:
        expires = expires_at(self.clock, ttl)
        with self._lock:
            sql = f"UPDATE kv SET expires = ? WHERE key = ? AND value = ? AND {_LIVE}"
            return self._execute("write", sql, (expires, key, value, self.clock.time())) == 1

    def delete_if(self, key: str, value: str) -> bool:
        with self._lock:
            sql = f"DELETE FROM kv WHERE key = ? AND value = ? AND {_LIVE}"
            return self._execute("write", sql, (key, value, self.clock.time())) == 1

    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        upper = prefix_successor(prefix)
        sql = f"SELECT key, value FROM kv WHERE key >= ? AND {_LIVE}"
        params: list[Any] = [prefix, 0.0]
        if upper is not None:
            sql += " AND key < ?"
            params.append(upper)
        sql += " ORDER BY key"
        with self._lock:
            params[1] = self.clock.time()
            rows = self._fetch("read", sql, params)
        return [(k, v) for k, v in rows]

    def ttl(self, key: str) -> float | None:
        with self._lock:
            now = self.clock.time()
            rows = self._fetch(
                "read", f"SELECT expires FROM kv WHERE key = ? AND {_LIVE}", (key, now)
            )
        if not rows or rows[0][0] is None:
            return None
        return float(rows[0][0]) - now

    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        check_key(stream)
        when, text = encode_record(record)
        with self._lock:
            self._execute("write", _SQL_APPEND, (stream, when, text, stream, when, text))

    def prune_records(self, stream: str, before: float) -> int:
        with self._lock:
            gone = self._execute(
                "write",
                "DELETE FROM records WHERE stream = ? AND time < ?",
                (stream, float(before)),
            )
            return max(0, gone)

    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._fetch(
                "read",
                "SELECT data FROM records WHERE stream = ? AND time >= ? ORDER BY time, id",
                (stream, since),
            )
        return readable((text for (text,) in rows), stream_record, f"state records {stream}")

    def record_groups(
        self, stream: str, fields: Sequence[str], bucket: float, since: float = 0.0
    ) -> list[RecordGroup]:
        # each field's JSON text (->; null and absent alike), so 5 and "5" stay apart; a row
        # that is not JSON fails the statement: the stream is grouped in Python, which skips
        # and logs it
        sql = group_query(
            "records WHERE stream = ? AND time >= ?",
            "nullif(data -> ?, 'null')",
            "CAST(time / ? AS INTEGER)",
            fields,
        )
        params = (*(f"$.{f}" for f in fields), stream, float(since), check_bucket(bucket))
        with self._lock:
            try:
                rows = self._connection().execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                if "malformed JSON" not in str(exc):
                    raise StateError(self._explain(exc, "read")) from exc
                rows = None
            except sqlite3.Error as exc:
                raise StateError(self._explain(exc, "read")) from exc
        if rows is None:
            return group_records(self.records(stream, since), fields, bucket)
        return groups_of(rows, fields)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None and self._pid == os.getpid():
                try:
                    self._conn.close()
                except sqlite3.Error as exc:
                    logger.warning("state file {}: error on close: {}", self.path, exc)
            self._conn = None


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # the failed statement already ended the transaction


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
CREATE INDEX IF NOT EXISTS pilots_live ON pilots (backend, endpoint, submitted, job_id, state)
    WHERE terminal = 0;
CREATE TABLE IF NOT EXISTS pilot_counts (
    backend TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    state TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (backend, endpoint, state)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pilot_reservations (
    holder TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    n INTEGER NOT NULL,
    cores INTEGER NOT NULL,
    expires REAL NOT NULL
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


#: Job ids per ``IN (...)`` of :meth:`SqlitePilots.get_many` (well under sqlite's limit on
#: the parameters of one statement, 999 before 3.32).
_IDS_PER_SELECT = 500


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


def _pilots(rows: Iterable[Sequence[Any]]) -> list[Pilot]:
    return readable(rows, pilot_from_row, "pilot registry (sqlite)")


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
        return sorted(_pilots(rows), key=pilot_order)

    def live_states(self, backend: str, endpoint: str) -> LiveStates:
        # read from the partial index pilots_live alone, in its order: no row, no sort
        rows = self._read(
            "SELECT job_id, state, submitted FROM pilots "
            "WHERE backend = ? AND endpoint = ? AND terminal = 0 ORDER BY submitted, job_id",
            (backend, endpoint),
        )
        return LiveStates({j: s for j, s, _t in rows}, {j: t for j, _s, t in rows})

    def get_many(self, backend: str, endpoint: str, job_ids: Iterable[str]) -> list[Pilot]:
        wanted = list(dict.fromkeys(job_ids))
        found: dict[str, Pilot] = {}
        with self.store.transaction("read pilots", write=False) as conn:
            for start in range(0, len(wanted), _IDS_PER_SELECT):
                some = wanted[start : start + _IDS_PER_SELECT]
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM pilots WHERE backend = ? AND endpoint = ? "
                    f"AND job_id IN ({', '.join('?' * len(some))})",
                    (backend, endpoint, *some),
                ).fetchall()
                found.update((p.job_id, p) for p in _pilots(rows))
        return [found[job] for job in wanted if job in found]

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
        return _pilots(rows)

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
        return _pilots(self._read(sql, params))

    def get(self, backend: str, endpoint: str, job_id: str) -> Pilot | None:
        rows = self._read(
            f"SELECT {_COLUMNS} FROM pilots WHERE backend = ? AND endpoint = ? AND job_id = ?",
            (backend, endpoint, job_id),
        )
        found = _pilots(rows[:1])
        return found[0] if found else None

    def finished_per_slot(self, bucket: float, since: float = 0.0) -> list[FinishedSlot]:
        rows = self._read(
            "SELECT min(changed), state, count(*) FROM pilots WHERE terminal = 1 "
            "AND changed >= ? GROUP BY CAST(changed / ? AS INTEGER), state ORDER BY 1, 2",
            (float(since), check_bucket(bucket)),
        )
        return [FinishedSlot(float(c), str(s), int(n)) for c, s, n in rows]

    def prune(self, before: float) -> int:
        with self.store.transaction("prune pilots") as conn:
            return conn.execute(
                "DELETE FROM pilots WHERE terminal = 1 AND changed < ?", (before,)
            ).rowcount

    def reserve(self, claim: RoomClaim, now: float) -> int:
        b, e = claim.backend, claim.endpoint
        terminal = sorted(TERMINAL_STATES)
        with self.store.transaction("reserve room") as conn:  # BEGIN IMMEDIATE: one writer
            conn.execute("DELETE FROM pilot_reservations WHERE expires <= ?", (now,))
            waiting, cores = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(cores), 0) FROM pilots "
                "WHERE state = 'waiting' AND backend = ? AND endpoint = ?",
                (b, e),
            ).fetchone()
            (active,) = conn.execute(
                "SELECT COALESCE(SUM(n), 0) FROM pilot_counts WHERE backend = ? "
                f"AND state NOT IN ({', '.join('?' * len(terminal))})",
                (b, *terminal),
            ).fetchone()
            others = "FROM pilot_reservations WHERE holder <> ? AND backend = ?"
            here_n, here_cores = conn.execute(
                f"SELECT COALESCE(SUM(n), 0), COALESCE(SUM(cores), 0) {others} AND endpoint = ?",
                (claim.holder, b, e),
            ).fetchone()
            (on_backend,) = conn.execute(
                f"SELECT COALESCE(SUM(n), 0) {others}", (claim.holder, b)
            ).fetchone()
            take = claim.room(
                int(waiting),
                int(cores),
                int(active),
                (int(here_n), int(here_cores)),
                int(on_backend),
            )
            if take > 0:
                conn.execute(
                    "INSERT INTO pilot_reservations VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (holder) DO UPDATE SET n = excluded.n, cores = excluded.cores, "
                    "expires = excluded.expires",
                    (claim.holder, b, e, take, take * claim.cores, claim.expires),
                )
            return take

    def settle(self, holder: str) -> None:
        with self.store.transaction("settle room") as conn:
            conn.execute("DELETE FROM pilot_reservations WHERE holder = ?", (holder,))

    def put_reserved(self, pilots: Iterable[Pilot], holder: str) -> None:
        rows = [_row(p) for p in pilots]
        with self.store.transaction("write pilots") as conn:
            conn.executemany(_UPSERT, rows)
            conn.execute("DELETE FROM pilot_reservations WHERE holder = ?", (holder,))


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
