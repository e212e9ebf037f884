"""The director's closed loop: pilots are tracked, polled in bulk, bounded by max_waiting /
max_total, cancelled past max_wait_time, and an endpoint whose pilots abort leaves rotation."""

from __future__ import annotations

import json
from dataclasses import replace

from support.director import BACKEND, TrackingBackend, config, set_director

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director, summary_json
from gridgate.core.engine.limits import PilotRoom
from gridgate.core.model import Endpoint, Grant, Refusal
from gridgate.core.state import MemoryPilots
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.sqlite import SqliteState
from gridgate.core.testing import Collector, stand_in_command


def make(
    backend: TrackingBackend,
    *extra,
    pilots: int = 6,
    state=None,
    clock=None,
    command_timeout: float = 5,
    failing_expiry: float = 3600,
    ticket_expiry: float = 3600,
    **settings,
):
    """A director on the tracking test backend; ``settings`` go to director.pilots."""
    clock = clock or FakeClock()
    cfg = config(
        servers=len(backend.endpoints),
        pilots=pilots,
        command_timeout=command_timeout,
        failing_expiry=failing_expiry,
        ticket_expiry=ticket_expiry,
    )
    cfg.data["director"]["pilots"].update(settings)
    collector = Collector()
    director = Director(
        cfg,
        clock=clock,
        extra_plugins=[backend, collector, *extra],
        state=state if state is not None else MemoryState(clock=clock),
    )
    director.collector = collector  # type: ignore[attr-defined]
    return director


def registry(director):
    return director.state.pilot_registry()


def states(director, endpoint=None):
    out = {}
    for (_b, e, s), n in registry(director).counts().items():
        if endpoint is None or e == endpoint:
            out[s] = out.get(s, 0) + n
    return out


def test_submitted_pilots_are_tracked_then_polled_in_one_call_per_endpoint():
    backend = TrackingBackend(servers=2)
    director = make(backend, pilots=10)
    director.run_iteration()
    assert states(director) == {"waiting": 10}
    assert backend.status_calls == []  # nothing was tracked when the iteration began
    backend.move("s0", "running")
    backend.config = None
    summary = director.run_iteration()
    per_endpoint = sorted(name for name, _ids in backend.status_calls)
    assert per_endpoint == ["s0", "s1"]  # one call per endpoint, with all its pilots
    s0_ids = dict(backend.status_calls)["s0"]
    assert len(s0_ids) == sum(1 for n in backend.calls[:10] if n == "s0")
    assert states(director, "s0").get("running") == len(s0_ids)
    doc = json.loads(summary_json(summary))
    assert {p["endpoint"]: p["pilots"] for p in doc["pilots"]["polls"]} == {
        "s0": len(s0_ids),
        "s1": 10 - len(s0_ids),
    }
    assert doc["pilots"]["states"][f"{BACKEND}/s0"]["running"] == len(s0_ids)
    director.close()


def test_status_interval_spaces_polls_and_a_backend_can_override_it():
    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=2, clock=clock, status_interval=300)
    director.run_iteration()
    director.run_iteration()  # polls (first poll of the endpoint)
    director.run_iteration()  # not due
    assert len(backend.status_calls) == 1
    clock.advance(301)
    director.run_iteration()
    assert len(backend.status_calls) == 2
    set_director(director, "pilots", "backends", value={BACKEND: {"status_interval": 10}})
    clock.advance(11)
    director.run_iteration()
    assert len(backend.status_calls) == 3
    director.close()


def test_forgotten_pilot_goes_unknown_then_lost_after_the_configured_time():
    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=3, clock=clock, lost_after=600)
    director.run_iteration()
    director.config.data["demand"]["static"][BACKEND] = 0
    (gone,) = backend.move("s0", "forget", 1)
    director.run_iteration()
    pilot = registry(director).get(BACKEND, "s0", gone)
    assert pilot.state == "unknown" and pilot.reason == "no longer known to the backend"
    clock.advance(599)
    director.run_iteration()
    assert registry(director).get(BACKEND, "s0", gone).state == "unknown"
    clock.advance(2)
    director.run_iteration()
    lost = registry(director).get(BACKEND, "s0", gone)
    assert lost.state == "lost" and "601 s" in lost.reason
    assert states(director) == {"waiting": 2, "lost": 1}
    director.close()


