"""Two director processes sharing one Redis and one failing server: one error mail per
episode and one alarm per alarm step, not one per director."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from support.redis_server import RedisServer

HOSTS = ["wms01.example.org", "wms02.example.org", "wms03.example.org"]
FAILING_EXPIRY = 3.0


def director_config(
    tmp_path: Path, name: str, sim_bin: Path, scenario_path: Path, url: str
) -> Path:
    doc = {
        # nothing here hangs: a healthy stand-in must not time out on a loaded machine
        "director": {
            "cycle_seconds": 0.3,
            "max_threads": 3,
            "command_timeout": 30,
            "failing_expiry": FAILING_EXPIRY,
            "ticket_expiry": 60,
            "state_dir": str(tmp_path / name),
            # the stand-in's pilots do not start within these 5 s: with the room reserved in
            # the store (issue 43) the two directors fill max_waiting exactly and then submit
            # nothing, which the stall watch rightly tells; not what this test is about
            "pilots": {"max_waiting": None},
        },
        "state": {"driver": "redis", "url": url, "prefix": "shared-test:"},
        "backends": {
            "wms_glite": {
                "servers": HOSTS,
                "commands": {
                    "submit": str(sim_bin / "glite-wms-job-submit"),
                    "list_match": str(sim_bin / "glite-wms-job-list-match"),
                },
                "list_match": False,
                "env": {"GRIDGATE_SIM_SCENARIO": str(scenario_path)},
            }
        },
        "demand": {"static": {"wms_glite": 6}},
        "notifiers": {"files": {"folder": str(tmp_path / "notes")}},  # one folder for both
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_two_directors_share_one_view(tmp_path, sim_bin, scenario, gridgate_exe) -> None:
    path = scenario(hosts={HOSTS[0]: {"behaviour": "error"}})
    with RedisServer(tmp_path / "redis") as server:
        configs = [director_config(tmp_path, n, sim_bin, path, server.url) for n in ("a", "b")]
        procs = [
            subprocess.Popen(
                [gridgate_exe, "run", "-c", str(c), "--iterations", "16"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for c in configs
        ]
        try:
            for proc in procs:
                _out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    notes = sorted((tmp_path / "notes").glob("*.txt"))
    errors = [n for n in notes if "-error-" in n.name]
    alarms = [n for n in notes if "-alarm-" in n.name]
    assert all(HOSTS[0] in n.name for n in notes), [n.name for n in notes]
    assert len(errors) == 1, [
        n.name for n in notes
    ]  # one error for the episode, not one per director
    # every alarm step is one failing-cache period: two alarms closer than that would be the
    # second director repeating the first
    stamps = sorted(n.stat().st_mtime for n in alarms)
    assert alarms, "the server failed past its failing-cache expiry: alarms were due"
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert all(gap >= FAILING_EXPIRY * 0.9 for gap in gaps), gaps
