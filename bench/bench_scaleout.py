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
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_pilots import RedisServer

from gridgate.core.devkit.directors import (
    DirectorSpec,
    Submission,
    overlap_seconds,
    pilots_per_endpoint,
    spawn,
    submissions,
)

SUBMIT_SECONDS = 0.05


def _read(paths: list[Path]) -> dict[str, list[Submission]]:
    """Director (its file's name) -> its submissions."""
    return {path.stem: submissions([path]) for path in paths}


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
        spec = DirectorSpec(
            state={"driver": "redis", "url": url, "prefix": prefix},
            out=str(path),
            state_dir=str(folder / f"{prefix[:-1]}-state{i}"),
            groups=groups,
            pilots=pilots,
            threads=threads,
            cycle=cycle,
            lease=lease,
            lock=lock,
            max_waiting=max_waiting,
            submit_seconds=SUBMIT_SECONDS,
        )
        procs.append(spawn(spec))
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
    firsts = [min(s.start for s in rows) for rows in runs.values() if rows]
    window_start = max(firsts) if len(firsts) == n else started
    window_end = min(started + seconds, killed_at or started + seconds)
    per = {
        d: sum(s.pilots for s in rows if window_start <= s.start < window_end)
        for d, rows in runs.items()
    }
    result: dict[str, Any] = {
        "directors": n,
        "window_s": round(window_end - window_start, 2),
        "pilots_per_director": sorted(per.values()),
        "rate": sum(per.values()) / max(1e-9, window_end - window_start),
        "overlap_group_seconds": round(
            overlap_seconds(s for rows in runs.values() for s in rows), 4
        ),
    }
    if max_waiting is not None:
        waiting = pilots_per_endpoint(submissions(paths))
        result.update(
            max_waiting=max_waiting,
            demand_lock=lock,
            waiting_per_endpoint=sorted(waiting.values()),
            over_the_limit=sum(max(0, k - max_waiting) for k in waiting.values()),
        )
    if killed_at is not None:
        victim = paths[0].stem
        last: dict[str, float] = {}
        for s in runs[victim]:
            last[s.group] = max(last.get(s.group, 0.0), s.start)
        orphaned = {g for g, t in last.items() if t >= killed_at - 2 * cycle - 1}
        taken: dict[str, float] = {}
        for d, rows in runs.items():
            if d == victim:
                continue
            for s in rows:
                if s.group in orphaned and s.start > killed_at:
                    taken[s.group] = min(taken.get(s.group, float("inf")), s.start)
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
