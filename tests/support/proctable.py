"""Reading the process table from /proc: which processes a test left running."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path


def proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, pgid, state) for every process visible in /proc."""
    table: dict[int, tuple[int, int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: split after the last ')'.
        fields = raw[raw.rindex(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def live_descendants(root: int) -> set[int]:
    """Non-zombie processes whose parent chain leads to ``root``."""
    table = proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {pid for pid in found if table[pid][2] != "Z"}


def live_in_group(pgid: int) -> set[int]:
    """Non-zombie members of process group ``pgid`` (zombies may wait on a lazy init)."""
    return {pid for pid, (_pp, g, state) in proc_table().items() if g == pgid and state != "Z"}


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker`` (a test's private path)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and alive(int(entry)):
            found.append(int(entry))
    return found


@contextlib.contextmanager
def no_child_left(grace: float = 5.0) -> Iterator[None]:
    """Fail when the block leaves a process of its own running: a descendant of this process
    that was not there before. One told to stop a moment ago (a director, a server's backend
    whose client went) has ``grace`` seconds to finish its shutdown."""
    before = live_descendants(os.getpid())
    yield
    end = time.monotonic() + grace
    while (left := live_descendants(os.getpid()) - before) and time.monotonic() < end:
        time.sleep(0.05)
    assert not left, f"test left child processes running: {sorted(left)}"
