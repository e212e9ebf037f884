"""The director's state keeps working while its store fails, says so once, and catches up."""

from __future__ import annotations

from support.director import ScriptedBackend, config

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.engine.resilient import ResilientState
from gridgate.core.engine.runtime import ACCOUNTING
from gridgate.core.state import StateError
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector


class Unplugged(MemoryState):
    """A memory store that can be switched off, the way a disk fills or a server goes away."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise StateError("store unreachable (unplugged by the test)")

    def add_if_absent(self, key, value, ttl=None):
        self._check()
        return super().add_if_absent(key, value, ttl)

    def set(self, key, value, ttl=None):
        self._check()
        super().set(key, value, ttl)

    def get(self, key):
        self._check()
        return super().get(key)

    def items(self, prefix=""):
        self._check()
        return super().items(prefix)

    def append_record(self, stream, record):
        self._check()
        super().append_record(stream, record)

    def records(self, stream, since=0.0):
        self._check()
        return super().records(stream, since)


def test_fallback_keeps_state_and_resyncs() -> None:
    clock = FakeClock()
    primary = Unplugged(clock=clock)
    changes: list[bool] = []
    state = ResilientState(
        primary, clock=clock, retry_every=30, on_change=lambda d, r: changes.append(d)
    )
    assert state.add_if_absent("failing/a", "1", ttl=100)
    primary.down = True
    # the local view already knows what this process wrote before the failure
    assert state.add_if_absent("failing/a", "1", ttl=100) is False
    assert state.add_if_absent("failing/b", "1", ttl=100) is True
    state.append_record(ACCOUNTING, {"time": clock.time(), "n": 1})
    assert changes == [True]
    clock.advance(10)
    assert state.get("failing/b") == "1"  # not yet time to retry: local answers
    primary.down = False
    clock.advance(30)
    assert state.get("failing/b") == "1"  # recovered: the primary was given the local keys
    assert changes == [True, False]
    assert primary.get("failing/b") == "1"
    assert [r["n"] for r in primary.records(ACCOUNTING)] == [1]


def test_director_notifies_once_per_outage_and_keeps_submitting() -> None:
    clock = FakeClock()
    primary = Unplugged(clock=clock)
    collector = Collector()
    backend = ScriptedBackend(2, {"s0": "fake-fail", "s1": "fake-ok"})
    director = Director(
        config(servers=2, pilots=4, max_threads=1, state_retry_seconds=60),
        clock=clock,
        extra_plugins=[backend, collector],
        state=primary,
    )
    primary.down = True
    for _ in range(3):
        summary = director.run_iteration()
        assert sum(1 for r in summary.records if r.outcome == "submitted") >= 3
        clock.advance(5)
    subjects = [n.subject for n in collector.notes]
    assert subjects.count("gridgate: state store unavailable, running on a local view") == 1
    assert subjects.count("s0: error executing Job Submit [error]") == 1  # no storm while degraded
    primary.down = False
    clock.advance(60)
    director.run_iteration()
    assert [n.subject for n in collector.notes].count("gridgate: state store available again") == 1
    # the rows kept in memory were written back: 4 iterations of 4 pilots, and the one retry
    # of the submission that failed on s0 in the first
    assert len(primary.records(ACCOUNTING)) == 17
    director.close()
