"""The Slurm documents gridgate reads, each decoded here once into typed values; past these
functions nothing looks at the text again:

- the backend's commands: ``sbatch --parsable``, ``squeue -h -r -o '%i %T %r'`` and
  ``scancel --verbose`` (job ids that the next command would take, core's pilot states);
- what the token daemon reads of the controller: ``sdiag``'s report (its stamps, gauges and
  the two RPC tables) and slurmctld's log lines of the requests it received
  (``DebugFlags=Protocol``).

sdiag's tables are fixed-width rows read by sdiag's own formats (``src/sdiag/sdiag.c``), never
split on blanks: a user name of 16 characters or more fills its ``%-16s`` column and leaves no
blank before its ``(uid)``, and is still that user's row.
"""

from __future__ import annotations

import pwd
import re
from datetime import datetime

from gridgate.core.documents import DocumentError, ascii_int, printf_fields
from gridgate.core.model import JobStatus, RpcCount, SchedulerRequest, SchedulerRPCs
from gridgate.core.patterns import clip

__all__ = [
    "JOB_ID_RE",
    "PER_TYPE_ROW",
    "PER_USER_ROW",
    "STATE_MAP",
    "parse_parsable",
    "parse_protocol_lines",
    "parse_sdiag",
    "parse_squeue",
    "pilot_state",
    "refused_ids",
]

#: sdiag's row of the table by message type: the type's name, its number, count, times (us)
PER_TYPE_ROW = "\t%-40s(%5u) count:%-6u ave_time:%-6u total_time:%u"
#: sdiag's row of the table by user: the user's name (or uid), uid, count, times (us)
PER_USER_ROW = "\t%-16s(%8u) count:%-6u ave_time:%-6u total_time:%u"
#: the tables, by the header line that starts each, with the format of their rows
_TABLES = {
    "Remote Procedure Call statistics by message type": ("type", PER_TYPE_ROW),
    "Remote Procedure Call statistics by user": ("user", PER_USER_ROW),
}
_KIND = "sdiag output"
#: counters are 32-bit, total times 64-bit in sdiag
_MOST = 2**64

_STAMP = re.compile(r"^(sdiag output at|Data since)\s.*\(([0-9]+)\)\s*$")
_GAUGES = {
    "Server thread count": "server_threads",
    "Agent queue size": "agent_queue",
    "Agent count": "agents",
    "DBD Agent queue size": "dbd_agent_queue",
}


def parse_sdiag(text: str) -> SchedulerRPCs:
    """``sdiag``'s output as counters: the stamps, the gauges, the two RPC tables (times in
    sdiag's microseconds, kept in milliseconds). An output without its stamps or tables, or
    with a row of a table not in sdiag's format, is not ok: it is not sdiag's (a wrapper, a
    changed format)."""
    try:
        return _sdiag(text)
    except DocumentError as exc:
        return SchedulerRPCs("slurm", ok=False, message=f"not sdiag's output: {exc.problem}")


def _sdiag(text: str) -> SchedulerRPCs:
    stamps: dict[str, float] = {}
    load: dict[str, float] = {}
    tables: dict[str, dict[str, RpcCount]] = {"type": {}, "user": {}}
    table, row_format = "", ""
    for line in text.splitlines():
        stamp = _STAMP.match(line)
        if stamp:
            stamps[stamp.group(1)] = float(ascii_int(stamp.group(2), kind=_KIND, maximum=_MOST))
            continue
        if line.rstrip() in _TABLES:
            table, row_format = _TABLES[line.rstrip()]
            continue
        if not line.strip():
            continue
        if not line[0].isspace():
            table = ""
            key, _, value = line.partition(":")
            if key.strip() in _GAUGES and value.strip().isascii() and value.strip().isdigit():
                load[_GAUGES[key.strip()]] = float(value)
            continue
        if table:
            name, _number, count, _average, total = printf_fields(line, row_format, kind=_KIND)
            tables[table][name] = RpcCount(
                ascii_int(count, kind=_KIND, maximum=_MOST),
                ascii_int(total, kind=_KIND, maximum=_MOST) / 1000.0,
            )
    if "Data since" not in stamps or "server_threads" not in load:
        raise DocumentError(_KIND, repr(clip(text.strip())))
    return SchedulerRPCs(
        "slurm",
        ok=True,
        taken=stamps.get("sdiag output at") or 0.0,
        since=stamps["Data since"],
        by_user={user: row.count for user, row in tables["user"].items()},
        by_type=tables["type"],
        load=load,
    )


