"""What asking each endpoint's queue state costs the director (``gridgate_endpoint_state``,
issue 45): one backend of N Slurm partitions on one private cluster, the director's whole
iteration with the partitions saying nothing (``queue_state_interval: null``) against the same
with one read of the cluster at every iteration (``queue_state_interval: 0.5`` and 0.6 s between
iterations, not timed: what a cycle longer than the interval gets). ``max_waiting: 0`` keeps
every iteration alike: demand is asked, nothing is sent.

    .venv/bin/python bench/bench_queue_state.py [--partitions 50] [--rounds 9]

Prints, per mode, the median iteration, the Slurm commands run per iteration, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loguru import logger

from gridgate.core import runner
from gridgate.core.clock import SYSTEM_CLOCK
from gridgate.core.testing import director_for
from gridgate.plugins.slurm.cluster import SlurmCluster

#: the interval of the asking mode, and the pause between two iterations (longer)
INTERVAL, PAUSE = 0.5, 0.6


def _doc(cluster: SlurmCluster, folder: Path, interval: float | None) -> dict[str, Any]:
    script = folder / "pilot.sh"
    script.write_text("#!/bin/sh\nsleep 1\n", encoding="utf-8")
    script.chmod(0o755)
    return {
        "director": {
            "state_dir": str(folder / f"state-{interval}"),
            "command_timeout": 60,
            "max_threads": 4,
            "pilots": {"max_waiting": 0},
        },
        "state": {"driver": "sqlite", "path": str(folder / f"state-{interval}.db")},
        "backends": {
            "slurm": {
                "partitions": list(cluster.partitions),
                "script": str(script),
                "env": dict(cluster.env),
                "queue_state_interval": interval,
            }
        },
        "demand": {"static": {"slurm": 10}},
    }


def _measure(cluster: SlurmCluster, folder: Path, interval: float | None, rounds: int) -> dict:
    ran: list[str] = []
    real = runner.run

    def counted(argv: Any, *args: Any, **kwargs: Any) -> Any:
        ran.append(str(argv[0]))
        return real(argv, *args, **kwargs)

    runner.run = counted
    director = director_for(_doc(cluster, folder, interval), clock=SYSTEM_CLOCK)
    try:
        director.run_iteration()  # the first: stores and files made
        ran.clear()
        times = []
        for _ in range(rounds):
            time.sleep(PAUSE)  # the last read is older than the interval
            started = time.perf_counter()
            director.run_iteration()
            times.append(time.perf_counter() - started)
    finally:
        director.close()
        runner.run = real
    return {"median": statistics.median(times), "commands": len(ran) / rounds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    partitions = tuple(f"p{i:02d}" for i in range(args.partitions))
    with tempfile.TemporaryDirectory() as tmp, SlurmCluster(partitions=partitions) as cluster:
        folder = Path(tmp)
        quiet = _measure(cluster, folder, None, args.rounds)
        asking = _measure(cluster, folder, INTERVAL, args.rounds)
    print(f"{args.partitions} partitions on one cluster, {args.rounds} iterations each")
    print("| mode | median iteration | commands per iteration |")
    print("|---|---|---|")
    for name, row in (
        ("queue_state_interval: null", quiet),
        (f"queue_state_interval: {INTERVAL}", asking),
    ):
        print(f"| {name} | {row['median'] * 1000:.1f} ms | {row['commands']:.1f} |")
    print(f"ratio: {asking['median'] / quiet['median']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
