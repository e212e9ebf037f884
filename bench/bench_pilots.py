"""Pilot-registry figures for docs/performance.md: the director's iteration time and memory with
1,000 and with 100,000 (or 1,000,000) tracked pilots in a sqlite, Redis or PostgreSQL store, as
ratios measured in one run. Each size runs in a fresh child process, so its peak RSS is its own.

Per size: the registry is filled (``--active`` of the pilots non-terminal, the rest finished
and kept for the accounting) over 11 endpoints, then iterations are timed with tracking off
(the baseline), with tracking on but no poll due (``status_interval`` not reached: counts and
limits only), and with a poll of every endpoint at every iteration. The backend answers in
process (no command) that every live pilot is running, so after the first (warm-up) poll of a
director nothing changes state. The figures are the director's own cost plus building the
answers. Beside the wall times: the director's CPU time (``time.process_time``, all its
threads) and the store server's own: on Redis ``INFO cpu``, on PostgreSQL the user and system
time of the postmaster and all its children, live or reaped (``/proc``: the sessions of the
director's connections and the background processes). A poll's cost per live pilot is the CPU
of a polling iteration less that of one with no poll due, over the live pilots.

Restart (``restart_*``): with the registry as the timed directors left it (all live pilots
running), a fresh Python process (``sys.executable`` running this file) imports gridgate,
builds a director whose ``state:`` section names the filled store (the director opens it
itself, as ``gridgate run`` does) and runs its first iteration, which polls every endpoint
(nothing changes) and submits 11 pilots. ``restart_wall_s``: from just before the process is
spawned to the moment it reports that first iteration done (interpreter start, imports, the
store opened, the first iteration; not the close). ``restart_cpu_s``: the process's own user
and system CPU (``getrusage``) over that same span. ``restart_peak_rss_mb``: its peak RSS
(``VmHWM``) at that moment. ``restart_iteration_*``: the first iteration alone, timed
inside the process. ``restart_server_cpu_s``: the store server's CPU over the restart (Redis,
PostgreSQL).

Stores: sqlite a file in a temporary folder; Redis a redis-server the bench starts on loopback
without persistence; PostgreSQL a private cluster the bench starts on loopback as the tests do
(tests/support/postgres_server.py: fsync off, synchronous_commit off, autovacuum off), each size
in a schema of its own. As autovacuum would on a site, the bench runs ``VACUUM ANALYZE`` on the
pilots table after the fill and after each timed director's warm-up iteration (whose poll moved
half the pilots from waiting to running). ``db_mb``: the sqlite file with its write-ahead
log, the PostgreSQL pilots table with its indexes (``pg_total_relation_size``), or the growth
of redis-server's ``used_memory`` over the fill.

``--baseline REV`` runs each size a second time, first, on the code of commit REV (its
``core``, ``plugins`` and ``demo`` put before the installed package on ``PYTHONPATH``) against
the same server, and gives the ratios of this code to it: a before/after in one run.

    .venv/bin/python bench/bench_pilots.py [--sizes 1000 100000] [--active 0.1] [--json]
    .venv/bin/python bench/bench_pilots.py --driver redis        # starts its own redis-server
    .venv/bin/python bench/bench_pilots.py --driver postgresql   # starts its own cluster
    .venv/bin/python bench/bench_pilots.py --sizes 100000 --active 1 --baseline 1274d90
    .venv/bin/python bench/bench_pilots.py --driver postgresql --sizes 100000 1000000 --active 1
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.config import Config, validate_document
from gridgate.core.engine.director import Director
from gridgate.core.model import BackendInfo, Endpoint, JobStatus, StatusResult, SubmitResult
from gridgate.core.state import Pilot, StateStore, open_state

BACKEND = "bench"
ENDPOINTS = tuple(Endpoint(BACKEND, f"ce{i:02d}.example.org") for i in range(11))
#: the environment variable that carries the private cluster's password to the children
PG_PASSWORD = "GRIDGATE_BENCH_PG_PASSWORD"


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


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``). Not ``ru_maxrss``: a process spawned by vfork and
    exec, as subprocess does, starts with its parent's peak in it."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def director_doc(
    folder: Path, track: bool, interval: float | None, state: dict[str, Any]
) -> Config:
    """The bench director's config: the in-process backend's 11 endpoints, 11 pilots a cycle."""
    return validate_document(
        {
            "director": {
                "cycle_seconds": 1,
                "max_threads": 4,
                "command_timeout": 30,
                "state_dir": str(folder),
                "pilots": {"track": track, "status_interval": interval},
            },
            "state": state,
            "demand": {"static": {BACKEND: 11}},
        }
    )


def server_cpu(store: StateStore, section: dict[str, Any], server_pid: int) -> Callable[[], float]:
    """A function giving the seconds of CPU the store's server has used (0 for sqlite)."""
    if section["driver"] == "redis":

        def redis_cpu() -> float:
            info = store.client.info("cpu")  # type: ignore[attr-defined]
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

        return redis_cpu
    if section["driver"] == "postgresql":
        return lambda: cluster_cpu(server_pid)
    return lambda: 0.0


