"""Job lifecycles of the stand-in LSF, time-compressed (standard library only: the stand-ins
may run under an interpreter without gridgate).

A queue whose spec (or the scenario's ``default``) has ``pilots`` gives its jobs a lifecycle;
without it a job keeps the scenario's fixed ``job_stat``::

    queues:
      normal:
        pilots:
          pend: 2            # seconds PEND, then RUN
          run: 10            # seconds RUN, then DONE or EXIT
          outcome: done      # done | exit | killed, or weights {done: 3, exit: 1}
          exit_code: 1       # for exit
          exit_reason: "TERM_RUNLIMIT: job killed after reaching LSF run time limit"  # killed
          clean_period: 3600 # seconds after the end until bjobs no longer knows the id

The outcome among weighted ones is chosen by a hash of the job id, so every invocation
agrees. ``bkill`` records the kill time: a pending or running job is EXIT from then on
(``TERM_OWNER``). The caller gives the time: the stand-in reads the scenario's ``clock_file``
with :func:`gridgate.core.clock.file_time`.
"""

from __future__ import annotations

import hashlib
from typing import Any

OUTCOMES = ("done", "exit", "killed")
KILLED_REASON = "TERM_RUNLIMIT: job killed after reaching LSF run time limit"
OWNER_REASON = "TERM_OWNER: job killed by owner"


def check(spec: Any, where: str) -> str | None:
    """What is wrong with a ``pilots`` spec, or None."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        return f"scenario {where}.pilots: expected a mapping"
    outcome = spec.get("outcome", "done")
    for name in outcome if isinstance(outcome, dict) else [outcome]:
        if name not in OUTCOMES:
            return (
                f"scenario {where}.pilots: unknown outcome {name!r} (known: {', '.join(OUTCOMES)})"
            )
    return None


def pilots_spec(scenario: dict[str, Any], queue: str) -> dict[str, Any] | None:
    own = ((scenario.get("queues") or {}).get(queue) or {}).get("pilots")
    return own if own is not None else (scenario.get("default") or {}).get("pilots")


def _outcome(job_id: str, spec: dict[str, Any]) -> str:
    outcome = spec.get("outcome", "done")
    if not isinstance(outcome, dict):
        return str(outcome)
    digest = hashlib.sha256(str(job_id).encode()).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64 * sum(float(w) for w in outcome.values())
    seen = 0.0
    for name, weight in outcome.items():
        seen += float(weight)
        if point < seen:
            return str(name)
    return str(next(iter(outcome)))


def state(job: dict[str, Any], scenario: dict[str, Any], at: float) -> dict[str, Any] | None:
    """``job`` with ``stat``, ``exit_code`` and ``exit_reason`` as of ``at``; None when it
    finished more than ``clean_period`` ago (bjobs no longer knows it)."""
    spec = pilots_spec(scenario, str(job.get("queue", "")))
    if spec is None:
        return job
    started = float(job["submitted"]) + float(spec.get("pend", 2))
    ended = started + float(spec.get("run", 10))
    outcome = _outcome(str(job["id"]), spec)
    killed = job.get("killed")
    stat, code, reason = "DONE", "-", "-"
    if killed is not None and float(killed) < ended:
        ended, stat, code, reason = float(killed), "EXIT", "130", OWNER_REASON
    elif outcome == "exit":
        stat, code = "EXIT", str(int(spec.get("exit_code", 1)) or 1)
    elif outcome == "killed":
        stat, code, reason = "EXIT", "140", str(spec.get("exit_reason") or KILLED_REASON)
    clean = spec.get("clean_period", 3600)
    if clean is not None and at >= ended + float(clean):
        return None
    if at < ended:
        stat, code, reason = ("PEND" if at < started else "RUN"), "-", "-"
    ran = min(at, ended) >= started
    return {**job, "stat": stat, "exit_code": code, "exit_reason": reason, "ran": ran}
