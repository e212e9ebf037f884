"""What became of the demo's pilots: the lifecycles its simulated servers give them, and the
per-server table of waiting / running / done / failed it ends with, as the director tracked
them (its pilot registry, polled with ``glite-wms-job-status`` at each iteration).

The stand-ins keep every job they accepted on disk and answer ``glite-wms-job-status`` from
it, time-compressed: a pilot on a healthy server waits about 2.5 s and runs about 3 s; one
in ten exits non-zero. ``wms04`` accepts every submission, and every pilot it takes aborts
(``Cannot plan: BrokerHelper: no compatible resources``), the failure no submission error
reveals: only tracking the pilots shows it, and the director takes it out of rotation once
enough of its pilots have finished (``DIRECTOR_PILOTS``, compressed like the failing cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gridgate.plugins.wms_glite.sim.jobs import JobTable, now, snapshot
from gridgate.plugins.wms_glite.sim.tracking import pilot_specs, state_text
from gridgate.plugins.wms_glite.status import normalise

#: The aborting server of the demo.
ABORTING = "wms04.example.org"
#: Seconds in each state on the demo's servers (the real grid: minutes to hours).
STAGES = {"submitted": 0.5, "waiting": 1.0, "ready": 0.5, "scheduled": 0.5, "running": 3.0}
HEALTHY: Mapping[str, Any] = {**STAGES, "outcome": {"done": 9, "exit": 1}, "exit_code": 1}
ABORTS: Mapping[str, Any] = {
    **STAGES,
    "outcome": "aborted",
    "reason": "Cannot plan: BrokerHelper: no compatible resources",
}
COLUMNS = ("waiting", "running", "done", "failed")
#: ``director.pilots`` of the demo: a verdict on 5 finished pilots instead of 10, since an
#: iteration brings each server about 6 (a site keeps the defaults).
DIRECTOR_PILOTS: Mapping[str, Any] = {"abort_min_finished": 5, "abort_window": 10}


def pilots_spec(host: str) -> dict[str, Any]:
    """The ``pilots`` scenario entry of one demo server."""
    return dict(ABORTS if host == ABORTING else HEALTHY)


def stand_in_states(scenario: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per server, how many of the pilots it accepted are waiting, running, done or failed
    now, as its bookkeeping server (the stand-in's job table) says."""
    table = JobTable.of(scenario)
    if table is None:
        return {}
    jobs = table.load()
    specs = pilot_specs(scenario, jobs)
    at = now(scenario)
    counts: dict[str, dict[str, int]] = {}
    for job in jobs.values():
        if job.nodes:
            continue  # a parametric parent is not a pilot; its nodes are
        snap = snapshot(job, specs.get(job.host, {}), at)
        state = normalise(state_text(snap, "glite"), snap.exit_code)
        row = counts.setdefault(job.host, dict.fromkeys(COLUMNS, 0))
        if state in row:
            row[state] += 1
        elif state == "cancelled":
            row["failed"] += 1
    return counts


def tracked_states(director: Any) -> dict[str, dict[str, int]]:
    """Per server, the director's pilots by state (``cancelled`` and ``lost`` count as failed,
    ``unknown`` as waiting: the table has four columns)."""
    fold = {"cancelled": "failed", "lost": "failed", "unknown": "waiting"}
    counts: dict[str, dict[str, int]] = {}
    try:
        rows = director.state.pilot_registry().counts()
    except Exception:  # a demo without a registry still prints its other tables
        return counts
    for (_backend, endpoint, state), n in rows.items():
        row = counts.setdefault(endpoint, dict.fromkeys(COLUMNS, 0))
        row[fold.get(state, state)] += n
    return counts


def left_rotation(notes: Any) -> dict[str, str]:
    """Servers the director took out of rotation because their pilots failed."""
    out: dict[str, str] = {}
    for note in notes:
        if (
            note.endpoint is not None
            and note.failure is not None
            and note.failure.kind == "aborted"
        ):
            out[note.endpoint.name] = "left rotation: its pilots abort"
    return out


def aborted_lines(summary: Any) -> list[str]:
    """Progress lines for servers an iteration took out of rotation for aborting pilots."""
    pilots = getattr(summary, "pilots", None) or {}
    return [
        f"    {key.split('/', 1)[-1]}: its last finished pilots failed; out of rotation"
        for key in pilots.get("aborted") or ()
    ]


def render_pilots(
    states: Mapping[str, Mapping[str, int]],
    hosts: list[str],
    out_of_rotation: Mapping[str, str] | None = None,
) -> list[str]:
    """The table lines: one row per server that accepted pilots."""
    out_of_rotation = out_of_rotation or {}
    lines = [
        "",
        "What became of the pilots (the director's registry, as last polled):",
        f"{'server':<20}{'waiting':>9}{'running':>9}{'done':>9}{'failed':>9}  note",
        "-" * 72,
    ]
    footer = [
        "-" * 72,
        "failed: pilots that ended badly. On a healthy server one pilot in ten exits non-zero",
        "  (the stand-ins' normal failure rate): too few to leave rotation, which takes more than",
        "  half of an endpoint's last finished pilots failing (an aborted verdict, above).",
    ]
    for host in hosts:
        row = states.get(host)
        if not row:
            continue
        note = out_of_rotation.get(host, "")
        lines.append(
            f"{host:<20}" + "".join(f"{row[c]:>9}" for c in COLUMNS) + (f"  {note}" if note else "")
        )
    return lines + footer


def scenario_of(folder: Path) -> dict[str, Any]:
    from gridgate.plugins.wms_glite.sim import load_scenario

    return load_scenario(folder / "scenario.json")
