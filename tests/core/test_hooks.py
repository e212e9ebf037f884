"""One test per hook (named after it), the order hooks fire in over an iteration, and the
meta-tests that keep the contract documented and tested."""

from __future__ import annotations

import inspect
import re
import threading
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from support.director import (
    BACKEND,
    MatchingBackend,
    ScriptedBackend,
    TrackingBackend,
    config,
    set_director,
)

from gridgate.core import hookimpl, hookspecs
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.engine.loader import new_plugin_manager
from gridgate.core.model import Endpoint, Episode, Escalation, Failure, Grant, Refusal
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector

TESTS = Path(__file__).resolve().parent.parent
HOOKS = sorted(
    name
    for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)
    if name.startswith("gridgate_")
)


def director_with(*plugins: object, servers: int = 3, **kw) -> Director:
    clock = FakeClock()
    return Director(
        config(servers=servers, **kw),
        clock=clock,
        extra_plugins=list(plugins),
        state=MemoryState(clock=clock),
    )


# --- meta-tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented(hook: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
    assert "Called" in doc, f"{hook}: say when it is called"
    assert ":return:" in doc, f"{hook}: say what the return value means"
    for param in inspect.signature(getattr(hookspecs, hook)).parameters:
        assert f":param {param}:" in doc, f"{hook}: document :param {param}:"
    if getattr(hookspecs, hook).gridgate_spec["firstresult"]:
        assert "Stops at first non-None result." in doc


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test_named_after_it(hook: str) -> None:
    pattern = re.compile(rf"def test_{hook}(\b|_)")
    assert any(pattern.search(p.read_text(encoding="utf-8")) for p in TESTS.rglob("test_*.py")), (
        f"no test named test_{hook}"
    )


# --- the order of one iteration ------------------------------------------------------------


class Order:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()

    def log(self, name: str) -> None:
        with self.lock:
            self.events.append(name)

    @hookimpl
    def gridgate_iteration_started(self, iteration):
        self.log("iteration_started")

    @hookimpl
    def gridgate_demand(self, iteration, demand):
        self.log("demand")

    @hookimpl
    def gridgate_backend_info(self, backend):
        self.log("backend_info")

    @hookimpl(tryfirst=True)
    def gridgate_select_endpoint(self, candidates, request):
        self.log("select_endpoint")

    @hookimpl(tryfirst=True)
    def gridgate_admit(self, request):
        self.log("admit")

    @hookimpl(tryfirst=True)
    def gridgate_list_match(self, endpoint, request, timeout):
        self.log("list_match")

    @hookimpl(tryfirst=True)
    def gridgate_submit(self, endpoint, request, timeout):
        self.log("submit")

    @hookimpl(tryfirst=True)
    def gridgate_classify_failure(self, endpoint, result):
        self.log("classify_failure")

    @hookimpl(tryfirst=True)
    def gridgate_escalate(self, endpoint, failure, result):
        self.log("escalate")

    @hookimpl
    def gridgate_notify(self, notification):
        self.log("notify")

    @hookimpl
    def gridgate_release(self, grant):
        self.log("release")

    @hookimpl
    def gridgate_submission_finished(self, record):
        self.log("submission_finished")

    @hookimpl
    def gridgate_iteration_finished(self, summary):
        self.log("iteration_finished")


def test_hooks_fire_in_the_documented_order_over_one_iteration() -> None:
    order = Order()
    backend = MatchingBackend(1, {"s0": "fake-fail"})
    director = director_with(backend, order, servers=1, pilots=1)
    director.config.data["demand"]["static"][BACKEND] = [
        {"group": "g", "pilots": 1, "list_match": True, "requirements": "", "attributes": {}}
    ]
    director.run_iteration()
    assert order.events == [
        # backend_info twice: the pilot tracker asks first (to poll and trim), then the plan
        "iteration_started",
        "demand",
        "backend_info",
        "backend_info",
        "select_endpoint",
        "admit",
        "list_match",
        "submit",
        "release",
        "classify_failure",
        "escalate",
        "notify",
        "submission_finished",
        "iteration_finished",
    ]
    director.close()


# --- one test per hook -----------------------------------------------------------------------


