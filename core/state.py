"""Expiring keys with atomic add-if-absent, and an append-only accounting log.

The failing and tickets caches, the list-match cache, escalation history, notification
de-duplication and the per-submission accounting rows all live here. Drivers are found
through the ``gridgate.state`` entry-point group; every driver passes the same contract
tests (tests/core/test_state_contract.py).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from gridgate.core.config import Config
    from gridgate.core.pilots import PilotRegistry


def open_state(config: Config | Mapping[str, Any], clock: Clock = SYSTEM_CLOCK) -> StateStore:
    """Open the state store a config names: the driver ``state.driver`` (found through the
    ``gridgate.state`` entry points) made with the rest of that section.

    :param config: a config (or a mapping) with a ``state:`` section; none means
        ``{driver: sqlite}``.
    :param clock: the store's clock, on which expiries are measured.
    :raises PluginLoadError: when no installed driver has that name.
    """
    from gridgate.core.plugins import STATE_GROUP, load_class  # the loader imports this module

    section = dict(config.get("state") or {"driver": "sqlite"})
    driver = section.pop("driver", "sqlite")
    cls = load_class(STATE_GROUP, driver)
    return cls(section, clock=clock)


class StateError(Exception):
    """The state store cannot be read or written (disk full, read-only, server gone)."""


class StateStore(ABC):
    """Contract every state driver implements.

    Values are strings (callers encode JSON). ``ttl`` is in seconds, None for no expiry;
    expiry is measured on the injected clock's wall time, so it survives restarts.
    All methods are safe to call from many threads; drivers that share state between
    processes (sqlite, redis) are safe across processes too.
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

    @abstractmethod
    def ttl(self, key: str) -> float | None:
        """Seconds until ``key`` expires; None when absent or without expiry."""

    @abstractmethod
    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        """Append a JSON-serialisable record (must hold a float ``time``) to ``stream``."""

    @abstractmethod
    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        """Records of ``stream`` whose ``time`` >= ``since``, oldest first."""

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
        """The pilot registry kept in this store (see :mod:`gridgate.core.pilots`).

        A driver that does not override this keeps pilots in this process only."""
        with _REGISTRY_LOCK:
            registry = self._pilot_registry
            if registry is None:
                from gridgate.core.pilots import MemoryPilots

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
# memory: one process, gone at exit


