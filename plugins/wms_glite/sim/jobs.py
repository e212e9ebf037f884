"""The stand-ins' job table and pilot lifecycles, time-compressed.

Every job a stand-in ``glite-wms-job-submit`` accepts is appended to ``<state_dir>/jobs.jsonl``
(one O_APPEND line per submission or cancel, so concurrent stand-ins never lose one), with the
WMS host that took it. ``glite-wms-job-status`` and ``glite-wms-job-cancel`` read the table
back, so separate invocations agree. A job's state is a pure function of its submission time,
the clock and its host's ``pilots`` spec::

    hosts:
      wms01.example.org:
        pilots:
          submitted: 1    # seconds in each state (defaults below)
          waiting: 2
          ready: 1
          scheduled: 2
          running: 10
          outcome: done   # done | exit | failed | aborted | cancelled, or weights {done: 3, exit: 1}
          exit_code: 1    # for exit
          reason: X509 proxy expired   # for aborted / failed (defaults below)
          abort_after: waiting         # the last state an aborting job shows before Aborted
          clear_after: null            # seconds from Done to Cleared (output retrieved)
          purge_after: 3600            # seconds from the end to the LB forgetting the job
          status: healthy              # the LB for this host's jobs: healthy | lb_down | hang
          status_latency: 0

Which outcome a job gets among weighted ones is decided by its place among its host's jobs in
the table (a golden-ratio sequence over the weights), so every invocation agrees and the
outcomes are spread evenly: with ``{done: 9, exit: 1}`` about one job in ten exits, and never
two of any five in a row (random draws would now and then give a healthy server a run of
failures, and the director's verdict on its pilots would rightly take it out of rotation). The clock is the file named by the scenario's ``clock_file`` (or
``GRIDGATE_SIM_CLOCK``) holding epoch seconds, when it exists: tests move time by rewriting it
and never sleep; without it the stand-ins use the wall clock (the demo).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gridgate.core.clock import file_time, write_file_time

CLOCK_ENV = "GRIDGATE_SIM_CLOCK"
#: Seconds in each state before the next, when the scenario does not say.
DEFAULT_DURATIONS: Mapping[str, float] = {
    "Submitted": 1.0,
    "Waiting": 2.0,
    "Ready": 1.0,
    "Scheduled": 2.0,
    "Running": 10.0,
}
STAGES = tuple(DEFAULT_DURATIONS)
OUTCOMES = ("done", "exit", "failed", "aborted", "cancelled")
DEFAULT_REASONS: Mapping[str, str] = {
    "aborted": "Cannot plan: BrokerHelper: no compatible resources",
    "failed": "Job got an error while in the CondorG queue",
    "cancelled": "Aborted by user",
}
STATUS_BEHAVIOURS = ("healthy", "lb_down", "hang")
DEFAULT_CES = (
    "ce01.example.org:8443/cream-pbs-long",
    "ce02.example.org:2119/jobmanager-lcgpbs-grid",
)


class LifecycleError(ValueError):
    """A ``pilots`` spec the stand-ins cannot act out."""


def check_pilots(spec: Any, where: str) -> None:
    """Raise :class:`LifecycleError` naming ``where`` for a bad ``pilots`` spec."""
    if spec is None:
        return
    if not isinstance(spec, Mapping):
        raise LifecycleError(f"scenario {where}.pilots: expected a mapping")
    outcome = spec.get("outcome", "done")
    names = list(outcome) if isinstance(outcome, Mapping) else [outcome]
    for name in names:
        if name not in OUTCOMES:
            raise LifecycleError(
                f"scenario {where}.pilots: unknown outcome {name!r} (known: {', '.join(OUTCOMES)})"
            )
    if spec.get("status", "healthy") not in STATUS_BEHAVIOURS:
        raise LifecycleError(
            f"scenario {where}.pilots: unknown status behaviour "
            f"{spec.get('status')!r} (known: {', '.join(STATUS_BEHAVIOURS)})"
        )
    if spec.get("abort_after", "Waiting").capitalize() not in STAGES:
        raise LifecycleError(f"scenario {where}.pilots: abort_after must be one of {STAGES}")


def now(scenario: Mapping[str, Any]) -> float:
    """The stand-ins' time: the clock file when there is one, else the wall clock."""
    return file_time(scenario.get("clock_file") or os.environ.get(CLOCK_ENV))


#: tests move the stand-ins' time with it
set_clock = write_file_time