def test_gridgate_register_commands() -> None:
    class Adds:
        @hookimpl
        def gridgate_register_commands(self, cli: click.Group) -> None:
            @cli.command("hello")
            def hello() -> None:
                click.echo("hello from a plugin")

    group = click.Group("g")
    pm = new_plugin_manager()
    pm.register(Adds())
    pm.hook.gridgate_register_commands(cli=group)
    assert CliRunner().invoke(group, ["hello"]).output == "hello from a plugin\n"


def test_gridgate_iteration_started_and_finished_see_the_same_iteration() -> None:
    seen: list[tuple[str, int]] = []

    class Watch:
        @hookimpl
        def gridgate_iteration_started(self, iteration):
            seen.append(("started", iteration.number))

        @hookimpl
        def gridgate_iteration_finished(self, summary):
            seen.append(("finished", summary.number))

    director = director_with(ScriptedBackend(1, {"s0": "fake-ok"}), Watch(), servers=1, pilots=1)
    director.run_iteration()
    director.run_iteration()
    assert seen == [("started", 1), ("finished", 1), ("started", 2), ("finished", 2)]
    director.close()


def test_gridgate_iteration_finished_summary_counts_every_attempt() -> None:
    summaries = []

    class Watch:
        @hookimpl
        def gridgate_iteration_finished(self, summary):
            summaries.append(summary)

    director = director_with(
        ScriptedBackend(2, {"s0": "fake-fail", "s1": "fake-ok"}),
        Watch(),
        servers=2,
        pilots=7,
        max_threads=1,
    )
    director.run_iteration()
    # 7 submissions, and one retry on s1 of the one that failed on s0
    assert len(summaries[0].records) == 8
    assert [r.attempt for r in summaries[0].records].count(2) == 1
    director.close()


def test_gridgate_demand_adds_to_the_static_demand() -> None:
    from gridgate.core.model import SubmitRequest

    class More:
        @hookimpl
        def gridgate_demand(self, iteration, demand):
            demand.add(SubmitRequest(backend=BACKEND, group="extra", count=2), times=2)

    director = director_with(ScriptedBackend(1, {"s0": "fake-ok"}), More(), servers=1, pilots=1)
    records = director.run_iteration().records
    assert sorted(r.group for r in records) == ["default", "extra", "extra", "extra", "extra"]
    director.close()


def test_gridgate_backend_info_bulk_size_splits_demand() -> None:
    backend = ScriptedBackend(1, {"s0": "fake-ok"}, pilots_per_submission=4)
    director = director_with(backend, servers=1, pilots=10)
    records = director.run_iteration().records
    assert sorted(r.pilots for r in records) == [2, 4, 4]
    director.close()


def test_gridgate_backend_info_missing_backend_is_skipped_not_crashed() -> None:
    director = director_with(servers=1, pilots=3)  # no plugin knows the testbed backend
    records = director.run_iteration().records
    assert [r.outcome for r in records] == ["skipped"] and records[0].failure_kind == "no_backend"
    director.close()


def test_gridgate_select_endpoint_custom_choice_and_only_usable_candidates() -> None:
    offered: list[list[str]] = []

    class Last:
        @hookimpl
        def gridgate_select_endpoint(self, candidates, request):
            offered.append([c.name for c in candidates])
            return candidates[-1]

    backend = ScriptedBackend(3, {"s2": "fake-fail", "s0": "fake-ok", "s1": "fake-ok"})
    director = director_with(backend, Last(), pilots=3, max_threads=1)
    director.run_iteration()
    assert backend.calls == ["s2", "s1", "s1", "s1"]  # the failed one was retried on s1
    assert offered[1] == ["s0", "s1"]  # s2 excluded after its failure
    director.close()


def test_gridgate_select_endpoint_default_is_uniform_random() -> None:
    backend = ScriptedBackend(4, {f"s{i}": "fake-ok" for i in range(4)})
    director = director_with(backend, servers=4, pilots=400)
    set_director(director, "pilots", "max_waiting", value=None)  # the choice, not the limit
    director.run_iteration()
    counts = [backend.calls.count(f"s{i}") for i in range(4)]
    assert all(60 <= c <= 140 for c in counts), counts  # 100 expected each; 6 sigma is ~52
    director.close()


def test_gridgate_admit_refusal_is_counted_not_escalated() -> None:
    class Refuse:
        @hookimpl
        def gridgate_admit(self, request):
            assert request.endpoint is not None and request.category == "submission"
            return Refusal(issuer="test", reason="busy")

    backend = ScriptedBackend(2)
    collector = Collector()
    director = director_with(backend, Refuse(), collector, servers=2, pilots=3)
    summary = director.run_iteration()
    assert [r.outcome for r in summary.records] == ["refused"] * 3
    assert backend.calls == [] and collector.notes == [] and summary.excluded == ()
    director.close()


