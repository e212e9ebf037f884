"""Job descriptions sent over REST, and the CE's answers read back into values.

A-REX's answers have shapes a client must read with care (``shared/reference/arc.md``, REST
interface, traps 3-5): one item is a JSON object and several a list (``{"job":{...}}`` against
``{"job":[...]}``); an empty list is an empty body; management answers are ``201`` with each
job's own ``status-code`` (a string) inside, in request order, ``404 Job not found`` with
``"state":"None"`` for a job the CE does not have. :func:`entries` reads all of them alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gridgate.core.model import JobStatus
from gridgate.core.text import parse_json
from gridgate.plugins.arc.parse import final_status

__all__ = [
    "ENTRY_KEYS",
    "FINAL_NATIVE",
    "STATE_MAP",
    "Entry",
    "bundle",
    "ce_id",
    "entries",
    "info_status",
    "job_url",
    "pilot_state",
]

#: The list key of each kind of answer.
ENTRY_KEYS = {"jobs": "job", "delegations": "delegation"}
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
#: A CE-side job id: what A-REX returns, the last path element of a job URL.
CE_ID_RE = re.compile(r"[A-Za-z0-9]+")


@dataclass(frozen=True)
class Entry:
    """One job's part of a bulk answer: its ``status-code`` (an int), ``reason``, CE-side
    ``id`` (empty when the CE gave none) and the rest of the entry (``state``,
    ``info_document``...)."""

    code: int
    reason: str
    id: str
    fields: Mapping[str, Any]


def entries(body: bytes, key: str = "job") -> list[Entry]:
    """Every entry of an answer, in order, whatever its shape: an empty body is none, an
    object is one, a list is each.

    :raises ValueError: when the body is not such an answer (not JSON, no ``key``, an entry
        without a status code)."""
    if not body.strip():
        return []
    data = parse_json(body)
    if not isinstance(data, dict) or key not in data:
        raise ValueError(f"no {key!r} in the answer")
    items = data[key]
    items = items if isinstance(items, list) else [items]
    found: list[Entry] = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(f"an entry of {key!r} is not an object")
        code = item.get("status-code", 200)  # listings (GET jobs) carry only ids
        try:
            number = int(code)
        except (TypeError, ValueError):
            raise ValueError(f"an entry's status-code {code!r} is not a number") from None
        found.append(Entry(number, str(item.get("reason", "")), str(item.get("id", "")), item))
    return found


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


def _listed(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def info_status(job_id: str, native: str, document: Mapping[str, Any]) -> JobStatus:
    """A final pilot's status from its ``info`` document: the exit code, and the CE's
    ``Error`` lines as the reason (``LRMS error: (3) Job finished with wrong exit code``)."""
    activity = document.get("ComputingActivity", {}) if isinstance(document, Mapping) else {}
    for state in _listed(activity.get("State")):
        if state.startswith("arcrest:"):
            native = state.removeprefix("arcrest:")
    return final_status(
        job_id,
        native,
        str(activity.get("ExitCode", "")),
        "; ".join(_listed(activity.get("Error"))),
        pilot_state,
    )
