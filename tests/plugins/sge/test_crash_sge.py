"""Issue 41 on the real Grid Engine cell: `gridgate run` (as the cell's submit user) SIGKILLed at
a seeded random moment while its qsub commands are in flight, restarted. After recovery qstat
(read here with the cell's own client, every state: ``-s a``) holds no job of the fleet the
registry does not know, the registry tracks no live pilot qstat does not hold, the waiting jobs
never pass ``max_waiting``, no job id is in two accounting rows, no traceback.

The pilots sleep for the whole test (a job that ends leaves qstat at once, and its pilot is
tracked until the next poll): the director submits at its start only, so the moment is drawn in
the first submissions, 0-400 ms after the first intent is on disk.
"""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET

import pytest
from support.crashes import Jobs, Run, record, seeds
from support.sge_site import SgeSite

SEEDS = seeds((41, 4101))
BASE = "gridgate-pilot"
#: qstat's states of a job that waits for a slot (``t``, transferring, has one: dispatched to
#: the execd, it is running for the director too)
WAITING = frozenset({"qw", "hqw", "Eqw"})


def qstat_jobs(cell) -> Jobs:
    out = cell.run(["qstat", "-u", "*", "-s", "a", "-xml"], as_user=False)
    assert out.ok, out.stderr
    jobs = {}
    for job in ET.fromstring(out.stdout).iter("job_list"):
        number = job.findtext("JB_job_number", "")
        tasks = job.findtext("tasks", "")
        ident = f"{number}.{tasks}" if tasks and tasks.isdigit() else number
        jobs[ident] = (job.findtext("JB_name", ""), job.findtext("state", ""))
    return jobs


def crash_once(cell, seed: int) -> dict:
    site = SgeSite(cell, f"crash-{seed}")
    doc = site.doc(pilots=6)
    doc["director"].update(
        {
            "cycle_seconds": 1,
            "max_threads": 4,
            "command_timeout": 30,
            "pilots": {"max_waiting": 3, "reconcile_for": 60},
        }
    )
    doc["backends"]["sge"]["queues"] = [cell.queues[0]]
    run = Run(
        site.folder,
        doc,
        lambda: qstat_jobs(cell),
        base=BASE,
        waiting_states=WAITING,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(site.folder)},
        prefix=cell.submit_prefix,
    )
    run.start()
    killed_at = run.kill_during_submission(random.Random(seed), window=(0, 0), into=(0, 0.4))
    run.start()
    try:
        run.wait_iterations(3)
    finally:
        code = run.stop()
    verdict = run.verdict(killed_at)
    assert code == 0, run.log_text()[-3000:]
    return {"seed": seed, **verdict.row(), "why": verdict}


@pytest.mark.timeout(600)
def test_sigkill_during_parallel_qsub_leaves_no_unknown_job(sge) -> None:
    rows = []
    for seed in SEEDS:
        sge.cancel_all()
        rows.append(crash_once(sge, seed))
    record("sge sigkill during qsub", [{k: v for k, v in r.items() if k != "why"} for r in rows])
    for row in rows:
        assert row["why"].clean(), row
