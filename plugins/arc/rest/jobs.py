"""Job descriptions sent over REST, the pilots' job ids, and A-REX's job states in core's
(the answers themselves are decoded in :mod:`gridgate.plugins.arc.documents`)."""

from __future__ import annotations

from collections.abc import Sequence

from gridgate.core.model import JobStatus
from gridgate.plugins.arc.documents import Activity
from gridgate.plugins.arc.parse import final_status

__all__ = [
    "FINAL_NATIVE",
    "STATE_MAP",
    "bundle",
    "ce_id",
    "info_status",
    "job_url",
    "pilot_state",
]

#: A-REX's REST job states (``arcrest:``) in core's pilot states. ``FINISHED`` depends on the
#: exit code (:func:`pilot_state`); ``KILLING`` stays running until the CE says ``KILLED``, as
#: arcstat shows ``Running`` until ``Killed``.
STATE_MAP: dict[str, str] = {
    **dict.fromkeys(
        ("ACCEPTING", "ACCEPTED", "PREPARING", "PREPARED", "SUBMITTING", "QUEUING", "HELD"),
        "waiting",
    ),
    **dict.fromkeys(("RUNNING", "EXITINGLRMS", "EXECUTED", "FINISHING", "KILLING"), "running"),
    "FAILED": "failed",
    "KILLED": "cancelled",
    **dict.fromkeys(("WIPED", "OTHER", "NONE"), "unknown"),
}
#: States whose exit code and error the CE's ``info`` document tells (asked once per pilot).
FINAL_NATIVE = frozenset({"FINISHED", "FAILED"})


def ce_id(job_id: str) -> str:
    """The CE-side id of a pilot's job id (``https://ce/arex/rest/1.0/jobs/ID`` -> ``ID``)."""
    return job_id.rstrip("/").rsplit("/", 1)[-1]


def job_url(service: str, version: str, identifier: str) -> str:
    """A pilot's job id: the URL arcsub prints for the same job, so that both interfaces name
    a pilot alike (``https://ce:443/arex/rest/1.0/jobs/ID``)."""
    return f"{service.rstrip('/')}/rest/{version}/jobs/{identifier}"


def bundle(descriptions: Sequence[str]) -> str:
    """One request body for ``descriptions`` (xRSL, each ``&(...)``): the description itself
    for one, a multi-xRSL ``+(&...)(&...)`` for several (A-REX answers one entry each, in
    order)."""
    if len(descriptions) == 1:
        return descriptions[0]
    return "+" + "".join(f"({d.strip()})" for d in descriptions)


def pilot_state(native: str, exit_code: int | None) -> str:
    """Core's state for a REST state and exit code (None when not known)."""
    name = native.strip().upper()
    if name == "FINISHED":
        return "done" if exit_code in (0, None) else "failed"
    return STATE_MAP.get(name, "unknown")


def info_status(job_id: str, native: str, activity: Activity | None) -> JobStatus:
    """A final pilot's status from its ``info`` document's activity: the exit code, and the
    CE's ``Error`` lines as the reason (``LRMS error: (3) Job finished with wrong exit code``)."""
    found = activity or Activity()
    for state in found.states:
        if state.startswith("arcrest:"):
            native = state.removeprefix("arcrest:")
    return final_status(job_id, native, found.exit_code, "; ".join(found.errors), pilot_state)
