"""The Slurm documents gridgate reads, each decoded here once into typed values; past these
functions nothing looks at the text again:

- the backend's commands: ``sbatch --parsable``, ``squeue -h -r -o '%i %T %r'``, the
  listing by name (:data:`FIND_FORMAT`), ``scancel --verbose`` (job ids that the next
  command would take, core's pilot states) and ``scontrol -o show job`` (where a job's
  stdout and stderr go);
- what the token daemon reads of the controller: ``sdiag``'s report (its stamps, gauges and
  the two RPC tables), slurmctld's log lines of the requests it received
  (``DebugFlags=Protocol``), ``scontrol``'s partitions and config, and the scheduler plugin's
  own record files read back.

sdiag's tables are fixed-width rows read by sdiag's own formats (``src/sdiag/sdiag.c``), never
split on blanks: a user name of 16 characters or more fills its ``%-16s`` column and leaves no
blank before its ``(uid)``, and is still that user's row.
"""

from __future__ import annotations

import pwd
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import msgspec

from gridgate.core.documents import DocumentError, ascii_int, convert, decode_json, printf_fields
from gridgate.core.model import JobStatus
from gridgate.core.patterns import clip
from gridgate.core.scheduler import RpcCount, SchedulerRequest, SchedulerRPCs

__all__ = [
    "FIND_FORMAT",
    "JOB_ID_RE",
    "PARTITION_STATES",
    "QUEUE_FORMAT",
    "SINFO_FORMAT",
    "PartitionCpus",
    "PartitionLimits",
    "parse_partitions",
    "parse_queue_counts",
    "parse_sinfo_cpus",
    "slurm_seconds",
    "PER_TYPE_ROW",
    "PER_USER_ROW",
    "STATE_MAP",
    "OldDenial",
    "SlurmConfig",
    "TraceCursor",
    "old_denials",
    "parse_parsable",
    "parse_protocol_lines",
    "parse_named_jobs",
    "output_paths",
    "parse_sdiag",
    "parse_squeue",
    "partition_groups",
    "pilot_state",
    "refused_ids",
    "slurm_config",
    "trace_cursor",
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


#: A record of slurmctld's log: its time stamp (``LogTimeFormat=iso8601_ms``), then its text.
_RECORD = re.compile(
    r"^\[([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?)\] (.*)$"
)
#: One request as slurmctld logs it with ``DebugFlags=Protocol``.
_REQUEST = re.compile(r"^slurmctld_req: received opcode (\S+) from (\S+) uid ([0-9]{1,10})\s*$")


def _records(text: str) -> list[tuple[float, str] | None]:
    """Each line of the log as (time, text) where it starts as slurmctld starts a record;
    None for any other line (the rest of a message that held a newline)."""
    out: list[tuple[float, str] | None] = []
    for line in text.splitlines():
        found = _RECORD.match(line)
        try:
            out.append((datetime.fromisoformat(found[1]).timestamp(), found[2]) if found else None)
        except ValueError:
            out.append(None)
    return out


def parse_protocol_lines(text: str) -> list[SchedulerRequest]:
    """The requests among slurmctld's log lines (``[2026-12-03T13:37:05.743] slurmctld_req:
    received opcode REQUEST_JOB_INFO from 127.0.0.1:35678 uid 65534``): the time (the log's
    local time), the user (the uid's name, or the uid when it has none), the opcode and the
    host address without its port. Other lines are the log's other messages: skipped.

    A message of slurmctld may carry a user's text with newlines in it (``sbatch -p NAME``
    logs NAME as given), and so lines shaped like records. slurmctld writes its records one
    after another, each stamped when written: a request line is taken only where it is in
    that order, its time neither before the record above it nor after the record below it,
    and not right after a line that is not a record (the rest of a message that held a
    newline). A forged line must then also guess slurmctld's clock to the millisecond; what
    the trace can prove is in docs/proxyd-limits.md."""
    out: list[SchedulerRequest] = []
    names: dict[int, str] = {}
    records = _records(text)
    last = float("-inf")  # the time of the last record found in place
    for index, record in enumerate(records):
        if record is None:
            continue
        at, message = record
        if not _in_place(records, index, at, last):
            continue
        last = at
        found = _REQUEST.match(message)
        if not found:
            continue
        opcode, source, uid_text = found.groups()
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


#: ``squeue -o`` of the listing by name: id, long state, reason, then the job name in full
#: (a field without a width is never cut), tab-separated; the name comes last, so that a name
#: holding a tab is still read whole.
FIND_FORMAT = "%i\t%T\t%r\t%j"


def parse_named_jobs(stdout: str) -> list[tuple[str, JobStatus]]:
    """(job name, status) of every line of ``squeue -h -r -o FIND_FORMAT`` (others, like
    ``CLUSTER: c2``, are skipped): the same ids and states as :func:`parse_squeue`."""
    jobs: list[tuple[str, JobStatus]] = []
    for line in stdout.splitlines():
        parts = line.split("\t", 3)
        if len(parts) < 4 or not JOB_ID_RE.fullmatch(parts[0]):
            continue
        job_id, native, reason, name = parts
        jobs.append(
            (
                name,
                JobStatus(
                    job_id=job_id,
                    state=pilot_state(native),  # type: ignore[arg-type]
                    native=native,
                    reason="" if reason.strip() == "None" else reason.strip(),
                ),
            )
        )
    return jobs


#: One ``Key=value`` of ``scontrol -o show job``: the value runs to the next `` Key=`` (a path
#: holding a blank is read whole; one holding `` Word=`` would be cut there, as Slurm prints it).
_SHOW_FIELD = re.compile(r"(?:^| )([A-Za-z][A-Za-z0-9_:/]*)=(.*?)(?= [A-Za-z][A-Za-z0-9_:/]*=|$)")
#: scontrol's keys of the streams, by core's stream names
OUTPUT_KEYS = {"stdout": "StdOut", "stderr": "StdErr"}


def output_paths(stdout: str) -> dict[str, str]:
    """``{"stdout": path, "stderr": path}`` from ``scontrol -o show job ID``'s first record
    (Slurm expands ``%j``, ``%A``, ``%x``... in them; a record without them gives ``{}``)."""
    for line in stdout.splitlines():
        fields = dict(_SHOW_FIELD.findall(line.rstrip()))
        if "JobId" not in fields:
            continue
        return {
            stream: fields[key]
            for stream, key in OUTPUT_KEYS.items()
            if fields.get(key) not in (None, "", "(null)")
        }
    return {}


#: how many lines below a record are looked at for the next one in order
_LOOKAHEAD = 64


def _in_place(records: list[tuple[float, str] | None], index: int, at: float, last: float) -> bool:
    """Whether the record at ``index`` (stamped ``at``) is where slurmctld would have written
    it: right after a record (or at the start), no earlier than ``last`` (the last record in
    place), and no later than the next record that is itself not before ``last`` (a line out
    of order below it cannot push it out)."""
    if index > 0 and records[index - 1] is None:
        return False
    if at < last:
        return False
    for below in records[index + 1 : index + 1 + _LOOKAHEAD]:
        if below is not None and below[0] >= last:
            return at <= below[0]
    return True


# --- scontrol's answers ----------------------------------------------------------------------


def partition_groups(text: str) -> dict[str, str]:
    """``scontrol -o show partition``'s output (one partition a line, ``Key=Value`` fields):
    partition -> its ``AllowGroups`` exactly as shown (``ALL`` when the line has none)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "PartitionName" in fields:
            groups = fields["AllowGroups"] if "AllowGroups" in fields else "ALL"
            found[fields["PartitionName"]] = groups
    return found


@dataclass(frozen=True)
class SlurmConfig:
    """What the plugin reads of ``scontrol show config``: slurmctld's log file ("" when it
    logs to syslog) and its DebugFlags, lower case."""

    log_file: str
    debug_flags: tuple[str, ...]


def slurm_config(text: str) -> SlurmConfig:
    """``scontrol show config``'s ``Key = Value`` lines, read for the log file and flags."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip()] = value.strip()
    log = found.get("SlurmctldLogFile") or ""
    flags = (found.get("DebugFlags") or "").split(",")
    return SlurmConfig(
        "" if log == "(null)" else log, tuple(f.strip().lower() for f in flags if f.strip())
    )


