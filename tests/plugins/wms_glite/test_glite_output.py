"""A pilot's output on the stand-in gLite WMS (``gridgate pilots output``'s path,
core/engine/output.py): the first read retrieves the output sandbox with
``glite-wms-job-output`` (the WMS then clears the job) and keeps it, every later read takes the
kept copy; a pilot still running, one that failed and a second retrieval are refused as the WMS
refuses them; ``pilots show``'s read of 0 bytes never retrieves. Real stand-in processes; the
director's clock and the stand-ins' clock file move together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.director import pilots_by_state

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.engine.output import read_output
from gridgate.core.testing import make_config
from gridgate.plugins.wms_glite.output import kept_folder, stored_folder
from gridgate.plugins.wms_glite.sim import commands_section, read_calls
from gridgate.plugins.wms_glite.sim.jobs import set_clock

GOOD, FAILS = "wms01.example.org", "wms02.example.org"
T0 = 1_800_000_000.0


@pytest.fixture
def world(tmp_path: Path, sim_bin: Path, scenario: Any, calls_log: Path) -> Any:
    clock_file = tmp_path / "simclock"
    set_clock(clock_file, T0)
    path = scenario(
        hosts={
            GOOD: {"pilots": {"outcome": {"done": 1, "exit": 1}, "exit_code": 3}},
            FAILS: {"pilots": {"outcome": "failed"}},
        },
        clock_file=str(clock_file),
    )
    clock = FakeClock(T0)
    doc = {
        "director": {
            "cycle_seconds": 1,
            "command_timeout": 20,
            "state_dir": str(tmp_path / "state"),
        },
        "state": {"driver": "sqlite", "path": str(tmp_path / "state" / "state.db")},
        "backends": {
            "wms_glite": {
                "servers": [GOOD, FAILS],
                "commands": commands_section(sim_bin),
                "list_match": False,
                "work_dir": str(tmp_path),
                "std_output": "pilot.out",
                "env": {"GRIDGATE_SIM_SCENARIO": str(path)},
            }
        },
        "demand": {"static": {"wms_glite": 4}},
        "selectors": {"round_robin": {}},
    }
    director = Director(make_config(doc), clock=clock)

    def advance(seconds: float) -> None:
        clock.advance(seconds)
        set_clock(clock_file, clock.time())

    def retrievals() -> int:
        return sum(1 for c in read_calls(calls_log) if c.command == "glite-wms-job-output")

    yield director, advance, retrievals
    director.close()


def test_the_sandbox_is_retrieved_once_and_kept(world) -> None:
    director, advance, retrievals = world
    director.run_iteration()
    advance(3)
    director.run_iteration()
    running = pilots_by_state(director)[f"{GOOD}/waiting"][0]
    # not Done yet: the WMS refuses, nothing is kept, and the job goes on
    early = read_output(director.runtime, running, "stdout")
    assert early.ok and not early.held, early
    assert "Current Job Status is" in early.message and retrievals() == 1
    assert not kept_folder(director.pm.get_plugin("backends:wms_glite"), running.job_id).exists()

    advance(30)
    director.run_iteration()
    found = pilots_by_state(director)
    done, failed = found[f"{GOOD}/done"], found[f"{GOOD}/failed"]
    pilot = done[0]
    # pilots show: where it is, and no retrieval (it would clear the job on the WMS)
    show = read_output(director.runtime, pilot, "stdout", cap=0)
    assert show.ok and "not retrieved yet" in show.message and retrievals() == 1
    out = read_output(director.runtime, pilot, "stdout")
    assert out.ok and out.held, out
    assert out.text.startswith(f"gridgate stand-in pilot {pilot.job_id} ran on ce0")
    assert out.where.endswith("/pilot.out") and retrievals() == 2
    err = read_output(director.runtime, pilot, "stderr")
    assert err.held and err.text == "" and err.where.endswith("/std.err")
    assert retrievals() == 2  # the kept copy
    # the WMS cleared the job; the director still counts it done
    director.run_iteration()
    assert pilot.job_id in {p.job_id for p in pilots_by_state(director)[f"{GOOD}/done"]}

    # a pilot that exited non-zero: its stderr says so
    exited = read_output(director.runtime, failed[0], "stderr")
    assert exited.held and exited.text == "pilot exited with code 3\n"


def test_a_failed_job_and_a_second_retrieval_are_refused(world, tmp_path) -> None:
    director, advance, retrievals = world
    director.run_iteration()
    advance(30)
    director.run_iteration()
    failed = pilots_by_state(director)[f"{FAILS}/failed"][0]
    refused = read_output(director.runtime, failed, "stdout")
    assert refused.ok and not refused.held and "Done (Failed)" in refused.message
    # a sandbox another client retrieved: the WMS refuses a second hand-over
    pilot = pilots_by_state(director)[f"{GOOD}/done"][0]
    backend = director.pm.get_plugin("backends:wms_glite")
    first = read_output(director.runtime, pilot, "stdout")
    assert first.held
    for item in kept_folder(backend, pilot.job_id).iterdir():
        item.unlink()
    kept_folder(backend, pilot.job_id).rmdir()
    again = read_output(director.runtime, pilot, "stdout")
    assert not again.held and "already retrieved" in again.message
    assert retrievals() == 3


def test_the_folder_is_read_from_the_clients_answer() -> None:
    answer = (
        "\nConnecting to the service https://wms01:7443/glite_wms_wmproxy_server\n\n"
        "Output sandbox files for the job:\nhttps://lb01:9000/abc\n"
        "have been successfully retrieved and stored in the directory:\n/tmp/x/u_abc\n\n"
    )
    assert stored_folder(answer) == "/tmp/x/u_abc"
    assert stored_folder("Output sandbox files for the job:\n") is None
