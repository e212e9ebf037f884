"""`gridgate demo` ends with what became of its pilots: per server waiting / running / done /
failed as the director tracked them, every accepted pilot counted once, and the server whose
pilots all abort taken out of rotation."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gridgate.demo.pilots import ABORTING, COLUMNS


@pytest.mark.timeout(300)
def test_demo_table_of_pilot_states(tmp_path, gridgate_exe) -> None:
    folder = tmp_path / "demo"
    proc = subprocess.run(
        [
            gridgate_exe,
            "demo",
            "--duration",
            "12",
            "--dir",
            str(folder),
            "--json",
            "--admission",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    states = result["pilot_states"]
    # every pilot a server accepted is in its row, once (the accounting says how many)
    for host, row in result["servers"].items():
        if row["submitted"]:
            assert sum(states[host][c] for c in COLUMNS) == row["submitted"], host
        else:
            assert host not in states
    assert states[ABORTING]["failed"] >= 5  # the verdict needs 5 finished pilots
    assert states[ABORTING]["done"] == 0 and states[ABORTING]["running"] == 0
    assert result["left_rotation"] == {ABORTING: "left rotation: its pilots abort"}
    assert result["servers"][ABORTING]["errors"] == 1
    # its failures are the verdicts, by kind, though no submission of it failed
    assert set(result["servers"][ABORTING]["failures"]) == {"aborted"}
    assert result["servers"][ABORTING]["failures"]["aborted"] >= 1
    assert result["servers"][ABORTING]["failed_submissions"] == 0
    # the director's view lags the stand-in's bookkeeping by at most one poll, never leads it
    truth = result["stand_in_states"]
    assert truth[ABORTING]["failed"] >= states[ABORTING]["failed"]
    assert sum(truth["wms01.example.org"].values()) == sum(states["wms01.example.org"].values())
    assert truth["wms01.example.org"]["done"] >= states["wms01.example.org"]["done"]
    assert f"{ABORTING}: its last finished pilots failed; out of rotation" in proc.stderr


def test_demo_table_renders_a_row_per_server_that_took_pilots() -> None:
    from gridgate.demo.pilots import render_pilots

    lines = render_pilots(
        {"wms01.example.org": {"waiting": 1, "running": 2, "done": 3, "failed": 4}},
        ["wms01.example.org", "wms02.example.org"],
        {"wms01.example.org": "out of rotation: aborted"},
    )
    assert lines[2].split() == ["server", "waiting", "running", "done", "failed", "note"]
    assert lines[4].split() == [
        "wms01.example.org",
        "1",
        "2",
        "3",
        "4",
        "out",
        "of",
        "rotation:",
        "aborted",
    ]
    assert len(lines) == 9  # wms02 took no pilot: no row; the footer explains the failed column
    assert "normal failure rate" in "\n".join(lines[-4:])
