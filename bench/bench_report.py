"""`gridgate report` over a long history (issue 43): the report counted in the store
(``StateStore.record_groups`` and ``PilotRegistry.finished_per_slot``, SQL on sqlite and
PostgreSQL) against the same report counted from every row and every finished pilot read into
the director's Python (what the report did before), on the same store in the same run.

The store is filled with ``--rows`` accounting rows and ``--pilots`` finished pilots spread
over 7 days and 11 endpoints (written as the drivers write them, in bulk); each way of reading
runs in a fresh child process, so its peak RSS is its own, and the two tables are checked
equal. Figures: wall and CPU time of the child's read and table, and its peak RSS; ratios
counted-in-store / read-whole.

    .venv/bin/python bench/bench_report.py [--driver sqlite|postgresql] [--rows 200000]
        [--pilots 1000000] [--repeat 3] [--json]

PostgreSQL runs in a private cluster the bench starts (tests/support/postgres_server.py, as
the tests do).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DAY = 86400.0
BUCKET = 3600.0


def _store(spec: dict[str, Any]) -> Any:
    from gridgate.core.state import open_state

    return open_state({"state": spec})


def fill(spec: dict[str, Any], rows: int, pilots: int, seed: int = 5) -> float:
    """Write the history; seconds it took."""
    from gridgate.core.engine.runtime import ACCOUNTING
    from gridgate.core.state import Pilot, encode_record

    rng = random.Random(seed)
    now = time.time()
    started = time.perf_counter()
    store = _store(spec)
    records = []
    for i in range(rows):
        outcome = rng.choices(["submitted", "failed", "skipped"], [8, 1, 1])[0]
        kind = {"failed": "error", "skipped": "max_waiting"}.get(outcome, "")
        records.append(
            encode_record(
                {
                    "time": now - rng.random() * 7 * DAY,
                    "backend": "arc",
                    "endpoint": f"ce{i % 11:02d}.example.org",
                    "outcome": outcome,
                    "pilots": rng.choice([1, 1, 1, 2, 5]),
                    "failure_kind": kind,
                    "name": f"sub-{i}",
                }
            )
        )
    if spec["driver"] == "sqlite":
        import sqlite3

        with sqlite3.connect(spec["path"]) as db:
            store.records(ACCOUNTING)  # the tables made
            db.executemany(
                "INSERT INTO records (stream, time, data) VALUES (?, ?, ?)",
                [(ACCOUNTING, t, d) for t, d in records],
            )
    else:
        sql = f"INSERT INTO {store._s}.records (stream, time, data) VALUES (%s, %s, %s)"
        for start in range(0, len(records), 20_000):
            chunk = [(ACCOUNTING, t, d) for t, d in records[start : start + 20_000]]
            store.run("fill", lambda conn, c=chunk: conn.cursor().executemany(sql, c))
    registry = store.pilot_registry()
    batch: list[Pilot] = []
    for i in range(pilots):
        changed = now - rng.random() * 7 * DAY
        state = rng.choices(["done", "failed", "lost"], [8, 2, 1])[0]
        batch.append(
            Pilot(
                f"j{i:08d}",
                "arc",
                f"ce{i % 11:02d}.example.org",
                "g",
                changed - 600,
                state,
                changed,
            )
        )
        if len(batch) == 20_000:
            registry.put(batch)
            batch = []
    registry.put(batch)
    store.close()
    return time.perf_counter() - started


def child(spec: dict[str, Any], way: str, since: float) -> dict[str, Any]:
    """One report read, ``way`` 'store' (counted in the store) or 'whole' (every row)."""
    from loguru import logger

    from gridgate.core.commands.report import FINISHED_STATES, hourly_table, read_report
    from gridgate.core.engine.runtime import ACCOUNTING, FAILURES
    from gridgate.core.engine.tracking import state_counts

    logger.remove()
    store = _store(spec)
    wall, cpu = time.perf_counter(), time.process_time()
    if way == "store":
        table = read_report(store, since, BUCKET).table()
    else:
        registry = store.pilot_registry()
        finished = [p for p in registry.query(states=FINISHED_STATES) if p.changed >= since]
        table = hourly_table(
            store.records(ACCOUNTING, since),
            BUCKET,
            finished,
            state_counts(registry.counts()),
            store.records(FAILURES, since),
        )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    store.close()
    kept = {k: table[k] for k in ("pilots", "totals", "finished", "failure_kinds", "trimmed")}
    return {
        "way": way,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "digest": json.dumps(kept, sort_keys=True),
    }


def run_child(spec: dict[str, Any], way: str, since: float) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            way,
            "--spec",
            json.dumps(spec),
            "--since",
            str(since),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(spec: dict[str, Any], rows: int, pilots: int, repeat: int) -> dict[str, Any]:
    fill_s = fill(spec, rows, pilots)
    since = 0.0  # the whole week: what --since 7d reads
    runs = []
    for _ in range(repeat):  # alternating, so that load on the machine falls on both
        whole = run_child(spec, "whole", since)
        store = run_child(spec, "store", since)
        if whole.pop("digest") != store.pop("digest"):
            raise SystemExit("the two reports differ")
        runs.append({"whole": whole, "store": store})

    def median(way: str, key: str) -> float:
        values = sorted(r[way][key] for r in runs)
        return values[len(values) // 2]

    result: dict[str, Any] = {
        "driver": spec["driver"],
        "rows": rows,
        "pilots": pilots,
        "fill_s": round(fill_s, 1),
        "runs": runs,
    }
    for key in ("wall_s", "cpu_s", "peak_rss_mb"):
        result[key] = {
            "whole": round(median("whole", key), 3),
            "store": round(median("store", key), 3),
            "ratio": round(median("store", key) / median("whole", key), 3),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--pilots", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--since", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.spec), args.child, args.since)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-report-") as folder:
        if args.driver == "sqlite":
            result = measure(
                {"driver": "sqlite", "path": f"{folder}/state.db"},
                args.rows,
                args.pilots,
                args.repeat,
            )
        else:
            sys.path.insert(0, str(HERE.parent / "tests"))
            from support.postgres_server import (  # type: ignore[import-not-found]
                PostgresServer,
            )

            with PostgresServer() as server:
                spec = server.state_section(Path(folder))
                result = measure(spec, args.rows, args.pilots, args.repeat)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['driver']}: {args.rows} accounting rows, {args.pilots} finished pilots")
    for key in ("wall_s", "cpu_s", "peak_rss_mb"):
        r = result[key]
        print(
            f"  {key:<12} every row {r['whole']:>10}  in the store {r['store']:>10}  ratio {r['ratio']}"
        )


if __name__ == "__main__":
    main()
