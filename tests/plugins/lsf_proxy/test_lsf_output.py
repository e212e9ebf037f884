"""A pilot's output on the stand-in LSF (``gridgate pilots output``'s path, core/engine/output.py):
the ``-o`` and ``-e`` files the backend named (``%J``, ``%I``), which the stand-in writes as
LSF does when a job ends (the job's report, then its output); stderr in the ``-o`` file when no
``-e`` was given; nothing yet while the job runs; and no output path at all (LSF mails it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.director import pilots_by_state

from gridgate.core.clock import FakeClock, write_file_time
from gridgate.core.engine.director import Director
from gridgate.core.engine.output import read_output
from gridgate.core.model import Endpoint
from gridgate.core.testing import build_plugin, make_config
from gridgate.plugins.lsf_proxy.director.backend import LsfBackend
from gridgate.plugins.lsf_proxy.sim import install_commands, write_scenario
from gridgate.plugins.lsf_proxy.sim.cli import output_path

T0 = 1_800_000_000.0


def site(tmp_path: Path, **section: object):
    """A director on the stand-in LSF: ``normal`` (done after 30 s), ``broken`` (exit 127
    after 2 s); the backend's section takes ``section``. (director, advance)."""
    bin_dir = install_commands(tmp_path / "bin")
    clock_file = tmp_path / "clock"
    write_file_time(clock_file, T0)
    scenario = write_scenario(
        tmp_path / "scenario.json",
        {
            "state_dir": str(tmp_path / "lsf"),
            "clock_file": str(clock_file),
            "queues": {
                "normal": {"pilots": {"pend": 2, "run": 30, "outcome": "done"}},
                "broken": {"pilots": {"pend": 1, "run": 1, "outcome": "exit", "exit_code": 127}},
            },
        },
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
            "lsf": {
                "queues": ["normal", "broken"],
                "tokens": False,
                "commands": {n: str(bin_dir / n) for n in ("bsub", "bjobs", "bkill")},
                "env": {"GRIDGATE_LSF_SCENARIO": str(scenario)},
                **section,
            }
        },
        "demand": {"static": {"lsf": 4}},
        "selectors": {"round_robin": {}},
    }
    director = Director(make_config(doc), clock=clock)

    def advance(seconds: float) -> None:
        clock.advance(seconds)
        write_file_time(clock_file, clock.time())

    return director, advance


def names(job_id: str) -> tuple[str, str]:
    """What LSF puts for ``%J`` and ``%I`` (0 outside an array)."""
    base, _, index = job_id.partition("[")
    return base, index.rstrip("]") or "0"


def test_the_o_and_e_files_of_a_done_and_a_failed_pilot(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    director, advance = site(tmp_path, output=f"{out}/%J.%I.out", error=f"{out}/pilot-%J-%I.err")
    try:
        director.run_iteration()
        advance(5)
        director.run_iteration()  # broken's pilots ended, normal's run
        found = pilots_by_state(director)
        running = found["normal/running"][0]
        now = read_output(director.runtime, running, "stdout")
        base, index = names(running.job_id)
        assert now.ok and not now.held and now.where == f"{out}/{base}.{index}.out"
        assert "is not there" in now.message

        failed = found["broken/failed"][0]
        report = read_output(director.runtime, failed, "stdout")
        assert report.ok and report.held, report
        assert report.text.startswith("Sender: LSF System <")
        assert f"Subject: Job {failed.job_id}: <" in report.text
        assert "Exited with exit code 127." in report.text
        assert "The output (if any) follows:" in report.text
        base, index = names(failed.job_id)
        err_path = f"{out}/pilot-{base}-{index}.err"
        assert f"Read file <{err_path}> for stderr output of this job." in report.text
        err = read_output(director.runtime, failed, "stderr")
        assert err.held and err.where == err_path
        assert err.text == f"stand-in stderr of job {failed.job_id}\n"

        advance(40)
        director.run_iteration()
        done = next(
            p for p in pilots_by_state(director)["normal/done"] if p.job_id == running.job_id
        )
        text = read_output(director.runtime, done, "stdout", cap=64)
        assert text.held and text.cut and len(text.text.encode()) == 64
        assert read_output(director.runtime, done, "stdout").text.count("Successfully completed.")
        # a file of its own is not something LSF names
        assert not read_output(director.runtime, done, "file", name="x.log").ok
    finally:
        director.close()


def test_without_e_stderr_is_read_from_the_o_file(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    director, advance = site(tmp_path, output=f"{out}/%J_%I")
    try:
        director.run_iteration()
        advance(5)
        director.run_iteration()
        failed = pilots_by_state(director)["broken/failed"][0]
        err = read_output(director.runtime, failed, "stderr")
        assert err.held and err.where == read_output(director.runtime, failed, "stdout").where
        assert "wrote nothing to stderr" in err.text and "Read file" not in err.text
        assert "LSF writes stderr into the -o file" in err.message
    finally:
        director.close()


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ({}, "LSF mails a job's output"),
        ({"output": "out/%J"}, "not absolute"),
    ],
)
def test_no_path_to_read_says_why(section, said) -> None:
    backend = build_plugin(LsfBackend, {"queues": ["normal"], "tokens": False, **section})
    endpoint = Endpoint("lsf", "normal")
    got = backend.pilot_output(endpoint, "1234[2]", "stdout", "", 1024, False, 10)
    assert got is not None and said in got.message and not got.text
    odd = backend.pilot_output(endpoint, "../1234", "stdout", "", 1024, False, 10)
    assert odd is not None and not odd.ok


def test_the_stand_in_names_files_as_lsf_does() -> None:
    assert output_path("o.%J.%I", "123[4]", "/sub") == "/sub/o.123.4"
    assert output_path("/abs/%J-%I", "123", "/sub") == "/abs/123-0"
