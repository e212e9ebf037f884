"""Several directors on one shared store (a Redis, a PostgreSQL schema): each demand group is
filled by one of them (a lock in the store), and another takes it over when the holder stops."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from support.director import ScriptedBackend, config

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.state import StateStore
from gridgate.core.stores.postgresql import PostgresqlState
from gridgate.core.stores.redis import RedisState
from gridgate.core.testing import Collector


@pytest.fixture(params=["redis", "postgresql"])
def shared(request, monkeypatch) -> Callable[[FakeClock], StateStore]:
    """Makes stores of one shared place: a key prefix of a Redis, a schema of a PostgreSQL."""
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        prefix = f"lock-{uuid.uuid4().hex[:8]}:"
        return lambda clock: RedisState({"url": server.url, "prefix": prefix}, clock=clock)
    cluster = request.getfixturevalue("postgres_server")
    monkeypatch.setenv("GG_TEST_PG_PW", cluster.password)
    section = {
        "dsn": cluster.dsn,
        "password": {"env": "GG_TEST_PG_PW"},
        "schema": f"lock_{uuid.uuid4().hex[:8]}",
    }
    return lambda clock: PostgresqlState(section, clock=clock)


def director(state: StateStore, clock: FakeClock) -> tuple[Director, ScriptedBackend]:
    backend = ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})
    d = Director(
        config(servers=2, pilots=5, cycle_seconds=60, demand_lock=True),
        clock=clock,
        extra_plugins=[backend, Collector()],
        state=state,
    )
    return d, backend


def test_one_director_fills_each_group_and_another_takes_over(shared) -> None:
    clock = FakeClock()
    first, first_backend = director(shared(clock), clock)
    second, second_backend = director(shared(clock), clock)
    try:
        for _ in range(3):  # both iterate every cycle; only the holder submits
            a, b = first.run_iteration(), second.run_iteration()
            assert sum(r.pilots for r in a.records if r.outcome == "submitted") == 5
            assert {(r.outcome, r.failure_kind) for r in b.records} == {
                ("skipped", "claimed_elsewhere")
            }
            clock.advance(60)
        assert len(second_backend.calls) == 0 and len(first_backend.calls) == 15
        # the holder stops; 1.5 cycles later its lock has lapsed and the other fills the group
        clock.advance(91)
        b = second.run_iteration()
        assert sum(r.pilots for r in b.records if r.outcome == "submitted") == 5
    finally:
        first.close()
        second.close()


def test_while_redis_is_down_only_the_last_holder_fills_the_group(tmp_path) -> None:
    """Issue 31, item 9: during a store outage each director falls back to its own view, in
    which every lock is free: without care both would fill the group. The holder keeps it,
    the other fills nothing, until the store answers again."""
    import os
    import signal

    from support.redis_server import RedisServer

    clock = FakeClock()
    with RedisServer(tmp_path / "redis") as server:
        prefix = f"lock-{uuid.uuid4().hex[:8]}:"

        def make() -> tuple[Director, ScriptedBackend]:
            backend = ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})
            state = RedisState(
                {"url": server.url, "prefix": prefix, "socket_timeout": 0.3}, clock=clock
            )
            doc = config(servers=2, pilots=5, cycle_seconds=60, demand_lock=True)
            return Director(
                doc, clock=clock, extra_plugins=[backend, Collector()], state=state
            ), backend

        (first, first_backend), (second, second_backend) = make(), make()
        try:
            first.run_iteration(), second.run_iteration()  # the first holds the group
            clock.advance(60)
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                for _ in range(2):
                    a, b = first.run_iteration(), second.run_iteration()
                    assert sum(r.pilots for r in a.records if r.outcome == "submitted") == 5
                    assert not [r for r in b.records if r.outcome == "submitted"]
                    clock.advance(60)
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert len(second_backend.calls) == 0 and len(first_backend.calls) == 15
        finally:
            first.close()
            second.close()
