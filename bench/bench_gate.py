"""Admission-in-use figures for docs/performance.md: the director's throughput with ``mode:
local`` admission against none, in the same run; and a swarm of polling loops against the
stand-in master daemon (slower as requests pile up), with and without tokens, as a curve.

    .venv/bin/python bench/bench_gate.py [all|director|swarm|overhead] [--json]

The swarm runs as ``nobody`` (root is privileged and never waits for a token): one process of
N threads, each looping "take a query token from the real daemon, send one request to the
master, give the token back" (gated) or just "send one request" (ungated) for a fixed time.
That is the token protocol ``gridgate gate`` speaks, without the cost of starting a process
per call; ``overhead`` measures that cost separately.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
HOSTS = [f"wms{i:02d}.example.org" for i in range(1, 12)]


# --- the director with and without admission ---------------------------------------------------


def _director_doc(
    folder: Path, admission: dict[str, Any] | None, pilots: int, threads: int
) -> dict[str, Any]:
    from gridgate.plugins.wms_glite.sim import install_commands, write_scenario

    bin_dir = install_commands(folder / "bin")
    (folder / "sim").mkdir(exist_ok=True)
    scenario = write_scenario(
        folder / "scenario.json",
        {
            "state_dir": str(folder / "sim"),
            "calls_log": str(folder / "calls.jsonl"),
            "default": {"behaviour": "healthy", "latency": 0.05},
        },
    )
    doc: dict[str, Any] = {
        "director": {
            "cycle_seconds": 0.001,
            "max_threads": threads,
            "command_timeout": 30,
            "state_dir": str(folder / "state"),
        },
        "state": {"driver": "sqlite", "path": str(folder / "state" / "state.db")},
        "backends": {
            "wms_glite": {
                "servers": HOSTS,
                "commands": {
                    "submit": str(bin_dir / "glite-wms-job-submit"),
                    "list_match": str(bin_dir / "glite-wms-job-list-match"),
                },
                "list_match": False,
                "env": {"GRIDGATE_SIM_SCENARIO": str(scenario)},
            }
        },
        "demand": {"static": {"wms_glite": pilots}},
        "notifiers": {"files": {"folder": str(folder / "notes")}},
    }
    if admission is not None:
        doc["admission"] = {"lsf_proxy": admission}
    return doc


def _director_once(admission: dict[str, Any] | None, pilots: int, threads: int) -> dict[str, Any]:
    from gridgate.core.config import validate_document
    from gridgate.core.engine.director import Director
    from gridgate.plugins.wms_glite.sim import max_concurrency, read_calls

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        director = Director(validate_document(_director_doc(folder, admission, pilots, threads)))
        started = time.monotonic()
        try:
            summary = director.run_iteration()
            plugin = director.pm.get_plugin("admission:lsf_proxy")
            stats = plugin.stats() if plugin is not None else {}
        finally:
            director.close()
        elapsed = time.monotonic() - started
        calls = read_calls(folder / "calls.jsonl")
    submitted = sum(r.pilots for r in summary.records if r.outcome == "submitted")
    peak = max(max_concurrency([c for c in calls if c.host == h]) for h in HOSTS)
    return {
        "rate": submitted / elapsed,
        "submitted": submitted,
        "refused": sum(1 for r in summary.records if r.outcome == "refused"),
        "waited": sum(s.waited for s in stats.values()),
        "peak_per_server": peak,
    }


def bench_director(pilots: int = 400, threads: int = 16, rounds: int = 2) -> dict[str, Any]:
    """Alternate runs without and with ``mode: local`` (max 2 per server) to cancel drift."""
    local = {"mode": "local", "max": 2}
    runs: dict[str, list[dict[str, Any]]] = {"none": [], "local": []}
    for _ in range(rounds):
        runs["none"].append(_director_once(None, pilots, threads))
        runs["local"].append(_director_once(local, pilots, threads))

    def mean(name: str, key: str) -> float:
        return sum(r[key] for r in runs[name]) / len(runs[name])

    return {
        "pilots": pilots,
        "threads": threads,
        "servers": len(HOSTS),
        "rounds": rounds,
        "admission": local,
        "none_per_s": round(mean("none", "rate"), 1),
        "local_per_s": round(mean("local", "rate"), 1),
        "ratio": round(mean("local", "rate") / mean("none", "rate"), 3),
        "peak_per_server_none": max(r["peak_per_server"] for r in runs["none"]),
        "peak_per_server_local": max(r["peak_per_server"] for r in runs["local"]),
        "local_grants_that_waited": round(mean("local", "waited")),
        "local_refused": sum(r["refused"] for r in runs["local"]),
    }


# --- the swarm against the master -------------------------------------------------------------


class _Daemon:
    def __init__(self, folder: Path, section: dict[str, Any]) -> None:
        config = folder / "proxyd.yaml"
        section = {"socket": str(folder / "proxyd.sock"), **section}
        config.write_text(yaml.safe_dump({"proxyd": section}), encoding="utf-8")
        config.chmod(0o644)
        self.proc = subprocess.Popen(
            [str(BIN / "gridgate"), "lsfproxyd", "serve", "-c", str(config), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the token daemon did not start")
        self.socket = json.loads(line)["socket"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)
        self.proc.stdout.close()  # type: ignore[union-attr]


_WORKER = r"""
import json, sys, threading, time
sys.path.insert(0, {root!r})
from gridgate.plugins.lsf_proxy.sim.cli import call
loops, seconds, master, socket = {loops}, {seconds}, {master!r}, {socket!r}
client = None
if socket:
    from loguru import logger
    logger.remove()
    from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
    client = ProxyClient([Daemon("proxy", socket)], backoff=(0.01, 0.2))