# --- the plugin's own record files, read back ---------------------------------------------------


class TraceCursor(msgspec.Struct, frozen=True, omit_defaults=True):
    """The request trace in force: slurmctld's log, its inode and how far it was read
    (``had_protocol``: only in the files of versions before the journal)."""

    log: Annotated[str, msgspec.Meta(min_length=1)]
    inode: Annotated[int, msgspec.Meta(ge=0)]
    offset: Annotated[int, msgspec.Meta(ge=0)]
    had_protocol: bool | None = None


def trace_cursor(text: str | bytes) -> TraceCursor:
    """The trace record file. :raises DocumentError: not one."""
    return decode_json(text, TraceCursor, kind="request trace record")


class OldDenial(msgspec.Struct, frozen=True):
    """One partition a denial changed, as versions before the journal kept it."""

    before: str
    set: str
    removed: list[str] = []


def old_denials(text: str | bytes) -> dict[str, dict[str, OldDenial]]:
    """The denials file of versions before the journal (user -> partition -> what was
    changed); entries not of that shape are dropped. :raises DocumentError: not JSON."""
    kind = "denials record"
    data: dict[str, Any] = decode_json(text, dict[str, Any], kind=kind)
    out: dict[str, dict[str, OldDenial]] = {}
    for user, partitions in data.items():
        if not isinstance(partitions, dict):
            continue
        kept: dict[str, OldDenial] = {}
        for partition, record in partitions.items():
            try:
                kept[str(partition)] = convert(record, OldDenial, kind=kind)
            except DocumentError:
                continue
        out[user] = kept
    return out


