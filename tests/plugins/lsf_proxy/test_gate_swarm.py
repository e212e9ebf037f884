"""Many gated clients at once against the stand-in master daemon: 100 concurrent `gridgate gate`
calls of bjobs by an ordinary user never run more than max at a time, and directors submitting
with the lsf backend plus a swarm of gated queries never push the master past the limits."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.polling import until
from support.ports import free_port
from support.uids import AS_NOBODY

from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.sim import install_commands, start_master, write_scenario

#: The stand-ins must be runnable by nobody; this interpreter may live in root's home.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.fixture
def lsf_world(sockdir):
    """Stand-in bjobs/bsub for everyone, a master daemon, and a scenario pointing at it."""
    bin_dir = install_commands(sockdir / "bin", python=SYSTEM_PYTHON)
    lsf_state = sockdir / "lsf"
    lsf_state.mkdir()
    lsf_state.chmod(0o777)  # nobody's bsub writes the job table
    master = start_master(sockdir / "master.sock", base=0.5, knee=1000)
    scenario = write_scenario(
        sockdir / "scenario.json", {"master": master.socket, "state_dir": str(lsf_state)}
    )
    try:
        yield bin_dir, master, scenario
    finally:
        master.stop()


def in_use(_cli, socket: str) -> dict[str, int]:
    """Tokens in use per category, asked in-process (no CLI start-up on a loaded machine)."""
    with ProxyClient([Daemon("proxyd", socket)]) as client:
        [reply] = client.admin("status")
    cats = reply.reply["status"]["categories"]
    return {name: c["in_use"] for name, c in cats.items()}


def launch(argv: list[str], env: dict, out_dir: Path, index: int) -> tuple[subprocess.Popen, Path]:
    err = out_dir / f"{index}.err"
    with open(out_dir / f"{index}.out", "wb") as out, open(err, "wb") as errf:
        proc = subprocess.Popen(argv, stdout=out, stderr=errf, env=env, cwd="/")
    return proc, err


def wait_all(procs, deadline: float) -> list[int]:
    codes = []
    for proc, _ in procs:
        codes.append(proc.wait(max(1.0, deadline - time.monotonic())))
    return codes


@pytest.mark.timeout(600)
def test_100_concurrent_gated_queries_never_exceed_max(
    start_daemon, cli, gridgate_exe, lsf_world, tmp_path
) -> None:
    bin_dir, master, scenario = lsf_world
    daemon = start_daemon({"policies": "QUERY[max=8 nominal=4 throttle=1]", "token_wait_time": 120})
    env = {**os.environ, "GRIDGATE_LSF_SCENARIO": str(scenario)}
    env.pop("GRIDGATE_GATE_TOKEN", None)
    # control: without the gate the same command piles up on a master (a slow one, so that
    # the overlap does not depend on how fast this machine starts processes)
    slow = start_master(bin_dir.parent / "slow.sock", base=5.0, knee=1000)  # nobody can reach it
    try:
        slow_env = {**env, "GRIDGATE_LSF_MASTER": slow.socket}
        control = [
            launch(AS_NOBODY + [str(bin_dir / "bjobs")], slow_env, tmp_path, -i - 1)
            for i in range(30)
        ]
        assert wait_all(control, time.monotonic() + 300) == [0] * 30
        assert slow.stats()["max_in_flight"] > 8
    finally:
        slow.stop()

    argv = AS_NOBODY + [
        gridgate_exe,
        "gate",
        "-c",
        str(daemon.config),
        "--",
        str(bin_dir / "bjobs"),
    ]
    # -c: the gates read the daemon's own config, so they wait for an answer as long as the
    # daemon may keep them waiting (a client that gives up first proceeds without a token)
    # 100 (twelve times the limit): each gated call is three processes (setpriv, the gate,
    # bjobs) started on a machine that may have two cores, so a swarm of 200 took a minute
    procs = [launch(argv, env, tmp_path, i) for i in range(100)]
    codes = wait_all(procs, time.monotonic() + 500)
    refused = [err.read_text() for (_, err), code in zip(procs, codes, strict=True) if code == 75]
    assert set(codes) <= {0, 75}, [c for c in codes if c not in (0, 75)]
    assert all("bjobs: no query token, not run" in text for text in refused)
    assert not [e for (_, e) in procs if "without a token" in e.read_text()]
    stats = master.stats()
    assert stats["max_in_flight"] <= 8
    assert stats["max_in_flight"] >= 2  # the calls did overlap: the bound above was the gate's
    assert stats["completed"] == codes.count(0)
    assert until(lambda: in_use(cli, daemon.socket) == {"query": 0, "submission": 0, "other": 0})


def director_site(
    folder: Path, bin_dir: Path, scenario: Path, daemon_address: str, key: Path, demand: int
) -> Path:
    folder.mkdir()
    doc = {
        "director": {
            "cycle_seconds": 1,
            "max_threads": 8,
            "command_timeout": 60,
            "state_dir": str(folder / "state"),
        },
        "state": {"driver": "sqlite", "path": str(folder / "state.db")},
        # the client waits for an answer as long as the daemon may keep a request waiting
        "proxyd": {
            "hosts": [{"name": "proxy1", "address": daemon_address}],
            "key": {"file": str(key)},
            "token_wait_time": 120,
        },
        "backends": {
            "lsf": {
                "queues": ["normal"],
                "tokens": True,
                "token_user": "pilots",
                "notoken_ntries": 5,
                "commands": {"bsub": str(bin_dir / "bsub"), "bjobs": str(bin_dir / "bjobs")},
                "env": {"GRIDGATE_LSF_SCENARIO": str(scenario)},
            }
        },
        "demand": {"static": {"lsf": demand}},
        "notifiers": {"files": {"folder": str(folder / "notes")}},
    }
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.mark.timeout(600)
def test_directors_and_gated_queries_stay_within_the_limits(
    start_daemon, cli, gridgate_exe, lsf_world, sockdir, tmp_path
) -> None:
    """Two directors (their own processes, on the daemon's signed TCP port as the service
    account ``pilots``, as directors on other hosts would be) and 40 gated bjobs by nobody."""
    bin_dir, master, scenario = lsf_world
    key = tmp_path / "proxyd.key"
    key.write_text("s3cret-shared-key\n", encoding="utf-8")
    key.chmod(0o600)
    address = f"127.0.0.1:{free_port()}"
    daemon = start_daemon(
        {
            "policies": "SUBMISSION[max=3] QUERY[max=5]",
            "token_wait_time": 120,
            "tcp": address,
            "key": {"file": str(key)},
        }
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GRIDGATE_GATE_TOKEN", "GRIDGATE_PROXYD_SOCKET")
    }
    directors = []
    for n in range(2):
        config = director_site(tmp_path / f"director{n}", bin_dir, scenario, address, key, 12)
        err = tmp_path / f"director{n}.err"
        with open(err, "wb") as errf:
            directors.append(
                (
                    subprocess.Popen(
                        [gridgate_exe, "run", "-c", str(config), "--once", "--json"],
                        stdout=subprocess.PIPE,
                        stderr=errf,
                        env=env,
                    ),
                    err,
                )
            )
    query_env = {**env, "GRIDGATE_LSF_SCENARIO": str(scenario)}
    argv = AS_NOBODY + [
        gridgate_exe,
        "gate",
        "-c",
        str(daemon.config),
        "--",
        str(bin_dir / "bjobs"),
    ]
    swarm = [launch(argv, query_env, tmp_path, i) for i in range(40)]
    assert set(wait_all(swarm, time.monotonic() + 400)) <= {0, 75}
    submitted = 0
    for proc, err in directors:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.read_text()
        submitted += json.loads(out.splitlines()[-1])["pilots_submitted"]
    assert submitted == 24
    stats = master.stats()
    by_command = stats["max_in_flight_by_command"]
    assert by_command["bsub"] <= 3 and by_command["bjobs"] <= 5
    assert by_command["bsub"] >= 2  # the directors did overlap
    assert stats["max_in_flight"] <= 8
    assert stats["by_command"]["bsub"] == 24
    assert until(lambda: in_use(cli, daemon.socket) == {"query": 0, "submission": 0, "other": 0})
