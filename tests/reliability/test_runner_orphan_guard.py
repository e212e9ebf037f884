"""The runner's orphan guard: a caller killed with SIGKILL takes its commands' groups with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from relkit import alive, proc_table, wait_for

from gridgate.core.runner import orphan_guard, run

CALLER = r"""
import sys, threading
from gridgate.core.runner import orphan_guard, run
marker, guarded = sys.argv[1], sys.argv[2] == "1"
# The command forks a grandchild into its group, then both sleep "forever".
code = ("import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]]); "
        "time.sleep(600)")
def go():
    run([sys.executable, "-c", code, marker], timeout=600)
if guarded:
    orphan_guard().__enter__()
for _ in range(3):
    threading.Thread(target=go, daemon=True).start()
print("started", flush=True)
threading.Event().wait()
"""


def _marked(marker: str) -> list[int]:
    found = []
    for pid in proc_table():
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() and alive(pid):
                found.append(pid)
        except OSError:
            pass
    return found


def _caller_killed(tmp_path: Path, guarded: bool) -> list[int]:
    """Start a caller with 3 commands (6 processes) in flight, SIGKILL it; return survivors
    after the guard had its chance (killing them afterwards so nothing outlives the test)."""
    marker = str(tmp_path / "orphan-marker")
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, marker, "1" if guarded else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert caller.stdout is not None and caller.stdout.readline() == "started\n"

        def commands() -> list[int]:
            return [pid for pid in _marked(marker) if pid != caller.pid]

        wait_for(lambda: len(commands()) == 6, 30, "3 commands and 3 grandchildren")
        groups = {proc_table()[pid][1] for pid in commands()}
        assert len(groups) == 3 and caller.pid not in groups
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait(30)
        caller.stdout.close()  # type: ignore[union-attr]
    try:
        if guarded:
            wait_for(lambda: not _marked(marker), 10, "the guard to kill the orphans")
        return _marked(marker)
    finally:
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(60)
def test_guarded_caller_killed_leaves_nothing(tmp_path: Path) -> None:
    assert _caller_killed(tmp_path, guarded=True) == []


@pytest.mark.timeout(60)
def test_unguarded_caller_killed_leaves_orphans(tmp_path: Path) -> None:
    # The finding the guard answers: each command leads its own session, so without the
    # guard SIGKILL of the caller orphans the commands and their grandchildren.
    assert len(_caller_killed(tmp_path, guarded=False)) == 6


@pytest.mark.timeout(60)
def test_guard_nests_and_leaves_no_watchdog() -> None:
    def watchdogs() -> set[int]:
        return {
            pid for pid, (ppid, _g, st) in proc_table().items() if ppid == os.getpid() and st != "Z"
        }

    before = watchdogs()
    with orphan_guard():
        with orphan_guard():
            assert run([sys.executable, "-c", "print('ok')"], timeout=30).stdout == "ok\n"
        assert len(watchdogs() - before) == 1  # still armed by the outer block
    assert watchdogs() - before == set()
