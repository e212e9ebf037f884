"""The limits hold among concurrent directors (issue 43): each submission reserves its room
in the store's registry in one atomic step, so directors iterating at the same time, with or
without demand_lock, never put more than max_waiting on an endpoint. Before, every director
read the same counts and filled the same room: 40 waiting with 2 directors, 80 with 4,
against max_waiting 20."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from support.director import BACKEND, TrackingBackend

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.state import StateStore
from gridgate.core.stores.postgresql import PostgresqlState
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState
from gridgate.core.testing import Collector, make_config

MAX_WAITING = 5


class SlowSite(TrackingBackend):
    """Pilots that never start; each submission waits at a barrier of all directors' first
    submissions, so every director has read the counts before any pilot exists."""

    def __init__(self, directors: int) -> None:
        super().__init__(3, {f"s{i}": "fake-ok" for i in range(3)})
        self.gate = threading.Barrier(directors, timeout=1)
        self.first = threading.local()

    @hookimpl
    def gridgate_submit(self, endpoint, request, timeout):  # noqa: ANN001, ANN201
        if endpoint.backend == BACKEND and not getattr(self.first, "done", False):
            self.first.done = True
            try:
                self.gate.wait()
            except threading.BrokenBarrierError:
                pass  # fewer directors got this far: go on
        return super().gridgate_submit(endpoint, request, timeout)


def _doc(lock: bool) -> dict:
    return {
        "director": {
            "cycle_seconds": 60,
            "max_threads": 3,
            "command_timeout": 5,
            "demand_lock": lock,
            "pilots": {"max_waiting": MAX_WAITING, "max_total": 40},
        },
        "state": {"driver": "memory"},
        "demand": {"static": {BACKEND: [{"group": g, "pilots": 30} for g in ("a", "b")]}},
        "selectors": {"random": {"seed": 7}},
    }


def _stores(kind: str, tmp_path: Path, request: pytest.FixtureRequest, clock: FakeClock, n: int):
    if kind == "sqlite":
        path = tmp_path / "state.db"
        return [SqliteState({"path": str(path)}, clock=clock) for _ in range(n)]
    if kind == "postgresql":
        cluster = request.getfixturevalue("postgres_server")
        monkeypatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setenv("GG_TEST_PG_PW", cluster.password)
        section = {
            "dsn": cluster.dsn,
            "password": {"env": "GG_TEST_PG_PW"},
            "schema": f"room_{uuid.uuid4().hex[:8]}",
        }
        return [PostgresqlState(section, clock=clock) for _ in range(n)]
    server = request.getfixturevalue("redis_server")
    prefix = f"room-{uuid.uuid4().hex[:8]}:"
    return [RedisState({"url": server.url, "prefix": prefix}, clock=clock) for _ in range(n)]


@pytest.mark.parametrize("lock", [False, True], ids=["no-lock", "demand-lock"])
@pytest.mark.parametrize("kind", ["redis", "sqlite", "postgresql"])
def test_concurrent_directors_never_put_more_than_max_waiting_on_an_endpoint(
    kind: str, lock: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    clock, n = FakeClock(), 4
    site = SlowSite(n)
    stores: list[StateStore] = _stores(kind, tmp_path, request, clock, n)
    directors = [
        Director(
            make_config(_doc(lock)), clock=clock, extra_plugins=[site, Collector()], state=store
        )
        for store in stores
    ]
    try:
        for _ in range(3):  # rounds of four directors iterating at once
            site.gate.reset()
            threads = [threading.Thread(target=d.run_iteration) for d in directors]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            waiting = {e.name: site.count(e.name, "waiting") for e in site.endpoints}
            assert all(w <= MAX_WAITING for w in waiting.values()), waiting
            clock.advance(60)
        assert sum(waiting.values()) == 3 * MAX_WAITING  # and the room is filled
        counts = stores[0].pilot_registry().counts()
        assert sorted(n for (_b, _e, s), n in counts.items() if s == "waiting") == [5, 5, 5]
    finally:
        for d in directors:
            d.close()
