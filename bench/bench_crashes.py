"""Issue 41's crash-consistency table: the crash tests of each real backend, 10 seeded runs per
fault instead of the suite's few, their rows kept for docs/reliability.md.

    .venv/bin/python bench/bench_crashes.py [--runs 10] [--tests tests/plugins/slurm/test_crash_slurm.py ...]

Each run is a test of tests/support/crashes.py's kit against the real Slurm cluster, Grid Engine
cell or A-REX the suite starts (a SIGKILL of `gridgate run` at a seeded moment while it submits,
a Redis without persistence killed and started empty, the CE stopped mid-bulk, the state folder
on a full tmpfs); the rows (unknown jobs, phantom pilots, jobs over max_waiting, duplicate
accounting rows, crash) go to bench/results/crashes-<UTC date>.jsonl, and a summary per fault is
printed. Not a speed figure: counts, which must all be 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = [
    "tests/plugins/slurm/test_crash_slurm.py",
    "tests/plugins/sge/test_crash_sge.py",
    "tests/plugins/arc/rest/test_crash_arc.py",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tests", nargs="*", default=TESTS)
    args = parser.parse_args()
    out = ROOT / "bench" / "results" / f"crashes-{time.strftime('%Y-%m-%d', time.gmtime())}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("", encoding="utf-8")
    env = {**os.environ, "GRIDGATE_CRASH_RUNS": str(args.runs)}
    env["GRIDGATE_RELIABILITY_FIGURES"] = str(out)
    tests = [t for t in args.tests if (ROOT / t).exists()]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            *tests,
        ],
        cwd=ROOT,
        env=env,
        check=False,
    )
    for line in out.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        runs = row.get("runs", [])
        totals = {
            k: sum(int(r.get(k) or 0) for r in runs)
            for k in ("unknown", "phantom", "over", "duplicate_rows", "crash")
        }
        print(f"{row['test']}: {len(runs)} run(s): {totals}")
    print(f"rows in {out.relative_to(ROOT)}")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