def test_failed_status_query_is_a_server_failure_and_pilots_keep_their_state():
    backend = TrackingBackend(servers=2)
    director = make(backend, pilots=6)
    director.run_iteration()
    backend.move("s0", "running")
    backend.move("s1", "running")
    backend.status_mode["s0"] = "fail"
    summary = director.run_iteration()
    assert states(director, "s0") == {"waiting": backend.count("s0", "running")}
    assert states(director, "s1")["running"] == backend.count("s1", "running")
    assert f"{BACKEND}/s0" in summary.excluded
    assert director.failing.contains(Endpoint(BACKEND, "s0"))
    (failure,) = [f for f in summary.failures if f.endpoint == "s0"]
    assert failure.operation == "Job Status" and failure.kind != ""
    (note,) = director.collector.notes
    assert note.level == "error" and note.subject == "s0: error executing Job Status [error]"
    assert "Unable to connect" in note.body
    # this iteration's submissions all went to the server still in rotation
    assert {r.endpoint for r in summary.records if r.outcome == "submitted"} == {"s1"}
    director.close()


def test_status_query_goes_through_admission_as_a_query_and_a_refusal_skips_it():
    class Gate:
        def __init__(self):
            self.asked, self.released, self.refuse = [], [], False

        @hookimpl(tryfirst=True)
        def gridgate_admit(self, request):
            self.asked.append((request.category, request.opcode, request.size))
            if self.refuse and request.category == "query":
                return Refusal(issuer="gate", reason="too many queries")
            return Grant(issuer="gate", token=f"t{len(self.asked)}")

        @hookimpl
        def gridgate_release(self, grant):
            self.released.append(grant.token)

    gate = Gate()
    backend = TrackingBackend(servers=1)
    director = make(backend, gate, pilots=2)
    director.run_iteration()
    director.run_iteration()
    assert ("query", "JOB_STATUS", 2) in gate.asked
    assert len(gate.released) == len(gate.asked)
    gate.refuse = True
    calls = len(backend.status_calls)
    director.run_iteration()
    assert len(backend.status_calls) == calls  # refused: not run, not a failure
    assert director.collector.notes == []
    director.close()


def test_real_status_command_killed_at_the_deadline_is_a_timeout_failure(tmp_path):
    hang = stand_in_command(tmp_path / "bin", "job-status", stdout="s0.1 running\n", sleep=60)
    backend = TrackingBackend(servers=1)
    backend.status_mode["s0"] = "command"
    backend.status_command = [str(hang)]
    director = make(backend, pilots=2, command_timeout=1)
    director.run_iteration()
    summary = director.run_iteration()
    (failure,) = summary.failures
    assert failure.timed_out is True and failure.operation == "Job Status"
    assert failure.command[0] == str(hang) and len(failure.command) == 3  # both ids, one command
    assert len(hang.calls()) == 1
    assert states(director) == {"waiting": 2}
    assert "timeout executing Job Status" in director.collector.notes[0].subject
    director.close()


def test_max_waiting_trims_demand_and_a_queue_full_of_idle_pilots_gets_none():
    backend = TrackingBackend(servers=2)
    director = make(backend, pilots=10, max_waiting=3)
    first = director.run_iteration()
    assert states(director) == {"waiting": 6}
    assert backend.count("s0", "waiting") == 3 and backend.count("s1", "waiting") == 3
    doc = json.loads(summary_json(first))
    assert doc["pilots"]["trimmed"] == {BACKEND: {"max_waiting": 4}}
    trimmed = [r for r in first.records if r.failure_kind == "max_waiting"]
    assert sum(r.pilots for r in trimmed) == 4
    second = director.run_iteration()
    assert not [r for r in second.records if r.outcome == "submitted"]
    assert json.loads(summary_json(second))["pilots"]["trimmed"] == {BACKEND: {"max_waiting": 10}}
    backend.move("s0", "running", 2)
    third = director.run_iteration()
    assert [(r.endpoint, r.pilots) for r in third.records if r.outcome == "submitted"] == [
        ("s0", 1)
    ] * 2
    assert backend.count("s0", "waiting") == 3
    director.close()


def test_a_server_whose_last_room_went_to_another_thread_sends_the_pilot_elsewhere(monkeypatch):
    """Between the director's check for room and its reservation another submission thread
    may take the last of a server's room: the pilot then goes to a server that still has some,
    it is not dropped. The interleaving is made certain here: the selector (a real hook
    implementation) takes all of s0's room just before it picks s0."""
    made: list[PilotRoom] = []
    original = PilotRoom.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(PilotRoom, "__init__", recording)

    class Racing:
        raced = False

        @hookimpl(tryfirst=True)
        def gridgate_select_endpoint(self, candidates, request):
            first = candidates[0]
            if not self.raced and first.name == "s0":
                self.raced = True
                taken = made[-1].reserve(first, replace(request, count=10))
                assert taken is not None and taken.count == 3  # all of s0's room
                return first
            return None

    backend = TrackingBackend(servers=2)
    director = make(backend, Racing(), pilots=2, max_waiting=3)
    summary = director.run_iteration()
    director.close()
    assert [r.outcome for r in summary.records] == ["submitted"] * len(summary.records)
    assert sum(r.pilots for r in summary.records) == 2
    assert backend.count("s0", "waiting") == 0 and backend.count("s1", "waiting") == 2


