"""Director processes sharing one state store, each with an in-process stand-in backend that
notes every submission it is given: what bench/bench_scaleout.py measures and
tests/core/engine/test_sharing_processes.py checks (``director.demand_lock``, issue 43).

:func:`spawn` starts one (``python -m gridgate.core.devkit.directors SPEC``), which runs until
SIGTERM (a clean stop: its leases are handed back) or SIGKILL. Its backend's servers take
every submission, sleep ``submit_seconds`` (no CPU) and note it, on the store's clock, as a
line of ``out``; their pilots never start, so only ``max_waiting`` stops the directors.
:func:`submissions` reads those lines back, :func:`overlaps` finds two directors submitting
to one group at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gridgate.core import hookimpl
from gridgate.core.clock import Clock
from gridgate.core.documents import decode_json
from gridgate.core.model import (
    BackendInfo,
    Endpoint,
    JobStatus,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)

__all__ = [
    "BACKEND",
    "DirectorSpec",
    "Submission",
    "overlap_seconds",
    "overlaps",
    "pilots_per_endpoint",
    "spawn",
    "submissions",
]

#: The stand-in backend's name (its servers are ``ce0``, ``ce1``, ...).
BACKEND = "standin"


@dataclass(frozen=True)
class DirectorSpec:
    """One director process: its store, its settings and where it notes its submissions.

    The groups are ``g00``, ``g01``, ... (``groups`` of them, ``pilots`` each an iteration);
    ``max_waiting`` is the director-wide limit, ``limited`` each named server's own.
    """

    #: the ``state:`` section of the shared store, ``driver`` included
    state: Mapping[str, Any]
    #: the file the submissions are noted in, one JSON line each
    out: str
    state_dir: str
    groups: int = 8
    pilots: int = 2
    endpoints: int = 8
    threads: int = 8
    cycle: float = 1.0
    lease: float = 3.0
    lock: bool = True
    max_waiting: int | None = None
    limited: Mapping[str, int] = field(default_factory=dict)
    submit_seconds: float = 0.05

    def doc(self) -> dict[str, Any]:
        """The director's config (its store is given to it built, see :func:`run`)."""
        endpoints = {name: {"max_waiting": n} for name, n in self.limited.items()}
        return {
            "director": {
                "cycle_seconds": self.cycle,
                "max_threads": self.threads,
                "command_timeout": 10,
                "demand_lock": self.lock,
                "lease_seconds": self.lease,
                "state_dir": self.state_dir,
                "pilots": {
                    "max_waiting": self.max_waiting,
                    "max_wait_time": None,
                    "backends": {BACKEND: {"endpoints": endpoints}} if endpoints else {},
                },
            },
            "state": {"driver": "memory"},  # the shared store is given to the Director
            "demand": {
                "static": {
                    BACKEND: [
                        {"group": f"g{i:02d}", "pilots": self.pilots} for i in range(self.groups)
                    ]
                }
            },
        }


@dataclass(frozen=True)
class Submission:
    """One submission the stand-in was given: by which director (its instance, the name its
    leases hold), when (the store's clock) and where."""

    director: str
    group: str
    endpoint: str
    start: float
    end: float
    pilots: int


class NotingBackend:
    """The stand-in backend of one director process: see the module."""

    def __init__(self, spec: DirectorSpec, clock: Clock) -> None:
        self.endpoints = tuple(Endpoint(BACKEND, f"ce{i}") for i in range(spec.endpoints))
        self.submit_seconds = spec.submit_seconds
        self.clock = clock
        #: the director's instance, set once it is built
        self.director = ""
        self._lock = threading.Lock()
        self._out = open(spec.out, "a", buffering=1, encoding="utf-8")

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        return BackendInfo(BACKEND, self.endpoints) if backend == BACKEND else None

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend != BACKEND:
            return None
        start = self.clock.time()
        time.sleep(self.submit_seconds)  # a command in flight, without CPU
        note = Submission(
            self.director, request.group, endpoint.name, start, self.clock.time(), request.count
        )
        with self._lock:
            self._out.write(json.dumps(asdict(note)) + "\n")
        ids = tuple(uuid.uuid4().hex[:12] for _ in range(request.count))
        return SubmitResult(endpoint, ok=True, job_ids=ids)

    @hookimpl
    def gridgate_job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        if endpoint.backend != BACKEND:
            return None
        statuses = {j: JobStatus(j, "waiting") for j in job_ids}
        return StatusResult(endpoint, ok=True, statuses=statuses)

    def close(self) -> None:
        with self._lock:
            self._out.close()


def run(spec: DirectorSpec) -> None:
    """Be one director process: iterate until SIGTERM, then stop cleanly."""
    from loguru import logger

    from gridgate.core.engine.director import Director
    from gridgate.core.state import open_state
    from gridgate.core.testing import make_config

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    state = open_state({"state": dict(spec.state)})
    backend = NotingBackend(spec, state.clock)
    director = Director(make_config(spec.doc()), extra_plugins=[backend], state=state)
    backend.director = director.instance
    signal.signal(signal.SIGTERM, lambda *_: director.stop())
    try:
        director.run()
    finally:
        director.close()
        state.close()
        backend.close()


def spawn(spec: DirectorSpec, **popen: Any) -> subprocess.Popen[bytes]:
    """Start a director process of this interpreter (``popen``: Popen's own arguments)."""
    argv = [sys.executable, "-m", "gridgate.core.devkit.directors", json.dumps(asdict(spec))]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, **popen)


def submissions(paths: Iterable[Path]) -> list[Submission]:
    """The submissions noted in ``paths``, file by file; a line a SIGKILL cut short is not
    one."""
    found: list[Submission] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        for line in text.splitlines(keepends=True):
            if line.endswith("\n"):
                found.append(decode_json(line, Submission, kind="director kit submission"))
    return found


def overlaps(noted: Iterable[Submission]) -> list[tuple[Submission, Submission]]:
    """Pairs of submissions to one group by two directors whose times overlap."""
    by_group: dict[str, list[Submission]] = defaultdict(list)
    for s in noted:
        by_group[s.group].append(s)
    found = []
    for rows in by_group.values():
        rows.sort(key=lambda s: s.start)
        running: list[Submission] = []
        for s in rows:
            running = [r for r in running if r.end > s.start]
            found += [(r, s) for r in running if r.director != s.director]
            running.append(s)
    return found


def overlap_seconds(noted: Iterable[Submission]) -> float:
    """Group-seconds during which two or more directors had a submission in flight on the
    same group."""
    events: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for s in noted:
        events[s.group] += [(s.start, 1, s.director), (s.end, -1, s.director)]
    total = 0.0
    for evs in events.values():
        evs.sort()
        active: dict[str, int] = defaultdict(int)
        last = None
        for t, step, director in evs:
            if last is not None and sum(1 for v in active.values() if v > 0) >= 2:
                total += t - last
            active[director] += step
            last = t
    return total


def pilots_per_endpoint(noted: Iterable[Submission]) -> dict[str, int]:
    """Endpoint -> the pilots submitted there (none ever starts: all of them wait)."""
    out: dict[str, int] = defaultdict(int)
    for s in noted:
        out[s.endpoint] += s.pilots
    return dict(out)


if __name__ == "__main__":
    run(decode_json(sys.argv[1], DirectorSpec, kind="director kit spec"))
