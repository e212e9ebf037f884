"""`gridgate demo` ends with what became of its pilots: per server waiting / running / done /
failed, every accepted pilot counted once, the aborting server's pilots all failed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gridgate.plugins.wms_glite.demo_pilots import ABORTING, COLUMNS


@pytest.mark.timeout(300)
def test_demo_table_of_pilot_states(tmp_path, gridgate_exe) -> None:
    folder = tmp_path / "demo"
    proc = subprocess.run([gridgate_exe, "demo", "--duration", "8", "--dir", str(folder), "--json",
                           "--admission", "none"],
                          capture_output=True, text=True, timeout=240, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    states = result["pilot_states"]
    # every pilot a server accepted is in its row, once (the accounting says how many)
    for host, row in result["servers"].items():
        if row["submitted"]:
            assert sum(states[host][c] for c in COLUMNS) == row["submitted"], host
        else:
            assert host not in states
    assert states[ABORTING]["failed"] > 0
    assert states[ABORTING]["done"] == 0 and states[ABORTING]["running"] == 0
    healthy = states["wms01.example.org"]
    assert healthy["done"] + healthy["running"] + healthy["waiting"] > 0


def test_demo_table_renders_a_row_per_server_that_took_pilots() -> None:
    from gridgate.plugins.wms_glite.demo_pilots import render_pilots

    lines = render_pilots({"wms01.example.org": {"waiting": 1, "running": 2, "done": 3, "failed": 4}},
                          ["wms01.example.org", "wms02.example.org"],
                          {"wms01.example.org": "out of rotation: aborted"})
    assert lines[1].split() == ["pilots", "by", "state", "waiting", "running", "done", "failed", "note"]
    assert lines[3].split() == ["wms01.example.org", "1", "2", "3", "4", "out", "of", "rotation:", "aborted"]
    assert len(lines) == 4
