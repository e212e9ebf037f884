"""The stand-in gLite commands: faithful output, options, and per-host behaviour."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gridgate.core.model import CommandResult
from gridgate.core.runner import run
from gridgate.plugins.wms_glite.parse import parse_job_ids
from gridgate.plugins.wms_glite.sim import Call, install_commands, max_concurrency, read_calls

HOST = "wms01.example.org"
EP = f"https://{HOST}:7443/glite_wms_wmproxy_server"
SUBMIT_BANNER = "====================== glite-wms-job-submit Success ======================"


@pytest.fixture
def jdl(tmp_path: Path) -> Path:
    path = tmp_path / "job.jdl"
    path.write_text('[\n  Executable = "pilot.sh";\n]\n')
    return path


@pytest.fixture
def sim(sim_bin: Path, scenario: Callable[..., Path], jdl: Path) -> Callable[..., CommandResult]:
    """Run a stand-in: ``sim(args, hosts=..., command=...)``."""

    def go(
        args: list[str] | None = None,
        hosts: dict[str, Any] | None = None,
        command: str = "glite-wms-job-submit",
        timeout: float = 10.0,
    ) -> CommandResult:
        path = scenario(hosts=hosts or {})
        env = {**os.environ, "GRIDGATE_SIM_SCENARIO": str(path)}
        argv = [
            str(sim_bin / command),
            *(args if args is not None else ["--noint", "--endpoint", EP, "-a", str(jdl)]),
        ]
        return run(argv, timeout, env=env, kill_grace=0.5)

    return go


def test_install_writes_executables_and_touches_no_path(tmp_path: Path) -> None:
    before = os.environ.get("PATH", "")
    bin_dir = install_commands(tmp_path / "private" / "bin")
    for name in ("glite-wms-job-submit", "glite-wms-job-list-match"):
        assert os.access(bin_dir / name, os.X_OK)
        assert (bin_dir / name).read_text().startswith("#!")
    assert os.environ.get("PATH", "") == before
    assert str(bin_dir) not in before.split(os.pathsep)
    assert shutil.which("glite-wms-job-submit") != str(bin_dir / "glite-wms-job-submit")


def test_submit_default_output_is_the_real_layout(sim: Callable[..., CommandResult]) -> None:
    result = sim()
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.split("\n")
    assert lines[:5] == ["", f"Connecting to the service {EP}", "", "", SUBMIT_BANNER]
    assert lines[6:9] == [
        "The job has been successfully submitted to the WMProxy",
        "Your job identifier is:",
        "",
    ]
    assert parse_job_ids(lines[9]) == (lines[9],)
    assert lines[11] == "=" * 74


def test_banner_follows_the_program_name(sim: Callable[..., CommandResult]) -> None:
    result = sim(command="glite-wms-job-list-match")
    assert "COMPUTING ELEMENT IDs LIST" in result.stdout
    no_match = sim(command="glite-wms-job-list-match", hosts={HOST: {"behaviour": "no_match"}})
    assert (
        "==================== glite-wms-job-list-match failure ===================="
        in no_match.stdout
    )
    assert no_match.returncode == 0


def test_nomsg_json_and_output_file(
    sim: Callable[..., CommandResult], jdl: Path, tmp_path: Path
) -> None:
    nomsg = sim(["--noint", "--nomsg", "-e", EP, "-a", str(jdl)])
    assert nomsg.returncode == 0 and parse_job_ids(nomsg.stdout) == (nomsg.stdout.strip(),)
    assert nomsg.stdout.count("\n") == 1
    out = tmp_path / "ids.txt"
    js = sim(["--json", "--endpoint", EP, "-d", "deleg", "-o", str(out), str(jdl)])
    data = json.loads(js.stdout)
    assert data["result"] == "success" and data["endpoint"] == EP
    assert out.read_text() == f"###Submitted Job Ids###\n{data['jobid']}\n"


def test_endpoint_from_long_option_with_equals_or_environment(
    sim_bin: Path, scenario: Callable[..., Path], jdl: Path, calls_log: Path
) -> None:
    path = scenario(hosts={HOST: {"behaviour": "drained"}})
    env = {**os.environ, "GRIDGATE_SIM_SCENARIO": str(path)}
    submit = str(sim_bin / "glite-wms-job-submit")
    assert run([submit, f"--endpoint={EP}", "-a", str(jdl)], 10, env=env).returncode == 1
    env["GLITE_WMS_WMPROXY_ENDPOINT"] = EP
    assert run([submit, "-a", str(jdl)], 10, env=env).returncode == 1
    del env["GLITE_WMS_WMPROXY_ENDPOINT"]
    nowhere = run([submit, "-a", str(jdl)], 10, env=env)
    assert nowhere.returncode == 1 and "Unable to contact any specified enpoint" in nowhere.stderr
    assert [c.host for c in read_calls(calls_log)] == [HOST, HOST, ""]


def test_parametric_json_lists_children(sim: Callable[..., CommandResult], tmp_path: Path) -> None:
    bulk = tmp_path / "bulk.jdl"
    bulk.write_text('[\n  JobType = "Parametric";\n  Parameters = 4;\n]\n')
    data = json.loads(sim(["--json", "-e", EP, "-a", str(bulk)]).stdout)
    assert len(data["children"]) == 4 and data["parent"] not in data["children"].values()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-e", EP, "-a", "-d", "x", "JDL"], "cannot be specified together"),
        (["-e", EP, "JDL"], "A mandatory option is missing"),
        (["-e", EP, "-a", "--bogus", "JDL"], "unrecognized option '--bogus'"),
        (["-e", EP, "-a"], "JDL file"),
        (["-e"], "requires an argument"),
    ],
)
def test_usage_errors_exit_255(
    sim: Callable[..., CommandResult], jdl: Path, args: list[str], message: str
) -> None:
    result = sim([str(jdl) if a == "JDL" else a for a in args])
    assert result.returncode == 255
    assert message in result.stderr and "Usage: glite-wms-job-submit" in result.stderr


def test_nomsg_is_a_submit_only_option(sim: Callable[..., CommandResult], jdl: Path) -> None:
    result = sim(["--nomsg", "-e", EP, "-a", str(jdl)], command="glite-wms-job-list-match")
    assert result.returncode == 255


def test_unknown_behaviour_in_the_scenario_is_a_clear_error(
    sim: Callable[..., CommandResult],
) -> None:
    result = sim(hosts={HOST: {"behaviour": "explode"}})
    assert result.returncode == 1 and "unknown behaviour 'explode'" in result.stderr


def test_flapping_fails_every_kth_call(sim: Callable[..., CommandResult]) -> None:
    hosts = {HOST: {"behaviour": "flapping", "every": 3, "fail_as": "overloaded"}}
    codes = [sim(hosts=hosts).returncode for _ in range(6)]
    assert codes == [0, 0, 1, 0, 0, 1]


def test_call_counter_is_exact_under_concurrency(
    sim: Callable[..., CommandResult], calls_log: Path
) -> None:
    hosts = {HOST: {"behaviour": "healthy", "latency": 0.2}}
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda _: sim(hosts=hosts), range(6)))
    assert all(r.returncode == 0 for r in results)
    calls = read_calls(calls_log)
    assert sorted(c.call for c in calls) == [1, 2, 3, 4, 5, 6]
    assert all(c.end is not None and c.end >= c.start for c in calls)


def test_slow_then_recover_by_calls(sim: Callable[..., CommandResult]) -> None:
    hosts = {HOST: {"behaviour": "slow_then_recover", "calls": 2, "fail_as": "drained"}}
    results = [sim(hosts=hosts) for _ in range(3)]
    assert [r.returncode for r in results] == [1, 1, 0]
    assert "temporarily drained" in results[0].stderr


def test_slow_then_recover_by_wall_time(sim: Callable[..., CommandResult]) -> None:
    failing = {
        HOST: {
            "behaviour": "slow_then_recover",
            "until": time.time() + 3600,
            "fail_as": "unreachable",
        }
    }
    assert sim(hosts=failing).returncode == 1
    recovered = {
        HOST: {"behaviour": "slow_then_recover", "until": time.time() - 1, "fail_as": "unreachable"}
    }
    assert sim(hosts=recovered).returncode == 0


def test_slow_then_recover_slow_phase_is_a_timeout(sim: Callable[..., CommandResult]) -> None:
    hosts = {HOST: {"behaviour": "slow_then_recover", "calls": 1, "slow_latency": 600}}
    # 4 s: the stand-in must have counted its call before it is killed, or the next call
    # would be the slow first one again
    slow = sim(hosts=hosts, timeout=4.0)
    assert slow.timed_out
    assert sim(hosts=hosts).returncode == 0


def test_calls_log_records_behaviour_and_jdl(
    sim: Callable[..., CommandResult], calls_log: Path
) -> None:
    sim(hosts={HOST: {"behaviour": "flapping", "every": 1}})
    (call,) = read_calls(calls_log)
    assert (call.host, call.behaviour, call.effective) == (HOST, "flapping", "unreachable")
    assert 'Executable = "pilot.sh";' in call.jdl and call.end is not None


def test_killed_call_has_no_end(sim: Callable[..., CommandResult], calls_log: Path) -> None:
    # 3 s: the stand-in must have started (and logged its call) before the deadline kills it;
    # on a loaded machine Python alone can take longer than the 0.5 s this used to allow
    sim(hosts={HOST: {"behaviour": "hang_before_print"}}, timeout=3)
    (call,) = read_calls(calls_log)
    assert call.end is None


def test_max_concurrency() -> None:
    def c(start: float, end: float | None) -> Call:
        return Call(1, "x", "h", "b", "b", 1, start, end)

    assert max_concurrency([]) == 0
    assert max_concurrency([c(0, 1), c(1, 2)]) == 1  # touching, not overlapping
    assert max_concurrency([c(0, 3), c(1, 2), c(1.5, 4)]) == 3
    assert max_concurrency([c(0, None), c(5, 6)], now=4) == 1
    assert max_concurrency([c(0, None), c(5, 6)]) == 2
