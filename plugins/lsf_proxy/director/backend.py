"""The LSF backend: submits pilots with ``bsub`` under a ``submission`` token and asks ``bjobs``
under a ``query`` token, then reads LSF's answers as formats.md quotes them.

Each configured queue is an endpoint. Failures are split the way an LSF operator would:
a request the cluster will never accept (no such queue, too many processors, a resource
requirement it cannot parse) is permanent and told at once; daemon trouble (LIM down, the batch
daemon not responding, a non-LSF host) is transient: the queue is set aside for this iteration
and people hear about it only when it fails again after its failing-cache period.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from loguru import logger

from gridgate.core.backend import (
    Backend,
    Deadline,
    command_timeout_schema,
    env_schema,
    file_output,
    job_name,
)
from gridgate.core.kinds import KINDS
from gridgate.core.model import (
    CancelResult,
    CommandResult,
    Endpoint,
    Failure,
    FoundPilots,
    OutputStream,
    PilotOutput,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import PluginContext
from gridgate.core.settings import Settings
from gridgate.plugins.lsf_proxy.client.client import ProxyClient
from gridgate.plugins.lsf_proxy.client.settings import ClientSettings
from gridgate.plugins.lsf_proxy.commands import COMMANDS, request_size
from gridgate.plugins.lsf_proxy.director.failures import classify
from gridgate.plugins.lsf_proxy.director.tracking import cancel_pilots, find_pilots, query_pilots
from gridgate.plugins.lsf_proxy.documents import BJOBS_STATES, bjobs_states, bsub_job_id
from gridgate.plugins.lsf_proxy.wire import NoToken, ProxyError

OPERATION_SUBMIT = "Job Submit"
OPERATION_QUERY = "Job Query"
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,58}")  # fullmatch: "$" takes a "\n"
#: bsub options the backend writes itself (``-q`` from queues, ``-J`` with the job array) or
#: that would replace the submission altogether; extra_options may not carry them, neither
#: alone nor with the value glued on (``-qother``). ``-Jd`` (a description) is another option.
OWNED_OPTIONS: dict[str, str] = {
    "-q": "the queue comes from queues",
    "-J": "job_name names the job and pilots_per_job makes its array",
    "-pack": "the backend submits one job description, not a pack file",
    "-n": "processors and a demand group's resources.cores are written as -n",
    "-W": "a demand group's resources.walltime is written as -W",
}
OTHER_OPTIONS = frozenset({"-Jd", "-network", "-notify", "-We", "-Wa", "-Wt"})
#: ``-n4``, ``-n2,4``, ``-W90``, ``-W1:30``: the owned options with their value glued on
GLUED_RE = re.compile(r"-n[0-9,]+|-W[0-9:]+(?:/\S*)?")


def lsf_run_limit(seconds: int) -> str:
    """``-W`` for a walltime in seconds: LSF's ``[hour:]minute``, minutes rounded up."""
    minutes = max(math.ceil(seconds / 60), 1)
    hours, rest = divmod(minutes, 60)
    return f"{hours}:{rest:02d}" if hours else str(rest)


def resource_options(request: SubmitRequest, processors: int | None) -> list[str]:
    """The bsub options of ``request.resources`` (and of the section's ``processors``):
    ``-n`` (the cores, else ``processors``), with ``-R span[hosts=1]`` for more than one
    core (a pilot runs on one host), ``-R rusage[mem=MB]`` (the whole pilot's memory: LSF
    reserves it per host by default, and the pilot has one host) and ``-W`` (minutes rounded
    up, :func:`lsf_run_limit`); each option and each value its own argv item."""
    resources = request.resources
    cores = resources.cores if resources is not None and resources.cores != 1 else processors
    options: list[str] = []
    if cores:
        options += ["-n", str(cores)]
    if resources is None:
        return options
    if resources.cores > 1:
        options += ["-R", "span[hosts=1]"]
    if resources.memory_mb is not None:
        options += ["-R", f"rusage[mem={resources.memory_mb}]"]
    if resources.walltime is not None:
        options += ["-W", lsf_run_limit(resources.walltime)]
    return options


def owned_option(word: str) -> str | None:
    """The option of ``extra_options`` word ``word`` that the backend writes itself, if any."""
    if word in OWNED_OPTIONS:
        return word
    if word in OTHER_OPTIONS:
        return None
    if GLUED_RE.fullmatch(word):
        return word[:2]
    for short in ("-q", "-J"):
        if word.startswith(short) and len(word) > 2:
            return short
    return None


