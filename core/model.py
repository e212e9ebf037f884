"""The small immutable values that cross hooks: what a plugin receives and what it returns."""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from gridgate.core._moved import moved_names

#: Outcomes of one submission attempt, as recorded in the accounting table.
Outcome = Literal["submitted", "failed", "no_match", "refused", "skipped"]
#: Notification levels. ``error`` and ``alarm`` are the seed's two destinations.
Level = Literal["info", "error", "alarm"]
#: The fixed set of pilot states core understands; a backend maps its native states onto it.
#: ``unknown`` is "the backend could not say" (gLite ``Unknown``, LSF ``UNKWN``); ``lost`` is
#: set only by core, for a pilot the backend has not known for ``lost_after`` seconds.
PilotState = Literal["waiting", "running", "done", "failed", "cancelled", "unknown", "lost"]
PILOT_STATES: tuple[str, ...] = (
    "waiting",
    "running",
    "done",
    "failed",
    "cancelled",
    "unknown",
    "lost",
)
#: States a pilot never leaves.
TERMINAL_STATES: frozenset[str] = frozenset({"done", "failed", "cancelled", "lost"})

__all__ = [
    "AVAILABILITY_STATES",
    "AVAILABLE",
    "OUTPUT_STREAMS",
    "PILOT_STATES",
    "TERMINAL_STATES",
    "AccountingRecord",
    "AdmissionRequest",
    "Availability",
    "BackendInfo",
    "CancelResult",
    "CommandResult",
    "CredentialRegistry",
    "CredentialStatus",
    "DemandFigure",
    "DemandRegistry",
    "Endpoint",
    "Episode",
    "Escalation",
    "Failure",
    "FailureReport",
    "FoundPilots",
    "Grant",
    "IterationInfo",
    "IterationSummary",
    "JobStatus",
    "Level",
    "ListMatchResult",
    "Notification",
    "Outcome",
    "OutputStream",
    "PilotOutput",
    "PilotReport",
    "PilotState",
    "PollReport",
    "Refusal",
    "Resources",
    "RetryReport",
    "StatusResult",
    "SubmitRequest",
    "SubmitResult",
    "elapsed_text",
]


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


#: An endpoint's availability states, from fully usable to not used at all (worst last).
AVAILABILITY_STATES: tuple[str, ...] = ("available", "degraded", "drained", "banned")


@dataclass(frozen=True)
class Availability:
    """Whether an endpoint gets new pilots, as a ``gridgate_endpoint_availability`` source
    says: ``available``; ``degraded`` (fewer: its weight halved); ``drained`` (none, its pilots
    still tracked); ``banned`` (none, and not polled when its backend says it cannot be,
    :attr:`BackendInfo.poll_banned`). ``reason`` says why, ``until`` when it ends (clock time,
    None: not known), ``source`` who said so (``gocdb``, ``operator``, ``pilot efficiency``;
    several, comma-separated and worst first, in the director's merged answer)."""

    state: str
    reason: str = ""
    until: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.state not in AVAILABILITY_STATES:
            raise ValueError(
                f"availability state {self.state!r} is not one of {AVAILABILITY_STATES}"
            )

    @property
    def rank(self) -> int:
        """0 (available) to 3 (banned): the larger, the less the endpoint is used."""
        return AVAILABILITY_STATES.index(self.state)

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "until": self.until,
            "source": self.source,
        }


#: What an endpoint no source says anything about is.
AVAILABLE = Availability("available")


