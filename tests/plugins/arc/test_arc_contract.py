"""The arc backend keeps the backend contract every backend inherits (with stand-ins for the
ARC client, so ``interface: cli``; the real CE is exercised in test_arc_backend.py for both
interfaces, and the REST path's own rules in tests/plugins/arc/rest/)."""

from __future__ import annotations

from gridgate.core.testing import Answer, BackendContract
from gridgate.plugins.arc.backend import ArcBackend

#: arcstat's State: for the live states the contract asks about
ARC_STATES = {"waiting": "Queuing", "running": "Running"}


class TestArcBackendContract(BackendContract):
    backend_class = ArcBackend
    name = "arc"
    submitted_output = (
        "Job submitted with jobid: https://ce.example.org:443/arex/rest/1.0/jobs/gg{call}\n"
    )
    refused_output = (
        "ERROR: Failed to establish connection: TCP: GENERIC_ERROR (Failed to connect "
        "to ce.example.org(IPv4):443)\nERROR: Job submission aborted because no "
        "resource returned any information\n"
    )
    bad_sections = (
        (
            {"endpoints": ["https://ce.example.org/arex", "https://ce.example.org/arex"]},
            ("endpoints", 1),
        ),
        ({"endpoints": ["http://ce.example.org/arex"]}, ("endpoints", 0)),
        ({"xrsl": {"executable": "/bin/sh"}}, ("xrsl", "executable")),
        ({"xrsl": {"Queue": "long"}}, ("xrsl", "Queue")),
    )

    # interface: cli cannot list the CE's jobs with their names (the ARC client keeps no such
    # listing): find_pilots answers None there; the REST finding is held to the real CE in
    # tests/plugins/arc/rest/
    finds_pilots = False

    def section(self, program, tmp_path):
        script = tmp_path / "pilot.sh"
        script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        return {
            "interface": "cli",
            "endpoints": ["https://ce.example.org:443/arex"],
            "script": str(script),
            "commands": {
                name: program for name in ("arcsub", "arcstat", "arckill", "arcclean", "arcget")
            },
        }

    def make_backend(self, program, tmp_path, max_output_bytes=None):
        # arcsub writes the job list the client reads its jobs from; the stand-in does not
        backend = super().make_backend(program, tmp_path, max_output_bytes)
        for ce in backend._ces.values():
            ce.job_list.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            ce.job_list.touch()
        return backend

    def status_answer(self, known, unknown):
        blocks = "".join(f"Job: {i}\n State: {ARC_STATES[s]}\n\n" for i, s in known.items())
        return Answer(
            stdout=blocks + f"Status of {len(known) + len(unknown)} jobs was queried, "
            f"{len(known)} jobs returned information\n",
            stderr="".join(
                f"WARNING: Failed to process job: {i} - 404 Job not found\n" for i in unknown
            ),
        )

    def cancel_answer(self, cancelled, finished, unknown):
        # arckill skips a finished job without a word and counts only the jobs it killed
        return Answer(
            stdout="".join(f"Warning: Job not found in job list: {i}\n" for i in unknown)
            + f"Jobs processed: {len(cancelled)}, successfully killed: {len(cancelled)}, "
            "successfully cleaned: 0\n"
        )


def test_ids_that_are_no_arc_job_id_never_reach_a_command(tmp_path) -> None:
    from gridgate.core.testing import build_plugin, stand_in_command

    program = stand_in_command(tmp_path / "bin", "arc-command", stdout="")
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    backend = build_plugin(
        ArcBackend,
        {
            "interface": "cli",
            "endpoints": ["https://ce.example.org/arex"],
            "script": str(script),
            "commands": {"arcstat": str(program), "arckill": str(program)},
        },
        state_dir=tmp_path / "state",
        name="arc",
    )
    (endpoint,) = backend.gridgate_backend_info(backend="arc").endpoints
    bad = ["https://ce.example.org/arex/rest/1.0/jobs/ok1", "x; rm -rf /"]
    status = backend.gridgate_job_status(endpoint=endpoint, job_ids=bad, timeout=5)
    cancel = backend.gridgate_cancel(endpoint=endpoint, job_ids=bad, timeout=5)
    # the odd id is that pilot's alone (issue 40 item 4): unknown, saying why, never in an argv
    odd = bad[1]
    assert status.statuses[odd].state == "unknown", status
    assert "not an ARC job id" in status.statuses[odd].reason
    assert odd not in cancel.cancelled and "not an ARC job id" in cancel.message, cancel
    assert not any(odd in " ".join(call["argv"]) for call in program.calls())
    before = program.calls()
    empty = backend.gridgate_job_status(endpoint=endpoint, job_ids=[], timeout=5)
    assert empty.ok and empty.commands == 0 and program.calls() == before


