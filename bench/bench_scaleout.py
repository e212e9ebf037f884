"""Several directors on one Redis (issue 43): throughput of 1, 2 and 4 director processes
sharing the demand groups (``director.demand_lock``), the time two directors submitted to one
group at once, and the takeover of a director killed with SIGKILL.

Each director is a process of its own with an in-process stand-in backend whose submission
sleeps 50 ms (no CPU) and notes when it ran; demand is 4x what one director can submit.

    .venv/bin/python bench/bench_scaleout.py [--seconds 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench_pilots import RedisServer

BACKEND = "standin"
SUBMIT_SECONDS = 0.05


def worker(spec: dict[str, Any]) -> None:
    """One director process: runs until SIGTERM (a clean stop) or SIGKILL."""
    from loguru import logger

    from gridgate.core import hookimpl
    from gridgate.core.engine.director import Director
    from gridgate.core.model import BackendInfo, Endpoint, JobStatus, StatusResult, SubmitResult
    from gridgate.core.stores.redis import RedisState
    from gridgate.core.testing import make_config

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    out = open(spec["out"], "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - the process's life
    lock = threading.Lock()

    class StandIn:
        endpoints = tuple(Endpoint(BACKEND, f"ce{i}") for i in range(8))

        @hookimpl
        def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
            return BackendInfo(BACKEND, self.endpoints) if backend == BACKEND else None

        @hookimpl
        def gridgate_submit(self, endpoint, request, timeout):  # noqa: ANN001, ANN201
            if endpoint.backend != BACKEND:
                return None
            started = time.time()
            time.sleep(SUBMIT_SECONDS)
            ended = time.time()
            with lock:
                out.write(
                    json.dumps([request.group, started, ended, request.count, endpoint.name]) + "\n"
                )
            ids = tuple(uuid.uuid4().hex[:12] for _ in range(request.count))
            return SubmitResult(endpoint, ok=True, job_ids=ids)

        @hookimpl
        def gridgate_job_status(self, endpoint, job_ids, timeout):  # noqa: ANN001, ANN201
            if endpoint.backend != BACKEND:
                return None
            # pilots that never start: only max_waiting stops the directors
            states = {j: JobStatus(j, "waiting") for j in job_ids}
            return StatusResult(endpoint, ok=True, statuses=states)

    doc = {
        "director": {
            "cycle_seconds": spec["cycle"],
            "max_threads": spec["threads"],
            "command_timeout": 10,
            "demand_lock": spec.get("lock", True),
            "lease_seconds": spec["lease"],
            "state_dir": spec["state_dir"],
            "pilots": {"max_waiting": spec.get("max_waiting"), "max_wait_time": None},
        },
        "state": {"driver": "memory"},  # the Redis store is given below
        "demand": {
            "static": {
                BACKEND: [
                    {"group": f"g{i:02d}", "pilots": spec["pilots"]} for i in range(spec["groups"])
                ]
            }
        },
    }
    state = RedisState({"url": spec["url"], "prefix": spec["prefix"]})
    director = Director(make_config(doc), extra_plugins=[StandIn()], state=state)
    signal.signal(signal.SIGTERM, lambda *_: director.stop())
    try:
        director.run()
    finally:
        director.close()


def _spawn(spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    code = "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_scaleout as b; b.worker(json.loads(sys.argv[2]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, str(Path(__file__).parent), json.dumps(spec)]
    )


def _read(paths: list[Path]) -> dict[str, list[tuple[str, float, float, int]]]:
    """Director -> its submissions (group, start, end, pilots)."""
    out: dict[str, list[tuple[str, float, float, int]]] = {}
    for path in paths:
        rows = []
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                group, start, end, n, _endpoint = json.loads(line)
                rows.append((group, start, end, n))
        out[path.stem] = rows
    return out


def _per_endpoint(paths: list[Path]) -> dict[str, int]:
    """Endpoint -> pilots all directors submitted there (none ever starts: all wait)."""
    out: dict[str, int] = defaultdict(int)
    for path in paths:
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                _g, _s, _e, n, endpoint = json.loads(line)
                out[endpoint] += n
    return dict(out)


def overlap_seconds(runs: dict[str, list[tuple[str, float, float, int]]]) -> float:
    """Group-seconds during which two or more directors had a submission in flight on the
    same group."""
    events: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for director, rows in runs.items():
        for group, start, end, _n in rows:
            events[group] += [(start, 1, director), (end, -1, director)]
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


def run_directors(
    url: str,
    folder: Path,
    n: int,
    seconds: float,
    *,
    groups: int,
    pilots: int,
    threads: int,
    cycle: float,
    lease: float,
    kill_after: float | None = None,
    max_waiting: int | None = None,
    lock: bool = True,
) -> dict[str, Any]:
    prefix = f"scale-{uuid.uuid4().hex[:8]}:"
    paths = [folder / f"{prefix[:-1]}-d{i}.jsonl" for i in range(n)]
    procs = []
    for i, path in enumerate(paths):
        spec = {
            "url": url,
            "prefix": prefix,
            "out": str(path),
            "groups": groups,
            "pilots": pilots,
            "threads": threads,
            "cycle": cycle,
            "lease": lease,
            "state_dir": str(folder / f"{prefix[:-1]}-state{i}"),
            "max_waiting": max_waiting,
            "lock": lock,
        }
        procs.append(_spawn(spec))
    started = time.time()
    killed_at = None
    try:
        if kill_after is not None:
            time.sleep(kill_after)
            procs[0].send_signal(signal.SIGKILL)
            killed_at = time.time()
            time.sleep(max(0.0, seconds - kill_after))
        else:
            time.sleep(seconds)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    runs = _read(paths)
    # the steady window: from the time every director has submitted once, to the end
    firsts = [min(s for _g, s, _e, _n in rows) for rows in runs.values() if rows]
    window_start = max(firsts) if len(firsts) == n else started
    window_end = min(started + seconds, killed_at or started + seconds)
    per = {
        d: sum(k for _g, s, _e, k in rows if window_start <= s < window_end)
        for d, rows in runs.items()
    }
    result: dict[str, Any] = {
        "directors": n,
        "window_s": round(window_end - window_start, 2),
        "pilots_per_director": sorted(per.values()),
        "rate": sum(per.values()) / max(1e-9, window_end - window_start),
        "overlap_group_seconds": round(overlap_seconds(runs), 4),
    }
    if max_waiting is not None:
        waiting = _per_endpoint(paths)
        result.update(
            max_waiting=max_waiting,
            demand_lock=lock,
            waiting_per_endpoint=sorted(waiting.values()),
            over_the_limit=sum(max(0, k - max_waiting) for k in waiting.values()),
        )
    if killed_at is not None:
        victim = paths[0].stem
        last: dict[str, float] = {}
        for g, s, _e, _n in runs[victim]:
            last[g] = max(last.get(g, 0.0), s)
        orphaned = {g for g, t in last.items() if t >= killed_at - 2 * cycle - 1}
        taken: dict[str, float] = {}
        for d, rows in runs.items():
            if d == victim:
                continue
            for g, s, _e, _n in rows:
                if g in orphaned and s > killed_at:
                    taken[g] = min(taken.get(g, float("inf")), s)
        delays = [taken[g] - killed_at for g in orphaned if g in taken]
        result.update(
            lease_s=lease,
            groups_of_the_killed=len(orphaned),
            taken_over=len(delays),
            takeover_max_s=round(max(delays), 2) if delays else None,
            within_two_leases=bool(delays)
            and len(delays) == len(orphaned)
            and max(delays) <= 2 * lease,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cycle = 1.0
    one = args.threads / SUBMIT_SECONDS * cycle  # what one director can submit a cycle
    groups = 16
    pilots = max(1, int(4 * one / groups))
    figures: dict[str, Any] = {
        "submit_seconds": SUBMIT_SECONDS,
        "threads": args.threads,
        "demand_per_cycle": groups * pilots,
        "one_director_capacity": one,
    }
    with tempfile.TemporaryDirectory(prefix="gridgate-scaleout-") as tmp, RedisServer() as url:
        folder = Path(tmp)
        rows = []
        for n in (1, 2, 4):
            rows.append(
                run_directors(
                    url,
                    folder,
                    n,
                    args.seconds,
                    groups=groups,
                    pilots=pilots,
                    threads=args.threads,
                    cycle=cycle,
                    lease=3.0,
                )
            )
        base = rows[0]["rate"]
        for row in rows:
            row["ratio"] = round(row["rate"] / base, 2)
            row["rate"] = round(row["rate"], 1)
        figures["throughput"] = rows
        figures["sigkill"] = run_directors(
            url,
            folder,
            2,
            args.seconds,
            groups=8,
            pilots=pilots,
            threads=args.threads,
            cycle=cycle,
            lease=3.0,
            kill_after=args.seconds / 2,
        )
        figures["limits"] = [
            run_directors(
                url,
                folder,
                4,
                args.seconds / 2,
                groups=groups,
                pilots=pilots,
                threads=args.threads,
                cycle=cycle,
                lease=3.0,
                max_waiting=20,
                lock=lock,
            )
            for lock in (False, True)
        ]
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for row in figures["throughput"]:
        print(
            f"{row['directors']} director(s): {row['rate']} pilots/s, {row['ratio']}x one; "
            f"per director {row['pilots_per_director']}; two on one group "
            f"{row['overlap_group_seconds']} group-s"
        )
    kill = figures["sigkill"]
    print(
        f"SIGKILL of one of 2 (lease {kill['lease_s']} s): {kill['taken_over']} of "
        f"{kill['groups_of_the_killed']} groups taken over, the last after "
        f"{kill['takeover_max_s']} s; two on one group {kill['overlap_group_seconds']} group-s"
    )
    for row in figures["limits"]:
        print(
            f"4 directors, demand_lock {row['demand_lock']}, max_waiting {row['max_waiting']}: "
            f"waiting per endpoint {row['waiting_per_endpoint']}, {row['over_the_limit']} over"
        )


if __name__ == "__main__":
    main()