@dataclass(frozen=True)
class Endpoint:
    """One server a backend can submit to.

    ``backend`` is the backend's entry-point name (``wms_glite``), ``name`` the host or queue
    name shown to people (``wms01.example.org``), ``url`` the address the command line needs
    (``https://wms01.example.org:7443/glite_wms_wmproxy_server``), empty when not applicable.
    """

    backend: str
    name: str
    url: str = ""

    @property
    def key(self) -> str:
        """Stable identifier used in state keys and metrics: ``backend/name``."""
        return f"{self.backend}/{self.name}"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class BackendInfo:
    """What a backend tells the director about itself.

    ``endpoints`` are its configured servers in config order; ``pilots_per_submission`` how
    many pilots one command carries (bulk/parametric jobs when > 1); ``command_timeout``
    overrides the director's limit for this backend's commands when set. ``credentials`` are
    the credential kinds its commands need (``("x509",)``): while the credential of one of
    them that an endpoint or a demand group uses (``credential:``, the nearest naming one of
    that kind, else the first configured) is unusable, that endpoint or group gets no pilot
    and the endpoint is not polled (a local fault of kind ``credential``); get their
    environment with ``context.credential_env(kind)``, which answers with the credential of
    the call's group and endpoint.
    """

    backend: str
    endpoints: tuple[Endpoint, ...]
    pilots_per_submission: int = 1
    command_timeout: float | None = None
    list_match: bool = False
    credentials: tuple[str, ...] = ()
    #: the :class:`Resources` values the backend maps to its batch system's words (of
    #: ``cores``, ``memory_mb``, ``walltime``); empty, the default, for one that maps none: a
    #: request may then ask only the defaults (one core, no memory or time asked), anything
    #: more is a config error naming it, never dropped in silence
    resources: tuple[str, ...] = ()
    #: the ``Resources.tags`` names the backend maps (Slurm's ``constraint``); any other tag
    #: is a config error, as an unmapped value is
    resource_tags: tuple[str, ...] = ()
    #: whether a ``banned`` endpoint's pilots are still polled (True, the default: a ban stops
    #: new pilots only); False for a backend whose servers cannot be asked while banned (the
    #: server itself is down), so that a banned one costs no command and blames no server
    poll_banned: bool = True


@dataclass(frozen=True)
class Resources:
    """What one pilot asks of its slot, from a demand group's ``resources``.

    ``cores`` is the number of CPUs of one pilot; ``memory_mb`` the memory of the whole pilot
    (a backend whose batch system counts memory per core, such as ARC, divides it); ``walltime``
    the pilot's time limit in seconds; ``tags`` free-form words a backend may map (a GPU type, a
    node feature). None means not asked: the batch system's default. A backend that cannot
    express a value says so at config time (a config error naming it), never silently.
    """

    cores: int = 1
    memory_mb: int | None = None
    walltime: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"Resources.cores must be >= 1, got {self.cores}")
        for name in ("memory_mb", "walltime"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"Resources.{name} must be >= 1 or None, got {value}")
        object.__setattr__(self, "tags", _frozen_mapping(self.tags))


@dataclass(frozen=True)
class SubmitRequest:
    """Pilots to submit in one command to one backend.

    ``group`` names the demand group (a queue or a requirements set) the request came from;
    ``count`` pilots go in this one command (a parametric/bulk job when > 1);
    ``requirements`` is the backend's requirement expression (JDL ``Requirements``, LSF ``-R``);
    ``list_match`` asks the director to list-match before submitting (None: the backend's default); ``attributes`` carries
    backend-specific extras from the demand config; ``user`` is who asks (for admission);
    ``resources`` what each pilot asks of its slot (:class:`Resources`); ``name`` the
    submission's unique name, its intent written under it before it is sent: a backend puts it
    in its jobs' names (:func:`gridgate.core.backend.job_name`) for :func:`gridgate_find_pilots`.
    """

    backend: str
    group: str = "default"
    count: int = 1
    requirements: str = ""
    list_match: bool | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    user: str = ""
    #: what each pilot of the request asks of its slot (None: the batch system's defaults)
    resources: Resources | None = None
    name: str = ""  # ``<fleet>-<12 hex digits>``; "" outside the director
    #: the demand group's ``credential`` (a ``credentials:`` name); "" when it names none
    credential: str = ""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"SubmitRequest.count must be >= 1, got {self.count}")
        object.__setattr__(self, "attributes", _frozen_mapping(self.attributes))


