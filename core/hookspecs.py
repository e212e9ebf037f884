"""The hook contract between gridgate's engine and its plugins.

Decisions are ``firstresult`` hooks: the first non-None answer wins, and a plugin returns None
for what is not its own. Events are broadcast to every plugin. Call hooks with keyword
arguments only. The built-in defaults (``gridgate.core.defaults``) are plugins registered
``trylast`` so that any configured plugin answers before them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gridgate.core import hookspec

if TYPE_CHECKING:
    import click

    from gridgate.core.endpoint_state import EndpointState
    from gridgate.core.model import (
        AccountingRecord,
        AdmissionRequest,
        Availability,
        BackendInfo,
        CancelResult,
        CredentialRegistry,
        DemandRegistry,
        Endpoint,
        Episode,
        Escalation,
        Failure,
        FoundPilots,
        Grant,
        IterationInfo,
        IterationSummary,
        ListMatchResult,
        Notification,
        OutputStream,
        PilotOutput,
        Refusal,
        StatusResult,
        SubmitRequest,
        SubmitResult,
    )
    from gridgate.core.scheduler import SchedulerChange, SchedulerRequests, SchedulerRPCs

#: The hook specifications, one per hook (docs/hooks.md documents each).
__all__ = [
    "gridgate_register_commands",
    "gridgate_iteration_started",
    "gridgate_demand",
    "gridgate_endpoint_availability",
    "gridgate_endpoint_state",
    "gridgate_iteration_finished",
    "gridgate_backend_info",
    "gridgate_check_credentials",
    "gridgate_credential_env",
    "gridgate_select_endpoint",
    "gridgate_admit",
    "gridgate_release",
    "gridgate_list_match",
    "gridgate_submit",
    "gridgate_classify_failure",
    "gridgate_escalate",
    "gridgate_notify",
    "gridgate_submission_finished",
    "gridgate_job_status",
    "gridgate_cancel",
    "gridgate_pilot_output",
]


# -------------------------------------------------------------------------------------------
# command line
# -------------------------------------------------------------------------------------------


@hookspec
def gridgate_register_commands(cli: click.Group) -> None:
    """Add sub-commands to the ``gridgate`` command line.

    Called once when the ``gridgate`` program starts, before arguments are parsed, on every
    plugin of the ``gridgate.cli`` entry-point group (commands must exist before any config
    is read).

    :param cli: the top-level click group; call ``cli.add_command(...)``.
    :return: nothing (broadcast).
    """


# -------------------------------------------------------------------------------------------
# iteration lifecycle
# -------------------------------------------------------------------------------------------


@hookspec
def gridgate_iteration_started(iteration: IterationInfo) -> None:
    """An iteration of the director begins.

    Called after the config has been re-read and before demand is asked for.

    :param iteration: the iteration number and its start time.
    :return: nothing (broadcast).
    """


@hookspec
def gridgate_demand(iteration: IterationInfo, demand: DemandRegistry) -> None:
    """Say what to submit this iteration.

    Called once per iteration, after :func:`gridgate_iteration_started`, on every demand
    plugin in config order.

    :param iteration: the iteration number and its start time.
    :param demand: registry; call ``demand.add(SubmitRequest(...), times=N)``.
    :return: nothing (broadcast); contribute through ``demand``.
    """


@hookspec
def gridgate_endpoint_availability(
    iteration: IterationInfo, endpoints: Sequence[Endpoint], changed: frozenset[str] | None
) -> Mapping[str, Availability] | None:
    """Say which endpoints are not fully available: downtimes, bans, drains, bad efficiency.

    Called once per iteration, after the demand and before any pilot is polled or submitted,
    on every availability plugin (each on its own: one that raises is logged and left out, as
    a broadcast). The answers are merged per endpoint, the worst state winning (banned >
    drained > degraded > available) with its reason and end; the merged answer's ``source``
    names every source that said the endpoint was not available. The director honours it:
    drained and banned endpoints get no new pilots (drained ones are still polled, banned
    ones unless :attr:`BackendInfo.poll_banned` is False), degraded ones count half in the
    selectors' weights, and a failure on an endpoint GOCDB says is in a downtime is not
    mailed. One notice (level info) is sent when an endpoint's merged state starts, changes
    or ends, never a mail.

    :param iteration: the iteration number and its start time.
    :param endpoints: every configured endpoint of every configured backend, in config order.
    :param changed: keys of the endpoints whose pilots changed state at the last iteration's
        polls (a source reading the pilot registry may read only those again); None when not
        known (no tracking, the first iteration).
    :return: ``{Endpoint.key: Availability}`` for the endpoints this source has something to
        say about (an endpoint left out is available as far as it goes); None for nothing.
    """


@hookspec(firstresult=True)
def gridgate_endpoint_state(endpoint: Endpoint, timeout: float) -> EndpointState | None:
    """Say what ``endpoint``'s queue reports of itself: everybody's waiting and running jobs,
    its free slots, its limits and its serving state (:class:`EndpointState`).

    Called once per iteration for every endpoint that may get pilots this iteration (its
    backend has demand; it is not drained, banned, failing or waiting for its credential),
    after :func:`gridgate_endpoint_availability` and before any pilot is polled or submitted,
    under an admission grant of category ``query`` (opcode ``QUEUE_STATE``). The director
    honours the answer: a queue that is not in ``production`` is drained this iteration
    (merged with the availability sources' answers, source ``queue``: shown in ``servers
    list``, the journal and the availability metric); one whose ``waiting`` reaches the
    endpoint's ``max_waiting`` gets no pilot this iteration (skipped as ``max_waiting``). Read
    the scheduler once per short interval for all its endpoints
    (:class:`gridgate.core.endpoint_state.StateCache`); every command killed at ``timeout``.

    :param endpoint: the endpoint (a CE queue, a partition) asked about.
    :param timeout: hard limit in seconds for all the commands of this call.
    :return: an :class:`EndpointState`; None when ``endpoint.backend`` is not this plugin's
        or it cannot say now (nothing changes for the endpoint then).
        Stops at first non-None result.
    """


@hookspec
def gridgate_iteration_finished(summary: IterationSummary) -> None:
    """An iteration has finished: every submission is accounted for.

    Called after the last submission of the iteration and its accounting, before the
    director sleeps until the next cycle.

    :param summary: what the iteration did.
    :return: nothing (broadcast).
    """


@hookspec(firstresult=True)
def gridgate_backend_info(backend: str) -> BackendInfo | None:
    """Describe a configured backend: its servers, bulk size and command limit.

    Called at the start of every iteration for every backend that has demand (so a config
    reload that changes the server list takes effect at the next iteration), and before that
    by the pilot tracker for every configured backend and every backend with tracked pilots.

    :param backend: the backend's entry-point name (``wms_glite``).
    :return: a :class:`BackendInfo`; None when ``backend`` is not this plugin's.
        Stops at first non-None result.
    """


# -------------------------------------------------------------------------------------------
# credentials: checked (and renewed) before anything uses them, handed to backends' commands
# -------------------------------------------------------------------------------------------


@hookspec
def gridgate_check_credentials(
    iteration: IterationInfo, timeout: float, credentials: CredentialRegistry
) -> None:
    """Check each configured credential, renew it when it runs short, and report its state.

    Called once per iteration on every plugin of the ``gridgate.credentials`` group, after
    :func:`gridgate_demand` and before any pilot is polled or submitted, in the director's
    thread. A renewal command must be an argv run with ``runner.run`` and killed at its
    deadline. The director acts on the reports, each credential on its own (by its
    ``CredentialStatus.name``, its key in ``credentials:``): the endpoints and demand groups
    that would use an unusable credential (of a kind their backend's
    :attr:`BackendInfo.credentials` lists) submit nothing, and an endpoint whose credential is
    unusable is not polled, this iteration (a local fault of kind ``credential``: no server is
    blamed); the director tells people once per episode. A credential kept in a file and
    refreshed by a command (a WLCG bearer token) needs only a subclass of
    ``gridgate.core.credentials.CredentialPlugin``: see
    [plugins.md](plugins.md#credential-plugins-and-a-token_file).

    :param iteration: the iteration number and its start time.
    :param timeout: the director's ``command_timeout``: the renewal's deadline in seconds
        unless the plugin's section sets its own.
    :param credentials: registry; call ``credentials.add(CredentialStatus(...))`` once per
        credential the plugin manages.
    :return: nothing (broadcast); report through ``credentials``.
    """


@hookspec(firstresult=True)
def gridgate_credential_env(kind: str) -> Mapping[str, str] | None:
    """The environment variables that hand a credential to a backend's commands.

    Called by ``PluginContext.credential_env(kind)`` (when no named credential is in force
    for the call: else that credential's plugin is asked itself), which a backend calls when it builds a
    command (``{**os.environ, **self.context.credential_env("x509")}``), in any process that
    built the plugins from the config: the director, and commands such as
    ``gridgate pilots cancel`` that run no iteration. Answer from the configured section (the
    path is there), not from the last check.

    :param kind: a credential kind a backend names in :attr:`BackendInfo.credentials`
        (``x509``, ``token``).
    :return: the variables (``{"X509_USER_PROXY": "/var/lib/gridgate/proxy.pem"}``); None
        when this plugin's credential is not of ``kind`` (with no answer the backend gets
        ``{}`` and runs unmanaged, with the director's own environment).
        Stops at first non-None result.
    """


# -------------------------------------------------------------------------------------------
# one submission, in the order the director calls them
# -------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def gridgate_select_endpoint(
    candidates: Sequence[Endpoint],
    request: SubmitRequest,
    weights: Mapping[str, int],
    availability: Mapping[str, Availability],
    queues: Mapping[str, EndpointState],
) -> Endpoint | None:
    """Choose the server for one submission.

    Called for every submission with the backend's servers minus those in the failing cache,
    those excluded earlier in this iteration, and those drained or banned this iteration
    (:func:`gridgate_endpoint_availability`); never called with an empty list. A selector
    that takes none of ``weights``, ``availability`` and ``queues`` keeps working (pluggy passes an
    implementation only the arguments it names); one that honours them can hand both to
    ``gridgate.core.weights.effective_weights``.

    :param candidates: usable endpoints of ``request.backend``, in config order.
    :param request: what is to be submitted.
    :param weights: the backend section's ``weights`` (``{ENDPOINT: N}``, by name or by key;
        an endpoint not named weighs 1, 0 means never).
    :param availability: this iteration's merged availability of the candidates that are
        not fully available (by ``Endpoint.key``; a degraded one counts half).
    :param queues: what the candidates' queues said of themselves this iteration
        (:func:`gridgate_endpoint_state`, by ``Endpoint.key``; an endpoint whose backend cannot
        say is left out): the ``free_slots`` selector weighs by their free slots (API 1.13).
    :return: one of ``candidates``; None to let the next plugin decide (the default picks
        uniformly at random). Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_admit(request: AdmissionRequest) -> Grant | Refusal | None:
    """Ask admission control whether a command may run now.

    Called after the endpoint is chosen and before any command contacts it (the endpoint is
    part of the request so that per-server limits are possible). May block up to the
    controller's wait limit.

    :param request: category, opcode, user and the endpoint about to be contacted.
    :return: a :class:`Grant` (proceed, and later release it) or a :class:`Refusal` (do not
        run now; not a server failure); None if this plugin does not govern the request
        (the default admits everything). Stops at first non-None result.
    """


@hookspec
def gridgate_release(grant: Grant) -> None:
    """Give back what :func:`gridgate_admit` granted.

    Called exactly once per grant, when the command has finished or was killed, also when the
    submission failed. Every plugin is called; only the one named by ``grant.issuer`` acts.

    :param grant: the grant returned by :func:`gridgate_admit`.
    :return: nothing (broadcast).
    """


@hookspec(firstresult=True)
def gridgate_list_match(
    endpoint: Endpoint, request: SubmitRequest, timeout: float
) -> ListMatchResult | None:
    """Find the resources that match ``request`` on ``endpoint``.

    Called before a submission whose ``request.list_match`` is true, unless a cached answer
    for (endpoint, requirements) is still fresh. The command must be killed at ``timeout``.
    Only a backend that implements this hook may be asked: ``list_match: true`` for one that
    does not is a config error (or, asked at run time, those pilots are skipped as ``config``).

    :param endpoint: the chosen server.
    :param request: the submission to match.
    :param timeout: hard limit in seconds for the command.
    :return: a :class:`ListMatchResult`; None when ``endpoint.backend`` is not this plugin's.
        Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_submit(
    endpoint: Endpoint, request: SubmitRequest, timeout: float
) -> SubmitResult | None:
    """Submit ``request`` to ``endpoint``.

    Called once per submission, after admission and list-match. The command must be killed
    at ``timeout`` and whatever it printed kept in the result. Pass
    ``max_output=self.context.max_output_bytes`` to ``runner.run``: the site's
    ``director.max_output_bytes`` is not applied to a plugin's own commands otherwise.

    An ``ok`` result carries at least one job id: one per pilot (``request.count`` of them)
    or one standing for the whole bulk (an array or collection id); the director counts
    ``request.count`` pilots submitted either way. ``ok`` without any job id is turned into
    a failure (classified like exit 0 without an answer, ``bad_output``).

    :param endpoint: the chosen server.
    :param request: the pilots to submit.
    :param timeout: hard limit in seconds for the command.
    :return: a :class:`SubmitResult` (failures are results, not exceptions); None when
        ``endpoint.backend`` is not this plugin's. Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_classify_failure(endpoint: Endpoint, result: SubmitResult) -> Failure | None:
    """Say what kind of failure ``result`` is.

    Called for every submission or list-match whose result is not ``ok``. For a failed
    list-match, ``result`` is a ``SubmitResult`` with ``operation == "List Match"``, no job
    ids, and the list-match's command as ``command``. Answer with a kind from the catalogue
    (``gridgate.core.kinds``) when one fits.

    :param endpoint: the server that failed.
    :param result: the failed result with the command's evidence (``result.operation`` says
        which step: ``"Job Submit"``, ``"List Match"`` or the backend's own name for it).
    :return: a :class:`Failure`; None to let the next classifier decide (the default
        ``rules`` classifier always answers). Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_escalate(
    endpoint: Endpoint, failure: Failure, result: SubmitResult, episode: Episode
) -> Escalation | None:
    """Decide whether a failure is told to people, and at which level.

    Called for every classified failure whose ``failure.exclude`` is true and ``failure.local``
    false, after the director has excluded the endpoint from the iteration and put it in the
    failing cache (``context.failing``, :mod:`gridgate.core.failing`): exclusion does not
    depend on this hook, only what people are told does. A local fault blames no server: the
    director reports it itself. Keep any memory of your own in the state store (several
    directors may share it); ``context.failing.watch`` marks a server whose failure was told.

    :param endpoint: the server that failed.
    :param failure: its classification.
    :param result: the failed result.
    :param episode: the server's failure episode, this failure counted: its start, its
        failures, and ``entered`` (this failure put it in the failing cache; false when it
        was there already).
    :return: an :class:`Escalation` whose ``level`` is ``error``, ``alarm`` or None (record,
        send nothing); None to let the next plugin decide (the default is the seed's two
        caches). Stops at first non-None result.
    """


@hookspec
def gridgate_notify(notification: Notification) -> None:
    """Deliver a message to people.

    Called on every notifier for every notification (errors, alarms, config refusals,
    state-store trouble). Must not block a submission thread: queue and return.

    :param notification: level, subject, body and the structured evidence.
    :return: nothing (broadcast).
    """


@hookspec
def gridgate_submission_finished(record: AccountingRecord) -> None:
    """A submission attempt is over, whatever its outcome.

    Called once per attempt (submitted, failed, no match, refused, skipped) after it has been
    written to the accounting table; used for metrics.

    :param record: the accounting row.
    :return: nothing (broadcast).
    """


# -------------------------------------------------------------------------------------------
# tracking pilots: status polling and cancelling, per endpoint, in bulk
# -------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def gridgate_job_status(
    endpoint: Endpoint, job_ids: Sequence[str], timeout: float
) -> StatusResult | None:
    """Report the state of many pilot jobs on one endpoint in one bulk query.

    Called by the director when it polls the pilots it tracks (at the start of an iteration,
    at most every ``status_interval`` seconds), once per endpoint with every tracked,
    non-terminal pilot of that endpoint, under an admission grant of category ``query``.
    The backend runs one command for the whole list (several only when the argv would grow
    too long) and must kill it at ``timeout``.

    :param endpoint: the server the jobs were submitted to.
    :param job_ids: the job ids as the backend reported them at submission.
    :param timeout: hard limit in seconds for all the commands of this call.
    :return: a :class:`StatusResult` with a normalised :class:`JobStatus` per id still known
        (ids it omits are no longer known to the backend); ``ok`` False when the query failed.
        None when ``endpoint.backend`` is not this plugin's or it cannot report states.
        Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_find_pilots(
    endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
) -> FoundPilots | None:
    """Say which jobs of the submissions ``names`` ``endpoint`` holds, by name.

    Called by the director for a submission whose intent is written but not settled: its
    director was killed while it was sent, its answer was lost (``SubmitResult.uncertain``, a
    command killed at its deadline), or the store refused its pilots. With ``fleet`` set (the
    state store came back empty, or was replaced), also every job named for any submission
    of that fleet (a name starting ``fleet + "-"``): the director adopts them before it submits
    again. The jobs are looked for in every state the server may hold a new job in; the
    backend matches a job's name to a submission with :func:`gridgate.core.backend.submission_of`.
    Under an admission grant of category ``query``; every command killed at ``timeout``.

    A backend that cannot look jobs up by name leaves this unanswered: an unsettled
    submission of it is then given up after ``director.pilots.reconcile_for`` with a log line.
    An answer with ``ok`` False (the server cannot be asked) keeps the submissions unsettled
    until it answers; an ``ok`` answer without them gives them up once the server has answered
    so for ``reconcile_for``.

    :param endpoint: the server the submissions were sent to.
    :param names: the submission names (:attr:`SubmitRequest.name`) to look for.
    :param fleet: "" or the fleet whose every submission is looked for.
    :param timeout: hard limit in seconds for all the commands of this call.
    :return: a :class:`FoundPilots`; None when ``endpoint.backend`` is not this plugin's or it
        cannot look jobs up by name. Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_cancel(
    endpoint: Endpoint, job_ids: Sequence[str], timeout: float
) -> CancelResult | None:
    """Cancel pilot jobs on one endpoint.

    Called by the director for pilots that waited longer than ``max_wait_time``, and by
    ``gridgate pilots cancel``, under an admission grant of category ``other``. The command
    must be killed at ``timeout``.

    :param endpoint: the server the jobs were submitted to.
    :param job_ids: the job ids to cancel.
    :param timeout: hard limit in seconds for all the commands of this call.
    :return: a :class:`CancelResult`; None when ``endpoint.backend`` is not this plugin's or
        it cannot cancel. Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_pilot_output(
    endpoint: Endpoint,
    job_id: str,
    stream: OutputStream,
    name: str,
    size: int,
    from_end: bool,
    timeout: float,
) -> PilotOutput | None:
    """Read one stream of one pilot from where its CE keeps it: its standard output, its
    standard error, or a file of the job's own.

    Called by ``gridgate pilots output`` (and, with ``size`` 0, by ``gridgate pilots show``)
    for one tracked pilot, under an admission grant of category ``query``, with the pilot's
    demand group's credential in force. The commands and requests must end by ``timeout``.
    The text is returned as read: the caller escapes it and trims it to whole lines.

    :param endpoint: the server the pilot was submitted to.
    :param job_id: the pilot's job id as the backend reported it at submission.
    :param stream: ``stdout``, ``stderr`` or ``file``.
    :param name: for ``file``, the file's name in the job's own folder (no ``/``, never
        ``..``: the caller refuses those); '' otherwise.
    :param size: the most bytes to read; 0 to say only where the stream is and whether it is
        still there (without reading it when the backend can tell so).
    :param from_end: read the last ``size`` bytes instead of the first.
    :param timeout: hard limit in seconds for all the commands and requests of this call.
    :return: a :class:`PilotOutput` (``held`` False when the CE no longer holds the job or
        the file; ``ok`` False when the CE could not be asked); None when ``endpoint.backend``
        is not this plugin's or it cannot read that stream. Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_scheduler_rpcs(scheduler: str, timeout: float) -> SchedulerRPCs | None:
    """Read the scheduler controller's own count of the requests it served, per user and per
    request type (Slurm: ``sdiag``), for the token daemon's bypass audit and adaptive limits.

    Called by the token daemon every ``proxyd.bypass.audit.interval`` seconds (and
    ``proxyd.adaptive`` intervals), outside any iteration. The command must be killed at
    ``timeout``.

    :param scheduler: the name the daemon's config gives the scheduler (``slurm``).
    :param timeout: hard limit in seconds for the whole read.
    :return: a :class:`SchedulerRPCs` (``ok`` False with a message when it could not be read);
        None when ``scheduler`` is not this plugin's. Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_scheduler_deny(
    scheduler: str, user: str, deny: bool, timeout: float
) -> SchedulerChange | None:
    """Make the scheduler itself refuse ``user`` (``deny`` True) or admit it again as before
    (``deny`` False): the token daemon's ``proxyd.bypass.action: deny_partition``. Slurm takes
    the user out of its partitions' ``AllowGroups`` (slurmctld enforces it for submissions).

    Called by the token daemon when its bypass audit finds ``user`` went around the gate, and
    again once ``proxyd.bypass.for`` has passed. The plugin keeps what it changed, so that
    ``deny=False`` puts back exactly what was there, also after a restart of the daemon. The
    commands must be killed at ``timeout``.

    :param scheduler: the name the daemon's config gives the scheduler (``slurm``).
    :param user: the user name, as the scheduler's statistics gave it.
    :param deny: True to refuse the user, False to put back what the denial changed.
    :param timeout: hard limit in seconds for the whole change.
    :return: a :class:`SchedulerChange` (``ok`` False with a message when it could not be
        done); None when ``scheduler`` is not this plugin's. Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_scheduler_trace(scheduler: str, on: bool, timeout: float) -> SchedulerChange | None:
    """Switch the controller's own log of every request on (``on`` True) or back to what it
    was (``on`` False): Slurm's ``scontrol setdebugflags +protocol``, the counterpart of LSF's
    ``LSB_DEBUG_MBD``. The plugin keeps whether it changed anything, so that ``on=False``
    leaves a trace an operator had switched on alone, also after a restart of the daemon.

    Called by the token daemon when ``lsfproxyd diagnose on -c bypass`` starts and when its
    window ends (and once when the daemon starts, to end a trace a killed daemon left on).
    The commands must be killed at ``timeout``.

    :param scheduler: the name the daemon's config gives the scheduler (``slurm``).
    :param on: True to start the trace, False to put the flags back.
    :param timeout: hard limit in seconds for the whole change.
    :return: a :class:`SchedulerChange`; None when ``scheduler`` is not this plugin's.
        Stops at first non-None result.
    """


@hookspec(firstresult=True)
def gridgate_scheduler_requests(scheduler: str, timeout: float) -> SchedulerRequests | None:
    """The requests the controller logged since the last call, while the trace of
    :func:`gridgate_scheduler_trace` is on (Slurm: the ``slurmctld_req: received opcode``
    lines of ``SlurmctldLogFile``, read from where the last call stopped).

    Called by the token daemon every ``proxyd.bypass.audit.interval`` during a bypass
    diagnosis. The read must end by ``timeout``.

    :param scheduler: the name the daemon's config gives the scheduler (``slurm``).
    :param timeout: hard limit in seconds for the read.
    :return: a :class:`SchedulerRequests`; None when ``scheduler`` is not this plugin's.
        Stops at first non-None result.
    """
