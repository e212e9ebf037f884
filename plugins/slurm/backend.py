"""The Slurm backend: submits pilots with ``sbatch --parsable``, tracks them with one bulk
``squeue`` per partition and cancels them with ``scancel``. A pilot's stdout and stderr are
read from the paths ``scontrol show job`` gives while the controller holds the job, on the
file system the director shares with the nodes.

Each configured partition is an endpoint (``partition`` on the cluster of ``SLURM_CONF``, or
``partition@cluster`` for another cluster of a multi-cluster site, passed as ``--clusters``).
It is written only against gridgate's public plugin API (docs/plugins.md), as a site's own
backend would be. Failures are read from Slurm's own messages (:mod:`.classify`). A controller
that cannot be contacted takes every partition of its cluster out of rotation: once one
partition found it unreachable (submitting, polling or cancelling), the others of the same
cluster fail at once in that iteration with the same evidence, instead of each waiting ~9 s for
Slurm to give up again.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from gridgate.core import hookimpl
from gridgate.core.backend import (
    NOT_TRIED,
    Backend,
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
    JobStatus,
    OutputStream,
    PilotOutput,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import ConfigProblems, PluginContext
from gridgate.core.runner import argv_chunks
from gridgate.core.settings import Settings
from gridgate.plugins.slurm.classify import classify, clip, cluster_wide
from gridgate.plugins.slurm.documents import (
    FIND_FORMAT,
    JOB_ID_RE,
    output_paths,
    parse_named_jobs,
    parse_parsable,
    parse_squeue,
    refused_ids,
)

# the outputs' names, where they were before documents.py (tests and sites import them here)
from gridgate.plugins.slurm.documents import KILL_ERROR_RE as KILL_ERROR_RE  # noqa: E402
from gridgate.plugins.slurm.documents import PARSABLE_RE as PARSABLE_RE  # noqa: E402
from gridgate.plugins.slurm.documents import STATE_MAP as STATE_MAP  # noqa: E402
from gridgate.plugins.slurm.documents import pilot_state as pilot_state  # noqa: E402
from gridgate.plugins.slurm.queues import ClusterStates

OPERATION_SUBMIT = "Job Submit"
#: Every pattern here is used with fullmatch: ``$`` would also take a trailing newline.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
SQUEUE_FORMAT = "%i %T %r"
#: Options the backend writes itself; ``sbatch_options`` may not carry them.
OWNED_OPTIONS: dict[str, str] = {
    "--parsable": "the backend reads the job id from --parsable",
    "-p": "the partition comes from partitions",
    "--partition": "the partition comes from partitions",
    "-M": "the cluster comes from partition@cluster",
    "--clusters": "the cluster comes from partition@cluster",
    "--cluster": "the cluster comes from partition@cluster",
    "-a": "pilots_per_submission makes the job array",
    "--array": "pilots_per_submission makes the job array",
    "-J": "job_name names the job",
    "--job-name": "job_name names the job",
    "--wrap": "the pilot is the script key",
    "--": "the word after it would be taken for the script",
    "-c": "resources.cores is written as --cpus-per-task",
    "--cpus-per-task": "resources.cores is written as --cpus-per-task",
    "--mem": "resources.memory_mb is written as --mem",
    "--mem-per-cpu": "resources.memory_mb is written as --mem (sbatch takes one of them)",
    "--mem-per-gpu": "resources.memory_mb is written as --mem (sbatch takes one of them)",
    "-t": "resources.walltime is written as --time",
    "--time": "resources.walltime is written as --time",
    "-C": "resources.tags.constraint is written as --constraint",
    "--constraint": "resources.tags.constraint is written as --constraint",
    "--gres": "resources.tags.gres is written as --gres",
}


def split_partition(name: str) -> tuple[str, str]:
    """``batch@c2`` -> (``batch``, ``c2``); ``batch`` -> (``batch``, ``""``: SLURM_CONF's)."""
    partition, _, cluster = name.partition("@")
    return partition, cluster


#: Why a tracked pilot id of no Slurm job id's form is not asked about (its status: unknown).
ODD_ID = "not a Slurm job id: it was never sent to Slurm"


def _checked_ids(job_ids: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ids of a Slurm job id's form, and the others: an id reaches an argv, so only the form
    sbatch printed is passed on, and an odd one is that pilot's problem alone, never the whole
    partition's poll or cancel (issue 40 item 4, round 5)."""
    ids = [str(j) for j in job_ids]
    return [j for j in ids if JOB_ID_RE.fullmatch(j)], [
        j for j in ids if not JOB_ID_RE.fullmatch(j)
    ]


#: sbatch's short options that take a value (the rest of a bundle is that value: ``-t10``);
#: the other letters are flags that may be bundled (``-Hv``). ``-k`` takes an optional one.
SHORT_WITH_VALUE = frozenset("AaBbCcDdeFGiJkLMmNnopqSTtwx")
#: The environment variables sbatch reads for the options the backend owns: sbatch_options
#: cannot carry them, nor can ``env`` (and the director's own environment is cleaned of them).
OWNED_ENVIRONMENT: dict[str, str] = {
    "SBATCH_ARRAY_INX": "--array",
    "SBATCH_PARTITION": "--partition",
    "SBATCH_CLUSTERS": "--clusters",
    "SBATCH_JOB_NAME": "--job-name",
    "SBATCH_WRAP": "--wrap",
    "SLURM_CLUSTERS": "--clusters",
    "SBATCH_MEM_PER_CPU": "--mem-per-cpu",
    "SBATCH_MEM_PER_GPU": "--mem-per-gpu",
    "SBATCH_MEM_PER_NODE": "--mem",
    "SBATCH_TIMELIMIT": "--time",
    "SBATCH_CONSTRAINT": "--constraint",
    "SBATCH_GRES": "--gres",
}


def slurm_time(seconds: int) -> str:
    """``--time`` for a walltime in seconds: whole minutes, rounded up, as Slurm writes them
    (``MM``, ``HH:MM:00`` from an hour on, ``D-HH:MM:00`` from a day on)."""
    minutes = max(math.ceil(seconds / 60), 1)
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{mins:02d}:00"
    if hours:
        return f"{hours}:{mins:02d}:00"
    return str(mins)


def resource_options(request: SubmitRequest) -> list[str]:
    """The sbatch options of ``request.resources``: ``--cpus-per-task``, ``--mem`` (MB of the
    whole job: one node, as a pilot runs), ``--time`` (:func:`slurm_time`), and the tags
    ``constraint`` (``--constraint``) and ``gres`` (``--gres``); none for what is not asked."""
    resources = request.resources
    if resources is None:
        return []
    options = []
    if resources.cores != 1:
        options.append(f"--cpus-per-task={resources.cores}")
    if resources.memory_mb is not None:
        options.append(f"--mem={resources.memory_mb}M")
    if resources.walltime is not None:
        options.append(f"--time={slurm_time(resources.walltime)}")
    for tag in ("constraint", "gres"):
        if tag in resources.tags:
            options.append(f"--{tag}={resources.tags[tag]}")
    return options


def owned_option(word: str) -> str | None:
    """The option of ``sbatch_options`` word ``word`` that the backend writes itself, if any.

    sbatch (getopt_long) takes any unambiguous prefix of a long option (``--arr=0-4`` is
    ``--array``) and bundles of short ones (``-Hpbatch`` is ``-H -p batch``), so both are
    read as sbatch reads them. ``--`` alone is refused too: it would make the next word the
    script and the backend's script one of its arguments.
    """
    if word == "--":
        return "--"
    if word.startswith("--"):
        name = word.split("=", 1)[0]
        owned = [o for o in OWNED_OPTIONS if o.startswith("--") and o.startswith(name)]
        if name in OWNED_OPTIONS:
            return name
        return min(owned, key=len) if len(name) > 2 and owned else None
    if word.startswith("-") and len(word) > 1:
        for letter in word[1:]:
            if f"-{letter}" in OWNED_OPTIONS:
                return f"-{letter}"
            if letter in SHORT_WITH_VALUE:  # the rest of the word is its value
                return None
    return None


SLURM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Slurm backend: partitions (one endpoint each), the pilot script, sbatch "
    "options.",
    "properties": {
        "partitions": {
            "type": "array",
            "default": [],
            "items": {"type": "string", "minLength": 1},
            "description": "Partitions to submit to; each is an endpoint. "
            "`partition@cluster` submits with --clusters=cluster (a "
            "multi-cluster site with slurmdbd).",
        },
        "script": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "",
            "description": "The pilot batch script sbatch submits (a path readable "
            "on this machine; #SBATCH lines in it apply).",
        },
        "job_name": {
            "type": "string",
            "minLength": 1,
            "default": "gridgate-pilot",
            "description": "sbatch --job-name; a submission of the director's is named "
            "`<job_name>-<its name>` (an array's tasks share it), which finds its jobs "
            "again after a crash.",
        },
        "sbatch_options": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "More sbatch arguments, each one argv item (e.g. "
            '["--output=/dev/null", "--account=atlas"]). Options the '
            "backend writes itself (--parsable, --partition, --clusters, "
            "--array, --job-name, --wrap; and those of a demand group's resources: "
            "--cpus-per-task, --mem, --time, --constraint, --gres) are refused.",
        },
        "pilots_per_submission": {
            "type": "integer",
            "minimum": 1,
            "maximum": 10000,
            "default": 1,
            "description": "Pilots per sbatch; > 1 submits a job array (--array=0-N-1), "
            "one job id per pilot (`<id>_<index>`).",
        },
        "commands": commands_schema(
            "Names (looked up on PATH) or paths of the Slurm commands.",
            (
                ("sbatch", "submit"),
                ("squeue", "status"),
                ("scancel", "cancel"),
                ("scontrol", "output paths (scontrol show job), partition state and limits"),
                ("sinfo", "partition CPUs"),
            ),
        ),
        "queue_state_interval": {
            "type": ["number", "null"],
            "minimum": 0,
            "maximum": 3600,
            "default": 10,
            "description": "Seconds one read of a cluster's partitions (scontrol, sinfo, "
            "squeue of every user's jobs) answers for all its partitions: what each says "
            "of its queue (waiting and running jobs, idle CPUs, state, limits; "
            "docs/slurm.md). null: the partitions say nothing of their queues.",
        },
        "command_timeout": command_timeout_schema(
            "Seconds; replaces the director's limit for "
            "these commands when set. Slurm's clients "
            "give up on a stopped controller after ~9 s."
        ),
        "env": env_schema(
            "Extra environment variables for the commands (e.g. "
            "SLURM_CONF for a cluster other than the machine's)."
        ),
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class SlurmSettings(Settings):
    """The ``slurm`` backend's section (:data:`SLURM_SCHEMA`; defaults from there)."""

    section_schema: ClassVar[dict[str, Any]] = SLURM_SCHEMA

    partitions: tuple[str, ...]
    script: str
    job_name: str
    sbatch_options: tuple[str, ...]
    pilots_per_submission: int
    commands: Mapping[str, str]
    command_timeout: float | None
    env: Mapping[str, str]
    queue_state_interval: float | None


class SlurmBackend(Backend):
    """Submits pilots to Slurm partitions; polls and cancels them."""

    name = "slurm"
    expresses = ("cores", "memory_mb", "walltime")
    expresses_tags = ("constraint", "gres")
    #: the config key that lists the endpoints: a section without any is a config error
    endpoints_key = "partitions"

    config_schema: ClassVar[dict[str, Any]] = SLURM_SCHEMA
    settings_class = SlurmSettings
    settings: SlurmSettings

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> ConfigProblems:
        problems: ConfigProblems = list(super().config_errors(section))
        seen: set[str] = set()
        partitions = section.get("partitions") or []
        for index, entry in enumerate(partitions):
            partition, cluster = split_partition(entry)
            if not NAME_RE.fullmatch(partition) or (
                ("@" in entry) and not NAME_RE.fullmatch(cluster)
            ):
                problems.append(
                    (
                        ("partitions", index),
                        f"{entry!r} is not a Slurm partition (name or name@cluster)",
                    )
                )
            elif entry in seen:
                problems.append((("partitions", index), f"partition {entry!r} is listed twice"))
            seen.add(entry)
        if partitions and not section.get("script"):
            problems.append((("script",), "a pilot script is needed to submit to the partitions"))
        for index, word in enumerate(section.get("sbatch_options") or []):
            owned = owned_option(str(word))
            if owned is not None:
                read = (
                    ""
                    if str(word).split("=", 1)[0] == owned
                    else f" (sbatch reads {word!r} as {owned})"
                )
                problems.append(
                    (
                        ("sbatch_options", index),
                        f"{owned} is written by the backend ({OWNED_OPTIONS[owned]}){read}",
                    )
                )
        for name in section.get("env") or {}:
            if name in OWNED_ENVIRONMENT:
                owned = OWNED_ENVIRONMENT[name]
                problems.append(
                    (
                        ("env", name),
                        f"{name} sets sbatch {owned}, which is written by the "
                        f"backend ({OWNED_OPTIONS[owned]})",
                    )
                )
        return problems

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        #: clusters ("" = SLURM_CONF's) whose controller a partition found unreachable
        self._outages = Outages()
        self._programs = {k: v for k, v in self.settings.commands.items() if v}
        interval = self.settings.queue_state_interval
        #: what each cluster's partitions say of their queues, read once an interval
        self._queues = (
            None if interval is None else ClusterStates(interval, self.run, self._command)
        )
        extra = self.settings.env
        inherited = {k: v for k, v in os.environ.items() if k not in OWNED_ENVIRONMENT}
        # an SBATCH_ARRAY_INX left in the director's environment would make every pilot an array
        self._environ: dict[str, str] | None = (
            {**inherited, **extra} if extra or len(inherited) != len(os.environ) else None
        )

    # --- helpers ----------------------------------------------------------------------------

    def _command(self, which: str) -> str:
        return self._programs.get(which) or which

    def environment(self) -> dict[str, str] | None:
        """The director's environment without the variables of the options the backend
        writes (``OWNED_ENVIRONMENT``), with the section's ``env``; None when unchanged."""
        return self._environ

    def sbatch_argv(self, endpoint: Endpoint, request: SubmitRequest) -> list[str]:
        """The argv of one submission (no shell ever sees it)."""
        partition, cluster = split_partition(endpoint.name)
        argv = [
            self._command("sbatch"),
            "--parsable",
            f"--partition={partition}",
            f"--job-name={job_name(self.settings.job_name, request)}",
        ]
        if cluster:
            argv.append(f"--clusters={cluster}")
        if request.count > 1:
            argv.append(f"--array=0-{request.count - 1}")
        argv += resource_options(request)
        argv += self.settings.sbatch_options
        argv.append(self.settings.script)
        return argv

    def _known_unreachable(self, endpoint: Endpoint) -> tuple[CommandResult, str] | None:
        """The evidence and a 'not tried' message when a sibling partition of ``endpoint``
        found its controller unreachable in this iteration."""
        _partition, cluster = split_partition(endpoint.name)
        known = self._outages.found(cluster)
        if known is None:
            return None
        found_by, command = known
        return command, (
            f"{NOT_TRIED}partition {found_by} of the same cluster could not "
            f"contact the controller this iteration"
        )

    def _note_unreachable(self, endpoint: Endpoint, outcome: CommandResult) -> None:
        if cluster_wide(outcome):
            _partition, cluster = split_partition(endpoint.name)
            self._outages.note(endpoint, outcome, cluster)

    def _cluster_args(self, endpoint: Endpoint) -> list[str]:
        _partition, cluster = split_partition(endpoint.name)
        return [f"--clusters={cluster}"] if cluster else []

    # --- hooks ------------------------------------------------------------------------------

    @hookimpl
    def gridgate_iteration_started(self, iteration: IterationInfo) -> None:
        # A controller found unreachable is tried again (by one partition) next iteration.
        self._outages.clear()

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        known = self._known_unreachable(endpoint)
        if known is not None:
            return SubmitResult(
                endpoint, ok=False, command=known[0], operation=OPERATION_SUBMIT, message=known[1]
            )
        outcome = self.run(self.sbatch_argv(endpoint, request), self.deadline(timeout))
        parsed = parse_parsable(outcome.stdout) if outcome.ok else None
        if parsed is not None:
            job_id = parsed[0]
            ids = (
                tuple(f"{job_id}_{i}" for i in range(request.count))
                if request.count > 1
                else (job_id,)
            )
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

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        failure = classify(result.command, result.message if result.command is None else "")
        return (
            not_tried(failure, result.message) if result.message.startswith(NOT_TRIED) else failure
        )

    def job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        ids, bad = _checked_ids(job_ids)
        statuses = {j: JobStatus(job_id=j, state="unknown", reason=ODD_ID) for j in bad}
        if not ids:
            return StatusResult(endpoint, ok=True, statuses=statuses, commands=0)
        known = self._known_unreachable(endpoint)
        if known is not None:
            return StatusResult(endpoint, ok=False, command=known[0], commands=0, message=known[1])
        # -r: one line per array task (a pending array is otherwise shown as 12_[0-3]);
        # -t all: finished jobs still in memory too (the default filter hides them even with -j).
        # Arrays are asked for by their base id: once the still-pending tasks of an array are
        # cancelled, Slurm keeps them as one record printed as the bare base id (``12``), and
        # ``--jobs=12_3`` then matches nothing.
        prefix = [
            self._command("squeue"),
            "-h",
            "-r",
            "-t",
            "all",
            "-o",
            SQUEUE_FORMAT,
            *self._cluster_args(endpoint),
            "--jobs=",
        ]
        asked = list(dict.fromkeys(j.split("_")[0] for j in ids))
        seen: dict[str, JobStatus] = {}
        chunks = argv_chunks(prefix, asked, joiner=",")
        last: CommandResult | None = None
        deadline = self.deadline(timeout)
        for argv in chunks:
            outcome = self.run(argv, deadline)
            last = outcome
            # One id that has left the controller's memory: exit 1 with this text, an answer.
            gone = (
                outcome.returncode == 1
                and "Invalid job id specified" in outcome.stderr
                and not outcome.timed_out
            )
            if outcome.stdout_truncated and not outcome.timed_out:
                # gridgate's own cap cut the answer: core names it (kind output_cap) and keeps
                # every pilot's state, rather than this chunk's ids going unknown, then lost
                return StatusResult(
                    endpoint,
                    ok=False,
                    command=outcome,
                    commands=len(chunks),
                    message="squeue's output passed director.max_output_bytes",
                )
            if not outcome.ok and not gone:
                self._note_unreachable(endpoint, outcome)
                return StatusResult(
                    endpoint,
                    ok=False,
                    command=outcome,
                    commands=len(chunks),
                    message=outcome.describe(),
                )
            seen.update(parse_squeue(outcome.stdout))
        for job_id in ids:
            found = seen.get(job_id) or ("_" in job_id and seen.get(job_id.split("_")[0]))
            if found:
                statuses[job_id] = replace(found, job_id=job_id)
        return StatusResult(
            endpoint, ok=True, statuses=statuses, command=last, commands=len(chunks)
        )

    def endpoint_state(self, endpoint: Endpoint, timeout: float) -> EndpointState | None:
        if self._queues is None:
            return None
        partition, cluster = split_partition(endpoint.name)
        deadline = self.deadline(timeout)
        return self._queues.partition(partition, cluster, deadline.left())

    def find_argv(self, endpoint: Endpoint) -> list[str]:
        """The squeue argv that lists this user's jobs on ``endpoint``'s partition in every
        state (``-t all``: just submitted, pending, held, running, and finished while the
        controller still holds them), one line per array task (``-r``), named in full
        (:data:`FIND_FORMAT`)."""
        partition, _cluster = split_partition(endpoint.name)
        return [
            self._command("squeue"),
            "-h",
            "-r",
            "--me",
            "-t",
            "all",
            f"--partition={partition}",
            *self._cluster_args(endpoint),
            "-o",
            FIND_FORMAT,
        ]

    def find_pilots(
        self, endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
    ) -> FoundPilots | None:
        base = self.settings.job_name
        if not names and not fleet:
            return found_pilots(endpoint, base, names, fleet, [])
        known = self._known_unreachable(endpoint)
        if known is not None:
            return FoundPilots(endpoint, ok=False, command=known[0], message=known[1])
        prefix = self.find_argv(endpoint)
        # Only names asked for: --name makes the controller send only their jobs (a base
        # holding a comma, which --name would split, lists every job instead).
        chunks = (
            argv_chunks([*prefix, "--name="], [f"{base}-{n}" for n in names], joiner=",")
            if not fleet and "," not in base
            else [prefix]
        )
        deadline = self.deadline(timeout)
        jobs: list[tuple[str, JobStatus]] = []
        last: CommandResult | None = None
        for chunk in chunks:
            outcome = self.run(chunk, deadline)
            last = outcome
            if outcome.stdout_truncated and not outcome.timed_out:
                return FoundPilots(
                    endpoint,
                    ok=False,
                    command=outcome,
                    message="squeue's output passed director.max_output_bytes",
                )
            if not outcome.ok:
                self._note_unreachable(endpoint, outcome)
                return FoundPilots(endpoint, ok=False, command=outcome, message=outcome.describe())
            jobs += parse_named_jobs(outcome.stdout)
        return found_pilots(endpoint, base, names, fleet, jobs, command=last)

    def cancel(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> CancelResult | None:
        ids, bad = _checked_ids(job_ids)
        odd = f"{ODD_ID}: {bad[:5]}" if bad else ""
        if not ids:
            return CancelResult(endpoint, ok=True, message=odd)
        known = self._known_unreachable(endpoint)
        if known is not None:
            return CancelResult(endpoint, ok=False, command=known[0], message=known[1])
        cancelled: list[str] = []
        left: dict[str, str] = {}
        last: CommandResult | None = None
        prefix = [self._command("scancel"), "--verbose", *self._cluster_args(endpoint)]
        deadline = self.deadline(timeout)
        # scancel (no signal, no filter) exits 0 for ids already finished or unknown; with
        # --verbose it names each ("Job/step already completing or completed", "Invalid job id
        # specified"): those are not cancelled, and their next poll says how they ended.
        for argv in argv_chunks(prefix, ids):
            outcome = self.run(argv, deadline)
            last = outcome
            if not outcome.ok:
                self._note_unreachable(endpoint, outcome)
                return CancelResult(
                    endpoint,
                    ok=False,
                    cancelled=tuple(cancelled),
                    command=outcome,
                    message=outcome.describe(),
                )
            refused = refused_ids(outcome.stderr)
            left.update((j, refused[j]) for j in argv[len(prefix) :] if j in refused)
            cancelled += [j for j in argv[len(prefix) :] if j not in refused]
        return CancelResult(
            endpoint,
            ok=True,
            cancelled=tuple(cancelled),
            command=last,
            message="; ".join(
                m
                for m in (
                    clip("not cancelled: " + "; ".join(f"{j}: {w}" for j, w in left.items()))
                    if left
                    else "",
                    odd,
                )
                if m
            ),
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
        """The pilot's stdout or stderr, read on this machine from the path the controller
        gives (``scontrol -o show job ID``: the ``--output``/``--error`` of the submission,
        its ``%j``... expanded): the nodes write it to a file system the director shares. A
        job the controller no longer holds (``MinJobAge`` after its end) is not held; a file
        of its own (``file``) is not offered."""
        if stream == "file":
            return None
        if not JOB_ID_RE.fullmatch(job_id):
            return PilotOutput(job_id, stream, ok=False, message=ODD_ID)
        known = self._known_unreachable(endpoint)
        if known is not None:
            return PilotOutput(job_id, stream, ok=False, command=known[0], message=known[1])
        argv = [self._command("scontrol"), *self._cluster_args(endpoint), "-o", "show", "job"]
        outcome = self.run([*argv, job_id], self.deadline(timeout))
        if (
            outcome.returncode == 1
            and "Invalid job id specified" in outcome.stderr
            and not outcome.timed_out
        ):
            return PilotOutput(
                job_id,
                stream,
                held=False,
                command=outcome,
                message=f"the controller no longer holds job {job_id}",
            )
        if not outcome.ok:
            self._note_unreachable(endpoint, outcome)
            return PilotOutput(
                job_id, stream, ok=False, command=outcome, message=outcome.describe()
            )
        path = output_paths(outcome.stdout).get(stream)
        if path is None:
            return PilotOutput(
                job_id,
                stream,
                ok=False,
                command=outcome,
                message=f"scontrol show job {job_id} names no {stream} path",
            )
        if path == "/dev/null":
            return PilotOutput(
                job_id, stream, held=False, where=path, message=f"its {stream} went to /dev/null"
            )
        if not os.path.isabs(path):  # relative to the job's working folder, as Slurm reads it
            return PilotOutput(
                job_id, stream, ok=False, where=path, message=f"{stream} path is not absolute"
            )
        return file_output(job_id, stream, path, size, from_end)