done, latencies, errors = [0] * loops, [[] for _ in range(loops)], [0] * loops
stop = time.monotonic() + seconds
def loop(i):
    while time.monotonic() < stop:
        started = time.monotonic()
        try:
            if client is None:
                call(master, {{"op": "request", "command": "bjobs"}})
            else:
                with client.acquire("query", "bjobs"):
                    call(master, {{"op": "request", "command": "bjobs"}})
        except Exception:
            errors[i] += 1
            continue
        if time.monotonic() <= stop:
            done[i] += 1
            latencies[i].append(time.monotonic() - started)
threads = [threading.Thread(target=loop, args=(i,)) for i in range(loops)]
for t in threads: t.start()
for t in threads: t.join()
flat = sorted(x for l in latencies for x in l)
p99 = flat[max(0, int(len(flat) * 0.99 + 0.999) - 1)] if flat else 0.0
print(json.dumps({{"completed": sum(done), "errors": sum(errors), "client_p99": p99,
                  "min_per_loop": min(done)}}))
"""


def _swarm_once(
    folder: Path, master: Any, daemon: _Daemon | None, loops: int, seconds: float
) -> dict[str, Any]:
    master.reset()
    code = _WORKER.format(
        root=str(ROOT),
        loops=loops,
        seconds=seconds,
        master=master.socket,
        socket=daemon.socket if daemon else "",
    )
    proc = subprocess.run(
        AS_NOBODY + [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        cwd="/",
    )
    if proc.returncode != 0:
        raise RuntimeError(f"swarm worker failed: {proc.stderr[-2000:]}")
    client = json.loads(proc.stdout)
    stats = master.stats()
    return {
        "loops": loops,
        "completed": client["completed"],
        "per_s": round(client["completed"] / seconds, 1),
        "master_p50_ms": round(stats["p50"] * 1000, 1),
        "master_p99_ms": round(stats["p99"] * 1000, 1),
        "master_max_in_flight": stats["max_in_flight"],
        "client_p99_ms": round(client["client_p99"] * 1000, 1),
        "slowest_loop_completed": client["min_per_loop"],
        "errors": client["errors"],
    }


def bench_swarm(
    loops: tuple[int, ...] = (8, 25, 50, 100),
    seconds: float = 8.0,
    base: float = 0.02,
    knee: float = 8.0,
    max_tokens: int = 8,
) -> dict[str, Any]:
    from gridgate.plugins.lsf_proxy.sim import start_master

    folder = Path(tempfile.mkdtemp(prefix="gg-bench-gate-", dir="/tmp"))
    folder.chmod(0o755)
    rows = []
    try:
        master = start_master(folder / "master.sock", base=base, knee=knee)
        daemon = _Daemon(
            folder,
            {"policies": f"QUERY[max={max_tokens} nominal={max_tokens}]", "token_wait_time": 60},
        )
        try:
            for n in loops:
                rows.append({"gate": False, **_swarm_once(folder, master, None, n, seconds)})
                rows.append({"gate": True, **_swarm_once(folder, master, daemon, n, seconds)})
        finally:
            daemon.stop()
            master.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "seconds_per_run": seconds,
        "master_base_ms": base * 1000,
        "master_knee": knee,
        "query_max": max_tokens,
        "rows": rows,
    }


# --- what a gated process costs --------------------------------------------------------------

#: The shim as ``--install-shims`` wrote it before issue 46 (gridgate's run-time modules
#: imported at every call, settings given to ``gating.shim_main``): the "before" side of the
#: same run.
_SHIM_BEFORE = """#!{python} -IS
import sys

gridgate = sys.modules["gridgate"] = type(sys)("gridgate")
gridgate.__path__ = {roots!r}
from gridgate.plugins.lsf_proxy.gate.gating import shim_main

sys.exit(shim_main({name!r}, {real!r}, {shim_dir!r}, config=None, socket={socket!r},
                   snap={snap!r}))
