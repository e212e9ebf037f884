"""A fixed query limit against ``proxyd.adaptive``, on a real slurmctld, in one run
(docs/performance.md, "Limits that follow the scheduler"; issue 33's figure).

The gate bench's shape (bench_slurm.py, whose phases this reuses): a private Slurm cluster with
``--jobs`` pending (held) jobs (5,000: the queue of the gate bench's 1.65x); ``--loops`` squeue
loops as ``nobody`` and a light user (``daemon``) running one squeue a second, both taking
query tokens through the in-process client, for ``--seconds`` per phase. ``--mode niced`` (the
default) runs each squeue at the niceness its grant names, as the gate's shims do (the daemon
nices a busy user's commands); ``--mode client`` at full priority; ``--mode shims`` through
each daemon's own shims (``gridgate gate --install-shims``: a process per call, its start in
the light user's time).

Two real ``gridgate lsfproxyd serve`` daemons: ``fixed`` (``--fixed``, default
``QUERY[max=3 nominal=3 user_max=2]``, the gate bench's) and ``adaptive`` (``QUERY[max=M
nominal=M]`` with ``adaptive.query``: ``--source`` tokens or sdiag, min ``--min``, max
``--max``, interval ``--interval``, ``--reserve``, ``--grow-after``, ``--light-window``; sdiag's
``--max-server-threads`` and ``--rpc-types``). Its target is ``--target-over-idle`` times the
light user's idle median measured first on the cluster (what an operator does: time an idle
squeue, say what it may become), or ``--target-ms`` with ``--target-over-idle 0``. Each of
``--rounds`` rounds runs ``idle`` (the light user alone), fixed and adaptive, so load from
elsewhere hits all three alike; the figures are medians over the rounds. In ``--mode shims``
each round also runs the light user alone through a shim (``idle:shims``: the shim's own cost).
The shims are ``--shim-kind compiled`` (the default: no interpreter per call) or ``python``;
with ``python`` the adaptive daemon runs a second time through shims installed with
``proxyd.nice_caller`` (``adaptive+nice_caller``: a busy user's loop gets its grant's niceness,
so that its next shims start niced).

Figures: the light user's gated median over its idle median (goal <= 1.3), and the loops'
squeue calls/s, adaptive over fixed (goal >= 0.8); beside them slurmctld's own mean
REQUEST_JOB_INFO time and thread count, where the adaptive max ended each phase and its last
five decisions.

    .venv/bin/python bench/bench_adaptive.py [--loops 32] [--jobs 5000] [--seconds 20]
        [--rounds 3] [--mode niced|client|shims] [--shim-kind compiled|python]
        [--source tokens|sdiag] [--target-over-idle 1.2]
        [--target-ms 50] [--min 2] [--max 32] [--interval 1] [--reserve 1] [--grow-after 5]
        [--light-window 0]
        [--max-server-threads N] [--rpc-types A,B] [--fixed 'QUERY[...]'] [--json]
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

import yaml

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
    fixed: str,
    entry: dict[str, Any],
    target_over_idle: float | None = None,
    mode: str = "niced",
    shim_kind: str = "compiled",
) -> dict[str, Any]:
    """``entry``: the adaptive daemon's ``proxyd.adaptive.query``; with ``target_over_idle``
    its ``target_ms`` is that ratio over the light user's idle median, measured first on this
    cluster (what an operator does: time an idle squeue, say what it may become)."""
    from gridgate.plugins.lsf_proxy.gate.gate import install_shims
    from gridgate.plugins.slurm.cluster import SlurmCluster

    folder = Path(tempfile.mkdtemp(prefix="gg-bench-adaptive-", dir="/tmp"))
    folder.chmod(0o755)
    started = time.time()
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    entry = dict(entry)
    calibration: dict[str, Any] | None = None
    shims = folder / "no-shims"  # the idle phases run no shim
    try:
        with SlurmCluster(folder / "cluster", extra_conf=[f"MaxJobCount={jobs * 2 + 1000}"]) as c:
            _fill(c, jobs)
            # the first squeues after the fill are slow: a warm-up, measured by nothing (it
            # used to be the calibration, which then came out 10-20% over the idle rounds)
            _phase(c, "idle", loops, min(seconds, 10.0), "", shims)
            if target_over_idle is not None:
                calibration = _phase(c, "idle", loops, seconds, "", shims)
                entry["target_ms"] = round(target_over_idle * calibration["light_median_ms"], 1)
                print(json.dumps({"calibration": calibration}), file=sys.stderr, flush=True)
            common = {"token_wait_time": 600}
            (folder / "fixed").mkdir(mode=0o755)
            (folder / "adaptive").mkdir(mode=0o755)
            # each started inside the try: one that fails to start stops those started
            daemons: dict[str, _Daemon] = {}
            try:
                daemons["fixed"] = _Daemon(folder / "fixed", {**common, "policies": fixed})
                daemons["adaptive"] = _Daemon(
                    folder / "adaptive",
                    {
                        **common,
                        "policies": f"QUERY[max={entry['max']} nominal={entry['max']}]",
                        # how to run sdiag: read only for source sdiag (the config refuses
                        # options nothing reads)
                        **(
                            {
                                "bypass": {
                                    "scheduler_options": {
                                        "commands": {"sdiag": SDIAG},
                                        "env": c.env,
                                    }
                                }
                            }
                            if entry["source"] == "sdiag"
                            else {}
                        ),
                        "adaptive": {"query": entry},
                    },
                )
                shim_dirs = {}
                sides = list(daemons.items())
                for name, daemon in daemons.items():
                    Path(daemon.socket).chmod(0o666)
                    # mode shims: each daemon's own shims (the gate's: a process per call)
                    shim_dirs[name] = folder / f"shims-{name}"
                    install_shims(
                        shim_dirs[name], ["squeue"], socket_path=daemon.socket, kind=shim_kind
                    )
                if mode == "shims" and shim_kind == "python":
                    # the adaptive daemon again, through shims that nice a busy user's loop
                    # (proxyd.nice_caller): its next shims start niced
                    config = folder / "nice-caller.yaml"
                    section = {"socket": daemons["adaptive"].socket, "nice_caller": True}
                    config.write_text(yaml.safe_dump({"proxyd": section}))
                    config.chmod(0o644)
                    shim_dirs["adaptive+nice_caller"] = folder / "shims-nice-caller"
                    install_shims(
                        shim_dirs["adaptive+nice_caller"],
                        ["squeue"],
                        config=str(config),
                        kind="python",
                    )
                    sides.append(("adaptive+nice_caller", daemons["adaptive"]))
                for index in range(rounds):
                    # an idle phase in every round: load from elsewhere hits all three alike
                    idle = _phase(c, "idle", loops, seconds, daemons["fixed"].socket, shims)
                    rows.append({"daemon": "idle", "round": index, **idle})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                    if mode == "shims":  # the shim's own cost: the light user alone, gated
                        alone = _phase(c, "idle:shims", loops, seconds, "", shim_dirs["fixed"])
                        rows.append({"daemon": "idle-shims", "round": index, **alone})
                        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                    for name, daemon in sides:
                        row: dict[str, Any] = {"daemon": name, "round": index}
                        row.update(_phase(c, mode, loops, seconds, daemon.socket, shim_dirs[name]))
                        seen = _status(daemon.socket)
                        row["query_max_at_end"] = seen["categories"]["query"]["token_limit"]
                        if name.startswith("adaptive"):
                            state = seen["adaptive"]["query"]
                            row["user_max_at_end"] = state["user_max"]
                            row["adaptive_decisions"] = state["decisions"]
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
        "mode": mode,
        "shim_kind": shim_kind if mode == "shims" else None,
        "fixed": fixed,
        "adaptive": entry,
        "target_over_idle": target_over_idle,
        "calibration_idle_ms": calibration["light_median_ms"] if calibration else None,
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "rows": rows,
        "figures": {
            "light_gated_over_idle": {
                name: round(median(name, "light_median_ms") / idle_ms, 2)
                for name in ("fixed", "adaptive", "adaptive+nice_caller")
                if any(r["daemon"] == name for r in rows)
            },
            "light_gated_over_idle_goal": 1.3,
            # through the shims: the light user alone, gated, over its idle median (the floor
            # no limit can go under: the shim's own start)
            "light_alone_shims_over_idle": (
                round(median("idle-shims", "light_median_ms") / idle_ms, 2)
                if mode == "shims"
                else None
            ),
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
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fixed", default="QUERY[max=3 nominal=3 user_max=2]")
    parser.add_argument("--source", choices=("tokens", "sdiag"), default="tokens")
    parser.add_argument("--target-ms", type=float, default=50.0)
    parser.add_argument(
        "--target-over-idle",
        type=float,
        default=1.2,
        help="target_ms as this ratio over the idle squeue measured first (0: --target-ms)",
    )
    parser.add_argument("--min", type=int, default=2)
    parser.add_argument("--max", type=int, default=32)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--reserve", type=int, default=1)
    parser.add_argument("--grow-after", type=int, default=5)
    parser.add_argument(
        "--light-window",
        type=float,
        default=0.0,
        help="source tokens: adaptive.light_window in seconds (0: off, the default)",
    )
    parser.add_argument("--max-server-threads", type=int, default=None)
    parser.add_argument("--rpc-types", default="", help="comma-separated sdiag RPC types")
    parser.add_argument(
        "--mode",
        choices=("niced", "client", "shims"),
        default="niced",
        help="niced: squeue at the grant's nice, as the gate runs it; client: at full priority; "
        "shims: through the gate's shims, a process per call",
    )
    parser.add_argument(
        "--shim-kind",
        choices=("compiled", "python"),
        default="compiled",
        help="mode shims: the shims --install-shims writes (python: also the nice_caller side)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    entry: dict[str, Any] = {
        "source": args.source,
        "target_ms": args.target_ms,
        "min": args.min,
        "max": args.max,
        "interval": args.interval,
        "reserve": args.reserve,
        "grow_after": args.grow_after,
    }
    if args.light_window:
        entry["light_window"] = args.light_window
    if args.source == "sdiag":
        entry["max_server_threads"] = args.max_server_threads
        entry["rpc_types"] = [t for t in args.rpc_types.split(",") if t]
    result = bench(
        args.loops,
        args.jobs,
        args.seconds,
        args.rounds,
        args.fixed,
        entry,
        args.target_over_idle or None,
        args.mode,
        args.shim_kind,
    )
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
