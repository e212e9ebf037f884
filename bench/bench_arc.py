"""The arc backend against a real ARC CE (A-REX 6.17, fork LRMS, started here in a temporary
folder): submission rate, status queries per poll, and how late the registry learns of a
finished pilot. Every figure comes from one run; the rate is a ratio within that run.

    .venv/bin/python bench/bench_arc.py [--pilots 24] [--threads 4] [--rounds 4] [--poll 200]

- **rate**: ``--pilots`` trivial pilots, ``--threads`` at a time, submitted (a) by a plain loop
  of the real ``arcsub`` (the same xRSL, one job list per thread, no ``-d VERBOSE``) and (b) by
  one director iteration (``Director.run_iteration``, the ``arc`` backend, ``max_threads`` =
  ``--threads``, a managed proxy); alternated for ``--rounds`` rounds, the CE left to finish
  the previous phase's jobs before the next starts. Reported: pilots/s of each, and the
  director's over the loop's (the issue asks >= 0.9).
- **polls**: one director with 1 tracked pilot and one with ``--poll`` (submitted in bulks of
  10); the status poll that follows is counted by a wrapper around ``arcstat``
  (``commands.arcstat``), which also times each call.
- **lag**: ``--lag`` pilots submitted by a director that then iterates every 2 s
  (status_interval none) until all are ``done``: the registry's ``done`` time against A-REX's own ``State: FINISHED``
  line in its log (seconds after submission, median and max).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from loguru import logger

from gridgate.core.config import validate_document
from gridgate.core.director import Director
from gridgate.core.runner import run
from gridgate.plugins.arc.ce import ArcCE

ARCSUB = "/usr/bin/arcsub"
ARCSTAT = "/usr/bin/arcstat"
PILOT = "#!/bin/sh\nexit 0\n"
WRAPPER = """#!{python}
import subprocess, sys, time
started = time.time()
proc = subprocess.run([{real!r}, *sys.argv[1:]])
with open({log!r}, "a") as log:
    log.write(f"{{started}} {{time.time() - started:.3f}} {{len(sys.argv) - 1}}\\n")