@dataclass
class Job:
    """One job of the table: ``nodes`` are a parametric parent's children, ``parent`` a
    child's parent."""

    job_id: str
    host: str
    endpoint: str
    submitted: float
    parent: str | None = None
    nodes: list[str] = field(default_factory=list)
    cancelled: float | None = None
    #: The job's place (0, 1, 2...) among its host's jobs in the table, in submission order.
    ordinal: int = 0
    #: When its output sandbox was retrieved (``glite-wms-job-output``): Cleared from then on.
    retrieved: float | None = None
    #: The JDL's StdOutput and StdError, the files of its output sandbox.
    outputs: tuple[str, str] = ("std.out", "std.err")


@dataclass(frozen=True)
class Snapshot:
    """What the bookkeeping server says of a job at one moment."""

    state: str  # Submitted ... Running, Done, Aborted, Cancelled, Cleared, Purged
    done_code: int | None = None  # 0 ok, 1 failed, 2 cancelled (Done only)
    exit_code: int | None = None
    reason: str = ""
    destination: str = ""
    logged: tuple[str, ...] = ()
    entered: float = 0.0

    @property
    def terminal(self) -> bool:
        return self.state in ("Done", "Aborted", "Cancelled", "Cleared", "Purged")


def _fraction(job_id: str) -> float:
    digest = hashlib.sha256(job_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


#: The golden ratio's fractional part: the points ``k * SPREAD mod 1`` fill [0, 1) as evenly
#: as any sequence can, so each weight's share of consecutive jobs is close to its weight.
SPREAD = (5**0.5 - 1) / 2


def outcome_of(ordinal: int, spec: Mapping[str, Any]) -> str:
    """The outcome the job at place ``ordinal`` of its host gets under ``spec``."""
    outcome = spec.get("outcome", "done")
    if not isinstance(outcome, Mapping):
        return str(outcome)
    total = sum(float(w) for w in outcome.values())
    point, seen = ((ordinal + 1) * SPREAD) % 1.0 * total, 0.0
    for name, weight in outcome.items():
        seen += float(weight)
        if point < seen:
            return str(name)
    return str(next(iter(outcome)))


def snapshot(job: Job, spec: Mapping[str, Any], at: float) -> Snapshot:
    """The state of ``job`` at time ``at`` under its host's ``pilots`` spec."""
    durations = {
        stage: float(spec.get(stage.lower(), DEFAULT_DURATIONS[stage])) for stage in STAGES
    }
    outcome = outcome_of(job.ordinal, spec)
    ces = spec.get("ces") or DEFAULT_CES
    destination = ces[int(_fraction(job.job_id + "ce") * len(ces)) % len(ces)]
    reason = str(spec.get("reason") or DEFAULT_REASONS.get(outcome, ""))
    last = (
        STAGES.index(spec.get("abort_after", "Waiting").capitalize())
        if outcome == "aborted"
        else len(STAGES) - 1
    )
    if outcome == "cancelled":
        last = STAGES.index("Waiting")
    # The timeline: each stage up to the last, then the end state.
    t = job.submitted
    timeline: list[tuple[float, str]] = []
    for stage in STAGES[: last + 1]:
        timeline.append((t, stage))
        t += durations[stage]
    end = t
    if job.cancelled is not None and job.cancelled < end:
        end, outcome, reason = job.cancelled, "cancelled", DEFAULT_REASONS["cancelled"]
        timeline = [(start, stage) for start, stage in timeline if start <= job.cancelled]
    purge_after = spec.get("purge_after", 3600)
    if purge_after is not None and at >= end + float(purge_after):
        return Snapshot("Purged", entered=end + float(purge_after))
    if at < end:
        start, stage = next(((s, st) for s, st in reversed(timeline) if s <= at), timeline[0])
        matched = STAGES.index(stage) >= STAGES.index("Ready")
        if stage == "Waiting" and outcome == "aborted" and "BrokerHelper" in reason:
            why = "BrokerHelper: no compatible resources"
        elif stage in ("Scheduled", "Running"):
            why = (
                "unavailable" if ":8443/" in destination else "Job successfully submitted to Globus"
            )
        else:
            why = ""
        return Snapshot(
            stage, reason=why, destination=destination if matched else "", entered=start
        )
    ran = any(stage == "Scheduled" for _, stage in timeline)
    where = destination if ran else ""
    if job.retrieved is not None and outcome in ("done", "exit") and at >= job.retrieved:
        return Snapshot(
            "Cleared",
            reason="user retrieved output sandbox",
            destination=where,
            entered=job.retrieved,
        )
    if outcome == "done":
        clear_after = spec.get("clear_after")
        if clear_after is not None and at >= end + float(clear_after):
            return Snapshot(
                "Cleared",
                reason="user retrieved output sandbox",
                destination=where,
                entered=end + float(clear_after),
            )
        return Snapshot(
            "Done",
            0,
            0,
            "Job Terminated Successfully",
            where,
            ("job completed", "Job Terminated Successfully"),
            end,
        )
    if outcome == "exit":
        code = int(spec.get("exit_code", 1)) or 1
        return Snapshot(
            "Done",
            0,
            code,
            "Job Terminated Successfully",
            where,
            ("job completed", "Job Terminated Successfully"),
            end,
        )
    if outcome == "failed":
        return Snapshot("Done", 1, None, reason, where, (reason,), end)
    if outcome == "cancelled":
        return Snapshot("Cancelled", reason=reason, destination=where, entered=end)
    return Snapshot("Aborted", reason=reason, destination=where, entered=end)


def parent_snapshot(children: Sequence[Snapshot], submitted: float) -> Snapshot:
    """A parametric parent's state from its nodes' (how the real LB derives it is uncertain):
    running while any node runs, waiting while any waits, then Done."""
    live = [c for c in children if not c.terminal]
    if any(c.state == "Running" for c in live):
        return Snapshot("Running", entered=submitted)
    if live:
        return Snapshot("Waiting", entered=submitted)
    ok = all(
        c.state in ("Done", "Cleared") and c.done_code in (0, None) and not c.exit_code
        for c in children
    )
    return Snapshot("Done", 0, 0 if ok else 1, "", "", (), submitted)


class JobTable:
    """The jobs of one scenario's ``state_dir``."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / "jobs.jsonl"

    @classmethod
    def of(cls, scenario: Mapping[str, Any], state_dir: str = "") -> JobTable | None:
        folder = state_dir or scenario.get("state_dir") or ""
        return cls(folder) if folder else None

    def _append(self, entries: Sequence[Mapping[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps(dict(e)) + "\n" for e in entries).encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)  # one write: concurrent stand-ins never interleave
        finally:
            os.close(fd)

    def add(
        self,
        endpoint: str,
        parent: str,
        nodes: Sequence[str],
        at: float,
        outputs: tuple[str, str] = ("std.out", "std.err"),
    ) -> None:
        """Record a submission to ``endpoint``: a plain job, or a parent and its nodes;
        ``outputs`` the JDL's StdOutput and StdError."""
        host = urlsplit(endpoint).hostname or endpoint
        self._append(
            [
                {
                    "event": "submit",
                    "id": parent,
                    "host": host,
                    "endpoint": endpoint,
                    "time": at,
                    "nodes": list(nodes),
                    "outputs": list(outputs),
                }
            ]
        )

    def retrieve(self, job_id: str, at: float) -> None:
        """Record that ``job_id``'s output sandbox was handed over (the WMS clears the job)."""
        self._append([{"event": "output", "id": job_id, "time": at}])

    def cancel(self, job_ids: Sequence[str], at: float) -> None:
        self._append([{"event": "cancel", "id": j, "time": at} for j in job_ids])

    def load(self) -> dict[str, Job]:
        """Every job by id, parametric nodes included."""
        jobs: dict[str, Job] = {}
        places: dict[str, int] = {}  # per host, the next ordinal

        def place(host: str) -> int:
            places[host] = places.get(host, -1) + 1
            return places[host]

        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return jobs
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == "submit":
                outputs = tuple(entry.get("outputs") or ("std.out", "std.err"))
                parent = Job(
                    entry["id"],
                    entry["host"],
                    entry["endpoint"],
                    float(entry["time"]),
                    nodes=list(entry.get("nodes") or []),
                    outputs=(str(outputs[0]), str(outputs[-1])),
                )
                if not parent.nodes:  # a parametric parent's state is its nodes'
                    parent.ordinal = place(parent.host)
                jobs[parent.job_id] = parent
                for node in parent.nodes:
                    jobs[node] = Job(
                        node,
                        parent.host,
                        parent.endpoint,
                        parent.submitted,
                        parent=parent.job_id,
                        ordinal=place(parent.host),
                        outputs=parent.outputs,
                    )
            elif entry.get("event") == "output" and entry.get("id") in jobs:
                job = jobs[entry["id"]]
                job.retrieved = job.retrieved or float(entry["time"])
            elif entry.get("event") == "cancel" and entry.get("id") in jobs:
                job = jobs[entry["id"]]
                if job.cancelled is None:
                    job.cancelled = float(entry["time"])
                for node in job.nodes:
                    if jobs[node].cancelled is None:
                        jobs[node].cancelled = float(entry["time"])
        return jobs