def test_gridgate_release_once_per_grant_even_when_the_backend_crashes() -> None:
    released: list[str] = []

    class Tokens:
        def __init__(self) -> None:
            self.n = 0

        @hookimpl
        def gridgate_admit(self, request):
            self.n += 1
            return Grant(issuer="tokens", token=f"t{self.n}")

        @hookimpl
        def gridgate_release(self, grant):
            if grant.issuer == "tokens":
                released.append(grant.token)

    class Crashes:
        @hookimpl(tryfirst=True)
        def gridgate_submit(self, endpoint, request, timeout):
            raise RuntimeError("plugin bug")

    director = director_with(
        ScriptedBackend(1), Tokens(), Crashes(), servers=1, pilots=3, max_threads=1
    )
    records = director.run_iteration().records
    assert sorted(released) == ["t1", "t2", "t3"]
    assert {r.failure_kind for r in records} == {"plugin_error"}
    director.close()


def test_gridgate_list_match_failure_is_a_list_match_error_and_empty_is_no_match() -> None:
    class FirstUsable:  # deterministic: s0 first, then s1 once s0 is excluded
        @hookimpl
        def gridgate_select_endpoint(self, candidates, request):
            return candidates[0]

    backend = MatchingBackend(2, broken={"s0"}, empty={"s1"})
    collector = Collector()
    director = director_with(backend, collector, FirstUsable(), servers=2, pilots=4, max_threads=1)
    director.config.data["demand"]["static"][BACKEND] = [
        {"group": "g", "pilots": 4, "list_match": True, "requirements": "", "attributes": {}}
    ]
    outcomes = [r.outcome for r in director.run_iteration().records]
    # the submission whose list-match failed on s0 is retried on s1, where nothing matches
    assert outcomes.count("failed") == 1 and outcomes.count("no_match") == 4
    assert backend.calls == []  # nothing submitted where nothing matched
    assert collector.notes[0].subject == "s0: error executing List Match [error]"
    director.close()


def test_gridgate_submit_result_job_ids_are_recorded() -> None:
    director = director_with(ScriptedBackend(1, {"s0": "ok"}), servers=1, pilots=2)
    records = director.run_iteration().records
    assert all(r.job_ids and r.job_ids[0].startswith("job-") for r in records)
    director.close()


def test_gridgate_classify_failure_plugin_kind_wins_over_the_default() -> None:
    class Kind:
        @hookimpl
        def gridgate_classify_failure(self, endpoint, result):
            return Failure(kind="custom", exclude=False, notify=False)

    director = director_with(ScriptedBackend(1, {"s0": "fake-fail"}), Kind(), servers=1, pilots=3)
    summary = director.run_iteration()
    assert {r.failure_kind for r in summary.records} == {"custom"}
    assert summary.excluded == ()  # exclude=False keeps the server in rotation
    director.close()


def test_gridgate_classify_failure_default_rules_from_config() -> None:
    from gridgate.core.config import validate_document

    doc = {
        "state": {"driver": "memory"},
        "demand": {"static": {BACKEND: 1}},
        "classifiers": {
            "rules": {"rules": [{"kind": "opfail", "pattern": "Operation failed", "notify": False}]}
        },
    }
    collector = Collector()
    director = Director(
        validate_document(doc),
        extra_plugins=[ScriptedBackend(1, {"s0": "fake-fail"}), collector],
        state=MemoryState(),
    )
    records = director.run_iteration().records
    assert records[0].failure_kind == "opfail" and collector.notes == []
    director.close()


def test_gridgate_escalate_plugin_decides_the_level() -> None:
    class AlwaysAlarm:
        @hookimpl
        def gridgate_escalate(self, endpoint, failure, result):
            return Escalation(level="alarm", episode_start=0.0, failures=9)

    collector = Collector()
    director = director_with(
        ScriptedBackend(1, {"s0": "fake-fail"}), AlwaysAlarm(), collector, servers=1, pilots=1
    )
    director.run_iteration()
    assert collector.levels() == ["alarm"] and collector.notes[0].failures_in_episode == 9
    director.close()


