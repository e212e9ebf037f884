"""The pilot states of the ARC client's and A-REX's words, a final pilot's status from them, and
the xRSL the backend writes (what the client prints is read in :mod:`.documents`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from gridgate.core.model import JobStatus

#: arcstat's ``State:`` names in core's pilot states (issue 20; formats in arc.md section 4).
#: ``Finished`` depends on the exit code and is decided in :func:`pilot_state`.
STATE_MAP: dict[str, str] = {
    **dict.fromkeys(("accepted", "preparing", "submitting", "queuing", "hold"), "waiting"),
    **dict.fromkeys(("running", "finishing"), "running"),
    "failed": "failed",
    "killed": "cancelled",
    **dict.fromkeys(("deleted", "undefined", "other"), "unknown"),
}


def pilot_state(native: str, exit_code: int | None) -> str:
    """Core's state for arcstat's ``State:`` text and ``Exit Code:`` (None when not printed)."""
    name = native.strip().lower()
    if name == "finished":
        return "done" if exit_code in (0, None) else "failed"
    return STATE_MAP.get(name, "unknown")


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
    exit_code = int(code_text) if re.fullmatch(r"-?[0-9]{1,10}", code_text) else None
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