#: One request as slurmctld logs it with ``DebugFlags=Protocol``.
_REQUEST = re.compile(
    r"^\[([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?)\] slurmctld_req: "
    r"received opcode (\S+) from (\S+) uid ([0-9]{1,10})\s*$"
)


def parse_protocol_lines(text: str) -> list[SchedulerRequest]:
    """The requests among slurmctld's log lines (``[2026-12-03T13:37:05.743] slurmctld_req:
    received opcode REQUEST_JOB_INFO from 127.0.0.1:35678 uid 65534``): the time (the log's
    local time), the user (the uid's name, or the uid when it has none), the opcode and the
    host address without its port. Other lines are the log's other messages: skipped."""
    out: list[SchedulerRequest] = []
    names: dict[int, str] = {}
    for line in text.splitlines():
        found = _REQUEST.match(line)
        if not found:
            continue
        stamp, opcode, source, uid_text = found.groups()
        try:
            at = datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            continue
        uid = int(uid_text)
        if uid not in names:
            try:
                names[uid] = pwd.getpwuid(uid).pw_name
            except (KeyError, OverflowError):
                names[uid] = str(uid)
        if source.startswith("[") and "]" in source:  # [::1]:35692
            host = source[1 : source.index("]")]
        else:
            host = source.rsplit(":", 1)[0] if source.count(":") == 1 else source
        out.append(SchedulerRequest(at, names[uid], opcode, host))
    return out


#: ``sbatch --parsable``: ``JOBID`` or ``JOBID;CLUSTER`` (the latter with ``--clusters``).
PARSABLE_RE = re.compile(r"([0-9]+)(?:;([A-Za-z0-9_.-]+))?")
#: Job ids as squeue and scancel take them: plain, array task ``<base>_<idx>``.
JOB_ID_RE = re.compile(r"[0-9]+(?:_[0-9]+)?")
#: What ``scancel --verbose`` prints for an id it did not cancel (exit 0 all the same): plain
#: scancel says nothing for a job already finished or unknown, verbose names each one.
KILL_ERROR_RE = re.compile(r"Kill job error on job id ([0-9]+(?:_[0-9]+)?): (.*)$", re.M)
#: Slurm's long job states (squeue %T) in core's pilot states; formats.md's Slurm section.
STATE_MAP: dict[str, str] = {
    **dict.fromkeys(
        ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"),
        "waiting",
    ),
    **dict.fromkeys(
        ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "SUSPENDED", "STOPPED"),
        "running",
    ),
    "COMPLETED": "done",
    **dict.fromkeys(
        (
            "FAILED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "BOOT_FAIL",
            "DEADLINE",
            "PREEMPTED",
            "SPECIAL_EXIT",
        ),
        "failed",
    ),
}


def pilot_state(native: str) -> str:
    """Core's state for a Slurm state text (``CANCELLED by 0`` and ``CANCELLED+`` included)."""
    text = native.strip().upper()
    if text.startswith("CANCELLED"):
        return "cancelled"
    return STATE_MAP.get(text.split()[0] if text else "", "unknown")


def refused_ids(stderr: str) -> dict[str, str]:
    """The ids ``scancel --verbose`` says it did not cancel (it exits 0 all the same), each
    with what it said."""
    return {job_id: why.strip() for job_id, why in KILL_ERROR_RE.findall(stderr)}


def parse_parsable(stdout: str) -> tuple[str, str] | None:
    """(job id, cluster) from ``sbatch --parsable`` output; None when there is no such line."""
    for line in stdout.splitlines():
        found = PARSABLE_RE.fullmatch(line.strip())
        if found:
            return found.group(1), found.group(2) or ""
    return None


def parse_squeue(stdout: str) -> dict[str, JobStatus]:
    """Read ``squeue -h -r -o '%i %T %r'`` lines (others, like ``CLUSTER: c2``, are skipped)."""
    statuses: dict[str, JobStatus] = {}
    for line in stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 2 or not JOB_ID_RE.fullmatch(parts[0]):
            continue
        reason = parts[2].strip() if len(parts) > 2 else ""
        statuses[parts[0]] = JobStatus(
            job_id=parts[0],
            state=pilot_state(parts[1]),  # type: ignore[arg-type]
            native=parts[1],
            reason="" if reason == "None" else reason,
        )
    return statuses
