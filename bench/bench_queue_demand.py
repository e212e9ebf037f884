"""The queue demand (issue 23) through the real director and a real redis-server (started here
on loopback): pilots waiting per iteration against ceil(W / jobs_per_pilot) and the limits,
submissions after the task queue drains, and what counting a group's waiting pilots costs.

    .venv/bin/python bench/bench_queue_demand.py [--iterations 12] [--sizes 1000 10000]

- **settle**: for each scenario (W jobs in a Redis list, jobs_per_pilot k, the limits), a
  director with the ``queue`` demand and an in-process tracking backend of 3 endpoints runs
  ``--iterations`` iterations. After iteration 4 half of the waiting pilots start, each taking
  k jobs off the list (LPOP), so the target moves; after iteration 8 the list is deleted (the
  queue drains). Reported per iteration: the jobs in the list, the target
  min(ceil(W/k), limit), the pilots waiting after the iteration, and the pilots submitted.
- **count**: ``PilotRegistry.waiting()`` (what the demand subtracts and max_waiting_cores
  counts) on sqlite and Redis with N waiting pilots over 1,000 endpoints and 9 N finished
  ones: median of 20 calls.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_pilots import RedisServer  # noqa: E402 - a script beside it
from support.director import (  # type: ignore[import-not-found]  # noqa: E402 - tests/support
    BACKEND,
    TrackingBackend,
)

from gridgate.core.clock import FakeClock  # noqa: E402
from gridgate.core.engine.director import Director
from gridgate.core.state import Pilot
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState
from gridgate.core.testing import make_config  # noqa: E402

#: (name, W, k, director.pilots, resources)
SCENARIOS: list[tuple[str, int, int, dict[str, Any], dict[str, Any]]] = [
    ("W=10 k=3", 10, 3, {}, {}),
    ("W=37 k=1", 37, 1, {}, {}),
    ("W=100 k=4", 100, 4, {}, {}),
    ("W=200 k=1, max_waiting 20 (default)", 200, 1, {}, {}),
    ("W=200 k=1, 8 cores, max_waiting_cores 64", 200, 1, {"max_waiting_cores": 64}, {"cores": 8}),
]


def settle(url: str, name: str, jobs: int, k: int, pilots: dict, resources: dict, n: int):
    import redis

    client = redis.Redis.from_url(url)
    key = f"tq:{uuid.uuid4().hex}"
    client.rpush(key, *range(jobs))
    clock = FakeClock()
    backend = TrackingBackend(servers=3)
    group = {"backend": BACKEND, "source": {"redis": {"url": url, "key": key}}}
    group.update(jobs_per_pilot=k, resources=resources)
    doc = {
        "director": {"cycle_seconds": 0.01, "max_threads": 4, "pilots": pilots},
        "state": {"driver": "memory"},
        "demand": {"queue": {"groups": {"mc": group}}},
    }
    config = make_config(doc)
    settings = config.director["pilots"]
    per_endpoint = [
        settings["max_waiting"],
        None
        if settings["max_waiting_cores"] is None
        else settings["max_waiting_cores"] // int(resources.get("cores", 1)),
    ]
    limit = min((x for x in per_endpoint if x is not None), default=None)
    director = Director(
        config, clock=clock, extra_plugins=[backend], state=MemoryState(clock=clock)
    )
    rows = []
    for step in range(1, n + 1):
        listed = int(client.llen(key))
        summary = director.run_iteration()
        submitted = sum(r.pilots for r in summary.records if r.outcome == "submitted")
        waiting = sum(
            c for (_b, _e, _g), (c, _cores) in director.state.pilot_registry().waiting().items()
        )
        target = math.ceil(listed / k)
        if limit is not None:
            target = min(target, 3 * limit)
        rows.append(
            {
                "iteration": step,
                "jobs": listed,
                "target": target,
                "waiting": waiting,
                "submitted": submitted,
            }
        )
        if step == 4:
            for endpoint in ("s0", "s1", "s2"):
                started = backend.move(endpoint, "running", backend.count(endpoint, "waiting") // 2)
                for _ in started:
                    client.lpop(key, k)
        if step == 8:
            client.delete(key)
        clock.advance(60)
    director.close()
    client.close()
    return {"scenario": name, "rows": rows}


def count_cost(url: str, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {"waiting": size}
    pilots = []
    for i in range(size * 10):
        state = "waiting" if i % 10 == 0 else "done"
        pilots.append(
            Pilot(f"j{i}", "b", f"e{i % 1000}", "mc", 0.0, state, float(i), cores=1 + i % 8)
        )
    with tempfile.TemporaryDirectory() as folder:
        stores = {
            "sqlite": SqliteState({"path": str(Path(folder) / "state.db")}, clock=FakeClock()),
            "redis": RedisState(
                {"url": url, "prefix": f"b-{uuid.uuid4().hex}:"}, clock=FakeClock()
            ),
        }
        for name, store in stores.items():
            registry = store.pilot_registry()
            for start in range(0, len(pilots), 10_000):
                registry.put(pilots[start : start + 10_000])
            times = []
            for _ in range(20):
                began = time.perf_counter()
                found = registry.waiting()
                times.append(time.perf_counter() - began)
            assert sum(n for n, _c in found.values()) == size
            out[name + "_ms"] = round(statistics.median(times) * 1000, 2)
            store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000])
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    with RedisServer() as url:
        for scenario in SCENARIOS:
            result = settle(url, *scenario, args.iterations)
            rows = result["rows"]
            print(f"\n{result['scenario']}")
            print("| iteration | " + " | ".join(str(r["iteration"]) for r in rows) + " |")
            for field in ("jobs", "target", "waiting", "submitted"):
                print(f"| {field} | " + " | ".join(str(r[field]) for r in rows) + " |")
            over = [r for r in rows if r["waiting"] > r["target"] and r["iteration"] <= 8]
            print(json.dumps({"scenario": result["scenario"], "waiting_above_target": len(over)}))
        for size in args.sizes:
            print(json.dumps(count_cost(url, size)))


if __name__ == "__main__":
    main()
