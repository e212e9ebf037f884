"""The stall alarm: demand asked for pilots, none was submitted K iterations in a row, whatever
the cause: one error saying why, an alarm past ticket_expiry, one "submitting again"."""

from __future__ import annotations

import pytest
from support.director import BACKEND, ScriptedBackend, config

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.config import validate_document
from gridgate.core.engine.director import Director
from gridgate.core.engine.section import DirectorSettings
from gridgate.core.model import AdmissionRequest, Refusal
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector


class RefuseAll:
    """Admission control that refuses every token (an overloaded or disabled token daemon)."""

    def __init__(self) -> None:
        self.refusing = True

    @hookimpl
    def gridgate_admit(self, request: AdmissionRequest) -> Refusal | None:
        return Refusal(issuer="test", reason="category disabled") if self.refusing else None


def stall_notes(collector: Collector) -> list:
    return [n for n in collector.notes if n.key.startswith("stall/")]


def director_for(
    cause: str, clock: FakeClock, state: MemoryState, collector: Collector, **director
) -> tuple[Director, ScriptedBackend, RefuseAll]:
    backend = ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})
    admission = RefuseAll()
    admission.refusing = cause == "refused"
    if cause == "failing":
        backend.behaviour = {"s0": "fake-fail", "s1": "fake-fail"}
    elif cause == "missing":
        backend.behaviour = {"s0": "missing", "s1": "missing"}
    cfg = config(servers=2, pilots=4, failing_expiry=600, ticket_expiry=1800, **director)
    if cause == "no_backend":  # a demand group for a backend nothing answers for
        doc = {
            **{k: v for k, v in cfg.data.items() if k != "backends"},
            "demand": {"static": {"wms_glitch": 4}},
        }
        cfg = validate_document(doc)
    plugins = [backend, collector] + ([admission] if cause == "refused" else [])
    return Director(cfg, clock=clock, extra_plugins=plugins, state=state), backend, admission


def fix(cause: str, director: Director, backend: ScriptedBackend, admission: RefuseAll) -> None:
    backend.behaviour = {"s0": "fake-ok", "s1": "fake-ok"}
    admission.refusing = False
    if cause == "failing":
        director.failing.clear(sorted(director.failing.excluded()))
    if cause == "no_backend":
        director.config.data["demand"]["static"].clear()
        director.config.data["demand"]["static"][BACKEND] = 4


@pytest.mark.parametrize(
    ("cause", "reasons"),
    [
        ("failing", ["failed/error", "skipped/no_endpoint"]),
        # the submissions run in parallel: those started before the first one found the
        # command missing fail the same way, the others are skipped (skipped/local_fault)
        ("missing", ["failed/launch"]),
        ("refused", ["refused/admission"]),
        ("no_backend", ["skipped/no_backend"]),
    ],
)
def test_three_iterations_without_a_pilot_raise_one_error_naming_why(cause, reasons) -> None:
    clock = FakeClock(1_000_000.0)
    collector = Collector()
    director, backend, admission = director_for(cause, clock, MemoryState(clock=clock), collector)
    for _ in range(2):
        director.run_iteration()
        clock.advance(60)
    assert stall_notes(collector) == []
    summary = director.run_iteration()
    (error,) = stall_notes(collector)
    assert error in summary.notifications
    assert error.level == "error"
    assert "has submitted no pilot for 3 iteration(s) in a row" in error.body
    assert "12 in all" in error.body
    for reason in reasons:
        assert f"- {reason}: " in error.body
    for _ in range(3):  # still stalled: no second error
        clock.advance(60)
        director.run_iteration()
    assert len(stall_notes(collector)) == 1
    clock.advance(1800)  # it has now lasted past ticket_expiry: an alarm
    director.run_iteration()
    assert [n.level for n in stall_notes(collector)] == ["error", "alarm"]
    alarm = stall_notes(collector)[-1]
    assert alarm.body.startswith(
        "Submit GGUS Ticket for this error if not already opened\n"
        "It has been failing at least for 35 minutes\n"
    )
    clock.advance(60)
    director.run_iteration()  # alarms repeat at the failing-cache rhythm, not every iteration
    assert [n.level for n in stall_notes(collector)] == ["error", "alarm"]
    fix(cause, director, backend, admission)
    clock.advance(60)
    assert director.run_iteration().records[0].outcome == "submitted"
    assert [n.level for n in stall_notes(collector)] == ["error", "alarm", "info"]
    assert "is submitting again" in stall_notes(collector)[-1].subject
    for _ in range(3):
        clock.advance(60)
        director.run_iteration()
    assert len(stall_notes(collector)) == 3  # said once
    director.close()


