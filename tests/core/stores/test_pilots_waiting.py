"""The registry's waiting pilots by group with their cores (issue 23), on every driver (memory,
a real sqlite file, a real redis-server, a real PostgreSQL cluster), and the migration of a sqlite file made before
pilots had cores."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridgate.core.clock import FakeClock
from gridgate.core.state import Pilot, StateStore
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.postgresql import PostgresqlState
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState

#: the pilots table and its triggers as API 1.2 wrote them: no cores column
OLD_SCHEMA = """
CREATE TABLE pilots (
    backend TEXT NOT NULL, endpoint TEXT NOT NULL, job_id TEXT NOT NULL, grp TEXT NOT NULL,
    submitted REAL NOT NULL, state TEXT NOT NULL, changed REAL NOT NULL, native TEXT NOT NULL,
    reason TEXT NOT NULL, terminal INTEGER NOT NULL, PRIMARY KEY (backend, endpoint, job_id)
) WITHOUT ROWID;
CREATE TABLE pilot_counts (
    backend TEXT NOT NULL, endpoint TEXT NOT NULL, state TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (backend, endpoint, state)
) WITHOUT ROWID;
CREATE TRIGGER pilots_counted_in AFTER INSERT ON pilots BEGIN
    INSERT INTO pilot_counts VALUES (NEW.backend, NEW.endpoint, NEW.state, 1)
        ON CONFLICT (backend, endpoint, state) DO UPDATE SET n = n + 1;
END;
"""


@pytest.fixture(params=["memory", "sqlite", "redis", "postgresql"])
def store(request, tmp_path: Path, monkeypatch) -> Iterator[StateStore]:
    clock = FakeClock()
    if request.param == "memory":
        made: StateStore = MemoryState({}, clock=clock)
    elif request.param == "sqlite":
        made = SqliteState({"path": str(tmp_path / "state.db")}, clock=clock)
    elif request.param == "redis":
        server = request.getfixturevalue("redis_server")
        made = RedisState({"url": server.url, "prefix": f"t-{uuid.uuid4().hex}:"}, clock=clock)
    else:
        cluster = request.getfixturevalue("postgres_server")
        monkeypatch.setenv("GG_TEST_PG_PW", cluster.password)
        section = {
            "dsn": cluster.dsn,
            "password": {"env": "GG_TEST_PG_PW"},
            "schema": f"t_{uuid.uuid4().hex}",
        }
        made = PostgresqlState(section, clock=clock)
    yield made
    made.close()


def _p(job: str, endpoint: str = "e1", group: str = "mc", cores: int = 1, **kw) -> Pilot:
    return Pilot(job, "b", endpoint, group, cores=cores, **kw)


def test_waiting_counts_pilots_and_cores_by_group_and_follows_state_changes(store) -> None:
    reg = store.pilot_registry()
    reg.put(
        [
            _p("j1", cores=8),
            _p("j2", cores=8),
            _p("j3", group="ana", cores=2),
            _p("j4", endpoint="e2", cores=4),
            _p("j5", state="running", cores=8),
            _p("j6", state="done", cores=8, changed=5),
        ]
    )
    assert reg.waiting() == {
        ("b", "e1", "mc"): (2, 16),
        ("b", "e1", "ana"): (1, 2),
        ("b", "e2", "mc"): (1, 4),
    }
    assert reg.get("b", "e1", "j1").cores == 8  # stored and read back
    # j1 starts, j3 ends, j4 is put again unchanged (no double count)
    reg.put([_p("j1", cores=8, state="running"), _p("j3", group="ana", cores=2, state="failed")])
    reg.put([_p("j4", endpoint="e2", cores=4)])
    assert reg.waiting() == {("b", "e1", "mc"): (1, 8), ("b", "e2", "mc"): (1, 4)}
    reg.put([_p("j2", cores=8, state="cancelled"), _p("j4", endpoint="e2", state="lost")])
    assert reg.waiting() == {}


def test_a_pilot_has_at_least_one_core() -> None:
    assert Pilot("j", "b", "e").cores == 1
    for bad in (0, -2, True, 1.5):
        with pytest.raises(ValueError, match="cores"):
            Pilot("j", "b", "e", cores=bad)  # type: ignore[arg-type]


def test_a_sqlite_file_from_before_cores_opens_migrated(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    conn.execute(
        "INSERT INTO pilots VALUES ('b', 'e1', 'old1', 'mc', 1.0, 'waiting', 1.0, 'PD', '', 0)"
    )
    conn.execute(
        "INSERT INTO pilots VALUES ('b', 'e1', 'old2', 'mc', 1.0, 'done', 2.0, 'CD', '', 1)"
    )
    conn.commit()
    conn.close()
    store = SqliteState({"path": str(path)}, clock=FakeClock())
    try:
        reg = store.pilot_registry()
        assert reg.get("b", "e1", "old1") == Pilot(
            "old1", "b", "e1", "mc", 1.0, "waiting", 1.0, "PD"
        )
        assert reg.waiting() == {("b", "e1", "mc"): (1, 1)}  # an old pilot is one core
        reg.put([_p("new", cores=4)])
        assert reg.waiting() == {("b", "e1", "mc"): (2, 5)}
        assert reg.counts()[("b", "e1", "waiting")] == 2
    finally:
        store.close()
    again = SqliteState({"path": str(path)}, clock=FakeClock())  # migrated once, opens again
    try:
        assert again.pilot_registry().get("b", "e1", "new").cores == 4
    finally:
        again.close()


def test_a_redis_store_from_before_the_waiting_counters_builds_them(redis_server) -> None:
    prefix = f"t-{uuid.uuid4().hex}:"
    store = RedisState({"url": redis_server.url, "prefix": prefix}, clock=FakeClock())
    try:
        reg = store.pilot_registry()
        reg.put([_p("j1", cores=8), _p("j2", group="ana")])
        client = redis_server.client()
        # as a store written before the counters: rows without cores, no counters, no marker
        client.delete(f"{prefix}pilots:waiting", f"{prefix}pilots:waiting-cores")
        client.delete(f"{prefix}pilots:waiting-kept")
        client.hset(
            f"{prefix}pilots:row",
            "b\x1fe1\x1fj2",
            '{"job_id": "j2", "backend": "b", "endpoint": "e1", "group": "ana", '
            '"submitted": 0.0, "state": "waiting", "changed": 0.0, "native": "", "reason": ""}',
        )
        assert reg.waiting() == {("b", "e1", "mc"): (1, 8), ("b", "e1", "ana"): (1, 1)}
        assert reg.get("b", "e1", "j2").cores == 1
        reg.put([_p("j1", cores=8, state="running")])
        assert reg.waiting() == {("b", "e1", "ana"): (1, 1)}
    finally:
        store.close()
