"""The sge backend against the private cell: real qsub, qstat, qacct and qdel, real errors.

The director runs as the cell's submit user (``SgeSite.run_once``); a backend built in this
(root) process runs the commands as that user through wrappers (``SgeSite.as_user``), since
Grid Engine refuses root (``min_uid``), as the last test shows.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from support.polling import until
from support.sge_site import SgeSite

from gridgate.core.model import Endpoint, IterationInfo, Resources, SubmitRequest
from gridgate.core.testing import build_plugin, plugin_manager_with
from gridgate.plugins.sge.backend import SgeBackend
from gridgate.plugins.sge.parse import parse_qstat


@pytest.fixture
def sge_site(sge, tmp_path) -> SgeSite:
    return SgeSite(sge, tmp_path.name)


def _backend(site: SgeSite, **section) -> SgeBackend:
    return build_plugin(SgeBackend, site.section(**section))


def _live(cell) -> dict:
    """Every job and task of the submit user, as the real qstat shows them."""
    out = cell.run(["qstat", "-u", "*", "-g", "d"], as_user=False)
    assert out.ok, out.stderr
    return parse_qstat(out.stdout)


def _submit(backend: SgeBackend, queue: str, count: int = 1):
    endpoint = Endpoint("sge", queue)
    with plugin_manager_with(backend) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=endpoint, request=SubmitRequest(backend="sge", count=count), timeout=60
        )
        failure = (
            None
            if result.ok
            else pm.hook.gridgate_classify_failure(endpoint=endpoint, result=result)
        )
    return result, failure


def _status(backend: SgeBackend, queue: str, ids):
    return backend.gridgate_job_status(endpoint=Endpoint("sge", queue), job_ids=ids, timeout=60)


# --- the director submits, real qstat sees -------------------------------------------------


def test_gridgate_run_submits_n_pilots_that_qstat_shows(sge_site) -> None:
    summary = sge_site.run_once(sge_site.doc(pilots=3))
    assert summary["pilots_submitted"] == 3 and summary["failures"] == [], summary
    ids = [i for s in summary["submitted"] for i in s["job_ids"]]
    live = _live(sge_site.cell)
    assert sorted(ids) == sorted(set(ids) & set(live))
    for record in summary["submitted"]:
        for job_id in record["job_ids"]:
            assert live[job_id].state in ("waiting", "running")
            if live[job_id].state == "running":
                assert live[job_id].reason == f"in {record['endpoint']}@{sge_site.cell.host}"


def test_pilots_per_submission_submits_an_array_with_one_id_per_task(sge_site) -> None:
    doc = sge_site.doc(pilots=3, pilots_per_submission=3, queues=[sge_site.queue])
    [record] = sge_site.run_once(doc)["submitted"]
    number = record["job_ids"][0].split(".")[0]
    assert record["job_ids"] == [f"{number}.{t}" for t in (1, 2, 3)]
    assert set(record["job_ids"]) <= set(_live(sge_site.cell))


# --- tracking: qstat while they live, qacct once they have left it ---------------------------


def test_a_pilot_is_followed_from_qstat_to_qacct(sge_site, figures) -> None:
    backend = _backend(sge_site, script=str(sge_site.pilot("short.sh", "sleep 3\n")))
    failing = _backend(sge_site, script=str(sge_site.pilot("fails.sh", "exit 3\n")))
    array, _ = _submit(backend, sge_site.queue, count=2)
    single, _ = _submit(backend, sge_site.queue)
    bad, _ = _submit(failing, sge_site.queue)
    assert array.ok and single.ok and bad.ok, (array, single, bad)
    ids = [*array.job_ids, *single.job_ids, *bad.job_ids]
    seen = _status(backend, sge_site.queue, ids)
    assert seen.ok and {s.state for s in seen.statuses.values()} <= {"waiting", "running", "done"}
    assert until(lambda: not set(ids) & set(_live(sge_site.cell)), timeout=120)

    def finished():
        result = _status(backend, sge_site.queue, [*ids, "999999"])
        return result if result.ok and set(result.statuses) == set(ids) else None

    # the accounting file is written within flush_time (15 s by default) of the job's end:
    # until then a job that left qstat is unknown to both
    begun = time.monotonic()
    result = until(finished, timeout=60, pause=0.5)
    assert result, _status(backend, sge_site.queue, ids)
    assert {result.statuses[i].state for i in [*array.job_ids, *single.job_ids]} == {"done"}
    failed = result.statuses[bad.job_ids[0]]
    assert (failed.state, failed.exit_code, failed.reason) == ("failed", 3, "exit status 3")
    # one qstat, and one qacct per job number (the array's two tasks share one)
    assert result.commands == 1 + 3 + 1  # 999999 is looked up too, and not found
    figures(accounting_visible_after_s=round(time.monotonic() - begun, 1))


def test_the_queues_of_one_iteration_share_one_qstat(sge_site) -> None:
    from gridgate.core.model import IterationSummary

    backend = _backend(sge_site, qsub_options=["-h", "-o", "/dev/null", "-j", "y"])
    first, second = sge_site.cell.queues
    one, two = _submit(backend, first)[0], _submit(backend, second)[0]
    backend.gridgate_iteration_started(iteration=IterationInfo(number=1, started=0.0))
    a = _status(backend, first, one.job_ids)
    b = _status(backend, second, two.job_ids)
    assert (a.commands, b.commands) == (1, 0) and b.command is a.command
    assert a.statuses[one.job_ids[0]].state == b.statuses[two.job_ids[0]].state == "waiting"
    backend.gridgate_iteration_finished(
        summary=IterationSummary(number=1, started=0.0, duration=0.1)
    )
    assert _status(backend, second, two.job_ids).commands == 1  # outside an iteration: its own


def test_qacct_per_poll_bounds_the_accounting_calls(sge_site) -> None:
    backend = _backend(sge_site, script=str(sge_site.pilot("quick.sh", "exit 0\n")))
    ids = [_submit(backend, sge_site.queue)[0].job_ids[0] for _ in range(3)]
    bounded = _backend(sge_site, qacct_per_poll=1)

    def all_done() -> bool:
        statuses = _status(backend, sge_site.queue, ids).statuses
        return {statuses[i].state if i in statuses else "" for i in ids} == {"done"}

    assert until(all_done, timeout=90, pause=0.5)
    result = _status(bounded, sge_site.queue, ids)
    assert result.ok and result.commands == 2  # qstat and one qacct, for the oldest job
    assert list(result.statuses) == [ids[0]] and result.statuses[ids[0]].state == "done"


def test_a_job_in_error_state_is_failed_with_the_reason_qstat_gives(sge_site) -> None:
    backend = _backend(
        sge_site,
        qsub_options=["-o", "/dev/null", "-j", "y", "-wd", "/nonexistent-gridgate-wd"],
    )
    result, _ = _submit(backend, sge_site.queue)
    assert result.ok, result
    [job_id] = result.job_ids

    def erred():
        status = _status(backend, sge_site.queue, [job_id]).statuses.get(job_id)
        return status if status is not None and status.state == "failed" else None

    status = until(erred, timeout=60, pause=0.2)
    assert status and status.native == "Eqw", _status(backend, sge_site.queue, [job_id])
    assert "can't chdir to /nonexistent-gridgate-wd" in status.reason


# --- cancel -------------------------------------------------------------------------------------


def test_gridgate_cancel_deletes_and_does_not_claim_what_had_finished(sge_site) -> None:
    held = _backend(sge_site, qsub_options=["-h", "-o", "/dev/null", "-j", "y"])
    quick = _backend(sge_site, script=str(sge_site.pilot("quick.sh", "exit 0\n")))
    array, _ = _submit(held, sge_site.queue, count=3)
    done, _ = _submit(quick, sge_site.queue)
    assert array.ok and done.ok
    [finished] = done.job_ids
    assert until(lambda: finished not in _live(sge_site.cell), timeout=60)
    queue = Endpoint("sge", sge_site.queue)
    with plugin_manager_with(held) as pm:
        cancel = pm.hook.gridgate_cancel(
            endpoint=queue, job_ids=[array.job_ids[1], finished, "999999"], timeout=60
        )
        rest = pm.hook.gridgate_cancel(endpoint=queue, job_ids=list(array.job_ids), timeout=60)
        refused = pm.hook.gridgate_cancel(endpoint=queue, job_ids=["1; rm -rf /"], timeout=60)
    assert cancel.ok and cancel.cancelled == (array.job_ids[1],), cancel
    assert cancel.command.argv[1:] == (array.job_ids[1], finished, "999999")
    assert "finished before the cancel" in cancel.message and finished in cancel.message
    # the task already deleted is not claimed twice
    assert rest.ok and rest.cancelled == (array.job_ids[0], array.job_ids[2])
    assert not set(array.job_ids) & set(_live(sge_site.cell))
    # an odd id alone: nothing to ask the cell, nothing run, the reason given (issue 40 item 4)
    assert refused.ok and refused.cancelled == () and refused.command is None, refused
    assert "not a Grid Engine job id" in refused.message


def test_an_odd_tracked_id_is_that_pilots_alone_and_never_reaches_grid_engine(sge_site) -> None:
    # issue 40 item 4, round 5: one tracked id of no Grid Engine job id's form made every poll
    # and cancel of the queue fail, so its other pilots never got their verdict
    held = _backend(sge_site, qsub_options=["-h", "-o", "/dev/null", "-j", "y"])
    submitted, _ = _submit(held, sge_site.queue)
    assert submitted.ok, submitted
    [job] = submitted.job_ids
    odd = "1; touch /tmp/gridgate-odd-id"
    queue = Endpoint("sge", sge_site.queue)
    with plugin_manager_with(held) as pm:
        status = pm.hook.gridgate_job_status(endpoint=queue, job_ids=[odd, job], timeout=60)
        cancel = pm.hook.gridgate_cancel(endpoint=queue, job_ids=[odd, job], timeout=60)
    assert status.ok, status
    assert status.statuses[job].state == "waiting", status.statuses
    assert status.statuses[odd].state == "unknown"
    assert "not a Grid Engine job id" in status.statuses[odd].reason
    assert cancel.ok and cancel.cancelled == (job,), cancel
    assert cancel.command.argv[1:] == (job,)
    assert "not a Grid Engine job id" in cancel.message and odd in cancel.message
    assert job not in _live(sge_site.cell)


# --- what Grid Engine refuses, each to its kind ----------------------------------------------


def test_a_stopped_qmaster_takes_every_queue_out_and_escalates(sge_site) -> None:
    cell = sge_site.cell
    cell.stop_qmaster()
    summary = sge_site.run_once(sge_site.doc(pilots=4))
    assert summary["pilots_submitted"] == 0
    assert sorted(summary["excluded"]) == sorted(cell.queues)
    assert {f["kind"] for f in summary["failures"]} == {"unreachable"}
    notes = sge_site.notes()
    assert all("got select error (Connection refused)" in n for n in notes), notes
    # the other queue of the cell was not made to ask the qmaster again
    assert sum("not tried: queue" in n for n in notes) == len(cell.queues) - 1
    backend = _backend(sge_site)
    status = _status(backend, cell.queues[0], ["1", "2.1"])
    assert not status.ok and status.commands == 1
    assert "unable to send message to qmaster" in status.command.stderr
    sibling = _status(backend, cell.queues[1], ["3"])
    assert not sibling.ok and sibling.commands == 0 and sibling.command == status.command
    cancel = backend.gridgate_cancel(
        endpoint=Endpoint("sge", cell.queues[1]), job_ids=["3"], timeout=30
    )
    assert not cancel.ok and cancel.message.startswith("not tried: queue")
    backend.gridgate_iteration_started(iteration=IterationInfo(number=2, started=0.0))
    assert _status(backend, cell.queues[1], ["3"]).commands == 1


def test_a_qmaster_that_does_not_answer_holds_qsub_to_its_deadline_once_per_cell(sge_site) -> None:
    """A stopped (SIGSTOP) qmaster takes connections and answers nothing: qsub prints that it
    could not send its message to the qmaster, then does not exit until it is killed at its
    deadline; the other queue is not made to wait as long again."""
    cell = sge_site.cell
    backend = _backend(sge_site, command_timeout=3)
    pid = cell.qmaster_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        first, failure = _submit(backend, cell.queues[0])
        second, _ = _submit(backend, cell.queues[1])
    finally:
        os.kill(pid, signal.SIGCONT)
    assert first.command.timed_out
    assert "unable to send message to qmaster" in first.command.stderr
    assert failure.kind == "unreachable"
    assert second.message.startswith(f"not tried: queue {cell.queues[0]}")
    assert second.command == first.command


@pytest.mark.parametrize(
    ("section", "said", "kind"),
    [
        ({"queues": ["nosuch.q"]}, 'job requests unknown queue "nosuch.q"', "config"),
        ({"qsub_options": ["-l", "bogus=1"]}, 'unknown resource "bogus"', "usage"),
        ({"qsub_options": ["-bogus"]}, 'invalid option argument "-bogus"', "usage"),
        ({"resources": {"parallel_environment": "nope"}}, 'environment "nope" does not', "config"),
    ],
)
def test_what_the_site_configured_wrong_is_refused_with_its_kind(
    sge_site, section, said, kind
) -> None:
    backend = _backend(sge_site, **section)
    queue = (section.get("queues") or [sge_site.queue])[0]
    cores = 2 if "resources" in section else 1
    request = SubmitRequest(backend="sge", resources=Resources(cores=cores))
    with plugin_manager_with(backend) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=Endpoint("sge", queue), request=request, timeout=60
        )
        failure = pm.hook.gridgate_classify_failure(endpoint=Endpoint("sge", queue), result=result)
    assert not result.ok and said in result.command.stderr, result.command
    assert (failure.kind, failure.local, failure.transient) == (kind, False, False)


def test_a_queue_whose_access_list_bars_the_user_is_refused_at_submission(sge_site) -> None:
    cell = sge_site.cell
    cell.restrict_queue_to(sge_site.queue, ("root",))
    result, failure = _submit(_backend(sge_site), sge_site.queue)
    assert "no suitable queues" in result.command.stderr  # qsub -w e (validation: e)
    assert failure.kind == "usage"
    # with Grid Engine's own default (-w n) the same job is taken, to wait for ever
    waiting, _ = _submit(_backend(sge_site, validation="n"), sge_site.queue)
    assert waiting.ok


def test_a_cell_that_bars_the_user_is_auth_for_every_queue(sge_site) -> None:
    sge_site.cell.restrict_cell_to(("root",))
    backend = _backend(sge_site)
    result, failure = _submit(backend, sge_site.queue)
    assert "is not allowed to submit jobs" in result.command.stderr
    assert (failure.kind, failure.transient) == ("auth", False)
    other, _ = _submit(backend, sge_site.cell.queues[1])
    assert other.message.startswith("not tried: queue") and other.command == result.command


def test_a_user_at_max_u_jobs_is_overload_and_nobody_is_told(sge_site) -> None:
    sge_site.cell.set_user_job_limit(1)
    backend = _backend(sge_site, qsub_options=["-h", "-o", "/dev/null", "-j", "y"])
    first, _ = _submit(backend, sge_site.queue)
    second, failure = _submit(backend, sge_site.queue)
    assert first.ok and not second.ok
    assert "jobs are allowed per user" in second.command.stderr
    assert (failure.kind, failure.exclude, failure.notify) == ("overload", True, False)


def test_root_is_refused_by_min_uid_as_a_fault_of_this_machine(sge_site) -> None:
    cell = sge_site.cell
    section = sge_site.section()
    section["commands"] = {n: str(cell.bin_dir / n) for n in ("qsub", "qstat", "qacct", "qdel")}
    result, failure = _submit(build_plugin(SgeBackend, section), sge_site.queue)
    assert "your user id 0 is lower than minimum user id" in result.command.stderr
    assert (failure.kind, failure.local) == ("auth", True)


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["-q", "other.q"], "-q is written by the backend (the queue comes from queues)"),
        (["-terse"], "-terse is written by the backend"),
        (["-t", "1-5"], "-t is written by the backend (pilots_per_submission"),
        (["-N", "x"], "-N is written by the backend"),
        (["-w", "n"], "-w is written by the backend (validation sets it)"),
        (["-sync", "y"], "-sync is written by the backend (qsub would wait"),
        (["-clear"], "-clear is written by the backend"),
        (["-@", "/etc/opts"], "-@ is written by the backend"),
        (["-verify"], "-verify is written by the backend"),
    ],
)
def test_options_the_backend_writes_itself_are_refused_at_their_line(
    options, said, tmp_path
) -> None:
    import subprocess
    import sys
    from pathlib import Path

    site = tmp_path / "site.yaml"
    site.write_text(
        "backends:\n  sge:\n    queues: [pilots.q]\n    script: /p.sh\n"
        f"    qsub_options: ['-j', 'y', {', '.join(repr(o) for o in options)}]\n"
        "demand:\n  static:\n    sge: 1\n"
    )
    out = subprocess.run(
        [str(Path(sys.executable).parent / "gridgate"), "config", "validate", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout
    assert f"{site}:5: backends.sge.qsub_options[2]: {said}" in out.stderr, out.stderr


def test_config_errors_name_queue_script_job_name_and_resources() -> None:
    problems = SgeBackend.config_errors(
        {
            "queues": ["ok.q", "bad name", "ok.q"],
            "job_name": "9lives",
            "resources": {"parallel_environment": "s m p"},
        }
    )
    assert (("queues", 1), "'bad name' is not a Grid Engine cluster queue name") in problems
    assert (("queues", 2), "queue 'ok.q' is listed twice") in problems
    assert (("script",), "a pilot script is needed to submit to the queues") in problems
    assert ("job_name",) in [p for p, _ in problems]
    assert (
        ("resources", "parallel_environment"),
        "'s m p' is not a Grid Engine resource name",
    ) in problems


def test_the_script_is_found_next_to_the_config_file(tmp_path, monkeypatch) -> None:
    from gridgate.core.config import load_config

    site = tmp_path / "etc" / "site.yaml"
    site.parent.mkdir()
    site.write_text(
        "backends:\n  sge:\n    queues: [pilots.q]\n    script: pilots/pilot.sh\n"
        "    commands: {qsub: bin/qsub, qstat: qstat}\n"
        "demand:\n  static:\n    sge: 1\n"
    )
    monkeypatch.chdir(tmp_path)
    section = load_config(site)["backends"]["sge"]
    assert section["script"] == str(site.parent / "pilots" / "pilot.sh")
    assert section["commands"]["qsub"] == str(site.parent / "bin" / "qsub")
    assert section["commands"]["qstat"] == "qstat"  # a bare name is looked up on PATH