BJOBS_FORMAT = "jobid stat exec_host delimiter='^'"
STATES = BJOBS_STATES
#: The boundary's readers, by the names the tests and older callers know.
parse_job_id = bsub_job_id
parse_bjobs = bjobs_states


#: An LSF job id: ``1234``, or an element of an array ``1234[5]``.
LSF_JOB_ID_RE = re.compile(r"[0-9]+(?:\[[0-9]+\])?")


@dataclass(frozen=True)
class JobStates:
    """What ``bjobs`` said about some jobs: ``states`` id -> (STAT, EXEC_HOST); ``missing``
    the ids LSF does not know; ``ok`` False when the query itself failed (see ``command``)."""

    ok: bool
    states: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    command: CommandResult | None = None
    message: str = ""


@dataclass(frozen=True)
class CommandSettings(Settings):
    """``commands``: the LSF commands' names or paths."""

    bsub: str
    bjobs: str
    bkill: str | None


#: The keys only the token client reads (``tokens: true``).
TOKEN_KEYS = ("socket", "token_user", "notoken_ntries")
LSF_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "LSF backend: queues (one endpoint each), bsub options, tokens.",
    "properties": {
        "queues": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "Queues to submit to; each is an endpoint (bsub -q).",
        },
        "commands": {
            "type": "object",
            "default": {},
            "additionalProperties": False,
            "description": "Names (looked up on PATH) or paths of the LSF commands.",
            "properties": {
                "bsub": {
                    "type": "string",
                    "x-gridgate-path": "command",
                    "minLength": 1,
                    "default": "bsub",
                    "description": "The submit command.",
                },
                "bjobs": {
                    "type": "string",
                    "x-gridgate-path": "command",
                    "minLength": 1,
                    "default": "bjobs",
                    "description": "The query command.",
                },
                "bkill": {
                    "type": ["string", "null"],
                    "x-gridgate-path": "command",
                    "minLength": 1,
                    "default": None,
                    "description": "The cancel command; null: bkill beside bjobs "
                    "when that is a path, else on PATH.",
                },
            },
        },
        "status_format": {
            "enum": ["custom", "table"],
            "default": "custom",
            "description": "How pilots are tracked: bjobs -noheader -o "
            "(LSF 9.1 and later) or the classic bjobs -aw "
            "table (older clusters).",
        },
        "job_name": {
            "type": "string",
            "minLength": 1,
            "default": "gridgate-pilot",
            "description": "bsub -J: this, then the submission's name (an array "
            "NAME[1-N] when a job carries N pilots); the director finds its jobs by it.",
        },
        "output": {
            "type": "string",
            "default": "",
            "description": "bsub -o path (%J the job id, %I the array index); empty: "
            "LSF's default (mailed). gridgate pilots output reads it when it is absolute, "
            "on a file system the director shares.",
        },
        "error": {
            "type": "string",
            "default": "",
            "description": "bsub -e path (%J, %I); empty: LSF's default (stderr in the -o file).",
        },
        "resources": {
            "type": "string",
            "default": "",
            "description": "bsub -R resource requirement; a request's own requirements replace it.",
        },
        "processors": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "bsub -n; null: not given. A demand group's "
            "resources.cores replace it for that group's pilots.",
        },
        "extra_options": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "More bsub arguments, each one argv item "
            '(e.g. ["-P", "myproject"]). Options the backend writes itself (-q, -J, '
            "-pack; -n from processors and resources.cores, -W from "
            "resources.walltime) are refused.",
        },
        "command": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "default": ["pilot.sh"],
            "description": "The pilot command and its arguments (argv).",
        },
        "pilots_per_job": {
            "type": "integer",
            "minimum": 1,
            "maximum": 10000,
            "default": 1,
            "description": "Pilots per bsub; > 1 submits a job array.",
        },
        "env": env_schema(),
        "command_timeout": command_timeout_schema(),
        "tokens": {
            "type": "boolean",
            "default": True,
            "description": "Take a token from lsfproxyd (the proxyd: section) before "
            "each bsub (submission) and bjobs (query).",
        },
        "socket": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "",
            "description": "The daemon's socket (default: $GRIDGATE_PROXYD_SOCKET, "
            "proxyd.socket or proxyd.hosts).",
        },
        "token_user": {
            "type": "string",
            "default": "",
            "description": "User named in signed TCP requests (a director's "
            "service account); empty: the process's user. Over "
            "a Unix socket the kernel says who is asking.",
        },
        "notoken_ntries": {
            "type": "integer",
            "minimum": 1,
            "default": 3,
            "description": "Attempts when the daemon denies a token.",
        },
        "transient_notify_after": {
            "type": "integer",
            "minimum": 1,
            "default": 2,
            "description": "Tell people about daemon trouble only "
            "from this failure of an episode on.",
        },
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class LsfSettings(Settings):
    """The LSF backend's section, typed (defaults: :data:`LSF_SCHEMA`)."""

    section_schema: ClassVar[Mapping[str, Any]] = LSF_SCHEMA
    queues: tuple[str, ...]
    commands: CommandSettings
    status_format: str
    job_name: str
    output: str
    error: str
    resources: str
    processors: int | None
    extra_options: tuple[str, ...]
    command: tuple[str, ...]
    pilots_per_job: int
    env: Mapping[str, str]
    command_timeout: float | None
    tokens: bool
    socket: str
    token_user: str
    notoken_ntries: int
    transient_notify_after: int

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        seen: set[str] = set()
        for index, queue in enumerate(self.queues):
            if not QUEUE_NAME_RE.fullmatch(queue):
                problems.append((("queues", index), f"{queue!r} is not an LSF queue name"))
            elif queue in seen:
                problems.append((("queues", index), f"queue {queue!r} is listed twice"))
            seen.add(queue)
        for index, word in enumerate(self.extra_options):
            owned = owned_option(word)
            if owned is not None:
                problems.append(
                    (
                        ("extra_options", index),
                        f"{owned} is written by the backend ({OWNED_OPTIONS[owned]})",
                    )
                )
        if not self.tokens:
            # the token client's keys would be accepted and then do nothing
            for key in TOKEN_KEYS:
                if getattr(self, key) != LSF_SCHEMA["properties"][key]["default"]:
                    problems.append(((key,), f"{key} is read only with tokens: true"))
        return problems


