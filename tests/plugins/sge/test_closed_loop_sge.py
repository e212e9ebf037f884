"""The director's closed loop on the real Grid Engine cell, each iteration a real
``gridgate run --once --json`` process run as the cell's submit user (a site runs its director
under a service account; Grid Engine refuses root), on one sqlite state: ``max_waiting``
bounds what real qstat shows waiting per queue while demand exceeds what runs, finished pilots
are found in qacct once they have left qstat, and a queue whose every pilot fails leaves
rotation with one error.

The cell has 4 slots in each of its two queues. Between iterations the test waits for Grid
Engine to have started (or finished) what it could; expiries are not waited for.
"""

from __future__ import annotations

import pytest
from support.polling import until
from support.sge_site import SgeSite

from gridgate.plugins.sge.parse import parse_qstat


@pytest.fixture
def sge_site(sge, tmp_path) -> SgeSite:
    return SgeSite(sge, tmp_path.name)


def jobs(cell) -> dict[str, tuple[str, str]]:
    """pilot id -> (state, queue or "") of every job the qmaster holds."""
    out = cell.run(["qstat", "-u", "*", "-g", "d"], as_user=False)
    assert out.ok, out.stderr
    return {
        j: (s.state, s.reason.removeprefix("in ").split("@")[0])
        for j, s in parse_qstat(out.stdout).items()
    }


def test_max_waiting_bounds_waiting_jobs_in_real_qstat(sge_site, figures) -> None:
    cell, width = sge_site.cell, 3
    doc = sge_site.doc(pilots=12)
    doc["director"]["pilots"] = {"max_waiting": width}
    doc["selectors"] = {"round_robin": {}}
    slots = cell.slots * len(cell.queues)
    submitted: dict[str, str] = {}  # pilot id -> the queue it was submitted to
    trimmed = 0
    peak = dict.fromkeys(cell.queues, 0)
    for iteration in range(1, 5):
        summary = sge_site.run_once(doc)
        assert summary["failures"] == [], summary["failures"]
        submitted.update({i: s["endpoint"] for s in summary["submitted"] for i in s["job_ids"]})
        trimmed += sum(summary["pilots"]["trimmed"].get("sge", {}).values())
        # what fits runs (the scheduler starts jobs within a second or so)
        assert until(
            lambda: (
                sum(s == "running" for s, _ in jobs(cell).values()) == min(slots, len(submitted))
            ),
            timeout=60,
        ), jobs(cell)
        live = jobs(cell)
        assert set(live) == set(submitted), "every pilot submitted is in qstat, nothing else"
        # a waiting job has no queue yet: count it for the queue it was submitted to
        for queue in cell.queues:
            waiting = sum(
                1 for j, (s, _) in live.items() if s == "waiting" and submitted[j] == queue
            )
            assert waiting <= width, (iteration, queue, live)
            peak[queue] = max(peak[queue], waiting)
        if iteration > 1:  # the polls saw the earlier pilots running or waiting
            polls = {p["endpoint"]: p for p in summary["pilots"]["polls"]}
            assert set(polls) == set(cell.queues) and {p["outcome"] for p in polls.values()} == {
                "ok"
            }
    assert trimmed >= 4 * 12 - (slots + width * len(cell.queues))  # the rest was held back
    figures(
        max_waiting=width,
        slots=slots,
        submitted=len(submitted),
        peak_waiting=peak,
        trimmed_pilots=trimmed,
    )


def test_finished_pilots_come_from_qacct_and_a_failing_queue_leaves_rotation(
    sge_site, figures
) -> None:
    cell = sge_site.cell
    good, bad = cell.queues
    script = sge_site.pilot(
        "pilot-by-queue.sh",
        # Grid Engine gives a job its queue in $QUEUE
        f'if [ "$QUEUE" = {bad} ]; then echo "pilot: no usable software area" >&2; exit 1; fi\n',
    )
    doc = sge_site.doc(pilots=8, script=str(script))
    doc["director"]["pilots"] = {"abort_window": 6, "abort_min_finished": 4}
    doc["selectors"] = {"round_robin": {}}
    out_at = None
    for iteration in range(1, 6):
        summary = sge_site.run_once(doc)
        if "sge/" + bad in summary["pilots"]["aborted"]:
            out_at = iteration
            break
        assert until(lambda: not jobs(cell), timeout=120), jobs(cell)  # all have ended
    assert out_at is not None and out_at <= 3, out_at
    states = {p["endpoint"]: p for p in summary["pilots"]["polls"]}
    assert set(states) == {good, bad} and {p["outcome"] for p in states.values()} == {"ok"}
    notes = sge_site.notes()
    assert len(notes) == 1 and bad in notes[0], notes
    assert "failed 0, exit_status 1" in notes[0]  # qacct's words for the pilots' end
    # out of rotation: the next process submits to the good queue only
    assert until(lambda: not jobs(cell), timeout=120)
    after = sge_site.run_once(doc)
    assert {s["endpoint"] for s in after["submitted"]} == {good}
    figures(iterations_until_out=out_at, note=notes[0].splitlines()[0])
