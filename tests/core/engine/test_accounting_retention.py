"""Accounting rows are kept ``director.keep_accounting`` seconds, then pruned by every state
driver: with Redis they lived in memory for ever (issue 21, item 17)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from support.director import ScriptedBackend, config

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.engine.resilient import ResilientState
from gridgate.core.engine.runtime import ACCOUNTING
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState

DAY = 86400.0


def _store(kind: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest):
    if kind == "memory":
        return MemoryState(clock=clock)
    if kind == "sqlite":
        return SqliteState({"path": str(tmp_path / "state.db")}, clock=clock)
    server = request.getfixturevalue("redis_server")
    return RedisState({"url": server.url, "prefix": f"acct-{uuid.uuid4().hex[:8]}:"}, clock=clock)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
def test_prune_records_drops_the_rows_older_than_the_cut(kind, tmp_path, request) -> None:
    clock = FakeClock(1_000_000.0)
    store = _store(kind, tmp_path, clock, request)
    for hour in range(10):
        store.append_record(ACCOUNTING, {"time": 1_000_000.0 + hour * 3600, "n": hour})
    store.append_record("other", {"time": 1_000_000.0, "n": -1})
    assert store.prune_records(ACCOUNTING, before=1_000_000.0 + 4 * 3600) == 4
    assert [r["n"] for r in store.records(ACCOUNTING)] == [4, 5, 6, 7, 8, 9]
    assert [r["n"] for r in store.records("other")] == [-1]  # another stream is left alone
    assert store.prune_records(ACCOUNTING, before=1_000_000.0 + 4 * 3600) == 0
    store.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
def test_the_director_prunes_accounting_rows_past_keep_accounting(kind, tmp_path, request) -> None:
    clock = FakeClock(1_000_000.0)
    store = _store(kind, tmp_path, clock, request)
    director = Director(
        config(servers=2, pilots=2, keep_accounting=2 * DAY),
        clock=clock,
        extra_plugins=[ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})],
        state=store,
    )
    director.run_iteration()
    first = len(store.records(ACCOUNTING))
    assert first == 2
    clock.advance(DAY)
    director.run_iteration()
    assert len(store.records(ACCOUNTING)) == 4  # a day old: kept
    clock.advance(1.5 * DAY)
    director.run_iteration()
    rows = store.records(ACCOUNTING)
    assert len(rows) == 4 and min(r["time"] for r in rows) >= clock.time() - 2 * DAY
    director.close()


def test_the_resilient_wrapper_prunes_the_store_it_wraps() -> None:
    clock = FakeClock(1_000_000.0)
    local = ResilientState(MemoryState(clock=clock), clock=clock)
    local.append_record(ACCOUNTING, {"time": 1_000_000.0})
    local.append_record(ACCOUNTING, {"time": 1_000_000.0 + DAY})
    assert local.prune_records(ACCOUNTING, before=1_000_000.0 + 1) == 1
    assert len(local.records(ACCOUNTING)) == 1


def test_keep_accounting_defaults_to_a_finite_retention() -> None:
    assert 0 < float(config().director["keep_accounting"]) < float("inf")
