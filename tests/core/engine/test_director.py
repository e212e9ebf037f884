"""The director over whole iterations: parallel submission, exclusion, escalation timeline,
accounting, config reloads."""

from __future__ import annotations

import json
import socket
import threading
import warnings
from dataclasses import FrozenInstanceError

import pytest
from support.director import (
    BACKEND,
    MISSING_PROGRAM,
    MatchingBackend,
    ScriptedBackend,
    config,
    set_director,
)

from gridgate.core.clock import FakeClock
from gridgate.core.engine.compose import ALARM_HEADER
from gridgate.core.engine.director import Director, summary_json
from gridgate.core.engine.reload import ConfigSource
from gridgate.core.engine.runtime import ACCOUNTING
from gridgate.core.model import FailureReport, PilotReport, PollReport, RetryReport
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector


def make(
    backend: ScriptedBackend, clock: FakeClock | None = None, **kw
) -> tuple[Director, Collector]:
    collector = Collector()
    clock = clock or FakeClock()
    director = Director(
        config(servers=len(backend.endpoints), **kw),
        clock=clock,
        extra_plugins=[backend, collector],
        state=MemoryState(clock=clock),
    )
    return director, collector


def test_all_healthy_submits_every_pilot_and_accounts_for_each() -> None:
    backend = ScriptedBackend(3)
    director, notes = make(backend, pilots=6)
    summary = director.run_iteration()
    assert [r.outcome for r in summary.records] == ["submitted"] * 6
    assert len({j for r in summary.records for j in r.job_ids}) == 6
    assert notes.notes == []
    rows = director.state.records(ACCOUNTING)
    assert len(rows) == 6 and {r["outcome"] for r in rows} == {"submitted"}
    director.close()


def test_failing_server_is_excluded_for_the_rest_of_the_iteration() -> None:
    backend = ScriptedBackend(3, {"s0": "fail"})
    director, notes = make(backend, pilots=30, max_threads=2)
    summary = director.run_iteration()
    assert backend.calls.count("s0") <= 2  # at most the threads already on their way
    assert summary.excluded == ("testbed/s0",)
    submitted = [r for r in summary.records if r.outcome == "submitted"]
    failed = [r for r in summary.records if r.outcome == "failed"]
    # every failed submission was sent to a healthy server in the same iteration
    assert sum(r.pilots for r in submitted) == 30 and all(r.endpoint != "s0" for r in submitted)
    assert [(e.failed_on, e.outcome) for e in summary.retries] == [("s0", "retried")] * len(failed)
    assert notes.levels() == ["error"]
    note = notes.notes[0]
    assert note.subject == "s0: error executing Job Submit [error]"
    assert (
        "returns: 1" in note.body
        and "Error - Operation failed" in note.body
        and "Connecting" in note.body
    )
    director.close()


def test_hanging_server_is_killed_at_the_deadline_and_reported_as_timeout() -> None:
    backend = ScriptedBackend(2, {"s0": "hang"})
    # 3 s: long enough for a Python child to start and print on a loaded 2-core machine
    director, notes = make(backend, pilots=4, command_timeout=3, max_threads=4)
    summary = director.run_iteration()
    assert "testbed/s0" in summary.excluded
    timeouts = [n for n in notes.notes if n.subject == "s0: timeout executing Job Submit [timeout]"]
    assert len(timeouts) == 1
    assert "started" in timeouts[0].body  # what it printed before it was killed is kept
    assert all(r.duration < 3 + 0.5 + 10 for r in summary.records)  # deadline + grace + slack
    director.close()


def test_every_server_excluded_skips_the_rest_instead_of_hammering() -> None:
    backend = ScriptedBackend(2, {"s0": "fake-fail", "s1": "fake-fail"})
    director, notes = make(backend, pilots=40, max_threads=1)
    summary = director.run_iteration()
    outcomes = [r.outcome for r in summary.records]
    # the first pilot fails on s0, is retried on s1 and fails there too: 39 pilots left to skip
    assert outcomes.count("failed") == 2
    assert outcomes.count("skipped") == 39
    assert len(backend.calls) == 2
    assert [e.outcome for e in summary.retries] == [
        "retried",
        "not retried: no other usable server",
    ]
    director.close()


def test_fifty_threads_failing_at_once_send_one_notification() -> None:
    barrier = threading.Barrier(50)
    backend = ScriptedBackend(1, {"s0": "fake-fail"}, barrier=barrier)
    director, notes = make(backend, pilots=50, max_threads=50)
    set_director(director, "pilots", "max_waiting", value=None)  # all 50 on one server
    summary = director.run_iteration()
    assert [r.outcome for r in summary.records].count("failed") == 50
    assert notes.levels() == ["error"]
    assert notes.notes[0].failures_in_episode >= 1
    director.close()


