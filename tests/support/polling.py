"""Polling a state a real process reaches by itself (a daemon's counters, a process's exit).

Never for an expiry: those are tested on a FakeClock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(predicate: Callable[[], Any], timeout: float = 20.0, pause: float = 0.05) -> Any:
    """Call ``predicate`` until it is truthy or ``timeout`` seconds pass; return its last value
    (falsy on timeout, for the caller's assert to say what was missing)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(pause)
