"""One director iteration, top to bottom.

:class:`IterationRunner` runs one iteration: the demand hooks, the failing cache read, the
credential check, the pilot tracker (poll, cancel, trim to the limits), the plan (demand split
into submissions), the submissions in parallel (each sent elsewhere by the resubmit policy when
it may be), the stall watch, the summary. Its state is one
:class:`~gridgate.core.engine.runtime.Iteration`; every failure it meets goes down the failure
path (:mod:`gridgate.core.engine.failure`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from loguru import logger

from gridgate.core.credential_names import credentials_in_force
from gridgate.core.engine.availability import AvailabilityNotices, merge_availability
from gridgate.core.engine.contract import checked_submit, list_matches, no_list_match
from gridgate.core.engine.credential_episodes import CredentialEpisodes
from gridgate.core.engine.demand_episodes import DemandEpisodes
from gridgate.core.engine.failure import AttemptOutcome, FailurePath
from gridgate.core.engine.intents import unrecordable
from gridgate.core.engine.queue_state import (
    SOURCE,
    LimitProblems,
    QueueStates,
    asked_endpoints,
    beyond_limits,
    closed_queues,
)
from gridgate.core.engine.retry import ResubmitPolicy, retry_entry
from gridgate.core.engine.runtime import Iteration, Runtime, Sending
from gridgate.core.engine.sharing import DemandShare, StoreRoom
from gridgate.core.engine.stall import StallWatch
from gridgate.core.engine.tracking import PilotTracker
from gridgate.core.fitting import capacities, fits, requirement_label, unfit_reason
from gridgate.core.model import (
    AdmissionRequest,
    BackendInfo,
    DemandRegistry,
    Endpoint,
    Failure,
    Grant,
    IterationInfo,
    IterationSummary,
    Notification,
    Refusal,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.state import StateError
from gridgate.core.weights import configured_weight


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
        #: this director's share of the demand groups (``director.demand_lock``)
        self.share = DemandShare(runtime, instance)
        #: the limits' room taken in the store, so that concurrent directors hold them too
        self.room = StoreRoom(runtime, tracker, instance)
        #: tells each start, change and end of an endpoint's availability once, of all the
        #: directors on the store and across restarts
        self.notices = AvailabilityNotices(runtime, failures)
        #: tells a demand source that failed past keep_last once, and when it answers again
        self.demand_sources = DemandEpisodes(runtime, failures)
        #: asks each endpoint that may get pilots what its queue holds (gridgate_endpoint_state)
        self.queues = QueueStates(runtime)
        #: tells once that a group's pilots ask more than an endpoint's queue allows
        self.limit_problems = LimitProblems(runtime, failures)
        #: endpoints whose pilots changed at the last polls (for sources reading the registry)
        self._changed: frozenset[str] | None = None
        #: every backend demand has named (in order): asked for its endpoints' availability
        self._backends: dict[str, None] = {}
        #: demand groups that fit no endpoint, and why: said once until they fit again
        self._unfit: dict[tuple[str, str], str] = {}

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
        if not runtime.settings.paused:  # paused on purpose: no demand, no stall
            runtime.broadcast(
                "gridgate_demand", "demand plugin", "demand", iteration=info, demand=demand
            )
        try:
            failing = runtime.failing.excluded()
            troubled = runtime.failing.troubled()
        except StateError as exc:
            logger.error("state store unreadable, failing cache ignored this iteration: {}", exc)
            failing, troubled = set(), set()
        it = Iteration(
            info=info,
            failing=failing,
            retry=ResubmitPolicy.for_iteration(runtime.settings, info.started),
            troubled=troubled,
        )
        it.notifications.extend(sent)
        for note in unsent:
            self.failures.tell(it, note)
        asked = demand.figures  # before the limits trim the demand
        self.demand_sources.check(it, asked)
        self.credentials.check(it, demand)  # before any command could use one
        self._availability(it, demand)  # before any server is polled or chosen
        demand = self.tracker.prepare(demand, it)  # poll pilots, cancel, trim to the limits
        self._changed = _changed_endpoints(it)
        jobs = self._plan(demand, it)
        threads = runtime.settings.max_threads
        if jobs:
            with ThreadPoolExecutor(
                max_workers=min(threads, len(jobs)), thread_name_prefix="submit"
            ) as pool:
                for future in [
                    pool.submit(self._submit_request, backend, request, it)
                    for backend, request in jobs
                ]:
                    future.result()
            self.tracker.submissions_done()
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
            credential_users=dict(it.credential_users),
            unavailable=dict(it.availability),
            demand=asked,
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
        keys = {e.key for e in endpoints}
        it.availability = merge_availability(answers or [], keys)
        # the queues that may get pilots say what they hold and whether they run new jobs
        wanted = dict.fromkeys(r.backend for r in demand.requests if r.count > 0)
        queues = self.queues.ask(it, asked_endpoints(it, wanted))
        closed = closed_queues(queues)
        if closed:
            it.availability = merge_availability([*(answers or []), (SOURCE, closed)], keys)
        self.notices.tell_changes(it)

    def _plan(
        self, demand: DemandRegistry, it: Iteration
    ) -> list[tuple[BackendInfo, SubmitRequest]]:
        """Split demand into submissions of the backend's bulk size."""
        jobs: list[tuple[BackendInfo, SubmitRequest]] = []
        infos = it.infos  # asked when availability was (the demand's backends among them)
        for backend in dict.fromkeys(r.backend for r in demand.requests):
            if backend not in infos:
                infos[backend] = self.runtime.pm.hook.gridgate_backend_info(backend=backend)
                if infos[backend] is None:
                    logger.error("demand names backend {!r}, which is not configured", backend)
        claimed: set[tuple[str, str]] = set()
        if self.runtime.settings.demand_lock:  # this director's share of what it can fill
            claimed = self.share.plan(
                (r.backend, r.group)
                for r in demand.requests
                if (info := infos[r.backend]) is not None
                and not it.blocked_everywhere(info, r.credential)
            )
        user = self.runtime.user
        for request in demand.requests:
            info = infos[request.backend]
            if info is None:
                AttemptOutcome(it, request).skipped("no_backend").account(self.failures)
                continue
            if request.credential and request.credential not in it.choice.kinds:
                # a demand file's group (the config's are checked when it is loaded)
                logger.error(
                    "demand group {}/{}: no credential is named {!r} (credentials: {})",
                    request.backend,
                    request.group,
                    request.credential,
                    ", ".join(it.choice.kinds) or "none",
                )
                AttemptOutcome(it, request).skipped("config").account(self.failures)
                continue
            blocked = it.blocked_everywhere(info, request.credential)
            if blocked:  # no candidate for its group: one with a usable credential takes it
                AttemptOutcome(it, request).skipped(blocked).account(self.failures)
                continue
            if not self._fits_somewhere(info, request):
                AttemptOutcome(it, request).skipped("no_fit").account(self.failures)
                continue
            if (
                self.runtime.settings.demand_lock
                and (request.backend, request.group) not in claimed
            ):
                AttemptOutcome(it, request).skipped("claimed_elsewhere").account(self.failures)
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
                AttemptOutcome(it, request).skipped("config").account(self.failures)
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

    def _submit_request(self, info: BackendInfo, request: SubmitRequest, it: Iteration) -> None:
        """Send ``request``, then each part of it that a server had no room for (to a server
        with room, or skipped as trimmed), until nothing is left."""
        parts = [request]
        while parts:
            sending = Sending(info=info, it=it, request=parts.pop())
            self._send_with_retries(sending)
            parts.extend(sending.leftover)

    def _send_with_retries(self, sending: Sending) -> None:
        """Attempts of one request (or of the part of it that fitted), each failed one sent to
        another server while the resubmit policy allows (gridgate.core.engine.retry)."""
        info, it = sending.info, sending.it
        for attempt in range(1, 2 + max(0, it.retry.retries)):
            started = time.monotonic()
            try:
                failure = self._attempt(sending, attempt, started)
            except Exception as exc:  # a plugin bug must not stop the iteration
                logger.opt(exception=exc).error(
                    "submission to {} crashed in a plugin", info.backend
                )
                crashed = AttemptOutcome(it, sending.request, attempt=attempt, started=started)
                crashed.failed("plugin_error").account(self.failures)
                return
            finally:  # its pilots are in the registry now (or none were made)
                self.room.settle(sending)
            if failure is None or not self._retry(sending, attempt, failure):
                return

    def _retry(self, sending: Sending, attempt: int, failure: Failure) -> bool:
        """Whether the failed ``attempt`` of ``sending`` is sent elsewhere (kept in the
        iteration's retries either way)."""
        info, request, it, tried = sending.info, sending.request, sending.it, sending.tried
        others = [e for e in self._eligible(info, it, request) if e not in tried]
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

    def _attempt(self, sending: Sending, attempt: int, started: float) -> Failure | None:
        """One attempt; the failure when it failed (the caller may send it elsewhere). When the
        server has room for only part of a bulk request, this attempt sends that part (which
        becomes ``sending.request``) and the remainder goes to ``sending.leftover``.

        Its steps: a server to try (:meth:`_candidates`, :meth:`_reserve`), admission
        (:meth:`_admit`), the commands (:meth:`_send`); each way it ends is one
        :class:`AttemptOutcome`, accounted once."""
        info, it = sending.info, sending.it
        start = AttemptOutcome(it, sending.request, attempt=attempt, started=started)
        group = (sending.request.backend, sending.request.group)
        if self.runtime.settings.demand_lock and not self.share.holds(group):
            start.skipped("claimed_elsewhere").account(self.failures)  # its lease lapsed
            return None
        candidates = self._candidates(sending, start)
        if candidates is None:
            return None
        endpoint = self._reserve(sending, candidates)
        if endpoint is None:
            if it.limits is not None:
                it.limits.skipped(info.backend, sending.request.count)
            start.skipped("max_waiting").account(self.failures)
            return None
        sending.tried.append(endpoint)
        intents = self.tracker.intents
        try:  # intent first: what is sent can always be found again by its name
            sending.request = intents.begin(endpoint, sending.request)
            self.room.named(sending)
        except OSError as exc:
            return self._unrecordable(sending, start.on(endpoint, sending.request), exc)
        name = sending.request.name
        reached = start.on(endpoint, sending.request)
        with it.lock:
            paused = info.backend in it.local_faults
        if paused:  # another thread found meanwhile that its commands cannot run here
            intents.settle(name)
            reached.skipped("local_fault").account(self.failures)
            return None
        grant = self._admit(endpoint, sending.request)
        if isinstance(grant, Refusal):
            intents.settle(name)
            reached.refused("admission").account(self.failures)
            return None
        names = it.choice.names(
            info.backend, info.credentials, endpoint.name, sending.request.credential
        )
        try:
            with credentials_in_force(names):  # the backend's commands get the group's
                result = self._send(info, endpoint, sending.request, grant)
        except BaseException:
            intents.unsettle(name, "its submission crashed in a plugin")
            raise
        done = reached.timed()
        if result is None:
            intents.settle(name)
            done.no_match().account(self.failures)
            return None
        if result.ok:
            # an uncertain answer names the jobs it knows were made, one per pilot; the others
            # are accounted when they are found by name (intents)
            done = done.submitted(result.job_ids)
            if result.uncertain:
                done = replace(done, pilots=len(result.job_ids))
            done.account(self.failures)
            intents.finish(name, result)
            return None
        failure = self.failures.server_failed(endpoint, result, it, submission=True)
        done.failed(failure.kind).account(self.failures)
        intents.finish(name, result)
        return failure

    def _unrecordable(self, sending: Sending, reached: AttemptOutcome, exc: OSError) -> Failure:
        """The intent of ``sending`` could not be written: nothing is sent (its result could
        be recorded nowhere that outlives this process), said as a fault of this machine."""
        endpoint = reached.endpoint
        assert endpoint is not None
        why = unrecordable(self.tracker.intents.folder, exc)
        result = SubmitResult(endpoint, ok=False, local_fault=why, message=why)
        failure = self.failures.server_failed(endpoint, result, sending.it, submission=True)
        reached.failed(failure.kind).account(self.failures)
        return failure

    def _candidates(self, sending: Sending, start: AttemptOutcome) -> list[Endpoint] | None:
        """The servers this attempt may try; None when it cannot try any (accounted as
        skipped: the backend is paused, or every server left is withdrawn or none is left)."""
        info, it = sending.info, sending.it
        with it.lock:
            paused = info.backend in it.local_faults
        if paused:  # its command cannot start here: trying every server would only repeat that
            start.skipped("local_fault").account(self.failures)
            return None
        request = sending.request
        candidates = [e for e in self._eligible(info, it, request) if e not in sending.tried]
        if not candidates:
            # every server left is withdrawn (drained, banned, weight 0) or waits for its
            # credential: said as such, no stall
            left = [e for e in it.usable(info.endpoints) if e not in sending.tried]
            waiting = [e for e in left if it.credential_block(info, e, request.credential)]
            # or every one left said its queue cannot run these pilots: the group's config
            too_big = [e for e in left if beyond_limits(request, it.queues.get(e.key))]
            reason = "unavailable" if left else "no_endpoint"
            if left and waiting == left:
                reason = "credential"
            elif left and too_big == left:
                reason = "config"
            start.skipped(reason).account(self.failures)
            return None
        return candidates

    def _reserve(self, sending: Sending, candidates: list[Endpoint]) -> Endpoint | None:
        """The server the selector picks among ``candidates`` that still has room, with room
        reserved there for the request (or the part of it that fits: that part becomes
        ``sending.request``, the rest goes to ``sending.leftover``); None when none has room."""
        it, request = sending.it, sending.request
        weights = self._weights(sending.info.backend)
        while candidates:
            if it.limits is not None:
                candidates = it.limits.with_room(candidates)
                if not candidates:
                    return None
            endpoint = (
                self.runtime.pm.hook.gridgate_select_endpoint(
                    candidates=candidates,
                    request=request,
                    weights=weights,
                    availability=it.availability,
                    queues={e.key: it.queues[e.key] for e in candidates if e.key in it.queues},
                )
                or candidates[0]
            )
            fitting = it.limits.reserve(endpoint, request) if it.limits is not None else request
            if fitting is not None:
                fitting = self.room.reserve(sending, endpoint, fitting)
            if fitting is not None:
                if fitting.count < request.count:
                    sending.leftover.append(replace(request, count=request.count - fitting.count))
                sending.request = fitting
                return endpoint
            # another thread took the last room there between the check and the reservation:
            # the pilot goes to another server that has some
            candidates = [e for e in candidates if e != endpoint]
        return None

    def _admit(self, endpoint: Endpoint, request: SubmitRequest) -> Grant | Refusal | None:
        """Admission control's answer for sending ``request`` to ``endpoint``."""
        answer: Grant | Refusal | None = self.runtime.pm.hook.gridgate_admit(
            request=AdmissionRequest(
                category="submission",
                opcode="JOB_SUBMIT",
                user=request.user,
                size=request.count,
                endpoint=endpoint,
            )
        )
        return answer

    def _send(
        self, info: BackendInfo, endpoint: Endpoint, request: SubmitRequest, grant: Grant | None
    ) -> SubmitResult | None:
        """Run the commands of ``request`` on ``endpoint`` (:meth:`_commands`), giving
        ``grant`` back as soon as the server is no longer being talked to."""
        try:
            return self._commands(endpoint, request, self.runtime.timeout(info))
        finally:
            if grant is not None:
                self.runtime.pm.hook.gridgate_release(grant=grant)

    def _section(self, backend: str) -> Mapping[str, Any]:
        """``backend``'s config section (empty when none)."""
        section = (self.runtime.config.get("backends") or {}).get(backend) or {}
        return section if isinstance(section, Mapping) else {}

    def _weights(self, backend: str) -> Mapping[str, int]:
        """The ``weights`` of ``backend``'s config section (empty when none)."""
        weights = self._section(backend).get("weights")
        return weights if isinstance(weights, Mapping) else {}

    def _fits_somewhere(self, info: BackendInfo, request: SubmitRequest) -> bool:
        """Whether some endpoint of ``info`` can run ``request``'s pilots (its
        ``endpoint_resources``, what the backend expresses); a group that fits none is said
        once (a warning) until it fits again (a notice)."""
        if request.resources is None:
            return True
        declared = capacities(self._section(info.backend), info.endpoints)
        reasons = {
            e.key: unfit_reason(request.resources, declared.get(e.key), info)
            for e in info.endpoints
        }
        group = (request.backend, request.group)
        if info.endpoints and all(reasons.values()):
            why = "; ".join(f"{key}: {reason}" for key, reason in reasons.items())
            if self._unfit.get(group) != why:
                logger.warning(
                    "demand group {}/{} asks {} pilot(s) of {}, which no endpoint can run ({}): "
                    "none sent until one can",
                    request.backend,
                    request.group,
                    request.count,
                    requirement_label(request.resources),
                    why,
                )
            self._unfit[group] = why
            return False
        if self._unfit.pop(group, None) is not None:
            logger.info("demand group {}/{} fits an endpoint again", request.backend, request.group)
        return True

    def _eligible(self, info: BackendInfo, it: Iteration, request: SubmitRequest) -> list[Endpoint]:
        """``info``'s endpoints that may get ``request``'s pilots now: usable, neither drained
        nor banned, not weighted 0 (0 means never, whatever the selector), the credential
        the request would use there usable, and their queue's limits not below what the
        pilots ask (as far as the queue said)."""
        weights = self._weights(info.backend)
        declared = capacities(self._section(info.backend), info.endpoints)
        eligible = [
            e
            for e in it.submittable(info.endpoints)
            if configured_weight(e, weights) > 0
            and not it.credential_block(info, e, request.credential)
            and fits(request.resources, declared.get(e.key))
        ]
        return self.limit_problems.fitting(it, request, eligible) if it.queues else eligible

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


def _changed_endpoints(it: Iteration) -> frozenset[str] | None:
    """Keys of the endpoints whose pilots changed state at this iteration's polls."""
    if it.pilots is None:
        return None
    changed = {f"{p.backend}/{p.endpoint}" for p in it.pilots.polls if p.changed}
    return frozenset(changed | set(it.pilots.aborted))
