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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gridgate.core.model import CancelResult, CommandResult, Endpoint, JobStatus, StatusResult
from gridgate.plugins.lsf_proxy.commands import COMMANDS

__all__ = [
    "BJOBS_STATUS_FORMAT",
    "STATES",
    "normalise",
    "parse_status_rows",
    "parse_bkill",
    "query_pilots",
    "cancel_pilots",
]

OPERATION_STATUS = "Job Status"
OPERATION_CANCEL = "Job Cancel"
BJOBS_STATUS_FORMAT = "jobid stat exec_host exit_code exit_reason delimiter='^'"
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
#: A live state wins over a finished one when an array shows several rows under one id.
_RANK = {"running": 0, "waiting": 1, "unknown": 2, "done": 3, "failed": 4}
NOT_FOUND_RE = re.compile(r"Job <([0-9]+(?:\[[0-9]+\])?)> is not found")
JOB_ID_RE = re.compile(r"[0-9]+(?:\[[0-9]+\])?")
_TERMINATED_RE = re.compile(r"Job <([0-9]+(?:\[[0-9]+\])?)> is being terminated")
_FINISHED_RE = re.compile(r"Job <([0-9]+(?:\[[0-9]+\])?)>: Job has already finished")
_NO_MATCH_RE = re.compile(
    r"Job <([0-9]+(?:\[[0-9]+\])?)>: No matching job found|"
    r"Job <([0-9]+(?:\[[0-9]+\])?)> is not found"
)


@dataclass(frozen=True)
class Row:
    """One job as ``bjobs`` printed it."""

    job_id: str
    stat: str
    exec_host: str = ""
    exit_code: int | None = None
    reason: str = ""


def _value(text: str) -> str:
    text = text.strip()
    return "" if text == "-" else text


def _row_custom(line: str) -> Row | None:
    parts = line.strip().split("^", 4)
    if len(parts) < 2 or not JOB_ID_RE.fullmatch(parts[0]) or parts[1] not in STATES:
        return None
    parts += [""] * (5 - len(parts))
    code = _value(parts[3])
    return Row(
        parts[0],
        parts[1],
        _value(parts[2]),
        int(code) if re.fullmatch(r"[0-9]{1,5}", code) else None,
        _value(parts[4]),
    )


def _row_table(line: str) -> Row | None:
    # JOBID USER STAT QUEUE FROM_HOST EXEC_HOST JOB_NAME SUBMIT_TIME: the first three never
    # are blank, EXEC_HOST may be '-' or blank for pending jobs.
    words = line.split()
    if len(words) < 3 or not JOB_ID_RE.fullmatch(words[0]) or words[2] not in STATES:
        return None
    exec_host = (
        _value(words[5]) if len(words) >= 9 and words[2] not in ("PEND", "PSUSP", "WAIT") else ""
    )
    return Row(words[0], words[2], exec_host)


def parse_status_rows(stdout: str, table: bool = False) -> dict[str, Row]:
    """Rows by id of either ``bjobs`` output; junk lines and the header are skipped. An id
    with several rows (a job array) keeps its liveliest one. Never raises."""
    rows: dict[str, Row] = {}
    parse = _row_table if table else _row_custom
    for line in (stdout if isinstance(stdout, str) else "").splitlines():
        row = parse(line)
        if row is None:
            continue
        known = rows.get(row.job_id)
        if known is None or _RANK[STATES[row.stat]] < _RANK[STATES[known.stat]]:
            rows[row.job_id] = row
    return rows


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


@dataclass(frozen=True)
class KillOutput:
    """``bkill`` per id: being terminated, already finished, unknown."""

    terminated: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    seen: frozenset[str] = field(default_factory=frozenset)


def parse_bkill(stdout: str, stderr: str = "") -> KillOutput:
    text = (
        f"{stdout if isinstance(stdout, str) else ''}\n{stderr if isinstance(stderr, str) else ''}"
    )
    terminated = tuple(dict.fromkeys(_TERMINATED_RE.findall(text)))
    finished = tuple(dict.fromkeys(_FINISHED_RE.findall(text)))
    unknown = tuple(dict.fromkeys(a or b for a, b in _NO_MATCH_RE.findall(text)))
    return KillOutput(terminated, finished, unknown, frozenset((*terminated, *finished, *unknown)))


# --- the backend's hooks ----------------------------------------------------------------------------


def _bad_ids(ids: Sequence[str]) -> list[str]:
    return [j for j in ids if not JOB_ID_RE.fullmatch(j)]


def _daemon_trouble(backend_module: Any, command: CommandResult) -> bool:
    return backend_module.classify(command).kind != "error"


def query_pilots(
    backend: Any, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
) -> StatusResult:
    """``gridgate_job_status`` of the LSF backend: ``bjobs`` for every id, under ``query``
    tokens, all commands within ``timeout``."""
    from gridgate.core.runner import argv_chunks
    from gridgate.plugins.lsf_proxy.director import backend as module

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
    table = backend.config.get("status_format", "custom") == "table"
    prefix = (
        [backend.program("bjobs"), "-aw"]
        if table
        else [backend.program("bjobs"), "-a", "-noheader", "-o", BJOBS_STATUS_FORMAT]
    )
    deadline = backend.deadline(timeout)
    statuses: dict[str, JobStatus] = {}
    commands = 0
    last: CommandResult | None = None
    for argv in argv_chunks(prefix, ids):
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
        missing = NOT_FOUND_RE.findall(outcome.stderr)
        answered = outcome.ok or (
            outcome.returncode == 255 and bool(missing) and not _daemon_trouble(module, outcome)
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
        statuses.update(
            (job_id, _status(row))
            for job_id, row in parse_status_rows(outcome.stdout, table).items()
        )
    return StatusResult(
        endpoint,
        ok=True,
        statuses=statuses,
        command=last,
        commands=commands,
        operation=OPERATION_STATUS,
    )


def bkill_command(backend: Any) -> str:
    """``commands.bkill``, else ``bkill`` beside a ``bjobs`` given as a path, else on PATH."""
    configured = (backend.config.get("commands") or {}).get("bkill")
    folder = os.path.dirname(backend.program("bjobs"))
    return str(configured or (os.path.join(folder, "bkill") if folder else "bkill"))


def cancel_pilots(
    backend: Any, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
) -> CancelResult:
    """``gridgate_cancel`` of the LSF backend: ``bkill`` under ``other`` tokens. Only ids being
    terminated are cancelled: one that had already finished, or that LSF does not know, is
    left out (the next poll records how it really ended: ``bjobs -a`` still shows it); exit
    255 is an answer as long as every id got its line."""
    from gridgate.core.runner import argv_chunks
    from gridgate.plugins.lsf_proxy.director import backend as module

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
    for argv in argv_chunks([bkill_command(backend)], ids):
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
        parsed = parse_bkill(outcome.stdout, outcome.stderr)
        cancelled += [j for j in argv[1:] if j in parsed.terminated]
        finished += [j for j in argv[1:] if j in parsed.finished and j not in parsed.terminated]
        unknown += [j for j in argv[1:] if j in parsed.unknown]
        answered = outcome.ok or (
            outcome.returncode == 255
            and parsed.seen >= set(argv[1:])
            and not _daemon_trouble(module, outcome)
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
