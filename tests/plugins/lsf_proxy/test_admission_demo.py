"""`gridgate demo` with its submissions behind admission: a real token daemon (remote, the
default) or the in-process policy (local), and the table shows grants, waits and refusals."""

from __future__ import annotations

import json
import os
import subprocess

import pytest


def demo(exe: str, folder, *extra: str) -> tuple[dict, str]:
    proc = subprocess.run(
        [exe, "demo", "--duration", "5", "--dir", str(folder), *extra],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr
    return (json.loads(proc.stdout) if "--json" in extra else {}), proc.stdout


@pytest.mark.timeout(300)
def test_demo_submissions_take_tokens_from_a_daemon(tmp_path, gridgate_exe) -> None:
    result, _ = demo(gridgate_exe, tmp_path / "remote", "--json")
    admission = result["admission"]
    assert admission["mode"] == "remote" and admission["policy"].startswith("SUBMISSION[max=8")
    servers = admission["servers"]
    granted = sum(s["granted"] for s in servers.values())
    attempts = result["pilots"] + sum(s["failed_submissions"] for s in result["servers"].values())
    # every submission that reached a server held a token, and none was refused at 16 threads
    assert granted == attempts and result["refused"] == 0
    assert sum(s["waited"] for s in servers.values()) > 0  # 16 threads, 8 tokens: some waited
    assert not (tmp_path / "remote" / "proxyd.sock").exists()  # the daemon was stopped
    assert result["servers"]["wms09.example.org"]["errors"] == 1  # the demo's story still holds


@pytest.mark.timeout(300)
def test_demo_local_admission_table(tmp_path, gridgate_exe) -> None:
    _, text = demo(gridgate_exe, tmp_path / "local", "--admission", "local")
    header = next(line for line in text.splitlines() if line.startswith("server"))
    assert header.endswith("tokens  waited  wait s refused")
    assert "admission: in-process tokens, at most 2 submissions in flight per server" in text
    row = next(line for line in text.splitlines() if line.startswith("wms01.example.org"))
    pilots, tokens = int(row.split()[2]), int(row.split()[-4])
    assert tokens >= pilots > 0
