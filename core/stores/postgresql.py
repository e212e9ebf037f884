"""The ``postgresql`` state driver: several directors share one store whose history may grow to
millions of pilots, kept in tables of one PostgreSQL schema.

Expiries are absolute times on the injected clock, stored as numbers and compared with the
clock's time passed in by the caller (never the server's ``now()``), exactly as the sqlite
driver does. ``add_if_absent`` is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE expired``
statement, atomic across processes and hosts. The pilot registry is a ``pilots`` table beside
the keys; statement-level triggers keep ``pilot_counts`` in step, so the counts a director reads
at each iteration never scan the kept history.

Connections: a small pool of this module's own (:class:`Connections`), at most
``max_connections`` per store, each in autocommit mode with multi-statement work in explicit
transactions. psycopg_pool was not used: its ``getconn`` reports a server that refuses a login
as a bare ``PoolTimeout`` (the reason only in its log), where a state error must say why, and
a forked child would inherit a pool whose worker threads it does not have.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.model import TERMINAL_STATES
from gridgate.core.plugins import ConfigProblems
from gridgate.core.secrets import SECRET_SCHEMA, SecretError, read_secret
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
    prefix_successor,
)
from gridgate.core.stores.records import (
    group_query,
    groups_of,
    pilot_from_row,
    readable,
    stream_record,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.pq import TransactionStatus
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the 'postgresql' state driver needs psycopg 3: pip install psycopg") from exc

T = TypeVar("T")

#: tries of one unit of work that the server ended as a deadlock (two bulk writes of pilots
#: that met in the counts table): it is whole transactions, so trying again is safe
DEADLOCK_TRIES = 3
#: pilots per INSERT of a bulk write (one transaction for them all)
CHUNK = 5000

PG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Shared state in a PostgreSQL database: several directors, a long history.",
    "properties": {
        "dsn": {
            "type": "string",
            "minLength": 1,
            "default": "postgresql://gridgate@localhost/gridgate",
            "description": "libpq connection string or URL (host, port, dbname, user, sslmode, "
            "...), without the password.",
        },
        "password": {
            **SECRET_SCHEMA,
            "description": "The database password, from {env: VAR} or {file: PATH}; never "
            "inline, and never in the dsn.",
        },
        "schema": {
            "type": "string",
            "pattern": "^[a-z_][a-z0-9_]{0,62}$",
            "default": "gridgate",
            "description": "The PostgreSQL schema holding gridgate's tables (created when "
            "missing), so that several sites can share one database.",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 3600,
            "default": 10,
            "description": "Seconds allowed to connect, for one statement (statement_timeout) "
            "and to wait for a free connection.",
        },
        "max_connections": {
            "type": "integer",
            "minimum": 1,
            "maximum": 100,
            "default": 4,
            "description": "Connections one director keeps at most; more threads wait.",
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

_SCHEMA_NAME = re.compile(PG_SCHEMA["properties"]["schema"]["pattern"])


@dataclass(frozen=True)
class PostgresqlSettings(Settings):
    """The ``state:`` section of the postgresql driver, typed."""

    section_schema: ClassVar[Mapping[str, Any]] = PG_SCHEMA

    dsn: str
    password: Mapping[str, str] | None
    schema: str
    timeout: float
    max_connections: int
    prune_interval: float


def server_name(dsn: str) -> str:
    """``host:port/dbname`` of a DSN, for messages: never its password (nor any other secret
    the DSN carries), whatever form it is written in."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "(an unreadable dsn)"
    host = str(parts.get("host") or parts.get("hostaddr") or "local socket")
    port = parts.get("port")
    db = parts.get("dbname") or parts.get("user") or "(default database)"
    return f"{host}{f':{port}' if port else ''}/{db}"


# ---------------------------------------------------------------------------------------------
# The tables. Every text column is COLLATE "C": keys, endpoints and job ids sort in code-point
# order, as in every other driver, whatever the database's locale. {s} is the schema (checked
# against the schema's pattern, then quoted).

