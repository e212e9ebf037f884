"""Injected time: everything whose behaviour depends on time asks a clock, so tests never sleep."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Protocol

__all__ = ["Clock", "FakeClock", "SYSTEM_CLOCK", "file_time", "write_file_time"]


class Clock(Protocol):
    """Wall time (epoch seconds, for expiries that survive restarts) and a monotonic clock."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that only moves when told to; ``sleep`` advances it instead of waiting."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        return self.time()

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


SYSTEM_CLOCK = SystemClock()


# --- a clock file: time for other processes (stand-ins on PATH) that a test moves -----------
#
# This module imports the standard library only: the LSF stand-in, which runs as other users
# who cannot import gridgate from its venv, loads it by path for ``file_time``.


def file_time(path: str | os.PathLike[str] | None) -> float:
    """The time written in the clock file ``path``; the wall clock when there is no path, or
    no file yet. Written by :func:`write_file_time` (atomically), so a file that does not hold
    a number is broken, and an error: falling back to the wall clock would mix two times."""
    if not path:
        return time.time()
    try:
        text = Path(path).read_text(encoding="ascii")
    except FileNotFoundError:
        return time.time()
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"clock file {path}: {text[:40]!r} is not a time") from None


def write_file_time(path: str | os.PathLike[str], value: float) -> None:
    """Set the clock file ``path`` to ``value`` atomically (a reader never sees it half written),
    readable by the stand-ins' other users."""
    # imported here, not above: a stand-in that loads this module by path only reads the file
    from gridgate.core.files import atomic_write

    atomic_write(Path(path), repr(float(value)).encode("ascii"), mode=0o644, durable=False)
