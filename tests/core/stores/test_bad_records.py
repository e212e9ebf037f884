"""A record the store holds that no director wrote (a hand edit, an older release's row, a
value cut short) is that record's problem: each read skips it, says so in the log, and gives
the others (gridgate.core.stores.records)."""

from __future__ import annotations

import uuid

import pytest
from loguru import logger

from gridgate.core.clock import FakeClock
from gridgate.core.documents import DocumentError
from gridgate.core.state import Pilot
from gridgate.core.stores.postgresql import PostgresqlState
from gridgate.core.stores.records import pilot_from_json, pilot_from_row, stream_record
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState


def _pilots() -> list[Pilot]:
    return [
        Pilot("j1", "b", "e1", submitted=1.0, changed=1.0),
        Pilot("j2", "b", "e1", submitted=2.0, changed=2.0),
    ]


@pytest.fixture
def logged():
    lines: list[str] = []
    sink = logger.add(lines.append, level="ERROR", format="{message}")
    yield lines
    logger.remove(sink)


def _check(store, logged: list[str]) -> None:
    registry = store.pilot_registry()
    assert [p.job_id for p in registry.active("b", "e1")] == ["j2"]
    assert [p.job_id for p in registry.query("b", "e1")] == ["j2"]
    assert [p.job_id for p in registry.query()] == ["j2"]
    assert registry.get("b", "e1", "j1") is None
    assert [r["n"] for r in store.records("s")] == [2]
    assert any("unreadable record(s) skipped" in line for line in logged)


def test_sqlite_skips_a_bad_pilot_row_and_a_bad_record(tmp_path, logged) -> None:
    store = SqliteState({"path": str(tmp_path / "state.db")}, clock=FakeClock())
    store.pilot_registry().put(_pilots())
    store.append_record("s", {"time": 1.0, "n": 1})
    store.append_record("s", {"time": 2.0, "n": 2})
    store._conn.execute("UPDATE pilots SET state = 'bogus' WHERE job_id = 'j1'")
    store._conn.execute("UPDATE records SET data = '{\"n\": 1' WHERE time = 1.0")
    _check(store, logged)
    store.close()


def test_redis_skips_a_bad_pilot_value_and_a_bad_record(redis_server, logged) -> None:
    prefix = f"test-{uuid.uuid4().hex}:"
    store = RedisState({"url": redis_server.url, "prefix": prefix}, clock=FakeClock())
    store.pilot_registry().put(_pilots())
    store.append_record("s", {"time": 1.0, "n": 1})
    store.append_record("s", {"time": 2.0, "n": 2})
    raw = store.client  # answers in str
    field = next(f for f in raw.hkeys(f"{prefix}pilots:row") if f.endswith("j1"))
    raw.hset(f"{prefix}pilots:row", field, '{"job_id": "j1", "backend": "b"}')
    member = next(m for m in raw.zrange(f"{prefix}rec:s", 0, -1) if '"n": 1' in m)
    raw.zrem(f"{prefix}rec:s", member)
    raw.zadd(f"{prefix}rec:s", {member.replace('"time": 1.0', '"time": "soon"'): 1.0})
    _check(store, logged)
    store.close()


def test_postgresql_skips_a_bad_pilot_row_and_a_bad_record(
    postgres_server, logged, monkeypatch
) -> None:
    schema = f"t_{uuid.uuid4().hex}"
    monkeypatch.setenv("GG_TEST_PG_PW", postgres_server.password)
    section = {"dsn": postgres_server.dsn, "password": {"env": "GG_TEST_PG_PW"}, "schema": schema}
    store = PostgresqlState(section, clock=FakeClock())
    store.pilot_registry().put(_pilots())
    store.append_record("s", {"time": 1.0, "n": 1})
    store.append_record("s", {"time": 2.0, "n": 2})
    with postgres_server.connect() as raw:
        raw.execute(f"UPDATE {schema}.pilots SET state = 'bogus' WHERE job_id = 'j1'")
        raw.execute(f"UPDATE {schema}.records SET data = '{{\"n\": 1' WHERE time = 1.0")
    _check(store, logged)
    store.close()


def test_each_decoder_refuses_what_is_no_such_record() -> None:
    good = Pilot("j", "b", "e")
    assert pilot_from_row(("j", "b", "e", "default", 0.0, "waiting", 0.0, "", "", 1)) == good
    assert pilot_from_json('{"job_id": "j", "backend": "b", "endpoint": "e"}') == good
    for bad in ('{"job_id": "", "backend": "b", "endpoint": "e"}', "[]", '{"job_id": "j"}'):
        with pytest.raises(DocumentError):
            pilot_from_json(bad)
    with pytest.raises(DocumentError):
        pilot_from_row(("j", "b", "e", "default", 0.0, "waiting", 0.0, "", "", 0))
    with pytest.raises(DocumentError):
        pilot_from_row(("j", "b", "e"))
    assert stream_record('{"time": 3, "x": [1]}') == {"time": 3, "x": [1]}
    for bad in ('{"x": 1}', '{"time": "3"}', "[1]", "{"):
        with pytest.raises(DocumentError):
            stream_record(bad)
