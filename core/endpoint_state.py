"""What an endpoint reports about itself: the figures a CE or a batch queue gives of its own
queue (``gridgate_endpoint_state``), and a cache that lets one read of a cluster or a CE answer
for every endpoint on it during a short interval.

The figures are the scheduler's own view, everybody's jobs counted (another VO's, a second
director's), not gridgate's registry: GLUE2's ComputingShare on an ARC CE, ``sinfo``/``squeue``
of a Slurm partition. A backend that cannot say answers None, and nothing changes for its
endpoints (docs/pilots.md, "What the CE says of its queue").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["SERVING_STATES", "EndpointState", "StateCache"]

#: A queue's serving state, as GLUE2 names them: ``production`` (accepts jobs and runs them),
#: ``queueing`` (accepts jobs, runs none now), ``draining`` (accepts none, runs those it has),
#: ``closed`` (accepts none, runs none).
SERVING_STATES: tuple[str, ...] = ("production", "queueing", "draining", "closed")

#: The largest count a figure may be (a queue of a billion jobs is a misread, not a queue).
MAX_COUNT = 10**9

T = TypeVar("T")


@dataclass(frozen=True)
class EndpointState:
    """What an endpoint's queue says of itself, read at ``read_at`` (clock time).

    ``waiting`` and ``running`` count the jobs of every user in the queue; ``free_slots`` the
    cores (slots) it could start a job on now. The queue's limits: ``max_walltime`` (seconds),
    ``max_memory_mb`` (per job or node), ``max_cores`` (per job or node). ``serving`` is one of
    :data:`SERVING_STATES`; ``reason`` the scheduler's own words for it, when it gave any;
    ``source`` what was read (``slurm sinfo/squeue``, ``GLUE2 ComputingShare``). A figure the
    backend cannot tell is None (no limit, for the limits)."""

    serving: str = "production"
    waiting: int | None = None
    running: int | None = None
    free_slots: int | None = None
    max_walltime: int | None = None
    max_memory_mb: int | None = None
    max_cores: int | None = None
    read_at: float = 0.0
    source: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        if self.serving not in SERVING_STATES:
            raise ValueError(f"serving state {self.serving!r} is not one of {SERVING_STATES}")
        for name in (
            "waiting",
            "running",
            "free_slots",
            "max_walltime",
            "max_memory_mb",
            "max_cores",
        ):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_COUNT:
                raise ValueError(f"{name} {value!r} is not a count from 0 to {MAX_COUNT}")

    @property
    def accepts(self) -> bool:
        """Whether a pilot sent there now can be expected to run: the queue is in
        ``production`` (a ``queueing`` queue takes jobs but runs none)."""
        return self.serving == "production"

    def describe(self) -> str:
        """One line for people: the serving state and the figures known."""
        parts = [self.serving]
        for label, value in (
            ("waiting", self.waiting),
            ("running", self.running),
            ("free slots", self.free_slots),
        ):
            if value is not None:
                parts.append(f"{value} {label}")
        if self.reason:
            parts.append(f"reason: {self.reason}")
        return ", ".join(parts)


class StateCache(Generic[T]):
    """Reads kept for ``interval`` seconds, by key (a cluster, a CE's address): threads that
    ask for the same key while it is read wait for that one read, so that 50 endpoints on one
    cluster cost one read per interval. Whatever the reader returns is kept, a failure it
    returns as a value too (a dead controller is not asked 50 times); an exception it raises is
    not kept (the next caller reads again) and reaches the caller."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, threading.Lock] = {}
        self._kept: dict[str, tuple[float, T]] = {}

    def get(self, key: str, read: Callable[[], T]) -> T:
        """The value kept for ``key`` if read less than ``interval`` ago, else ``read()``'s."""
        with self._lock:
            lock = self._keys.setdefault(key, threading.Lock())
        with lock:
            kept = self._kept.get(key)
            now = self._clock()
            if kept is not None and now - kept[0] < self.interval:
                return kept[1]
            value = read()
            self._kept[key] = (self._clock(), value)
            return value

    def clear(self) -> None:
        """Forget every read (the next ask of each key reads again)."""
        with self._lock:
            self._kept.clear()
