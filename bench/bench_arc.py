"""The arc backend against a real ARC CE (A-REX 6.17, fork LRMS, started here in a temporary
folder): submission rate and CPU per pilot through each interface, status requests per poll,
and how late the registry learns of a finished pilot. Every figure comes from one run; rates
are compared within that run.

    .venv/bin/python bench/bench_arc.py [--pilots 60] [--threads 4] [--rounds 2] [--poll 200]

- **rate**: ``--pilots`` trivial pilots, ``--threads`` at a time, submitted by (a) a plain loop
  of the real ``arcsub`` (the same xRSL, one job list per thread, no ``-d VERBOSE``), (b) one
  director iteration with ``interface: cli``, (c) one with ``interface: rest`` and one pilot
  per POST, (d) one with ``interface: rest`` and 10 descriptions per POST
  (``pilots_per_submission: 10``); the director's ``max_threads`` = ``--threads``, a managed
  proxy. The phases run in turn (reversed every other round), for ``--rounds`` rounds, the CE
  left to finish the previous phase's jobs before the next starts. Reported per phase: pilots/s,
  and the CPU seconds per pilot of this machine's side (``getrusage`` SELF + CHILDREN: the
  bench's threads and the arcsub processes for the loop; the director's iteration, its threads
  and the commands it ran, for the directors); each director's rate over the loop's in the same
  round.
- **polls**: a director tracking 1 and one tracking ``--poll`` pilots, for each interface; the
  status requests of the poll that a paused director makes next (nothing submitted) are counted
  independently of the backend (a wrapper around ``arcstat`` for cli, a count of the HTTP
  requests made for rest), and timed.
- **lag**: ``--lag`` pilots submitted over REST by a director, then a paused one that iterates
  every 2 s (status_interval none) until all are ``done``: the registry's ``done`` time against A-REX's own
  ``State: FINISHED`` line in its log (seconds after submission, median and max); and for every
  rate phase, the CE's own run rate: its pilots over the time from the phase's start to the
  last of them FINISHED in A-REX's log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
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
from gridgate.core.engine.director import Director
from gridgate.core.http import HttpClient
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


def _doc(
    ce: ArcCE, folder: Path, pilots: int, threads: int, *, paused: bool = False, **backend: Any
) -> dict[str, Any]:
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
            "paused": paused,  # a paused director polls and submits nothing
            # every pilot of a phase in one iteration: no waiting limit (default 20) trims it
            "pilots": {"status_interval": None, "max_waiting": 100000},
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


def _cpu() -> float:
    """CPU seconds of this process (every thread) and of the commands it has reaped."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class RequestCount:
    """Counts the HTTP requests the process makes, by method and URL (the REST path's, for the
    poll figures): a wrapper around gridgate.core.http.HttpClient.request, outside the
    backend, so that what the backend reports is checked against what it sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self._real = HttpClient.request
        counter = self

        def counted(client: HttpClient, method: str, url: str, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return counter._real(client, method, url, **kwargs)
            finally:
                counter.calls.append((method, url, time.monotonic() - started))

        HttpClient.request = counted  # type: ignore[method-assign, assignment]

    def since(self, mark: int) -> list[tuple[str, str, float]]:
        return self.calls[mark:]


def plain_loop(ce: ArcCE, folder: Path, pilots: int, threads: int) -> tuple[float, list[str]]:
    """``pilots`` arcsub calls, ``threads`` at a time, one job list per thread."""
    from gridgate.core.model import SubmitRequest
    from gridgate.core.plugins import PluginContext
    from gridgate.plugins.arc.backend import ArcBackend

    folder.mkdir(parents=True)
    section = {"interface": "cli", "endpoints": [ce.url], "script": str(folder.parent / "pilot.sh")}
    backend = ArcBackend(section, PluginContext(state_dir=folder))
    (ce_entry,) = backend._ces.values()
    description = folder / "pilot.xrsl"
    description.write_text(backend.description(ce_entry, SubmitRequest("arc")), encoding="utf-8")
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


def poller(ce: ArcCE, folder: Path, threads: int, **backend: Any) -> Director:
    """A paused director on ``folder``'s state (the same pilots): its iterations only poll."""
    return Director(validate_document(_doc(ce, folder, 1, threads, paused=True, **backend)))


def director_once(
    ce: ArcCE, folder: Path, pilots: int, threads: int, **backend: Any
) -> tuple[float, Director, Any]:
    """One iteration of a new director; its wall time, the director and the summary. The CPU
    it took (:func:`_cpu`, the iteration only) is ``director.bench_cpu``."""
    folder.mkdir(parents=True, exist_ok=True)
    director = Director(validate_document(_doc(ce, folder, pilots, threads, **backend)))
    cpu = _cpu()
    started = time.monotonic()
    summary = director.run_iteration()
    seconds = time.monotonic() - started
    director.bench_cpu = _cpu() - cpu  # type: ignore[attr-defined]
    return seconds, director, summary


#: The rate phases: name -> the backend section's extra keys (None: the plain arcsub loop).
PHASES: dict[str, dict[str, Any] | None] = {
    "loop": None,
    "cli": {"interface": "cli"},
    "rest1": {"interface": "rest"},
    "rest10": {"interface": "rest", "pilots_per_submission": 10},
}


def _submitted(summary: Any) -> list[str]:
    return [j for rec in summary.records if rec.outcome == "submitted" for j in rec.job_ids]


