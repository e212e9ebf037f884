"""One director iteration, top to bottom, and the failure path every part of it shares.

:class:`IterationRunner` runs one iteration: the demand hooks, the failing cache read, the
credential check, the pilot tracker (poll, cancel, trim to the limits), the plan (demand split
into submissions), the submissions in parallel (each retried elsewhere by the retry policy when
it may be), the stall watch, the summary. Its state is one :class:`Iteration`.

:class:`FailurePath` is what happens to a failure of a server, whoever found it (a submission,
a status poll, pilots that abort, a cancel): classify -> a local fault (the backend paused, no
server blamed, one message per ``failing_expiry``) or a server failure (excluded, into the
failing cache, escalation decides the level, people told) -> accounted. The director, the
pilot tracker and the credential check are given it; none of them calls another's insides.

:class:`Runtime` is what all of them read that a config reload replaces (the config, the
plugins, the failing cache with its expiries): the director updates that one object in place.
"""

from __future__ import annotations

import getpass
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import pluggy
from loguru import logger

from gridgate.core.clock import Clock
from gridgate.core.compose import compose_failure, compose_local_fault
from gridgate.core.config import Config
from gridgate.core.contract import checked_submit, list_matches, no_list_match
from gridgate.core.failing import FailingCache
from gridgate.core.model import (
    AVAILABILITY_STATES,
    AccountingRecord,
    AdmissionRequest,
    Availability,
    BackendInfo,
    CredentialStatus,
    DemandRegistry,
    Endpoint,
    Failure,
    FailureReport,
    Grant,
    IterationInfo,
    IterationSummary,
    Notification,
    Outcome,
    Refusal,
    RetryReport,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.retry import RetryPolicy, retry_entry
from gridgate.core.state import StateError, StateStore
from gridgate.core.weights import configured_weight

if TYPE_CHECKING:
    from gridgate.core.credential_episodes import CredentialEpisodes
    from gridgate.core.stall import StallWatch
    from gridgate.core.tracking import Limits, PilotReportDraft, PilotTracker

__all__ = [
    "ACCOUNTING",
    "FAILURES",
    "FailurePath",
    "Iteration",
    "IterationRunner",
    "Runtime",
    "merge_availability",
]

#: The state store's accounting table: one row per submission attempt.
ACCOUNTING = "accounting"
#: The state store's failures of servers that were no submission (a status poll, aborting
#: pilots, a cancel): one row each, counted by `gridgate report` beside the failed submissions
#: of ``ACCOUNTING``, which has one row per submission attempt and so cannot hold them.
FAILURES = "failures"


class Broadcast(Protocol):
    """Calls every implementation of a broadcast hook, each on its own (``Director.broadcast``),
    and gives back each one's answer that was not None, as (plugin name, answer)."""

    def __call__(
        self, hook_name: str, role: str, what: str = "", **kwargs: Any
    ) -> list[tuple[str, Any]]: ...


@dataclass
class Runtime:
    """What an iteration and its collaborators read: the store, the clock, how to tell people
    and plugins, and what a config reload replaces (``config``, ``pm``, ``failing``). The
    director owns it and updates it in place, so no collaborator keeps a stale config."""

    config: Config
    pm: pluggy.PluginManager
    failing: FailingCache
    state: StateStore
    clock: Clock
    notify: Callable[[Notification], None]
    broadcast: Broadcast

    @property
    def settings(self) -> Mapping[str, Any]:
        """The config's ``director`` section."""
        return self.config.director

    def timeout(self, info: BackendInfo) -> float:
        """The deadline of one of ``info``'s commands, in seconds."""
        return float(info.command_timeout or self.config.director["command_timeout"])


@dataclass
class Iteration:
    """One iteration's state, shared by its submission and status threads (under ``lock``): what
    it accounted, excluded, told and retried, the backends it paused, the pilot limits."""

    info: IterationInfo
    failing: set[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    excluded: list[str] = field(default_factory=list)
    records: list[AccountingRecord] = field(default_factory=list)
    notifications: list[Notification] = field(default_factory=list)
    failures: list[FailureReport] = field(default_factory=list)
    #: backends whose commands cannot run on this machine: paused for the rest of the iteration
    local_faults: set[str] = field(default_factory=set)
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(0, 0.0))
    retries: list[RetryReport] = field(default_factory=list)
    #: room under max_waiting / max_total, None when not tracking
    limits: Limits | None = None
    #: what the pilot tracker did this iteration, for the summary (None: not tracking)
    pilots: PilotReportDraft | None = None
    #: what each credential plugin reported before anything was polled or submitted
    credentials: tuple[CredentialStatus, ...] = ()
    #: credential kinds whose configured credential is unusable this iteration
    unusable: dict[str, CredentialStatus] = field(default_factory=dict)
    #: why the credential check itself failed (a plugin raised): nothing needing one submits
    credential_crash: str = ""
    #: the endpoints not fully available this iteration, by key (merged answers of
    #: gridgate_endpoint_availability); an endpoint not in it is available
    availability: dict[str, Availability] = field(default_factory=dict)
    #: what each backend with endpoints said of itself when availability was asked (the plan
    #: reuses it, so a backend is asked once for the plan and once by the tracker)
    infos: dict[str, BackendInfo | None] = field(default_factory=dict)

    def credential_block(self, info: BackendInfo) -> str:
        """Why ``info``'s backend may not use its credentials this iteration: ``credential``
        (one it needs is unusable), ``plugin_error`` (the check crashed), '' when it may."""
        if not info.credentials:
            return ""
        if self.credential_crash:
            return "plugin_error"
        return "credential" if any(kind in self.unusable for kind in info.credentials) else ""

    def paused(self, info: BackendInfo) -> bool:
        """Whether ``info``'s backend is paused this iteration (a local fault, or a credential
        it needs is unusable): it submits nothing and its pilots are not polled."""
        with self.lock:
            if info.backend in self.local_faults:
                return True
        return bool(self.credential_block(info))

    def exclude(self, endpoint: Endpoint) -> None:
        """Take ``endpoint`` out of rotation for the rest of the iteration."""
        with self.lock:
            if endpoint.key not in self.excluded:
                self.excluded.append(endpoint.key)

    def usable(self, endpoints: Iterable[Endpoint]) -> list[Endpoint]:
        """``endpoints`` in rotation: neither excluded this iteration nor in the failing cache
        when it began."""
        with self.lock:
            gone = set(self.excluded) | self.failing
        return [e for e in endpoints if e.key not in gone]

    def submittable(self, endpoints: Iterable[Endpoint]) -> list[Endpoint]:
        """``endpoints`` that may get new pilots: usable, and neither drained nor banned."""
        return [e for e in self.usable(endpoints) if not self.withdrawn(e)]

    def withdrawn(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint`` is drained or banned this iteration (no new pilots)."""
        state = self.availability.get(endpoint.key)
        return state is not None and state.state in ("drained", "banned")

    def pollable(self, info: BackendInfo) -> list[Endpoint]:
        """``info``'s endpoints whose pilots are polled: usable, and not banned when the
        backend says a banned server cannot be asked (``BackendInfo.poll_banned`` False)."""
        endpoints = self.usable(info.endpoints)
        if info.poll_banned:
            return endpoints
        return [e for e in endpoints if self.state_of(e) != "banned"]

    def state_of(self, endpoint: Endpoint) -> str:
        """``endpoint``'s availability state this iteration."""
        state = self.availability.get(endpoint.key)
        return "available" if state is None else state.state

    def in_downtime(self, endpoint: Endpoint) -> Availability | None:
        """What GOCDB says of ``endpoint`` when it is in a downtime (banned or degraded with
        ``gocdb`` among the merged answer's sources); None otherwise."""
        state = self.availability.get(endpoint.key)
        if state is None or "gocdb" not in state.source.split(","):
            return None
        return state


class FailurePath:
    """classify -> local fault or server failure -> failing cache -> escalation -> notify, and
    the accounting of every attempt. ``on_submitted`` hears of each successful submission (the
    pilot tracker tracks its pilots)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.on_submitted: Callable[[AccountingRecord], None] | None = None

    def tell(self, it: Iteration, note: Notification) -> None:
        """Send ``note`` to every notifier and keep it in the iteration's summary."""
        with it.lock:
            it.notifications.append(note)
        self.runtime.notify(note)

    def server_failed(
        self,
        endpoint: Endpoint,
        result: SubmitResult,
        it: Iteration,
        failure: Failure | None = None,
        *,
        submission: bool = False,
    ) -> Failure:
        """A failure of ``endpoint`` (a submission, a status query, aborting pilots):
        classified unless ``failure`` is given, then excluded, escalated and told. One that is
        no ``submission`` (whose caller writes its accounting row) is kept in ``FAILURES``."""
        hook = self.runtime.pm.hook
        if failure is None:
            failure = hook.gridgate_classify_failure(endpoint=endpoint, result=result) or Failure(
                kind="error"
            )
        override = self.runtime.config.director.get("notify_kinds", {}).get(failure.kind)
        if override is not None:
            failure = replace(failure, notify=override)
        command = result.command
        with it.lock:
            it.failures.append(
                FailureReport(
                    backend=endpoint.backend,
                    endpoint=endpoint.name,
                    kind=failure.kind,
                    returncode=command.returncode if command else None,
                    timed_out=bool(command and command.timed_out),
                    command=tuple(command.argv) if command else (),
                    operation=result.operation,
                )
            )
        if not submission:
            self._record_failure(endpoint, failure, result, it)
        if failure.local:
            self.local_fault(endpoint, failure, result, it)
        elif failure.exclude:
            it.exclude(endpoint)
            episode = self.runtime.failing.enter(
                endpoint, failure.kind
            )  # whichever plugin escalates
            escalation = hook.gridgate_escalate(
                endpoint=endpoint, failure=failure, result=result, episode=episode
            )
            if escalation is not None and escalation.level is not None:
                downtime = it.in_downtime(endpoint)
                if downtime is not None:  # the site said so already: counted, excluded, not told
                    logger.info(
                        "failure of {} ({}) not mailed: it is in a GOCDB downtime ({}); it "
                        "still counts and excludes",
                        endpoint.key,
                        failure.kind,
                        downtime.reason,
                    )
                else:
                    note = compose_failure(
                        endpoint, failure, escalation, result, self.runtime.clock.time()
                    )
                    self.tell(it, note)
        return failure

    def _record_failure(
        self, endpoint: Endpoint, failure: Failure, result: SubmitResult, it: Iteration
    ) -> None:
        try:
            self.runtime.state.append_record(
                FAILURES,
                {
                    "time": self.runtime.clock.time(),
                    "backend": endpoint.backend,
                    "endpoint": endpoint.name,
                    "kind": failure.kind,
                    "operation": result.operation,
                    "iteration": it.info.number,
                },
            )
        except StateError as exc:
            logger.error("failure row lost, state store failed: {}", exc)

    def local_fault(
        self, endpoint: Endpoint, failure: Failure, result: SubmitResult, it: Iteration
    ) -> None:
        """A command that cannot start on this machine: pause the backend, blame no server,
        and say so once per failing-cache period (the same rhythm as a failing server)."""
        with it.lock:
            it.local_faults.add(endpoint.backend)
        if not failure.notify:
            return
        now = self.runtime.clock.time()
        repeat_every = float(self.runtime.config.director["failing_expiry"])
        try:
            first = self.runtime.failing.local_fault(endpoint.backend, failure.kind)
        except StateError:  # no shared view: a repeated mail beats a silent outage
            first = True
        if not first:
            return
        note = compose_local_fault(endpoint, failure, result, now, repeat_every)
        self.tell(it, note)

    def account(
        self,
        it: Iteration,
        request: SubmitRequest,
        endpoint: Endpoint | None,
        outcome: Outcome,
        pilots: int,
        *,
        failure_kind: str = "",
        job_ids: tuple[str, ...] = (),
        duration: float = 0.0,
        attempt: int = 1,
    ) -> None:
        """Account one attempt of ``request`` (``pilots`` of them) on ``endpoint`` (None when
        none was chosen): a row in the iteration and in the store's accounting table, the
        tracker told of a submission, ``gridgate_submission_finished`` broadcast."""
        record = AccountingRecord(
            time=self.runtime.clock.time(),
            backend=request.backend,
            endpoint=endpoint.name if endpoint else "",
            outcome=outcome,
            group=request.group,
            pilots=pilots,
            failure_kind=failure_kind,
            job_ids=job_ids,
            duration=round(duration, 4),
            iteration=it.info.number,
            attempt=attempt,
        )
        with it.lock:
            it.records.append(record)
        try:
            self.runtime.state.append_record(ACCOUNTING, record.as_dict())
        except StateError as exc:
            logger.error("accounting row lost, state store failed: {}", exc)
        if outcome == "submitted" and self.on_submitted is not None:
            self.on_submitted(record)
        self.runtime.broadcast(
            "gridgate_submission_finished", "plugin", "submission finished", record=record
        )


class IterationRunner:
    """Runs the iterations of one director, each top to bottom (:meth:`run`), with the
    collaborators it is given: the runtime, the failure path, the credential check, the pilot
    tracker and the stall watch. ``instance`` names the director in shared state (demand
    locks)."""

    def __init__(
        self,
        runtime: Runtime,
        failures: FailurePath,
        credentials: CredentialEpisodes,
        tracker: PilotTracker,
        stall: StallWatch,
        instance: str,
    ) -> None:
        self.runtime = runtime
        self.failures = failures
        self.credentials = credentials
        self.tracker = tracker
        self.stall = stall
        self.instance = instance
        #: the merged availability told last (by endpoint key): a notice when it changes
        self._told: dict[str, Availability] = {}
        #: endpoints whose pilots changed at the last polls (for sources reading the registry)
        self._changed: frozenset[str] | None = None
        #: every backend demand has named (in order): asked for its endpoints' availability
        self._backends: dict[str, None] = {}

    def run(
        self,
        info: IterationInfo,
        sent: Iterable[Notification] = (),
        unsent: Iterable[Notification] = (),
        config_error: str | None = None,
    ) -> IterationSummary:
        """One iteration numbered and timed by ``info``. ``sent`` (a refused config, already
        told) and ``unsent`` (accepted config changes, told here, once the demand is in)
        go into its summary, as ``config_error`` does."""
        runtime = self.runtime
        started = time.monotonic()
        runtime.broadcast(
            "gridgate_iteration_started", "plugin", "iteration started", iteration=info
        )
        demand = DemandRegistry()
        if not runtime.settings["paused"]:  # paused on purpose: no demand, no stall
            runtime.broadcast(
                "gridgate_demand", "demand plugin", "demand", iteration=info, demand=demand
            )
        try:
            failing = runtime.failing.excluded()
        except StateError as exc:
            logger.error("state store unreadable, failing cache ignored this iteration: {}", exc)
            failing = set()
        it = Iteration(
            info=info,
            failing=failing,
            retry=RetryPolicy.for_iteration(runtime.settings, info.started),
        )
        it.notifications.extend(sent)
        for note in unsent:
            self.failures.tell(it, note)
        self.credentials.check(it, demand)  # before any command could use one
        self._availability(it, demand)  # before any server is polled or chosen
        demand = self.tracker.prepare(demand, it)  # poll pilots, cancel, trim to the limits
        self._changed = _changed_endpoints(it)
        jobs = self._plan(demand, it)
        threads = int(runtime.settings["max_threads"])
        if jobs:
            with ThreadPoolExecutor(
                max_workers=min(threads, len(jobs)), thread_name_prefix="submit"
            ) as pool:
                for future in [
                    pool.submit(self._submit_one, backend, request, it) for backend, request in jobs
                ]:
                    future.result()
        # a credential episode says everything itself (error, alarm, works again): not twice
        # nor is an endpoint withdrawn on purpose (a ban, a drain, a downtime) a stall
        watched = [r for r in it.records if r.failure_kind not in ("credential", "unavailable")]
        for note in self.stall.observe(info, watched, runtime.settings):
            self.failures.tell(it, note)
        return IterationSummary(
            number=info.number,
            started=info.started,
            duration=time.monotonic() - started,
            records=tuple(it.records),
            excluded=tuple(it.excluded),
            notifications=tuple(it.notifications),
            failures=tuple(it.failures),
            config_error=config_error,
            retries=tuple(it.retries),
            pilots=it.pilots.freeze() if it.pilots is not None else None,
            credentials=it.credentials,
            unavailable=dict(it.availability),
        )

    # --- availability ---------------------------------------------------------------------

    def _availability(self, it: Iteration, demand: DemandRegistry) -> None:
        """Ask every availability source once (each on its own), merge the answers per
        endpoint (the worst state wins), keep them in ``it`` and tell what changed."""
        runtime = self.runtime
        # configured backends, and those demand named (now or before: one registered in the
        # director's process has pilots to poll after its demand stopped)
        self._backends.update(dict.fromkeys(r.backend for r in demand.requests))
        backends = dict.fromkeys([*(runtime.config.get("backends") or {}), *self._backends])
        endpoints: list[Endpoint] = []
        for backend in backends:
            info = it.infos[backend] = runtime.pm.hook.gridgate_backend_info(backend=backend)
            if info is not None:
                endpoints.extend(info.endpoints)
        answers = runtime.broadcast(
            "gridgate_endpoint_availability",
            "availability source",
            "endpoint availability",
            iteration=it.info,
            endpoints=tuple(endpoints),
            changed=self._changed,
        )
        it.availability = merge_availability(answers or [], {e.key for e in endpoints})
        self._tell_changes(it)

    def _tell_changes(self, it: Iteration) -> None:
        """One notice (level info) per endpoint whose merged state starts, changes or ends."""
        now = self.runtime.clock.time()
        before, after = self._told, it.availability
        for key in [*after, *(k for k in before if k not in after)]:
            old, new = before.get(key), after.get(key)
            if old is not None and new is not None and _same(old, new):
                continue
            if new is None:
                assert old is not None
                subject = f"gridgate: {key} available again (was {old.state}: {old.source})"
                body = (
                    f"{key} was {old.state} ({old.source}): {old.reason}\nIt is available again.\n"
                )
                state = "available"
            else:
                until = (
                    "no known end"
                    if new.until is None
                    else time.strftime("until %Y-%m-%d %H:%M UTC", time.gmtime(new.until))
                )
                subject = f"gridgate: {key} {new.state} ({new.source}), {until}"
                body = (
                    f"{key} is {new.state}, {until}, says {new.source}:\n{new.reason}\n\n"
                    + _EFFECT[new.state]
                )
                state = new.state
            self.failures.tell(
                it,
                Notification(
                    level="info",
                    subject=subject,
                    body=body,
                    created=now,
                    key=f"availability/{key}/{state}/{now:.0f}",
                ),
            )
        self._told = dict(after)

    def _plan(
        self, demand: DemandRegistry, it: Iteration
    ) -> list[tuple[BackendInfo, SubmitRequest]]:
        """Split demand into submissions of the backend's bulk size."""
        jobs: list[tuple[BackendInfo, SubmitRequest]] = []
        infos = it.infos  # asked when availability was (the demand's backends among them)
        claims: dict[tuple[str, str], bool] = {}
        user = self.runtime.config.director.get("user") or _current_user()
        for request in demand.requests:
            if request.backend not in infos:
                infos[request.backend] = self.runtime.pm.hook.gridgate_backend_info(
                    backend=request.backend
                )
                if infos[request.backend] is None:
                    logger.error(
                        "demand names backend {!r}, which is not configured", request.backend
                    )
            info = infos[request.backend]
            if info is None:
                self.failures.account(
                    it, request, None, "skipped", request.count, failure_kind="no_backend"
                )
                continue
            blocked = it.credential_block(info)
            if blocked:  # before the demand lock: a director with a usable credential takes it over
                self.failures.account(
                    it, request, None, "skipped", request.count, failure_kind=blocked
                )
                continue
            if self.runtime.config.director["demand_lock"] and not self._claim(request, claims):
                self.failures.account(
                    it, request, None, "skipped", request.count, failure_kind="claimed_elsewhere"
                )
                continue
            size = max(1, info.pilots_per_submission)
            list_match = info.list_match if request.list_match is None else request.list_match
            backend_plugin = self.runtime.pm.get_plugin(f"backends:{request.backend}")
            if list_match and backend_plugin is not None and not list_matches(backend_plugin):
                logger.error(
                    "demand group {}/{}: {}",
                    request.backend,
                    request.group,
                    no_list_match(request.backend),
                )
                self.failures.account(
                    it, request, None, "skipped", request.count, failure_kind="config"
                )
                continue
            for index in range(math.ceil(request.count / size)):
                count = min(size, request.count - index * size)
                jobs.append(
                    (
                        info,
                        replace(
                            request, count=count, list_match=list_match, user=request.user or user
                        ),
                    )
                )
        return jobs

    def _claim(self, request: SubmitRequest, claims: dict[tuple[str, str], bool]) -> bool:
        """Whether this director fills ``request``'s demand group this iteration.

        With several directors on one shared store (Redis), each group is filled by the
        director holding its lock: an atomic add-if-absent (SET NX PX on Redis) that the owner
        renews every iteration and that lapses 1.5 cycles after its owner stops, so another
        director takes the group over. No consensus of our own: the store's atomic add decides.
        """
        group = (request.backend, request.group)
        if group not in claims:
            key = f"demand-lock/{request.backend}/{request.group}"
            ttl = 1.5 * float(self.runtime.config.director["cycle_seconds"])
            try:
                mine = self.runtime.state.add_if_absent(key, self.instance, ttl=ttl)
                if not mine and self.runtime.state.get(key) == self.instance:
                    self.runtime.state.set(key, self.instance, ttl=ttl)
                    mine = True
            except StateError as exc:  # no shared view: filling twice beats filling never
                logger.error("demand lock unavailable, filling {}/{} anyway: {}", *group, exc)
                mine = True
            claims[group] = mine
        return claims[group]

    def _submit_one(self, info: BackendInfo, request: SubmitRequest, it: Iteration) -> None:
        # a bulk submission shortened to the room of the server it went to leaves the rest,
        # which is submitted in turn (to a server with room, or skipped as trimmed)
        rest = [request]
        while rest:
            self._submit_whole(info, rest.pop(), it, rest)

    def _submit_whole(
        self, info: BackendInfo, request: SubmitRequest, it: Iteration, rest: list[SubmitRequest]
    ) -> None:
        tried: list[Endpoint] = []  # a failed submission is sent elsewhere (gridgate.core.retry)
        for attempt in range(1, 2 + max(0, it.retry.retries)):
            started = time.monotonic()
            try:
                failure = self._attempt(info, request, it, started, tried, attempt, rest)
            except Exception as exc:  # a plugin bug must not stop the iteration
                logger.opt(exception=exc).error(
                    "submission to {} crashed in a plugin", info.backend
                )
                self.failures.account(
                    it,
                    request,
                    None,
                    "failed",
                    request.count,
                    failure_kind="plugin_error",
                    duration=time.monotonic() - started,
                    attempt=attempt,
                )
                return
            if failure is None or not self._retry(info, request, it, tried, attempt, failure):
                return

    def _retry(
        self,
        info: BackendInfo,
        request: SubmitRequest,
        it: Iteration,
        tried: list[Endpoint],
        attempt: int,
        failure: Failure,
    ) -> bool:
        others = [e for e in self._eligible(info, it) if e not in tried]
        outcome = it.retry.decide(
            failure, attempt, self.runtime.clock.time(), self.runtime.timeout(info), len(others)
        )
        if outcome is None:
            return False
        with it.lock:
            it.retries.append(
                retry_entry(
                    request.backend,
                    request.group,
                    request.count,
                    tried[-1].name,
                    failure.kind,
                    attempt,
                    outcome,
                )
            )
        return outcome == "retried"

    def _attempt(
        self,
        info: BackendInfo,
        request: SubmitRequest,
        it: Iteration,
        started: float,
        tried: list[Endpoint],
        attempt: int,
        rest: list[SubmitRequest],
    ) -> Failure | None:
        """One attempt; the failure when it failed (the caller may send it elsewhere). When the
        server has room for only part of a bulk request, this attempt sends that part and the
        remainder goes to ``rest``."""
        hook = self.runtime.pm.hook
        with it.lock:
            paused = info.backend in it.local_faults
        if paused:  # its command cannot start here: trying every server would only repeat that
            self.failures.account(
                it,
                request,
                None,
                "skipped",
                request.count,
                failure_kind="local_fault",
                attempt=attempt,
            )
            return None
        candidates = [e for e in self._eligible(info, it) if e not in tried]
        if not candidates:
            # every server left is withdrawn (drained, banned, weight 0): said as such, no stall
            withdrawn = [e for e in it.usable(info.endpoints) if e not in tried]
            self.failures.account(
                it,
                request,
                None,
                "skipped",
                request.count,
                failure_kind="unavailable" if withdrawn else "no_endpoint",
                attempt=attempt,
            )
            return None
        weights = self._weights(info.backend)
        endpoint: Endpoint | None = None
        while candidates:
            if it.limits is not None:
                candidates = it.limits.with_room(candidates)
                if not candidates:
                    break
            endpoint = (
                hook.gridgate_select_endpoint(
                    candidates=candidates,
                    request=request,
                    weights=weights,
                    availability=it.availability,
                )
                or candidates[0]
            )
            fitting = it.limits.reserve(endpoint, request) if it.limits is not None else request
            if fitting is not None:
                if fitting.count < request.count:
                    rest.append(replace(request, count=request.count - fitting.count))
                request = fitting
                break
            # another thread took the last room there between the check and the reservation:
            # the pilot goes to another server that has some
            candidates = [e for e in candidates if e != endpoint]
            endpoint = None
        if endpoint is None:
            if it.limits is not None:
                it.limits.skipped(info.backend, request.count)
            self.failures.account(
                it,
                request,
                None,
                "skipped",
                request.count,
                failure_kind="max_waiting",
                attempt=attempt,
            )
            return None
        tried.append(endpoint)
        answer = hook.gridgate_admit(
            request=AdmissionRequest(
                category="submission",
                opcode="JOB_SUBMIT",
                user=request.user,
                size=request.count,
                endpoint=endpoint,
            )
        )
        if isinstance(answer, Refusal):
            self.failures.account(
                it,
                request,
                endpoint,
                "refused",
                request.count,
                failure_kind="admission",
                duration=time.monotonic() - started,
                attempt=attempt,
            )
            return None
        grant: Grant | None = answer
        timeout = self.runtime.timeout(info)
        try:
            result = self._commands(endpoint, request, timeout)
        finally:
            # the token goes back as soon as the server is no longer being talked to
            if grant is not None:
                hook.gridgate_release(grant=grant)
        duration = time.monotonic() - started
        if result is None:
            self.failures.account(
                it, request, endpoint, "no_match", request.count, duration=duration, attempt=attempt
            )
        elif result.ok:
            self.failures.account(
                it,
                request,
                endpoint,
                "submitted",
                request.count,
                job_ids=result.job_ids,
                duration=duration,
                attempt=attempt,
            )
        else:
            return self._failed(endpoint, request, result, it, duration, attempt)
        return None

    def _weights(self, backend: str) -> Mapping[str, int]:
        """The ``weights`` of ``backend``'s config section (empty when none)."""
        section = (self.runtime.config.get("backends") or {}).get(backend) or {}
        weights = section.get("weights") if isinstance(section, Mapping) else None
        return weights if isinstance(weights, Mapping) else {}

    def _eligible(self, info: BackendInfo, it: Iteration) -> list[Endpoint]:
        """``info``'s endpoints that may get a new pilot now: usable, neither drained nor
        banned, and not weighted 0 (0 means never, whatever the selector)."""
        weights = self._weights(info.backend)
        return [e for e in it.submittable(info.endpoints) if configured_weight(e, weights) > 0]

    def _commands(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        """List-match (when asked) and submit; None when nothing matches on this server."""
        hook = self.runtime.pm.hook
        if request.list_match:
            match = hook.gridgate_list_match(endpoint=endpoint, request=request, timeout=timeout)
            if match is not None and not match.ok:
                return SubmitResult(
                    endpoint=endpoint,
                    ok=False,
                    command=match.command,
                    operation="List Match",
                    local_fault=match.local_fault,
                )
            if match is not None and not match.resources:
                return None
        result = hook.gridgate_submit(endpoint=endpoint, request=request, timeout=timeout)
        if result is None:
            return SubmitResult(
                endpoint=endpoint,
                ok=False,
                message=f"no plugin submits to backend {endpoint.backend!r}",
            )
        return checked_submit(result)

    def _failed(
        self,
        endpoint: Endpoint,
        request: SubmitRequest,
        result: SubmitResult,
        it: Iteration,
        duration: float,
        attempt: int = 1,
    ) -> Failure:
        failure = self.failures.server_failed(endpoint, result, it, submission=True)
        self.failures.account(
            it,
            request,
            endpoint,
            "failed",
            request.count,
            failure_kind=failure.kind,
            duration=duration,
            attempt=attempt,
        )
        return failure


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


#: What each state does, for the notice's body.
_EFFECT = {
    "degraded": "It gets fewer new pilots (its weight is halved); its pilots are tracked.\n",
    "drained": "It gets no new pilots; its pilots are still tracked.\n",
    "banned": "It gets no new pilots; its pilots are polled unless its backend cannot ask it.\n",
}


def _same(a: Availability, b: Availability) -> bool:
    # the reason's counts move at every look (pilot efficiency): a notice per start and end
    return (a.state, a.source, a.until) == (b.state, b.source, b.until)


def merge_availability(
    answers: Iterable[tuple[str, Any]], endpoints: Iterable[str]
) -> dict[str, Availability]:
    """The answers of ``gridgate_endpoint_availability`` merged per endpoint key: the worst
    state wins (banned > drained > degraded > available) with its reason and end (of equal
    states, the first answer's); ``source`` names every source that said the endpoint was not
    available, worst first. Only keys in ``endpoints`` are kept, available ones are left out;
    an answer that is not a mapping of keys to :class:`Availability` is logged and skipped."""
    known = set(endpoints)
    said: dict[str, list[Availability]] = {}
    for plugin, answer in answers:
        if not isinstance(answer, Mapping):
            logger.error(
                "availability source {} answered {}, not a mapping: ignored",
                plugin,
                type(answer).__name__,
            )
            continue
        for key, state in answer.items():
            if not isinstance(state, Availability):
                logger.error(
                    "availability source {}: {!r} is not an Availability: ignored", plugin, key
                )
                continue
            if key in known and state.state != "available":
                source = state.source or plugin.split(":", 1)[-1]
                said.setdefault(key, []).append(replace(state, source=source))
    merged: dict[str, Availability] = {}
    for key, states in said.items():
        ordered = sorted(states, key=lambda a: -AVAILABILITY_STATES.index(a.state))
        sources = ",".join(dict.fromkeys(a.source for a in ordered))
        merged[key] = replace(ordered[0], source=sources)
    return merged


def _changed_endpoints(it: Iteration) -> frozenset[str] | None:
    """Keys of the endpoints whose pilots changed state at this iteration's polls."""
    if it.pilots is None:
        return None
    changed = {f"{p.backend}/{p.endpoint}" for p in it.pilots.polls if p.changed}
    return frozenset(changed | set(it.pilots.aborted))