@dataclass(frozen=True)
class CommandResult:
    """What one external command did, including when it was killed or never started.

    ``returncode`` is None when the process never started (see ``launch_error``) or was killed
    at its deadline (``timed_out``). ``stdout``/``stderr`` hold what it printed up to the end
    or the kill, decoded as UTF-8 with replacement; ``*_truncated`` says output past the cap
    was dropped.
    """

    argv: tuple[str, ...]
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration: float = 0.0
    launch_error: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the command ran to completion with exit code 0."""
        return self.returncode == 0 and not self.timed_out and self.launch_error is None

    @property
    def command_line(self) -> str:
        """The argv quoted for display only (never executed through a shell)."""
        return shlex.join(self.argv)

    def describe(self) -> str:
        """One line saying what happened: ``timed out after 120.0 s``, ``exit code 1``..."""
        if self.launch_error is not None:
            return f"could not start: {self.launch_error}"
        if self.timed_out:
            return f"timed out after {self.duration:.1f} s and was killed"
        return f"exit code {self.returncode}"


@dataclass(frozen=True)
class ListMatchResult:
    """Resources (CE ids, queues) that match a request on one endpoint.

    ``ok`` is False when the command failed (a server fault, classified like a submit failure);
    ``ok`` True with no ``resources`` means "nothing matches here", which is not a fault.
    ``local_fault`` as in :class:`SubmitResult`.
    """

    endpoint: Endpoint
    ok: bool
    resources: tuple[str, ...] = ()
    command: CommandResult | None = None
    cached: bool = False
    local_fault: str = ""


@dataclass(frozen=True)
class SubmitResult:
    """The answer of a backend to one submission.

    ``ok`` with ``job_ids`` on success; on failure ``command`` carries the evidence that the
    classifier reads. ``operation`` names what was run (``Job Submit``, ``List Match``) for
    messages. ``no_match`` marks "no resources for this request here", which is not a fault.
    ``local_fault``, when set, says why nothing could be run because of this machine (a work
    folder missing, not writable or full: the folder and the OS error); it is classified as a
    local fault (kind ``local_io``), so no server is blamed.
    ``uncertain``: the request may have made pilots no answer names (an answer lost, a command
    killed at its deadline); ``job_ids`` one per pilot known made, the rest found by name."""

    endpoint: Endpoint
    ok: bool
    job_ids: tuple[str, ...] = ()
    command: CommandResult | None = None
    operation: str = "Job Submit"
    no_match: bool = False
    message: str = ""
    local_fault: str = ""
    uncertain: bool = False


@dataclass(frozen=True)
class JobStatus:
    """What a backend knows of one pilot job.

    ``state`` is one of :data:`PILOT_STATES` (never ``lost``: core decides that); ``native``
    the backend's own state text as printed (``Done (Exit Code !=0)``, ``PEND``,
    ``CANCELLED by 0``) and ``reason`` its reason text, both kept for people;
    ``exit_code`` when the backend reports one.
    """

    job_id: str
    state: PilotState
    native: str = ""
    reason: str = ""
    exit_code: int | None = None

    def __post_init__(self) -> None:
        if self.state not in PILOT_STATES or self.state == "lost":
            raise ValueError(
                f"JobStatus.state must be one of {PILOT_STATES[:-1]}, got {self.state!r}"
            )


@dataclass(frozen=True)
class StatusResult:
    """The answer of a backend to one bulk status query on one endpoint.

    ``statuses`` maps job id to :class:`JobStatus` for every id the backend still knows; an id
    that was asked for and is absent is one the backend no longer knows (core marks it
    ``unknown``, then ``lost``). ``ok`` False means the query itself failed (a fault of the
    server, classified and escalated like a failed submission; the pilots keep their last
    known state); ``command`` carries the evidence, ``commands`` how many commands were run
    (more than 1 only when a long id list had to be split).
    """

    endpoint: Endpoint
    ok: bool
    statuses: Mapping[str, JobStatus] = field(default_factory=dict)
    command: CommandResult | None = None
    commands: int = 1
    operation: str = "Job Status"
    message: str = ""
    #: why nothing (or not everything) could be asked because of this machine (an id file that
    #: cannot be written, gridgate's own output cap): a local fault, no server blamed
    local_fault: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "statuses", _frozen_mapping(self.statuses))


@dataclass(frozen=True)
class FoundPilots:
    """The answer of a backend to "which jobs of these submissions do you hold"
    (:func:`gridgate_find_pilots`).

    ``found`` maps a submission name (:attr:`SubmitRequest.name`) to the jobs the server holds
    under it in **any** state, one :class:`JobStatus` per pilot (an array's tasks each on their
    own, with the ids ``gridgate_job_status`` takes); a name with none is left out. ``ok``
    False: the server could not be asked now (core asks again later)."""

    endpoint: Endpoint
    ok: bool
    found: Mapping[str, tuple[JobStatus, ...]] = field(default_factory=dict)
    command: CommandResult | None = None
    operation: str = "Job Find"
    message: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "found", _frozen_mapping({k: tuple(v) for k, v in self.found.items()})
        )


@dataclass(frozen=True)
class CancelResult:
    """The answer of a backend to cancelling jobs on one endpoint.

    ``cancelled`` are the ids the batch system accepted to cancel, and only those: core
    records each as ``cancelled`` (terminal: never polled again, and left out of the aborted
    verdict, since it was gridgate's decision). A job that had **already finished**, or that
    the batch system does not know, is left out of ``cancelled``, never reported as
    cancelled: its pilot keeps its state and the next ``gridgate_job_status`` poll records how
    it really ended (``done``, ``failed``; or ``unknown``, then ``lost`` after
    ``director.pilots.lost_after``). Say why in ``message`` (``not cancelled: 1 had already
    finished``); core reports the ids left out as not cancelled. When the cancel command
    cannot tell which of its ids it skipped (it only counts), leave them all out.
    ``ok`` False when the command failed as a whole (timed out, could not start, refused):
    ``cancelled`` then holds only what earlier commands of the same call confirmed.
    """

    endpoint: Endpoint
    ok: bool
    cancelled: tuple[str, ...] = ()
    command: CommandResult | None = None
    operation: str = "Job Cancel"
    message: str = ""
    #: as in :class:`StatusResult`: a fault of this machine, not of the server
    local_fault: str = ""


#: The streams of a pilot that ``gridgate_pilot_output`` reads: its standard output, its
#: standard error, or a file of the job's own (its name in :attr:`PilotOutput.name`).
OutputStream = Literal["stdout", "stderr", "file"]
OUTPUT_STREAMS: tuple[str, ...] = ("stdout", "stderr", "file")


@dataclass(frozen=True)
class PilotOutput:
    """The answer of a backend to reading one stream of one pilot (``gridgate_pilot_output``).

    ``ok`` False when the CE could not be asked (down, refused, timed out: ``message`` and
    ``command`` say why); nothing is then known of ``held``. ``held`` False when the CE
    answered that it no longer holds the job, or the job holds no such file (``message``
    says which: ``the CE no longer holds job 12``, ``file /scratch/12.out is not there``).
    ``where`` says where the stream is, as the CE names it (a path, a URL), as far as known.
    ``text`` is what was read, at most the bytes asked for, decoded as UTF-8 with
    replacement and not yet escaped (the caller escapes it with
    :func:`gridgate.core.text.printable`); ``cut`` is true when the stream holds more than
    ``text`` (``size``, when known, is its whole length in bytes); ``from_end`` says that
    ``text`` is the stream's end rather than its start.
    """

    job_id: str
    stream: OutputStream
    ok: bool = True
    held: bool = True
    where: str = ""
    text: str = ""
    cut: bool = False
    size: int | None = None
    from_end: bool = False
    #: the file's name for ``stream == "file"`` ('' otherwise)
    name: str = ""
    command: CommandResult | None = None
    message: str = ""

    def __post_init__(self) -> None:
        if self.stream not in OUTPUT_STREAMS:
            raise ValueError(f"stream must be one of {OUTPUT_STREAMS}, got {self.stream!r}")


@dataclass(frozen=True)
class Failure:
    """A classified failure.

    ``kind`` is a short word (``timeout``, ``overload``, ``drained``, ``unreachable``, ``auth``,
    ``usage``, ``bad_output``, ``launch``, ``error``...). ``exclude`` takes the endpoint out of
    rotation; ``notify`` says whether people hear about it; ``transient`` says a retry elsewhere
    is worthwhile. ``reason`` is one human line.

    ``local`` says the fault is on the director's own machine (the command could not be
    started at all, or its input file could not be written), not the server's: no server is blamed (no failing cache, no ticket
    escalation), the backend is paused for the rest of the iteration, and one error per
    episode says what to fix here.
    """

    kind: str
    exclude: bool = True
    notify: bool = True
    transient: bool = True
    reason: str = ""
    local: bool = False


@dataclass(frozen=True)
class Episode:
    """A server's failure episode: it started at the first failure after the server was last
    in good standing and lasts while it keeps failing within ``failing_expiry + ticket_expiry``.

    ``start`` is the wall time of its first failure, ``failures`` how many failures it has
    counted (this one included). ``entered`` is true when this failure put the server in the
    failing cache, false when it was there already (another thread or director was first, or
    :meth:`gridgate.core.failing.FailingCache.episode` was asked outside a failure).
    """

    start: float
    failures: int
    entered: bool = False


@dataclass(frozen=True)
class Escalation:
    """What to do about a failure, decided by the escalation hook.

    ``level`` is ``error`` or ``alarm``, or None to record the failure and tell nobody.
    ``episode_start`` is the wall time of the first failure of this episode (the seed's
    "failing at least for N hours" comes from it, see :meth:`failing_for`); ``failures`` counts failures in the episode.
    """

    level: Level | None
    episode_start: float
    failures: int = 1
    reason: str = ""

    def hours_failing(self, now: float) -> float:
        """Hours since the episode started, as they are (never rounded up, never clamped)."""
        return max(0.0, now - self.episode_start) / 3600

    def failing_for(self, now: float) -> str:
        """The time since the episode's first failure as the alarm says it (:func:`elapsed_text`)."""
        return elapsed_text(now - self.episode_start)


