"""The gate in front of a real Slurm: tight squeue loops against the private cluster, ungated
and gated, while a light user asks squeue once a second. Every figure comes from one run.

    .venv/bin/python bench/bench_slurm.py [--loops 32] [--jobs 200,5000] [--seconds 20]
        [--modes ungated,shims,shims:ungated,shims:client,client] [--query-max 3]
        [--user-max 2|none] [--busy-after 4|off] [--busy-nice 10]

For each queue size (pending, held jobs in the queue) and each mode, N loops (threads of one
process running as ``nobody``, each ``while true; do squeue; done`` as an argv loop) run for
``--seconds`` while the light user (uid ``daemon``) runs one ``squeue`` per second. Modes:

- ``ungated``: the real ``/usr/bin/squeue``;
- ``shims``: the shim ``gridgate gate --install-shims`` writes (a Python process per call
  taking a query token from a real ``gridgate lsfproxyd serve``), for loops and light user;
- ``client``: one long-lived in-process token client per process (``ProxyClient``): each
  call takes a query token, runs the real squeue, gives the token back.
- ``niced``: as ``client``, and squeue runs at the niceness the grant names (``Token.nice``:
  the daemon's ``busy_nice`` for a busy user), as the gate's shims run it.
- ``LOOPS:LIGHT``: the loops one way, the light user another. ``shims:ungated`` and
  ``shims:client`` split the light user's gated median into what the gated flood costs any
  squeue on the host, what waiting for a token adds, and what the shim's own start adds.

Measured per phase: the light user's squeue latency (median, max), the loops' squeue calls/s,
slurmctld's RPCs/s and mean REQUEST_JOB_INFO time (``sdiag``, reset at phase start), its CPU
(``/proc/<pid>/stat``) and server thread count (``sdiag``, sampled each second). An ``idle``
phase (light user alone) gives the baseline of each queue size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gate import _Daemon  # noqa: E402  (the same real token daemon the gate bench uses)

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
AS_LIGHT = ["setpriv", "--reuid=daemon", "--regid=daemon", "--clear-groups"]
SQUEUE = shutil.which("squeue", path="/usr/bin:/bin") or "/usr/bin/squeue"
NICE = shutil.which("nice", path="/usr/bin:/bin") or "/usr/bin/nice"
TICKS = os.sysconf("SC_CLK_TCK")

# Runs as nobody (the loops) or daemon (the light user). ``interval`` 0: as fast as possible.
_WORKER = r"""
import json, os, subprocess, sys, threading, time
sys.path.insert(0, {root!r})
threads, seconds, interval, mode, socket = {threads}, {seconds}, {interval}, {mode!r}, {socket!r}
argv = {argv!r}
env = dict(os.environ)
client = None
if mode in ("client", "niced"):
    from loguru import logger
    logger.remove()
    from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
    client = ProxyClient([Daemon("proxy", socket)], backoff=(0.01, 0.2))
calls, latencies, errors = [0] * threads, [[] for _ in range(threads)], [0] * threads
stop = time.monotonic() + seconds
def one():
    if client is None:
        return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env).returncode
    with client.acquire("query", "squeue") as token:
        run = argv
        if mode == "niced" and token.nice:  # the grant's nice, as the gate applies it
            run = [{nice!r}, "-n", str(token.nice), *argv]
        return subprocess.run(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env).returncode
def loop(i):
    while time.monotonic() < stop:
        started = time.monotonic()
        try:
            code = one()
        except Exception:
            code = -1
        ended = time.monotonic()
        if code != 0:
            errors[i] += 1
        elif ended <= stop + 30:
            calls[i] += 1
            latencies[i].append(ended - started)
        if interval:
            time.sleep(max(0.0, interval - (ended - started)))
ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps({{"calls": sum(calls), "errors": sum(errors),
                  "latencies": [x for l in latencies for x in l]}}))