def test_a_submitting_iteration_resets_the_count() -> None:
    clock = FakeClock(1_000_000.0)
    collector = Collector()
    director, backend, admission = director_for(
        "refused", clock, MemoryState(clock=clock), collector
    )
    for refusing in (True, True, False, True, True, False, True, True):
        admission.refusing = refusing
        director.run_iteration()
        clock.advance(60)
    assert stall_notes(collector) == []  # never 3 in a row; nothing to say, nothing resumed
    director.close()


def test_no_demand_is_not_a_stall() -> None:
    clock = FakeClock()
    collector = Collector()
    director, _, _ = director_for("failing", clock, MemoryState(clock=clock), collector)
    director.config.data["demand"]["static"][BACKEND] = 0
    for _ in range(5):
        director.run_iteration()
    assert stall_notes(collector) == []
    director.close()


def test_the_count_survives_a_restart_and_two_directors_send_one_error() -> None:
    clock = FakeClock(1_000_000.0)
    state = MemoryState(clock=clock)
    collector = Collector()
    first, _, _ = director_for("refused", clock, state, collector, stall_iterations=4)
    for _ in range(3):
        first.run_iteration()
    first.close()  # restarted after 3 stalled iterations: the 4th raises the error
    second, _, admission = director_for("refused", clock, state, collector, stall_iterations=4)
    twin, _, twin_admission = director_for("refused", clock, state, collector, stall_iterations=4)
    second.run_iteration()
    twin.run_iteration()
    assert [n.level for n in stall_notes(collector)] == ["error"]
    assert "for 4 iteration(s) in a row" in stall_notes(collector)[0].body
    second.close()
    third, _, admission = director_for("refused", clock, state, collector, stall_iterations=4)
    third.run_iteration()  # restarted while stalled: no second error for the same stall
    assert [n.level for n in stall_notes(collector)] == ["error"]
    admission.refusing = twin_admission.refusing = False
    third.run_iteration()
    twin.run_iteration()
    assert [n.level for n in stall_notes(collector)] == ["error", "info"]
    third.close()
    twin.close()


def test_demand_trimmed_because_enough_pilots_wait_is_not_a_stall() -> None:
    from gridgate.core.engine.stall import StallWatch
    from gridgate.core.model import AccountingRecord, IterationInfo

    clock = FakeClock()
    watch = StallWatch(MemoryState(clock=clock), clock, "host:site.yaml")
    director = DirectorSettings.of(
        {"failing_expiry": 600, "ticket_expiry": 1800, "stall_iterations": 1}
    )
    full = [
        AccountingRecord(
            time=0, backend=BACKEND, endpoint="", outcome="skipped", pilots=4, failure_kind=kind
        )
        for kind in ("max_waiting", "max_total", "claimed_elsewhere")
    ]
    for number in range(1, 6):
        assert watch.observe(IterationInfo(number, clock.time()), full, director) == []
    refused = [
        AccountingRecord(
            time=0,
            backend=BACKEND,
            endpoint="s0",
            outcome="refused",
            pilots=4,
            failure_kind="admission",
        )
    ]
    assert [n.level for n in watch.observe(IterationInfo(6, clock.time()), refused, director)] == [
        "error"
    ]


def test_a_store_that_came_back_empty_mid_stall_sends_no_second_error_and_says_resumed() -> None:
    """Issue 41: a Redis without persistence restarted while the director stalls. The episode
    was in the store; the director's own view writes it back when it notices the empty store,
    so the stall is not told a second time, and "submitting again" follows when it ends."""
    clock = FakeClock(1_000_000.0)
    collector = Collector()
    store = MemoryState(clock=clock)
    director, backend, admission = director_for("refused", clock, store, collector)
    for _ in range(3):
        director.run_iteration()
        clock.advance(60)
    assert [n.level for n in stall_notes(collector)] == ["error"]
    for key, _value in store.items():  # what a restarted Redis without persistence holds
        store.delete(key)
    store._pilot_registry = None
    for _ in range(3):  # still stalled, the store empty then written back: no second error
        director.run_iteration()
        clock.advance(60)
    assert [n.level for n in stall_notes(collector)] == ["error"]
    fix("refused", director, backend, admission)
    director.run_iteration()
    assert [n.level for n in stall_notes(collector)] == ["error", "info"]
    assert "is submitting again" in stall_notes(collector)[-1].subject
    director.close()