class MemoryState(StateStore):
    """A dict behind a lock, for tests and single-shot runs; nothing survives the process."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "description": "In-process state: nothing is kept across restarts or shared.",
        "properties": {},
        "additionalProperties": False,
    }

    #: Expired keys are dropped at most this often (clock seconds), not on every call.
    PRUNE_EVERY = 60.0

    def __init__(
        self, config: Mapping[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        super().__init__(config, clock)
        self._lock = threading.Lock()
        self._data: dict[str, tuple[str, float | None]] = {}
        self._records: dict[str, list[tuple[float, str]]] = {}
        self._last_prune = clock.time()

    def _live(self, key: str, now: float) -> tuple[str, float | None] | None:
        entry = self._data.get(key)
        if entry is None:
            return None
        if entry[1] is not None and entry[1] <= now:
            del self._data[key]
            return None
        return entry

    def _maybe_prune(self, now: float) -> None:
        if now - self._last_prune < self.PRUNE_EVERY:
            return
        self._last_prune = now
        dead = [k for k, (_v, exp) in self._data.items() if exp is not None and exp <= now]
        for k in dead:
            del self._data[k]

    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        with self._lock:
            now = self.clock.time()
            self._maybe_prune(now)
            if self._live(key, now) is not None:
                return False
            self._data[key] = (value, expires)
            return True

    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        with self._lock:
            self._maybe_prune(self.clock.time())
            self._data[key] = (value, expires)

    def get(self, key: str) -> str | None:
        with self._lock:
            entry = self._live(key, self.clock.time())
            return None if entry is None else entry[0]

    def delete(self, key: str) -> bool:
        with self._lock:
            live = self._live(key, self.clock.time()) is not None
            self._data.pop(key, None)
            return live

    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        with self._lock:
            now = self.clock.time()
            return sorted(
                (k, v)
                for k, (v, exp) in self._data.items()
                if k.startswith(prefix) and (exp is None or exp > now)
            )

    def ttl(self, key: str) -> float | None:
        with self._lock:
            now = self.clock.time()
            entry = self._live(key, now)
            if entry is None or entry[1] is None:
                return None
            return entry[1] - now

    def increment(self, key: str, by: int = 1) -> int:
        check_key(key)
        with self._lock:
            entry = self._live(key, self.clock.time())
            total = parse_count(key, None if entry is None else entry[0]) + int(by)
            self._data[key] = (str(total), None)
            return total

    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        check_key(stream)
        when, text = encode_record(record)
        with self._lock:
            self._records.setdefault(stream, []).append((when, text))

    def prune_records(self, stream: str, before: float) -> int:
        with self._lock:
            rows = self._records.get(stream, [])
            kept = [r for r in rows if r[0] >= before]
            self._records[stream] = kept
            return len(rows) - len(kept)

    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self._lock:
            rows = [r for r in self._records.get(stream, []) if r[0] >= since]
        rows.sort(key=lambda r: r[0])  # stable: equal times stay in append order
        return [json.loads(text) for _when, text in rows]


# ---------------------------------------------------------------------------------------------
# sqlite: the embedded default, one file shared by threads and processes

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


class SqliteState(StateStore):
    """State in one SQLite file (WAL mode): safe for many threads and several processes on one
    host, and expiries are absolute clock times, so a restart keeps them."""

    config_schema: ClassVar[dict[str, Any]] = {
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

    def __init__(
        self, config: Mapping[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        super().__init__(config, clock)
        self.path = Path(self.config.get("path", "./gridgate-state/state.db"))
        self.busy_timeout = float(self.config.get("busy_timeout", 30))
        self.prune_interval = float(self.config.get("prune_interval", 300))
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

    def _execute(self, what: str, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run one statement under the lock; caller holds ``self._lock``."""
        if self._closed:
            raise StateError(f"state file {self.path}: the store is closed")
        conn = self._conn
        if conn is None or self._pid != os.getpid():
            # A forked child must not share the parent's connection.
            conn = self._connect()
        try:
            return conn.execute(sql, params)
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
                from gridgate.core.pilots import SqlitePilots

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
            cur = self._execute("write", _SQL_ADD, (key, value, expires, now))
            return cur.rowcount == 1

    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        with self._lock:
            self._maybe_prune(self.clock.time())
            self._execute("write", _SQL_SET, (key, value, expires))

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._execute(
                "read", f"SELECT value FROM kv WHERE key = ? AND {_LIVE}", (key, self.clock.time())
            ).fetchone()
        return None if row is None else row[0]

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
            rows = self._execute(
                "write", "DELETE FROM kv WHERE key = ? RETURNING expires", (key,)
            ).fetchall()
            now = self.clock.time()
        return any(exp is None or exp > now for (exp,) in rows)

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
            rows = self._execute("read", sql, params).fetchall()
        return [(k, v) for k, v in rows]

    def ttl(self, key: str) -> float | None:
        with self._lock:
            now = self.clock.time()
            row = self._execute(
                "read", f"SELECT expires FROM kv WHERE key = ? AND {_LIVE}", (key, now)
            ).fetchone()
        if row is None or row[0] is None:
            return None
        return row[0] - now

    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        check_key(stream)
        when, text = encode_record(record)
        with self._lock:
            self._execute(
                "write",
                "INSERT INTO records (stream, time, data) VALUES (?, ?, ?)",
                (stream, when, text),
            )

    def prune_records(self, stream: str, before: float) -> int:
        with self._lock:
            cursor = self._execute(
                "write",
                "DELETE FROM records WHERE stream = ? AND time < ?",
                (stream, float(before)),
            )
            return int(cursor.rowcount or 0)

    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._execute(
                "read",
                "SELECT data FROM records WHERE stream = ? AND time >= ? ORDER BY time, id",
                (stream, since),
            ).fetchall()
        return [json.loads(text) for (text,) in rows]

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
