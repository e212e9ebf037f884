"""Status polls of 1 vs 5,000 pilots on one server, through the real backends' hooks and the
stand-in commands (real processes), for docs/performance.md.

Per backend (``wms_glite``: ``glite-wms-job-status --noint -v 1 -i FILE``; ``lsf``:
``bjobs -a -noheader -o ...``) and per size: the stand-in's bookkeeping is seeded with N
finished pilots, then ``gridgate_job_status`` is called ``--rounds`` times. Reported: the
commands run per poll (counted from the stand-in's call log, not from the backend's own
answer), the output size, the median wall time of a poll, and the share of it spent parsing
(``status_result`` / ``parse_status_rows`` on the captured output, timed apart); the ratio
5,000 / 1 of the median poll is measured in the same run.

    .venv/bin/python bench/bench_status_polls.py [--sizes 1 5000] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gridgate.core.model import Endpoint
from gridgate.core.plugins import PluginContext
from gridgate.core.testing import section_for

T0 = 1_800_000_000.0
HOST = "wms01.example.org"


def glite(folder: Path, size: int, rounds: int) -> dict[str, Any]:
    from gridgate.plugins.wms_glite.backend import GliteBackend
    from gridgate.plugins.wms_glite.sim import install_commands, read_calls, write_scenario
    from gridgate.plugins.wms_glite.sim.jobs import JobTable, set_clock
    from gridgate.plugins.wms_glite.status import status_result

    bin_dir = install_commands(folder / "bin")
    clock = folder / "clock"
    set_clock(clock, T0 + 100)
    calls = folder / "calls.jsonl"
    scenario = write_scenario(
        folder / "scenario.json",
        {
            "state_dir": str(folder / "state"),
            "calls_log": str(calls),
            "clock_file": str(clock),
            "hosts": {HOST: {"pilots": {"outcome": "done"}}},
        },
    )
    endpoint = Endpoint("wms_glite", HOST, f"https://{HOST}:7443/glite_wms_wmproxy_server")
    table = JobTable(folder / "state")
    ids = [f"https://lb01.example.org:9000/Bench{n:017d}" for n in range(size)]
    for job_id in ids:
        table.add(endpoint.url, job_id, [], T0)
    backend = GliteBackend(
        section_for(
            GliteBackend,
            {
                "servers": [HOST],
                "commands": {"submit": str(bin_dir / "glite-wms-job-submit")},
                "env": {"GRIDGATE_SIM_SCENARIO": str(scenario)},
                "work_dir": str(folder),
            },
        ),
        PluginContext(),
    )
    row = _polls(
        backend, endpoint, ids, rounds, lambda result: status_result(endpoint, ids, result.command)
    )
    commands = [c for c in read_calls(calls) if c.command == "glite-wms-job-status"]
    return {
        "backend": "wms_glite",
        "pilots": size,
        "commands_per_poll": len(commands) / rounds,
        "ids_per_command": sorted({c.ids for c in commands}),
        **row,
    }


def lsf(folder: Path, size: int, rounds: int) -> dict[str, Any]:
    from gridgate.plugins.lsf_proxy.director.backend import LsfBackend
    from gridgate.plugins.lsf_proxy.director.tracking import parse_status_rows
    from gridgate.plugins.lsf_proxy.sim import install_commands, write_scenario

    bin_dir = install_commands(folder / "bin")
    (folder / "clock").write_text(repr(T0 + 100))
    calls = folder / "calls.jsonl"
    scenario = write_scenario(
        folder / "scenario.json",
        {
            "state_dir": str(folder / "lsf"),
            "calls_log": str(calls),
            "clock_file": str(folder / "clock"),
            "queues": {"normal": {"pilots": {"pend": 2, "run": 10, "outcome": "done"}}},
        },
    )
    (folder / "lsf").mkdir()
    with open(folder / "lsf" / "jobs.jsonl", "w", encoding="utf-8") as handle:
        for n in range(size):
            handle.write(
                json.dumps(
                    {
                        "id": 100000 + n,
                        "user": "pilot",
                        "queue": "normal",
                        "name": "p",
                        "stat": "PEND",
                        "submitted": T0,
                        "host": "h",
                        "command": ["p"],
                    }
                )
                + "\n"
            )
    ids = [str(100000 + n) for n in range(size)]
    backend = LsfBackend(
        section_for(
            LsfBackend,
            {
                "queues": ["normal"],
                "tokens": False,
                "commands": {"bsub": str(bin_dir / "bsub"), "bjobs": str(bin_dir / "bjobs")},
                "env": {"GRIDGATE_LSF_SCENARIO": str(scenario)},
            },
        ),
        PluginContext(),
    )
    endpoint = Endpoint("lsf", "normal")
    row = _polls(
        backend, endpoint, ids, rounds, lambda result: parse_status_rows(result.command.stdout)
    )
    commands = [
        e for e in map(json.loads, calls.read_text().splitlines()) if e["command"] == "bjobs"
    ]
    return {
        "backend": "lsf",
        "pilots": size,
        "commands_per_poll": len(commands) / rounds,
        "ids_per_command": sorted({c["ids"] for c in commands}),
        **row,
    }


def _polls(
    backend: Any, endpoint: Any, ids: list[str], rounds: int, parse_again: Any
) -> dict[str, Any]:
    """Time ``rounds`` bulk polls of ``ids`` and, apart, the parse of each answer."""
    times, parse, result = [], [], None
    for _ in range(rounds):
        start = time.perf_counter()
        result = backend.gridgate_job_status(endpoint=endpoint, job_ids=ids, timeout=120)
        times.append(time.perf_counter() - start)
        assert result is not None and result.ok and len(result.statuses) == len(ids), result
        start = time.perf_counter()
        parse_again(result)
        parse.append(time.perf_counter() - start)
    return {
        "stdout_bytes": len(result.command.stdout.encode()),  # type: ignore[union-attr]
        "poll_s": statistics.median(times),
        "parse_s": statistics.median(parse),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 5000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for run in (glite, lsf):
        for size in args.sizes:
            with tempfile.TemporaryDirectory(prefix="gridgate-bench-status-") as folder:
                rows.append(run(Path(folder), size, args.rounds))
    for backend in ("wms_glite", "lsf"):
        mine = [r for r in rows if r["backend"] == backend]
        if len(mine) >= 2:
            mine[-1]["ratio_poll_vs_smallest"] = mine[-1]["poll_s"] / mine[0]["poll_s"]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        ratio = (
            f"  ratio {r['ratio_poll_vs_smallest']:.1f}" if "ratio_poll_vs_smallest" in r else ""
        )
        print(
            f"{r['backend']:<10}{r['pilots']:>6} pilots: {r['commands_per_poll']:.0f} command(s)/poll, "
            f"{r['stdout_bytes']:>9} B out, poll {r['poll_s'] * 1000:8.1f} ms "
            f"(parse {r['parse_s'] * 1000:6.1f} ms){ratio}"
        )


if __name__ == "__main__":
    main()
