"""The Grid Engine backend: submits pilots with ``qsub -terse``, tracks them with one ``qstat``
per poll and ``qacct -j`` for the jobs that have left it, and cancels them with ``qdel``.

Each configured queue (a cluster queue of the cell that ``SGE_ROOT``/``SGE_CELL`` name) is an
endpoint. It is written only against gridgate's public plugin API (docs/plugins.md), as a
site's own backend would be. Failures are read from Grid Engine's own messages
(:mod:`.classify`), its outputs by :mod:`.parse`. One qmaster serves every queue of a cell: once
one queue found it unreachable (or found that the cell refuses this user or host), the other
queues fail at once in that iteration with the same evidence instead of asking again. A
pilot's stdout and stderr are read where qsub's options put them (:mod:`.output`), on the file
system the director shares with the execution hosts.
"""

from __future__ import annotations

import math
import pwd
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gridgate.core import hookimpl
from gridgate.core.backend import (
    NOT_TRIED,
    Backend,
    Deadline,
    Outages,
    command_timeout_schema,
    commands_schema,
    env_schema,
    file_output,
    found_pilots,
    job_name,
    not_tried,
)
from gridgate.core.endpoint_state import EndpointState
from gridgate.core.model import (
    CancelResult,
    CommandResult,
    Endpoint,
    Failure,
    FoundPilots,
    IterationInfo,
    IterationSummary,
    JobStatus,
    OutputStream,
    PilotOutput,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import ConfigProblems, PluginContext
from gridgate.core.runner import argv_chunks
from gridgate.core.settings import Settings, settings_from
from gridgate.plugins.sge.classify import cell_wide, classify, clip
from gridgate.plugins.sge.output import output_options, output_path
from gridgate.plugins.sge.parse import (
    JOB_ID_RE,
    job_number,
    job_owner,
    parse_named_qstat,
    parse_qacct,
    parse_qdel,
    parse_qstat,
    parse_qstat_errors,
    parse_terse,
)
from gridgate.plugins.sge.queues import CellStates

OPERATION_SUBMIT = "Job Submit"
#: A cluster queue name as the configuration may give it (fullmatch: no trailing newline).
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: A job name qsub -N takes (sge_types(5): no blanks, none of ``/ : @ \ * ?``, no leading digit).
JOB_NAME_RE = re.compile(r"[A-Za-z_][^\s/:@\\*?]*")
#: A resource name for -l, a parallel environment name for -pe.
RESOURCE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
#: Options the backend writes itself; ``qsub_options`` may not carry them.
OWNED_OPTIONS: dict[str, str] = {
    "-terse": "the backend reads the job id from -terse",
    "-q": "the queue comes from queues",
    "-N": "job_name names the job",
    "-t": "pilots_per_submission makes the array job",
    "-pe": "resources.cores is written as -pe <resources.parallel_environment> N",
    "-sync": "qsub would wait for the job to end, and be killed at command_timeout",
    "-clear": "it would discard the options the backend writes before it",
    "-@": "an option file may carry any option, those the backend writes too",
    "-verify": "qsub would print the job instead of submitting it",
    "-w": "validation sets it",
}
#: How many jobs in E state one poll asks ``qstat -j`` for their reason.
ERROR_REASONS_PER_POLL = 20
COMMANDS = (
    ("qsub", "submit"),
    ("qstat", "status"),
    ("qacct", "accounting (finished jobs)"),
    ("qdel", "cancel"),
    ("qconf", "queue limits"),
)


def sge_memory(megabytes: int) -> str:
    """A memory value in Grid Engine's words: ``700M`` (``M`` is 1024 * 1024 bytes)."""
    return f"{megabytes}M"


def resource_options(request: SubmitRequest, settings: SgeResourceSettings) -> list[str]:
    """The qsub options of ``request.resources``: ``-pe <pe> N`` for N > 1 cores and one
    ``-l`` with the memory (per slot unless ``memory_per_slot`` is false: h_vmem and s_vmem
    are limits per slot, multiplied by the slots) and the walltime in seconds (``h_rt``)."""
    resources = request.resources
    if resources is None:
        return []
    options: list[str] = []
    if resources.cores != 1:
        options += ["-pe", settings.parallel_environment, str(resources.cores)]
    asked: list[str] = []
    if resources.memory_mb is not None:
        per_slot = settings.memory_per_slot
        megabytes = (
            math.ceil(resources.memory_mb / resources.cores) if per_slot else resources.memory_mb
        )
        asked.append(f"{settings.memory}={sge_memory(megabytes)}")
    if resources.walltime is not None:
        asked.append(f"{settings.walltime}={resources.walltime}")
    if asked:
        options += ["-l", ",".join(asked)]
    return options


def owned_option(words: Sequence[str], index: int, settings: SgeResourceSettings) -> str | None:
    """Why ``qsub_options[index]`` may not be given (the backend writes it), or None.

    qsub takes options as whole words with their value in the next word (``-q``, ``all.q``),
    so words are compared whole. ``-l`` is refused only when its list names the memory or
    walltime resource the backend writes for a demand group's resources."""
    word = str(words[index])
    if word in OWNED_OPTIONS:
        return f"{word} is written by the backend ({OWNED_OPTIONS[word]})"
    value = str(words[index + 1]) if index + 1 < len(words) else ""
    if word == "-l":
        mine = {settings.memory, settings.walltime}
        named = {item.split("=", 1)[0].strip() for item in value.split(",")}
        taken = sorted(named & mine)
        if taken:
            return (
                f"-l {','.join(taken)} is written by the backend (a demand group's "
                "resources.memory_mb / resources.walltime; see backends.sge.resources)"
            )
    return None


#: Why a tracked pilot id of no Grid Engine job id's form is not asked about (its status:
#: unknown).
ODD_ID = "not a Grid Engine job id: it was never sent to Grid Engine"


def _checked_ids(job_ids: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ids of a Grid Engine job id's form, and the others: an id reaches an argv, so only
    the form qsub printed is passed on, and an odd one is that pilot's problem alone, never the
    whole queue's poll or cancel (issue 40 item 4, round 5)."""
    ids = [str(j) for j in job_ids]
    return [j for j in ids if JOB_ID_RE.fullmatch(j)], [
        j for j in ids if not JOB_ID_RE.fullmatch(j)
    ]


SGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Grid Engine backend: cluster queues (one endpoint each), the pilot "
    "script, qsub options, how resources are asked.",
    "properties": {
        "queues": {
            "type": "array",
            "default": [],
            "items": {"type": "string", "minLength": 1},
            "description": "Cluster queues to submit to (qsub -q); each is an endpoint. "
            "The cell is the one SGE_ROOT and SGE_CELL name (env).",
        },
        "script": {
            "type": "string",
            "default": "",
            "x-gridgate-path": True,
            "description": "The pilot job script qsub submits (a path on this machine; "
            "its #$ lines apply).",
        },
        "job_name": {
            "type": "string",
            "minLength": 1,
            "default": "gridgate-pilot",
            "description": "qsub -N; a submission of the director's is named "
            "`<job_name>-<its name>` (an array's tasks share it), which finds its jobs "
            "again after a crash.",
        },
        "qsub_options": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "More qsub arguments, each one argv item, an option's value "
            'its own item (e.g. ["-o", "/dev/null", "-j", "y", "-P", "atlas"]). '
            "Options the backend writes itself (-terse, -q, -N, -w, -t, -pe, and -l of "
            "the memory and walltime resources) are refused, as are -sync, -clear, -@ "
            "and -verify.",
        },
        "validation": {
            "enum": ["e", "w", "n"],
            "default": "e",
            "description": "qsub -w: `e` refuses a job that no instance of the queue can "
            "ever run (its access list bars the user, more slots than it has, a limit "
            "below the request): kind usage, at once; `n` (Grid Engine's own default) "
            "queues it to wait forever; `w` queues it with a warning.",
        },
        "pilots_per_submission": {
            "type": "integer",
            "minimum": 1,
            "maximum": 10000,
            "default": 1,
            "description": "Pilots per qsub; > 1 submits an array job (-t 1-N), one "
            "job id per pilot (`<job>.<task>`).",
        },
        "resources": {
            "type": "object",
            "default": {},
            "additionalProperties": False,
            "description": "How a demand group's resources are asked of this cell.",
            "properties": {
                "parallel_environment": {
                    "type": "string",
                    "minLength": 1,
                    "default": "smp",
                    "description": "The parallel environment of -pe for cores > 1 (one "
                    "with allocation_rule $pe_slots keeps a pilot on one host).",
                },
                "memory": {
                    "type": "string",
                    "minLength": 1,
                    "default": "h_vmem",
                    "description": "The resource of -l that carries memory_mb "
                    "(h_vmem, s_vmem, mem_free, or the site's own consumable).",
                },
                "memory_per_slot": {
                    "type": "boolean",
                    "default": True,
                    "description": "Whether the memory resource counts per slot "
                    "(h_vmem and consumables of type YES do: memory_mb is divided by "
                    "the cores, rounded up); false for a JOB consumable.",
                },
                "walltime": {
                    "type": "string",
                    "minLength": 1,
                    "default": "h_rt",
                    "description": "The resource of -l that carries the walltime (seconds).",
                },
            },
        },
        "qacct_per_poll": {
            "type": "integer",
            "minimum": 0,
            "maximum": 10000,
            "default": 20,
            "description": "Most qacct -j calls one status poll makes, one per job that "
            "has left qstat (oldest first; each call reads the whole accounting file). "
            "The others are looked up at the next polls; 0: none (finished jobs go "
            "unknown, then lost).",
        },
        "commands": commands_schema(
            "Names (looked up on PATH) or paths of the Grid Engine commands.", COMMANDS
        ),
        "queue_state_interval": {
            "type": ["number", "null"],
            "minimum": 0,
            "maximum": 3600,
            "default": 10,
            "description": "Seconds one read of the cell (qstat -g c, and every user's "
            "pending jobs) answers for all its queues: what each says of itself (pending "
            "jobs, used and free slots, disabled; docs/sge.md). null: the queues say nothing.",
        },
        "command_timeout": command_timeout_schema(
            "Seconds; replaces the director's limit for these commands when set. One "
            "poll's qstat, qstat -j and qacct calls share it."
        ),
        "env": env_schema(
            "Extra environment variables for the commands (SGE_ROOT and SGE_CELL of "
            "a cell other than the machine's default)."
        ),
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class SgeResourceSettings(Settings):
    """``resources``: how a demand group's resources are asked of Grid Engine."""

    parallel_environment: str
    memory: str
    memory_per_slot: bool
    walltime: str


@dataclass(frozen=True)
class SgeSettings(Settings):
    """The ``sge`` backend's section (:data:`SGE_SCHEMA`; defaults from there)."""

    section_schema: ClassVar[dict[str, Any]] = SGE_SCHEMA

    queues: tuple[str, ...]
    script: str
    job_name: str
    qsub_options: tuple[str, ...]
    validation: str
    pilots_per_submission: int
    resources: SgeResourceSettings
    qacct_per_poll: int
    commands: Mapping[str, str]
    command_timeout: float | None
    env: Mapping[str, str]
    queue_state_interval: float | None


class SgeBackend(Backend):
    """Submits pilots to Grid Engine queues; polls and cancels them."""

    name = "sge"
    expresses = ("cores", "memory_mb", "walltime")
    #: the config key that lists the endpoints: a section without any is a config error
    endpoints_key = "queues"

    config_schema: ClassVar[dict[str, Any]] = SGE_SCHEMA
    settings_class = SgeSettings
    settings: SgeSettings

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> ConfigProblems:
        problems: ConfigProblems = list(super().config_errors(section))
        typed = settings_from(SGE_SCHEMA, section, SgeSettings, validate=False)
        seen: set[str] = set()
        queues = typed.queues
        for index, entry in enumerate(queues):
            if not NAME_RE.fullmatch(str(entry)):
                problems.append(
                    (("queues", index), f"{entry!r} is not a Grid Engine cluster queue name")
                )
            elif entry in seen:
                problems.append((("queues", index), f"queue {entry!r} is listed twice"))
            seen.add(str(entry))
        if queues and not typed.script:
            problems.append((("script",), "a pilot script is needed to submit to the queues"))
        name = typed.job_name
        if not JOB_NAME_RE.fullmatch(name):
            problems.append(
                (
                    ("job_name",),
                    f"{name!r} is not a Grid Engine job name (no blanks, none of / : @ \\ * ?, "
                    "not starting with a digit)",
                )
            )
        settings = typed.resources
        for key in ("parallel_environment", "memory", "walltime"):
            value = getattr(settings, key)
            if not RESOURCE_RE.fullmatch(value):
                problems.append(
                    (("resources", key), f"{value!r} is not a Grid Engine resource name")
                )
        words = typed.qsub_options
        for index in range(len(words)):
            owned = owned_option(words, index, settings)
            if owned is not None:
                problems.append((("qsub_options", index), owned))
        return problems

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._lock = threading.Lock()
        #: the cell, when a queue found it out of reach this iteration
        self._outages = Outages()
        #: this iteration's qstat listing, shared by the polls of every queue (qstat lists the
        #: user's jobs of all of them); only between iteration_started and _finished
        self._listing_lock = threading.Lock()
        self._listing: CommandResult | None = None
        self._sharing = False
        self._programs = {k: v for k, v in self.settings.commands.items() if v}
        interval = self.settings.queue_state_interval
        #: what the cell's queues say of themselves, read once an interval
        self._queues = None if interval is None else CellStates(interval, self.run, self._command)

    # --- helpers ----------------------------------------------------------------------------

    def _command(self, which: str) -> str:
        return self._programs.get(which) or which

    def qsub_argv(self, endpoint: Endpoint, request: SubmitRequest) -> list[str]:
        """The argv of one submission (no shell ever sees it): the backend's options first,
        so that a ``-soft`` in ``qsub_options`` cannot make them soft requests."""
        argv = [
            self._command("qsub"),
            "-terse",
            "-q",
            endpoint.name,
            "-N",
            job_name(self.settings.job_name, request),
            "-w",
            self.settings.validation,
        ]
        if request.count > 1:
            argv += ["-t", f"1-{request.count}"]
        argv += resource_options(request, self.settings.resources)
        argv += self.settings.qsub_options
        argv.append(self.settings.script)
        return argv

    def qstat_argv(self) -> list[str]:
        """One listing of this user's jobs, one line per array task (``-g d``).

        ``-u $user`` (qstat expands ``$user`` itself; no shell) keeps a cell-wide
        ``sge_qstat`` file that says ``-u *`` from listing every user's jobs."""
        return [self._command("qstat"), "-u", "$user", "-g", "d"]

    def _known_unreachable(self) -> tuple[CommandResult, str] | None:
        known = self._outages.found()
        if known is None:
            return None
        found_by, command = known
        return command, (
            f"{NOT_TRIED}queue {found_by} of the same cell found it out of reach this iteration"
        )

    def _note_unreachable(self, endpoint: Endpoint, outcome: CommandResult) -> None:
        """Remember a cell found out of reach (or refusing this user or host) for the rest of
        the iteration. A qsub, qstat or qdel killed at its deadline counts too: each of them
        waits on the qmaster (a stopped one takes connections and answers nothing: qstat
        waited over 120 s), so the other queues would each wait as long."""
        if cell_wide(outcome) or outcome.timed_out:
            self._outages.note(endpoint, outcome)

    # --- hooks ------------------------------------------------------------------------------

    @hookimpl
    def gridgate_iteration_started(self, iteration: IterationInfo) -> None:
        # A cell found out of reach is tried again (by one queue) next iteration; the polls of
        # this iteration share one qstat.
        self._outages.clear()
        with self._lock:
            self._listing, self._sharing = None, True

    @hookimpl
    def gridgate_iteration_finished(self, summary: IterationSummary) -> None:
        with self._lock:
            self._listing, self._sharing = None, False

    def listing(self, deadline: Deadline) -> tuple[CommandResult, bool]:
        """The user's jobs as ``qstat -g d`` lists them, and whether this call ran it.

        Within an iteration the first poll runs it and the polls of the other queues reuse
        its answer (they wait for it: polls run in parallel); outside one (``gridgate pilots``)
        every call runs its own."""
        with self._lock:
            sharing = self._sharing
        if not sharing or not self._listing_lock.acquire(timeout=deadline.left()):
            return self.run(self.qstat_argv(), deadline), True
        try:
            with self._lock:
                shared = self._listing
            if shared is not None:
                return shared, False
            outcome = self.run(self.qstat_argv(), deadline)
            if outcome.ok and not outcome.stdout_truncated:
                with self._lock:
                    if self._sharing:
                        self._listing = outcome
            return outcome, True
        finally:
            self._listing_lock.release()

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        known = self._known_unreachable()
        if known is not None:
            return SubmitResult(
                endpoint, ok=False, command=known[0], operation=OPERATION_SUBMIT, message=known[1]
            )
        outcome = self.run(self.qsub_argv(endpoint, request), self.deadline(timeout))
        try:
            parsed = parse_terse(outcome.stdout, max_tasks=request.count) if outcome.ok else None
        except ValueError as exc:
            return SubmitResult(
                endpoint, ok=False, command=outcome, operation=OPERATION_SUBMIT, message=str(exc)
            )
        if parsed is not None:
            number, tasks = parsed
            ids = tuple(f"{number}.{t}" for t in tasks) if tasks else (number,)
            return SubmitResult(
                endpoint, ok=True, job_ids=ids, command=outcome, operation=OPERATION_SUBMIT
            )
        self._note_unreachable(endpoint, outcome)
        return SubmitResult(
            endpoint,
            ok=False,
            command=outcome,
            operation=OPERATION_SUBMIT,
            message=outcome.describe(),
        )

    def endpoint_state(self, endpoint: Endpoint, timeout: float) -> EndpointState | None:
        if self._queues is None:
            return None
        return self._queues.queue(endpoint.name, self.deadline(timeout).left())

    def find_argv(self) -> list[str]:
        """The qstat argv that lists this user's jobs in every state qstat holds (``-s a``:
        pending, held, running, suspended; a finished job has left it), one line per array
        task (``-g d``), each with its full name and the queue it asked for (``-r``)."""
        return [self._command("qstat"), "-u", "$user", "-s", "a", "-g", "d", "-r"]

    def find_pilots(
        self, endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
    ) -> FoundPilots | None:
        base = self.settings.job_name
        if not names and not fleet:
            return found_pilots(endpoint, base, names, fleet, [])
        known = self._known_unreachable()
        if known is not None:
            return FoundPilots(endpoint, ok=False, command=known[0], message=known[1])
        outcome = self.run(self.find_argv(), self.deadline(timeout))
        if outcome.stdout_truncated and not outcome.timed_out:
            return FoundPilots(
                endpoint,
                ok=False,
                command=outcome,
                message="qstat's output passed director.max_output_bytes",
            )
        if not outcome.ok:
            self._note_unreachable(endpoint, outcome)
            return FoundPilots(endpoint, ok=False, command=outcome, message=outcome.describe())
        # the queue's own jobs only: the backend submits each with -q <queue>, and a job
        # another queue's search also found would be adopted twice
        jobs = [
            (job.name, job.status)
            for job in parse_named_qstat(outcome.stdout)
            if endpoint.name in job.queues
        ]
        return found_pilots(endpoint, base, names, fleet, jobs, command=outcome)

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        failure = classify(result.command, result.message if result.command is None else "")
        return (
            not_tried(failure, result.message) if result.message.startswith(NOT_TRIED) else failure
        )

    def job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        ids, bad = _checked_ids(job_ids)
        odd = {j: JobStatus(job_id=j, state="unknown", reason=ODD_ID) for j in bad}
        if not ids:
            return StatusResult(endpoint, ok=True, statuses=odd, commands=0)
        known = self._known_unreachable()
        if known is not None:
            return StatusResult(endpoint, ok=False, command=known[0], commands=0, message=known[1])
        deadline = self.deadline(timeout)
        listing, ran = self.listing(deadline)
        commands = 1 if ran else 0
        failed = self._failed_poll(endpoint, listing, "qstat", commands)
        if failed is not None:
            return failed
        live = parse_qstat(listing.stdout)
        statuses: dict[str, JobStatus] = {**odd, **{j: live[j] for j in ids if j in live}}
        # jobs in E state: why, in one qstat -j for the first of them
        erred = sorted({job_number(j) for j, s in statuses.items() if s.state == "failed"}, key=int)
        if erred:
            asked = erred[:ERROR_REASONS_PER_POLL]
            detail = self.run([self._command("qstat"), "-j", ",".join(asked)], deadline)
            commands += 1
            # all of them gone since the listing (exit 1, "Following jobs do not exist:"): an
            # answer; they keep the listing's state, the next poll finds them in qacct
            gone = detail.returncode == 1 and "Following jobs do not exist" in detail.stderr
            failed = None if gone else self._failed_poll(endpoint, detail, "qstat -j", commands)
            if failed is not None:
                return failed
            reasons = parse_qstat_errors(detail.stdout)
            for job_id, status in list(statuses.items()):
                why = reasons.get(job_id)
                if status.state == "failed" and why:
                    statuses[job_id] = JobStatus(job_id, "failed", status.native, clip(why))
        # jobs that left qstat: finished (or deleted); qacct -j says how, oldest job first
        departed = sorted({job_number(j) for j in ids if j not in live}, key=int)
        last = listing
        for number in departed[: self.settings.qacct_per_poll]:
            if deadline.passed():
                break
            outcome = self.run([self._command("qacct"), "-j", number], deadline)
            commands += 1
            last = outcome
            absent = outcome.returncode == 1 and "not found" in outcome.stderr
            if (not outcome.ok and not absent) or outcome.stdout_truncated:
                return self._failure(endpoint, outcome, "qacct", commands, qmaster=False)
            for job_id, status in parse_qacct(outcome.stdout).items():
                if job_id in ids and job_id not in live:
                    statuses[job_id] = status
        return StatusResult(endpoint, ok=True, statuses=statuses, command=last, commands=commands)

    def _failed_poll(
        self, endpoint: Endpoint, outcome: CommandResult, what: str, commands: int
    ) -> StatusResult | None:
        """The failed poll a qstat ``outcome`` makes, or None when it answered."""
        if outcome.ok and not outcome.stdout_truncated:
            return None
        return self._failure(endpoint, outcome, what, commands)

    def _failure(
        self,
        endpoint: Endpoint,
        outcome: CommandResult,
        what: str,
        commands: int,
        *,
        qmaster: bool = True,
    ) -> StatusResult:
        """The failed poll ``outcome`` makes: every pilot keeps its state. ``qmaster`` False
        for qacct, which reads the accounting file, not the qmaster."""
        if outcome.stdout_truncated and not outcome.timed_out:
            # gridgate's own cap cut the answer: core names it (kind output_cap) and keeps
            # every pilot's state, rather than the ids past the cut going unknown, then lost
            return StatusResult(
                endpoint,
                ok=False,
                command=outcome,
                commands=commands,
                message=f"{what}'s output passed director.max_output_bytes",
            )
        if qmaster:
            self._note_unreachable(endpoint, outcome)
        return StatusResult(
            endpoint, ok=False, command=outcome, commands=commands, message=outcome.describe()
        )

    def cancel(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> CancelResult | None:
        ids, bad = _checked_ids(job_ids)
        odd = f"{ODD_ID}: {bad[:5]}" if bad else ""
        if not ids:
            return CancelResult(endpoint, ok=True, message=odd)
        known = self._known_unreachable()
        if known is not None:
            return CancelResult(endpoint, ok=False, command=known[0], message=known[1])
        cancelled: list[str] = []
        absent: list[str] = []
        last: CommandResult | None = None
        prefix = [self._command("qdel")]
        deadline = self.deadline(timeout)
        for argv in argv_chunks(prefix, ids):
            outcome = self.run(argv, deadline)
            last = outcome
            answer = parse_qdel(f"{outcome.stdout}\n{outcome.stderr}")
            asked = set(argv[len(prefix) :])
            # an id qdel says does not exist had already finished (or never was): it is not
            # reported cancelled, so the next poll finds how it ended (qacct)
            cancelled += [j for j in answer.deleted if j in asked]
            absent += [j for j in answer.absent if j in asked]
            if outcome.timed_out or (not outcome.ok and not answer.deleted and not answer.absent):
                self._note_unreachable(endpoint, outcome)
                return CancelResult(
                    endpoint,
                    ok=False,
                    cancelled=tuple(cancelled),
                    command=outcome,
                    message=outcome.describe(),
                )
        gone = (
            f"{len(absent)} no longer in the cell (finished before the cancel): {absent[:5]}"
            if absent
            else ""
        )
        message = "; ".join(m for m in (gone, odd) if m)
        return CancelResult(
            endpoint, ok=True, cancelled=tuple(cancelled), command=last, message=message
        )

    def pilot_output(
        self,
        endpoint: Endpoint,
        job_id: str,
        stream: OutputStream,
        name: str,
        size: int,
        from_end: bool,
        timeout: float,
    ) -> PilotOutput | None:
        """The pilot's stdout or stderr, read on this machine where qsub's options put it
        (:mod:`.output`): the job's name and owner from ``qstat -j`` while the cell holds it,
        else from ``qacct -j``; a job neither knows is not held. A file of its own (``file``)
        is not offered."""
        if stream == "file":
            return None
        if not JOB_ID_RE.fullmatch(job_id):
            return PilotOutput(job_id, stream, ok=False, message=ODD_ID)
        known = self._known_unreachable()
        if known is not None:
            return PilotOutput(job_id, stream, ok=False, command=known[0], message=known[1])
        deadline = self.deadline(timeout)
        number = job_number(job_id)
        outcome = self.run([self._command("qstat"), "-j", number], deadline)
        facts = job_owner(outcome.stdout, "qstat") if outcome.ok else None
        if not outcome.ok and not (
            outcome.returncode == 1 and "Following jobs do not exist" in outcome.stderr
        ):
            self._note_unreachable(endpoint, outcome)
            return PilotOutput(
                job_id, stream, ok=False, command=outcome, message=outcome.describe()
            )
        if facts is None and not outcome.ok:  # it left the cell: its accounting record
            outcome = self.run([self._command("qacct"), "-j", number], deadline)
            if outcome.returncode == 1 and "not found" in outcome.stderr:
                return PilotOutput(
                    job_id,
                    stream,
                    held=False,
                    command=outcome,
                    message=f"the cell no longer knows job {number} (qstat -j, qacct -j)",
                )
            facts = job_owner(outcome.stdout, "qacct") if outcome.ok else None
        if facts is None:
            why = outcome.describe() if not outcome.ok else f"no job name or owner for {number}"
            return PilotOutput(job_id, stream, ok=False, command=outcome, message=why)
        job, owner = facts
        try:
            home = pwd.getpwnam(owner).pw_dir
        except KeyError:
            home = ""
        path, problem = output_path(
            output_options(self.settings.qsub_options), stream, job_id, job, owner, home
        )
        if problem:
            return PilotOutput(job_id, stream, ok=False, message=problem)
        if path == "/dev/null":
            return PilotOutput(
                job_id, stream, held=False, where=path, message=f"its {stream} went to /dev/null"
            )
        return file_output(job_id, stream, path, size, from_end)


__all__ = ["OWNED_OPTIONS", "SgeBackend", "owned_option", "resource_options"]
