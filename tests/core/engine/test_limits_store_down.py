"""Issue 21, item 8: the pilot limits fail closed while the state store is down. A real
redis-server stopped under the director (SIGSTOP: every call times out, and it comes back with
its data on SIGCONT) and a real sqlite file on a full tmpfs (every write refused with SQLITE_FULL).
While the store is down, max_waiting applies to the last known counts plus this process's own
submissions, which are written back to the store when it answers again. Before: the demand
went out untrimmed at every iteration and the pilots submitted meanwhile were never recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

from support.director import BACKEND, TrackingBackend, config

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.state import PilotRegistry
from gridgate.core.testing import Collector


def director_on(state: dict, clock: FakeClock, backend: TrackingBackend) -> Director:
    cfg = config(servers=1, pilots=4, state_retry_seconds=30)
    cfg.data["state"] = state
    cfg.data["director"]["pilots"].update({"max_waiting": 5})
    return Director(cfg, clock=clock, extra_plugins=[backend, Collector()])


def submitted(summary) -> int:
    return sum(r.pilots for r in summary.records if r.outcome == "submitted")


def waiting(registry: PilotRegistry) -> int:
    return sum(n for (_b, _e, s), n in registry.counts().items() if s == "waiting")


def outage(director: Director, clock: FakeClock) -> list[int]:
    out = []
    for _ in range(3):
        clock.advance(10)
        out.append(submitted(director.run_iteration()))
    return out


def test_redis_down_the_limits_hold_on_the_last_counts_and_own_submissions(redis_server) -> None:
    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    state = {
        "driver": "redis",
        "url": redis_server.url,
        "socket_timeout": 0.5,
        "prefix": f"gg-{uuid.uuid4().hex[:8]}:",
    }
    director = director_on(state, clock, backend)
    try:
        assert submitted(director.run_iteration()) == 4
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            during = outage(director, clock)
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        assert during == [1, 0, 0]  # 4 known + 1 of its own = max_waiting
        clock.advance(31)
        assert submitted(director.run_iteration()) == 0
        registry = director.state.pilot_registry()
        assert waiting(registry) == 5  # the one submitted during the outage was written back
        assert {p.job_id for p in registry.query(BACKEND)} == set(backend.jobs["s0"])
    finally:
        director.close()


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:  # nothing left to flush at close
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass  # ENOSPC: the file system is full, as wanted
    return filler


def test_sqlite_disk_full_the_limits_hold_and_the_pilots_are_written_back(tmp_path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(folder)], check=True
    )
    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    director = director_on({"driver": "sqlite", "path": str(folder / "state.db")}, clock, backend)
    try:
        assert submitted(director.run_iteration()) == 4
        filler = _fill(folder)
        try:
            during = outage(director, clock)
        finally:
            filler.unlink()
        assert during == [1, 0, 0]
        clock.advance(31)
        assert submitted(director.run_iteration()) == 0
        assert waiting(director.state.pilot_registry()) == 5
    finally:
        director.close()
        subprocess.run(["umount", str(folder)], check=True)


def test_a_director_restarted_while_the_store_is_down_keeps_the_limits_and_the_pilots(
    tmp_path,
) -> None:
    """The pilots a director submitted during an outage are not lost when it exits: the next
    director on the same state folder counts them (and the last known counts), and writes them
    back when the store answers. Before: a restarted director knew nothing, submitted its whole
    demand, and the first one's outage pilots were never recorded."""
    from gridgate.core.state import StateError
    from gridgate.core.stores.memory import MemoryState

    class Flaky(MemoryState):
        down = False

        def pilot_registry(self):
            if self.down:
                raise StateError("redis state at redis://x: Connection refused")
            return super().pilot_registry()

    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    store = Flaky(clock=clock)

    def director() -> Director:
        cfg = config(servers=1, pilots=3, state_dir=str(tmp_path / "state"))
        cfg.data["director"]["pilots"].update({"max_waiting": 5})
        return Director(cfg, clock=clock, extra_plugins=[backend, Collector()], state=store)

    first = director()
    assert submitted(first.run_iteration()) == 3
    store.down = True
    assert submitted(first.run_iteration()) == 2
    second = director()  # the first one exited (its memory gone), the store is still down
    assert [submitted(second.run_iteration()) for _ in range(2)] == [0, 0]
    store.down = False
    assert submitted(second.run_iteration()) == 0
    assert waiting(store.pilot_registry()) == 5
    assert {p.job_id for p in store.pilot_registry().query(BACKEND)} == set(backend.jobs["s0"])
    second.close()
