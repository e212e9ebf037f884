"""The director and what each endpoint's queue says of itself (``gridgate_endpoint_state``,
issue 45): asked once an iteration per endpoint that may get pilots, under a ``query`` grant; a
queue not in production is drained and shown so; the jobs a queue reports waiting (everybody's)
count against ``max_waiting``; an endpoint that says nothing, a plugin that crashes or answers
nonsense changes nothing. The real backends' answers are tested against their real services
(tests/plugins/slurm/test_slurm_queue_state.py)."""

from __future__ import annotations

import json
import tempfile
import threading
from collections import Counter

import pytest
from support.director import BACKEND, TrackingBackend, config

from gridgate.core import hookimpl
from gridgate.core.builtin.bans import OperatorBans
from gridgate.core.clock import FakeClock
from gridgate.core.endpoint_state import EndpointState, StateCache
from gridgate.core.engine.availability import unavailable_view
from gridgate.core.engine.director import Director, summary_json
from gridgate.core.model import Endpoint, Grant, Refusal, Resources, SubmitRequest
from gridgate.core.stores.memory import MemoryState

S0, S1 = f"{BACKEND}/s0", f"{BACKEND}/s1"


class Queues:
    """Says for each endpoint name what the test tells it (missing: nothing); ``boom`` raises."""

    def __init__(self, said: dict[str, object] | None = None, boom: bool = False) -> None:
        self.said = said or {}
        self.boom = boom
        self.asked: list[str] = []
        self.lock = threading.Lock()

    @hookimpl
    def gridgate_endpoint_state(self, endpoint: Endpoint, timeout: float):
        with self.lock:
            self.asked.append(endpoint.name)
        if self.boom:
            raise RuntimeError("queue plugin bug")
        return self.said.get(endpoint.name)


class Admission:
    """Grants or refuses, and keeps what it was asked and given back."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.asked: list[tuple[str, str, str]] = []
        self.released: list[Grant] = []

    @hookimpl
    def gridgate_admit(self, request):
        self.asked.append((request.category, request.opcode, request.endpoint.name))
        if self.refuse and request.category == "query":
            return Refusal("test", "busy")
        return Grant(issuer="test", token=str(len(self.asked)))

    @hookimpl
    def gridgate_release(self, grant):
        self.released.append(grant)


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path, monkeypatch) -> None:
    """Each test keeps its directors' files under its own folder."""
    monkeypatch.chdir(tmp_path)


def make(*plugins, servers: int = 2, pilots: int = 6, max_waiting: int | None = 3, store=None):
    clock = FakeClock()
    # each director its own state_dir: the store's epoch file is a director's own
    cfg = config(servers=servers, pilots=pilots, state_dir=tempfile.mkdtemp(dir="."))
    cfg.data["director"]["pilots"]["max_waiting"] = max_waiting
    backend = TrackingBackend(servers=servers)
    director = Director(
        cfg,
        clock=clock,
        extra_plugins=[backend, *plugins],
        state=store if store is not None else MemoryState(clock=clock),
    )
    return director, backend


def submitted(summary) -> Counter[str]:
    return Counter(
        {
            e: sum(
                r.pilots for r in summary.records if r.outcome == "submitted" and r.endpoint == e
            )
            for e in {r.endpoint for r in summary.records if r.outcome == "submitted"}
        }
    )


def test_the_jobs_a_queue_reports_waiting_count_against_max_waiting() -> None:
    # s0's queue holds 3 waiting jobs of others: full; s1's holds 1: room for 2
    queues = Queues({"s0": EndpointState(waiting=3), "s1": EndpointState(waiting=1, running=9)})
    director, _backend = make(queues, pilots=6, max_waiting=3)
    summary = director.run_iteration()
    assert submitted(summary) == {"s1": 2}
    assert sorted(queues.asked) == ["s0", "s1"]  # once each
    trimmed = json.loads(summary_json(summary))["pilots"]["trimmed"]
    assert trimmed == {BACKEND: {"max_waiting": 4}}
    assert summary.unavailable == {}  # a full queue is a limit, not a drain
    director.close()


def test_gridgates_own_waiting_pilots_are_not_counted_twice() -> None:
    # the queue reports gridgate's own 2 pilots among its 2 waiting: the larger count holds
    queues = Queues()
    director, backend = make(queues, servers=1, pilots=2, max_waiting=3)
    director.run_iteration()
    assert backend.count("s0", "waiting") == 2
    queues.said = {"s0": EndpointState(waiting=2)}
    second = director.run_iteration()
    assert submitted(second) == {"s0": 1}
    director.close()