def elapsed_text(seconds: float) -> str:
    """A duration as an alarm's "failing at least for ..." says it, rounded down so that
    "at least" stays true: ``42 seconds`` below a minute, ``17 minutes`` below an hour,
    ``1.5 hours`` (one decimal) from an hour on.

    :param seconds: how long, for instance ``now - notification.episode_start``.
    """
    seconds = max(0.0, seconds)
    if seconds < 60:
        whole, unit = int(seconds), "second"
    elif seconds < 3600:
        whole, unit = int(seconds // 60), "minute"
    else:
        tenths = int(seconds // 360)
        return f"{tenths // 10}.{tenths % 10} hours"
    return f"{whole} {unit}{'' if whole == 1 else 's'}"


@dataclass(frozen=True)
class Notification:
    """A message for people, broadcast to every notifier.

    ``level`` chooses the destination; ``subject`` and ``body`` are ready to send; ``endpoint``,
    ``failure``, ``command`` and the episode fields let a notifier render its own format (a GGUS
    ticket) without re-parsing the body. ``key`` identifies the event for de-duplication;
    ``logged`` (API 1.10): its sender logged it itself, so the ``log`` notifier does not."""

    level: Level
    subject: str
    body: str
    created: float
    endpoint: Endpoint | None = None
    failure: Failure | None = None
    command: CommandResult | None = None
    episode_start: float | None = None
    failures_in_episode: int = 0
    key: str = ""
    logged: bool = False


@dataclass(frozen=True)
class CredentialStatus:
    """What a credential plugin found when it checked (and, if needed, renewed) its credential.

    ``name`` is the credential's key in ``credentials:`` (``lhcb-proxy``; the plugin's
    entry-point name, ``x509_proxy``, for an entry named after it), ``kind`` the credential kind
    backends name in :attr:`BackendInfo.credentials` (``x509``, ``token``), ``path`` the file.
    ``usable`` False means nothing may be submitted with it (missing, unreadable, not a
    credential, not yet or no longer valid): ``message`` says why in one line. ``expires`` is
    its end time (epoch seconds; None when it could not be read). ``command`` is the renewal
    command's result when one ran this iteration, ``renewed`` True when it left a credential
    that needs no renewal. ``renewal_due`` (API 1.9): usable, less than its ``min_lifetime``
    left, and no renewal extended it; ``at_risk``: besides, it ends before the next
    iteration's renewal could finish (``director.cycle_seconds`` plus the renewal's deadline)."""

    name: str
    kind: str
    usable: bool
    path: str = ""
    expires: float | None = None
    message: str = ""
    command: CommandResult | None = None
    renewed: bool = False
    at_risk: bool = False
    renewal_due: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The status for ``gridgate run --json`` (the command as its argv and exit code)."""
        command = self.command
        return {
            "name": self.name,
            "kind": self.kind,
            "usable": self.usable,
            "path": self.path,
            "expires": self.expires,
            "message": self.message,
            "renewed": self.renewed,
            "at_risk": self.at_risk,
            "renewal_due": self.renewal_due,
            "command": None
            if command is None
            else {
                "argv": list(command.argv),
                "returncode": command.returncode,
                "timed_out": command.timed_out,
                "launch_error": command.launch_error,
            },
        }


class CredentialRegistry:
    """Collects what the credential plugins report in one iteration.

    Plugins call :meth:`add` from ``gridgate_check_credentials``; the director reads
    :attr:`statuses`. The hook runs in the director's thread, one plugin after another.
    """

    def __init__(self) -> None:
        self._statuses: list[CredentialStatus] = []

    def add(self, status: CredentialStatus) -> None:
        """Report the state of one credential."""
        if not isinstance(status, CredentialStatus):
            raise TypeError(f"add() takes a CredentialStatus, got {type(status).__name__}")
        self._statuses.append(status)

    @property
    def statuses(self) -> tuple[CredentialStatus, ...]:
        return tuple(self._statuses)


@dataclass(frozen=True)
class AdmissionRequest:
    """Who wants to run what, asked of admission control before a command runs.

    ``category`` is ``query``, ``submission`` or ``other``; ``opcode`` a batch opcode or command
    name; ``endpoint`` is the server the command will contact (None for plain commands).
    """

    category: str
    opcode: str
    user: str = ""
    host: str = ""
    size: int = 0
    endpoint: Endpoint | None = None


@dataclass(frozen=True)
class Grant:
    """Permission to proceed. ``issuer`` is the admission plugin that must release it;
    ``token`` is empty when no token was needed (category disabled, controller unavailable)."""

    issuer: str
    token: str = ""
    category: str = ""
    waited: float = 0.0
    note: str = ""


@dataclass(frozen=True)
class Refusal:
    """Permission denied: do not run the command now. Not a server failure."""

    issuer: str
    reason: str
    retry_after: float | None = None


@dataclass(frozen=True)
class IterationInfo:
    """Handed to lifecycle and demand hooks: which iteration this is and when it started."""

    number: int
    started: float


@dataclass(frozen=True)
class AccountingRecord:
    """One row per submission attempt: what `gridgate report` counts."""

    time: float
    backend: str
    endpoint: str
    outcome: Outcome
    group: str = "default"
    pilots: int = 0
    failure_kind: str = ""
    job_ids: tuple[str, ...] = ()
    duration: float = 0.0
    iteration: int = 0
    #: 1 for a submission's first try, 2... for its retries elsewhere in the same iteration
    attempt: int = 1
    #: the submission's name (:attr:`SubmitRequest.name`); "" for an attempt that sent nothing
    name: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "backend": self.backend,
            "endpoint": self.endpoint,
            "outcome": self.outcome,
            "group": self.group,
            "pilots": self.pilots,
            "failure_kind": self.failure_kind,
            "job_ids": list(self.job_ids),
            "duration": self.duration,
            "iteration": self.iteration,
            "attempt": self.attempt,
            **({"name": self.name} if self.name else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AccountingRecord:
        fields = dict(data)
        if "job_ids" in fields:  # a list in JSON, a tuple here; absent: the field's default
            fields["job_ids"] = tuple(fields["job_ids"])
        return cls(**fields)


class _DeprecatedItems:
    """Answers ``x["key"]`` and ``x.get("key")`` as the dict it replaced did (API 1.2), with a
    :class:`DeprecationWarning` naming the attribute to use instead; kept for one minor
    release (docs/api.md, "Versions and deprecation")."""

    __slots__ = ()

    def as_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def _legacy(self, key: str) -> Any:
        old = self.as_dict()
        if key not in old:
            raise KeyError(key)
        warnings.warn(
            f"{type(self).__name__}[{key!r}] is deprecated since API 1.3: use the attribute .{key}",
            DeprecationWarning,
            stacklevel=3,
        )
        return old[key]

    def __getitem__(self, key: str) -> Any:
        return self._legacy(key)

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated: the attribute ``key``, as the dict it replaced answered it."""
        return self._legacy(key) if key in self.as_dict() else default

    def keys(self) -> list[str]:
        """Deprecated: the keys of the dict this value replaced."""
        warnings.warn(
            f"{type(self).__name__}.keys() is deprecated since API 1.3: use its attributes",
            DeprecationWarning,
            stacklevel=2,
        )
        return list(self.as_dict())


@dataclass(frozen=True)
class FailureReport(_DeprecatedItems):
    """One failure of a server in an iteration (a submission, a status poll, aborting pilots, a
    cancel this machine could not run), as ``gridgate run --json``'s ``failures`` lists it."""

    backend: str
    endpoint: str
    kind: str
    #: the failed command's exit status; None when no command ran or it was killed
    returncode: int | None = None
    timed_out: bool = False
    #: the failed command's argv, () when no command ran
    command: tuple[str, ...] = ()
    operation: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "endpoint": self.endpoint,
            "kind": self.kind,
            "returncode": self.returncode,
            "timed_out": self.timed_out,
            "command": list(self.command),
            "operation": self.operation,
        }


@dataclass(frozen=True)
class RetryReport(_DeprecatedItems):
    """A failed submission and what was done about it: ``outcome`` is ``retried`` (sent to
    another server) or why not (``not retried: ...``)."""

    backend: str
    group: str
    pilots: int
    #: the server it failed on
    failed_on: str
    kind: str
    attempt: int
    outcome: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "group": self.group,
            "pilots": self.pilots,
            "failed_on": self.failed_on,
            "kind": self.kind,
            "attempt": self.attempt,
            "outcome": self.outcome,
        }


