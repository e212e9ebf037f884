"""A fixed query limit against ``proxyd.adaptive``, on a real slurmctld, in one run
(docs/performance.md, "Limits that follow the scheduler"; issue 33's figure).

The gate bench's shape (bench_slurm.py, whose phases this reuses): a private Slurm cluster with
``--jobs`` pending (held) jobs; ``--loops`` squeue loops as ``nobody`` and a light user
(``daemon``) running one squeue a second, both taking query tokens through the in-process
client (mode ``client``), for ``--seconds`` per phase. Two real ``gridgate lsfproxyd serve``
daemons: ``fixed`` (``--fixed``, default ``QUERY[max=3 nominal=3 user_max=2]``, the gate
bench's) and ``adaptive`` (``QUERY[max=32 nominal=32]`` with ``adaptive.query``: target
``--target-ms``, min 1, max 32, interval 1 s). Each of ``--rounds`` rounds runs ``idle`` (the
light user alone), fixed and adaptive, so load from elsewhere hits all three alike; the figures
are medians over the rounds.

Figures: the light user's gated median over its idle median (goal <= 1.3), and the loops'
squeue calls/s, adaptive over fixed (goal >= 0.8); beside them slurmctld's own mean
REQUEST_JOB_INFO time and thread count, and where the adaptive max ended each phase.

    .venv/bin/python bench/bench_adaptive.py [--loops 32] [--jobs 200] [--seconds 20]
        [--rounds 2] [--target-ms 5] [--max-server-threads N]
        [--fixed 'QUERY[max=3 nominal=3 user_max=2]'] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gate import _Daemon  # noqa: E402  (the same real token daemon the gate bench uses)
from bench_slurm import _fill, _phase  # noqa: E402

SDIAG = shutil.which("sdiag", path="/usr/bin:/bin") or "/usr/bin/sdiag"


def _status(socket: str) -> dict[str, Any]:
    from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient

    with ProxyClient([Daemon("proxyd", socket)]) as client:
        [reply] = client.admin("status")
    return dict((reply.reply or {})["status"])


def bench(
    loops: int,
    jobs: int,
    seconds: float,
    rounds: int,
    target: float,
    fixed: str,
    max_threads: int | None = None,
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
            common = {"token_wait_time": 600}
            (folder / "fixed").mkdir(mode=0o755)
            (folder / "adaptive").mkdir(mode=0o755)
            daemons = {
                "fixed": _Daemon(folder / "fixed", {**common, "policies": fixed}),
                "adaptive": _Daemon(
                    folder / "adaptive",
                    {
                        **common,
                        "policies": "QUERY[max=32 nominal=32]",
                        "bypass": {
                            "scheduler_options": {"commands": {"sdiag": SDIAG}, "env": c.env}
                        },
                        "adaptive": {
                            "query": {
                                "target_ms": target,
                                "min": 1,
                                "max": 32,
                                "interval": 1,
                                "max_server_threads": max_threads,
                            }
                        },
                    },
                ),
            }
            for daemon in daemons.values():
                Path(daemon.socket).chmod(0o666)
            try:
                shims = folder / "no-shims"  # mode client: the in-process token client
                for index in range(rounds):
                    # an idle phase in every round: the first squeues after the fill are slow
                    idle = _phase(c, "idle", loops, seconds, daemons["fixed"].socket, shims)
                    rows.append({"daemon": "idle", "round": index, **idle})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                    for name, daemon in daemons.items():
                        row: dict[str, Any] = {"daemon": name, "round": index}
                        row.update(_phase(c, "client", loops, seconds, daemon.socket, shims))
                        seen = _status(daemon.socket)
                        row["query_max_at_end"] = seen["categories"]["query"]["token_limit"]
                        if name == "adaptive":
                            row["adaptive_last"] = seen["adaptive"]["query"]["last"]
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
            finally:
                for daemon in daemons.values():
                    daemon.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def median(name: str, key: str) -> float:
        return float(statistics.median(r[key] for r in rows if r["daemon"] == name))

    idle_ms = median("idle", "light_median_ms")
    return {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "loops": loops,
        "pending_jobs": jobs,
        "seconds_per_phase": seconds,
        "rounds": rounds,
        "fixed": fixed,
        "target_ms": target,
        "max_server_threads": max_threads,
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "rows": rows,
        "figures": {
            "light_gated_over_idle": {
                name: round(median(name, "light_median_ms") / idle_ms, 2)
                for name in ("fixed", "adaptive")
            },
            "light_gated_over_idle_goal": 1.3,
            "loops_adaptive_over_fixed": round(
                median("adaptive", "loop_calls_per_s") / median("fixed", "loop_calls_per_s"), 3
            ),
            "loops_adaptive_over_fixed_goal": 0.8,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loops", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target-ms", type=float, default=5.0)
    parser.add_argument("--fixed", default="QUERY[max=3 nominal=3 user_max=2]")
    parser.add_argument("--max-server-threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = bench(
        args.loops,
        args.jobs,
        args.seconds,
        args.rounds,
        args.target_ms,
        args.fixed,
        args.max_server_threads,
    )
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
