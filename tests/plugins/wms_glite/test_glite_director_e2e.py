"""End to end: `gridgate run --once --json` and `gridgate demo` against the stand-in gLite
commands, as separate processes, configured by YAML alone."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

HOSTS = ["wms01.example.org", "wms02.example.org", "wms03.example.org", "wms04.example.org"]


def site(tmp_path: Path, sim_bin: Path, scenario_path: Path, **director) -> Path:
    doc = {
        # the stand-ins answer in well under a second, but a loaded CI host can take seconds to
        # start a Python process: a healthy server must not time out beside the hanging one
        "director": {
            "cycle_seconds": 0.1,
            "max_threads": 4,
            "command_timeout": 6,
            "state_dir": str(tmp_path / "state"),
            **director,
        },
        "state": {"driver": "sqlite", "path": str(tmp_path / "state" / "state.db")},
        "backends": {
            "wms_glite": {
                "servers": HOSTS,
                "commands": {
                    "submit": str(sim_bin / "glite-wms-job-submit"),
                    "list_match": str(sim_bin / "glite-wms-job-list-match"),
                },
                "list_match": True,
                "env": {"GRIDGATE_SIM_SCENARIO": str(scenario_path)},
                "arguments": 'say "hi" $(touch ' + str(tmp_path / "pwned") + ")",
            }
        },
        "demand": {"static": {"wms_glite": 8}},
        "notifiers": {"files": {"folder": str(tmp_path / "notes")}},
        # in turn, not at random: the first four submissions reach all four servers, so the
        # assertions about each server's behaviour do not depend on chance
        "selectors": {"round_robin": {}},
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def run_once(exe: str, config: Path, *more: str) -> list[dict]:
    proc = subprocess.run(
        [exe, "run", "-c", str(config), "--json", *more],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_run_once_json_against_mixed_stand_ins(tmp_path, sim_bin, scenario, gridgate_exe) -> None:
    path = scenario(
        hosts={
            HOSTS[0]: {"behaviour": "overloaded"},
            HOSTS[1]: {"behaviour": "print_then_hang", "hang": 600},
            HOSTS[2]: {"behaviour": "no_match"},
        }
    )
    config = site(tmp_path, sim_bin, path)
    [doc] = run_once(gridgate_exe, config, "--once")
    assert doc["iteration"] == 1
    kinds = {f["endpoint"]: f["kind"] for f in doc["failures"]}
    assert kinds.get(HOSTS[0]) == "overload"
    assert kinds.get(HOSTS[1]) == "timeout"
    assert {f["timed_out"] for f in doc["failures"] if f["endpoint"] == HOSTS[1]} == {True}
    assert HOSTS[0] in doc["excluded"] and HOSTS[1] in doc["excluded"]
    assert all(s["endpoint"] == HOSTS[3] for s in doc["submitted"])
    assert all(
        j.startswith("https://lb01.example.org:9000/")
        for s in doc["submitted"]
        for j in s["job_ids"]
    )
    # overload is the server protecting itself: no mail; the hang is a timeout mail
    subjects = [n["subject"] for n in doc["notifications"]]
    assert subjects == [f"{HOSTS[1]}: timeout executing List Match [timeout]"]
    assert doc["no_match"] >= 0
    attempts = (
        len(doc["submitted"])
        + len(doc["failures"])
        + doc["skipped"]
        + doc["no_match"]
        + doc["refused"]
    )
    # a failed submission retried elsewhere is one more attempt for the same pilot
    retried = sum(1 for r in doc["retries"] if r["outcome"] == "retried")
    assert {r["failed_on"] for r in doc["retries"]} <= {HOSTS[0], HOSTS[1]}
    assert attempts - retried == 8
    assert not (tmp_path / "pwned").exists()  # config text never reached a shell


def test_failing_cache_survives_a_restart(tmp_path, sim_bin, scenario, gridgate_exe) -> None:
    path = scenario(hosts={HOSTS[0]: {"behaviour": "error"}}, default={"behaviour": "healthy"})
    config = site(tmp_path, sim_bin, path, command_timeout=30)  # nothing here hangs
    first = run_once(gridgate_exe, config, "--once")[0]
    assert [n["level"] for n in first["notifications"]] == ["error"]
    second = run_once(gridgate_exe, config, "--once")[0]  # a new process, same sqlite state
    assert second["notifications"] == []
    assert all(s["endpoint"] != HOSTS[0] for s in second["submitted"])
    assert all(f["endpoint"] != HOSTS[0] for f in second["failures"])


def test_report_counts_what_run_submitted(tmp_path, sim_bin, scenario, gridgate_exe) -> None:
    config = site(tmp_path, sim_bin, scenario())
    docs = run_once(gridgate_exe, config, "--iterations", "2")
    pilots = sum(len(d["submitted"]) for d in docs)
    report = subprocess.run(
        [gridgate_exe, "report", "-c", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    table = json.loads(report.stdout)
    assert sum(sum(row.values()) for row in table["pilots"].values()) == pilots


def test_demo_runs_and_reports_per_server(tmp_path, gridgate_exe) -> None:
    proc = subprocess.run(
        [gridgate_exe, "demo", "--duration", "6", "--dir", str(tmp_path / "demo"), "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["pilots"] > 0
    servers = result["servers"]
    assert servers["wms06.example.org"]["failures"] == {
        "overload": servers["wms06.example.org"]["failures"]["overload"]
    }
    assert servers["wms06.example.org"]["errors"] == 0  # overloaded: excluded, no mail
    assert servers["wms09.example.org"]["errors"] == 1
    assert servers["wms01.example.org"]["submitted"] > 0
    assert list(Path(result["notifications"]).glob("*-error-wms09.example.org.txt"))
