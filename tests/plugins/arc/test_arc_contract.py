"""The arc backend keeps the backend contract every backend inherits (with stand-ins for the
ARC client; the real CE is exercised in test_arc_backend.py)."""

from __future__ import annotations

from gridgate.core.testing import BackendContract
from gridgate.plugins.arc.backend import ArcBackend


class TestArcBackendContract(BackendContract):
    backend_class = ArcBackend
    name = "arc"
    submitted_output = "Job submitted with jobid: https://ce.example.org:443/arex/rest/1.0/jobs/gg{call}\n"
    refused_output = ("ERROR: Failed to establish connection: TCP: GENERIC_ERROR (Failed to connect "
                      "to ce.example.org(IPv4):443)\nERROR: Job submission aborted because no "
                      "resource returned any information\n")
    bad_sections = (
        ({"endpoints": ["https://ce.example.org/arex", "https://ce.example.org/arex"]}, ("endpoints", 1)),
        ({"endpoints": ["http://ce.example.org/arex"]}, ("endpoints", 0)),
        ({"xrsl": {"executable": "/bin/sh"}}, ("xrsl", "executable")),
        ({"xrsl": {"Queue": "long"}}, ("xrsl", "Queue")),
    )

    def section(self, program, tmp_path):
        script = tmp_path / "pilot.sh"
        script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        return {"endpoints": ["https://ce.example.org:443/arex"], "script": str(script),
                "commands": {name: program for name in ("arcsub", "arcstat", "arckill", "arcclean", "arcget")}}


def test_ids_that_are_no_arc_job_id_never_reach_a_command(tmp_path) -> None:
    from gridgate.core.testing import build_plugin, stand_in_command

    program = stand_in_command(tmp_path / "bin", "arc-command", stdout="")
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    backend = build_plugin(ArcBackend, {"endpoints": ["https://ce.example.org/arex"], "script": str(script),
                                        "commands": {"arcstat": str(program), "arckill": str(program)}},
                           state_dir=tmp_path / "state", name="arc")
    (endpoint,) = backend.gridgate_backend_info(backend="arc").endpoints
    bad = ["https://ce.example.org/arex/rest/1.0/jobs/ok1", "x; rm -rf /"]
    status = backend.gridgate_job_status(endpoint=endpoint, job_ids=bad, timeout=5)
    cancel = backend.gridgate_cancel(endpoint=endpoint, job_ids=bad, timeout=5)
    assert not status.ok and "rm -rf" in status.message and not cancel.ok
    assert program.calls() == []
    empty = backend.gridgate_job_status(endpoint=endpoint, job_ids=[], timeout=5)
    assert empty.ok and empty.commands == 0 and program.calls() == []


def test_a_final_pilot_arcclean_would_not_delete_yet_stays_to_clean_until_it_gives_up(tmp_path) -> None:
    """arcclean deletes only jobs the CE has finished (a cancelled job still being killed prints
    `Jobs processed: 1, deleted: 0`): such a pilot is tried again, for CLEAN_GIVE_UP seconds."""
    from gridgate.core.clock import FakeClock
    from gridgate.core.testing import build_plugin, stand_in_command
    from gridgate.plugins.arc.backend import CLEAN_GIVE_UP

    job = "https://ce.example.org/arex/rest/1.0/jobs/gg1"
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    not_yet = stand_in_command(tmp_path / "bin", "arcclean", stdout="Jobs processed: 1, deleted: 0\n")
    killed = stand_in_command(tmp_path / "bin", "arckill",
                              stdout="Jobs processed: 1, successfully killed: 1, successfully cleaned: 0\n")
    clock = FakeClock()
    backend = build_plugin(ArcBackend, {"endpoints": ["https://ce.example.org/arex"], "script": str(script),
                                        "commands": {"arcclean": str(not_yet), "arckill": str(killed)}},
                           clock=clock, state_dir=tmp_path / "state", name="arc")
    (endpoint,) = backend.gridgate_backend_info(backend="arc").endpoints
    assert backend.gridgate_cancel(endpoint=endpoint, job_ids=[job], timeout=5).cancelled == (job,)
    (ce,) = backend._ces.values()
    assert backend.clean(ce, 5) == [] and job in ce.pending_clean.read_text()
    clock.advance(CLEAN_GIVE_UP + 1)
    assert backend.clean(ce, 5) == [] and not ce.pending_clean.exists()
    assert len(not_yet.calls()) == 2