def test_escalation_timeline_on_an_injected_clock() -> None:
    clock = FakeClock(1_000_000.0)
    backend = ScriptedBackend(1, {"s0": "fake-fail"})
    director, notes = make(
        backend, clock, pilots=1, failing_expiry=3600, ticket_expiry=3600, stall_iterations=100
    )  # one server failing: the stall alarm is test_stall.py's
    start = clock.time()

    def step(advance: float) -> list[str]:
        clock.advance(advance)
        before = len(notes.notes)
        director.run_iteration()
        return [n.level for n in notes.notes[before:]]

    assert step(0) == ["error"]  # first failure: error mail
    assert step(60) == []  # in the failing cache: left alone
    assert step(1800) == []
    assert step(3600) == ["alarm"]  # failing expired, fails again: alarm
    alarm = notes.notes[-1]
    # 60 + 1800 + 3600 s since the first failure: the real time, not a clamped whole hour
    assert alarm.body.startswith(ALARM_HEADER + "\nIt has been failing at least for 1.5 hours\n")
    assert alarm.episode_start == start
    assert step(3601) == ["alarm"]  # still broken: alarm again, not an error
    assert "failing at least for 2.5 hours\n" in notes.notes[-1].body
    assert step(3601) == ["alarm"]
    assert "failing at least for 3.5 hours\n" in notes.notes[-1].body
    backend.behaviour["s0"] = "fake-ok"  # recovery: said once (issue 42)
    assert step(3601) == ["info"]
    assert notes.notes[-1].subject == "gridgate: s0 works again"
    for _ in range(3):
        assert step(3601) == []
    backend.behaviour["s0"] = "fake-fail"  # long after: a new episode starts
    assert step(10) == ["error"]
    assert notes.notes[-1].episode_start == clock.time()
    director.close()


def test_an_alarm_seconds_after_the_first_failure_says_seconds_not_one_hour() -> None:
    clock = FakeClock(1_000_000.0)
    backend = ScriptedBackend(1, {"s0": "fake-fail"})
    director, notes = make(
        backend, clock, pilots=1, failing_expiry=2, ticket_expiry=3600, stall_iterations=100
    )
    director.run_iteration()
    clock.advance(4)
    director.run_iteration()
    assert notes.levels() == ["error", "alarm"]
    assert "It has been failing at least for 4 seconds\n" in notes.notes[-1].body
    clock.advance(20 * 60)
    director.run_iteration()
    assert "It has been failing at least for 20 minutes\n" in notes.notes[-1].body
    director.close()


def test_a_command_that_cannot_start_here_blames_no_server_and_pauses_the_backend() -> None:
    clock = FakeClock()
    backend = ScriptedBackend(3, {f"s{i}": "missing" for i in range(3)})
    director, notes = make(
        backend, clock, pilots=12, max_threads=2, failing_expiry=600, stall_iterations=100
    )
    first = director.run_iteration()
    failed = [r for r in first.records if r.outcome == "failed"]
    skipped = [r for r in first.records if r.outcome == "skipped"]
    assert len(failed) in (1, 2)  # at least one launch, at most the threads already on their way
    assert {r.failure_kind for r in failed} == {"launch"}
    assert len(failed) + len(skipped) == 12 and {r.failure_kind for r in skipped} == {"local_fault"}
    assert first.excluded == ()  # no server blamed...
    counts = director.failing.counts()
    assert counts["failing"] == 0 and counts["tickets"] == 0
    assert len(notes.notes) == 1  # ...and one message about this machine, not one per server
    note = notes.notes[0]
    assert note.level == "error" and note.endpoint is None and note.failure.local
    assert MISSING_PROGRAM in note.subject and "No such file or directory" in note.body
    assert "no server is put in the failing cache" in note.body

    director.run_iteration()  # still broken, same episode: no second message
    assert len(notes.notes) == 1
    clock.advance(601)
    director.run_iteration()  # still broken an episode later: said again, still an error
    assert [n.level for n in notes.notes] == ["error", "error"]

    for server in backend.behaviour:  # fixed: submission resumes at once, every server in use
        backend.behaviour[server] = "ok"
    fixed = director.run_iteration()
    assert [r.outcome for r in fixed.records] == ["submitted"] * 12
    assert {r.endpoint for r in fixed.records} == {"s0", "s1", "s2"}
    director.close()


def test_quiet_kinds_exclude_without_mail() -> None:
    backend = ScriptedBackend(2, {"s0": "fake-fail"})
    director, notes = make(backend, pilots=4, notify_kinds={"error": False})
    summary = director.run_iteration()
    assert "testbed/s0" in summary.excluded
    assert notes.notes == []
    director.close()


def test_list_match_no_resources_is_not_a_failure() -> None:
    backend = MatchingBackend(2, empty={"s0", "s1"})
    director, notes = make(backend, pilots=3)
    director.config.data["demand"]["static"][BACKEND]  # present
    summary = director.run_iteration()
    # the demand did not ask to list-match (backend default False): nothing matched
    assert backend.matches == 0
    assert {r.outcome for r in summary.records} == {"submitted"}
    director.close()


