"""Issue 41 on the real Slurm cluster: a `gridgate run` SIGKILLed at a seeded random moment while
parallel sbatch commands are in flight, restarted; a Redis without persistence killed and started
again empty under a running director. After recovery squeue (the scheduler's own view, read here
with the real client) holds no job of the fleet the registry does not know, the registry tracks
no live pilot squeue does not hold, the pending jobs never pass ``max_waiting``, no job id is in
two accounting rows, and the director never ends with a traceback.

The kit is tests/support/crashes.py; bench/bench_crashes.py runs the same with 10 seeds per fault
for docs/reliability.md's table (CI runs the seeds below).
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest
from support.crashes import Jobs, Run, record, restart_empty, seeds
from support.redis_server import RedisServer

#: The seeds CI runs (bench/bench_crashes.py runs 10).
SEEDS = seeds((41, 4101))
BASE = "gridgate-pilot"
WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "SUSPENDED"})


def squeue_jobs(cluster) -> Jobs:
    out = cluster.command(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%j|%T"])
    assert out.ok, out.stderr
    jobs = {}
    for line in out.stdout.splitlines():
        job, name, state = line.strip().split("|", 2)
        jobs[job] = (name, state)
    return jobs


def crash_doc(site, folder: Path, state: dict | None = None) -> dict:
    """One partition, pilots of 2 s (the node's 2 CPUs finish about one a second, so the
    director submits at most iterations), 4 waiting at most."""
    folder.mkdir(parents=True, exist_ok=True)
    script = site.cluster.jobs_dir / "crash-pilot.sh"  # where slurmd can read it
    script.write_text("#!/bin/sh\nsleep 2\n", encoding="utf-8")
    script.chmod(0o755)
    doc = site.doc(partitions=["debug"], pilots=6)
    doc["backends"]["slurm"]["script"] = str(script)
    doc["backends"]["slurm"]["sbatch_options"] = [f"--output={site.cluster.jobs_dir}/%j.out"]
    doc["director"].update(
        {
            "state_dir": str(folder / "state"),
            "cycle_seconds": 1,
            "max_threads": 4,
            "command_timeout": 30,
            "pilots": {"max_waiting": 4, "reconcile_for": 60},
        }
    )
    doc["state"] = state or {"driver": "sqlite", "path": str(folder / "state" / "state.db")}
    doc["notifiers"] = {"files": {"folder": str(folder / "notes")}}
    return doc


def crash_once(site, folder: Path, seed: int) -> dict:
    run = Run(
        folder,
        crash_doc(site, folder),
        lambda: squeue_jobs(site.cluster),
        base=BASE,
        waiting_states=WAITING,
        env=site.env,
    )
    run.start()
    killed_at = run.kill_during_submission(random.Random(seed))
    run.start()
    try:
        run.wait_iterations(3)
    finally:
        code = run.stop()
    verdict = run.verdict(killed_at)
    assert code == 0, run.log_text()[-3000:]
    return {"seed": seed, **verdict.row(), "why": verdict}


@pytest.mark.timeout(600)
def test_sigkill_during_parallel_sbatch_leaves_no_unknown_job(slurm_site, tmp_path) -> None:
    rows = []
    for seed in SEEDS:
        slurm_site.cluster.cancel_all()
        rows.append(crash_once(slurm_site, tmp_path / f"seed-{seed}", seed))
    record(
        "slurm sigkill during sbatch", [{k: v for k, v in r.items() if k != "why"} for r in rows]
    )
    for row in rows:
        assert row["why"].clean(), row


@pytest.mark.timeout(600)
def test_redis_back_empty_the_director_adopts_its_pilots_before_submitting(
    slurm_site, tmp_path
) -> None:
    """Redis without persistence, killed and started again empty on the same port under a
    running director: it notices (told once), finds its pilots in squeue by name and adopts
    them before it submits again, so max_waiting holds and nothing is unknown."""
    slurm_site.cluster.cancel_all()
    folder = tmp_path / "redis-empty"
    with RedisServer(tmp_path / "redis") as redis:
        state = {"driver": "redis", "url": redis.url, "socket_timeout": 2}
        doc = crash_doc(slurm_site, folder, state)
        doc["director"]["state_retry_seconds"] = 2
        run = Run(
            folder,
            doc,
            lambda: squeue_jobs(slurm_site.cluster),
            base=BASE,
            waiting_states=WAITING,
            env=slurm_site.env,
        )
        run.start()
        try:
            run.wait_iterations(4)
            restart_empty(redis)
            run.wait_iterations(4)
        finally:
            code = run.stop()
        verdict = run.verdict()
    notes = sorted((folder / "notes").rglob("*"))
    told = [
        p for p in notes if p.is_file() and "came back empty" in p.read_text("utf-8", "replace")
    ]
    record("slurm redis back empty", [verdict.row()])
    assert code == 0, run.log_text()[-3000:]
    assert verdict.clean(), verdict
    assert len(told) == 1, [p.name for p in notes]


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
        except OSError:
            pass  # ENOSPC: the file system is full, as wanted
    return filler


@pytest.mark.timeout(600)
def test_a_full_state_folder_stops_submission_and_loses_nothing(slurm_site, tmp_path) -> None:
    """The state folder on a 3 MiB tmpfs that fills up under a running director: it goes on
    (no traceback), submits nothing while no result can be recorded, says so through a
    notifier whose folder is elsewhere, and once space returns the registry and squeue agree."""
    slurm_site.cluster.cancel_all()
    folder = tmp_path / "full"
    doc = crash_doc(slurm_site, folder)
    doc["director"]["state_retry_seconds"] = 2
    state = folder / "state"
    state.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(state)], check=True
    )
    try:
        run = Run(
            folder,
            doc,
            lambda: squeue_jobs(slurm_site.cluster),
            base=BASE,
            waiting_states=WAITING,
            env=slurm_site.env,
        )
        run.start()
        filler = None
        try:
            run.wait_iterations(3)
            filler = _fill(state)
            time.sleep(2)  # the iteration in flight ends
            before = set(run.fleet_jobs())
            time.sleep(6)  # several iterations on the full disk
            during = set(run.fleet_jobs()) - before
            assert run.proc is not None and run.proc.poll() is None, run.log_text()[-3000:]
            filler.unlink()
            filler = None
            time.sleep(6)  # the store's retry (2 s), then iterations with space
        finally:
            if filler is not None:
                filler.unlink()
            code = run.stop()
        verdict = run.verdict()
        notes = [
            p.read_text("utf-8", "replace") for p in (folder / "notes").rglob("*") if p.is_file()
        ]
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)
    record("slurm state folder full", [{**verdict.row(), "sent while full": len(during)}])
    assert code == 0, run.log_text()[-3000:]
    assert during == set(), f"submitted while nothing could be recorded: {sorted(during)}"
    assert any("results cannot be recorded" in n for n in notes), notes
    assert verdict.clean(), verdict