def cluster_cpu(postmaster: int) -> float:
    """User and system seconds of the postmaster, its live children and the children it
    reaped (the sessions of a director that closed): ``/proc``."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" ", 1)
        except OSError:
            continue  # a process that ended meanwhile
        fields = rest.rsplit(")", 1)[1].split()
        if int(pid) == postmaster:
            ticks += sum(int(n) for n in fields[11:15])  # utime stime cutime cstime
        elif int(fields[1]) == postmaster:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def pg_settle(store: StateStore) -> None:
    """What autovacuum would do after a large write (it is off in the private cluster)."""
    schema = store.schema  # type: ignore[attr-defined]
    vacuum = f'VACUUM ANALYZE "{schema}".pilots'
    store.run("vacuum", lambda conn: conn.execute(vacuum))  # type: ignore[attr-defined]


def store_mb(store: StateStore, section: dict[str, Any]) -> float | None:
    if section["driver"] == "sqlite":  # the file and its write-ahead log
        files = (Path(section["path"]), Path(section["path"] + "-wal"))
        return sum(f.stat().st_size for f in files if f.exists()) / 2**20
    if section["driver"] == "postgresql":
        schema = store.schema  # type: ignore[attr-defined]
        rows = store._fetch(  # type: ignore[attr-defined]
            "size", "SELECT pg_total_relation_size(%s)", (f'"{schema}".pilots',)
        )
        return int(rows[0][0]) / 2**20
    if section["driver"] == "redis":
        return int(store.client.info("memory")["used_memory"]) / 2**20  # type: ignore[attr-defined]
    return None


def fill(store: StateStore, clock: FakeClock, size: int, live: int) -> float:
    """Put ``size`` pilots, ``live`` of them non-terminal, in writes of 10,000; the seconds."""
    registry = store.pilot_registry()
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
    return time.perf_counter() - started


def child(
    size: int,
    active: float,
    iterations: int,
    section: dict[str, Any],
    folder: Path,
    server_pid: int = 0,
) -> dict[str, Any]:
    logger.remove()
    clock = FakeClock()
    store = open_state({"state": section}, clock)
    settle = pg_settle if section["driver"] == "postgresql" else (lambda store: None)
    live = int(size * active)
    before_mb = store_mb(store, section) if section["driver"] == "redis" else 0.0
    fill_s = fill(store, clock, size, live)
    settle(store)
    db_mb = store_mb(store, section)
    if db_mb is not None and before_mb is not None:
        db_mb -= before_mb
    rss_filled = rss_mb()
    server = server_cpu(store, section, server_pid)

    def timed(track: bool, interval: float | None) -> tuple[float, float, float]:
        """Medians of an iteration's wall and CPU time, and the server's mean CPU time."""
        doc = director_doc(folder / "state", track, interval, {"driver": "memory"})
        director = Director(doc, clock=clock, extra_plugins=[Backend()], state=store)
        director.run_iteration()  # warm: the first poll (when polling) of every endpoint
        settle(store)
        times, cpu = [], []
        server_before = server()
        for _ in range(iterations):
            clock.advance(1)
            begin, begin_cpu = time.perf_counter(), time.process_time()
            director.run_iteration()
            times.append(time.perf_counter() - begin)
            cpu.append(time.process_time() - begin_cpu)
        server_mean = (server() - server_before) / iterations
        director.close()
        return statistics.median(times), statistics.median(cpu), server_mean

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
    peak = peak_rss_mb()
    clock.advance(1)
    server_before = server()
    restarted = restart(section, clock.time(), folder)
    restart_server = server() - server_before
    store.close()
    has_server = section["driver"] in ("redis", "postgresql")
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
            round((polling_server - no_poll_server) / live * 1e6, 2) if has_server else None
        ),
        "rss_after_fill_mb": round(rss_filled, 1),
        "peak_rss_mb": round(peak, 1),
        "db_mb": round(db_mb, 1) if db_mb is not None else None,
        **restarted,
        "restart_server_cpu_s": round(restart_server, 2) if has_server else None,
    }


def restart(section: dict[str, Any], now: float, folder: Path) -> dict[str, Any]:
    """A fresh director process on the filled store, to the end of its first iteration."""
    argv = [sys.executable, __file__, "--restart", json.dumps({"state": section, "now": now})]
    argv += ["--folder", str(folder / f"restart-{uuid.uuid4().hex[:8]}")]
    begin = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    wall = time.perf_counter() - begin
    rest, _ = proc.communicate()
    if proc.returncode != 0 or not line:
        raise SystemExit(f"the restarted director failed (exit {proc.returncode}): {rest}")
    return {"restart_wall_s": round(wall, 2), **json.loads(line)}


def restarted(spec: dict[str, Any], folder: Path) -> None:
    """The restarted director (in its own process): report its first iteration, then close."""
    logger.remove()
    begin, begin_cpu = time.perf_counter(), time.process_time()
    clock = FakeClock(spec["now"])
    doc = director_doc(folder, True, None, spec["state"])
    director = Director(doc, clock=clock, extra_plugins=[Backend()])
    built, built_cpu = time.perf_counter(), time.process_time()
    director.run_iteration()
    done, done_cpu = time.perf_counter(), time.process_time()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report = {
        "restart_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "restart_peak_rss_mb": round(peak_rss_mb(), 1),
        "restart_director_built_s": round(built - begin, 3),
        "restart_director_built_cpu_s": round(built_cpu - begin_cpu, 3),
        "restart_iteration_s": round(done - built, 2),
        "restart_iteration_cpu_s": round(done_cpu - built_cpu, 2),
    }
    print(json.dumps(report), flush=True)
    director.close()


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


class PostgresCluster:
    """The private cluster of the postgresql driver's tests (tests/support/postgres_server.py),
    its password handed to the child processes in :data:`PG_PASSWORD`."""

    def __enter__(self) -> tuple[str, int]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from support.postgres_server import (  # type: ignore[import-not-found]  # tests/support
            PostgresServer,
            server_bin,
        )

        if server_bin() is None:
            raise SystemExit(
                "--driver postgresql needs PostgreSQL's server binaries under "
                "/usr/lib/postgresql/<version>/bin (apt-get install postgresql)"
            )
        self.server = PostgresServer().start()
        os.environ[PG_PASSWORD] = self.server.password
        return str(self.server.dsn), int(self.server.proc.pid)

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def drop(self, schema: str) -> None:
        with self.server.connect() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument(
        "--active", type=float, default=0.1, help="Share of pilots not yet finished."
    )
    parser.add_argument("--iterations", type=int, default=7)
    parser.add_argument("--driver", choices=["sqlite", "redis", "postgresql"], default="sqlite")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--baseline", metavar="REV", help="Also run each size on the code of this commit."
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", default="", help=argparse.SUPPRESS)
    parser.add_argument("--folder", default="", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--restart", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.restart is not None:
        restarted(json.loads(args.restart), Path(args.folder))
        return
    if args.child is not None:
        section, folder = json.loads(args.store), Path(args.folder)
        figures = child(args.child, args.active, args.iterations, section, folder, args.server_pid)
        print(json.dumps(figures))
        return
    results, before = [], []
    work = tempfile.TemporaryDirectory(prefix="bench-pilots-")
    redis = RedisServer() if args.driver == "redis" else None
    cluster = PostgresCluster() if args.driver == "postgresql" else None
    url = redis.__enter__() if redis is not None else ""
    dsn, server_pid = cluster.__enter__() if cluster is not None else ("", 0)
    old = tempfile.TemporaryDirectory(prefix="bench-pilots-baseline-") if args.baseline else None

    def run(size: int, env: dict[str, str] | None = None) -> dict[str, Any]:
        """One child on a store of its own, removed after it."""
        tag = uuid.uuid4().hex
        folder = Path(work.name) / tag
        folder.mkdir()
        section: dict[str, Any] = {"driver": args.driver}
        if args.driver == "sqlite":
            section["path"] = str(folder / "state.db")
        elif args.driver == "redis":
            section |= {"url": url, "prefix": f"bench-{tag}:"}
        else:
            section |= {"dsn": dsn, "password": {"env": PG_PASSWORD}, "schema": f"bench_{tag}"}
        argv = [sys.executable, __file__, "--child", str(size), "--active", str(args.active)]
        argv += ["--iterations", str(args.iterations), "--store", json.dumps(section)]
        argv += ["--folder", str(folder), "--server-pid", str(server_pid)]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, env=env)
            if out.returncode != 0:
                raise SystemExit(f"size {size} failed (exit {out.returncode}):\n{out.stderr}")
            return dict(json.loads(out.stdout))
        finally:
            # Redis keeps each child's keys (under a prefix of its own) until the server stops
            # with the bench: a flush would wait for a script the child left running
            shutil.rmtree(folder, ignore_errors=True)
            if cluster is not None:
                cluster.drop(section["schema"])

    try:
        if old is not None:
            checkout(args.baseline, Path(old.name))
        for size in args.sizes:
            if old is not None:
                before.append(run(size, {**os.environ, "PYTHONPATH": old.name}))
            results.append(run(size))
    finally:
        if redis is not None:
            redis.__exit__()
        if cluster is not None:
            cluster.__exit__()
        if old is not None:
            old.cleanup()
        work.cleanup()
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
        + (f"; store {r['db_mb']} MB" if r["db_mb"] is not None else "")
        + f"; poll CPU {r['poll_cpu_us_per_live_pilot']} us/live pilot"
        + f" (of which the answers {r['answers_cpu_us_per_live_pilot']} us)"
        + (f" (+ server {server} us)" if server is not None else "")
        + f"; restart {r['restart_wall_s']} s wall, {r['restart_cpu_s']} s CPU, "
        f"peak RSS {r['restart_peak_rss_mb']} MB"
    )


if __name__ == "__main__":
    main()
