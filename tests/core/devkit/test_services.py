"""The kit of the private test services (gridgate.core.testing: free_port, not_traversable,
exited, signal_group, sweep_processes), on real processes and folders."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from gridgate.core.testing import (
    exited,
    free_port,
    not_traversable,
    signal_group,
    sweep_processes,
)


def test_free_port_is_one_a_server_can_bind() -> None:
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))


def test_not_traversable_names_the_first_closed_folder(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    closed = tmp_path / "closed"
    inner = closed / "inner"
    inner.mkdir(parents=True)
    closed.chmod(0o700)
    try:
        assert not_traversable(inner) == closed
        closed.chmod(0o711)
        found = not_traversable(inner)
        assert found != closed and (found is None or found in tmp_path.parents)
    finally:
        closed.chmod(0o755)


def test_exited_sees_a_zombie_and_signal_group_reaches_the_group() -> None:
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert not exited(child.pid)
        signal_group(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not exited(child.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert exited(child.pid)  # a zombie until reaped
    finally:
        child.kill()
        child.wait()
    signal_group(child.pid, signal.SIGTERM)  # a group that is gone is no error


def test_sweep_kills_what_runs_in_the_folder_and_what_the_predicate_names(tmp_path: Path) -> None:
    inside = tmp_path / "service"
    inside.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    # a job in the folder with a child of its own, and one elsewhere the predicate claims
    job = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], cwd=inside, start_new_session=True)
    claimed = subprocess.Popen(["sleep", "61"], cwd=other, start_new_session=True)
    spared = subprocess.Popen(["sleep", "62"], cwd=other, start_new_session=True)
    try:
        time.sleep(0.2)
        killed = sweep_processes(inside, belongs=lambda pid, _folder: pid == claimed.pid)
        assert job.pid in killed and claimed.pid in killed and spared.pid not in killed
        assert job.wait(timeout=10) == -signal.SIGKILL
        assert claimed.wait(timeout=10) == -signal.SIGKILL
        assert spared.poll() is None
        leftover = [
            pid
            for pid in (int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit())
            if _cwd(pid) == str(inside.resolve())
        ]
        assert leftover == []  # the job's own child went with its group
    finally:
        for proc in (job, claimed, spared):
            proc.kill()
            proc.wait()


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def test_sweep_spares_the_shell_it_was_run_from(tmp_path: Path) -> None:
    """``down`` typed in a shell whose working folder is inside the service's own."""
    import sys

    inside = tmp_path / "service"
    inside.mkdir()
    code = (
        "import sys; from gridgate.core.testing import sweep_processes; "
        "print(sweep_processes(sys.argv[1]))"
    )
    done = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "$1" "$PWD"; echo alive', "sh", code],
        cwd=inside,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.stdout.splitlines() == ["[]", "alive"], done.stderr
