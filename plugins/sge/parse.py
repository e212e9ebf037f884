"""Reading what Grid Engine's commands print: ``qsub -terse``, ``qstat -g d`` (with ``-r``,
the full job names), ``qstat -j``, ``qacct -j`` and ``qdel``, into job ids and core's pilot
states, and a job's name and owner (:func:`job_owner`: where its output goes); ``qstat -g c``
into each cluster queue's slots.

Every format here is the one SGE 8.1.9 (Debian's gridengine packages) prints; docs/sge.md
quotes the real outputs, and tests/plugins/sge/test_sge_parse.py holds them as captured on the
private cell. A pilot's id is the job number (``41``) or, for a task of an array job, the job
number and the task (``41.2``), the form ``qstat -g d``, ``qacct`` and ``qdel`` all take.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import msgspec

from gridgate.core.documents import DocumentError, ascii_int, convert
from gridgate.core.model import JobStatus

__all__ = [
    "JOB_ID_RE",
    "QUEUE_NAME_RE",
    "ClusterQueue",
    "QueueLimits",
    "parse_cluster_queues",
    "parse_queue_limits",
    "sge_seconds",
    "pending_per_queue",
    "NamedJob",
    "QdelAnswer",
    "job_number",
    "job_owner",
    "parse_qacct",
    "parse_named_qstat",
    "parse_qdel",
    "parse_qstat",
    "parse_qstat_errors",
    "parse_terse",
    "state_of",
]

#: A cluster queue's name as qstat -g c prints it.
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
#: A pilot's id: a job number, or ``number.task`` for a task of an array job.
JOB_ID_RE = re.compile(r"([0-9]+)(?:\.([0-9]+))?")
#: ``qsub -terse``: ``41`` for a job, ``41.1-3:1`` for an array job (first-last:step).
TERSE_RE = re.compile(r"([0-9]+)(?:\.([0-9]+)-([0-9]+):([0-9]+))?")
#: A job line of ``qstat`` (reduced format): the job number, the priority, then words.
QSTAT_LINE_RE = re.compile(r"\s*([0-9]+)\s+[0-9.]+\s+(.*)")
#: A submit/start date and time as qstat prints them (``12/02/2024 04:50:12``).
DATE_TIME_RE = re.compile(r"[0-9]{2}/[0-9]{2}/[0-9]{4}\s+[0-9]{2}:[0-9]{2}:[0-9]{2}")


def job_number(job_id: str) -> str:
    """``41`` for ``41.2`` (an array task) and for ``41``."""
    return job_id.split(".", 1)[0]


#: The most array tasks one ``qsub -terse`` answer may name (the schema's largest
#: ``pilots_per_submission``): a range past it is not expanded.
MAX_ARRAY_TASKS = 10_000


def parse_terse(stdout: str, max_tasks: int = MAX_ARRAY_TASKS) -> tuple[str, list[int]] | None:
    """(job number, task ids) from ``qsub -terse``; task ids empty for a job that is no array.

    None when no line is a job id (``qsub`` printed something else).

    :raises ValueError: for an array range of more than ``max_tasks`` tasks (``41.1-4000000000:1``
        from a broken or hostile qsub), counted without expanding it.
    """
    for line in stdout.splitlines():
        found = TERSE_RE.fullmatch(line.strip())
        if found is None:
            continue
        number, first, last, step = found.groups()
        if first is None:
            return number, []
        tasks = range(int(first), int(last) + 1, max(int(step), 1))
        if len(tasks) > max_tasks:  # len() of a range is arithmetic: nothing is expanded
            raise ValueError(
                f"qsub answered an array of {len(tasks)} tasks ({line.strip()[:60]}), more "
                f"than the {max_tasks} asked for: not read as pilots"
            )
        return number, list(tasks)
    return None


def state_of(native: str) -> str:
    """Core's pilot state for a qstat state code (sge_status(5)).

    ``E`` anywhere (``Eqw``, ``Ehqw``) is failed: the job cannot start until an administrator
    clears it. ``d`` (being deleted) is cancelled. Suspended ones (``s``, ``S``, ``T``) still
    hold their slot: running, as are ``r``, ``t`` and restarted ``R``. Pending ones (``qw``,
    held ``hqw``, re-queued ``Rq``) are waiting; ``z`` (finished, only with ``-s z``) done.
    """
    code = native.strip()
    if not code:
        return "unknown"
    if "E" in code:
        return "failed"
    if "d" in code:
        return "cancelled"
    if "z" in code:
        return "done"
    if any(c in code for c in "rtsST"):
        return "running"
    if "q" in code or "w" in code or "h" in code:
        return "waiting"
    return "unknown"


def _job_line(line: str) -> JobStatus | None:
    """The job or array task of one ``qstat`` job line, None for a line of another shape.

    A job line is ``job-ID prior name user state date time [queue] slots [ja-task-ID]``: the
    queue is there only for a running job and the task only for an array task, so the words
    after the date are read from the end: the task is the last word when two follow the
    queue, or when a word follows the slots of a pending job.
    """
    found = QSTAT_LINE_RE.fullmatch(line.rstrip())
    if found is None:
        return None
    number, rest = found.groups()
    when = DATE_TIME_RE.search(rest)
    if when is None:
        return None
    before = rest[: when.start()].split()
    after = rest[when.end() :].split()
    if len(before) < 3 or not after:
        return None
    native = before[-1]  # name and user come first; a name has no blanks
    queue = after[0] if "@" in after[0] else ""
    tail = after[1:] if queue else after
    task = tail[1] if len(tail) > 1 else ""
    pilot = f"{number}.{task}" if task.isdigit() else number
    return JobStatus(
        job_id=pilot,
        state=state_of(native),  # type: ignore[arg-type]
        native=native,
        reason=f"in {queue}" if queue else "",
    )


def parse_qstat(stdout: str) -> dict[str, JobStatus]:
    """Every job or array task ``qstat -g d`` lists, by pilot id (``41``, ``41.2``); the
    header, the dashes and lines of any other shape are skipped."""
    statuses: dict[str, JobStatus] = {}
    for line in stdout.splitlines():
        status = _job_line(line)
        if status is not None:
            statuses[status.job_id] = status
    return statuses


@dataclass(frozen=True)
class NamedJob:
    """A job (or array task) of ``qstat -r``: its full name, the queues it asked for
    (``-q``), its status."""

    name: str
    queues: tuple[str, ...]
    status: JobStatus


#: The ``qstat -r`` lines below a job line that are read.
_FULL_NAME, _QUEUES = "Full jobname:", "Hard requested queues:"


def parse_named_qstat(stdout: str) -> list[NamedJob]:
    """Every job or array task of ``qstat -g d -r``, each with the name in full (the job
    line cuts it at 10 characters; the ``Full jobname:`` line below holds it whole) and its
    ``Hard requested queues:``. A job line without a full name below it is left out: what
    it was named cannot be told."""
    jobs: list[NamedJob] = []
    current: JobStatus | None = None
    name, queues = "", ""

    def close() -> None:
        if current is not None and name:
            asked = tuple(q.strip() for q in queues.split(",") if q.strip())
            jobs.append(NamedJob(name, asked, current))

    for line in stdout.splitlines():
        status = _job_line(line)
        if status is not None:
            close()
            current, name, queues = status, "", ""
            continue
        text = line.strip()
        if current is None:
            continue
        if text.startswith(_FULL_NAME):
            name = text[len(_FULL_NAME) :].strip()
        elif text.startswith(_QUEUES):
            queues = text[len(_QUEUES) :]
    close()
    return jobs


def parse_qstat_errors(stdout: str) -> dict[str, str]:
    """Pilot id -> why it is in E state, from ``qstat -j 41,42``.

    One block per job, starting ``job_number:  41``; a job in E state has one ``error reason
    N:  <date> <time> [uid:pid]: <why>`` line per task (N the task; for a job that is no
    array, 1). The reason is ``<why>``: ``error: can't chdir to /x: No such file or directory``.
    """
    reasons: dict[str, str] = {}
    current = ""
    array = False
    for line in stdout.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "job_number":
            current, array = value.strip(), False
        elif key == "job-array tasks":
            array = True
        elif current and (found := ERROR_REASON_RE.fullmatch(line.strip())):
            task, why = found.groups()
            reasons[f"{current}.{task}" if array else current] = " ".join(why.split())
    return reasons


#: ``error reason    1:      12/02/2026 04:42:44 [1000:20436]: error: can't chdir to /x: ...``
ERROR_REASON_RE = re.compile(
    r"error reason\s+([0-9]+):\s+(?:[0-9/]+\s+[0-9:]+\s+)?(?:\[[0-9:]+\]:\s*)?(.*)"
)


def parse_qacct(stdout: str) -> dict[str, JobStatus]:
    """The finished jobs and tasks ``qacct -j`` reports, by pilot id, each done or failed.

    One record per job or task that ran, after a line of ``=``; each line is a key and a
    value. ``taskid`` is ``undefined`` for a job that is no array. A record whose ``failed``
    is not 0 is failed (the code and its text: ``100 : assumedly after job``, a job killed,
    by qdel too: ``exit_status 137 (Killed)``), as is one whose ``exit_status`` is not 0.
    SGE 8.1.9 records no ``deleted_by``, and a job deleted while pending has no record at all.
    When a job ran more than once (re-queued), the last record wins.
    """
    statuses: dict[str, JobStatus] = {}
    for record in _records(stdout):
        number = record.jobnumber
        if not number.isdigit():
            continue
        task = record.taskid
        pilot = f"{number}.{task}" if task.isdigit() else number
        statuses[pilot] = _finished(pilot, record)
    return statuses


class _QacctRecord(msgspec.Struct):
    """The keys of a ``qacct -j`` record that are read (the others are left out)."""

    jobnumber: str = ""
    taskid: str = "undefined"
    failed: str = "0"
    exit_status: str = ""


def _records(stdout: str) -> Iterable[_QacctRecord]:
    for record in _lines(stdout):
        yield convert(record, _QacctRecord, kind="qacct -j record")


def _lines(stdout: str) -> Iterable[Mapping[str, str]]:
    record: dict[str, str] = {}
    for line in stdout.splitlines():
        if line.startswith("====="):
            if record:
                yield record
            record = {}
            continue
        key, _, value = line.partition(" ")
        if key:
            record[key] = value.strip()
    if record:
        yield record


def _finished(pilot: str, record: _QacctRecord) -> JobStatus:
    failed = record.failed.strip()
    code_text = failed.split(":", 1)[0].strip()
    code = int(code_text) if code_text.isdigit() else -1
    exit_text = record.exit_status.split()[:1]
    exit_code = int(exit_text[0]) if exit_text and exit_text[0].isdigit() else None
    native = " ".join(f"failed {failed}, exit_status {record.exit_status or '?'}".split())
    if code != 0:
        return JobStatus(pilot, "failed", native, f"failed {failed}", exit_code)
    if exit_code != 0:
        return JobStatus(pilot, "failed", native, f"exit status {exit_code}", exit_code)
    return JobStatus(pilot, "done", native, "", exit_code)


def job_owner(stdout: str, listing: str) -> tuple[str, str] | None:
    """(job name, owner) of the first job of a ``qstat -j`` answer (``listing`` ``qstat``) or
    the last record of a ``qacct -j`` answer (``qacct``: a re-queued job's last run); None when
    it names neither."""
    if listing == "qstat":
        fields: dict[str, str] = {}
        for line in stdout.splitlines():
            if line.startswith("=====") and fields:
                break
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("job_name", "owner") and key == key.strip():
                fields.setdefault(key, value.strip())
        name, owner = fields.get("job_name") or "", fields.get("owner") or ""
    else:
        records = list(_lines(stdout))
        last = records[-1] if records else {}
        name, owner = last.get("jobname") or "", last.get("owner") or ""
    return (name, owner) if name and owner else None


@dataclass(frozen=True)
class QdelAnswer:
    """What ``qdel`` said of each id: deleted (or being deleted), or not there (finished)."""

    deleted: tuple[str, ...]
    absent: tuple[str, ...]


#: ``root has registered the job 41 for deletion`` (running), ``root has deleted job 41``
#: (pending); for array tasks ``... job-array task 41.2 ...``.
QDEL_DONE_RE = re.compile(
    r"has (?:registered the job(?:-array task)?|deleted job(?:-array task)?) "
    r"([0-9]+(?:\.[0-9]+)?)\b"
)
#: ``denied: job "99" does not exist``; for a task: ``job "2" task "2" does not exist``
QDEL_ABSENT_RE = re.compile(r'job "([0-9]+)"(?: task "([0-9]+)")? does not exist')


def parse_qdel(text: str) -> QdelAnswer:
    """Which ids ``qdel`` deleted and which it found absent, from what it printed."""
    deleted = [m.group(1) for m in QDEL_DONE_RE.finditer(text)]
    absent = [
        f"{m.group(1)}.{m.group(2)}" if m.group(2) else m.group(1)
        for m in QDEL_ABSENT_RE.finditer(text)
    ]
    return QdelAnswer(tuple(dict.fromkeys(deleted)), tuple(dict.fromkeys(absent)))


@dataclass(frozen=True)
class ClusterQueue:
    """One row of ``qstat -g c``: the slots of a cluster queue used, available and in all, and
    those of its instances that take no job (``cdsuE``: disabled, suspended, unknown, in
    error, or their calendar's)."""

    used: int
    available: int
    total: int
    unusable: int


_CQ_KIND = "qstat -g c output"
#: the columns of ``qstat -g c`` that are read (SGE 8.1.9 also prints RES, older ones not)
_CQ_NEEDED = ("USED", "AVAIL", "TOTAL", "cdsuE")
_CQ_MOST = 10**9


def parse_cluster_queues(stdout: str) -> dict[str, ClusterQueue]:
    """``qstat -g c``: cluster queue -> its slots. The columns are found by the header's names.

    :raises DocumentError: no header of that form, a row of other length, a slot count that
        is not digits."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    if header[:2] != ["CLUSTER", "QUEUE"] or not all(c in header for c in _CQ_NEEDED):
        raise DocumentError(_CQ_KIND, f"header {lines[0][:120]!r} is not qstat -g c's")
    columns = header[2:]
    found: dict[str, ClusterQueue] = {}
    for number, line in enumerate(lines[1:], 2):
        if set(line.strip()) == {"-"}:
            continue
        words = line.split()
        where = f"{_CQ_KIND}, line {number}"
        if len(words) != 1 + len(columns) or not QUEUE_NAME_RE.fullmatch(words[0]):
            raise DocumentError(where, f"{line[:120]!r} is not a cluster queue's row")
        row = dict(zip(columns, words[1:], strict=True))
        counts = {c: ascii_int(row[c], kind=f"{where}: {c}", maximum=_CQ_MOST) for c in _CQ_NEEDED}
        found[words[0]] = ClusterQueue(
            used=counts["USED"],
            available=counts["AVAIL"],
            total=counts["TOTAL"],
            unusable=counts["cdsuE"],
        )
    return found


def pending_per_queue(jobs: Iterable[NamedJob], queues: Iterable[str]) -> dict[str, int]:
    """Of the pending jobs of ``qstat -u * -s p -g d -r`` (:func:`parse_named_qstat`), how
    many each of ``queues`` may take: those that asked for it (``-q q`` or ``q@host``) and
    those that asked for no queue (any queue may take them)."""
    counts = dict.fromkeys(queues, 0)
    for job in jobs:
        asked = {q.split("@", 1)[0] for q in job.queues}
        for queue in counts:
            if not asked or queue in asked:
                counts[queue] += 1
    return counts


@dataclass(frozen=True)
class QueueLimits:
    """What ``qconf -sq`` says a cluster queue allows a job: ``h_rt`` in seconds and the
    ``slots`` of an instance (a pilot's cores land on one host with ``$pe_slots``); the
    largest over the queue's value and its host overrides (``4,[vm=2]``), None for
    ``INFINITY``."""

    walltime: int | None
    slots: int | None


_SQ_KIND = "qconf -sq output"
_SGE_TIME_RE = re.compile(r"(?:(?:([0-9]{1,7}):)?([0-9]{1,7}):)?([0-9]{1,9})")


def sge_seconds(text: str, *, kind: str) -> int | None:
    """An SGE time (``[[hours:]minutes:]seconds``) in seconds; None for INFINITY.

    :raises DocumentError: any other text."""
    if text.upper() == "INFINITY":
        return None
    found = _SGE_TIME_RE.fullmatch(text)
    if found is None:
        raise DocumentError(kind, f"time {text[:40]!r} is not an SGE time")
    hours, minutes, seconds = (int(p) if p else 0 for p in found.groups())
    return (hours * 60 + minutes) * 60 + seconds


def _largest(value: str, read: Callable[[str], int | None]) -> int | None:
    """The largest of a queue attribute's value and its host overrides; None when one is
    INFINITY (read gives None)."""
    found: list[int] = []
    for item in value.split(","):
        item = item.strip()
        if item.startswith("[") and item.endswith("]") and "=" in item:
            item = item[1:-1].split("=", 1)[1]
        figure = read(item)
        if figure is None:
            return None
        found.append(figure)
    return max(found) if found else None


def parse_queue_limits(stdout: str) -> dict[str, QueueLimits]:
    """``qconf -sq q1,q2,...``: cluster queue -> its limits (long values continued on the next
    line after a ``\\`` are joined first).

    :raises DocumentError: a block without ``qname``, an ``h_rt`` or ``slots`` qconf does not
        write."""
    joined = re.sub(r"\\\n\s*", "", stdout)
    found: dict[str, QueueLimits] = {}
    block: dict[str, str] = {}

    def close() -> None:
        if not block:
            return
        name = block["qname"] if "qname" in block else ""
        if not QUEUE_NAME_RE.fullmatch(name):
            raise DocumentError(_SQ_KIND, f"a queue's block names no queue ({name[:40]!r})")
        where = f"{_SQ_KIND}, queue {name}"
        found[name] = QueueLimits(
            walltime=_largest(
                block["h_rt"] if "h_rt" in block else "INFINITY",
                lambda t: sge_seconds(t, kind=f"{where}: h_rt"),
            ),
            slots=_largest(
                block["slots"] if "slots" in block else "INFINITY",
                lambda t: (
                    None
                    if t.upper() == "INFINITY"
                    else ascii_int(t, kind=f"{where}: slots", maximum=_CQ_MOST)
                ),
            ),
        )

    for line in joined.splitlines():
        key, _, value = line.strip().partition(" ")
        if not key:
            continue
        if key == "qname":
            close()
            block = {}
        block[key] = value.strip()
    close()
    return found
