"""The StateStore contract, written once and run against every driver (memory, sqlite, redis,
postgresql).

The sqlite, redis and postgresql drivers run against real storage: a file under tmp_path, a real
redis-server started by the ``redis_server`` fixture and a real PostgreSQL cluster started by the
``postgres_server`` fixture (each test in a schema of its own). Expiry is driven by a FakeClock.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import stat
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gridgate.core.clock import FakeClock
from gridgate.core.state import (
    LiveStates,
    MemoryPilots,
    Pilot,
    PilotRegistry,
    RoomClaim,
    StateError,
    StateStore,
    prefix_successor,
)
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.postgresql import PostgresqlState
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState

DRIVERS = ["memory", "sqlite", "redis", "postgresql"]
SHARED = ["sqlite", "redis", "postgresql"]  # drivers whose data outlives one instance

Factory = Callable[[FakeClock], StateStore]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def factory(request, tmp_path) -> Factory:
    """Makes instances of the driver under test that all see the same data (except memory,
    whose every instance is separate); closes them at the end of the test."""
    kind = request.param
    made: list[StateStore] = []
    if kind == "memory":

        def make(clock: FakeClock) -> StateStore:
            return MemoryState({}, clock=clock)
    elif kind == "sqlite":
        path = tmp_path / "state" / "state.db"

        def make(clock: FakeClock) -> StateStore:
            return SqliteState({"path": str(path)}, clock=clock)
    elif kind == "redis":
        server = request.getfixturevalue("redis_server")
        prefix = f"test-{uuid.uuid4().hex}:"

        def make(clock: FakeClock) -> StateStore:
            return RedisState({"url": server.url, "prefix": prefix}, clock=clock)
    else:
        config = pg_config(request.getfixturevalue("postgres_server"), tmp_path)

        def make(clock: FakeClock) -> StateStore:
            return PostgresqlState(config, clock=clock)

    def tracked(clock: FakeClock) -> StateStore:
        store = make(clock)
        made.append(store)
        return store

    tracked.kind = kind  # type: ignore[attr-defined]
    yield tracked
    for store in made:
        store.close()


def pg_config(server, folder: Path) -> dict:
    """A postgresql store's section on ``server`` in a schema of its own (a fresh one for
    each call), its password in a private file under ``folder``."""
    secret = folder / f"pg-{uuid.uuid4().hex}.pw"
    secret.write_text(server.password + "\n")
    secret.chmod(0o600)
    return {
        "dsn": server.dsn,
        "password": {"file": str(secret)},
        "schema": f"t_{uuid.uuid4().hex}",
    }


def drivers(names):
    return pytest.mark.parametrize("factory", names, indirect=True)


@pytest.fixture
def store(factory, clock) -> StateStore:
    return factory(clock)


# --------------------------------------------------------------------------- add_if_absent


@drivers(DRIVERS)
def test_add_if_absent_only_first_wins(store):
    assert store.add_if_absent("k", "first", ttl=60) is True
    assert store.add_if_absent("k", "second", ttl=60) is False
    assert store.add_if_absent("k", "third") is False
    assert store.get("k") == "first"


@drivers(DRIVERS)
def test_add_if_absent_without_ttl_never_expires(store, clock):
    assert store.add_if_absent("k", "v") is True
    clock.advance(10 * 365 * 86400)
    assert store.get("k") == "v"
    assert store.ttl("k") is None
    assert store.add_if_absent("k", "w") is False


@drivers(DRIVERS)
def test_fifty_threads_race_one_wins(factory, clock):
    # Each thread has its own instance where the driver allows it (own connection), and all
    # start together at the barrier.
    stores = [factory(clock) for _ in range(50)] if factory.kind != "memory" else None
    shared = factory(clock) if stores is None else None
    barrier = threading.Barrier(50)

    def contend(i: int) -> bool:
        s = stores[i] if stores is not None else shared
        barrier.wait()
        return s.add_if_absent("race", f"thread-{i}", ttl=300)

    with ThreadPoolExecutor(max_workers=50) as pool:
        wins = list(pool.map(contend, range(50)))
    assert wins.count(True) == 1
    winner = wins.index(True)
    reader = stores[0] if stores is not None else shared
    assert reader.get("race") == f"thread-{winner}"


@drivers(DRIVERS)
def test_many_keys_raced_by_threads_one_winner_each(store):
    keys = [f"key-{n}" for n in range(40)]
    barrier = threading.Barrier(8)

    def contend(i: int) -> list[str]:
        barrier.wait()
        return [k for k in keys if store.add_if_absent(k, str(i), ttl=100)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        won = [k for ks in pool.map(contend, range(8)) for k in ks]
    assert sorted(won) == sorted(keys)


# --------------------------------------------------------------------------------- expiry


@drivers(DRIVERS)
def test_expiry_follows_the_clock(store, clock):
    assert store.add_if_absent("k", "v", ttl=10)
    clock.advance(9.5)
    assert store.get("k") == "v"
    assert store.add_if_absent("k", "again", ttl=10) is False
    clock.advance(0.5)  # exactly at the expiry: gone
    assert store.get("k") is None
    assert store.ttl("k") is None
    assert store.add_if_absent("k", "again", ttl=10) is True
    assert store.get("k") == "again"
    assert store.ttl("k") == pytest.approx(10)


@drivers(DRIVERS)
def test_ttl_counts_down(store, clock):
    store.set("a", "1", ttl=100)
    store.set("b", "2")
    assert store.ttl("a") == pytest.approx(100)
    clock.advance(40)
    assert store.ttl("a") == pytest.approx(60)
    assert store.ttl("b") is None
    assert store.ttl("missing") is None
    clock.advance(60)
    assert store.ttl("a") is None


@drivers(DRIVERS)
def test_fractional_ttl(store, clock):
    # 10.25 s: Redis also expires the key by its own real clock, which must not come first
    store.set("k", "v", ttl=10.25)
    clock.advance(10.2)
    assert store.get("k") == "v"
    clock.advance(0.05)
    assert store.get("k") is None


# ------------------------------------------------------------------------ set/get/delete


@drivers(DRIVERS)
def test_set_get_delete(store, clock):
    assert store.get("k") is None
    store.set("k", "v1", ttl=10)
    assert store.get("k") == "v1"
    store.set("k", "v2")  # replaces the value and drops the expiry
    clock.advance(20)
    assert store.get("k") == "v2"
    assert store.ttl("k") is None
    store.set("k", "v3", ttl=5)  # and a new expiry replaces no-expiry
    assert store.ttl("k") == pytest.approx(5)
    assert store.delete("k") is True
    assert store.get("k") is None
    assert store.delete("k") is False


@drivers(DRIVERS)
def test_delete_of_expired_key_reports_false(store, clock):
    store.set("k", "v", ttl=1)
    clock.advance(2)
    assert store.delete("k") is False
    assert store.add_if_absent("k", "new") is True


@drivers(DRIVERS)
def test_values_are_kept_verbatim(store):
    awkward = ['{"a": [1, 2]}', "", " leading space", "multi\nline", "ünïcødé ✓", "- -", "1e9 x"]
    for i, value in enumerate(awkward):
        store.set(f"v{i}", value, ttl=60)
    for i, value in enumerate(awkward):
        assert store.get(f"v{i}") == value


# ------------------------------------------------------------------------------- leases


@drivers(DRIVERS)
def test_renew_extends_only_the_holders_live_lease(store, clock):
    assert store.add_if_absent("lease/g", "me", ttl=10)
    clock.advance(8)
    assert store.renew("lease/g", "me", ttl=10) is True
    assert store.ttl("lease/g") == pytest.approx(10)
    assert store.renew("lease/g", "other", ttl=10) is False  # not its lease
    assert store.get("lease/g") == "me" and store.ttl("lease/g") == pytest.approx(10)
    clock.advance(11)  # lapsed: the old holder cannot bring it back
    assert store.renew("lease/g", "me", ttl=10) is False
    assert store.get("lease/g") is None
    assert store.add_if_absent("lease/g", "other", ttl=10)
    assert store.renew("lease/g", "me", ttl=10) is False
    assert store.get("lease/g") == "other"
    assert store.renew("absent", "me", ttl=10) is False and store.get("absent") is None


@drivers(DRIVERS)
def test_renew_without_ttl_keeps_the_lease_for_good(store, clock):
    store.set("lease/g", "- me", ttl=5)  # a value with the payload's separator in it
    assert store.renew("lease/g", "- me", ttl=None) is True
    clock.advance(100)
    assert store.get("lease/g") == "- me" and store.ttl("lease/g") is None


@drivers(DRIVERS)
def test_delete_if_hands_back_only_the_holders_lease(store, clock):
    store.set("lease/g", "me", ttl=10)
    assert store.delete_if("lease/g", "other") is False
    assert store.get("lease/g") == "me"
    assert store.delete_if("lease/g", "me") is True
    assert store.get("lease/g") is None and store.items("lease/") == []
    assert store.delete_if("lease/g", "me") is False
    store.set("lease/g", "me", ttl=1)
    clock.advance(2)
    assert store.delete_if("lease/g", "me") is False  # lapsed: nothing of its own to hand back


@drivers(DRIVERS)
def test_a_lease_raced_by_threads_is_renewed_by_its_holder_only(factory, clock):
    store = factory(clock)
    try:
        store.set("lease/race", "t0", ttl=30)
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(
                pool.map(lambda i: store.renew("lease/race", f"t{i % 4}", ttl=30), range(40))
            )
        assert results.count(True) == 10 and store.get("lease/race") == "t0"
    finally:
        store.close()


# ------------------------------------------------------------------------------- items


@drivers(DRIVERS)
def test_items_by_prefix_sorted_without_expired(store, clock):
    store.set("failing:wms2", "b", ttl=100)
    store.set("failing:wms1", "a", ttl=100)
    store.set("failing:wms3", "gone", ttl=5)
    store.set("failingX", "not-in-prefix")
    store.set("failinf:zzz", "before-prefix")
    store.set("tickets:wms1", "t")
    clock.advance(10)
    assert store.items("failing:") == [("failing:wms1", "a"), ("failing:wms2", "b")]
    assert store.items("tickets:") == [("tickets:wms1", "t")]
    assert store.items("nothing:") == []
    assert [k for k, _ in store.items()] == [
        "failinf:zzz",
        "failing:wms1",
        "failing:wms2",
        "failingX",
        "tickets:wms1",
    ]


@drivers(DRIVERS)
def test_items_with_unicode_and_edge_prefixes(store):
    for key in ["é:1", "é:2", "éa", "e:1", "\U0010ffffz", "z\U0010ffff", "a%_b", "a%c", "A%_b"]:
        store.set(key, key)
    assert store.items("é:") == [("é:1", "é:1"), ("é:2", "é:2")]
    assert store.items("\U0010ffff") == [("\U0010ffffz", "\U0010ffffz")]
    assert store.items("z") == [("z\U0010ffff", "z\U0010ffff")]
    # LIKE/glob metacharacters and case are plain characters in a prefix.
    assert store.items("a%_") == [("a%_b", "a%_b")]
    keys = [k for k, _ in store.items()]
    assert keys == sorted(keys)


@drivers(DRIVERS)
def test_items_prefix_metacharacters_are_literal(store):
    # Characters with a meaning to LIKE, glob, or Redis' lexicographic range syntax.
    keys = ["[a", "[b", "(a", "-x", "+y", "*z", "a*b", "a?c", "\\d", "a", "b"]
    for key in keys:
        store.set(key, "v")
    for prefix in ["[", "(", "-", "+", "*", "a*", "a?", "\\"]:
        want = sorted(k for k in keys if k.startswith(prefix))
        assert [k for k, _ in store.items(prefix)] == want, prefix


def test_prefix_successor():
    assert prefix_successor("") is None
    assert prefix_successor("ab") == "ac"
    assert prefix_successor("a\U0010ffff") == "b"
    assert prefix_successor("\ud7ff") == "\ue000"
    assert prefix_successor("\U0010ffff") is None


# ----------------------------------------------------------------------------- records


@drivers(DRIVERS)
def test_records_since_oldest_first(store):
    store.append_record("accounting", {"time": 300.0, "endpoint": "wms3", "n": 3})
    store.append_record("accounting", {"time": 100.0, "endpoint": "wms1", "n": 1})
    store.append_record("accounting", {"time": 200, "endpoint": "wms2", "n": 2})
    store.append_record("accounting", {"time": 200, "endpoint": "wms2b", "n": 4})
    store.append_record("other", {"time": 150.0, "x": True})
    rows = store.records("accounting")
    assert [r["endpoint"] for r in rows] == ["wms1", "wms2", "wms2b", "wms3"]
    assert rows[0] == {"time": 100.0, "endpoint": "wms1", "n": 1}
    assert [r["n"] for r in store.records("accounting", since=200)] == [2, 4, 3]
    assert store.records("accounting", since=300.5) == []
    assert store.records("other") == [{"time": 150.0, "x": True}]
    assert store.records("missing") == []


@drivers(DRIVERS)
def test_an_identical_record_appended_again_is_kept_once(store):
    """An append retried after a store stall (its first try landed, its answer was lost) must
    not make a second accounting row; a record differing in any field, or in another stream,
    is its own row. Before: every append was a new row, in every driver."""
    for _ in range(3):
        store.append_record("s", {"time": 5.0, "same": 1})
    store.append_record("s", {"same": 1, "time": 5.0})  # the same JSON once keys are sorted
    store.append_record("s", {"time": 5.0, "same": 2})
    store.append_record("s", {"time": 6.0, "same": 1})
    store.append_record("t", {"time": 5.0, "same": 1})
    assert store.records("s") == [
        {"time": 5.0, "same": 1},
        {"time": 5.0, "same": 2},
        {"time": 6.0, "same": 1},
    ]
    assert store.records("t") == [{"time": 5.0, "same": 1}]
    assert store.prune_records("s", before=5.5) == 2
    store.append_record("s", {"time": 5.0, "same": 1})  # pruned, so new again
    assert [r["same"] for r in store.records("s")] == [1, 1]


@drivers(DRIVERS)
def test_record_groups_count_by_slot_and_fields_keeping_each_json_type(store):
    """What a report over a long history reads (SQL stores count in the database): a group per
    slot and distinct values, its count and earliest time; 5 and "5" are distinct values, an
    absent field and a null are both None."""
    rows = [
        {"time": 10.0, "endpoint": "a", "pilots": 5, "x": 1},
        {"time": 3599.5, "endpoint": "a", "pilots": 5, "x": 2},  # same slot, x not grouped
        {"time": 20.0, "endpoint": "a", "pilots": "5"},
        {"time": 30.0, "endpoint": "b", "pilots": None},
        {"time": 40.0, "endpoint": "b"},
        {"time": 3600.0, "endpoint": "a", "pilots": 5},  # the next slot
        {"time": 50.0, "endpoint": ["a", "list"], "pilots": {"n": 1}},
    ]
    for row in rows:
        store.append_record("acc", row)
    store.append_record("other", {"time": 10.0, "endpoint": "a", "pilots": 5})
    groups = store.record_groups("acc", ("endpoint", "pilots"), 3600)
    assert [(g.record, g.count) for g in groups] == [
        ({"endpoint": "a", "pilots": 5, "time": 10.0}, 2),
        ({"endpoint": "a", "pilots": "5", "time": 20.0}, 1),
        ({"endpoint": "b", "pilots": None, "time": 30.0}, 2),
        ({"endpoint": ["a", "list"], "pilots": {"n": 1}, "time": 50.0}, 1),
        ({"endpoint": "a", "pilots": 5, "time": 3600.0}, 1),
    ]
    later = store.record_groups("acc", ("endpoint",), 60, since=40.0)
    assert [(g.record, g.count) for g in later] == [
        ({"endpoint": "b", "time": 40.0}, 1),
        ({"endpoint": ["a", "list"], "time": 50.0}, 1),
        ({"endpoint": "a", "time": 3599.5}, 1),
        ({"endpoint": "a", "time": 3600.0}, 1),
    ]
    assert [g.count for g in store.record_groups("acc", (), 1e9)] == [7]
    assert store.record_groups("missing", ("endpoint",), 60) == []
    with pytest.raises(ValueError):
        store.record_groups("acc", ("endpoint",), 0)


@drivers(["sqlite", "postgresql"])
def test_record_groups_of_a_stream_holding_a_row_that_is_not_json(factory, clock, tmp_path):
    """A row another hand wrote (not JSON) makes the SQL grouping fail: the stream is grouped
    in Python instead, where that row is skipped and logged as every read of it is."""
    store = factory(clock)
    store.append_record("acc", {"time": 10.0, "endpoint": "a"})
    store.append_record("acc", {"time": 20.0, "endpoint": "a"})
    bad = ("acc", 15.0, "{not json")
    if factory.kind == "sqlite":
        with sqlite3.connect(tmp_path / "state" / "state.db") as db:
            db.execute("INSERT INTO records (stream, time, data) VALUES (?, ?, ?)", bad)
    else:
        sql = f"INSERT INTO {store._s}.records (stream, time, data) VALUES (%s, %s, %s)"
        store.run("write a bad row", lambda conn: conn.execute(sql, bad))
    assert len(store.records("acc")) == 2
    groups = store.record_groups("acc", ("endpoint",), 3600)
    assert [(g.record, g.count) for g in groups] == [({"endpoint": "a", "time": 10.0}, 2)]


@drivers(DRIVERS)
def test_bad_input_is_refused_and_nothing_is_lost(store):
    store.set("keep", "v")
    with pytest.raises(ValueError):
        store.set("k", "v", ttl=0)
    with pytest.raises(ValueError):
        store.add_if_absent("k", "v", ttl=-1)
    with pytest.raises(ValueError):
        store.set("k", "v", ttl=float("inf"))
    with pytest.raises(TypeError):
        store.set("k", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.set("", "v")
    with pytest.raises(ValueError, match="time"):
        store.append_record("s", {"no": "time"})
    with pytest.raises(ValueError, match="JSON"):
        store.append_record("s", {"time": 1.0, "obj": object()})
    assert store.get("keep") == "v"
    assert store.get("k") is None
    assert store.records("s") == []


# ------------------------------------------------------------------- restart and sharing


@drivers(SHARED)
def test_restart_keeps_values_expiries_and_records(factory, clock):
    first = factory(clock)
    first.set("fail:wms1", "x", ttl=600)
    first.add_if_absent("ticket:wms1", "t")
    first.append_record("accounting", {"time": 1.0, "n": 1})
    first.close()

    clock.advance(100)
    second = factory(clock)  # a new process would do the same: new instance, same storage
    assert second.get("fail:wms1") == "x"
    assert second.ttl("fail:wms1") == pytest.approx(500)
    assert second.add_if_absent("ticket:wms1", "other") is False
    assert second.records("accounting") == [{"time": 1.0, "n": 1}]
    clock.advance(500)
    assert second.get("fail:wms1") is None
    assert second.items() == [("ticket:wms1", "t")]


@drivers(SHARED)
def test_two_instances_see_each_other(factory, clock):
    a, b = factory(clock), factory(clock)
    assert a.add_if_absent("k", "from-a", ttl=30)
    assert b.add_if_absent("k", "from-b", ttl=30) is False
    assert b.get("k") == "from-a"
    assert b.delete("k") is True
    assert a.get("k") is None


# ------------------------------------------------------------------------------- increment


@drivers(DRIVERS)
def test_increment_counts_from_one_without_expiry(store, clock):
    assert [store.increment("n") for _ in range(3)] == [1, 2, 3]
    assert store.increment("n", by=4) == 7
    assert store.get("n") == "7" and store.ttl("n") is None
    clock.advance(10 * 365 * 86400)
    assert store.increment("n") == 8
    assert store.items("n") == [("n", "8")]


@drivers(DRIVERS)
def test_increment_drops_an_expiry_and_restarts_an_expired_count(store, clock):
    store.set("live", "41", ttl=10)
    store.set("dead", "41", ttl=10)
    assert store.increment("live") == 42
    clock.advance(11)
    assert store.get("live") == "42" and store.ttl("live") is None  # the count is kept
    assert store.increment("dead") == 1  # an expired value counts as absent


@drivers(DRIVERS)
def test_increment_refuses_a_value_that_is_no_count_and_keeps_it(store):
    store.set("text", "not a number")
    with pytest.raises(ValueError, match="not a count"):
        store.increment("text")
    assert store.get("text") == "not a number"
    with pytest.raises(TypeError):
        store.increment("")


@drivers(DRIVERS)
def test_increment_raced_by_threads_gives_every_number_once(factory, clock):
    stores = [factory(clock) for _ in range(8)] if factory.kind != "memory" else None
    shared = factory(clock) if stores is None else None
    barrier = threading.Barrier(8)

    def count(i: int) -> list[int]:
        s = stores[i] if stores is not None else shared
        barrier.wait()
        return [s.increment("race") for _ in range(25)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        got = [n for numbers in pool.map(count, range(8)) for n in numbers]
    assert sorted(got) == list(range(1, 201))


@drivers(SHARED)
def test_increment_is_shared_and_survives_a_restart(factory, clock):
    a, b = factory(clock), factory(clock)
    assert (a.increment("n"), b.increment("n"), a.increment("n")) == (1, 2, 3)
    a.close()
    assert factory(clock).increment("n") == 4


#: the class of each shared driver, for the workers of the process races
CLASSES: dict[str, type[StateStore]] = {
    "sqlite": SqliteState,
    "redis": RedisState,
    "postgresql": PostgresqlState,
}


def _count_worker(kind: str, config: dict, barrier, results) -> None:
    store = CLASSES[kind](config)
    try:
        barrier.wait(timeout=60)
        results.put([store.increment("race") for _ in range(50)])
    finally:
        store.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", SHARED)
def test_increment_raced_by_four_processes_gives_every_number_once(kind, tmp_path, request):
    if kind == "sqlite":
        config: dict = {"path": str(tmp_path / "shared.db")}
        SqliteState(config).close()  # the schema exists before the race starts
    elif kind == "redis":
        server = request.getfixturevalue("redis_server")
        config = {"url": server.url, "prefix": f"test-{uuid.uuid4().hex}:"}
    else:
        # no store made first: the four processes create the tables at once, which must work
        config = pg_config(request.getfixturevalue("postgres_server"), tmp_path)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_count_worker, args=(kind, config, barrier, results)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    try:
        got = [n for _ in procs for n in results.get(timeout=120)]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    assert all(p.exitcode == 0 for p in procs)
    assert sorted(got) == list(range(1, 201))


def _sqlite_worker(path: str, start: float, keys: list[str], barrier, results) -> None:
    store = SqliteState({"path": path}, clock=FakeClock(start))
    try:
        barrier.wait(timeout=60)
        me = str(multiprocessing.current_process().pid)
        results.put((me, [k for k in keys if store.add_if_absent(k, me, ttl=60)]))
    finally:
        store.close()


@pytest.mark.timeout(240)
def test_sqlite_four_processes_race(tmp_path):
    path = str(tmp_path / "shared.db")
    SqliteState({"path": path}).close()  # the schema exists before the race starts
    keys = [f"k{i}" for i in range(100)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_sqlite_worker, args=(path, 1_700_000_000.0, keys, barrier, results))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    try:
        wins = [results.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    assert all(p.exitcode == 0 for p in procs)
    flat = [k for _pid, won in wins for k in won]
    assert sorted(flat) == sorted(keys)  # every key won exactly once across the 4 processes
    store = SqliteState({"path": path}, clock=FakeClock(1_700_000_000.0))
    stored = dict(store.items("k"))
    store.close()
    # What is stored is what each winner was told it had won.
    assert stored == {k: pid for pid, won in wins for k in won}


# ------------------------------------------------------------ a model-based property test

OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "set", "get", "delete", "ttl", "advance", "items"]),
        st.sampled_from(["a", "ab", "b", "b:1", "b:2"]),
        st.one_of(st.none(), st.sampled_from([0.5, 1.0, 3.0])),
    ),
    max_size=40,
)


@drivers(DRIVERS)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_behaves_like_a_dict_with_expiry(factory, ops):
    clock = FakeClock()
    store = factory(clock)
    for key in ("a", "ab", "b", "b:1", "b:2"):  # same storage across examples: start clean
        store.delete(key)
    model: dict[str, tuple[str, float | None]] = {}

    def live(now: float) -> dict[str, tuple[str, float | None]]:
        return {k: v for k, v in model.items() if v[1] is None or v[1] > now}

    for n, (op, key, ttl) in enumerate(ops):
        now = clock.time()
        current = live(now)
        if op == "add":
            expected = key not in current
            assert store.add_if_absent(key, f"v{n}", ttl) is expected
            if expected:
                model[key] = (f"v{n}", None if ttl is None else now + ttl)
        elif op == "set":
            store.set(key, f"v{n}", ttl)
            model[key] = (f"v{n}", None if ttl is None else now + ttl)
        elif op == "get":
            assert store.get(key) == (current[key][0] if key in current else None)
        elif op == "delete":
            assert store.delete(key) is (key in current)
            model.pop(key, None)
        elif op == "ttl":
            want = current[key][1] - now if key in current and current[key][1] else None
            got = store.ttl(key)
            assert (got is None) == (want is None)
            if want is not None:
                assert got == pytest.approx(want)
        elif op == "advance":
            clock.advance(ttl or 0.25)
        else:
            assert store.items(key) == sorted(
                (k, v) for k, (v, _e) in current.items() if k.startswith(key)
            )


# ---------------------------------------------------------------------- driver specifics


def test_sqlite_file_and_directory_are_private(tmp_path, clock):
    path = tmp_path / "new-dir" / "state.db"
    store = SqliteState({"path": str(path)}, clock=clock)
    store.set("k", "v")
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    wal = Path(str(path) + "-wal")
    assert wal.exists() and stat.S_IMODE(wal.stat().st_mode) == 0o600
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    store.close()


def test_sqlite_default_path_is_relative_to_cwd(tmp_path, monkeypatch, clock):
    monkeypatch.chdir(tmp_path)
    store = SqliteState(None, clock=clock)
    store.set("k", "v")
    store.close()
    assert (tmp_path / "gridgate-state" / "state.db").is_file()


def test_sqlite_prunes_expired_rows_now_and_then(tmp_path, clock):
    path = tmp_path / "s.db"
    store = SqliteState({"path": str(path), "prune_interval": 60}, clock=clock)

    def rows() -> int:
        conn = sqlite3.connect(path)
        try:
            return conn.execute("SELECT count(*) FROM kv").fetchone()[0]
        finally:
            conn.close()

    for i in range(10):
        store.set(f"k{i}", "v", ttl=5)
    store.set("forever", "v")
    clock.advance(10)
    store.get("k0")
    assert rows() == 11  # reads never prune, and the interval has not passed
    clock.advance(60)
    store.set("trigger", "v")
    assert rows() == 2
    store.close()


def test_memory_prunes_expired_keys(clock):
    store = MemoryState(clock=clock)
    for i in range(10):
        store.set(f"k{i}", "v", ttl=1)
    clock.advance(MemoryState.PRUNE_EVERY + 1)
    store.set("x", "v")
    assert len(store._data) == 1


@pytest.mark.parametrize("make_bad", ["directory", "garbage", "parent-is-file"])
def test_sqlite_unusable_path_is_a_state_error(tmp_path, make_bad):
    if make_bad == "directory":
        path = tmp_path / "is-a-dir"
        path.mkdir()
    elif make_bad == "garbage":
        path = tmp_path / "garbage.db"
        path.write_bytes(b"this is not sqlite at all" * 100)
    else:
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "state.db"
    with pytest.raises(StateError) as info:
        SqliteState({"path": str(path)})
    assert str(path) in str(info.value)
    if make_bad == "garbage":
        assert "not a gridgate state database" in str(info.value)
        assert path.read_bytes().startswith(b"this is not sqlite")  # nothing overwritten


def test_sqlite_write_error_is_a_state_error(tmp_path, clock):
    path = tmp_path / "s.db"
    store = SqliteState({"path": str(path)}, clock=clock)
    store.set("k", "v")
    # A second connection holds the write lock past busy_timeout: a real "database is locked".
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    store.busy_timeout = 0.05
    store._conn.execute("PRAGMA busy_timeout = 50")
    try:
        with pytest.raises(StateError, match="lock"):
            store.set("k2", "v")
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    store.set("k2", "v")
    assert store.get("k2") == "v" and store.get("k") == "v"
    store.close()
    with pytest.raises(StateError, match="closed"):
        store.get("k")


def test_sqlite_full_database_is_a_state_error(tmp_path, clock):
    store = SqliteState({"path": str(tmp_path / "s.db")}, clock=clock)
    store.set("keep", "v")
    # SQLite's own page limit yields the very error a full disk gives (SQLITE_FULL).
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(StateError, match="disk is full"):
        for i in range(100):
            store.set(f"big{i}", "x" * 100_000)
    assert store.get("keep") == "v"  # what was stored before is intact
    store.close()


def test_sqlite_read_only_is_a_state_error(tmp_path, clock):
    path = tmp_path / "s.db"
    store = SqliteState({"path": str(path)}, clock=clock)
    store.set("keep", "v")
    if os.geteuid() != 0:
        store.close()
        path.chmod(0o400)
        with pytest.raises(StateError, match="read-only"):
            store = SqliteState({"path": str(path)}, clock=clock)
            store.set("k", "v")
        return
    # root ignores file modes: make the connection itself read-only instead.
    store._conn.execute("PRAGMA query_only = 1")
    with pytest.raises(StateError, match="read-only"):
        store.set("k", "v")
    assert store.get("keep") == "v"
    store.close()


def test_redis_sets_a_real_ttl_from_the_clock(redis_server, clock):
    store = RedisState({"url": redis_server.url, "prefix": "pttl:"}, clock=clock)
    store.add_if_absent("k", "v", ttl=120)
    store.set("forever", "v")
    raw = redis_server.client()
    try:
        assert 119_000 <= raw.pttl("pttl:kv:k") <= 120_000
        assert raw.pttl("pttl:kv:forever") == -1
    finally:
        raw.close()
        store.close()


def test_redis_forgets_keys_redis_expired_itself(redis_server, clock):
    store = RedisState({"url": redis_server.url, "prefix": "gone:"}, clock=clock)
    store.set("a", "1")
    store.set("b", "2")
    raw = redis_server.client()
    try:
        raw.delete("gone:kv:a")  # as if Redis' own TTL had fired
        assert store.items() == [("b", "2")]
        assert raw.zrange("gone:keys", 0, -1) == [b"b"]
    finally:
        raw.close()
        store.close()


def test_redis_unreachable_is_a_state_error(clock):
    from support.ports import free_port

    port = free_port()  # a port nobody listens on
    store = RedisState(
        {"url": f"redis://user:secret@127.0.0.1:{port}/0", "socket_connect_timeout": 2}, clock=clock
    )
    try:
        with pytest.raises(StateError) as info:
            store.add_if_absent("k", "v", ttl=5)
        assert "redis state" in str(info.value)
        assert "secret" not in str(info.value)
    finally:
        store.close()


def test_redis_password_from_a_secret(tmp_path, monkeypatch, clock):
    from support.redis_server import RedisServer

    with RedisServer(tmp_path / "auth", password="s3cret-pw") as server:
        monkeypatch.setenv("GG_REDIS_PW", "s3cret-pw")
        store = RedisState({"url": server.url, "password": {"env": "GG_REDIS_PW"}}, clock=clock)
        assert store.add_if_absent("k", "v", ttl=10) is True
        assert store.get("k") == "v"
        store.close()
        (tmp_path / "pw").write_text("s3cret-pw\n")
        (tmp_path / "pw").chmod(0o600)  # a secret others may read is refused
        store = RedisState(
            {"url": server.url, "password": {"file": str(tmp_path / "pw")}}, clock=clock
        )
        assert store.get("k") == "v"
        store.close()
        anonymous = RedisState({"url": server.url}, clock=clock)
        with pytest.raises(StateError, match="(?i)auth"):
            anonymous.get("k")
        anonymous.close()
    monkeypatch.delenv("GG_REDIS_PW")
    with pytest.raises(StateError, match="GG_REDIS_PW"):
        RedisState({"url": "redis://127.0.0.1:1/0", "password": {"env": "GG_REDIS_PW"}})


def test_redis_inline_password_is_a_config_error(tmp_path):
    from gridgate.core.config import ConfigError, load_config

    bad = tmp_path / "bad.yaml"
    bad.write_text("state:\n  driver: redis\n  url: redis://:hunter2@db.example:6379/0\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    text = str(info.value)
    assert "state.url" in text and "password" in text and f"{bad}:3" in text
    good = tmp_path / "good.yaml"
    good.write_text(
        "state:\n  driver: redis\n  url: redis://db.example:6379/0\n  password: {env: REDIS_PW}\n"
    )
    config = load_config(good)
    assert config.data["state"]["prefix"] == "gridgate:"
    assert RedisState.config_errors({"url": "redis://user@h/0"}) == []


def test_redis_prefixes_keep_sites_apart(redis_server, clock):
    one = RedisState({"url": redis_server.url, "prefix": "site1:"}, clock=clock)
    two = RedisState({"url": redis_server.url, "prefix": "site2:"}, clock=clock)
    try:
        assert one.add_if_absent("k", "1") and two.add_if_absent("k", "2")
        assert one.items() == [("k", "1")] and two.items() == [("k", "2")]
    finally:
        one.close()
        two.close()


# ------------------------------------------------------------------ entry points, schemas


@pytest.mark.parametrize(
    "name,cls",
    [
        ("memory", MemoryState),
        ("sqlite", SqliteState),
        ("redis", RedisState),
        ("postgresql", PostgresqlState),
    ],
)
def test_entry_point_and_schema(name, cls):
    (ep,) = [e for e in entry_points(group="gridgate.state") if e.name == name]
    assert ep.load() is cls
    Draft202012Validator.check_schema(cls.config_schema)
    props = cls.config_schema["properties"]
    assert all("description" in v for v in props.values())
    defaults = {k: v["default"] for k, v in props.items() if "default" in v}
    assert list(Draft202012Validator(cls.config_schema).iter_errors(defaults)) == []
    assert list(Draft202012Validator(cls.config_schema).iter_errors({"bogus": 1}))


# ------------------------------------------------------------------------- pilot registry


def _pilot(
    job: str,
    endpoint: str = "e1",
    state: str = "waiting",
    *,
    backend: str = "b",
    submitted: float = 100.0,
    changed: float | None = None,
    **kw,
) -> Pilot:
    return Pilot(
        job_id=job,
        backend=backend,
        endpoint=endpoint,
        submitted=submitted,
        state=state,
        changed=submitted if changed is None else changed,
        **kw,
    )


@drivers(DRIVERS)
def test_pilots_put_active_counts(store):
    reg = store.pilot_registry()
    reg.put(
        [
            _pilot("j1", submitted=3),
            _pilot("j2", submitted=1),
            _pilot("j3", "e2"),
            _pilot("j4", state="done", changed=200),
            _pilot("j1", backend="other"),
        ]
    )
    assert [p.job_id for p in reg.active("b", "e1")] == ["j2", "j1"]  # oldest submission first
    assert [p.job_id for p in reg.active("b", "e2")] == ["j3"]
    assert reg.active("b", "nowhere") == []
    assert reg.counts() == {
        ("b", "e1", "waiting"): 2,
        ("b", "e1", "done"): 1,
        ("b", "e2", "waiting"): 1,
        ("other", "e1", "waiting"): 1,
    }


@drivers(DRIVERS)
def test_pilots_update_moves_between_states_and_keeps_every_field(store):
    reg = store.pilot_registry()
    reg.put([_pilot("j1", group="g", submitted=10), _pilot("j2", submitted=11)])
    reg.put(
        [
            _pilot("j1", group="g", submitted=10, state="running", changed=20, native="R"),
            _pilot(
                "j2",
                submitted=11,
                state="failed",
                changed=30,
                native="Aborted",
                reason="BrokerHelper: no compatible resources",
            ),
        ]
    )
    (j1,) = reg.active("b", "e1")
    assert j1 == Pilot("j1", "b", "e1", "g", 10, "running", 20, "R", "")
    assert reg.counts() == {("b", "e1", "running"): 1, ("b", "e1", "failed"): 1}
    assert reg.get("b", "e1", "j2").reason == "BrokerHelper: no compatible resources"
    assert reg.get("b", "e1", "nope") is None
    # a terminal pilot put back as waiting (a restart that re-submitted it) is active again
    reg.put([_pilot("j2", submitted=11)])
    assert {p.job_id for p in reg.active("b", "e1")} == {"j1", "j2"}


@drivers(DRIVERS)
def test_pilots_last_finished_newest_first_after_a_time(store):
    reg = store.pilot_registry()
    reg.put(
        [_pilot(f"j{i}", state="failed" if i % 2 else "done", changed=1000 + i) for i in range(10)]
        + [
            _pilot("live", state="running", changed=5000),
            _pilot("elsewhere", "e2", "failed", changed=9e3),
        ]
    )
    got = reg.last_finished("b", "e1", 3)
    assert [p.job_id for p in got] == ["j9", "j8", "j7"]
    assert [p.job_id for p in reg.last_finished("b", "e1", 100, after=1006)] == ["j9", "j8", "j7"]
    assert len(reg.last_finished("b", "e1", 100)) == 10


@drivers(DRIVERS)
def test_pilots_query_filters_and_prune_forgets_only_old_terminal(store):
    reg = store.pilot_registry()
    reg.put(
        [
            _pilot("old-done", state="done", changed=100),
            _pilot("old-lost", "e2", "lost", changed=150),
            _pilot("new-done", state="done", changed=900),
            _pilot("old-waiting", changed=50),
        ]
    )
    # by backend, endpoint, submission time
    assert [p.job_id for p in reg.query(states=["done", "lost"])] == [
        "new-done",
        "old-done",
        "old-lost",
    ]
    assert [p.job_id for p in reg.query(endpoint="e2")] == ["old-lost"]
    assert [p.job_id for p in reg.query("b", "e1", ["waiting"])] == ["old-waiting"]
    assert len(reg.query(limit=2)) == 2
    assert reg.prune(before=500) == 2
    assert sorted(p.job_id for p in reg.query()) == ["new-done", "old-waiting"]
    assert reg.counts() == {("b", "e1", "done"): 1, ("b", "e1", "waiting"): 1}
    assert reg.last_finished("b", "e2", 10) == []


@drivers(DRIVERS)
def test_pilots_finished_per_slot_counts_terminal_states_since_a_time(store):
    reg = store.pilot_registry()
    reg.put(
        [_pilot(f"d{i}", state="done", changed=100 + i) for i in range(5)]
        + [_pilot("f1", "e2", "failed", changed=150), _pilot("f2", "e3", "failed", changed=120)]
        + [_pilot("late", state="done", changed=3700), _pilot("lost", state="lost", changed=90)]
        + [_pilot("live", state="running", changed=110), _pilot("new", changed=130)]
    )
    got = reg.finished_per_slot(3600)
    assert [(s.changed, s.state, s.count) for s in got] == [
        (90, "lost", 1),
        (100, "done", 5),
        (120, "failed", 2),
        (3700, "done", 1),
    ]
    later = reg.finished_per_slot(60, since=102)
    assert [(s.changed, s.state, s.count) for s in later] == [
        (102, "done", 3),  # the slot of 60-119 from 102 on
        (120, "failed", 2),
        (3700, "done", 1),
    ]
    assert reg.finished_per_slot(3600, since=1e6) == []


@drivers(SHARED)
def test_pilots_survive_a_restart_and_are_shared(factory, clock):
    first = factory(clock)
    first.pilot_registry().put([_pilot("j1", group="g"), _pilot("j2", state="running")])
    other = factory(clock)  # another process (gridgate pilots) sees them at once
    assert {p.job_id for p in other.pilot_registry().active("b", "e1")} == {"j1", "j2"}
    first.close()
    second = factory(clock)
    assert second.pilot_registry().counts() == {
        ("b", "e1", "waiting"): 1,
        ("b", "e1", "running"): 1,
    }
    assert second.pilot_registry().get("b", "e1", "j1").group == "g"


@drivers(DRIVERS)
def test_pilots_bulk_of_ten_thousand(store):
    reg = store.pilot_registry()
    reg.put(_pilot(f"j{i:05d}", f"e{i % 4}") for i in range(10_000))
    assert len(reg.active("b", "e3")) == 2500
    reg.put(_pilot(f"j{i:05d}", f"e{i % 4}", "done", changed=200) for i in range(0, 10_000, 2))
    assert sum(n for (_b, _e, s), n in reg.counts().items() if s == "done") == 5000
    assert len(reg.active("b", "e0")) == 0 and len(reg.active("b", "e1")) == 2500
    assert reg.prune(before=1000) == 5000


def _live_fleet(reg) -> None:
    """Pilots for the lean reads: ties of submission time, every kind of state, a terminal
    pilot made live again, other endpoints and backends, a job id holding the separators
    some drivers use."""
    reg.put(
        [
            _pilot("j3", submitted=5),
            _pilot("j1", submitted=5, state="running"),
            _pilot("j0", submitted=9, state="unknown", changed=20),
            _pilot("j2", submitted=1, state="running"),
            _pilot("done", submitted=0, state="done", changed=50),
            _pilot("back", submitted=7, state="failed", changed=60),
            _pilot("odd\x1e\x1fid", submitted=8),
            _pilot("j9", "e2"),
            _pilot("j8", backend="other"),
        ]
    )
    reg.put([_pilot("j3", submitted=5, state="cancelled", changed=70), _pilot("back", submitted=7)])


def _check_live_reads(reg) -> None:
    live = reg.live_states("b", "e1")
    # oldest submission first, ties by job id: the order of active()
    active = reg.active("b", "e1")
    assert list(live.states.items()) == [(p.job_id, p.state) for p in active]
    assert list(live.submitted.items()) == [(p.job_id, p.submitted) for p in active]
    assert live == LiveStates(
        {"j2": "running", "j1": "running", "back": "waiting", "odd\x1e\x1fid": "waiting"}
        | {"j0": "unknown"},
        {"j2": 1.0, "j1": 5.0, "back": 7.0, "odd\x1e\x1fid": 8.0, "j0": 9.0},
    )
    assert len(live) == 5
    assert reg.live_states("b", "e2") == LiveStates({"j9": "waiting"}, {"j9": 100.0})
    assert reg.live_states("b", "nowhere") == LiveStates()
    # whole rows, terminal ones too, in the order asked; an unknown id is left out
    got = reg.get_many("b", "e1", ["j0", "nope", "j3", "odd\x1e\x1fid", "j9"])
    assert [(p.job_id, p.state) for p in got] == [
        ("j0", "unknown"),
        ("j3", "cancelled"),
        ("odd\x1e\x1fid", "waiting"),
    ]
    assert got[0] == reg.get("b", "e1", "j0")
    assert reg.get_many("b", "e1", []) == []
    assert reg.get_many("b", "e1", ["j0", "j0"]) == [got[0]]  # once
    reg.put([_pilot("j1", submitted=5, state="done", changed=80), _pilot("j4", submitted=2)])
    assert list(reg.live_states("b", "e1").states) == ["j2", "j4", "back", "odd\x1e\x1fid", "j0"]


@drivers(DRIVERS)
def test_pilots_live_states_and_get_many(store):
    reg = store.pilot_registry()
    _live_fleet(reg)
    _check_live_reads(reg)


class _OnlyTheAbstract(PilotRegistry):
    """A registry that implements only what PilotRegistry requires (a driver written before
    the lean reads), on a real one: the defaults of live_states, get_many and get answer."""

    def __init__(self) -> None:
        self.inner = MemoryPilots()

    def put(self, pilots):
        self.inner.put(pilots)

    def active(self, backend, endpoint):
        return self.inner.active(backend, endpoint)

    def counts(self):
        return self.inner.counts()

    def waiting(self):
        return self.inner.waiting()

    def last_finished(self, backend, endpoint, n, after=0.0):
        return self.inner.last_finished(backend, endpoint, n, after)

    def query(self, backend=None, endpoint=None, states=None, limit=None):
        return self.inner.query(backend, endpoint, states, limit)

    def prune(self, before):
        return self.inner.prune(before)


def test_pilots_live_reads_default_to_the_abstract_methods():
    reg = _OnlyTheAbstract()
    _live_fleet(reg)
    _check_live_reads(reg)


@drivers(SHARED)
def test_pilots_live_states_shared_and_bulk(factory, clock):
    first, other = factory(clock).pilot_registry(), factory(clock).pilot_registry()
    first.put(_pilot(f"j{i:05d}", f"e{i % 4}", submitted=10_000 - i) for i in range(10_000))
    live = other.live_states("b", "e3")
    assert len(live) == 2500 and next(iter(live.states)) == "j09999"
    other.put(_pilot(f"j{i:05d}", "e3", "done", submitted=10_000 - i) for i in range(3, 10_000, 8))
    assert len(first.live_states("b", "e3")) == 1250


def test_redis_live_states_of_a_store_written_before_them(redis_server, clock):
    """A store written by a gridgate before the lean read kept no sorted set of live pilots:
    the first read of an endpoint builds it from the rows, later writes keep it."""
    store = RedisState({"url": redis_server.url, "prefix": f"t-{uuid.uuid4().hex}:"}, clock=clock)
    try:
        reg = store.pilot_registry()
        _live_fleet(reg)
        client = store.client
        old = [k for k in client.keys(f"{store.prefix}pilots:live*")]
        assert old and client.delete(*old) == len(old)
        assert reg.live_states("b", "e2") == LiveStates({"j9": "waiting"}, {"j9": 100.0})
        assert client.exists(f"{store.prefix}pilots:live:b\x1fe2")
        reg.put([_pilot("j9", "e2", "done", changed=300)])  # later writes keep it
        assert not reg.live_states("b", "e2")
        reg.put([_pilot("j9", "e2")])
        _check_live_reads(reg)
    finally:
        store.close()


def test_pilot_refuses_unknown_states_and_empty_ids():
    with pytest.raises(ValueError):
        _pilot("j", state="zombie")
    with pytest.raises(ValueError):
        _pilot("")


def test_sqlite_registry_write_error_is_a_state_error_and_loses_nothing(tmp_path, clock):
    store = SqliteState({"path": str(tmp_path / "s.db")}, clock=clock)
    reg = store.pilot_registry()
    reg.put([_pilot("j1")])
    other = sqlite3.connect(tmp_path / "s.db", timeout=0)
    other.execute("BEGIN EXCLUSIVE")
    store.busy_timeout = 0.01
    store._conn.execute("PRAGMA busy_timeout = 10")
    try:
        with pytest.raises(StateError, match="write pilots"):
            reg.put([_pilot("j1", state="running", changed=5), _pilot("j2")])
    finally:
        other.rollback()
        other.close()
    assert [(p.job_id, p.state) for p in reg.query()] == [("j1", "waiting")]  # all or nothing
    reg.put([_pilot("j2")])
    assert len(reg.query()) == 2
    store.close()


# ------------------------------------------------------------------- room reserved (issue 43)


def _claim(holder: str, count: int, endpoint: str = "e1", **limits) -> RoomClaim:
    return RoomClaim(holder, "b", endpoint, count, expires=limits.pop("expires", 1000.0), **limits)


@drivers(DRIVERS)
def test_reserve_counts_waiting_pilots_and_the_others_live_reservations(store):
    reg = store.pilot_registry()
    reg.put([_pilot(f"w{i}") for i in range(3)] + [_pilot("r1", state="running")])
    assert reg.reserve(_claim("a", 5, max_waiting=10), now=100) == 5  # 3 waiting + 5 <= 10
    assert reg.reserve(_claim("b", 5, max_waiting=10), now=100) == 2  # a's 5 count
    assert reg.reserve(_claim("c", 1, max_waiting=10), now=100) == 0
    assert reg.reserve(_claim("a", 6, max_waiting=10), now=100) == 5  # a replaces its own
    reg.settle("a")
    reg.settle("a")  # settled twice: nothing
    assert reg.reserve(_claim("c", 9, max_waiting=10), now=100) == 5  # 3 waiting, b's 2
    reg.put([_pilot(f"x{i}") for i in range(5)])  # c's pilots made, then settled
    reg.settle("c")
    assert reg.reserve(_claim("d", 1, max_waiting=10), now=100) == 0  # 8 waiting, b's 2
    assert reg.reserve(_claim("e", 4, endpoint="e2", max_waiting=10), now=100) == 4  # not e1's
    assert reg.reserve(_claim("d", 1, max_waiting=10), now=1000) == 1  # b's lapsed at 1000


@drivers(DRIVERS)
def test_reserve_holds_max_total_over_the_backend_and_the_waiting_cores(store):
    reg = store.pilot_registry()
    reg.put(
        [
            _pilot("w1", "e1", cores=8),
            _pilot("r1", "e2", state="running"),
            _pilot("d1", "e2", "done"),
        ]
    )
    assert reg.reserve(_claim("a", 9, "e3", max_total=6), now=100) == 4  # 2 active
    assert reg.reserve(_claim("b", 9, "e1", max_total=6), now=100) == 0
    assert reg.reserve(_claim("c", 4, "e1", cores=4, max_waiting_cores=20), now=100) == 3
    assert reg.reserve(_claim("d", 1, "e1", cores=4, max_waiting_cores=20), now=100) == 0
    assert reg.reserve(_claim("e", 1, "e1", cores=4), now=100) == 1  # no limit: all of it


@drivers(SHARED)
def test_reservations_raced_from_many_connections_never_pass_the_limit(factory, clock):
    stores = [factory(clock) for _ in range(8)]
    barrier = threading.Barrier(8)

    def take(i: int) -> int:
        reg = stores[i].pilot_registry()
        barrier.wait()
        return sum(reg.reserve(_claim(f"h{i}-{k}", 2, max_waiting=13), now=100) for k in range(3))

    with ThreadPoolExecutor(max_workers=8) as pool:
        granted = list(pool.map(take, range(8)))
    assert sum(granted) == 13, granted