# --- what a partition says of itself (gridgate_endpoint_state) ------------------------------

#: ``sinfo -h -a -o`` of the partitions' CPUs: name, CPUs allocated/idle/other/total, CPUs per
#: node, memory per node (MB); sinfo prints one line per partition and node shape.
SINFO_FORMAT = "%R|%C|%c|%m"
#: ``squeue -h -a -r -t PENDING,RUNNING -o`` of every user's jobs: partitions, compact state.
QUEUE_FORMAT = "%P|%t"
#: scontrol's partition state -> the serving state (GLUE2's words): DOWN takes jobs and starts
#: none, DRAIN takes none and runs those it has, INACTIVE takes none and starts none.
PARTITION_STATES = {
    "UP": "production",
    "DOWN": "queueing",
    "DRAIN": "draining",
    "INACTIVE": "closed",
}
_PARTITIONS = "scontrol -o show partition output"
_SINFO = "sinfo output"
_SQUEUE = "squeue output"
#: a count no real partition reaches (cores, jobs, MB of memory per node)
_MOST_COUNT = 10**9
_TIME_RE = re.compile(r"(?:(\d{1,5})-)?(\d{1,6})(?::(\d{1,2}))?(?::(\d{1,2}))?")
_NO_LIMIT = ("UNLIMITED", "INFINITE")
#: a partition's name as the backend accepts it in ``partitions``
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class PartitionLimits:
    """What ``scontrol -o show partition`` says of one partition: its ``State`` and limits
    (None: UNLIMITED): MaxTime in seconds, MaxMemPerNode and MaxMemPerCPU in MB,
    MaxCPUsPerNode."""

    state: str
    max_time: int | None
    max_memory_mb: int | None
    max_memory_per_cpu_mb: int | None
    max_cpus: int | None