def test_per_endpoint_override_and_max_total_per_backend():
    backend = TrackingBackend(servers=3)
    director = make(
        backend,
        pilots=30,
        max_waiting=5,
        backends={BACKEND: {"max_total": 12, "endpoints": {"s2": {"max_waiting": 1}}}},
    )
    summary = director.run_iteration()
    assert backend.count("s2", "waiting") <= 1
    assert sum(backend.count(f"s{i}", "waiting") for i in range(3)) == 11  # 5 + 5 + 1 < 12
    set_director(director, "pilots", "backends", BACKEND, "max_total", value=8)
    backend.move("s0", "running")  # room under max_waiting, but the backend holds 11 already
    summary = director.run_iteration()
    assert not [r for r in summary.records if r.outcome == "submitted"]
    assert json.loads(summary_json(summary))["pilots"]["trimmed"] == {BACKEND: {"max_total": 30}}
    director.close()


def test_bulk_submissions_reserve_room_per_endpoint():
    backend = TrackingBackend(servers=2, pilots_per_submission=4)
    director = make(backend, pilots=20, max_waiting=6)
    summary = director.run_iteration()
    # bulks of 4 into rooms of 6: a bulk shortened to a server's last 2 sends its other 2 to
    # the other server, so both fill and nothing that fits is dropped
    assert backend.count("s0", "waiting") == 6 and backend.count("s1", "waiting") == 6
    assert states(director) == {"waiting": 12}
    assert json.loads(summary_json(summary))["pilots"]["trimmed"] == {BACKEND: {"max_waiting": 8}}
    assert sum(r.pilots for r in summary.records) == 20  # every pilot accounted once
    director.close()


def test_max_wait_time_cancels_pilots_waiting_too_long():
    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=3, clock=clock, max_wait_time=3600)
    director.run_iteration()
    director.config.data["demand"]["static"][BACKEND] = 0
    backend.move("s0", "running", 1)
    clock.advance(3601)
    summary = director.run_iteration()
    assert len(backend.cancel_calls) == 1 and len(backend.cancel_calls[0][1]) == 2
    assert states(director) == {"running": 1, "cancelled": 2}
    cancelled = registry(director).query(states=["cancelled"])
    assert all("max_wait_time" in p.reason for p in cancelled)
    assert json.loads(summary_json(summary))["pilots"]["cancelled"] == {f"{BACKEND}/s0": 2}
    director.close()


def test_cancel_goes_through_admission_as_other():
    class Gate:
        categories: list[str] = []

        @hookimpl(tryfirst=True)
        def gridgate_admit(self, request):
            self.categories.append(request.category)
            return Grant(issuer="gate")

    clock = FakeClock()
    gate = Gate()
    backend = TrackingBackend(servers=1)
    director = make(backend, gate, pilots=1, clock=clock, max_wait_time=10)
    director.run_iteration()
    clock.advance(11)
    director.config.data["demand"]["static"][BACKEND] = 0
    director.run_iteration()
    assert gate.categories == ["submission", "query", "other"]
    director.close()


def _abort(
    backend, director, endpoint, n, state="failed", reason="BrokerHelper: no compatible resources"
):
    backend.move(endpoint, "running", n, only="waiting")
    return backend.move(endpoint, state, n, reason=reason, only="running")


def test_endpoint_whose_pilots_abort_leaves_rotation_with_one_error_then_an_alarm():
    clock = FakeClock()
    backend = TrackingBackend(servers=2)
    director = make(backend, pilots=24, clock=clock, failing_expiry=3600, ticket_expiry=3600)
    director.run_iteration()
    on_s0 = backend.count("s0", "waiting")
    assert on_s0 >= 10
    _abort(backend, director, "s0", on_s0)
    _abort(backend, director, "s1", 10, state="done", reason="")
    summary = director.run_iteration()  # the first poll that sees the failures
    assert f"{BACKEND}/s0" in summary.excluded
    assert json.loads(summary_json(summary))["pilots"]["aborted"] == [f"{BACKEND}/s0"]
    assert {r.endpoint for r in summary.records if r.outcome == "submitted"} <= {"s1"}
    (note,) = director.collector.notes
    assert note.level == "error" and note.failure.kind == "aborted"
    assert "s0" in note.subject
    assert f"Pilots: {on_s0} failed, 0 done" in note.body
    assert "BrokerHelper: no compatible resources" in note.body
    for _ in range(3):  # it stays out: no new verdict, no new mail
        assert f"{BACKEND}/s0" not in {r.endpoint for r in director.run_iteration().records}
    assert director.collector.levels() == ["error"]
    clock.advance(3601)  # back in rotation; every new pilot there aborts too
    set_director(director, "pilots", "max_waiting", value=12)
    director.run_iteration()
    _abort(backend, director, "s0", backend.count("s0", "waiting"))
    director.run_iteration()
    assert director.collector.levels() == ["error", "alarm"]
    assert "failing at least for" in director.collector.notes[-1].body
    director.close()


