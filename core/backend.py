"""The base class of a backend: subclass :class:`Backend` and write what your batch system does.

A backend answers the director's hooks for its own endpoints only: every hook call carries an
endpoint (or a backend name) and a backend that is not its owner answers None. :class:`Backend`
asks that question once, in its hook implementations, and calls your typed methods only for
your own endpoints:

============================================  =================================================
the hook the director calls                   the method of yours it calls (for your endpoints)
============================================  =================================================
``gridgate_backend_info(backend)``            :meth:`Backend.backend_info` (built for you)
``gridgate_submit(endpoint, ...)``            :meth:`Backend.submit` (the one you must write)
``gridgate_classify_failure(endpoint, ...)``  :meth:`Backend.classify_failure` (None: rules)
``gridgate_job_status(endpoint, ...)``        :meth:`Backend.job_status` (None: no tracking)
``gridgate_cancel(endpoint, ...)``            :meth:`Backend.cancel` (None: cannot cancel)
``gridgate_pilot_output(endpoint, ...)``      :meth:`Backend.pilot_output` (None: cannot read)
``gridgate_list_match(endpoint, ...)``        :meth:`Backend.list_match` (only if you write it)
============================================  =================================================

It also builds :class:`~gridgate.core.model.BackendInfo` from your schema'd section
(``endpoints_key``, ``pilots_key``, ``command_timeout``, ``list_match``, ``credentials``, and
the pilot resources you map: ``expresses`` and ``expresses_tags``) and
runs your commands through :func:`gridgate.core.runner.run` with the deadline of the hook call
(your section's ``command_timeout`` replaces the director's limit when set) and the site's
``director.max_output_bytes``: :meth:`Backend.deadline` and :meth:`Backend.run`.

A request asking resources your backend does not declare in ``expresses`` (cores, memory,
walltime) or ``expresses_tags`` is a config error before it gets here
(:func:`resource_gaps`); should one reach :meth:`Backend.submit` anyway it is refused there,
never submitted without them.

A backend may still implement the raw hooks on a plain :class:`~gridgate.core.plugins.Plugin`
(or any class) instead: the director only calls hooks.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gridgate.core import hookimpl, runner
from gridgate.core.endpoint_state import EndpointState
from gridgate.core.model import (
    BackendInfo,
    CancelResult,
    CommandResult,
    Endpoint,
    Failure,
    FoundPilots,
    JobStatus,
    ListMatchResult,
    OutputStream,
    PilotOutput,
    Resources,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.patterns import clip
from gridgate.core.plugins import Plugin

__all__ = [
    "Backend",
    "Deadline",
    "NOT_TRIED",
    "Outages",
    "command_timeout_schema",
    "commands_schema",
    "env_schema",
    "file_output",
    "found_pilots",
    "job_name",
    "not_tried",
    "resource_gaps",
    "submission_of",
]

#: A submission name as the director gives it (:attr:`SubmitRequest.name`): the fleet (6 hex
#: digits, the same for every director on one state store) and 12 random hex digits.
SUBMISSION_NAME = re.compile(r"[0-9a-f]{6}-[0-9a-f]{12}")


def job_name(base: str, request: SubmitRequest, index: int | None = None) -> str:
    """The name of a job made for ``request``: ``base`` (the backend's ``job_name``), then the
    submission's name, then ``index`` for a backend that makes one job per pilot
    (``gridgate-3fa2c1-9b8e7d6c5a4f-0``); ``base`` alone for a request without a name (made
    outside the director). :func:`submission_of` reads it back."""
    if not request.name:
        return base
    name = f"{base}-{request.name}"
    return name if index is None else f"{name}-{index}"


def submission_of(name: str, base: str) -> str | None:
    """The submission name in the job name ``name`` made by :func:`job_name` with ``base``;
    None when ``name`` is not one (another tool's job, or a request without a name)."""
    prefix = base + "-"
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    submission, _, index = rest[:19], rest[19:20], rest[20:]
    if not SUBMISSION_NAME.fullmatch(submission):
        return None
    if len(rest) == 19 or (_ == "-" and index.isdigit()):
        return submission
    return None


def found_pilots(
    endpoint: Endpoint,
    base: str,
    names: Sequence[str],
    fleet: str,
    jobs: Iterable[tuple[str, JobStatus]],
    command: CommandResult | None = None,
) -> FoundPilots:
    """The answer to :func:`gridgate_find_pilots` from every ``(job name, status)`` the server
    listed: the jobs whose name :func:`job_name` made with ``base`` for one of ``names``, or
    for any submission of ``fleet`` when it is set.

    :param endpoint: the server asked.
    :param base: the backend's ``job_name`` (what :func:`job_name` was given).
    :param names: the submission names looked for.
    :param fleet: "" or the fleet whose every submission is looked for.
    :param jobs: ``(job name, status)`` of every job the server listed.
    :param command: the listing's command, kept as evidence.
    """
    wanted = set(names)
    found: dict[str, list[JobStatus]] = {}
    for name, status in jobs:
        submission = submission_of(name, base)
        if submission is None:
            continue
        if submission in wanted or (fleet and submission.startswith(fleet + "-")):
            found.setdefault(submission, []).append(status)
    return FoundPilots(
        endpoint, ok=True, found={k: tuple(v) for k, v in found.items()}, command=command
    )


#: The :class:`~gridgate.core.model.Resources` values a backend may declare it maps.
RESOURCE_VALUES: tuple[str, ...] = ("cores", "memory_mb", "walltime")


def file_output(
    job_id: str,
    stream: OutputStream,
    path: str,
    size: int,
    from_end: bool = False,
    name: str = "",
) -> PilotOutput:
    """A :class:`PilotOutput` read from the file ``path`` on this machine: what a backend whose
    batch system writes a pilot's output to a file system the director shares answers (the
    part asked for, its length; ``held`` False with "file ... is not there" when it is missing).

    :param job_id: the pilot's job id.
    :param stream: ``stdout``, ``stderr`` or ``file``.
    :param path: where the batch system writes the stream (absolute).
    :param size: the most bytes to read (0: only whether it is there).
    :param from_end: read the last ``size`` bytes instead of the first.
    :param name: the file's name for ``stream == "file"``.
    """
    from gridgate.core.files import InputFileError, read_part

    try:
        data, total = read_part(path, size=size, from_end=from_end)
    except InputFileError as exc:
        if exc.errno == errno.ENOENT:
            return PilotOutput(
                job_id,
                stream,
                held=False,
                where=path,
                name=name,
                message=f"file {path} is not there",
            )
        return PilotOutput(job_id, stream, ok=False, where=path, name=name, message=str(exc))
    return PilotOutput(
        job_id,
        stream,
        where=path,
        text=data.decode("utf-8", "replace"),
        cut=total > len(data),
        size=total,
        from_end=from_end,
        name=name,
    )


def resource_gaps(
    resources: Resources | None, expresses: Sequence[str], tags: Sequence[str] = ()
) -> list[str]:
    """What ``resources`` asks that a backend mapping ``expresses`` and ``tags`` cannot say.

    One ``name=value`` per value asked but not mapped (``memory_mb=16000``, ``tags.gpu=a100``);
    the defaults (one core, no memory, no walltime, no tag) need no mapping. Empty: all of it
    can be expressed.

    :param resources: what a request asks (None: nothing).
    :param expresses: the values the backend maps (``BackendInfo.resources``).
    :param tags: the tag names the backend maps (``BackendInfo.resource_tags``).
    """
    if resources is None:
        return []
    gaps: list[str] = []
    asked = {
        "cores": resources.cores if resources.cores != 1 else None,
        "memory_mb": resources.memory_mb,
        "walltime": resources.walltime,
    }
    gaps += [f"{k}={v}" for k, v in asked.items() if v is not None and k not in expresses]
    gaps += [f"tags.{k}={v}" for k, v in resources.tags.items() if k not in tags]
    return gaps


#: What ``command_timeout`` means, for a section that says no more about it.
COMMAND_TIMEOUT_TEXT = "Seconds; replaces the director's limit for these commands when set."


def command_timeout_schema(description: str = COMMAND_TIMEOUT_TEXT) -> dict[str, Any]:
    """The schema of a section's ``command_timeout``, as :class:`Backend` reads it.

    Seconds (up to a day) that replace the director's limit for the backend's commands
    (:meth:`Backend.deadline`, ``BackendInfo.command_timeout``); null, the default, keeps it.

    :param description: what the key means for your commands (the configuration reference
        shows it).
    """
    return {
        "maximum": 86400,
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "default": None,
        "description": description,
    }


def env_schema(
    description: str = "Extra environment variables for the commands.",
) -> dict[str, Any]:
    """The schema of a section's ``env``: variables :meth:`Backend.environment` adds. Their
    values are handed to the commands as written: a value need not be a path (``SGE_CELL``),
    so none is resolved against the config file's folder as path-valued keys are; the
    reference says so beside ``description``.

    :param description: what the variables are for (the configuration reference shows it).
    """
    return {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "default": {},
        "description": f"{description} {ENV_AS_WRITTEN}",
    }


#: What every ``env`` says of its values (a value need not be a path, so none is resolved).
ENV_AS_WRITTEN = (
    "Values are passed as written, not taken from the config file's folder (a value need not "
    "be a path): give paths absolute; a relative one is read by the command from the "
    "director's working directory."
)


def commands_schema(description: str, commands: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The schema of a section's ``commands``: each a name looked up on PATH or a path from the
    config file's folder, defaulting to its own name.

    :param description: the section's sentence for it (the configuration reference shows it).
    :param commands: (name, what it does) per command: ``("sbatch", "submit")``.
    """
    return {
        "type": "object",
        "default": {},
        "additionalProperties": False,
        "description": description,
        "properties": {
            name: {
                "type": "string",
                "minLength": 1,
                "x-gridgate-path": "command",
                "default": name,
                "description": f"The {what} command.",
            }
            for name, what in commands
        },
    }


#: How the message of a result that was not tried because of an :class:`Outages` entry starts.
NOT_TRIED = "not tried: "


class Outages:
    """Services several endpoints share (a Slurm controller, a Grid Engine qmaster) that one of
    them found out of reach in this iteration.

    A backend whose endpoints stand behind one service keeps one of these: the first endpoint
    whose command shows the service down (or hung to its deadline) records it with :meth:`note`, the
    others ask :meth:`found` before running anything and fail at once with the same evidence,
    so an iteration does not wait once per endpoint for the same dead service. Clear it in
    ``gridgate_iteration_started``: the service is tried again, by one endpoint, next
    iteration. Keys name the service (a cluster name; ``""`` when there is only one). Thread
    safe: endpoints are submitted to and polled in parallel.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: dict[str, tuple[str, CommandResult]] = {}

    def note(self, endpoint: Endpoint, command: CommandResult, key: str = "") -> None:
        """``endpoint``'s ``command`` found service ``key`` out of reach (the first finder is
        kept)."""
        with self._lock:
            self._found.setdefault(key, (endpoint.name, command))

    def found(self, key: str = "") -> tuple[str, CommandResult] | None:
        """The endpoint that found ``key`` out of reach in this iteration, and its command."""
        with self._lock:
            return self._found.get(key)

    def clear(self) -> None:
        """Forget every service found out of reach (a new iteration tries them again)."""
        with self._lock:
            self._found.clear()


def not_tried(failure: Failure, message: str) -> Failure:
    """The classified ``failure`` of a result that was not tried (its ``message`` starts with
    :data:`NOT_TRIED`): excluded like the endpoint that found the outage, whatever its kind
    would do on its own, and its reason says why it was not tried."""
    return dataclasses.replace(failure, exclude=True, reason=clip(f"{failure.reason} ({message})"))


@dataclass(frozen=True)
class Deadline:
    """When the commands of one hook call must be done: an instant of ``time.monotonic()``.

    One hook call may run several commands (chunks of a long id list, a retry with more
    verbose output): they share the call's deadline, each getting what is left of it.
    """

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """The deadline ``seconds`` from now, at least a millisecond.

        A caller with no time left still gets a result (its command killed at once), not an
        error."""
        return cls(time.monotonic() + max(float(seconds), 0.001))

    def left(self) -> float:
        """Seconds left, at least 0.001 (the runner kills at once what has none left)."""
        return max(self.at - time.monotonic(), 0.001)

    def passed(self) -> bool:
        """Whether no time is left."""
        return time.monotonic() >= self.at


class Backend(Plugin):
    """Base class of a backend: answers the hooks for its own endpoints, and calls yours.

    Set ``name`` (the entry-point name), ``config_schema`` and ``endpoints_key`` (the key
    of your section listing the endpoints); write :meth:`submit`, and as your batch system
    allows :meth:`classify_failure`, :meth:`job_status`, :meth:`cancel`, :meth:`find_pilots`,
    :meth:`pilot_output`, :meth:`endpoint_state` and :meth:`list_match`. Override
    :meth:`endpoints` when an entry of your list is more than a name (a URL, a mapping),
    :meth:`environment` when your commands need more than the section's ``env`` and
    credentials.

    Do not override the ``gridgate_*`` hook methods of this class to change what they do:
    a method overriding one without ``@hookimpl`` is no hook implementation, and pluggy
    would not call it. Hooks this class does not implement (``gridgate_iteration_started``,
    ``gridgate_iteration_finished``...) are yours to add with ``@hookimpl``.
    """

    #: The section's key holding the pilots one command submits (``pilots_per_jdl``).
    pilots_key: ClassVar[str] = "pilots_per_submission"
    #: The credential kinds the commands need (``("x509",)``); see ``BackendInfo.credentials``.
    credentials: ClassVar[tuple[str, ...]] = ()
    #: The :data:`RESOURCE_VALUES` your :meth:`submit` maps to its batch system's words.
    expresses: ClassVar[tuple[str, ...]] = ()
    #: The ``Resources.tags`` names your :meth:`submit` maps (``("constraint",)``).
    expresses_tags: ClassVar[tuple[str, ...]] = ()

    # --- what the director is told ------------------------------------------------------

    def mine(self, endpoint: Endpoint | str) -> bool:
        """Whether ``endpoint`` (or a backend name) is this backend's."""
        backend = endpoint if isinstance(endpoint, str) else endpoint.backend
        return backend == self.name

    def endpoints(self) -> tuple[Endpoint, ...]:
        """The configured endpoints in config order: one per name of ``endpoints_key``."""
        names = self.config.get(self.endpoints_key) if self.endpoints_key else None
        return tuple(Endpoint(self.name, str(entry)) for entry in names or ())

    @classmethod
    def lists_matches(cls) -> bool:
        """Whether this backend list-matches: it overrides :meth:`list_match`."""
        return cls.list_match is not Backend.list_match

    def _setting(self, key: str) -> Any:
        """``key`` of the section as written, else its schema's default (the base class reads
        keys every backend's schema has; a backend's own class reads ``self.settings``)."""
        if key in self.config:
            return self.config[key]
        return self.config_schema.get("properties", {}).get(key, {}).get("default")

    def backend_info(self) -> BackendInfo:
        """What ``gridgate_backend_info`` answers, built from the section.

        The endpoints, the ``pilots_key`` value, ``command_timeout``, ``list_match`` (default
        true, and only for a backend that list-matches), the ``credentials`` kinds and the
        resources mapped (``expresses``, ``expresses_tags``)."""
        return BackendInfo(
            backend=self.name,
            endpoints=self.endpoints(),
            pilots_per_submission=int(self.config.get(self.pilots_key, 1)),
            command_timeout=self.config.get("command_timeout"),
            # a list-matching backend whose schema has no list_match key always list-matches
            list_match=self.lists_matches() and self._setting("list_match") is not False,
            credentials=tuple(self.credentials),
            resources=tuple(self.expresses),
            resource_tags=tuple(self.expresses_tags),
        )

    # --- what you write (called for your own endpoints only) -----------------------------

    def submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        """Submit ``request`` to ``endpoint`` (``gridgate_submit``): a result in every case
        (None only for an endpoint that is not yours after all: one no longer configured)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to submit")

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        """What the failed ``result`` means; None lets the next classifier decide."""
        return None

    def job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        """The pilots' states in one bulk query; None: this backend cannot tell them."""
        return None

    def cancel(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> CancelResult | None:
        """Cancel the pilots; None: this backend cannot cancel."""
        return None

    def find_pilots(
        self, endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
    ) -> FoundPilots | None:
        """The jobs of the submissions ``names`` (or of every submission of ``fleet``) that
        ``endpoint`` holds, in every state (``gridgate_find_pilots``; build the answer with
        :func:`found_pilots`); None: this backend cannot look jobs up by name."""
        return None

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
        """At most ``size`` bytes of one stream of pilot ``job_id`` (``gridgate_pilot_output``:
        the start, or the end with ``from_end``; 0 bytes: only where it is and whether it is
        still there); None: this backend cannot read that stream."""
        return None

    def endpoint_state(self, endpoint: Endpoint, timeout: float) -> EndpointState | None:
        """What ``endpoint``'s queue says of itself (``gridgate_endpoint_state``): everybody's
        waiting and running jobs, free slots, limits, serving state; read the scheduler once a
        short interval for all your endpoints on it
        (:class:`~gridgate.core.endpoint_state.StateCache`). None: this backend cannot say
        (nothing changes for the endpoint)."""
        return None

    def list_match(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> ListMatchResult | None:
        """The resources matching ``request``; write it only if your backend list-matches.

        Only a backend that overrides this method list-matches (``list_match: true`` in a
        demand group of any other is a config error)."""
        return None

    # --- running commands -----------------------------------------------------------------

    def deadline(self, timeout: float) -> Deadline:
        """The deadline of one hook call: ``command_timeout`` when set, else ``timeout``.

        ``timeout`` is the director's limit the hook was called with; the section's
        ``command_timeout`` replaces it when set."""
        return Deadline.after(float(self.config.get("command_timeout") or timeout))

    def environment(self) -> dict[str, str] | None:
        """The commands' environment: the director's, the section's ``env`` and credentials.

        The variables of the ``credentials`` kinds (``context.credential_env``) go on top;
        None (the director's own, unchanged) when there is nothing to add. Read per command:
        a managed credential's path is the director's, not fixed at start."""
        extra = {str(k): str(v) for k, v in (self.config.get("env") or {}).items()}
        for kind in self.credentials:
            extra.update(self.context.credential_env(kind))
        return {**os.environ, **extra} if extra else None

    def run(
        self,
        argv: Sequence[str],
        deadline: Deadline,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> CommandResult:
        """Run ``argv``, killed at ``deadline``, its output capped at the site's limit.

        Through :func:`gridgate.core.runner.run` with ``max_output`` the site's
        ``director.max_output_bytes``, in :meth:`environment` unless ``env`` is given."""
        # through the module: a test may watch runner.run (and see the file a command reads)
        return runner.run(
            list(argv),
            deadline.left(),
            env=self.environment() if env is None else env,
            cwd=cwd,
            max_output=self.context.max_output_bytes,
        )

    # --- the hooks: "is this mine?" answered once -----------------------------------------

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        """The hook: :meth:`backend_info` for this backend's name, else None."""
        return self.backend_info() if self.mine(backend) else None

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        """The hook: :meth:`submit` for this backend's endpoints, else None.

        A request asking resources the backend does not map is refused here (a local fault
        naming them), not submitted without them: config checks refuse such a group first."""
        if not self.mine(endpoint):
            return None
        gaps = resource_gaps(request.resources, self.expresses, self.expresses_tags)
        if gaps:
            problem = (
                f"group {request.group!r} asks {', '.join(gaps)}, which backend "
                f"{self.name!r} cannot express: nothing submitted"
            )
            return SubmitResult(endpoint, ok=False, local_fault=problem, message=problem)
        return self.submit(endpoint, request, timeout)

    @hookimpl
    def gridgate_classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        """The hook: :meth:`classify_failure` for this backend's endpoints, else None."""
        return self.classify_failure(endpoint, result) if self.mine(endpoint) else None

    @hookimpl
    def gridgate_job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        """The hook: :meth:`job_status` for this backend's endpoints, else None."""
        return self.job_status(endpoint, job_ids, timeout) if self.mine(endpoint) else None

    @hookimpl
    def gridgate_cancel(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> CancelResult | None:
        """The hook: :meth:`cancel` for this backend's endpoints, else None."""
        return self.cancel(endpoint, job_ids, timeout) if self.mine(endpoint) else None

    @hookimpl
    def gridgate_find_pilots(
        self, endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
    ) -> FoundPilots | None:
        """The hook: :meth:`find_pilots` for this backend's endpoints, else None."""
        return self.find_pilots(endpoint, names, fleet, timeout) if self.mine(endpoint) else None

    @hookimpl
    def gridgate_pilot_output(
        self,
        endpoint: Endpoint,
        job_id: str,
        stream: OutputStream,
        name: str,
        size: int,
        from_end: bool,
        timeout: float,
    ) -> PilotOutput | None:
        """The hook: :meth:`pilot_output` for this backend's endpoints, else None."""
        if not self.mine(endpoint):
            return None
        return self.pilot_output(endpoint, job_id, stream, name, size, from_end, timeout)

    @hookimpl
    def gridgate_endpoint_state(self, endpoint: Endpoint, timeout: float) -> EndpointState | None:
        """The hook: :meth:`endpoint_state` for this backend's endpoints, else None."""
        return self.endpoint_state(endpoint, timeout) if self.mine(endpoint) else None

    @hookimpl
    def gridgate_list_match(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> ListMatchResult | None:
        """The hook: :meth:`list_match` for this backend's endpoints, else None."""
        return self.list_match(endpoint, request, timeout) if self.mine(endpoint) else None