@dataclass(frozen=True)
class PollReport(_DeprecatedItems):
    """One endpoint's status poll: how many pilots were asked about, the ``outcome`` (``ok``,
    ``failed``, ``refused``, ``unsupported``, ``plugin_error``, ``local_fault``,
    ``output_cap``), the commands it took and how many pilots changed state."""

    backend: str
    endpoint: str
    pilots: int
    outcome: str
    commands: int = 0
    changed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "endpoint": self.endpoint,
            "pilots": self.pilots,
            "outcome": self.outcome,
            "commands": self.commands,
            "changed": self.changed,
        }


@dataclass(frozen=True)
class PilotReport(_DeprecatedItems):
    """What the pilot tracker did in an iteration: its polls, the pilots that changed state,
    those cancelled (per ``backend/endpoint``), the endpoints out of rotation for aborting
    pilots, the demand trimmed (per backend and limit), and the pilots by ``backend/endpoint``
    and state afterwards. ``blind`` says why nothing was polled ('' when it was)."""

    polls: tuple[PollReport, ...] = ()
    changed: int = 0
    cancelled: Mapping[str, int] = field(default_factory=dict)
    aborted: tuple[str, ...] = ()
    trimmed: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    states: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    blind: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cancelled", _frozen_mapping(self.cancelled))
        object.__setattr__(
            self,
            "trimmed",
            MappingProxyType({k: _frozen_mapping(v) for k, v in self.trimmed.items()}),
        )
        object.__setattr__(
            self,
            "states",
            MappingProxyType({k: _frozen_mapping(v) for k, v in self.states.items()}),
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "polls": [poll.as_dict() for poll in self.polls],
            "changed": self.changed,
            "cancelled": dict(self.cancelled),
            "aborted": list(self.aborted),
            "trimmed": {backend: dict(limits) for backend, limits in self.trimmed.items()},
            "states": {key: dict(states) for key, states in self.states.items()},
        }
        if self.blind:
            out["blind"] = self.blind
        return out