def _run_rate(ce: ArcCE, ids: list[str], started_wall: float) -> float | None:
    """The CE's own rate: ``ids`` over the time from ``started_wall`` to the last of them
    FINISHED in A-REX's log (seconds resolution)."""
    finished = _finished_times(ce)
    ends = [finished[i.rsplit("/", 1)[-1]] for i in ids if i.rsplit("/", 1)[-1] in finished]
    if len(ends) < len(ids) or not ends:
        return None
    return len(ids) / max(max(ends) - started_wall, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pilots", type=int, default=60)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--poll", type=int, default=200)
    parser.add_argument("--lag", type=int, default=8)
    args = parser.parse_args()
    logger.remove()  # the bench prints its figures; the director's own log only when it warns
    logger.add(sys.stderr, level="WARNING")
    requests = RequestCount()
    work = Path(tempfile.mkdtemp(prefix="bench-arc-", dir="/tmp"))
    work.chmod(0o755)
    (work / "pilot.sh").write_text(PILOT, encoding="utf-8")
    (work / "pilot.sh").chmod(0o755)
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": os.getloadavg()[0],
        "pilots": args.pilots,
        "threads": args.threads,
        "rounds": [],
    }
    with ArcCE(work / "ce") as ce:
        for r in range(args.rounds):
            row: dict[str, Any] = {}
            order = list(PHASES) if r % 2 == 0 else list(reversed(PHASES))
            for phase in order:
                cpu, wall = _cpu(), time.time()
                if PHASES[phase] is None:
                    seconds, ids = plain_loop(ce, work / f"loop{r}", args.pilots, args.threads)
                    used = _cpu() - cpu
                else:
                    seconds, director, summary = director_once(
                        ce, work / f"{phase}{r}", args.pilots, args.threads, **(PHASES[phase] or {})
                    )
                    ids = _submitted(summary)
                    used = director.bench_cpu  # type: ignore[attr-defined]
                    director.close()
                _wait_finished(ce, ids)
                row[phase] = {
                    "seconds": round(seconds, 2),
                    "submitted": len(ids),
                    "rate": round(len(ids) / seconds, 3),
                    "cpu_s_per_pilot": round(used / max(len(ids), 1), 4),
                    "ce_run_rate": _round(_run_rate(ce, ids, wall), 2),
                }
                print(json.dumps({"round": r, phase: row[phase]}), file=sys.stderr, flush=True)
            for phase in ("cli", "rest1", "rest10"):
                row[f"{phase}_over_loop"] = round(row[phase]["rate"] / row["loop"]["rate"], 2)
            row["load"] = round(os.getloadavg()[0], 1)
            result["rounds"].append(row)
        for phase in ("cli", "rest1", "rest10"):
            result[f"{phase}_over_loop_median"] = statistics.median(
                row[f"{phase}_over_loop"] for row in result["rounds"]
            )

        # lag: a REST director that submits --lag pilots, then iterates every 2 s until done
        _seconds, director, summary = director_once(
            ce, work / "lag", args.lag, args.threads, interface="rest"
        )
        submitted = {
            j: rec.time
            for rec in summary.records
            if rec.outcome == "submitted"
            for j in rec.job_ids
        }
        director.close()
        director = poller(ce, work / "lag", args.threads, interface="rest")
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
            "interface": "rest",
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

        # polls: 1 and --poll tracked pilots per interface, the status requests counted outside
        # the backend: a wrapper around arcstat (cli), the HTTP requests made (rest)
        result["polls"] = {}
        for interface in ("cli", "rest"):
            for count in (1, args.poll):
                folder = work / f"poll-{interface}-{count}"
                folder.mkdir()
                log = folder / "arcstat.log"
                wrapper = folder / "arcstat"
                wrapper.write_text(
                    WRAPPER.format(python=sys.executable, real=ARCSTAT, log=str(log)),
                    encoding="utf-8",
                )
                wrapper.chmod(0o755)
                _s, director, summary = director_once(
                    ce,
                    folder,
                    count,
                    args.threads,
                    interface=interface,
                    pilots_per_submission=min(10, count),
                    commands={"arcstat": str(wrapper)},
                )
                tracked = sum(rec.pilots for rec in summary.records if rec.outcome == "submitted")
                director.close()
                director = poller(
                    ce,
                    folder,
                    args.threads,
                    interface=interface,
                    commands={"arcstat": str(wrapper)},
                )
                mark = len(requests.calls)
                polled = director.run_iteration()
                director.close()
                polls = polled.pilots.polls if polled.pilots is not None else ()
                if interface == "cli":
                    calls = log.read_text().splitlines() if log.exists() else []
                    status = [(float(c.split()[1]), int(c.split()[2]) - 4) for c in calls]
                else:
                    made = requests.since(mark)
                    status = [
                        (round(sec, 3), 0) for method, url, sec in made if "action=status" in url
                    ]
                    others = sorted({url.rsplit("/", 1)[-1] for _m, url, _s in made})
                result["polls"][f"{interface}-{count}"] = {
                    "tracked": tracked,
                    "status_requests": len(status),
                    "poll_seconds": [s for s, _n in status],
                    "commands_reported": [p.commands for p in polls],
                    **({"ids_per_call": [n for _s, n in status]} if interface == "cli" else {}),
                    **({"requests": others} if interface == "rest" else {}),
                }
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


if __name__ == "__main__":
    main()
