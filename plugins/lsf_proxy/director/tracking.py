"""Pilot tracking on LSF: ``bjobs`` in bulk (one command per queue and poll, split only when
the argv would grow too long) and ``bkill``, read as formats.md quotes them.

Two ``bjobs`` outputs are read: the custom format (LSF 9.1 and later)
``bjobs -a -noheader -o "jobid stat exec_host exit_code exit_reason delimiter='^'" <ids>``,
which gives ``1234^EXIT^hostA^1^TERM_RUNLIMIT: ...`` (an empty value prints ``-``), and the
classic table of ``bjobs -aw <ids>`` (``status_format: table``, for clusters whose ``bjobs``
has neither ``-o`` nor ``-noheader``). An id LSF no longer knows (finished longer ago than
``CLEAN_PERIOD``) gives ``Job <N> is not found`` on stderr and exit 255, with the rows of the
other ids on stdout: that is an answer, and the id is simply left out.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping, Sequence
from typing import Any

from gridgate.core import runner
from gridgate.core.backend import found_pilots
from gridgate.core.model import (
    CancelResult,
    CommandResult,
    Endpoint,
    FoundPilots,
    JobStatus,
    StatusResult,
)
from gridgate.plugins.lsf_proxy.commands import COMMANDS
from gridgate.plugins.lsf_proxy.director.failures import daemon_trouble
from gridgate.plugins.lsf_proxy.documents import (
    JOB_ID_RE,
    NO_JOB_RE,
    KillOutput,
    Row,
    bjobs_not_found,
    bkill_output,
    named_rows,
    named_status_rows,
    status_rows,
)

__all__ = [
    "BJOBS_NAMED_FORMAT",
    "BJOBS_STATUS_FORMAT",
    "STATES",
    "KillOutput",
    "Row",
    "normalise",
    "parse_status_rows",
    "parse_bkill",
    "query_pilots",
    "cancel_pilots",
    "find_pilots",
]

OPERATION_STATUS = "Job Status"
OPERATION_CANCEL = "Job Cancel"
OPERATION_FIND = "Job Find"
BJOBS_STATUS_FORMAT = "jobid stat exec_host exit_code exit_reason delimiter='^'"
#: the same with the job name, where an array element's index is (``NAME[k]``): for finding
#: pilots by name, and for polling array elements (``1234[k]``), whose JOBID is the array's
BJOBS_NAMED_FORMAT = "jobid job_name stat exec_host exit_code exit_reason delimiter='^'"
#: LSF STAT -> core state (formats.md, "What the states mean to a pilot factory").
STATES: Mapping[str, str] = {
    "PEND": "waiting",
    "PROV": "waiting",
    "PSUSP": "waiting",
    "WAIT": "waiting",
    "RUN": "running",
    "USUSP": "running",
    "SSUSP": "running",
    "DONE": "done",
    "EXIT": "failed",
    "UNKWN": "unknown",
    "ZOMBI": "unknown",
}
#: The boundary's readers, by the names the tests and older callers know.
parse_status_rows = status_rows
parse_bkill = bkill_output


def normalise(stat: str) -> str:
    return STATES.get(stat.strip().upper(), "unknown")


def _status(row: Row) -> JobStatus:
    code = 0 if row.stat == "DONE" and row.exit_code is None else row.exit_code
    return JobStatus(
        row.job_id,
        normalise(row.stat),  # type: ignore[arg-type]
        native=row.stat,
        reason=row.reason,
        exit_code=code,
    )


# --- the backend's hooks ----------------------------------------------------------------------------


def _bad_ids(ids: Sequence[str]) -> list[str]:
    return [j for j in ids if not JOB_ID_RE.fullmatch(j)]


def query_pilots(
    backend: Any, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
) -> StatusResult:
    """``gridgate_job_status`` of the LSF backend: ``bjobs`` for every id, under ``query``
    tokens, all commands within ``timeout``."""
    ids = list(dict.fromkeys(str(j) for j in job_ids))
    if not ids:
        return StatusResult(endpoint, ok=True, commands=0, operation=OPERATION_STATUS)
    bad = _bad_ids(ids)
    if bad:
        return StatusResult(
            endpoint,
            ok=False,
            commands=0,
            operation=OPERATION_STATUS,
            message=f"not LSF job ids: {bad[:5]}",
        )
    table = backend.settings.status_format == "table"
    elements = any("[" in j for j in ids)
    prefix = (
        [backend.program("bjobs"), "-aw"]
        if table
        else [
            backend.program("bjobs"),
            "-a",
            "-noheader",
            "-o",
            BJOBS_NAMED_FORMAT if elements else BJOBS_STATUS_FORMAT,
        ]
    )
    deadline = backend.deadline(timeout)
    statuses: dict[str, JobStatus] = {}
    commands = 0
    last: CommandResult | None = None
    for argv in runner.argv_chunks(prefix, ids):
        outcome = backend.run_with_token(argv, COMMANDS["bjobs"].category, deadline)
        commands += 1
        if isinstance(outcome, str):
            return StatusResult(
                endpoint,
                ok=False,
                commands=commands,
                command=last,
                operation=OPERATION_STATUS,
                message=outcome,
            )
        last = outcome
        if outcome.stdout_truncated:  # ids past the cut would look unknown, then lost
            return StatusResult(
                endpoint,
                ok=False,
                commands=commands,
                command=outcome,
                operation=OPERATION_STATUS,
                message="bjobs output passed director.max_output_bytes and was cut",
            )
        missing = bjobs_not_found(outcome.stderr)
        answered = outcome.ok or (
            outcome.returncode == 255 and bool(missing) and not daemon_trouble(outcome)
        )
        if not answered:
            return StatusResult(
                endpoint,
                ok=False,
                commands=commands,
                command=outcome,
                operation=OPERATION_STATUS,
                message=outcome.describe(),
            )
        rows = (named_status_rows if elements else status_rows)(outcome.stdout, table)
        statuses.update(
            (job_id, _status(row)) for job_id, row in rows.items() if job_id in argv[len(prefix) :]
        )
    return StatusResult(
        endpoint,
        ok=True,
        statuses=statuses,
        command=last,
        commands=commands,
        operation=OPERATION_STATUS,
    )


def lsf_user() -> str:
    """The user whose jobs the backend submits: the one running ``bsub`` (this process)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def find_pilots(
    backend: Any, endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
) -> FoundPilots:
    """``gridgate_find_pilots`` of the LSF backend: one ``bjobs -a -q <queue> -u <user>`` of
    the user's jobs in the endpoint's queue with their names, under a ``query`` token (``-a``:
    finished jobs LSF still keeps are listed too), matched with
    :func:`gridgate.core.backend.found_pilots`; an array's elements each on their own, as
    ``1234[k]`` (the ids :func:`query_pilots` takes)."""
    if not names and not fleet:
        return FoundPilots(endpoint, ok=True, operation=OPERATION_FIND)
    table = backend.settings.status_format == "table"
    which = ["-q", endpoint.name, "-u", lsf_user()]
    argv = (
        [backend.program("bjobs"), "-aw", *which]
        if table
        else [backend.program("bjobs"), "-a", *which, "-noheader", "-o", BJOBS_NAMED_FORMAT]
    )
    outcome = backend.run_with_token(argv, COMMANDS["bjobs"].category, backend.deadline(timeout))
    if isinstance(outcome, str):
        return FoundPilots(endpoint, ok=False, operation=OPERATION_FIND, message=outcome)
    if outcome.stdout_truncated:  # jobs past the cut would be given up as never made
        return FoundPilots(
            endpoint,
            ok=False,
            command=outcome,
            operation=OPERATION_FIND,
            message="bjobs output passed director.max_output_bytes and was cut",
        )
    # "No job found" is an answer whichever exit code the cluster's bjobs gives it
    nothing = bool(NO_JOB_RE.search(outcome.stderr)) and not daemon_trouble(outcome)
    if not (outcome.ok or nothing) or outcome.timed_out:
        return FoundPilots(
            endpoint,
            ok=False,
            command=outcome,
            operation=OPERATION_FIND,
            message=outcome.describe(),
        )
    jobs = [(n.name, _status(n.row)) for n in named_rows(outcome.stdout, table)]
    return found_pilots(endpoint, backend.settings.job_name, names, fleet, jobs, outcome)