class LsfBackend(Backend):
    """Submits pilots to LSF queues with ``bsub``; queries them with ``bjobs``."""

    name = "lsf"
    #: the config key that lists the endpoints: a section without any is a config error
    endpoints_key = "queues"
    pilots_key = "pilots_per_job"
    expresses = ("cores", "memory_mb", "walltime")

    config_schema: ClassVar[dict[str, Any]] = LSF_SCHEMA
    settings_class = LsfSettings
    settings: LsfSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._client: ProxyClient | None = None
        self._client_lock = threading.Lock()

    # --- helpers ----------------------------------------------------------------------------

    def program(self, which: str) -> str:
        """The configured path or name of LSF command ``which`` (``bsub``, ``bjobs``)."""
        return str(getattr(self.settings.commands, which, None) or which)

    def client(self) -> ProxyClient | None:
        """The token client (None when ``tokens`` is off), built on first use."""
        if not self.settings.tokens:
            return None
        with self._client_lock:
            if self._client is None:
                section = ClientSettings.of(self.context.config.get("proxyd"))
                extra = {"user": self.settings.token_user} if self.settings.token_user else {}
                self._client = ProxyClient.from_settings(
                    section,
                    self.settings.socket or None,
                    notoken_ntries=self.settings.notoken_ntries,
                    **extra,
                )
            return self._client

    def bsub_argv(self, endpoint: Endpoint, request: SubmitRequest) -> list[str]:
        """The argv of one submission (no shell ever sees it)."""
        settings = self.settings
        name = job_name(settings.job_name, request)
        if request.count > 1:
            name = f"{name}[1-{request.count}]"
        argv = [self.program("bsub"), "-q", endpoint.name, "-J", name]
        for option, value in (("-o", settings.output), ("-e", settings.error)):
            if value:
                argv += [option, value]
        resources = request.requirements or settings.resources
        if resources:
            argv += ["-R", resources]
        argv += resource_options(request, settings.processors)
        argv += settings.extra_options
        argv += settings.command
        return argv

    def run_with_token(
        self, argv: Sequence[str], category: str, deadline: Deadline
    ) -> CommandResult | str:
        """Run under a token of ``category`` (none when ``tokens`` is off), killed at
        ``deadline``; a str says why it was not run."""
        client = self.client()
        token = None
        if client is not None:
            try:
                token = client.acquire(category, os.path.basename(argv[0]), request_size(argv))
            except NoToken as exc:
                return f"no {category} token: {exc}"
            except ProxyError as exc:
                return f"lsfproxyd: {exc}"
        try:
            return self.run(argv, deadline)
        finally:
            if token is not None:
                token.release()

    def query(self, job_ids: Sequence[str], timeout: float = 60.0) -> JobStates:
        """Ask ``bjobs`` (under a query token) for the state of ``job_ids``."""
        ids = [str(j) for j in job_ids]
        bad = [j for j in ids if not re.fullmatch(r"[0-9]+(\[[0-9]+\])?", j)]
        if bad:
            return JobStates(ok=False, message=f"not LSF job ids: {bad}")
        argv = [self.program("bjobs"), "-noheader", "-o", BJOBS_FORMAT, *ids]
        outcome = self.run_with_token(argv, COMMANDS["bjobs"].category, self.deadline(timeout))
        if isinstance(outcome, str):
            return JobStates(ok=False, message=outcome)
        states, missing = parse_bjobs(outcome.stdout, outcome.stderr)
        # exit 255 with only "is not found" lines is an answer, not a failure
        answered = outcome.ok or (
            outcome.returncode == 255 and bool(missing) and classify(outcome).kind == "error"
        )
        return JobStates(
            ok=answered and not outcome.timed_out,
            states=states,
            missing=missing,
            command=outcome,
            message="" if answered else outcome.describe(),
        )

    def _episode_failures(self, endpoint: Endpoint) -> int:
        """Failures counted so far in the server's open episode (core's failing cache, whichever
        escalation plugin the site runs); 0 without a state store or when it cannot be read."""
        failing = self.context.failing
        if failing is None:
            return 0
        try:
            episode = failing.episode(endpoint)
        except Exception as exc:  # a broken state store must not stop classification
            logger.warning("lsf: episode of {} unreadable: {}", endpoint.name, exc)
            return 0
        return episode.failures if episode is not None else 0

    # --- hooks ------------------------------------------------------------------------------

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        argv = self.bsub_argv(endpoint, request)
        outcome = self.run_with_token(argv, COMMANDS["bsub"].category, self.deadline(timeout))
        if isinstance(outcome, str):
            return SubmitResult(endpoint, ok=False, operation=OPERATION_SUBMIT, message=outcome)
        job_id = parse_job_id(outcome.stdout) or parse_job_id(outcome.stderr)
        if outcome.ok and job_id:
            return SubmitResult(
                endpoint, ok=True, job_ids=(job_id,), command=outcome, operation=OPERATION_SUBMIT
            )
        return SubmitResult(
            endpoint,
            ok=False,
            command=outcome,
            operation=OPERATION_SUBMIT,
            message=outcome.describe(),
        )

    def job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult:
        return query_pilots(self, endpoint, job_ids, timeout)

    def cancel(self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float) -> CancelResult:
        return cancel_pilots(self, endpoint, job_ids, timeout)

    def find_pilots(
        self, endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
    ) -> FoundPilots:
        return find_pilots(self, endpoint, names, fleet, timeout)

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
        """The pilot's ``-o`` or ``-e`` file, read on this machine where the backend's
        ``output``/``error`` name it (``%J`` the job's id, ``%I`` the element's index): LSF
        writes it when the job ends, on a file system the director shares; its stderr is in
        the ``-o`` file when no ``error`` is set. No ``output``: LSF mails the output, and
        there is nothing to read. A file of its own (``file``) is not offered."""
        if stream == "file":
            return None
        if not LSF_JOB_ID_RE.fullmatch(job_id):
            return PilotOutput(job_id, stream, ok=False, message=f"{job_id!r} is not an LSF job id")
        spec = self.settings.error if stream == "stderr" else ""
        spec = spec or self.settings.output
        if not spec:
            return PilotOutput(
                job_id,
                stream,
                held=False,
                message="LSF mails a job's output when bsub has no -o: set the backend's "
                "output (and error) to a folder this machine shares",
            )
        base, _, index = job_id.partition("[")
        path = spec.replace("%J", base).replace("%I", index.rstrip("]") or "0")
        if not os.path.isabs(path):  # relative to the folder bsub ran in
            return PilotOutput(
                job_id, stream, ok=False, where=path, message="the output path is not absolute"
            )
        found = file_output(job_id, stream, path, size, from_end)
        if stream == "stderr" and not self.settings.error and found.ok:
            note = "LSF writes stderr into the -o file when bsub has no -e"
            return replace(found, message=f"{found.message}; {note}" if found.message else note)
        return found

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure:
        if result.command is None and result.message.startswith(
            ("no submission token", "lsfproxyd")
        ):
            # the token daemon said no: the queue is fine, try again later
            return KINDS["refused"].failure(result.message)
        failure = classify(result.command, result.message)
        if failure.transient and failure.kind in ("daemon", "unreachable"):
            # this failure will be number (recorded + 1) of the episode
            persists = self._episode_failures(endpoint) + 1 >= self.settings.transient_notify_after
            if persists:
                failure = replace(failure, notify=True, reason=f"{failure.reason} (persists)")
        return failure

    def close(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