def test_gridgate_escalate_is_told_the_episode_the_director_counted() -> None:
    episodes = []

    class Records:
        @hookimpl
        def gridgate_escalate(self, endpoint, failure, result, episode):
            episodes.append(episode)

    director = director_with(
        ScriptedBackend(1, {"s0": "fake-fail"}), Records(), servers=1, pilots=1
    )
    clock = director.clock
    assert isinstance(clock, FakeClock)
    start = clock.time()
    director.run_iteration()
    assert episodes == [Episode(start=start, failures=1, entered=True)]
    assert director.failing.contains(Endpoint(BACKEND, "s0"))  # before the plugin was asked
    clock.advance(3601)  # out of the failing cache (failing_expiry), in the same episode
    director.run_iteration()
    assert episodes[-1] == Episode(start=start, failures=2, entered=True)
    director.close()


def test_gridgate_notify_reaches_every_notifier() -> None:
    first, second = Collector(), Collector()
    director = director_with(
        ScriptedBackend(1, {"s0": "fake-fail"}), first, second, servers=1, pilots=1
    )
    director.run_iteration()
    assert first.levels() == second.levels() == ["error"]
    director.close()


def test_gridgate_submission_finished_once_per_attempt() -> None:
    rows = []

    class Count:
        @hookimpl
        def gridgate_submission_finished(self, record):
            rows.append(record.outcome)

    director = director_with(
        ScriptedBackend(2, {"s0": "fake-fail", "s1": "fake-ok"}),
        Count(),
        servers=2,
        pilots=5,
        max_threads=1,
    )
    director.run_iteration()
    assert len(rows) == 6 and rows.count("failed") == 1  # the failed one was retried
    director.close()


def test_gridgate_select_endpoint_round_robin_takes_servers_in_turn() -> None:
    from gridgate.core.config import validate_document

    doc = {
        "state": {"driver": "memory"},
        "demand": {"static": {BACKEND: 9}},
        "director": {"max_threads": 1},
        "selectors": {"round_robin": {}},
    }
    backend = ScriptedBackend(3, {f"s{i}": "fake-ok" for i in range(3)})
    director = Director(validate_document(doc), extra_plugins=[backend], state=MemoryState())
    director.run_iteration()
    assert backend.calls == ["s0", "s1", "s2"] * 3
    director.close()


class StatusOrder(Order):
    @hookimpl(tryfirst=True)
    def gridgate_job_status(self, endpoint, job_ids, timeout):
        self.log("job_status")

    @hookimpl(tryfirst=True)
    def gridgate_cancel(self, endpoint, job_ids, timeout):
        self.log("cancel")


def test_gridgate_job_status_one_bulk_call_per_endpoint_under_a_query_grant_before_submitting() -> (
    None
):
    order = StatusOrder()
    backend = TrackingBackend(2)
    director = director_with(backend, order, servers=2, pilots=7)
    director.run_iteration()
    order.events.clear()
    director.run_iteration()
    first = order.events.index("job_status")
    # admitted (query), run, released, all before the first submission of the iteration
    assert order.events[first - 1] == "admit" and order.events[first + 1] == "release"
    assert order.events.count("job_status") == 2
    assert max(i for i, e in enumerate(order.events) if e == "job_status") < order.events.index(
        "submit"
    )
    calls = dict(backend.status_calls)
    assert sorted(calls) == ["s0", "s1"] and sum(len(ids) for ids in calls.values()) == 7
    assert director.state.pilot_registry().counts()  # the answers were recorded
    director.close()


def test_gridgate_cancel_for_pilots_past_max_wait_time_after_their_poll() -> None:
    order = StatusOrder()
    backend = TrackingBackend(1)
    director = director_with(backend, order, servers=1, pilots=2)
    set_director(director, "pilots", "max_wait_time", value=60)
    director.run_iteration()
    director.config.data["demand"]["static"][BACKEND] = 0
    director.clock.advance(61)
    order.events.clear()
    director.run_iteration()
    assert order.events[order.events.index("job_status") :] == [
        "job_status",
        "release",
        "admit",
        "cancel",
        "release",
        "iteration_finished",
    ]
    ((endpoint, ids),) = backend.cancel_calls
    assert endpoint == "s0" and len(ids) == 2
    assert {p.state for p in director.state.pilot_registry().query()} == {"cancelled"}
    director.close()