def test_a_final_pilot_arcclean_would_not_delete_yet_stays_to_clean_until_it_gives_up(
    tmp_path,
) -> None:
    """arcclean deletes only jobs the CE has finished (a cancelled job still being killed prints
    `Jobs processed: 1, deleted: 0`): such a pilot is tried again, for CLEAN_GIVE_UP seconds."""
    from gridgate.core.clock import FakeClock
    from gridgate.core.testing import build_plugin, stand_in_command
    from gridgate.plugins.arc.backend import CLEAN_GIVE_UP

    job = "https://ce.example.org/arex/rest/1.0/jobs/gg1"
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    not_yet = stand_in_command(
        tmp_path / "bin", "arcclean", stdout="Jobs processed: 1, deleted: 0\n"
    )
    killed = stand_in_command(
        tmp_path / "bin",
        "arckill",
        stdout="Jobs processed: 1, successfully killed: 1, successfully cleaned: 0\n",
    )
    clock = FakeClock()
    backend = build_plugin(
        ArcBackend,
        {
            "interface": "cli",
            "endpoints": ["https://ce.example.org/arex"],
            "script": str(script),
            "commands": {"arcclean": str(not_yet), "arckill": str(killed)},
        },
        clock=clock,
        state_dir=tmp_path / "state",
        name="arc",
    )
    (endpoint,) = backend.gridgate_backend_info(backend="arc").endpoints
    assert backend.gridgate_cancel(endpoint=endpoint, job_ids=[job], timeout=5).cancelled == (job,)
    (ce,) = backend._ces.values()
    assert backend.clean(ce, 5) == [] and job in ce.pending_clean.read_text()
    clock.advance(CLEAN_GIVE_UP + 1)
    assert backend.clean(ce, 5) == [] and not ce.pending_clean.exists()
    assert len(not_yet.calls()) == 2


def _backend_with(tmp_path, max_output_bytes=None, **commands):
    from gridgate.core.testing import build_plugin

    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    config = {"director": {"max_output_bytes": max_output_bytes}} if max_output_bytes else {}
    return build_plugin(
        ArcBackend,
        {
            "interface": "cli",
            "endpoints": ["https://ce.example.org/arex"],
            "script": str(script),
            "commands": {k: str(v) for k, v in commands.items()},
        },
        state_dir=tmp_path / "state",
        name="arc",
        config=config,
    )


def test_a_status_output_cut_by_gridgates_cap_is_a_failed_poll_carrying_the_cut_command(
    tmp_path,
) -> None:
    """Core names a cut output as gridgate's cap (kind output_cap) only when it sees the cut
    command: a cut arcstat is never read as 'these ids are gone'."""
    from gridgate.core.testing import stand_in_command

    job = "https://ce.example.org/arex/rest/1.0/jobs/gg1"
    big = stand_in_command(
        tmp_path / "bin", "arcstat", stdout=f"Job: {job}\n State: Running\n" + "x" * 200_000
    )
    backend = _backend_with(tmp_path, max_output_bytes=1024, arcstat=big)
    (endpoint,) = backend.gridgate_backend_info(backend="arc").endpoints
    (backend._ces[endpoint.name].job_list).parent.mkdir(parents=True)
    backend._ces[endpoint.name].job_list.write_bytes(b"")
    result = backend.gridgate_job_status(endpoint=endpoint, job_ids=[job], timeout=10)
    assert not result.ok and result.command is not None and result.command.stdout_truncated


def test_pilots_of_a_ce_removed_from_the_config_are_still_polled_and_cancelled(tmp_path) -> None:
    from gridgate.core.model import Endpoint
    from gridgate.core.testing import stand_in_command

    job = "https://old-ce.example.org/arex/rest/1.0/jobs/gg1"
    stat = stand_in_command(
        tmp_path / "bin",
        "arcstat",
        stdout=f"Job: {job}\n State: Running\n\n"
        "Status of 1 jobs was queried, 1 jobs returned information\n",
    )
    kill = stand_in_command(
        tmp_path / "bin",
        "arckill",
        stdout="Jobs processed: 1, successfully killed: 1, successfully cleaned: 0\n",
    )
    backend = _backend_with(tmp_path, arcstat=stat, arckill=kill)
    retired = Endpoint("arc", "old-ce.example.org")
    assert backend.gridgate_job_status(endpoint=retired, job_ids=[job], timeout=10) is None, (
        "no job list of that endpoint here: not this backend's to answer"
    )
    folder = tmp_path / "state" / "arc" / "old-ce.example.org"
    folder.mkdir(parents=True)
    (folder / "jobs.dat").write_bytes(b"")
    status = backend.gridgate_job_status(endpoint=retired, job_ids=[job], timeout=10)
    assert status.ok and status.statuses[job].state == "running"
    assert str(folder / "jobs.dat") in stat.calls()[0]["argv"]
    assert backend.gridgate_cancel(endpoint=retired, job_ids=[job], timeout=10).cancelled == (job,)
