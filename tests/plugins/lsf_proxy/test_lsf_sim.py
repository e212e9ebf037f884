"""The stand-in bsub/bjobs print what formats.md says LSF prints, and the stand-in master daemon
counts concurrent requests and slows down as they pile up."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gridgate.plugins.lsf_proxy.sim import install_commands, start_master, write_scenario
from gridgate.plugins.lsf_proxy.sim.master import call, percentile, service_time

HEADER = "JOBID   USER    STAT  QUEUE      FROM_HOST   EXEC_HOST   JOB_NAME   SUBMIT_TIME"


@pytest.fixture
def lsf(tmp_path):
    bin_dir = install_commands(tmp_path / "bin")

    def run(program: str, *args: str, scenario: dict | None = None, timeout: float = 30):
        env = dict(os.environ)
        if scenario is not None:
            data = {"state_dir": str(tmp_path / "lsf"), **scenario}
            env["GRIDGATE_LSF_SCENARIO"] = str(write_scenario(tmp_path / "scenario.json", data))
        return subprocess.run(
            [str(bin_dir / program), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )

    return run


def test_bsub_success_lines(lsf) -> None:
    first = lsf("bsub", "-q", "short", "-J", "pilot", "pilot.sh", scenario={})
    assert first.returncode == 0
    assert first.stdout == "Job <1001> is submitted to queue <short>.\n"
    second = lsf("bsub", "pilot.sh", scenario={"default_queue": "normal"})
    assert second.stdout == "Job <1002> is submitted to default queue <normal>.\n"


def test_bsub_preamble_comes_before_the_answer(lsf) -> None:
    out = lsf("bsub", "-q", "normal", "x", scenario={"queues": {"normal": {"preamble": 2}}})
    assert out.returncode == 0
    assert out.stdout.splitlines() == ["Cannot connect to LSF. Please wait ..."] * 2 + [
        "Job <1001> is submitted to queue <normal>."
    ]


@pytest.mark.parametrize(
    ("behaviour", "line"),
    [
        ("no_such_queue", "No such queue. Job not submitted."),
        ("too_many_processors", "Too many processors requested. Job not submitted."),
        ("rusage_error", "Error in rusage section. Job not submitted."),
        ("non_lsf_host", "Request from non-LSF host rejected"),
        ("lim_down", "Failed in an LSF library call: LIM is down; try later. Job not submitted."),
    ],
)
def test_bsub_failures_exit_255(lsf, behaviour, line) -> None:
    out = lsf("bsub", "-q", "q1", "x", scenario={"queues": {"q1": {"behaviour": behaviour}}})
    assert out.returncode == 255
    assert out.stderr.strip() == line
    assert "Job <" not in out.stdout


def test_bsub_checks_the_request_like_mbatchd(lsf) -> None:
    scenario = {"known_queues": ["normal"], "max_processors": 4}
    assert "No such queue" in lsf("bsub", "-q", "nope", "x", scenario=scenario).stderr
    assert (
        "Too many processors"
        in lsf("bsub", "-q", "normal", "-n", "5", "x", scenario=scenario).stderr
    )
    bad = lsf("bsub", "-q", "normal", "-R", "select[mem>1", "x", scenario=scenario)
    assert (bad.returncode, bad.stderr.strip()) == (
        255,
        "Bad resource requirement syntax. Job not submitted.",
    )
    assert (
        lsf(
            "bsub", "-q", "normal", "-n", "4", "-R", "select[mem>1]", "x", scenario=scenario
        ).returncode
        == 0
    )


def test_bjobs_table_format_and_not_found(lsf) -> None:
    scenario = {"job_stat": "RUN"}
    assert lsf("bjobs", scenario=scenario).stderr.strip() == "No unfinished job found"
    lsf("bsub", "-q", "normal", "-J", "pilot", "x", scenario=scenario)
    table = lsf("bjobs", scenario=scenario)
    lines = table.stdout.splitlines()
    assert lines[0] == HEADER
    assert lines[1].split()[:7] == [
        "1001",
        lines[1].split()[1],
        "RUN",
        "normal",
        lines[1].split()[4],
        lines[1].split()[4],
        "pilot",
    ]
    short = lsf(
        "bjobs",
        "-noheader",
        "-o",
        "jobid stat exec_host delimiter='^'",
        "1001",
        "77",
        scenario=scenario,
    )
    assert short.stdout.strip().split("^")[:2] == ["1001", "RUN"]
    assert short.stderr.strip() == "Job <77> is not found"
    assert short.returncode == 255


def test_unknown_behaviour_is_a_clear_error(lsf) -> None:
    out = lsf("bsub", "x", scenario={"default": {"behaviour": "explode"}})
    assert out.returncode == 2 and "unknown bsub behaviour 'explode'" in out.stderr


def test_service_time_grows_with_concurrency() -> None:
    times = [service_time(n, 0.01, 8) for n in (1, 8, 16, 64)]
    assert times == sorted(times) and times[0] == 0.01
    # past the knee the master completes fewer requests per second the more it is asked
    rate = [n / service_time(n, 0.01, 8) for n in (8, 32, 100)]
    assert rate[0] > rate[1] > rate[2]
    assert percentile([1, 2, 3, 4], 0.5) == 2 and percentile([], 0.99) == 0.0


def test_master_counts_concurrent_requests(tmp_path, lsf) -> None:
    sock = str(tmp_path / "master.sock")
    with start_master(sock, base=0.3, knee=100) as master:
        threads = [
            threading.Thread(target=call, args=(sock, {"op": "request", "command": "bjobs"}))
            for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        stats = master.stats()
        assert stats["completed"] == 6 and stats["in_flight"] == 0
        assert 2 <= stats["max_in_flight"] <= 6
        assert stats["max_in_flight_by_command"] == {"bjobs": stats["max_in_flight"]}
        # the stand-in commands contact it when the scenario names it
        assert lsf("bjobs", scenario={"master": sock}).returncode == 0
        assert master.stats()["by_command"]["bjobs"] == 7
        master.reset()
        assert master.stats()["completed"] == 0
        assert call(sock, {"op": "what"})["ok"] is False
    assert master.proc.returncode == 0 and not Path(sock).exists()


def test_commands_fail_like_lsf_when_the_master_is_down(lsf, tmp_path) -> None:
    out = lsf("bsub", "x", scenario={"master": str(tmp_path / "gone.sock")})
    assert out.returncode == 255
    assert "batch system daemon not responding ... still trying" in out.stderr
    query = lsf("bjobs", scenario={"master": str(tmp_path / "gone.sock")})
    assert query.returncode == 255 and "LIM is down" in query.stderr


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_master_stops_when_its_starter_dies(tmp_path) -> None:
    code = (
        "import os, sys; from gridgate.plugins.lsf_proxy.sim import start_master; "
        f"m = start_master({str(tmp_path / 'm.sock')!r}); print(m.proc.pid, flush=True); "
        "os._exit(0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout)
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling a real process's exit, no expiry involved
    assert not _alive(pid)
