"""The kit of the private test services: what a fixture that starts a real scheduler, CE or cell
in a folder of its own needs (the private Slurm cluster, the Grid Engine cell, the ARC CE and the
demo's token daemon each use it). A loopback port nothing holds, whether other users can reach a
folder, whether a child has exited, and the sweep that kills what a service left running.

Public through :mod:`gridgate.core.testing` (``free_port``, ``not_traversable``, ``exited``,
``signal_group``, ``sweep_processes``), so that a plugin author's own service fixture has it too.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listened on a moment ago (the kernel's pick).

    Also the port of "a server that does not answer": nothing listens there once the probe
    socket is closed. A service that binds it later may lose a race with another process:
    retry its start on "address in use".

    :param host: the address to probe (loopback).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def not_traversable(folder: Path) -> Path | None:
    """The first folder at or above ``folder`` that other users cannot pass through (no
    ``o+x``), or None: a service that runs jobs as another user needs every one passable.

    :param folder: the service's folder.
    """
    for part in (folder, *folder.parents):
        if not os.stat(part).st_mode & stat.S_IXOTH:
            return part
    return None


def exited(pid: int) -> bool:
    """Whether ``pid``, a child the caller has not reaped yet, has exited (a zombie, or gone).

    :param pid: the child's process id.
    """
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group of ``pid`` (a child started in a session of its own,
    not yet reaped); a group that is gone is no error.

    :param pid: the child's process id, also its group's.
    :param sig: the signal.
    """
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone (or was never ours): nothing left to signal


def in_folder(pid: int, folder: str) -> bool:
    """Whether process ``pid`` runs in ``folder`` (its working folder inside it) or names a file
    inside it on its command line."""
    entry = Path(f"/proc/{pid}")
    try:
        cwd = os.readlink(entry / "cwd")
        cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return cwd == folder or cwd.startswith(folder + "/") or folder + "/" in cmdline


def ancestors() -> set[int]:
    """This process and its ancestors, which a sweep never touches (a person may run a
    service's ``down`` from a shell whose working folder is inside the service's)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
            pid = int(raw[raw.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def sweep_processes(
    folder: str | os.PathLike[str],
    belongs: Callable[[int, str], bool] | None = None,
    rounds: int = 50,
) -> list[int]:
    """Kill what a service in ``folder`` left running: every process that runs in it or names
    it on its command line (:func:`in_folder`), or that ``belongs`` says is the service's. Each
    one's process group goes with it (a job's children); this process, its ancestors and its own
    group never (:func:`ancestors`); the scan repeats until a round finds none (a dying job may start one more).

    :param folder: the service's folder.
    :param belongs: ``(pid, folder) -> bool`` for processes found otherwise (a job known by
        its environment); the folder is given resolved.
    :param rounds: scans at most, 50 ms apart.
    :returns: the pids killed.
    """
    mark = str(Path(folder).resolve())
    spare = ancestors()
    killed: list[int] = []
    for _round in range(rounds):
        found = False
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in spare:
                continue
            pid = int(entry.name)
            if not (in_folder(pid, mark) or (belongs is not None and belongs(pid, mark))):
                continue
            found = True
            killed.append(pid)
            try:
                group = os.getpgid(pid)
                if group != os.getpgrp() and not spare & _members(group):
                    os.killpg(group, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # it exited meanwhile: the next scan of /proc confirms it
        if not found:
            break
        time.sleep(0.05)
    return sorted(set(killed))


def _members(group: int) -> set[int]:
    """The processes of process group ``group``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_text()
                if int(raw[raw.rindex(")") + 2 :].split()[2]) == group:
                    found.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found