@pytest.mark.parametrize("serving", ["draining", "closed", "queueing"])
def test_a_queue_not_in_production_is_drained_and_shown_so(tmp_path, serving) -> None:
    queues = Queues({"s0": EndpointState(serving=serving, reason="State=\x1b[31mDRAIN")})
    director, _backend = make(queues, pilots=4, max_waiting=None)
    first = director.run_iteration()
    assert submitted(first) == {"s1": 4}
    said = first.unavailable[S0]
    assert (said.state, said.source) == ("drained", "queue")
    # the scheduler's words are outside text: escaped where they are shown
    assert said.reason == f"its queue is {serving} (State=\\x1b[31mDRAIN)"
    assert [n.subject for n in first.notifications] == [
        f"gridgate: {S0} drained (queue), no known end"
    ]
    _checked, rows = unavailable_view(director.state)  # what `gridgate servers list` shows
    assert [(r["endpoint"], r["state"], r["source"]) for r in rows] == [(S0, "drained", "queue")]
    # the queue is back in production: available again, told once
    queues.said = {"s0": EndpointState()}
    second = director.run_iteration()
    assert second.unavailable == {} and submitted(second)["s0"] > 0
    assert [n.subject for n in second.notifications] == [
        f"gridgate: {S0} available again (was drained: queue)"
    ]
    director.close()


def test_gridgate_endpoint_state_is_asked_under_a_query_grant_and_not_when_refused() -> None:
    admission = Admission()
    queues = Queues({"s0": EndpointState(serving="closed")})
    director, _backend = make(queues, admission, max_waiting=None)
    director.run_iteration()
    asked = [a for a in admission.asked if a[0] == "query"]
    assert sorted(asked) == [("query", "QUEUE_STATE", "s0"), ("query", "QUEUE_STATE", "s1")]
    assert len(admission.released) == len(admission.asked)  # every grant given back
    director.close()
    refusing = Admission(refuse=True)
    queues = Queues({"s0": EndpointState(serving="closed")})
    director, _backend = make(queues, refusing, max_waiting=None)
    summary = director.run_iteration()
    assert queues.asked == [] and summary.unavailable == {}  # not asked: nothing changes
    assert summary.records and all(r.outcome == "submitted" for r in summary.records)
    director.close()


def test_only_endpoints_that_may_get_pilots_are_asked() -> None:
    queues = Queues()
    director, _backend = make(queues, pilots=0)
    director.run_iteration()
    assert queues.asked == []  # no demand: nobody asked
    director.close()
    director, _backend = make(queues, pilots=4)
    OperatorBans(director.state).drain(S0, who="alice", why="op", duration=600)
    director.run_iteration()
    assert queues.asked == ["s1"]  # the drained one is not asked
    director.close()


@pytest.mark.parametrize(
    ("plugin", "log"),
    [
        (Queues(boom=True), "crashed in a plugin"),
        (Queues({"s0": {"waiting": 99}, "s1": {"waiting": 99}}), "not an EndpointState"),
        (Queues({}), None),
    ],
)
def test_a_plugin_that_crashes_answers_nonsense_or_nothing_changes_nothing(
    plugin, log, logs
) -> None:
    director, _backend = make(plugin, pilots=6, max_waiting=3)
    summary = director.run_iteration()
    assert submitted(summary) == {"s0": 3, "s1": 3} and summary.unavailable == {}
    if log is not None:
        assert any(log in m for _level, m in logs)
    director.close()


class LongPilots:
    """Demand for 4 pilots of a group asking two hours."""

    @hookimpl
    def gridgate_demand(self, iteration, demand):
        asked = Resources(cores=1, walltime=7200)
        demand.add(SubmitRequest(BACKEND, group="long", resources=asked), times=4)


