"""One attempt's outcome accounts for itself (gridgate.core.engine.failure.AttemptOutcome): built
once with the request and the attempt, each ending states only what differs, and the row it
writes says what happened."""

from __future__ import annotations

import time

from support.director import BACKEND, config

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.engine.failure import AttemptOutcome
from gridgate.core.engine.runtime import ACCOUNTING, Iteration
from gridgate.core.model import Endpoint, IterationInfo, SubmitRequest
from gridgate.core.stores.memory import MemoryState


def test_each_ending_writes_its_row_and_a_skip_takes_no_time() -> None:
    clock = FakeClock()
    state = MemoryState(clock=clock)
    director = Director(config(), clock=clock, state=state)
    it = Iteration(info=IterationInfo(number=4, started=clock.time()), failing=set())
    request = SubmitRequest(backend=BACKEND, count=3, group="g")
    start = AttemptOutcome(it, request, attempt=2, started=time.monotonic() - 5)
    start.skipped("max_waiting", 1).account(director.failures)
    reached = start.on(Endpoint(BACKEND, "s1"), request)
    reached.timed().submitted(("j1", "j2", "j3")).account(director.failures)
    reached.failed("timeout").account(director.failures)
    rows = [
        (r["outcome"], r["endpoint"], r["pilots"], r["failure_kind"], r["attempt"])
        for r in state.records(ACCOUNTING)
    ]
    assert rows == [
        ("skipped", "", 1, "max_waiting", 2),
        ("submitted", "s1", 3, "", 2),
        ("failed", "s1", 3, "timeout", 2),
    ]
    durations = [r["duration"] for r in state.records(ACCOUNTING)]
    assert durations[0] == 0.0 and all(d >= 5 for d in durations[1:])
    assert [r.iteration for r in it.records] == [4, 4, 4]
    assert state.records(ACCOUNTING)[1]["job_ids"] == ["j1", "j2", "j3"]
    director.close()