sys.exit(proc.returncode)
"""
FINISHED_RE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] \[Arc\] \[INFO\] \[[^]]*\] (\S+): State: FINISHED from"
)


def _doc(ce: ArcCE, folder: Path, pilots: int, threads: int, **backend: Any) -> dict[str, Any]:
    proxy = folder / "proxy.pem"
    if not proxy.exists():
        proxy.write_bytes(Path(ce.proxy).read_bytes())
        proxy.chmod(0o600)
    return {
        "director": {
            "state_dir": str(folder / "state"),
            "command_timeout": 120,
            "max_threads": threads,
            "cycle_seconds": 2,
            "pilots": {"status_interval": None},
        },
        "state": {"driver": "sqlite", "path": str(folder / "state" / "state.db")},
        "credentials": {
            "x509_proxy": {
                "path": str(proxy),
                "min_lifetime": 600,
                "renew": [
                    "/usr/bin/arcproxy",
                    "-z",
                    str(ce.client_conf),
                    "-C",
                    str(ce.usercert),
                    "-K",
                    str(ce.userkey),
                    "-T",
                    str(ce.certificates),
                    "-P",
                    str(proxy),
                ],
            }
        },
        "backends": {
            "arc": {
                "endpoints": [ce.url],
                "script": str(folder.parent / "pilot.sh"),
                "env": {"X509_CERT_DIR": str(ce.certificates)},
                "keep_on_ce": True,
                **backend,
            }
        },
        "demand": {"static": {"arc": pilots}},
        "notifiers": {"log": {}},
    }


def _finished_times(ce: ArcCE) -> dict[str, float]:
    times: dict[str, float] = {}
    for line in ce.log("arex.log").splitlines():
        found = FINISHED_RE.match(line)
        if found:
            when = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").astimezone().timestamp()
            times.setdefault(found.group(2), when)
    return times


def _wait_finished(ce: ArcCE, ids: list[str], timeout: float = 600) -> None:
    want = {i.rsplit("/", 1)[-1] for i in ids}
    deadline = time.monotonic() + timeout
    while not want <= set(_finished_times(ce)) and time.monotonic() < deadline:
        time.sleep(2)
    time.sleep(ce.info_period)  # and one info-provider run over them, so both phases start alike


def plain_loop(ce: ArcCE, folder: Path, pilots: int, threads: int) -> tuple[float, list[str]]:
    """``pilots`` arcsub calls, ``threads`` at a time, one job list per thread."""
    from gridgate.core.plugins import PluginContext
    from gridgate.plugins.arc.backend import ArcBackend

    folder.mkdir(parents=True)
    section = {"endpoints": [ce.url], "script": str(folder.parent / "pilot.sh")}
    backend = ArcBackend(section, PluginContext(state_dir=folder))
    (ce_entry,) = backend._ces.values()
    description = folder / "pilot.xrsl"
    description.write_text(backend.description(ce_entry, None), encoding="utf-8")  # type: ignore[arg-type]
    env = {**os.environ, **ce.env}
    ids: list[str] = []
    lock = threading.Lock()

    def one(index: int) -> None:
        lane = folder / f"lane{index % threads}"
        lane.mkdir(exist_ok=True)
        out = run(
            [
                ARCSUB,
                "-z",
                str(ce.client_conf),
                "-j",
                str(lane / "jobs.dat"),
                "-C",
                ce.url,
                "-T",
                "arcrest",
                str(description),
            ],
            120,
            env=env,
            cwd=folder,
        )
        found = re.findall(r"Job submitted with jobid: (\S+)", out.stdout)
        with lock:
            ids.extend(found)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, range(pilots)))
    return time.monotonic() - started, ids


def director_once(
    ce: ArcCE, folder: Path, pilots: int, threads: int, **backend: Any
) -> tuple[float, Director, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    director = Director(validate_document(_doc(ce, folder, pilots, threads, **backend)))
    started = time.monotonic()
    summary = director.run_iteration()
    return time.monotonic() - started, director, summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pilots", type=int, default=24)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--poll", type=int, default=200)
    parser.add_argument("--lag", type=int, default=8)
    args = parser.parse_args()
    logger.remove()  # the bench prints its figures; the director's own log only when it warns
    logger.add(sys.stderr, level="WARNING")
    work = Path(tempfile.mkdtemp(prefix="bench-arc-", dir="/tmp"))
    work.chmod(0o755)
    (work / "pilot.sh").write_text(PILOT, encoding="utf-8")
    (work / "pilot.sh").chmod(0o755)
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": os.getloadavg()[0],
        "rounds": [],
    }
    with ArcCE(work / "ce") as ce:
        directors: list[tuple[Director, Any]] = []
        for r in range(args.rounds):
            row: dict[str, Any] = {}
            order = ("loop", "director") if r % 2 == 0 else ("director", "loop")
            for phase in order:
                if phase == "loop":
                    seconds, ids = plain_loop(ce, work / f"loop{r}", args.pilots, args.threads)
                    row["loop"] = {
                        "seconds": round(seconds, 2),
                        "submitted": len(ids),
                        "rate": round(len(ids) / seconds, 3),
                    }
                else:
                    seconds, director, summary = director_once(
                        ce, work / f"director{r}", args.pilots, args.threads
                    )
                    ids = [
                        j
                        for rec in summary.records
                        if rec.outcome == "submitted"
                        for j in rec.job_ids
                    ]
                    directors.append((director, summary))
                    row["director"] = {
                        "seconds": round(seconds, 2),
                        "submitted": len(ids),
                        "rate": round(len(ids) / seconds, 3),
                    }
                _wait_finished(ce, ids)
            row["ratio"] = round(row["director"]["rate"] / row["loop"]["rate"], 3)
            row["load"] = round(os.getloadavg()[0], 1)
            print(json.dumps(row), file=sys.stderr, flush=True)
            result["rounds"].append(row)
        result["ratio_median"] = statistics.median(r["ratio"] for r in result["rounds"])

        for d, _s in directors:
            d.close()

        # lag: a director that submits --lag pilots, then iterates every 2 s until all are done
        _seconds, director, summary = director_once(ce, work / "lag", args.lag, args.threads)
        submitted = {
            j: rec.time
            for rec in summary.records
            if rec.outcome == "submitted"
            for j in rec.job_ids
        }
        deadline = time.monotonic() + 300
        registry = director.state.pilot_registry()
        while time.monotonic() < deadline:
            time.sleep(2)
            director.run_iteration()
            pilots = [p for p in registry.query("arc", None, None) if p.job_id in submitted]
            if pilots and all(p.state == "done" for p in pilots):
                break
        finished = _finished_times(ce)
        lag_registry, lag_ce = [], []
        for pilot in registry.query("arc", None, None):
            if pilot.job_id in submitted and pilot.state == "done":
                lag_registry.append(pilot.changed - submitted[pilot.job_id])
                lag_ce.append(finished[pilot.job_id.rsplit("/", 1)[-1]] - submitted[pilot.job_id])
        result["lag"] = {
            "pilots": len(lag_registry),
            "poll_every_s": 2,
            "registry_done_s": {
                "median": round(statistics.median(lag_registry), 1),
                "max": round(max(lag_registry), 1),
            },
            "ce_finished_s": {
                "median": round(statistics.median(lag_ce), 1),
                "max": round(max(lag_ce), 1),
            },
        }
        director.close()

        # polls: 1 and --poll tracked pilots, one arcstat per poll counted by a wrapper
        result["polls"] = {}
        for count in (1, args.poll):
            folder = work / f"poll{count}"
            folder.mkdir()
            log = folder / "arcstat.log"
            wrapper = folder / "arcstat"
            wrapper.write_text(
                WRAPPER.format(python=sys.executable, real=ARCSTAT, log=str(log)), encoding="utf-8"
            )
            wrapper.chmod(0o755)
            bulk = min(10, count)
            _s, director, summary = director_once(
                ce,
                folder,
                count,
                args.threads,
                pilots_per_submission=bulk,
                commands={"arcstat": str(wrapper)},
            )
            tracked = sum(rec.pilots for rec in summary.records if rec.outcome == "submitted")
            polled = director.run_iteration()
            director.close()
            calls = log.read_text().splitlines() if log.exists() else []
            polls = polled.pilots.polls if polled.pilots is not None else ()
            result["polls"][str(count)] = {
                "tracked": tracked,
                "arcstat_calls": len(calls),
                "ids_per_call": [int(c.split()[2]) - 4 for c in calls],
                "poll_seconds": [float(c.split()[1]) for c in calls],
                "commands_reported": [p.commands for p in polls],
            }
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
