"""What the ARC 6 client prints, read into values: arcsub's job ids, arcstat's per-job blocks and
summary, arckill's and arcclean's counts, and the xRSL the backend writes.

Every format here is the real client's (ARC 6.17, ``shared/reference/arc.md`` and docs/arc.md
quote them). The exit codes say little (arcstat exits 0 when no job returned information,
arcsub exits 0 for a job it could not record), so the backend reads the text instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gridgate.core.model import JobStatus

#: ``Job submitted with jobid: https://ce:443/arex/rest/1.0/jobs/ID`` (one line per job, input order)
SUBMITTED_RE = re.compile(r"^Job submitted with jobid:\s*(\S+)\s*$")
#: ``Status of 3 jobs was queried, 1 jobs returned information``
SUMMARY_RE = re.compile(
    r"Status of (\d+) jobs? (?:was|were) queried, (\d+) jobs? returned information"
)
#: ``WARNING: Failed to process job: ID - 404 Job not found`` (or no reason at all)
FAILED_JOB_RE = re.compile(r"^WARNING: Failed to process job: (\S+)(?: - (.*))?$")
#: ``Warning: Job not found in job list: ID`` (the client never asks the CE about such an id)
NOT_IN_LIST_RE = re.compile(r"^Warning: Job not found in job list: (\S+)\s*$")
#: ``Jobs processed: 2, successfully killed: 1, successfully cleaned: 0``
KILLED_RE = re.compile(r"Jobs processed: (\d+), successfully killed: (\d+)")
#: ``Jobs processed: 1, deleted: 1``
CLEANED_RE = re.compile(r"Jobs processed: (\d+), deleted: (\d+)")
#: A job id as arcsub prints it with ``-T arcrest``: the CE-side id is the last path element.
JOB_ID_RE = re.compile(r"^https://[^\s/]+(?:/[^\s/]+)*/[A-Za-z0-9]+\Z")

#: arcstat's ``State:`` names in core's pilot states (issue 20; formats in arc.md section 4).
#: ``Finished`` depends on the exit code and is decided in :func:`pilot_state`.
STATE_MAP: dict[str, str] = {
    **dict.fromkeys(("accepted", "preparing", "submitting", "queuing", "hold"), "waiting"),
    **dict.fromkeys(("running", "finishing"), "running"),
    "failed": "failed",
    "killed": "cancelled",
    **dict.fromkeys(("deleted", "undefined", "other"), "unknown"),
}


def submitted_ids(stdout: str) -> list[str]:
    """The job ids arcsub printed, in input order."""
    ids = []
    for line in stdout.splitlines():
        found = SUBMITTED_RE.match(line.strip())
        if found:
            ids.append(found.group(1))
    return ids


def pilot_state(native: str, exit_code: int | None) -> str:
    """Core's state for arcstat's ``State:`` text and ``Exit Code:`` (None when not printed)."""
    name = native.strip().lower()
    if name == "finished":
        return "done" if exit_code in (0, None) else "failed"
    return STATE_MAP.get(name, "unknown")


@dataclass(frozen=True)
class StatusReport:
    """What one arcstat call said.

    ``statuses`` per job id that had a block; ``gone`` the ids the CE answered 404 for (it no
    longer has them) or that are not in the job list (the client never asked); ``failed`` the ids
    the client could not get information about for another reason (CE down, proxy refused),
    with that reason; ``queried``/``returned`` the summary line's numbers (None when absent).
    """

    statuses: Mapping[str, JobStatus] = field(default_factory=dict)
    gone: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    queried: int | None = None
    returned: int | None = None


def final_status(
    job_id: str,
    native: str,
    code_text: str,
    reason: str,
    state_of: Callable[[str, int | None], str] | None = None,
) -> JobStatus:
    """A pilot's status from the CE's state text, exit code text (``""``: none) and error:
    the state by ``state_of`` (default: arcstat's :func:`pilot_state`), and for a failed
    pilot without an error its exit code as the reason. Both interfaces read theirs with it."""
    code_text = code_text.strip()
    exit_code = int(code_text) if re.fullmatch(r"-?\d+", code_text) else None
    state = (state_of or pilot_state)(native, exit_code)
    if not reason and state == "failed" and exit_code is not None:
        reason = f"exit code {exit_code}"
    return JobStatus(
        job_id=job_id,
        state=state,  # type: ignore[arg-type]
        native=native,
        reason=reason,
        exit_code=exit_code,
    )


def with_stderr(status: JobStatus, tail: str) -> JobStatus:
    """``status`` with the end of the pilot's stderr joined to its reason."""
    return JobStatus(
        job_id=status.job_id,
        state=status.state,
        native=status.native,
        reason="; ".join(t for t in (status.reason, f"stderr: {tail}") if t),
        exit_code=status.exit_code,
    )


def _block_status(job_id: str, fields: Mapping[str, str]) -> JobStatus:
    return final_status(
        job_id, fields.get("State", ""), fields.get("Exit Code", ""), fields.get("Job Error", "")
    )


def parse_arcstat(stdout: str, stderr: str = "") -> StatusReport:
    """Read arcstat's per-job blocks (``Job: ID`` then `` Key: value`` lines), its warnings and
    its summary line. Fields it does not know are ignored."""
    statuses: dict[str, JobStatus] = {}
    current: str | None = None
    fields: dict[str, str] = {}

    def close() -> None:
        if current is not None:
            statuses[current] = _block_status(current, fields)

    for line in stdout.splitlines():
        if line.startswith("Job: "):
            close()
            current, fields = line[5:].strip(), {}
        elif current is not None and line.startswith(" ") and ":" in line:
            key, _, value = line.strip().partition(":")
            fields.setdefault(key.strip(), value.strip())
        elif not line.strip():
            close()
            current, fields = None, {}
    close()
    gone: list[str] = []
    failed: dict[str, str] = {}
    for line in f"{stdout}\n{stderr}".splitlines():
        line = line.strip()
        found = FAILED_JOB_RE.match(line)
        if found:
            job_id, why = found.group(1), (found.group(2) or "").strip()
            if why.startswith("404"):
                gone.append(job_id)
            else:
                failed[job_id] = why or "the CE returned no information"
            continue
        found = NOT_IN_LIST_RE.match(line)
        if found:
            gone.append(found.group(1))
    summary = SUMMARY_RE.search(stdout) or SUMMARY_RE.search(stderr)
    return StatusReport(
        statuses=statuses,
        gone=tuple(dict.fromkeys(gone)),
        failed=failed,
        queried=int(summary.group(1)) if summary else None,
        returned=int(summary.group(2)) if summary else None,
    )


def killed_counts(stdout: str) -> tuple[int, int] | None:
    """(processed, killed) from arckill's summary; None when it printed none ("No jobs")."""
    found = KILLED_RE.search(stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def cleaned_counts(stdout: str) -> tuple[int, int] | None:
    """(processed, deleted) from arcclean's summary; None when it printed none."""
    found = CLEANED_RE.search(stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def not_in_list(text: str) -> list[str]:
    """The ids the client says are not in its job list."""
    return [m.group(1) for m in (NOT_IN_LIST_RE.match(ln.strip()) for ln in text.splitlines()) if m]


# --- xRSL ---------------------------------------------------------------------------------------

#: The pilot's output files, as both interfaces name them in its description.
STDOUT, STDERR, GMLOG = "pilot.out", "pilot.err", "gmlog"

#: An xRSL attribute name (xRSL names are case-insensitive).
ATTRIBUTE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def xrsl_value(value: str | int | float | Sequence[str | int | float]) -> str:
    """One xRSL value: a quoted string (a quote inside is doubled, as RSL writes it), or a
    sequence of them (``("a" "b")``) for lists such as ``runtimeenvironment``."""
    if isinstance(value, (list, tuple)):
        return " ".join(xrsl_value(v) for v in value)
    text = str(value)
    return '"' + text.replace('"', '""') + '"'


def xrsl(attributes: Sequence[tuple[str, str | int | float | Sequence[str | int | float]]]) -> str:
    """A job description ``&(name=value)...`` from (name, value) pairs, in order. A list value
    whose items are themselves lists (``inputfiles``) becomes one parenthesised pair per item."""
    parts = []
    for name, value in attributes:
        if not ATTRIBUTE_RE.fullmatch(name):
            raise ValueError(f"{name!r} is not an xRSL attribute name")
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple)):
            inner = " ".join(f"({xrsl_value(item)})" for item in value)
            parts.append(f"({name}={inner})")
        else:
            parts.append(f"({name}={xrsl_value(value)})")
    return "&" + "\n ".join(parts) + "\n"
