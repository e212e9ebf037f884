"""Core's watchdog: a teardown run when its owner dies (SIGKILL included), or when the owner
stops it, unless the service's folder is already gone. Real processes, no mocks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.polling import until

from gridgate.core.watchdog import Watchdog


def _mark(path: Path) -> list[str]:
    """A teardown that leaves a mark: ``path`` holding ``down``."""
    return [sys.executable, "-c", f"open({str(path)!r}, 'w').write('down')"]


def _wait_for(path: Path, seconds: float = 30.0) -> bool:
    return bool(until(path.exists, timeout=seconds))


def test_the_teardown_runs_when_the_owner_is_killed(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    owner_code = (
        "import sys, time\n"
        "from gridgate.core.watchdog import Watchdog\n"
        f"dog = Watchdog({_mark(mark)!r}).start()\n"
        "print(dog.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE)
    try:
        assert owner.stdout is not None
        watchdog_pid = int(owner.stdout.readline())
        assert not mark.exists(), "nothing is torn down while the owner lives"
        owner.send_signal(signal.SIGKILL)  # no stop(), no finally, no atexit
        owner.wait()
        assert _wait_for(mark), "the watchdog ran no teardown after its owner died"
        assert mark.read_text() == "down"
    finally:
        owner.kill()
        owner.wait()
    until(lambda: not Path(f"/proc/{watchdog_pid}").exists(), timeout=30)
    assert not Path(f"/proc/{watchdog_pid}").exists() or _zombie(watchdog_pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_stop_runs_the_teardown_while_the_folder_is_there(tmp_path: Path) -> None:
    folder, mark = tmp_path / "service", tmp_path / "mark"
    folder.mkdir()
    dog = Watchdog(_mark(mark), only_if=folder).start()
    pid = dog.pid
    assert pid is not None and dog.poll() is None
    dog.stop()
    assert mark.read_text() == "down"
    assert dog.poll() == 0 and dog.pid is None


def test_stop_after_the_folder_went_runs_nothing(tmp_path: Path) -> None:
    folder, mark = tmp_path / "service", tmp_path / "mark"
    dog = Watchdog(_mark(mark), only_if=folder).start()
    dog.stop()
    assert not mark.exists()
    assert dog.poll() == 0


def test_a_signal_to_the_owners_group_does_not_end_the_watchdog(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    dog = Watchdog(_mark(mark)).start()
    assert dog.pid is not None
    # wait until it ignores signals (the interpreter has started and set its handlers)
    until(lambda: _ignores(dog.pid, signal.SIGTERM), timeout=30)
    os.kill(dog.pid, signal.SIGTERM)
    os.kill(dog.pid, signal.SIGINT)
    assert dog.poll() is None
    dog.stop()
    assert mark.read_text() == "down" and dog.poll() == 0


def _ignores(pid: int, sig: int) -> bool:
    """Whether process ``pid`` ignores ``sig`` (the SigIgn mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(mask, 16) & (1 << (sig - 1)))


def test_a_teardown_that_fails_is_told_by_the_exit_status(tmp_path: Path) -> None:
    dog = Watchdog([sys.executable, "-c", "raise SystemExit(3)"]).start()
    dog.stop()
    assert dog.poll() == 1
    missing = Watchdog([str(tmp_path / "no-such-program")]).start()
    missing.stop()
    assert missing.poll() == 127


def test_a_watchdog_needs_a_teardown() -> None:
    with pytest.raises(ValueError, match="needs a teardown command"):
        Watchdog([])
