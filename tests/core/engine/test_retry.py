"""A failed submission is sent elsewhere in the same iteration, within its bounds: at most
``retries_per_pilot`` more attempts, never to an excluded or already-tried server, never past
the iteration's deadline; and the director says what it did."""

from __future__ import annotations

import json

from support.director import BACKEND, ScriptedBackend, config

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director, summary_json
from gridgate.core.engine.retry import ResubmitPolicy
from gridgate.core.engine.section import DirectorSettings
from gridgate.core.model import Endpoint, Failure
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector


class Kind:
    """Classifies every failure as ``failure`` (to choose exclude/transient per test)."""

    def __init__(self, failure: Failure) -> None:
        self.failure = failure

    @hookimpl
    def gridgate_classify_failure(self, endpoint, result):
        return self.failure


class FirstUsable:
    @hookimpl
    def gridgate_select_endpoint(self, candidates, request):
        return candidates[0]


class Slow(ScriptedBackend):
    """Each submission takes ``seconds`` on the injected clock."""

    def __init__(self, clock: FakeClock, seconds: float, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.clock, self.seconds = clock, seconds

    @hookimpl
    def gridgate_submit(self, endpoint, request, timeout):
        self.clock.advance(self.seconds)
        return super().gridgate_submit(endpoint, request, timeout)


def make(backend, *plugins, clock=None, servers=5, **director):
    clock = clock or FakeClock()
    state = MemoryState(clock=clock)
    return Director(
        config(servers=servers, **director),
        clock=clock,
        state=state,
        extra_plugins=[backend, FirstUsable(), *plugins],
    ), state


def test_a_failed_pilot_is_retried_at_most_k_times_never_twice_on_one_server() -> None:
    busy = Failure(kind="busy", exclude=False, notify=False, transient=True)
    backend = ScriptedBackend(5, {f"s{i}": "fake-fail" for i in range(5)})
    director, _ = make(backend, Kind(busy), pilots=1, retries_per_pilot=2, max_threads=1)
    summary = director.run_iteration()
    assert backend.calls == ["s0", "s1", "s2"]  # 1 try + 2 retries, each on a new server
    assert [r.attempt for r in summary.records] == [1, 2, 3]
    assert [(e.failed_on, e.attempt, e.outcome) for e in summary.retries] == [
        ("s0", 1, "retried"),
        ("s1", 2, "retried"),
        ("s2", 3, "not retried: 2 retries done"),
    ]
    director.close()


def test_a_retry_goes_to_a_healthy_server_and_never_to_one_in_the_failing_cache() -> None:
    backend = ScriptedBackend(
        4, {"s0": "fake-fail", "s1": "fake-ok", "s2": "fake-ok", "s3": "fake-ok"}
    )
    director, state = make(backend, servers=4, pilots=1, max_threads=1)
    director.failing.enter(Endpoint(BACKEND, "s1"), "error")  # failing before the iteration
    summary = director.run_iteration()
    assert backend.calls == ["s0", "s2"]
    submitted = [r for r in summary.records if r.outcome == "submitted"]
    assert [(r.endpoint, r.attempt) for r in submitted] == [("s2", 2)]
    assert summary.excluded == (f"{BACKEND}/s0",)
    director.close()


def test_no_retry_starts_past_the_iterations_deadline() -> None:
    clock = FakeClock(1_000.0)
    busy = Failure(kind="busy", exclude=False, notify=False, transient=True)
    backend = Slow(clock, 200, 5, {f"s{i}": "fake-fail" for i in range(5)})
    director, _ = make(
        backend,
        Kind(busy),
        clock=clock,
        pilots=1,
        max_threads=1,
        retries_per_pilot=5,
        command_timeout=50,
        retry_within_seconds=300,
    )
    summary = director.run_iteration()
    # t=1200: 1250 <= 1300, retried; t=1400: 1450 > 1300, not retried
    assert backend.calls == ["s0", "s1"]
    assert [e.outcome for e in summary.retries] == [
        "retried",
        "not retried: it would run past the iteration's deadline",
    ]
    director.close()


def test_kinds_not_worth_retrying_and_local_faults_are_not_retried() -> None:
    for failure in (
        Failure(kind="auth", transient=False),
        Failure(kind="launch", transient=False, local=True),
    ):
        backend = ScriptedBackend(3, {f"s{i}": "fake-fail" for i in range(3)})
        director, _ = make(backend, Kind(failure), servers=3, pilots=1, max_threads=1)
        summary = director.run_iteration()
        assert backend.calls == ["s0"] and summary.retries == (), failure
        director.close()


def test_retries_off_is_reported_and_the_json_line_carries_the_report() -> None:
    backend = ScriptedBackend(2, {"s0": "fake-fail", "s1": "fake-ok"})
    collector = Collector()
    director, _ = make(backend, collector, servers=2, pilots=1, max_threads=1, retries_per_pilot=0)
    summary = director.run_iteration()
    assert backend.calls == ["s0"]
    doc = json.loads(summary_json(summary))
    assert doc["retries"] == [
        {
            "backend": BACKEND,
            "group": "default",
            "pilots": 1,
            "failed_on": "s0",
            "kind": "error",
            "attempt": 1,
            "outcome": "not retried: retries are off",
        }
    ]
    assert doc["pilots_submitted"] == 0
    director.close()


def test_retry_policy_reads_the_director_section() -> None:
    policy = ResubmitPolicy.for_iteration(
        DirectorSettings.of({"retries_per_pilot": 3, "retry_within_seconds": 60}), 100.0
    )
    assert policy == ResubmitPolicy(retries=3, deadline=160.0)
    transient = Failure(kind="timeout")
    assert policy.decide(transient, 1, now=100.0, timeout=60.0, others=2) == "retried"
    assert policy.decide(transient, 1, now=100.5, timeout=60.0, others=2).endswith("deadline")
    assert policy.decide(transient, 1, now=100.0, timeout=10.0, others=0).endswith(
        "no other usable server"
    )