_DDL = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.kv (
    key text COLLATE "C" PRIMARY KEY,
    value text NOT NULL,
    expires double precision
);
CREATE INDEX IF NOT EXISTS kv_expires ON {s}.kv (expires) WHERE expires IS NOT NULL;
CREATE TABLE IF NOT EXISTS {s}.records (
    id bigserial PRIMARY KEY,
    stream text COLLATE "C" NOT NULL,
    time double precision NOT NULL,
    data text NOT NULL
);
CREATE INDEX IF NOT EXISTS records_stream_time ON {s}.records (stream, time, id);
CREATE UNIQUE INDEX IF NOT EXISTS records_once ON {s}.records (stream, time, md5(data));
CREATE TABLE IF NOT EXISTS {s}.pilots (
    backend text COLLATE "C" NOT NULL,
    endpoint text COLLATE "C" NOT NULL,
    job_id text COLLATE "C" NOT NULL,
    grp text COLLATE "C" NOT NULL,
    submitted double precision NOT NULL,
    state text COLLATE "C" NOT NULL,
    changed double precision NOT NULL,
    native text NOT NULL,
    reason text NOT NULL,
    cores integer NOT NULL,
    terminal boolean NOT NULL,
    PRIMARY KEY (backend, endpoint, job_id)
);
CREATE INDEX IF NOT EXISTS pilots_active ON {s}.pilots (backend, endpoint) WHERE NOT terminal;
CREATE INDEX IF NOT EXISTS pilots_finished
    ON {s}.pilots (backend, endpoint, changed, job_id) WHERE terminal;
CREATE INDEX IF NOT EXISTS pilots_age ON {s}.pilots (changed) WHERE terminal;
CREATE INDEX IF NOT EXISTS pilots_waiting
    ON {s}.pilots (backend, endpoint, grp, cores) WHERE state = 'waiting';
CREATE TABLE IF NOT EXISTS {s}.pilot_reservations (
    holder text COLLATE "C" PRIMARY KEY,
    backend text COLLATE "C" NOT NULL,
    endpoint text COLLATE "C" NOT NULL,
    n integer NOT NULL,
    cores integer NOT NULL,
    expires double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.pilot_counts (
    backend text COLLATE "C" NOT NULL,
    endpoint text COLLATE "C" NOT NULL,
    state text COLLATE "C" NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (backend, endpoint, state)
);
"""

# The counts move by one statement per write, in key order: two bulk writes lock the rows of
# pilot_counts in the same order, so they queue instead of deadlocking (and a deadlock the
# server finds anyway is tried again, DEADLOCK_TRIES).
_COUNT_DELTAS = """
INSERT INTO {s}.pilot_counts AS c (backend, endpoint, state, n)
SELECT backend, endpoint, state, sum(n) FROM ({deltas}) AS d
GROUP BY backend, endpoint, state HAVING sum(n) <> 0
ORDER BY backend, endpoint, state
ON CONFLICT (backend, endpoint, state) DO UPDATE SET n = c.n + excluded.n
"""
_TRIGGERS = {
    "insert": ("NEW TABLE AS added", "SELECT backend, endpoint, state, 1 AS n FROM added"),
    "delete": ("OLD TABLE AS removed", "SELECT backend, endpoint, state, -1 AS n FROM removed"),
    "update": (
        "NEW TABLE AS added OLD TABLE AS removed",
        "SELECT backend, endpoint, state, 1 AS n FROM added "
        "UNION ALL SELECT backend, endpoint, state, -1 AS n FROM removed",
    ),
}
_TRIGGER_FUNCTION = """
CREATE OR REPLACE FUNCTION {s}.pilots_counted_{event}() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
{count};
RETURN NULL;
END
$f$
"""
# CREATE OR REPLACE TRIGGER needs PostgreSQL 14; this needs 10 (transition tables)
_TRIGGER = """
DO $d$ BEGIN
IF NOT EXISTS (SELECT 1 FROM pg_trigger
               WHERE tgname = 'pilots_counted_{event}' AND tgrelid = '{s}.pilots'::regclass) THEN
    CREATE TRIGGER pilots_counted_{event} AFTER {event} ON {s}.pilots
        REFERENCING {tables} FOR EACH STATEMENT EXECUTE FUNCTION {s}.pilots_counted_{event}();
END IF;
END $d$
"""


# whether every table and trigger of _DDL is there
_COMPLETE = """
SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = %s
        AND tablename IN ('kv', 'records', 'pilots', 'pilot_counts', 'pilot_reservations')) = 5
   AND (SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(%s)
        AND tgname IN ('pilots_counted_insert', 'pilots_counted_update',
                       'pilots_counted_delete')) = 3
