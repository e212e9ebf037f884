"""What ``proxyd.adaptive`` does to a real slurmctld under a gated squeue flood, against the same
daemon with a fixed max, in one run (docs/performance.md, "Limits that follow the scheduler").

A private Slurm cluster with ``--jobs`` pending (held) jobs, so each squeue costs the controller
real work. Two real ``gridgate lsfproxyd serve`` daemons: ``static`` (``QUERY[max=M]``) and
``adaptive`` (the same, plus ``adaptive.query`` with ``target_ms``). Phases alternate between
them, ``--rounds`` times, so load from elsewhere hits both alike. In each phase ``--loops``
threads of this process each take a query token (the in-process client), run the real squeue,
give it back, for ``--seconds``. Measured per phase: calls/s, the call's median and p95 (token
wait included), and slurmctld's own mean REQUEST_JOB_INFO time over the phase (sdiag deltas).
The target is a multiple of a warm-up phase's controller mean (static daemon): 0.5, a target
the controller cannot meet (the max falls to its min: what that costs), and 2, one it meets
(the max should stay at the top: no cost); the figures are ratios adaptive / static.

    .venv/bin/python bench/bench_adaptive.py [--loops 16] [--jobs 2000] [--seconds 20]
        [--rounds 3] [--query-max 16] [--target-ms auto] [--factors 0.5,2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gate import _Daemon  # noqa: E402  (the same real token daemon the gate bench uses)
from bench_slurm import _fill, _sdiag  # noqa: E402

from gridgate.plugins.slurm.scheduler import parse_sdiag  # noqa: E402

SQUEUE = shutil.which("squeue", path="/usr/bin:/bin") or "/usr/bin/squeue"
SDIAG = shutil.which("sdiag", path="/usr/bin:/bin") or "/usr/bin/sdiag"


def _job_info(cluster: Any) -> tuple[int, float]:
    """sdiag's cumulative REQUEST_JOB_INFO count and total time (ms), as the daemon reads it."""
    row = parse_sdiag(_sdiag(cluster)).by_type.get("REQUEST_JOB_INFO")
    return (row.count, row.total_ms) if row else (0, 0.0)


def _status(socket: str) -> dict[str, Any]:
    from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient

    with ProxyClient([Daemon("proxyd", socket)]) as client:
        [reply] = client.admin("status")
    return dict((reply.reply or {})["status"])


def _phase(cluster: Any, socket: str, loops: int, seconds: float) -> dict[str, Any]:
    import subprocess

    from loguru import logger

    from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient

    logger.remove()
    client = ProxyClient([Daemon("proxyd", socket)], backoff=(0.01, 0.2))
    env = cluster.client_env()
    latencies: list[list[float]] = [[] for _ in range(loops)]
    stop = time.monotonic() + seconds

    def loop(index: int) -> None:
        while time.monotonic() < stop:
            started = time.monotonic()
            with client.acquire("query", "squeue"):
                subprocess.run(
                    [SQUEUE, "-h"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
                )
            latencies[index].append(time.monotonic() - started)

    samples: list[float] = []

    def sample() -> None:  # the controller's own thread count, twice a second
        while time.monotonic() < stop:
            threads_now = parse_sdiag(_sdiag(cluster)).load.get("server_threads")
            if threads_now is not None:
                samples.append(threads_now)
            time.sleep(0.5)

    before = _job_info(cluster)
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(loops)]
    threads.append(threading.Thread(target=sample))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = _job_info(cluster)
    client.close()
    flat = sorted(x for one in latencies for x in one)
    served = after[0] - before[0]
    return {
        "calls_per_s": round(len(flat) / seconds, 1),
        "call_median_ms": round(statistics.median(flat) * 1000, 1) if flat else None,
        "call_p95_ms": round(flat[int(len(flat) * 0.95) - 1] * 1000, 1) if flat else None,
        "controller_job_info_ms": round((after[1] - before[1]) / served, 3) if served else None,
        "controller_job_info_rpcs": served,
        "server_threads_median": statistics.median(samples) if samples else None,
        "server_threads_max": max(samples) if samples else None,
    }


def bench(
    loops: int,
    jobs: int,
    seconds: float,
    rounds: int,
    query_max: int,
    target: float | None,
    factor: float,
) -> dict[str, Any]:
    from gridgate.plugins.slurm.cluster import SlurmCluster

    folder = Path(tempfile.mkdtemp(prefix="gg-bench-adaptive-", dir="/tmp"))
    folder.chmod(0o755)
    started = time.time()
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    try:
        with SlurmCluster(folder / "cluster", extra_conf=[f"MaxJobCount={jobs * 2 + 1000}"]) as c:
            _fill(c, jobs)
            policy = f"QUERY[max={query_max} nominal={query_max}]"
            (folder / "static").mkdir()
            static = _Daemon(folder / "static", {"policies": policy, "token_wait_time": 600})
            try:
                warm = _phase(c, static.socket, loops, seconds)
                if target is None:
                    target = round((warm["controller_job_info_ms"] or 1.0) * factor, 3)
                (folder / "adaptive").mkdir()
                adaptive = _Daemon(
                    folder / "adaptive",
                    {
                        "policies": policy,
                        "token_wait_time": 600,
                        "bypass": {
                            "scheduler_options": {"commands": {"sdiag": SDIAG}, "env": c.env}
                        },
                        "adaptive": {
                            "query": {
                                "target_ms": target,
                                "min": 1,
                                "max": query_max,
                                "interval": 1,
                            }
                        },
                    },
                )
                try:
                    for index in range(rounds):
                        for name, daemon in (("static", static), ("adaptive", adaptive)):
                            row = {"round": index, "daemon": name}
                            row.update(_phase(c, daemon.socket, loops, seconds))
                            if name == "adaptive":
                                seen = _status(daemon.socket)
                                row["query_max_at_end"] = seen["categories"]["query"]["token_limit"]
                            rows.append(row)
                            print(json.dumps(row), file=sys.stderr, flush=True)
                finally:
                    adaptive.stop()
            finally:
                static.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["daemon"] == name and r[key])

    return {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "loops": loops,
        "pending_jobs": jobs,
        "seconds_per_phase": seconds,
        "rounds": rounds,
        "query_max": query_max,
        "target_ms": target,
        "target_factor_of_warm_up": factor,
        "warm_up": warm,
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "rows": rows,
        "ratios_adaptive_over_static": {
            key: round(median("adaptive", key) / median("static", key), 3)
            for key in ("controller_job_info_ms", "calls_per_s", "call_median_ms", "call_p95_ms")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loops", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--query-max", type=int, default=16)
    parser.add_argument("--target-ms", default="auto")
    parser.add_argument(
        "--factors",
        default="0.5,2",
        help="with --target-ms auto: targets as these multiples of the warm-up's controller "
        "mean, one run each (default 0.5,2: one the controller cannot meet, one it meets)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    target = None if args.target_ms == "auto" else float(args.target_ms)
    factors = [float(f) for f in args.factors.split(",")] if target is None else [1.0]
    results = [
        bench(args.loops, args.jobs, args.seconds, args.rounds, args.query_max, target, factor)
        for factor in factors
    ]
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