def test_summary_json_has_the_documented_fields() -> None:
    backend = ScriptedBackend(2, {"s0": "fake-fail", "s1": "fake-ok"})
    director, _ = make(backend, pilots=3, max_threads=1)
    doc = json.loads(summary_json(director.run_iteration()))
    for key in (
        "iteration",
        "duration_s",
        "submitted",
        "failures",
        "excluded",
        "skipped",
        "notifications",
    ):
        assert key in doc
    assert doc["excluded"] == ["s0"]
    assert doc["failures"][0]["kind"] == "error" and doc["failures"][0]["returncode"] == 1
    assert doc["notifications"][0]["level"] == "error"
    director.close()


def test_invalid_config_mid_run_is_refused_and_the_last_good_one_stays(write) -> None:
    path = write(
        "site.yaml",
        "state: {driver: memory}\ndirector: {max_threads: 2, cycle_seconds: 0.01}\n"
        "demand: {static: {testbed: 2}}\n",
    )
    backend = ScriptedBackend(2)
    collector = Collector()
    director = Director(ConfigSource(path), extra_plugins=[backend, collector])
    assert len(director.run_iteration().records) == 2
    path.write_text("state: {driver: memory}\ndirector: {max_threads: lots}\n", encoding="utf-8")
    summary = director.run_iteration()
    assert summary.config_error and "director.max_threads" in summary.config_error
    assert len(summary.records) == 2  # old config still in force
    assert [n.level for n in collector.notes] == ["error"]
    assert "refused" in collector.notes[0].subject
    path.write_text(
        "state: {driver: memory}\ndirector: {max_threads: 2}\ndemand: {static: {testbed: 5}}\n",
        encoding="utf-8",
    )
    summary = director.run_iteration()
    assert summary.config_error is None and len(summary.records) == 5
    director.close()


def test_notify_test_command_reports_per_notifier(write, tmp_path) -> None:
    from click.testing import CliRunner

    from gridgate.core.commands.app import cli

    folder = tmp_path / "notes"
    with socket.socket() as busy:  # the running director holds its metrics port
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = write(
            "site.yaml",
            f"director: {{metrics_port: {port}}}\nstate: {{driver: memory}}\n"
            f"notifiers:\n  files: {{folder: {folder}}}\n",
        )
        result = CliRunner().invoke(cli, ["notify", "test", "-c", str(path), "--level", "alarm"])
    assert result.exit_code == 0, result.output
    [note] = folder.glob("*-alarm-gridgate.txt")
    assert f"notifiers:files: written to {note}" in result.output.splitlines()
    assert "notifiers:log: handed over" in result.output
    [text] = [p.read_text() for p in folder.glob("*-alarm-gridgate.txt")]
    assert "Subject: gridgate test alarm notification" in text


def test_the_summary_reports_are_typed_and_the_old_dict_reads_warn_naming_the_attribute() -> None:
    failure = FailureReport("b", "s0", "error", returncode=1, command=("bsub", "-q", "short"))
    retry = RetryReport("b", "default", 1, "s0", "busy", 1, "retried")
    report = PilotReport(
        polls=(PollReport("b", "s0", pilots=3, outcome="ok", commands=1, changed=2),),
        changed=2,
        states={"b/s0": {"waiting": 1, "running": 2}},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the attributes are the API now: no warning
        assert (failure.kind, failure.command, retry.failed_on) == (
            "error",
            ("bsub", "-q", "short"),
            "s0",
        )
        assert report.polls[0].outcome == "ok" and report.states["b/s0"]["running"] == 2
    # API 1.2's readers keep working for one minor release, told what to use instead
    with pytest.warns(DeprecationWarning, match=r"FailureReport\['kind'\] is deprecated.*\.kind"):
        assert failure["kind"] == "error"
    with pytest.warns(DeprecationWarning, match=r"\.command"):
        assert failure.get("command") == ["bsub", "-q", "short"]  # as the dict had it: a list
    with pytest.warns(DeprecationWarning, match=r"RetryReport\['outcome'\].*\.outcome"):
        assert retry["outcome"] == "retried"
    with pytest.warns(DeprecationWarning, match=r"PilotReport\['polls'\].*\.polls"):
        assert report["polls"] == [
            {
                "backend": "b",
                "endpoint": "s0",
                "pilots": 3,
                "outcome": "ok",
                "commands": 1,
                "changed": 2,
            }
        ]
    with pytest.warns(DeprecationWarning, match=r"\.aborted"):
        assert report.get("aborted", None) == []
    assert report.get("blind", "polled") == "polled"  # absent from the old dict: the default
    with pytest.raises(KeyError):
        failure["nope"]
    with pytest.raises(FrozenInstanceError):
        failure.kind = "timeout"  # type: ignore[misc]