def bkill_command(backend: Any) -> str:
    """``commands.bkill``, else ``bkill`` beside a ``bjobs`` given as a path, else on PATH."""
    configured = backend.settings.commands.bkill
    folder = os.path.dirname(backend.program("bjobs"))
    return str(configured or (os.path.join(folder, "bkill") if folder else "bkill"))


def cancel_pilots(
    backend: Any, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
) -> CancelResult:
    """``gridgate_cancel`` of the LSF backend: ``bkill`` under ``other`` tokens. Only ids being
    terminated are cancelled: one that had already finished, or that LSF does not know, is
    left out (the next poll records how it really ended: ``bjobs -a`` still shows it); exit
    255 is an answer as long as every id got its line."""
    ids = list(dict.fromkeys(str(j) for j in job_ids))
    if not ids:
        return CancelResult(endpoint, ok=True, operation=OPERATION_CANCEL)
    bad = _bad_ids(ids)
    if bad:
        return CancelResult(
            endpoint, ok=False, operation=OPERATION_CANCEL, message=f"not LSF job ids: {bad[:5]}"
        )
    deadline = backend.deadline(timeout)
    cancelled: list[str] = []
    finished: list[str] = []
    unknown: list[str] = []
    last: CommandResult | None = None
    for argv in runner.argv_chunks([bkill_command(backend)], ids):
        outcome = backend.run_with_token(argv, COMMANDS["bkill"].category, deadline)
        if isinstance(outcome, str):
            return CancelResult(
                endpoint,
                ok=False,
                cancelled=tuple(cancelled),
                command=last,
                operation=OPERATION_CANCEL,
                message=outcome,
            )
        last = outcome
        parsed = bkill_output(outcome.stdout, outcome.stderr)
        cancelled += [j for j in argv[1:] if j in parsed.terminated]
        finished += [j for j in argv[1:] if j in parsed.finished and j not in parsed.terminated]
        unknown += [j for j in argv[1:] if j in parsed.unknown]
        answered = outcome.ok or (
            outcome.returncode == 255
            and parsed.seen >= set(argv[1:])
            and not daemon_trouble(outcome)
        )
        if not answered:
            return CancelResult(
                endpoint,
                ok=False,
                cancelled=tuple(cancelled),
                command=outcome,
                operation=OPERATION_CANCEL,
                message=outcome.describe(),
            )
    left = [f"{len(finished)} had already finished"] if finished else []
    left += [f"{len(unknown)} unknown to LSF"] if unknown else []
    return CancelResult(
        endpoint,
        ok=True,
        cancelled=tuple(cancelled),
        command=last,
        operation=OPERATION_CANCEL,
        message=f"not cancelled: {', '.join(left)}" if left else "",
    )