"""

#: The goals, as ratios measured in the same run (docs/performance.md).
GOALS = {"shim_vs_bare_python": 1.3, "gate_vs_venv_python": 1.5}


def _become_subreaper() -> None:
    """Orphans below us (the gate's token holder) are re-parented to this process, so that
    their CPU is counted in RUSAGE_CHILDREN once reaped."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _reap_one(timeout: float = 5.0) -> None:
    """Wait for one orphan (a token holder) to exit; the daemon, our child too, never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            return
        time.sleep(0.0005)
    raise RuntimeError("the token holder did not exit")


def bench_overhead(calls: int = 100) -> dict[str, Any]:
    """Per-call wall time and CPU of each way to run ``true``, interleaved call by call (so
    that load from elsewhere hits every side alike); medians, and the goals' ratios.

    CPU is what the call's processes used (user + system), the gate's token holder included:
    it outlives the command by a moment and is reaped outside the timed window."""
    import resource
    import statistics

    _become_subreaper()

    load_before = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="gg-bench-gate-", dir="/tmp"))
    try:
        daemon = _Daemon(folder, {})
        true = shutil.which("true") or "/bin/true"
        try:
            from gridgate.plugins.lsf_proxy.gate.gate import install_shims
            from gridgate.plugins.lsf_proxy.gate.gating import snapshot

            install_shims(folder / "shims", ["true"], socket_path=daemon.socket, kind="python")
            install_shims(folder / "compiled", ["true"], socket_path=daemon.socket, kind="compiled")
            old_shim = folder / "before" / "true"
            old_shim.parent.mkdir()
            old_shim.write_text(
                _SHIM_BEFORE.format(
                    python=sys.executable,
                    roots=[str(ROOT)],
                    name="true",
                    real=true,
                    shim_dir=str(old_shim.parent),
                    socket=daemon.socket,
                    snap=snapshot("true", None),
                )
            )
            old_shim.chmod(0o755)
            sides = {
                "true": [true],
                "bare_python": ["/usr/bin/python3", "-I", "-S", "-c", "pass"],
                "venv_python": [sys.executable, "-c", "pass"],
                "gate": [str(BIN / "gridgate"), "gate", "--socket", daemon.socket, "--", true],
                "shim": [str(folder / "shims" / "true")],  # what a user's gated `bjobs` runs
                "shim_before": [str(old_shim)],  # the shim before issue 46
                "compiled_shim": [str(folder / "compiled" / "true")],  # --shim-kind compiled
            }
            gated = ("gate", "shim", "shim_before", "compiled_shim")
            wall: dict[str, list[float]] = {k: [] for k in sides}
            cpu: dict[str, float] = dict.fromkeys(sides, 0.0)
            for name, argv in sides.items():  # warm the page cache, the per-user config cache
                subprocess.run(argv, check=True, timeout=60)
                if name in gated:
                    _reap_one()
            for _ in range(calls):
                for name, argv in sides.items():
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    started = time.perf_counter()
                    # no timeout: with one, Popen.wait polls with sleeps of 0.5, 1, 2, 4...
                    # ms, and every figure came out as their sum (7.5, 15.5, 31.5 ms)
                    subprocess.run(argv, check=True)
                    wall[name].append(time.perf_counter() - started)
                    if name in gated:
                        _reap_one()
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu[name] += after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    median = {k: statistics.median(v) for k, v in wall.items()}
    ratios = {
        "shim_vs_bare_python": median["shim"] / median["bare_python"],
        "shim_before_vs_bare_python": median["shim_before"] / median["bare_python"],
        "gate_vs_venv_python": median["gate"] / median["venv_python"],
        "shim_vs_true": median["shim"] / median["true"],
        "compiled_shim_vs_bare_python": median["compiled_shim"] / median["bare_python"],
        "compiled_shim_vs_true": median["compiled_shim"] / median["true"],
        "gate_vs_true": median["gate"] / median["true"],
    }
    return {
        "calls_each": calls,
        "median_ms": {k: round(v * 1000, 2) for k, v in median.items()},
        "cpu_ms_per_call": {k: round(v / calls * 1000, 2) for k, v in cpu.items()},
        "ratios": {k: round(v, 2) for k, v in ratios.items()},
        "goals": {k: {"max": g, "met": ratios[k] <= g} for k, g in GOALS.items()},
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "which", nargs="?", default="all", choices=["all", "director", "swarm", "overhead"]
    )
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    parser.add_argument(
        "--calls", type=int, default=100, help="overhead: calls of each kind (default 100)"
    )
    args = parser.parse_args()
    from loguru import logger

    logger.remove()  # the bench is an entry point: warnings only, the figures go to stdout
    logger.add(sys.stderr, level="WARNING")
    results: dict[str, Any] = {}
    if args.which in ("all", "director"):
        results["director"] = bench_director()
    if args.which in ("all", "swarm"):
        results["swarm"] = bench_swarm()
    if args.which in ("all", "overhead"):
        results["overhead"] = bench_overhead(args.calls)
    results.update(
        {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
    )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
