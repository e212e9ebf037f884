"""Pilot-registry figures for docs/performance.md: the director's iteration time and memory with
1,000 and with 100,000 tracked pilots in the default (sqlite) store, as ratios measured in one
run. Each size runs in a fresh child process, so its peak RSS is its own.

Per size: the registry is filled (``--active`` of the pilots non-terminal, the rest finished
and kept for the accounting) over 11 endpoints, then iterations are timed with tracking off
(the baseline), with tracking on but no poll due (``status_interval`` not reached: counts and
limits only), and with a poll of every endpoint at every iteration. The backend answers in
process (no command), so the figures are the director's own cost plus building the answers.
Beside the wall times: the director's CPU time (``time.process_time``, all its threads) and, on
Redis, the server's own (``INFO cpu``); a poll's cost per live pilot is the CPU of a polling
iteration less that of one with no poll due, over the live pilots.

``--baseline REV`` runs each size a second time, first, on the code of commit REV (its
``core``, ``plugins`` and ``demo`` put before the installed package on ``PYTHONPATH``) against
the same redis-server, and gives the ratios of this code to it: a before/after in one run.

    .venv/bin/python bench/bench_pilots.py [--sizes 1000 100000] [--active 0.1] [--json]
    .venv/bin/python bench/bench_pilots.py --driver redis   # starts its own redis-server
    .venv/bin/python bench/bench_pilots.py --sizes 100000 --active 1 --baseline 1274d90
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.config import validate_document
from gridgate.core.engine.director import Director
from gridgate.core.model import BackendInfo, Endpoint, JobStatus, StatusResult, SubmitResult
from gridgate.core.state import Pilot, StateStore
from gridgate.core.stores.sqlite import SqliteState

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
    def gridgate_submit(
        self, endpoint: Endpoint, request: Any, timeout: float
    ) -> SubmitResult | None:
        self.n += 1
        return SubmitResult(endpoint, ok=True, job_ids=(f"new-{self.n}",))

    @hookimpl
    def gridgate_job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        return StatusResult(
            endpoint, ok=True, statuses={j: JobStatus(j, "running", native="R") for j in job_ids}
        )


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def open_store(folder: Path, clock: FakeClock, redis_url: str) -> StateStore:
    if not redis_url:
        return SqliteState({"path": str(folder / "state.db")}, clock=clock)
    from gridgate.core.stores.redis import RedisState

    return RedisState({"url": redis_url, "prefix": f"bench-{uuid.uuid4().hex}:"}, clock=clock)


def child(size: int, active: float, iterations: int, redis_url: str = "") -> dict[str, Any]:
    logger.remove()
    folder = Path(tempfile.mkdtemp(prefix="bench-pilots-"))
    clock = FakeClock()
    store = open_store(folder, clock, redis_url)
    registry = store.pilot_registry()
    live = int(size * active)
    started = time.perf_counter()
    batch: list[Pilot] = []
    for i in range(size):
        endpoint = ENDPOINTS[i % len(ENDPOINTS)].name
        state = ("waiting" if i % 2 else "running") if i < live else ("done" if i % 5 else "failed")
        batch.append(
            Pilot(
                f"job-{i:07d}",
                BACKEND,
                endpoint,
                "default",
                clock.time() - 3600,
                state,
                clock.time() - 1800,
            )
        )
        if len(batch) == 10_000:
            registry.put(batch)
            batch = []
    registry.put(batch)
    fill_s = time.perf_counter() - started
    rss_filled = rss_mb()

    def redis_cpu() -> float:
        """Seconds of CPU the redis-server has used (0 on sqlite)."""
        if not redis_url:
            return 0.0
        info = store.client.info("cpu")  # type: ignore[attr-defined]
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def timed(track: bool, interval: float | None) -> tuple[float, float, float]:
        """Medians of an iteration's wall and CPU time, and the server's mean CPU time."""
        doc = {
            "director": {
                "cycle_seconds": 1,
                "max_threads": 4,
                "command_timeout": 30,
                "state_dir": str(folder / "state"),
                "pilots": {"track": track, "status_interval": interval},
            },
            "state": {"driver": "memory"},
            "demand": {"static": {BACKEND: 11}},
        }
        director = Director(
            validate_document(doc), clock=clock, extra_plugins=[Backend()], state=store
        )
        director.run_iteration()  # warm: the first poll (when polling) of every endpoint
        times, cpu = [], []
        server = redis_cpu()
        for _ in range(iterations):
            clock.advance(1)
            begin, begin_cpu = time.perf_counter(), time.process_time()
            director.run_iteration()
            times.append(time.perf_counter() - begin)
            cpu.append(time.process_time() - begin_cpu)
        server = (redis_cpu() - server) / iterations
        director.close()
        return statistics.median(times), statistics.median(cpu), server

    untracked, _cpu, _server = timed(False, None)
    no_poll, no_poll_cpu, no_poll_server = timed(True, 86400)  # the schema's maximum
    polling, polling_cpu, polling_server = timed(True, None)
    # what building the backend's answers costs of that (JobStatus objects, not the registry)
    answers = []
    for _ in range(3):
        begin_cpu = time.process_time()
        for where in ENDPOINTS:
            Backend().gridgate_job_status(
                endpoint=where, job_ids=[f"job-{i:07d}" for i in range(live // 11)], timeout=1
            )
        answers.append(time.process_time() - begin_cpu)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    store.close()
    return {
        "size": size,
        "active": live,
        "fill_s": round(fill_s, 2),
        "iteration_untracked_ms": round(untracked * 1000, 2),
        "iteration_tracked_no_poll_ms": round(no_poll * 1000, 2),
        "iteration_tracked_polling_ms": round(polling * 1000, 2),
        "iteration_tracked_no_poll_cpu_ms": round(no_poll_cpu * 1000, 2),
        "iteration_tracked_polling_cpu_ms": round(polling_cpu * 1000, 2),
        "poll_cpu_us_per_live_pilot": round((polling_cpu - no_poll_cpu) / live * 1e6, 2),
        "answers_cpu_us_per_live_pilot": round(min(answers) / (live // 11 * 11) * 1e6, 2),
        "poll_server_cpu_us_per_live_pilot": (
            round((polling_server - no_poll_server) / live * 1e6, 2) if redis_url else None
        ),
        "rss_after_fill_mb": round(rss_filled, 1),
        "peak_rss_mb": round(peak, 1),
        "db_mb": round((folder / "state.db").stat().st_size / 2**20, 1) if not redis_url else None,
    }


class RedisServer:
    """A throw-away redis-server on a free loopback port, without persistence."""

    def __enter__(self) -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit(
                "--driver redis needs redis-server on PATH (apt-get install redis-server)"
            )
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(port=port)
        for _ in range(500):
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.02)  # waiting for a real server to listen
        client.close()
        return f"redis://127.0.0.1:{port}/0"

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument(
        "--active", type=float, default=0.1, help="Share of pilots not yet finished."
    )
    parser.add_argument("--iterations", type=int, default=7)
    parser.add_argument("--driver", choices=["sqlite", "redis"], default="sqlite")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--baseline", metavar="REV", help="Also run each size on the code of this commit."
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.active, args.iterations, args.redis_url)))
        return
    results, before = [], []
    server = RedisServer() if args.driver == "redis" else None
    url = server.__enter__() if server is not None else ""
    old = tempfile.TemporaryDirectory(prefix="bench-pilots-baseline-") if args.baseline else None
    try:
        if old is not None:
            checkout(args.baseline, Path(old.name))
        for size in args.sizes:
            argv = [sys.executable, __file__, "--child", str(size), "--active", str(args.active)]
            argv += ["--iterations", str(args.iterations), "--redis-url", url]
            if old is not None:
                env = {**os.environ, "PYTHONPATH": old.name}
                out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
                before.append(json.loads(out.stdout))
            out = subprocess.run(argv, capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout))
    finally:
        if server is not None:
            server.__exit__()
        if old is not None:
            old.cleanup()
    small, large = results[0], results[-1]
    ratios = {
        key: round(large[key] / small[key], 2)
        for key in (
            "iteration_untracked_ms",
            "iteration_tracked_no_poll_ms",
            "iteration_tracked_polling_ms",
            "peak_rss_mb",
        )
    }
    report: dict[str, Any] = {
        "driver": args.driver,
        "results": results,
        "ratios_largest_to_smallest": ratios,
    }
    if before:
        report["baseline"] = {"commit": args.baseline, "results": before}
        report["ratios_to_baseline"] = [
            {
                "size": new["size"],
                **{
                    key: round(new[key] / was[key], 3) if was[key] else None
                    for key in (
                        "iteration_tracked_polling_ms",
                        "iteration_tracked_polling_cpu_ms",
                        "poll_cpu_us_per_live_pilot",
                        "poll_server_cpu_us_per_live_pilot",
                    )
                    if new[key] is not None
                },
            }
            for new, was in zip(results, before, strict=True)
        ]
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for label, rows in (("baseline " + str(args.baseline), before), ("this code", results)):
        if before:
            print(label)
        for r in rows:
            print_row(r)
    print("ratios largest/smallest:", ratios)
    for row in report.get("ratios_to_baseline", []):
        print("ratios this code / baseline:", row)


def checkout(rev: str, folder: Path) -> None:
    """The package folders of commit ``rev`` under ``folder/gridgate``, as installed."""
    for part in ("core", "plugins", "demo"):
        target = folder / "gridgate" / part
        target.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parents[1]), "archive", rev, part],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(
            ["tar", "-x", "-C", str(target), "--strip-components=1"], input=archive, check=True
        )


def print_row(r: dict[str, Any]) -> None:
    server = r["poll_server_cpu_us_per_live_pilot"]
    print(
        f"{r['size']:>7} pilots ({r['active']} live): iteration untracked "
        f"{r['iteration_untracked_ms']} ms, tracked {r['iteration_tracked_no_poll_ms']} ms, "
        f"tracked+polling {r['iteration_tracked_polling_ms']} ms; RSS {r['rss_after_fill_mb']} MB "
        f"(peak {r['peak_rss_mb']} MB); fill {r['fill_s']} s"
        + (f"; sqlite file {r['db_mb']} MB" if r["db_mb"] is not None else "")
        + f"; poll CPU {r['poll_cpu_us_per_live_pilot']} us/live pilot"
        + f" (of which the answers {r['answers_cpu_us_per_live_pilot']} us)"
        + (f" (+ redis-server {server} us)" if server is not None else "")
    )


if __name__ == "__main__":
    main()