@dataclass(frozen=True)
class IterationSummary:
    """What one director iteration did; the ``--json`` line is built from it.

    **Deprecated since API 1.3**: reading the entries of ``failures``, ``retries`` and ``pilots``
    as dicts (``f["kind"]``, ``p.get("aborted")``), as 1.2 typed them, still works but logs a
    ``DeprecationWarning`` naming the attribute to use (``f.kind``, ``p.aborted``); it goes away
    with API 2.0."""

    number: int
    started: float
    duration: float
    records: tuple[AccountingRecord, ...] = ()
    excluded: tuple[str, ...] = ()
    notifications: tuple[Notification, ...] = ()
    failures: tuple[FailureReport, ...] = ()
    config_error: str | None = None
    #: failed submissions that were (or, with why not, were not) sent to another server
    retries: tuple[RetryReport, ...] = ()
    #: what the pilot tracker did: polls, state changes, cancels, aborted endpoints, demand
    #: trimmed per backend and limit, and pilots by endpoint and state after the iteration's
    #: submissions (gridgate.core.engine.tracking); None when pilots are not tracked
    pilots: PilotReport | None = None
    #: what each credential plugin found before anything was polled or submitted
    credentials: tuple[CredentialStatus, ...] = ()
    #: the endpoints not fully available this iteration (``gridgate_endpoint_availability``,
    #: merged: the worst state wins), by ``Endpoint.key``; available ones are left out
    unavailable: Mapping[str, Availability] = field(default_factory=dict)
    #: what the demand asked for, per (backend, group), before the limits, with the figure of
    #: waiting work it was sized from when its plugin gave one (:meth:`DemandRegistry.figure`)
    demand: tuple[DemandFigure, ...] = ()
    #: what waits for each unusable credential, by its name: backends (``arc``), endpoints
    #: (``arc/ce2``) and demand groups (``arc group lhcb``) that use it (API 1.12)
    credential_users: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class DemandFigure:
    """What the demand of one iteration asked for one (backend, group): ``pilots`` before the
    limits; ``jobs`` the waiting work its source counted (None: a demand without one, static or
    file), ``fresh`` whether that figure was read this iteration (False: the last good one,
    held while the source fails), ``source`` the plugin that said so. While the source fails,
    ``problem`` says why and ``failing_for`` for how many seconds; ``stale`` says it has failed
    longer than its ``keep_last``, so the group asks for no pilots until it answers (the
    director tells people once per such episode, and again when it answers)."""

    backend: str
    group: str
    pilots: int = 0
    jobs: int | None = None
    fresh: bool = True
    source: str = ""
    problem: str = ""
    failing_for: float | None = None
    stale: bool = False