def test_healthy_endpoint_with_some_failures_stays_in_rotation():
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=20)
    director.run_iteration()
    _abort(backend, director, "s0", 10)  # 10 of 20 failed: not above the default 50 %
    backend.move("s0", "done", 10, only="waiting")
    summary = director.run_iteration()
    assert summary.excluded == () and director.collector.notes == []
    director.close()


def test_director_restarted_mid_run_keeps_tracking_with_sqlite(tmp_path):
    clock = FakeClock()
    backend = TrackingBackend(servers=2)
    path = str(tmp_path / "state.db")
    first = make(
        backend,
        pilots=8,
        clock=clock,
        state=SqliteState({"path": path}, clock=clock),
        max_waiting=4,
    )
    first.run_iteration()
    first.close()
    first.state.close()
    backend.move("s0", "running")
    second = make(
        backend,
        pilots=8,
        clock=clock,
        state=SqliteState({"path": path}, clock=clock),
        max_waiting=4,
    )
    summary = second.run_iteration()
    assert sorted(len(ids) for _e, ids in backend.status_calls) == [4, 4]  # the first one's pilots
    assert states(second) == {"running": 4, "waiting": 8}
    assert [r.endpoint for r in summary.records if r.outcome == "submitted"] == ["s0"] * 4
    second.close()
    second.state.close()


def test_terminal_pilots_are_pruned_after_keep_finished():
    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=2, clock=clock, keep_finished=1000)
    director.run_iteration()
    director.config.data["demand"]["static"][BACKEND] = 0
    backend.move("s0", "done")
    director.run_iteration()
    assert states(director) == {"done": 2}
    clock.advance(1001)
    director.run_iteration()
    assert states(director) == {}
    director.close()


def test_tracking_off_submits_untracked():
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=2, track=False, max_waiting=0)
    director.run_iteration()
    director.run_iteration()
    assert backend.status_calls == [] and states(director) == {}
    assert backend.count("s0", "waiting") == 4
    director.close()


def test_a_registry_that_fails_keeps_the_limits_on_own_submissions_and_writes_them_back():
    """Item 8 of issue 21: while the registry fails the limits apply to the last known counts
    plus this process's own submissions (fail closed), which are written back when it returns.
    Before: every iteration submitted its whole demand untrimmed, and nothing was recorded."""
    from gridgate.core.state import StateError

    class Flaky(MemoryState):
        down = True

        def pilot_registry(self):
            if self.down:
                raise StateError("redis state at redis://x: cannot read pilots: Connection refused")
            return super().pilot_registry()

    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    store = Flaky(clock=clock)
    director = make(backend, pilots=4, clock=clock, state=store, max_waiting=3)
    submitted = []
    for _ in range(3):
        summary = director.run_iteration()
        submitted.append(sum(r.pilots for r in summary.records if r.outcome == "submitted"))
    assert submitted == [3, 0, 0]
    assert backend.status_calls == []
    store.down = False
    summary = director.run_iteration()
    assert sum(r.pilots for r in summary.records if r.outcome == "submitted") == 0
    assert states(director) == {"waiting": 3}  # written back, then polled
    assert len(backend.status_calls) == 1
    director.close()


def test_settings_resolve_endpoint_then_backend_then_director():
    from gridgate.core.engine.limits import PilotSettings
    from gridgate.core.model import Endpoint

    settings = PilotSettings.of(
        {
            "max_waiting": 50,
            "status_interval": 300,
            "backends": {"slurm": {"max_waiting": 10, "endpoints": {"debug": {"max_waiting": 2}}}},
        }
    )
    assert settings.for_endpoint(Endpoint("slurm", "debug"), "max_waiting") == 2
    assert settings.for_endpoint(Endpoint("slurm", "batch"), "max_waiting") == 10
    assert settings.for_endpoint(Endpoint("lsf", "short"), "max_waiting") == 50
    assert settings.for_backend("slurm", "status_interval") == 300
    assert settings.for_backend("slurm", "max_total") is None
    assert settings["abort_window"] == 20 and settings["lost_after"] == 3600