def slurm_seconds(text: str, *, kind: str) -> int | None:
    """A Slurm time limit in seconds (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``); None for UNLIMITED / INFINITE.

    :raises DocumentError: any other text."""
    if text.upper() in _NO_LIMIT:
        return None
    found = _TIME_RE.fullmatch(text)
    if found is None:
        raise DocumentError(kind, f"time limit {text[:40]!r} is not a Slurm time")
    days, first, second, third = found.groups()
    parts = [int(first)] + [int(p) for p in (second, third) if p is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:  # MM
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def _limit(fields: dict[str, str], key: str, kind: str) -> int | None:
    if key not in fields:
        return None
    value = fields[key]
    if value.upper() in _NO_LIMIT or value == "0":
        return None
    return ascii_int(value, kind=f"{kind}: {key}", maximum=_MOST_COUNT)


def _cluster_line(line: str) -> bool:
    """Whether ``line`` is blank or the ``CLUSTER: name`` header of ``--clusters`` output."""
    return not line.strip() or line.startswith("CLUSTER: ")


def parse_partitions(text: str) -> dict[str, PartitionLimits]:
    """``scontrol -o show partition``: partition -> its state and limits.

    :raises DocumentError: a line that is no partition's, a state or limit Slurm does not
        write."""
    found: dict[str, PartitionLimits] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if _cluster_line(line):
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        name = fields["PartitionName"] if "PartitionName" in fields else ""
        where = f"{_PARTITIONS}, line {number}"
        if not NAME_RE.fullmatch(name):
            raise DocumentError(where, f"{clip(line, 80)!r} names no partition")
        state = fields["State"] if "State" in fields else ""
        if state not in PARTITION_STATES:
            raise DocumentError(
                where,
                f"partition {name}: State={state[:40]!r} is not one of "
                f"{', '.join(PARTITION_STATES)}",
            )
        found[name] = PartitionLimits(
            state=state,
            max_time=slurm_seconds(fields["MaxTime"], kind=where) if "MaxTime" in fields else None,
            max_memory_mb=_limit(fields, "MaxMemPerNode", where),
            max_memory_per_cpu_mb=_limit(fields, "MaxMemPerCPU", where),
            max_cpus=_limit(fields, "MaxCPUsPerNode", where),
        )
    return found


@dataclass(frozen=True)
class PartitionCpus:
    """What sinfo says of a partition's nodes: idle CPUs, and the largest node's CPUs and
    memory (MB)."""

    idle: int
    node_cpus: int
    node_memory_mb: int


def _node_figure(text: str, kind: str) -> int:
    # sinfo writes "2+" when the nodes of one line differ: at least that many
    return ascii_int(text[:-1] if text.endswith("+") else text, kind=kind, maximum=_MOST_COUNT)


def parse_sinfo_cpus(text: str) -> dict[str, PartitionCpus]:
    """``sinfo -h -a -o SINFO_FORMAT``: partition -> its CPUs (the lines of one partition
    summed, its idle CPUs, its largest node's CPUs and memory).

    :raises DocumentError: a line not of that form."""
    found: dict[str, PartitionCpus] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if _cluster_line(line):
            continue
        where = f"{_SINFO}, line {number}"
        parts = line.strip().split("|")
        if len(parts) != 4 or not NAME_RE.fullmatch(parts[0].rstrip("*")):
            raise DocumentError(where, f"{clip(line, 80)!r} is not of the form {SINFO_FORMAT!r}")
        name = parts[0].rstrip("*")  # sinfo marks the default partition with *
        counts = parts[1].split("/")
        if len(counts) != 4:
            raise DocumentError(where, f"CPUs {parts[1][:40]!r} are not allocated/idle/other/total")
        idle = ascii_int(counts[1], kind=f"{where}: idle CPUs", maximum=_MOST_COUNT)
        cpus = _node_figure(parts[2], f"{where}: CPUs per node")
        memory = _node_figure(parts[3], f"{where}: memory per node")
        before = found.get(name)
        if before is not None:
            idle += before.idle
            cpus = max(cpus, before.node_cpus)
            memory = max(memory, before.node_memory_mb)
        found[name] = PartitionCpus(idle=idle, node_cpus=cpus, node_memory_mb=memory)
    return found


def parse_queue_counts(text: str) -> dict[str, tuple[int, int]]:
    """``squeue -h -a -r -t PENDING,RUNNING -o QUEUE_FORMAT``: partition -> (pending, running)
    jobs of every user (a job pending in several partitions counts in each).

    :raises DocumentError: a line not of that form, a state other than PD or R."""
    counts: dict[str, tuple[int, int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if _cluster_line(line):
            continue
        where = f"{_SQUEUE}, line {number}"
        partitions, sep, state = line.strip().partition("|")
        names = partitions.split(",")
        if not sep or not all(NAME_RE.fullmatch(n) for n in names):
            raise DocumentError(where, f"{clip(line, 80)!r} is not of the form {QUEUE_FORMAT!r}")
        if state not in ("PD", "R"):
            raise DocumentError(where, f"job state {state[:20]!r} is neither PD nor R")
        for name in names:
            pending, running = counts.get(name, (0, 0))
            counts[name] = (pending + (state == "PD"), running + (state == "R"))
    return counts
