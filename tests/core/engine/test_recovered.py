"""Issue 42: a server whose failures were told says once that it works again, when it answers a
submission or a status poll after its outage, and after an operator cleared it by hand."""

from __future__ import annotations

from support.director import BACKEND, ScriptedBackend, TrackingBackend, config

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector


def notices(collector: Collector) -> list:
    return [n for n in collector.notes if "works again" in n.subject]


def director_for(backend, clock: FakeClock, collector: Collector) -> Director:
    cfg = config(servers=1, pilots=1, max_threads=1, failing_expiry=60, ticket_expiry=3600)
    return Director(
        cfg, clock=clock, extra_plugins=[backend, collector], state=MemoryState(clock=clock)
    )


def test_a_server_that_answers_again_after_told_failures_is_said_to_work_once() -> None:
    clock = FakeClock(1_000_000.0)
    collector = Collector()
    backend = ScriptedBackend(1, {"s0": "fake-fail"})
    director = director_for(backend, clock, collector)
    try:
        for _ in range(3):  # fails, and fails again at each expiry of the failing cache
            director.run_iteration()
            clock.advance(61)
        assert [n.level for n in collector.notes if n.level != "info"][:2] == ["error", "alarm"]
        assert notices(collector) == []
        backend.behaviour["s0"] = "fake-ok"
        director.run_iteration()
        (note,) = notices(collector)
        assert note.level == "info" and note.subject == "gridgate: s0 works again"
        assert f"{BACKEND}/s0 works again" in note.body and "after 3 failure(s)" in note.body
        assert "by itself" in note.body
        for _ in range(3):  # once per episode
            clock.advance(61)
            director.run_iteration()
        assert len(notices(collector)) == 1
    finally:
        director.close()


def test_a_server_cleared_by_hand_is_said_to_work_when_it_answers() -> None:
    clock = FakeClock(1_000_000.0)
    collector = Collector()
    backend = ScriptedBackend(1, {"s0": "fake-fail"})
    director = director_for(backend, clock, collector)
    try:
        director.run_iteration()
        assert director.failing.clear(["s0"], who="alice") == [f"{BACKEND}/s0"]
        backend.behaviour["s0"] = "fake-ok"
        clock.advance(1)
        director.run_iteration()
        (note,) = notices(collector)
        assert "cleared by alice" in note.body and "after 1 failure(s)" in note.body
    finally:
        director.close()


def test_a_ce_found_down_by_its_polls_is_said_to_work_when_a_poll_answers() -> None:
    clock = FakeClock(1_000_000.0)
    collector = Collector()
    backend = TrackingBackend(1)
    cfg = config(servers=1, pilots=1, max_threads=1, failing_expiry=600, ticket_expiry=3600)
    cfg.data["director"]["pilots"]["max_waiting"] = 1
    director = Director(
        cfg, clock=clock, extra_plugins=[backend, collector], state=MemoryState(clock=clock)
    )
    try:
        director.run_iteration()  # one pilot waits; max_waiting is full from now on
        backend.status_mode["s0"] = "fail"
        clock.advance(60)
        director.run_iteration()
        assert [n.level for n in collector.notes] == ["error"]
        backend.status_mode["s0"] = "ok"
        clock.advance(601)  # out of the failing cache (it is not polled while in it)
        director.run_iteration()  # no submission (max_waiting full): the poll says it works
        (note,) = notices(collector)
        assert "after 1 failure(s)" in note.body
    finally:
        director.close()


def test_a_failure_nobody_was_told_of_ends_without_a_notice() -> None:
    """A failure whose kind tells nobody (notify: false) ends silently: nothing to undo."""
    clock = FakeClock(1_000_000.0)
    collector = Collector()
    backend = ScriptedBackend(1, {"s0": "fake-fail"})
    cfg = config(
        servers=1, pilots=1, max_threads=1, failing_expiry=60, notify_kinds={"error": False}
    )
    director = Director(
        cfg, clock=clock, extra_plugins=[backend, collector], state=MemoryState(clock=clock)
    )
    try:
        director.run_iteration()
        backend.behaviour["s0"] = "fake-ok"
        clock.advance(61)
        director.run_iteration()
        assert notices(collector) == []
    finally:
        director.close()