def test_a_store_that_is_down_is_not_asked_for_pilots_at_all():
    from gridgate.core.state import StateError

    asked = []

    class Down(MemoryState):
        def _fail(self, *args, **kw):
            asked.append("kv")
            raise StateError("redis state: cannot read: Connection refused")

        add_if_absent = set = get = delete = items = ttl = append_record = records = _fail

        def pilot_registry(self):
            asked.append("pilots")
            raise StateError("redis state: cannot read pilots: Connection refused")

    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=3, clock=clock, state=Down(clock=clock))
    summary = director.run_iteration()
    assert sum(r.pilots for r in summary.records if r.outcome == "submitted") == 3
    assert director.state.degraded and "pilots" not in asked
    director.close()


def test_a_backend_that_reports_no_states_is_not_blocked_by_max_waiting():
    from support.director import ScriptedBackend

    backend = ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})  # no gridgate_job_status
    director = make(backend, pilots=4, max_waiting=1)
    first = director.run_iteration()
    # no plugin implements gridgate_job_status at all: not limited from the first iteration
    assert sum(r.pilots for r in first.records if r.outcome == "submitted") == 4
    polls = []
    for _ in range(2):
        summary = director.run_iteration()
        assert sum(r.pilots for r in summary.records if r.outcome == "submitted") == 4
        assert summary.pilots is not None
        polls.append([p.outcome for p in summary.pilots.polls])
    # asked once per endpoint; after that its pilots are not even read (until plugins change)
    # (the endpoints are polled in parallel: the second may already know the backend's answer)
    assert set(polls[0]) == {"unsupported"} and polls[1] == []
    assert states(director) == {"waiting": 12}
    director.close()


def test_a_backend_that_reports_no_states_beside_one_that_does_is_limited_until_it_says_so():
    from support.director import ScriptedBackend

    class OtherBackend:  # implements gridgate_job_status, for its own backend only
        @hookimpl
        def gridgate_job_status(self, endpoint, job_ids, timeout):
            return None  # not one of mine

    quiet = ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})  # no gridgate_job_status
    director = make(quiet, OtherBackend(), pilots=4, max_waiting=1)
    first = director.run_iteration()
    # some plugin could report states: the limit holds until the first poll says it cannot
    assert sum(r.pilots for r in first.records if r.outcome == "submitted") == 2
    second = director.run_iteration()
    assert sum(r.pilots for r in second.records if r.outcome == "submitted") == 4
    director.close()


def test_demand_with_every_server_out_of_rotation_is_not_counted_as_trimmed():
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=3, max_waiting=5)
    director.failing.enter(Endpoint(BACKEND, "s0"), "error")
    summary = director.run_iteration()
    assert json.loads(summary_json(summary))["pilots"]["trimmed"] == {}
    assert {r.failure_kind for r in summary.records} == {"no_endpoint"}
    director.close()


def test_a_status_plugin_that_crashes_costs_tracking_not_the_iteration():
    from gridgate.core import hookimpl as impl

    class Crashes:
        @impl(tryfirst=True)
        def gridgate_job_status(self, endpoint, job_ids, timeout):
            raise RuntimeError("bug in a plugin")

    crashes = Crashes()
    backend = TrackingBackend(servers=1)
    director = make(backend, crashes, pilots=2, max_waiting=5)
    director.run_iteration()
    summary = director.run_iteration()
    assert summary.pilots is not None
    assert [p.outcome for p in summary.pilots.polls] == ["plugin_error"]
    assert states(director) == {"waiting": 4}

    def bug(*args):
        raise KeyError("a bug in the tracker itself")

    director.tracker._poll = bug  # the iteration still submits, within the last known counts
    after = director.run_iteration()
    assert sum(r.pilots for r in after.records if r.outcome == "submitted") == 1
    assert after.pilots is not None and after.pilots.polls == ()
    director.close()


def test_two_directors_on_one_store_poll_an_endpoint_once_per_interval(tmp_path):
    clock = FakeClock()
    backend = TrackingBackend(servers=2)
    path = str(tmp_path / "state.db")
    one, two = (
        make(
            backend,
            pilots=4,
            clock=clock,
            state=SqliteState({"path": path}, clock=clock),
            status_interval=300,
        )
        for _ in range(2)
    )
    one.run_iteration()  # submits; nothing tracked yet to poll
    one.run_iteration()
    two.run_iteration()
    assert sorted(e for e, _ids in backend.status_calls) == ["s0", "s1"]  # two found them polled
    clock.advance(301)
    two.run_iteration()
    one.run_iteration()
    assert len(backend.status_calls) == 4
    for d in (one, two):
        d.close()
        d.state.close()