"""


def _ddl(schema: str) -> list[str]:
    s = f'"{schema}"'
    statements = [part.strip() for part in _DDL.format(s=s).split(";") if part.strip()]
    for event, (tables, deltas) in _TRIGGERS.items():
        count = _COUNT_DELTAS.format(s=s, deltas=deltas).strip()
        statements.append(_TRIGGER_FUNCTION.format(s=s, event=event, count=count).strip())
        statements.append(_TRIGGER.format(s=s, event=event, tables=tables).strip())
    return statements


# ---------------------------------------------------------------------------------------------
# Connections


class Connections:
    """At most ``size`` connections made by ``connect``, lent one at a time.

    A connection goes back to the idle list only when it is healthy and outside a transaction;
    one the server or the network broke is closed and the next borrower gets a new one, so a
    restarted server costs one failed call per connection, not a stuck store. A forked child
    never uses its parent's connections (they share the parent's sockets): it starts afresh.
    """

    def __init__(
        self, connect: Callable[[], psycopg.Connection[Any]], size: int, wait: float, where: str
    ) -> None:
        self._connect = connect
        self._size = size
        self._wait = wait
        self._where = where
        self._lock = threading.Lock()
        self._reset()
        self._closed = False
        #: a forked child's copies of its parent's connections: kept, never used or closed
        #: (closing one would end the parent's session on the shared socket)
        self._inherited: list[psycopg.Connection[Any]] = []

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: list[psycopg.Connection[Any]] = []
        self._slots = threading.BoundedSemaphore(self._size)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of this store's own for the block."""
        with self._lock:
            if self._closed:
                raise StateError(f"postgresql state at {self._where}: the store is closed")
            if self._pid != os.getpid():
                self._inherited.extend(self._idle)
                self._reset()
            slots = self._slots
        if not slots.acquire(timeout=self._wait):
            raise StateError(
                f"postgresql state at {self._where}: all {self._size} connections stayed busy "
                f"for {self._wait:g} s (max_connections)"
            )
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
            try:
                yield conn
            finally:
                self._give_back(conn)
        finally:
            slots.release()

    def _give_back(self, conn: psycopg.Connection[Any]) -> None:
        healthy = not conn.closed and not conn.broken
        if healthy and conn.info.transaction_status == TransactionStatus.IDLE:
            with self._lock:
                if not self._closed and self._pid == os.getpid():
                    self._idle.append(conn)
                    return
        _close_quietly(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            mine = self._pid == os.getpid()
        if mine:
            for conn in idle:
                _close_quietly(conn)


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except psycopg.Error:
        pass  # a connection that is gone is closed


# ---------------------------------------------------------------------------------------------
# The store


class PostgresqlState(StateStore):
    """State in tables of one PostgreSQL schema, shared by every director pointed at it."""

    config_schema: ClassVar[dict[str, Any]] = PG_SCHEMA

    def __init__(
        self, config: Mapping[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        super().__init__(config, clock)
        #: the section, typed (defaults from the schema; a store made in code may name less)
        self.settings = settings = settings_from(
            PG_SCHEMA, self.config, PostgresqlSettings, validate=False
        )
        #: where the store is, for messages: host, port and database, never a password
        self.where = server_name(settings.dsn)
        if not _SCHEMA_NAME.fullmatch(settings.schema):
            raise StateError(
                f"postgresql state at {self.where}: schema {settings.schema!r} is not a plain "
                "lower-case name"
            )
        self.schema = settings.schema
        self.prune_interval = settings.prune_interval
        try:
            self._password = read_secret(settings.password)
        except SecretError as exc:
            raise StateError(
                f"postgresql state at {self.where}: cannot read the password: {exc}"
            ) from exc
        self._prune_lock = threading.Lock()
        self._registry_lock = threading.Lock()
        self._last_prune = clock.time()
        self._pool = Connections(
            self._connect, settings.max_connections, settings.timeout, self.where
        )
        s = self._s = f'"{self.schema}"'
        self._sql_add = (
            f"INSERT INTO {s}.kv AS kv (key, value, expires) VALUES (%s, %s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires = excluded.expires "
            "WHERE kv.expires IS NOT NULL AND kv.expires <= %s"
        )
        self._sql_set = (
            f"INSERT INTO {s}.kv AS kv (key, value, expires) VALUES (%s, %s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires = excluded.expires"
        )
        try:
            self.run("create its tables", self._create)
        except StateError:
            self._pool.close()  # the connection that found the error, if any
            raise

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> ConfigProblems:
        """A password written into the dsn would sit in the config file and in messages."""
        dsn = settings_from(PG_SCHEMA, section, PostgresqlSettings, validate=False).dsn
        try:
            parts = conninfo_to_dict(dsn)
        except psycopg.Error:
            return [(("dsn",), "not a libpq connection string or URL")]
        if parts.get("password"):
            return [
                (
                    ("dsn",),
                    "do not write the password into the dsn; give it as "
                    "password: {env: VARIABLE} or password: {file: PATH}",
                )
            ]
        return []

    # --- connections -------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        timeout = self.settings.timeout
        extra: dict[str, Any] = {}
        if self._password is not None:
            extra["password"] = self._password
        try:
            options = str(conninfo_to_dict(self.settings.dsn).get("options") or "")
            # the statement limit travels with the login: no extra round trip per connection
            options = f"{options} -c statement_timeout={max(1, round(timeout * 1000))}".strip()
            return psycopg.connect(
                self.settings.dsn,
                autocommit=True,
                # libpq counts whole seconds, and treats less than 2 as 2
                connect_timeout=max(2, math.ceil(timeout)),
                options=options,
                application_name="gridgate",
                **extra,
            )
        except psycopg.Error as exc:
            raise StateError(
                f"postgresql state at {self.where}: cannot connect: {_reason(exc)}"
            ) from exc

    def run(self, what: str, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``work(connection)`` on a connection of this store; a server error raised as
        :class:`StateError` saying that this store cannot ``what`` (and never the password).

        ``work`` is one statement or one transaction of its own (``conn.transaction()``), so
        that a deadlock the server broke can be tried again whole."""
        for attempt in range(1, DEADLOCK_TRIES + 1):
            try:
                with self._pool.connection() as conn:
                    return work(conn)
            except pg_errors.DeadlockDetected as exc:
                if attempt == DEADLOCK_TRIES:
                    raise StateError(
                        f"postgresql state at {self.where}: cannot {what}: {_reason(exc)}"
                    ) from exc
            except psycopg.Error as exc:
                raise StateError(
                    f"postgresql state at {self.where}: cannot {what}: {_reason(exc)}"
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _create(self, conn: psycopg.Connection[Any]) -> None:
        # Tables there already: nothing is written, so a store opens on a read-only database
        # (a standby, a database put read-only) and reads go on.
        complete = conn.execute(_COMPLETE, (self.schema, f"{self._s}.pilots")).fetchone()
        if complete and complete[0]:
            return
        with conn.transaction():
            # Two directors starting at once must not both create: CREATE ... IF NOT EXISTS
            # is not safe against itself (a duplicate key in the catalog).
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"gridgate:{self.schema}",))
            for statement in _ddl(self.schema):
                conn.execute(statement)

    def _execute(self, what: str, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; its row count."""
        return self.run(what, lambda conn: conn.execute(sql, params).rowcount)

    def _fetch(self, what: str, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one statement."""
        return self.run(what, lambda conn: conn.execute(sql, params).fetchall())

    def _maybe_prune(self, now: float) -> None:
        with self._prune_lock:
            if now - self._last_prune < self.prune_interval:
                return
            self._last_prune = now
        self._execute(
            "prune", f"DELETE FROM {self._s}.kv WHERE expires IS NOT NULL AND expires <= %s", (now,)
        )

    # --- keys --------------------------------------------------------------------------------

    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        now = self.clock.time()
        self._maybe_prune(now)
        return self._execute("write", self._sql_add, (key, value, expires, now)) == 1

    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        self._maybe_prune(self.clock.time())
        self._execute("write", self._sql_set, (key, value, expires))

    def get(self, key: str) -> str | None:
        rows = self._fetch(
            "read",
            f"SELECT value FROM {self._s}.kv WHERE key = %s AND {_LIVE}",
            (key, self.clock.time()),
        )
        return str(rows[0][0]) if rows else None

    def increment(self, key: str, by: int = 1) -> int:
        check_key(key)
        s = self._s

        def count(conn: psycopg.Connection[Any]) -> int:
            with conn.transaction():
                # the row exists before it is locked, so two processes that find the key
                # absent queue on the same row instead of both counting from 0
                conn.execute(
                    f"INSERT INTO {s}.kv (key, value, expires) VALUES (%s, '0', NULL) "
                    "ON CONFLICT (key) DO NOTHING",
                    (key,),
                )
                value, expires = conn.execute(
                    f"SELECT value, expires FROM {s}.kv WHERE key = %s FOR UPDATE", (key,)
                ).fetchone() or ("0", None)
                live = expires is None or expires > self.clock.time()
                total = parse_count(key, value if live else None) + int(by)
                conn.execute(
                    f"UPDATE {s}.kv SET value = %s, expires = NULL WHERE key = %s",
                    (str(total), key),
                )
            return total

        return self.run("count", count)

    def delete(self, key: str) -> bool:
        rows = self._fetch(
            "delete", f"DELETE FROM {self._s}.kv WHERE key = %s RETURNING expires", (key,)
        )
        now = self.clock.time()
        return any(exp is None or exp > now for (exp,) in rows)

    def renew(self, key: str, value: str, ttl: float | None) -> bool:
        expires = expires_at(self.clock, ttl)
        sql = f"UPDATE {self._s}.kv SET expires = %s WHERE key = %s AND value = %s AND {_LIVE}"
        return self._execute("renew", sql, (expires, key, value, self.clock.time())) == 1

    def delete_if(self, key: str, value: str) -> bool:
        sql = f"DELETE FROM {self._s}.kv WHERE key = %s AND value = %s AND {_LIVE}"
        return self._execute("release", sql, (key, value, self.clock.time())) == 1

    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        upper = prefix_successor(prefix)
        sql = f"SELECT key, value FROM {self._s}.kv WHERE key >= %s AND {_LIVE}"
        params: list[Any] = [prefix, self.clock.time()]
        if upper is not None:
            sql += " AND key < %s"
            params.append(upper)
        rows = self._fetch("list", sql + " ORDER BY key", params)
        return [(str(k), str(v)) for k, v in rows]

    def ttl(self, key: str) -> float | None:
        now = self.clock.time()
        rows = self._fetch(
            "read", f"SELECT expires FROM {self._s}.kv WHERE key = %s AND {_LIVE}", (key, now)
        )
        if not rows or rows[0][0] is None:
            return None
        return float(rows[0][0]) - now

    # --- records -----------------------------------------------------------------------------

    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        check_key(stream)
        when, text = encode_record(record)
        # the unique index records_once makes a retried append one row, even when two
        # processes append the same record at once
        self._execute(
            "append",
            f"INSERT INTO {self._s}.records (stream, time, data) VALUES (%s, %s, %s) "
            "ON CONFLICT (stream, time, md5(data)) DO NOTHING",
            (stream, when, text),
        )

    def prune_records(self, stream: str, before: float) -> int:
        gone = self._execute(
            "prune records",
            f"DELETE FROM {self._s}.records WHERE stream = %s AND time < %s",
            (stream, float(before)),
        )
        return max(0, gone)

    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        rows = self._fetch(
            "read records",
            f"SELECT data FROM {self._s}.records WHERE stream = %s AND time >= %s "
            "ORDER BY time, id",
            (stream, float(since)),
        )
        return readable((text for (text,) in rows), stream_record, f"state records {stream}")

    def record_groups(
        self, stream: str, fields: Sequence[str], bucket: float, since: float = 0.0
    ) -> list[RecordGroup]:
        # Grouped by each field's JSON value (jsonb, so 5 and "5" stay apart and the caller's
        # typed reading sees what was written; null and absent alike). A row whose text is
        # not JSON fails the cast: the stream is grouped in Python, which skips and logs it.
        sql = group_query(
            f"(SELECT time, data::jsonb AS d FROM {self._s}.records "
            "WHERE stream = %s AND time >= %s) AS r",
            "nullif(d -> %s::text, 'null'::jsonb)::text",
            "floor(time / %s)",
            fields,
        )
        params = (*fields, stream, float(since), check_bucket(bucket))

        def group(conn: psycopg.Connection[Any]) -> list[Any] | None:
            try:
                return conn.execute(sql, params).fetchall()
            except pg_errors.InvalidTextRepresentation:
                return None

        rows = self.run("group records", group)
        if rows is None:
            return group_records(self.records(stream, since), fields, bucket)
        return groups_of(rows, fields)

    # --- the rest ----------------------------------------------------------------------------

    def pilot_registry(self) -> PilotRegistry:
        """The ``pilots`` table of this schema."""
        with self._registry_lock:
            registry = self._pilot_registry
            if registry is None:
                registry = self._pilot_registry = PostgresqlPilots(self)
            return registry

    def close(self) -> None:
        self._pool.close()


_LIVE = "(expires IS NULL OR expires > %s)"


def _reason(exc: psycopg.Error) -> str:
    """The server's or libpq's own words for ``exc`` on one line (libpq's never hold the
    password), with the SQLSTATE when the server sent one."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    code = getattr(exc, "sqlstate", None)
    return f"{text} (SQLSTATE {code})" if code else text


# ---------------------------------------------------------------------------------------------
# The pilot registry

_COLUMNS = "job_id, backend, endpoint, grp, submitted, state, changed, native, reason, cores"
_UNNEST = (
    "%s::text[], %s::text[], %s::text[], %s::text[], %s::float8[], %s::text[], %s::float8[], "
    "%s::text[], %s::text[], %s::int4[], %s::bool[]"
)


def _pilots(rows: Iterable[Sequence[Any]]) -> list[Pilot]:
    return readable(rows, pilot_from_row, "pilot registry (postgresql)")


class PostgresqlPilots(PilotRegistry):
    """The ``pilots`` table of a :class:`PostgresqlState` schema, on its connections (so its
    errors are the store's :class:`StateError`). A bulk write is one transaction of a few
    ``INSERT ... SELECT FROM unnest(...)`` statements, each firing the counting triggers once."""

    def __init__(self, store: PostgresqlState) -> None:
        self.store = store
        s = self._s = store._s
        self._upsert = (
            f"INSERT INTO {s}.pilots AS p ({_COLUMNS}, terminal) "
            f"SELECT * FROM unnest({_UNNEST}) "
            "ORDER BY 2, 3, 1 "
            "ON CONFLICT (backend, endpoint, job_id) DO UPDATE SET "
            "grp = excluded.grp, submitted = excluded.submitted, state = excluded.state, "
            "changed = excluded.changed, native = excluded.native, reason = excluded.reason, "
            "cores = excluded.cores, terminal = excluded.terminal"
        )

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.store._fetch("read pilots", sql, params)

    def put(self, pilots: Iterable[Pilot]) -> None:
        self._write(pilots, "")

    def _write(self, pilots: Iterable[Pilot], holder: str) -> None:
        """Upsert ``pilots`` and, with a ``holder``, settle its reservation in the same
        transaction."""
        # one row per pilot (the last given wins, as in the other drivers): one INSERT may not
        # touch a row twice; in key order, so two writers lock rows in the same order
        latest = {(p.backend, p.endpoint, p.job_id): p for p in pilots}
        rows = [latest[k] for k in sorted(latest)]
        if not rows and not holder:
            return

        def write(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                for start in range(0, len(rows), CHUNK):
                    conn.execute(self._upsert, _columns(rows[start : start + CHUNK]))
                if holder:
                    conn.execute(
                        f"DELETE FROM {self._s}.pilot_reservations WHERE holder = %s", (holder,)
                    )

        self.store.run("write pilots", write)

    def active(self, backend: str, endpoint: str) -> list[Pilot]:
        return _pilots(
            self._read(
                f"SELECT {_COLUMNS} FROM {self._s}.pilots "
                "WHERE backend = %s AND endpoint = %s AND NOT terminal "
                "ORDER BY submitted, job_id",
                (backend, endpoint),
            )
        )

    def live_states(self, backend: str, endpoint: str) -> LiveStates:
        # three columns of the live rows, found through the partial index pilots_active
        # (never the kept history) and sorted by the server: no Pilot built, no sort here
        rows = self._read(
            f"SELECT job_id, state, submitted FROM {self._s}.pilots "
            "WHERE backend = %s AND endpoint = %s AND NOT terminal ORDER BY submitted, job_id",
            (backend, endpoint),
        )
        return LiveStates({j: s for j, s, _t in rows}, {j: t for j, _s, t in rows})

    def get_many(self, backend: str, endpoint: str, job_ids: Iterable[str]) -> list[Pilot]:
        wanted = list(dict.fromkeys(job_ids))
        if not wanted:
            return []
        # one statement however many: the ids travel as one array parameter
        rows = self._read(
            f"SELECT {_COLUMNS} FROM {self._s}.pilots "
            "WHERE backend = %s AND endpoint = %s AND job_id = ANY(%s::text[])",
            (backend, endpoint, wanted),
        )
        found = {p.job_id: p for p in _pilots(rows)}
        return [found[job] for job in wanted if job in found]

    def counts(self) -> Counts:
        rows = self._read(
            f"SELECT backend, endpoint, state, n FROM {self._s}.pilot_counts WHERE n > 0"
        )
        return {(b, e, s): int(n) for b, e, s, n in rows}

    def waiting(self) -> Waiting:
        rows = self._read(
            f"SELECT backend, endpoint, grp, count(*), sum(cores) FROM {self._s}.pilots "
            "WHERE state = 'waiting' GROUP BY backend, endpoint, grp"
        )
        return {(b, e, g): (int(n), int(c)) for b, e, g, n, c in rows}

    def last_finished(self, backend: str, endpoint: str, n: int, after: float = 0.0) -> list[Pilot]:
        return _pilots(
            self._read(
                f"SELECT {_COLUMNS} FROM {self._s}.pilots WHERE backend = %s AND endpoint = %s "
                "AND terminal AND changed > %s ORDER BY changed DESC, job_id DESC LIMIT %s",
                (backend, endpoint, float(after), int(n)),
            )
        )

    def query(
        self,
        backend: str | None = None,
        endpoint: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Pilot]:
        where: list[str] = ["true"]
        params: list[Any] = []
        if backend is not None:
            where.append("backend = %s")
            params.append(backend)
        if endpoint is not None:
            where.append("endpoint = %s")
            params.append(endpoint)
        if states:
            where.append("state = ANY(%s::text[])")
            params.append(list(states))
        sql = (
            f"SELECT {_COLUMNS} FROM {self._s}.pilots WHERE {' AND '.join(where)} "
            "ORDER BY backend, endpoint, submitted, job_id"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return _pilots(self._read(sql, params))

    def get(self, backend: str, endpoint: str, job_id: str) -> Pilot | None:
        found = _pilots(
            self._read(
                f"SELECT {_COLUMNS} FROM {self._s}.pilots "
                "WHERE backend = %s AND endpoint = %s AND job_id = %s",
                (backend, endpoint, job_id),
            )
        )
        return found[0] if found else None

    def finished_per_slot(self, bucket: float, since: float = 0.0) -> list[FinishedSlot]:
        rows = self._read(
            f"SELECT min(changed), state, count(*) FROM {self._s}.pilots "
            "WHERE terminal AND changed >= %s GROUP BY floor(changed / %s), state "
            "ORDER BY 1, 2",
            (float(since), check_bucket(bucket)),
        )
        return [FinishedSlot(float(c), str(s), int(n)) for c, s, n in rows]

    def prune(self, before: float) -> int:
        return max(
            0,
            self.store._execute(
                "prune pilots",
                f"DELETE FROM {self._s}.pilots WHERE terminal AND changed < %s",
                (float(before),),
            ),
        )

    def reserve(self, claim: RoomClaim, now: float) -> int:
        s, b, e = self._s, claim.backend, claim.endpoint
        terminal = sorted(TERMINAL_STATES)
        # one statement, one snapshot, taken after the lock: under READ COMMITTED a later
        # statement would see another director's commit that an earlier one did not
        counted = (
            f"SELECT (SELECT count(*) FROM {s}.pilots WHERE state = 'waiting' "
            "AND backend = %(b)s AND endpoint = %(e)s), "
            f"(SELECT coalesce(sum(cores), 0) FROM {s}.pilots WHERE state = 'waiting' "
            "AND backend = %(b)s AND endpoint = %(e)s), "
            f"(SELECT coalesce(sum(n), 0) FROM {s}.pilot_counts WHERE backend = %(b)s "
            "AND state <> ALL(%(t)s)), "
            f"(SELECT coalesce(sum(n), 0) FROM {s}.pilot_reservations WHERE holder <> %(h)s "
            "AND backend = %(b)s AND endpoint = %(e)s AND expires > %(now)s), "
            f"(SELECT coalesce(sum(cores), 0) FROM {s}.pilot_reservations WHERE holder <> %(h)s "
            "AND backend = %(b)s AND endpoint = %(e)s AND expires > %(now)s), "
            f"(SELECT coalesce(sum(n), 0) FROM {s}.pilot_reservations WHERE holder <> %(h)s "
            "AND backend = %(b)s AND expires > %(now)s)"
        )
        params = {"b": b, "e": e, "t": terminal, "h": claim.holder, "now": float(now)}

        def take(conn: psycopg.Connection[Any]) -> int:
            with conn.transaction():
                # one reserver of a backend at a time, of every director on this schema
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{s}:room:{b}",))
                conn.execute(
                    f"DELETE FROM {s}.pilot_reservations WHERE backend = %s AND expires <= %s",
                    (b, float(now)),
                )
                row = conn.execute(counted, params).fetchone()
                assert row is not None
                waiting, cores, active, here_n, here_cores, on_backend = (int(v) for v in row)
                granted = claim.room(waiting, cores, active, (here_n, here_cores), on_backend)
                if granted > 0:
                    conn.execute(
                        f"INSERT INTO {s}.pilot_reservations VALUES (%s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT (holder) DO UPDATE SET n = excluded.n, "
                        "cores = excluded.cores, expires = excluded.expires",
                        (claim.holder, b, e, granted, granted * claim.cores, claim.expires),
                    )
                return granted

        return self.store.run("reserve room", take)

    def settle(self, holder: str) -> None:
        self.store._execute(
            "settle room", f"DELETE FROM {self._s}.pilot_reservations WHERE holder = %s", (holder,)
        )

    def put_reserved(self, pilots: Iterable[Pilot], holder: str) -> None:
        self._write(pilots, holder)


def _columns(pilots: Sequence[Pilot]) -> list[list[Any]]:
    """The pilots as the columns ``unnest`` takes, in the order of :data:`_COLUMNS`."""
    return [
        [p.job_id for p in pilots],
        [p.backend for p in pilots],
        [p.endpoint for p in pilots],
        [p.group for p in pilots],
        [float(p.submitted) for p in pilots],
        [p.state for p in pilots],
        [float(p.changed) for p in pilots],
        [p.native for p in pilots],
        [p.reason for p in pilots],
        [p.cores for p in pilots],
        [p.terminal for p in pilots],
    ]
