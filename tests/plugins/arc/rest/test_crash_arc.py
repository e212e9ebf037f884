"""Issue 41 on the real A-REX (REST, bundles of 5 descriptions per POST): `gridgate run` SIGKILLed
at a seeded random moment while a bundle is being created or its pilot scripts uploaded, then
restarted. After recovery the CE (asked here with http.client and the CE's proxy, never the code
under test: every job of this DN, its name and state) holds no job of the fleet the registry does
not know (a job created and never given its script is either completed or killed and cleaned),
the registry tracks no live pilot the CE does not hold, no job id is in two accounting rows, and
the director never ends with a traceback.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from support.crashes import Jobs, Run, record, seeds

SEEDS = seeds((41, 4101))
BASE = "gridgate-pilot"
WAITING = frozenset({"ACCEPTING", "ACCEPTED", "PREPARING", "PREPARED", "SUBMITTING", "QUEUING"})
PILOT = "#!/bin/sh\nsleep 600\n"


def ce_jobs(witness, url: str) -> Jobs:
    status, _reason, body = witness.call("GET", "jobs")
    assert status == 200, status
    if not body.strip():
        return {}
    items = json.loads(body)["job"]
    ids = [i["id"] for i in (items if isinstance(items, list) else [items])]
    if not ids:
        return {}
    states = witness.states(ids)
    jobs = {}
    for entry in witness.jobs("info", ids):
        document = entry.get("info_document")  # a text, not a document, for a job too young
        activity = document.get("ComputingActivity", {}) if isinstance(document, dict) else {}
        name = activity.get("Name", "") if isinstance(activity, dict) else ""
        ident = entry["id"]
        state = states.get(ident, "")
        if state in ("", "None", "DELETED"):
            continue
        if not name:  # too young for its info document: its kept description names it
            code, _r, kept = witness.call("GET", f"jobs/{ident}/description")
            text = kept.decode("utf-8", "replace") if code == 200 else ""
            start = text.find(f'"{BASE}-')
            name = text[start + 1 : text.find('"', start + 1)] if start >= 0 else ""
        jobs[f"{url.rstrip('/')}/rest/1.0/jobs/{ident}"] = (name, state)
    return jobs


def clean_ce(witness) -> None:
    status, _reason, body = witness.call("GET", "jobs")
    if status != 200 or not body.strip():
        return
    items = json.loads(body)["job"]
    ids = [i["id"] for i in (items if isinstance(items, list) else [items])]
    if ids:
        witness.jobs("kill", ids)
        witness.jobs("clean", ids)


def _doc(site) -> dict:
    """Bundles of 5, 10 pilots wanted, all may wait."""
    return {
        "director": {
            "state_dir": str(site.folder / "state"),
            "cycle_seconds": 1,
            "max_threads": 2,
            "command_timeout": 60,
            "pilots": {"max_waiting": 10, "reconcile_for": 60},
        },
        "state": {"driver": "sqlite", "path": str(site.folder / "state" / "state.db")},
        "backends": {"arc": site.section(pilots_per_submission=5)},
        "demand": {"static": {"arc": 10}},
        "notifiers": {"files": {"folder": str(site.folder / "notes")}},
    }


def crash_once(arc, rest_site, witness, seed: int) -> dict:
    site = rest_site(arc, f"crash-{seed}", pilot=PILOT)
    look = witness(arc)
    clean_ce(look)
    doc = _doc(site)
    run = Run(
        site.folder,
        doc,
        lambda: ce_jobs(look, arc.url),
        base=BASE,
        waiting_states=WAITING,
    )
    run.start()
    killed_at = run.kill_during_submission(random.Random(seed), window=(0, 0), into=(0, 1.5))
    run.start()
    try:
        run.wait_iterations(3)
    finally:
        code = run.stop()
    verdict = run.verdict(killed_at)
    assert code == 0, run.log_text()[-3000:]
    return {"seed": seed, **verdict.row(), "why": verdict}


@pytest.mark.timeout(900)
def test_sigkill_during_bulk_creation_leaves_no_unknown_job(arc, rest_site, witness) -> None:
    rows = [crash_once(arc, rest_site, witness, seed) for seed in SEEDS]
    record(
        "arc sigkill during bulk creation",
        [{k: v for k, v in r.items() if k != "why"} for r in rows],
    )
    clean_ce(witness(arc))
    for row in rows:
        assert row["why"].clean(), row


@pytest.mark.timeout(900)
def test_the_ce_stopped_mid_bulk_and_started_again_leaves_no_unknown_job(
    arc, rest_site, witness
) -> None:
    """A-REX stopped while a bundle is being created (its answer lost with the connection)
    and started again: the director survives, the bundle's jobs the CE made are found by name
    in whatever state A-REX has them, and nothing is unknown or over the limit."""
    rows = []
    for seed in SEEDS:
        site = rest_site(arc, f"stop-{seed}", pilot=PILOT)
        look = witness(arc)
        clean_ce(look)
        doc = _doc(site)
        doc["director"]["failing_expiry"] = 5  # tried again soon after it is back
        run = Run(
            site.folder,
            doc,
            lambda look=look: ce_jobs(look, arc.url),
            base=BASE,
            waiting_states=WAITING,
        )
        run.start()
        try:
            run.wait_for_intent(random.Random(seed), into=(0.4, 1.2))  # in the bulk POST
            arc.stop_service()  # its daemons, keeping its folder, port and jobs
            time.sleep(3)
            arc.start()
            run.wait_iterations(10, bound=240)  # past failing_expiry: it is tried again
        finally:
            code = run.stop()
        verdict = run.verdict()
        assert code == 0, run.log_text()[-3000:]
        state = run.open()
        try:
            tracked = len(state.pilot_registry().query("arc"))
        finally:
            state.close()
        assert tracked, f"the CE got no pilot once back: {run.log_text()[-3000:]}"
        lost = "was lost" in run.log_text()
        rows.append({"seed": seed, **verdict.row(), "answer lost": lost, "why": verdict})
    record("arc CE stopped mid-bulk", [{k: v for k, v in r.items() if k != "why"} for r in rows])
    clean_ce(witness(arc))
    for row in rows:
        assert row["why"].clean(), row