def test_a_demand_trimmed_to_zero_by_limits_that_never_move_counts_toward_the_stall_alarm():
    """Item 2 of issue 21: max_waiting full and the pilots' states frozen (here the status
    polls of s0 fail, so s0 is out of rotation, and s1's pilots never start): after
    stall_iterations polls with no state change, the trimmed demand is a stall. Before: a trim
    never counted, and the director stopped submitting for good without a word."""
    clock = FakeClock()
    backend = TrackingBackend(servers=2)
    director = make(backend, pilots=4, clock=clock, max_waiting=2, failing_expiry=60)
    director.run_iteration()  # 2 on each server
    backend.status_mode["s0"] = "fail"
    notes = []
    for _ in range(8):
        clock.advance(10)
        summary = director.run_iteration()
        assert sum(r.pilots for r in summary.records if r.outcome == "submitted") == 0
        notes += [n for n in summary.notifications if "has submitted no pilot" in n.subject]
    assert [n.level for n in notes] == ["error"]
    assert "skipped/max_waiting" in notes[0].body
    assert "no pilot changed state" in notes[0].body
    # pilots that move are not a stall: one starts, the trim counts no more
    backend.move("s1", "running", 1)  # one starts: room again, a submission ends the stall
    clock.advance(10)
    summary = director.run_iteration()
    assert [n.level for n in summary.notifications if "submitting again" in n.subject] == ["info"]
    director.close()


def test_a_full_queue_whose_pilots_move_is_not_a_stall():
    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=4, clock=clock, max_waiting=2)
    director.run_iteration()
    for i in range(8):
        clock.advance(10)
        # one pilot starts and one finishes each poll: the limit is full but not stuck
        backend.move("s0", "done", 1, only="running")
        backend.move("s0", "running", 1, only="waiting")
        summary = director.run_iteration()
        assert not [n for n in summary.notifications if "has submitted no pilot" in n.subject], i
    director.close()


def test_a_full_site_whose_long_pilots_run_is_not_a_stall():
    """Two pilots run for hours, max_waiting more wait for their slots, the polls answer:
    nothing changes state for many iterations, and that is the limit doing its job, not a
    stall (the real Slurm closed-loop test met the first version of the stuck rule here)."""
    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=4, clock=clock, max_waiting=2)
    director.run_iteration()
    backend.move("s0", "running", 2, only="waiting")
    for i in range(10):
        clock.advance(60)
        summary = director.run_iteration()
        assert not [n for n in summary.notifications if "has submitted no pilot" in n.subject], i
    director.close()


def test_pilots_of_an_endpoint_removed_from_the_config_leave_the_limits_with_a_notice():
    """Item 3 of issue 21: s1 held max_total waiting pilots and is removed from the config: its
    pilots leave the limits (one notice names it), are still polled, and the backend submits to
    s0. Before: they counted against max_total for ever, were never polled, and nothing was said."""
    clock = FakeClock()
    backend = TrackingBackend(servers=2)
    director = make(backend, pilots=4, clock=clock, max_total=4)
    director.run_iteration()
    on_s1 = set(backend.jobs["s1"])
    backend.endpoints = backend.endpoints[:1]  # s1 retired
    summary = director.run_iteration()
    notes = [n for n in summary.notifications if "no longer configured" in n.subject]
    assert len(notes) == 1 and f"{BACKEND}/s1" in notes[0].subject
    assert "--endpoint s1" in notes[0].body
    assert sum(r.pilots for r in summary.records if r.outcome == "submitted") == len(on_s1)
    polled = [set(ids) for name, ids in backend.status_calls if name == "s1"]
    assert polled and polled[-1] == on_s1
    backend.move("s1", "running")
    summary = director.run_iteration()
    assert states(director, "s1") == {"running": len(on_s1)}
    assert not [n for n in summary.notifications if "no longer configured" in n.subject]  # once
    assert f"{BACKEND}/s1" not in summary.excluded
    director.close()


def test_pilots_of_a_removed_endpoint_the_backend_cannot_answer_for_go_lost_after_lost_after():
    clock = FakeClock()
    backend = TrackingBackend(servers=2)
    director = make(backend, pilots=4, clock=clock, lost_after=600)
    director.run_iteration()
    backend.endpoints = backend.endpoints[:1]
    backend.status_mode["s1"] = "fail"
    director.config.data["demand"]["static"][BACKEND] = 0
    summary = director.run_iteration()
    assert summary.excluded == () or f"{BACKEND}/s1" not in summary.excluded  # no server blamed
    assert not [n for n in summary.notifications if n.level != "info"]
    clock.advance(599)
    director.run_iteration()
    assert set(states(director, "s1")) == {"waiting"}
    clock.advance(2)
    director.run_iteration()
    assert set(states(director, "s1")) == {"lost"}
    (pilot, *_) = registry(director).query(BACKEND, "s1")
    assert "no longer configured" in pilot.reason
    director.close()