"""


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class _CpuGroup:
    """A cpuacct cgroup (v1) holding one worker and everything it starts, the gate's token
    holders included (orphans stay in their cgroup): its CPU is the whole cost of its calls.
    None of it when the machine has no writable cpuacct hierarchy."""

    def __init__(self, name: str) -> None:
        self.path: Path | None = CPUACCT / f"gg-bench-{os.getpid()}-{name}"
        try:
            self.path.mkdir()
        except OSError:
            self.path = None

    def enter(self) -> None:
        """In the child, before exec (Popen's preexec_fn)."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self) -> float | None:
        if self.path is None:
            return None
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def close(self) -> None:
        if self.path is None:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the last token holders are still exiting
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _worker(
    as_user: list[str],
    threads: int,
    seconds: float,
    interval: float,
    mode: str,
    socket: str,
    argv: list[str],
    env: dict[str, str],
    group: _CpuGroup | None = None,
) -> subprocess.Popen[str]:
    code = _WORKER.format(
        root=str(ROOT),
        threads=threads,
        seconds=seconds,
        interval=interval,
        mode=mode,
        socket=socket,
        argv=argv,
        nice=NICE,
    )
    return subprocess.Popen(
        [*as_user, sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",
        preexec_fn=group.enter if group is not None else None,
    )


def _collect(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed: {err[-2000:]}")
    return json.loads(out)


def _sdiag(cluster: Any) -> str:
    result = cluster.command(["sdiag"], timeout=120)
    return result.stdout if result.ok else ""


def _sdiag_rpcs(text: str) -> dict[str, tuple[int, float]]:
    """message type -> (count, mean µs) from sdiag's 'by message type' section."""
    section = text.split("Remote Procedure Call statistics by message type", 1)[-1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    rpcs = {}
    for found in re.finditer(
        r"^\s*(\w+)\s*\(\s*\d+\)\s*count:(\d+)\s+ave_time:(\d+)", section, re.M
    ):
        rpcs[found.group(1)] = (int(found.group(2)), float(found.group(3)))
    return rpcs


def _server_threads(text: str) -> int | None:
    found = re.search(r"Server thread count:\s*(\d+)", text)
    return int(found.group(1)) if found else None


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _os_threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _fill(cluster: Any, total: int, workers: int = 16) -> None:
    """Bring the queue to ``total`` pending (held) jobs, each its own job record."""
    have = len(cluster.job_ids())
    missing = total - have
    if missing <= 0:
        return
    argv = [
        "sbatch",
        "--hold",
        "--parsable",
        "-p",
        cluster.partitions[-1],
        "-J",
        "filler",
        f"--output={cluster.jobs_dir}/filler.out",
        "--wrap",
        "true",
    ]

    def submit(_i: int) -> bool:
        return cluster.command(argv, timeout=120).ok

    with ThreadPoolExecutor(workers) as pool:
        done = sum(pool.map(submit, range(missing)))
    if done != missing:
        raise RuntimeError(f"only {done} of {missing} filler jobs were accepted")


def _phase(
    cluster: Any, mode: str, loops: int, seconds: float, socket: str, shims: Path
) -> dict[str, Any]:
    pid = cluster.controller_pid
    assert pid is not None
    env = {"PATH": "/usr/bin:/bin", "LANG": "C", **cluster.env}
    loops_mode, _, light_mode = mode.partition(":")
    loops_argv = [str(shims / "squeue")] if loops_mode == "shims" else [SQUEUE]
    light_mode = light_mode or ("ungated" if loops_mode == "idle" else loops_mode)
    light_argv = [str(shims / "squeue")] if light_mode == "shims" else [SQUEUE]
    cluster.command(["sdiag", "-r"], timeout=120)
    cpu0, wall0 = _cpu_seconds(pid), time.monotonic()
    samples: list[tuple[int | None, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            samples.append((_server_threads(_sdiag(cluster)), _os_threads(pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    light = _worker(AS_LIGHT, 1, seconds, 1.0, light_mode, socket, light_argv, env)
    group = _CpuGroup(mode.replace(":", "-")) if loops_mode != "idle" else None
    heavy = (
        _worker(AS_NOBODY, loops, seconds, 0.0, loops_mode, socket, loops_argv, env, group)
        if loops_mode != "idle"
        else None
    )
    lat = _collect(light, seconds + 600)
    load = _collect(heavy, seconds + 600) if heavy is not None else {"calls": 0, "errors": 0}
    wall, cpu = time.monotonic() - wall0, _cpu_seconds(pid) - cpu0
    loop_cpu = None
    if group is not None:
        time.sleep(1.0)  # the last token holders give their tokens back and exit
        used = group.seconds()
        group.close()
        if used is not None and load["calls"]:
            loop_cpu = round(used / load["calls"] * 1000, 1)
    stop.set()
    sampler.join(130)
    rpcs = _sdiag_rpcs(_sdiag(cluster))
    total_rpcs = sum(c for c, _ in rpcs.values())
    job_info = rpcs.get("REQUEST_JOB_INFO", (0, 0.0))
    server = [s for s, _ in samples if s is not None]
    latencies = sorted(lat["latencies"])
    return {
        "mode": mode,
        "loops": 0 if loops_mode == "idle" else loops,
        "seconds": round(wall, 1),
        "light_calls": len(latencies),
        "light_errors": lat["errors"],
        "light_median_ms": round(statistics.median(latencies) * 1000) if latencies else None,
        "light_max_ms": round(latencies[-1] * 1000) if latencies else None,
        "loop_calls_per_s": round(load["calls"] / seconds, 1),
        "loop_errors": load["errors"],
        # every process of the loops (driver, squeue, shims, token holders) per call
        "loop_cpu_ms_per_call": loop_cpu,
        "rpcs_per_s": round(total_rpcs / wall, 1),
        "job_info_calls": job_info[0],
        "job_info_mean_ms": round(job_info[1] / 1000, 1),
        "ctld_cpu": round(cpu / wall, 2),
        "server_threads_mean": round(statistics.mean(server), 1) if server else None,
        "server_threads_max": max(server) if server else None,
        "os_threads_max": max((t for _, t in samples), default=None),
    }


def bench(
    loops: int,
    jobs: list[int],
    seconds: float,
    modes: list[str],
    query_max: int = 3,
    user_max: int | None = 2,
    busy_after: int | None = 4,
    busy_nice: int = 10,
) -> dict[str, Any]:
    from gridgate.plugins.lsf_proxy.gate.gate import install_shims
    from gridgate.plugins.slurm.cluster import SlurmCluster

    folder = Path(tempfile.mkdtemp(prefix="gg-bench-slurm-", dir="/tmp"))
    folder.chmod(0o755)
    rows: list[dict[str, Any]] = []
    started = time.time()
    load_before = os.getloadavg()[0]
    try:
        # MaxJobCount above the largest queue (cancelled fillers stay MinJobAge seconds)
        with SlurmCluster(
            folder / "cluster", extra_conf=[f"MaxJobCount={max(jobs) * 2 + 10000}"]
        ) as cluster:
            cap = f" user_max={user_max}" if user_max else ""
            policy = f"QUERY[max={query_max} nominal={query_max}{cap}]"
            daemon = _Daemon(
                folder,
                {
                    "policies": policy,
                    "token_wait_time": 600,
                    "busy_after": busy_after,
                    "busy_nice": busy_nice,
                },
            )
            try:
                shims = folder / "shims"
                install_shims(shims, ["squeue"], socket_path=daemon.socket)
                for total in sorted(jobs):
                    t0 = time.monotonic()
                    _fill(cluster, total)
                    filled = round(time.monotonic() - t0, 1)
                    for mode in ["idle", *modes]:
                        row = _phase(cluster, mode, loops, seconds, daemon.socket, shims)
                        rows.append({"pending_jobs": total, "fill_s": filled, **row})
                        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            finally:
                daemon.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "loops": loops,
        "jobs": jobs,
        "seconds_per_phase": seconds,
        "query_max": query_max,
        "user_max": user_max,
        "busy_after": busy_after,
        "busy_nice": busy_nice,
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "rows": rows,
        "goals": _goals(rows),
    }


def _goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per queue size: the light user's gated (shims) median against its idle median (goal
    <= 2x) and against the ungated flood's (goal <= 0.25x); the loops' CPU per call."""
    out: dict[str, Any] = {}
    for total in sorted({r["pending_jobs"] for r in rows}):
        by_mode = {r["mode"]: r for r in rows if r["pending_jobs"] == total}
        if not {"idle", "ungated", "shims"} <= set(by_mode):
            continue
        idle, flood, gated = (by_mode[m]["light_median_ms"] for m in ("idle", "ungated", "shims"))
        if not (idle and flood and gated):
            continue
        out[str(total)] = {
            "gated_vs_idle": round(gated / idle, 2),
            "gated_vs_idle_goal": 2.0,
            "gated_vs_flood": round(gated / flood, 3),
            "gated_vs_flood_goal": 0.25,
            "loop_cpu_ms_per_call": {
                m: by_mode[m].get("loop_cpu_ms_per_call")
                for m in ("ungated", "shims", "client")
                if m in by_mode
            },
            # the light user's median with the loops gated (shims), split: an ungated squeue
            # (the flood's CPU and controller load), through the in-process client (+ the wait
            # for a token), through a shim (+ the shim's own start)
            "light_median_ms": {
                "idle": idle,
                **{
                    m: by_mode[m]["light_median_ms"]
                    for m in ("shims:ungated", "shims:client", "shims")
                    if m in by_mode
                },
            },
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loops", type=int, default=32, help="squeue loops (default 32)")
    parser.add_argument(
        "--jobs",
        default="200,5000",
        help="pending jobs in the queue, comma-separated (default 200,5000)",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase (default 20)")
    parser.add_argument(
        "--modes",
        default="ungated,shims,shims:ungated,shims:client,client",
        help="comma-separated: ungated, shims, client; LOOPS:LIGHT runs the "
        "loops one way and the light user another (shims:ungated: the "
        "gated flood's cost to an ungated squeue)",
    )
    # the policy docs/performance.md recommends for this host: one user's loops get as many
    # squeues at once as the host has cores (2), and a third token stays for everyone else
    parser.add_argument(
        "--query-max",
        type=int,
        default=3,
        help="the daemon's QUERY max and nominal tokens (default 3)",
    )
    parser.add_argument(
        "--user-max",
        type=lambda v: None if v == "none" else int(v),
        default=2,
        help="the QUERY user_max: most tokens one user may hold ('none': no cap; default 2)",
    )
    parser.add_argument(
        "--busy-after",
        type=lambda v: None if v == "off" else int(v),
        default=4,
        help="the daemon's busy_after ('off': never; default 4, the daemon's)",
    )
    parser.add_argument(
        "--busy-nice",
        type=int,
        default=10,
        help="the daemon's busy_nice (default 10, the daemon's)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: it starts slurmctld and runs clients as other uids")
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    modes = [m for m in args.modes.split(",") if m]
    unknown = {part for m in modes for part in m.split(":", 1)} - {"ungated", "shims", "client"}
    if unknown:
        parser.error(f"unknown modes: {sorted(unknown)}")
    result = bench(
        args.loops,
        [int(j) for j in args.jobs.split(",") if j],
        args.seconds,
        modes,
        args.query_max,
        args.user_max,
        args.busy_after,
        args.busy_nice,
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