def test_pilots_asking_more_than_the_queue_allows_are_not_sent_there_told_once() -> None:
    queues = Queues({"s0": EndpointState(max_walltime=3600, source="test queue")})
    director, _backend = make(queues, LongPilots(), pilots=0, max_waiting=None)
    first = director.run_iteration()
    assert submitted(first) == {"s1": 4}
    [note] = first.notifications
    assert (note.level, note.subject) == ("error", f"gridgate: {S0} cannot run group long's pilots")
    assert "a walltime of 7200 s (the queue allows 3600)" in note.body
    second = director.run_iteration()
    assert submitted(second) == {"s1": 4} and second.notifications == ()  # told once
    # neither queue can run them: skipped as the group's config problem, s1 told once
    queues.said["s1"] = EndpointState(max_cores=1, max_walltime=600)
    third = director.run_iteration()
    assert not submitted(third)
    assert {r.failure_kind for r in third.records} == {"config"}
    assert [n.subject for n in third.notifications] == [
        f"gridgate: {BACKEND}/s1 cannot run group long's pilots"
    ]
    # s0's limit lifted, then set again: told again
    queues.said["s0"] = EndpointState()
    assert submitted(director.run_iteration()) == {"s0": 4}
    queues.said["s0"] = EndpointState(max_walltime=60)
    again = director.run_iteration()
    assert [n.subject for n in again.notifications] == [
        f"gridgate: {S0} cannot run group long's pilots"
    ]
    director.close()


def test_state_cache_reads_a_key_once_an_interval_and_keeps_no_exception() -> None:
    now = [0.0]
    cache: StateCache[int] = StateCache(10, clock=lambda: now[0])
    reads: list[str] = []

    def read(key: str, value: int):
        def go() -> int:
            reads.append(key)
            return value

        return go

    assert cache.get("a", read("a", 1)) == 1
    assert cache.get("a", read("a", 2)) == 1  # kept
    assert cache.get("b", read("b", 3)) == 3
    now[0] = 10.0
    assert cache.get("a", read("a", 4)) == 4  # the interval passed
    assert reads == ["a", "b", "a"]

    def boom() -> int:
        raise OSError("down")

    now[0] = 30.0
    with pytest.raises(OSError):
        cache.get("a", boom)
    assert cache.get("a", read("a", 5)) == 5  # the failure was not kept


def test_endpoint_state_refuses_what_is_no_state() -> None:
    with pytest.raises(ValueError, match="serving state 'open'"):
        EndpointState(serving="open")
    with pytest.raises(ValueError, match="waiting -1"):
        EndpointState(waiting=-1)
    said = EndpointState(serving="draining", waiting=4, free_slots=0, reason="State=DRAIN")
    assert (
        not said.accepts
        and said.describe() == "draining, 4 waiting, 0 free slots, reason: State=DRAIN"
    )


def test_only_backends_that_can_say_are_asked() -> None:
    from gridgate.core.backend import Backend
    from gridgate.core.engine.queue_state import answered_backends
    from gridgate.core.testing import build_plugin

    class Quiet(Backend):
        name = "quiet"
        config_schema = {"type": "object"}  # noqa: RUF012 - a test's own

    class Telling(Quiet):
        name = "telling"

        def endpoint_state(self, endpoint, timeout):
            return EndpointState()

    quiet, telling = build_plugin(Quiet, {}), build_plugin(Telling, {})
    # the base class implements the hook for every backend: only one that overrides it says
    assert answered_backends([quiet, telling]) == {"telling"}
    assert answered_backends([quiet]) == set()
    assert answered_backends([quiet, Queues()]) is None  # another plugin may answer for any


def test_free_slots_weigh_the_choice_of_an_endpoint() -> None:
    """``selectors: free_slots``: each endpoint chosen in proportion to the free slots its
    queue reports (at least ``floor``), an endpoint that says nothing as the mean of the
    others; the other selectors are not given the queues they do not take."""
    queues = Queues(
        {"s0": EndpointState(free_slots=0), "s1": EndpointState(free_slots=9, running=3)}
    )
    cfg = config(servers=3, pilots=300, state_dir=tempfile.mkdtemp(dir="."))
    cfg.data["director"]["pilots"]["max_waiting"] = None
    cfg.data["selectors"] = {"free_slots": {"seed": 3}}
    clock = FakeClock()
    backend = TrackingBackend(servers=3)
    director = Director(
        cfg, clock=clock, extra_plugins=[backend, queues], state=MemoryState(clock=clock)
    )
    try:
        sent = submitted(director.run_iteration())
    finally:
        director.close()
    # weights 1 (0 free, at the floor), 9 and, for s2 which says nothing, their mean 5
    assert sum(sent.values()) == 300, sent
    shares = {e: sent.get(e, 0) / 300 for e in ("s0", "s1", "s2")}
    assert shares["s0"] < 0.15 and shares["s1"] > 0.45 and 0.2 < shares["s2"] < 0.5, shares
    assert shares["s1"] > shares["s2"] > shares["s0"], shares
