"""Pilot-registry figures for docs/performance.md: the director's iteration time and memory with
1,000 and with 100,000 tracked pilots in the default (sqlite) store, as ratios measured in one
run. Each size runs in a fresh child process, so its peak RSS is its own.

Per size: the registry is filled (``--active`` of the pilots non-terminal, the rest finished
and kept for the accounting) over 11 endpoints, then iterations are timed with tracking off
(the baseline), with tracking on but no poll due (``status_interval`` not reached: counts and
limits only), and with a poll of every endpoint at every iteration. The backend answers in
process (no command), so the figures are the director's own cost plus building the answers.

    .venv/bin/python bench/bench_pilots.py [--sizes 1000 100000] [--active 0.1] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.config import validate_document
from gridgate.core.director import Director
from gridgate.core.model import BackendInfo, Endpoint, JobStatus, StatusResult, SubmitResult
from gridgate.core.pilots import Pilot
from gridgate.core.state import SqliteState

BACKEND = "bench"
ENDPOINTS = tuple(Endpoint(BACKEND, f"ce{i:02d}.example.org") for i in range(11))


class Backend:
    """Submits instantly and answers status from a dict: every non-terminal pilot stays running."""

    def __init__(self) -> None:
        self.n = 0

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        return BackendInfo(BACKEND, ENDPOINTS) if backend == BACKEND else None

    @hookimpl
    def gridgate_submit(self, endpoint: Endpoint, request: Any, timeout: float) -> SubmitResult | None:
        self.n += 1
        return SubmitResult(endpoint, ok=True, job_ids=(f"new-{self.n}",))

    @hookimpl
    def gridgate_job_status(self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float) -> StatusResult | None:
        return StatusResult(endpoint, ok=True,
                            statuses={j: JobStatus(j, "running", native="R") for j in job_ids})


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def child(size: int, active: float, iterations: int) -> dict[str, Any]:
    logger.remove()
    folder = Path(tempfile.mkdtemp(prefix="bench-pilots-"))
    clock = FakeClock()
    store = SqliteState({"path": str(folder / "state.db")}, clock=clock)
    registry = store.pilot_registry()
    live = int(size * active)
    started = time.perf_counter()
    batch: list[Pilot] = []
    for i in range(size):
        endpoint = ENDPOINTS[i % len(ENDPOINTS)].name
        state = ("waiting" if i % 2 else "running") if i < live else ("done" if i % 5 else "failed")
        batch.append(Pilot(f"job-{i:07d}", BACKEND, endpoint, "default", clock.time() - 3600, state,
                           clock.time() - 1800))
        if len(batch) == 10_000:
            registry.put(batch)
            batch = []
    registry.put(batch)
    fill_s = time.perf_counter() - started
    rss_filled = rss_mb()

    def timed(track: bool, interval: float | None) -> float:
        doc = {
            "director": {"cycle_seconds": 1, "max_threads": 4, "command_timeout": 30,
                         "state_dir": str(folder / "state"),
                         "pilots": {"track": track, "status_interval": interval}},
            "state": {"driver": "memory"},
            "demand": {"static": {BACKEND: 11}},
        }
        director = Director(validate_document(doc), clock=clock, extra_plugins=[Backend()], state=store)
        director.run_iteration()  # warm: the first poll (when polling) of every endpoint
        times = []
        for _ in range(iterations):
            clock.advance(1)
            begin = time.perf_counter()
            director.run_iteration()
            times.append(time.perf_counter() - begin)
        director.close()
        return statistics.median(times)

    untracked = timed(False, None)
    no_poll = timed(True, 1e9)
    polling = timed(True, None)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    store.close()
    return {"size": size, "active": live, "fill_s": round(fill_s, 2),
            "iteration_untracked_ms": round(untracked * 1000, 2),
            "iteration_tracked_no_poll_ms": round(no_poll * 1000, 2),
            "iteration_tracked_polling_ms": round(polling * 1000, 2),
            "rss_after_fill_mb": round(rss_filled, 1), "peak_rss_mb": round(peak, 1),
            "db_mb": round((folder / "state.db").stat().st_size / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--active", type=float, default=0.1, help="Share of pilots not yet finished.")
    parser.add_argument("--iterations", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.active, args.iterations)))
        return
    results = []
    for size in args.sizes:
        out = subprocess.run([sys.executable, __file__, "--child", str(size), "--active", str(args.active),
                              "--iterations", str(args.iterations)], capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout))
    small, large = results[0], results[-1]
    ratios = {key: round(large[key] / small[key], 2) for key in
              ("iteration_untracked_ms", "iteration_tracked_no_poll_ms", "iteration_tracked_polling_ms",
               "peak_rss_mb")}
    report = {"results": results, "ratios_largest_to_smallest": ratios}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for r in results:
        print(f"{r['size']:>7} pilots ({r['active']} live): iteration untracked "
              f"{r['iteration_untracked_ms']} ms, tracked {r['iteration_tracked_no_poll_ms']} ms, "
              f"tracked+polling {r['iteration_tracked_polling_ms']} ms; RSS {r['rss_after_fill_mb']} MB "
              f"(peak {r['peak_rss_mb']} MB); db {r['db_mb']} MB; fill {r['fill_s']} s")
    print("ratios largest/smallest:", ratios)


if __name__ == "__main__":
    main()