class DemandRegistry:
    """Collects what the demand hooks ask for in one iteration.

    Plugins call :meth:`add`; the director reads :attr:`requests`. Thread-safe is not needed:
    demand hooks run one after another before any submission starts.
    """

    def __init__(self) -> None:
        self._requests: list[SubmitRequest] = []
        self._figures: dict[tuple[str, str], DemandFigure] = {}

    def add(self, request: SubmitRequest, times: int = 1) -> None:
        """Ask for ``times`` submissions of ``request`` this iteration."""
        if times < 0:
            raise ValueError(f"times must be >= 0, got {times}")
        self._requests.extend([request] * times)

    @property
    def requests(self) -> tuple[SubmitRequest, ...]:
        return tuple(self._requests)

    def figure(self, figure: DemandFigure) -> None:
        """Say what waiting work a group's demand was sized from (the journal line, the
        ``gridgate_demand_waiting_jobs`` metric and ``--json`` show it); a group whose plugin
        says nothing is shown with what it asked only."""
        self._figures[(figure.backend, figure.group)] = figure

    @property
    def figures(self) -> tuple[DemandFigure, ...]:
        """Per (backend, group) asked for, what was asked (the requests' pilots) and the
        figures plugins gave (:meth:`figure`), by backend and group."""
        asked: dict[tuple[str, str], int] = {}
        for request in self._requests:
            key = (request.backend, request.group)
            asked[key] = asked.get(key, 0) + request.count
        out = []
        for key in sorted(set(asked) | set(self._figures)):
            told = self._figures.get(key, DemandFigure(*key))
            out.append(replace(told, pilots=asked.get(key, 0)))
        return tuple(out)


__getattr__ = moved_names(__name__)
