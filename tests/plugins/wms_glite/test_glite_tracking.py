"""Pilot tracking against the stand-in gLite commands as real processes: lifecycles moved by
the stand-ins' clock file (no sleeping), one status command per endpoint for 1 or 5,000 ids,
success / failure / abort on chosen servers, unknown and purged ids, cancel."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.runner import run
from gridgate.plugins.wms_glite.sim import read_calls
from gridgate.plugins.wms_glite.sim.jobs import JobTable, set_clock
from gridgate.plugins.wms_glite.sim.tracking import CANCEL_HEADER, HEADER

H1, H2, H3 = "wms01.example.org", "wms02.example.org", "wms03.example.org"
T0 = 1_800_000_000.0


def ep(host: str) -> Endpoint:
    return Endpoint("wms_glite", host, f"https://{host}:7443/glite_wms_wmproxy_server")


@pytest.fixture
def clock_file(tmp_path: Path) -> Path:
    path = tmp_path / "simclock"
    set_clock(path, T0)
    return path


@pytest.fixture
def tracked(make_backend: Any, scenario: Any, clock_file: Path, tmp_path: Path) -> Any:
    """``tracked(hosts, **config)`` -> (pm, backend); the scenario gets the clock file."""

    def make(hosts: dict[str, Any], ui: str = "glite", **config: Any) -> tuple[Any, Any]:
        pm, backend = make_backend(hosts=hosts, **config)
        # same path as make_backend's scenario: the backend's env already names it
        scenario(hosts=hosts, clock_file=str(clock_file), ui=ui)
        return pm, backend

    return make


def submit(pm: Any, host: str, count: int = 1) -> tuple[str, ...]:
    result = pm.hook.gridgate_submit(
        endpoint=ep(host), request=SubmitRequest("wms_glite", count=count), timeout=20
    )
    assert result.ok, result
    return result.job_ids


def status(pm: Any, host: str, ids: Any, timeout: float = 60) -> Any:
    return pm.hook.gridgate_job_status(endpoint=ep(host), job_ids=list(ids), timeout=timeout)


def status_calls(calls_log: Path) -> list[Any]:
    return [c for c in read_calls(calls_log) if c.command == "glite-wms-job-status"]


def test_lifecycle_success_failure_and_abort_on_chosen_servers(
    tracked: Any, clock_file: Path
) -> None:
    hosts = {
        H1: {"pilots": {"outcome": "done"}},
        H2: {"pilots": {"outcome": "exit", "exit_code": 3}},
        H3: {"pilots": {"outcome": "aborted", "reason": "X509 proxy expired"}},
    }
    pm, _ = tracked(hosts)
    ids = {host: submit(pm, host) for host in hosts}
    first = {host: status(pm, host, ids[host]) for host in hosts}
    assert all(r.ok for r in first.values())
    assert {h: r.statuses[ids[h][0]].native for h, r in first.items()} == {
        H1: "Submitted",
        H2: "Submitted",
        H3: "Submitted",
    }
    set_clock(clock_file, T0 + 4.5)  # Submitted 1 + Waiting 2 + Ready 1: Scheduled
    mid = {h: status(pm, h, ids[h]).statuses[ids[h][0]] for h in hosts}
    assert mid[H1].native == "Scheduled" and mid[H1].state == "waiting"
    assert mid[H3].native == "Aborted" and mid[H3].state == "failed"
    assert mid[H3].reason == "X509 proxy expired"
    set_clock(clock_file, T0 + 7)
    assert status(pm, H1, ids[H1]).statuses[ids[H1][0]].state == "running"
    set_clock(clock_file, T0 + 60)
    done = {h: status(pm, h, ids[h]).statuses[ids[h][0]] for h in hosts}
    assert (done[H1].state, done[H1].native, done[H1].exit_code) == ("done", "Done (Success)", 0)
    assert (done[H2].state, done[H2].native, done[H2].exit_code) == (
        "failed",
        "Done (Exit Code !=0)",
        3,
    )
    assert done[H3].state == "failed"


def test_the_emi_client_spelling(
    tracked: Any, clock_file: Path, sim_bin: Path, sim_env: Any, scenario: Any
) -> None:
    pm, _ = tracked({H1: {"pilots": {"outcome": "done"}}}, ui="emi")
    job = submit(pm, H1)[0]
    set_clock(clock_file, T0 + 60)
    result = status(pm, H1, [job])
    assert result.statuses[job].native == "Done(Success)"
    assert "Current Status:     Done(Success)\n" in result.command.stdout
    set_clock(clock_file, T0 + 1.5)
    assert "Current Status:     Waiting\n" in status(pm, H1, [job]).command.stdout


def test_the_output_is_the_real_layout(tracked: Any, clock_file: Path) -> None:
    pm, _ = tracked({H1: {"pilots": {"outcome": "done"}}})
    job = submit(pm, H1)[0]
    set_clock(clock_file, T0 + 4.5)
    out = status(pm, H1, [job]).command.stdout
    assert (
        len(HEADER) == 74 and HEADER.startswith("=" * 23 + " ") and HEADER.endswith(" " + "=" * 21)
    )
    lines = out.split("\n")
    assert lines[:5] == [
        "",
        HEADER,
        "BOOKKEEPING INFORMATION:",
        "",
        f"Status info for the Job : {job}",
    ]
    assert lines[5] == "Current Status:     Scheduled "  # value at column 21, trailing space
    assert lines[6].startswith("Status Reason:      ")
    assert out.endswith("=" * 74 + "\n\n")


def test_one_status_command_per_endpoint_for_1_or_5000_pilots(
    tracked: Any, tmp_path: Path, calls_log: Path
) -> None:
    pm, _ = tracked({H1: {"pilots": {"outcome": "done"}}})
    one = submit(pm, H1)
    assert status(pm, H1, one).ok
    assert [c.ids for c in status_calls(calls_log)] == [1]
    # 5,000 pilots recorded straight into the stand-in's job table (5,000 submissions would
    # only slow the test); the query still goes through the real command.
    table = JobTable(tmp_path / "simstate")
    many = [f"https://lb01.example.org:9000/Bulk{n:018d}" for n in range(5000)]
    for job_id in many:
        table.add(ep(H1).url, job_id, [], T0)
    result = status(pm, H1, [*one, *many])
    assert result.ok and result.commands == 1
    assert len(result.statuses) == 5001
    assert {s.native for s in result.statuses.values()} == {"Submitted"}
    calls = status_calls(calls_log)
    assert [c.ids for c in calls] == [1, 5001]
    assert [c.host for c in calls] == [H1, H1]


def test_weighted_outcomes_are_spread_evenly_over_a_hosts_jobs(
    tracked: Any, tmp_path: Path, clock_file: Path
) -> None:
    """{done: 9, exit: 1}: one in ten of 200 jobs exits, never two of any five in a row (the
    demo's healthy servers must not look like aborting ones by chance), and another host's
    jobs do not move this host's sequence."""
    pm, _ = tracked({H1: {"pilots": {"outcome": {"done": 9, "exit": 1}}}})
    table = JobTable(tmp_path / "simstate")
    ids = []
    for n in range(200):
        ids.append(f"https://lb01.example.org:9000/Spread{n:018d}")
        table.add(ep(H1).url, ids[-1], [], T0 + n)
        table.add(ep(H2).url, f"https://lb01.example.org:9000/Other{n:018d}", [], T0 + n)
    set_clock(clock_file, T0 + 1000)
    result = status(pm, H1, ids)
    assert result.ok and len(result.statuses) == 200
    failed = [n for n, job in enumerate(ids) if result.statuses[job].state == "failed"]
    assert {result.statuses[job].state for job in ids} == {"done", "failed"}
    assert len(failed) == 20
    assert min(b - a for a, b in itertools.pairwise(failed)) >= 5


def test_unknown_and_purged_ids_are_left_out_with_exit_255(tracked: Any, clock_file: Path) -> None:
    pm, _ = tracked({H1: {"pilots": {"outcome": "done", "purge_after": 100}}})
    old, new = submit(pm, H1)[0], None
    set_clock(clock_file, T0 + 200)  # old finished at T0+16 and was purged at T0+116
    new = submit(pm, H1)[0]
    never = "https://lb01.example.org:9000/NeverNeverNeverNeverNe"
    result = status(pm, H1, [old, new, never])
    assert result.ok and result.command.returncode == 255
    assert set(result.statuses) == {new}
    assert "matching job already purged" in result.command.stderr
    assert "no matching jobs found" in result.command.stderr
    gone = status(pm, H1, [old, never])
    assert gone.ok and gone.command.returncode == 1 and dict(gone.statuses) == {}


def test_a_bookkeeping_server_down_fails_the_query(tracked: Any) -> None:
    pm, _ = tracked({H1: {"pilots": {"status": "lb_down"}}})
    job = submit(pm, H1)[0]
    result = status(pm, H1, [job])
    assert not result.ok and result.command.returncode == 1
    assert "Connection refused" in result.message


def test_a_hanging_status_command_is_killed_at_its_deadline(tracked: Any) -> None:
    pm, _ = tracked({H1: {"pilots": {"status": "hang"}}})
    job = submit(pm, H1)[0]
    result = status(pm, H1, [job], timeout=1.0)
    assert not result.ok and result.command.timed_out


def test_parametric_submission_is_tracked_through_its_nodes(tracked: Any, clock_file: Path) -> None:
    pm, _ = tracked({H1: {"pilots": {"outcome": {"done": 1, "aborted": 1}}}})
    parent = submit(pm, H1, count=3)  # text output: the parent id only
    assert len(parent) == 1
    set_clock(clock_file, T0 + 100)
    result = status(pm, H1, parent)
    assert result.ok
    nodes = set(result.statuses) - set(parent)
    assert len(nodes) == 3
    assert {result.statuses[n].state for n in nodes} <= {"done", "failed"}
    assert result.statuses[parent[0]].native.startswith("Done")


def test_cancel_then_status_shows_cancelled(tracked: Any, clock_file: Path) -> None:
    pm, _ = tracked({H1: {"pilots": {"outcome": "done"}}})
    first, second = submit(pm, H1)[0], submit(pm, H1)[0]
    result = pm.hook.gridgate_cancel(endpoint=ep(H1), job_ids=[first], timeout=20)
    assert result.ok and result.cancelled == (first,)
    assert CANCEL_HEADER in result.command.stdout and len(CANCEL_HEADER) == 88
    assert f"Connecting to the service {ep(H1).url}" in result.command.stdout
    states = status(pm, H1, [first, second]).statuses
    assert (states[first].state, states[first].native) == ("cancelled", "Cancelled")
    assert states[second].state == "waiting"
    set_clock(clock_file, T0 + 60)  # second has finished: cancelling it is refused, an answer
    again = pm.hook.gridgate_cancel(endpoint=ep(H1), job_ids=[second], timeout=20)
    assert again.ok and again.cancelled == ()  # finished, not cancelled: its poll says how
    assert again.command.returncode == 1 and "Cancel not allowed" in again.command.stderr
    assert status(pm, H1, [second]).statuses[second].state == "done"


def test_stand_in_refuses_bad_options_and_missing_files(sim_bin: Path, scenario: Any) -> None:
    env = {**os.environ, "GRIDGATE_SIM_SCENARIO": str(scenario())}
    bad = run([str(sim_bin / "glite-wms-job-status"), "--bogus", "x"], 10, env=env)
    assert bad.returncode == 1
    level = run([str(sim_bin / "glite-wms-job-status"), "-v", "4", "x"], 10, env=env)
    assert level.returncode == 1 and "UI_ARG_OUT_OF_LIMIT" in level.stderr
    missing = run(
        [str(sim_bin / "glite-wms-job-status"), "--noint", "-i", "/nonexistent"], 10, env=env
    )
    assert missing.returncode == 1 and "UI_FILE_NOT_FOUND" in missing.stderr


def test_other_backends_are_not_answered(tracked: Any) -> None:
    pm, _ = tracked({H1: {}})
    other = Endpoint("lsf", "normal")
    assert pm.hook.gridgate_job_status(endpoint=other, job_ids=["1"], timeout=5) is None
    assert pm.hook.gridgate_cancel(endpoint=other, job_ids=["1"], timeout=5) is None
    empty = status(pm, H1, [])
    assert empty.ok and empty.commands == 0


def test_tracking_commands_are_found_beside_a_submit_path_unless_configured(
    make_backend: Any,
) -> None:
    _, backend = make_backend(
        hosts={H1: {}}, commands={"submit": "/opt/glite/bin/glite-wms-job-submit"}
    )
    assert backend.commands()["status"] == "/opt/glite/bin/glite-wms-job-status"
    assert backend.commands()["cancel"] == "/opt/glite/bin/glite-wms-job-cancel"
    _, named = make_backend(hosts={H1: {}}, commands={"status": "/usr/local/bin/my-status"})
    assert named.commands()["status"] == "/usr/local/bin/my-status"
    assert named.commands()["cancel"] == "glite-wms-job-cancel"  # submit is a name: PATH


def test_a_failed_status_query_is_classified_as_that_servers_failure(tracked: Any) -> None:
    from gridgate.core.model import SubmitResult

    pm, _ = tracked({H1: {"pilots": {"status": "lb_down"}}})
    job = submit(pm, H1)[0]
    result = status(pm, H1, [job])
    failure = pm.hook.gridgate_classify_failure(
        endpoint=ep(H1),
        result=SubmitResult(
            ep(H1),
            ok=False,
            command=result.command,
            operation=result.operation,
            message=result.message,
        ),
    )
    assert failure.kind == "unreachable" and "Connection refused" in failure.reason
    junk = SubmitResult(
        ep(H1),
        ok=False,
        operation="Job Status",
        command=result.command.__class__(("glite-wms-job-status",), 0, "junk\n", ""),
    )
    assert "no job status" in pm.hook.gridgate_classify_failure(endpoint=ep(H1), result=junk).reason