def test_a_bug_in_the_tracking_keeps_the_limits_on_the_last_known_counts():
    """Item 8's class: the other way the limits failed open. Before: any exception while
    polling sent the whole demand out untrimmed."""
    from gridgate.core.state import MemoryPilots

    class Buggy(MemoryPilots):
        broken = False

        def active(self, backend, endpoint):
            if self.broken:
                raise RuntimeError("a bug in the registry")
            return super().active(backend, endpoint)

    class Store(MemoryState):
        def pilot_registry(self):
            if not hasattr(self, "_buggy"):
                self._buggy = Buggy()
            return self._buggy

    clock = FakeClock()
    backend = TrackingBackend(servers=1)
    store = Store(clock=clock)
    director = make(backend, pilots=4, clock=clock, state=store, max_waiting=5)
    director.run_iteration()
    store.pilot_registry().broken = True
    submitted = [
        sum(r.pilots for r in director.run_iteration().records if r.outcome == "submitted")
        for _ in range(2)
    ]
    assert submitted == [1, 0]
    director.close()


def test_a_cancel_this_machine_cannot_run_is_one_local_fault_told_once():
    """Item 2's class: a cancel (max_wait_time) whose id file cannot be written. Before: logged
    only, nobody told, tried again at every poll."""
    from gridgate.core.model import CancelResult

    class NoSpace(TrackingBackend):
        @hookimpl
        def gridgate_cancel(self, endpoint, job_ids, timeout):
            if endpoint.backend != BACKEND:
                return None
            why = "cannot write the job id file in /state/x-jdl: [Errno 28] No space left on device"
            return CancelResult(endpoint, ok=False, message=why, local_fault=why)

    clock = FakeClock()
    backend = NoSpace(servers=1)
    director = make(backend, pilots=2, clock=clock, max_wait_time=100, max_waiting=2)
    director.run_iteration()
    notes = []
    for _ in range(3):
        clock.advance(101)
        summary = director.run_iteration()
        assert {f.kind for f in summary.failures} == {"local_io"}
        assert summary.excluded == ()
        notes += [n for n in summary.notifications if n.level == "error"]
    assert len(notes) == 1 and "No space left on device" in notes[0].body
    director.close()


def test_a_status_output_cut_by_gridgates_cap_blames_no_server_and_loses_no_pilot(tmp_path):
    """Item 11's class, for every backend: a status command whose output passes
    max_output_bytes (here a real command printing 5 MB, past the runner's 4 MiB cap). Before:
    the cut answer was read as it was, and the pilots past the cut went unknown, then lost (the
    LSF backend instead failed the server: excluded, an error with a false reason)."""
    import sys

    script = tmp_path / "status.py"
    script.write_text(
        "import sys\nfor job in sys.argv[1:]:\n    print(job, 'running')\nprint('x' * 5_000_000)\n",
        encoding="utf-8",
    )
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=3)
    director.run_iteration()
    backend.status_mode["s0"] = "command"
    backend.status_command = [sys.executable, str(script)]
    director.config.data["demand"]["static"][BACKEND] = 0
    notes = []
    for _ in range(2):
        summary = director.run_iteration()
        assert summary.pilots is not None
        assert [p.outcome for p in summary.pilots.polls] == ["output_cap"]
        assert summary.excluded == ()
        assert {f.kind for f in summary.failures} == {"output_cap"}
        notes += [n for n in summary.notifications if n.level == "error"]
    assert states(director) == {"waiting": 3}  # kept, not read from a cut answer
    assert len(notes) == 1 and "gridgate's own output cap" in notes[0].body
    director.close()


def test_a_backend_that_does_not_answer_for_a_removed_endpoint_keeps_its_limits():
    """A backend whose status hook answers None for an endpoint it no longer has (the ARC
    backend forgets a CE with its config) must not be taken for one that cannot report states:
    that would lift max_waiting / max_total on all its endpoints."""

    class Forgets(TrackingBackend):
        @hookimpl(tryfirst=True)
        def gridgate_job_status(self, endpoint, job_ids, timeout):
            if endpoint.backend == BACKEND and endpoint.name not in {
                e.name for e in self.endpoints
            }:
                return None
            return TrackingBackend.gridgate_job_status(self, endpoint, job_ids, timeout)

    clock = FakeClock()
    backend = Forgets(servers=2)
    director = make(backend, pilots=4, clock=clock, max_waiting=2, lost_after=600)
    director.run_iteration()
    backend.endpoints = backend.endpoints[:1]
    summary = director.run_iteration()
    assert summary.pilots is not None
    assert {p.endpoint: p.outcome for p in summary.pilots.polls} == {
        "s0": "ok",
        "s1": "unsupported",
    }
    assert sum(r.pilots for r in summary.records if r.outcome == "submitted") == 0  # s0 full
    clock.advance(601)
    director.run_iteration()
    assert set(states(director, "s1")) == {"lost"}
    director.close()


def test_pilots_of_a_removed_endpoint_still_answered_for_are_not_lost_between_polls():
    clock = FakeClock()
    backend = TrackingBackend(servers=2)
    director = make(backend, pilots=4, clock=clock, status_interval=400, lost_after=600)
    director.run_iteration()
    backend.endpoints = backend.endpoints[:1]
    director.config.data["demand"]["static"][BACKEND] = 0
    clock.advance(400)
    director.run_iteration()  # retired; its pilots polled (ok)
    clock.advance(401)
    director.run_iteration()  # polled again (ok)
    clock.advance(200)  # 1001 s after the retirement notice, 200 s after the last answer
    director.run_iteration()  # not due: no poll, and the backend did answer 200 s ago
    assert set(states(director, "s1")) == {"waiting"}
    director.close()


def test_pilot_settings_are_built_once_per_config_and_anew_for_a_new_one():
    director = make(TrackingBackend(), max_waiting=7)
    tracker = director.tracker
    first = tracker.settings
    assert first is tracker.settings is tracker.retired.settings is director.runtime.settings.pilots
    assert first.max_waiting == 7
    set_director(director, "pilots", "max_waiting", value=3)
    assert tracker.settings is not first and tracker.settings.max_waiting == 3
    director.close()


def test_demand_of_a_backend_whose_credential_is_unusable_is_skipped_for_it_not_trimmed() -> None:
    """Issue 42: with the credential unusable its pilots are not polled, their counts stale,
    and the iteration line and the stall mail blamed max_waiting; the credential is the cause,
    and the demand is skipped as `credential`."""
    from dataclasses import replace as swap

    from support.director import TrackingBackend

    from gridgate.core import hookimpl
    from gridgate.core.model import BackendInfo, CredentialRegistry, CredentialStatus

    class NeedsProxy(TrackingBackend):
        @hookimpl
        def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
            info = super().gridgate_backend_info(backend)
            return None if info is None else swap(info, credentials=("x509",))

    class Proxy:
        usable = True

        @hookimpl
        def gridgate_check_credentials(
            self, iteration: object, timeout: float, credentials: CredentialRegistry
        ) -> None:
            credentials.add(
                CredentialStatus("x509_proxy", "x509", self.usable, "/p.pem", None, "expired")
            )

    clock = FakeClock()
    backend, proxy = NeedsProxy(1), Proxy()
    cfg = config(servers=1, pilots=3, max_threads=1)
    cfg.data["director"]["pilots"]["max_waiting"] = 3
    director = Director(
        cfg,
        clock=clock,
        extra_plugins=[backend, proxy, Collector()],
        state=MemoryState(clock=clock),
    )
    try:
        director.run_iteration()  # 3 pilots wait: max_waiting is full
        proxy.usable = False
        clock.advance(60)
        summary = director.run_iteration()
        kinds = {r.failure_kind for r in summary.records}
        assert kinds == {"credential"}, summary.records
        assert sum(r.pilots for r in summary.records) == 3
    finally:
        director.close()


class _ReadsCounted(MemoryPilots):
    """The memory registry, saying which pilots were read whole and which were written."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []
        self.written: list[str] = []

    def get_many(self, backend, endpoint, job_ids):
        job_ids = list(job_ids)
        self.read += job_ids
        return super().get_many(backend, endpoint, job_ids)

    def put(self, pilots):
        pilots = list(pilots)
        self.written += [p.job_id for p in pilots]
        super().put(pilots)


def test_a_poll_reads_and_writes_only_the_pilots_whose_state_changed():
    clock = FakeClock()
    state = MemoryState(clock=clock)
    counted = state._pilot_registry = _ReadsCounted()
    backend = TrackingBackend(servers=1)
    director = make(backend, pilots=6, state=state, clock=clock)
    director.run_iteration()
    director.config.data["demand"]["static"][BACKEND] = 0
    moved = backend.move("s0", "running", 2)
    counted.read, counted.written = [], []
    director.run_iteration()
    assert len(backend.status_calls[-1][1]) == 6  # every live pilot asked about
    assert sorted(counted.read) == sorted(counted.written) == sorted(moved)
    assert registry(director).get(BACKEND, "s0", moved[0]).native == "RUNNING"
    # nothing changed, or only the backend's words for a state that did not change: no row
    # read, nothing written (a pilot's reason is the one of its last change of state)
    backend.move("s0", "waiting", reason="held by the admin", only="waiting")
    counted.read, counted.written = [], []
    clock.advance(1)
    director.run_iteration()
    assert counted.read == counted.written == []
    assert states(director) == {"waiting": 4, "running": 2}
    director.close()
