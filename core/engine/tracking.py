"""Closes the director's loop: it polls the pilots it submitted, bounds what waits, cancels what
waited too long, and takes out of rotation an endpoint whose pilots abort.

At the start of each iteration, after the demand hooks and before anything is submitted, the
:class:`PilotTracker` polls each endpoint that is due (``status_interval``) with one
``gridgate_job_status`` call carrying every non-terminal pilot of that endpoint, under an
admission grant of category ``query`` and the command deadline. The poll reads the pilots'
states and submission times alone (``PilotRegistry.live_states``), then reads and writes whole
rows only for the pilots whose state the answer changes. A failed query is a failure of that
server, classified and escalated like a failed submission; its pilots keep their last state.
Then the demand is trimmed to ``max_waiting`` and ``max_waiting_cores`` (per endpoint)
and ``max_total`` (per backend), and each submission reserves room on the endpoint it goes to.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from loguru import logger

from gridgate.core.credential_names import credentials_in_force
from gridgate.core.engine.aborted import AbortVerdicts
from gridgate.core.engine.cancelling import cancel_pilots
from gridgate.core.engine.epoch import StoreEpoch
from gridgate.core.engine.failure import AttemptOutcome, FailurePath, failed_call
from gridgate.core.engine.intents import Intents, default_instance
from gridgate.core.engine.kept_output import OutputKeeper
from gridgate.core.engine.limits import PilotRoom, PilotSettings, cores_of
from gridgate.core.engine.pending import PendingPilots
from gridgate.core.engine.pilot_credentials import GroupCredentials, names_for, split_live
from gridgate.core.engine.queue_state import reported_waiting
from gridgate.core.engine.records import clock_time
from gridgate.core.engine.retired import RetiredEndpoints
from gridgate.core.engine.runtime import Iteration, PilotReportDraft, Runtime
from gridgate.core.model import (
    PILOT_STATES,
    AccountingRecord,
    AdmissionRequest,
    BackendInfo,
    DemandRegistry,
    Endpoint,
    Failure,
    PollReport,
    Refusal,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.state import Counts, LiveStates, Pilot, PilotRegistry, StateError

#: An endpoint's last poll as ``gridgate servers show`` tells it (time, outcome, pilots asked
#: about, how many changed), kept as long as finished pilots are.
LAST_POLL = "pilots-last-poll/"
#: An endpoint's last poll (its time, with status_interval as TTL) in the shared state store:
#: of several directors on one store, one polls an endpoint per interval.
POLLED = "pilots-polled/"


@dataclass
class _Poll:
    """What polling one endpoint did, for the iteration's ``pilots`` report."""

    endpoint: Endpoint
    pilots: int
    outcome: str  # ok, failed, refused, unsupported, skipped
    commands: int = 0
    changed: int = 0
    #: the state and submission time of each pilot still live after the poll
    live: LiveStates = field(default_factory=LiveStates)

    @classmethod
    def joined(cls, parts: Sequence[_Poll]) -> _Poll:
        """One endpoint's poll made of several (one per credential its pilots were asked
        with): ``ok`` only when each part was, else the first part's other outcome."""
        live = LiveStates()
        for part in parts:
            live.states.update(part.live.states)
            live.submitted.update(part.live.submitted)
        outcome = next((p.outcome for p in parts if p.outcome != "ok"), "ok")
        return cls(
            parts[0].endpoint,
            sum(p.pilots for p in parts),
            outcome,
            sum(p.commands for p in parts),
            sum(p.changed for p in parts),
            live,
        )


@dataclass(frozen=True)
class _Target:
    """One endpoint's pilots being polled, as the registry's lean read gives them (their
    states and submission times, no rows); ``retired``: the endpoint left the config."""

    endpoint: Endpoint
    live: LiveStates
    retired: bool

    @functools.cached_property
    def ids(self) -> list[str]:
        return list(self.live.states)

    def poll(self, outcome: str, commands: int = 0) -> _Poll:
        """The poll, ended as ``outcome`` (its pilots all still live)."""
        return _Poll(self.endpoint, len(self.live), outcome, commands, live=self.live)


class PilotTracker:
    """The director's pilot bookkeeping; one per director, called from its iteration."""

    def __init__(
        self,
        runtime: Runtime,
        failures: FailurePath,
        on_stuck: Callable[[dict[str, str]], None] | None = None,
        instance: str = "",
    ) -> None:
        self.runtime = runtime
        #: the submissions written before they are sent, and the store's identity
        self.intents = Intents(runtime, instance or default_instance())
        self.epoch = StoreEpoch(runtime, self.intents)
        #: where a failed poll, aborting pilots or a cancel this machine cannot run go
        self.failures = failures
        #: told which backends' limits have been stuck (the director's stall watch)
        self.on_stuck = on_stuck
        #: last poll per endpoint, used only while the state store cannot say (see _claim)
        self._last_poll: dict[str, float] = {}
        self._last_prune: float | None = None
        self._lock = threading.Lock()
        #: this iteration's pilots by endpoint and state, kept current as submissions succeed
        self._states: dict[str, dict[str, int]] = {}
        #: backends that answered no status query (no gridgate_job_status): no limits for them
        self._blind: set[str] = set()
        self._blind_pm: object = None
        #: the registry's counts at the last iteration that could read them, and the pilots
        #: submitted since that the store could not take: while the store is down the limits
        #: apply to these (fail closed), and the pilots are written back when it returns
        self.pending = PendingPilots(lambda: runtime.settings.state_dir)
        self.retired = RetiredEndpoints(runtime, failures)
        self.verdicts = AbortVerdicts(runtime, failures)
        self.keeper = OutputKeeper(runtime)  # director.pilots.keep_output
        #: (backend, group) -> cores of one pilot, from this iteration's demand: what a
        #: submission's pilots are recorded with
        self._group_cores: dict[tuple[str, str], int] = {}
        #: the credential each demand group names: its pilots are polled and cancelled with it
        self.group_credentials = GroupCredentials(runtime)
        #: per backend: (iterations, clock time) of the last change of state of its pilots
        self._last_change: dict[str, tuple[int, float]] = {}
        #: backend -> the iteration of its last status poll that answered
        self._last_ok_poll: dict[str, int] = {}
        self._iterations = 0
        #: submission name -> its room reservation in the store (set by the iteration runner)
        self._reservation_of: Callable[[str], str] | None = None

    # --- settings and the registry ----------------------------------------------------------

    @property
    def settings(self) -> PilotSettings:
        """``director.pilots`` of the config in force (built once per config)."""
        return self.runtime.settings.pilots

    def reservation_of(self, name: str) -> str:
        """The room reservation held for the submission ``name`` (given by the iteration
        runner's :class:`~gridgate.core.engine.sharing.StoreRoom`); "" for none."""
        return self._reservation_of(name) if self._reservation_of is not None else ""

    def registry(self) -> PilotRegistry | None:
        """The store's registry, None while the store is down (nothing said)."""
        return self._registry(quiet=True)

    def _registry(self, quiet: bool = False) -> PilotRegistry | None:
        """The store's registry; None while the store is down (the director runs on its local
        view then, and every call to the store would wait for it to time out)."""
        if getattr(self.runtime.state, "degraded", False):
            if not quiet:
                logger.error(
                    "state store unavailable: pilots are not polled, limited or tracked "
                    "this iteration"
                )
            return None
        try:
            return self.runtime.state.pilot_registry()
        except StateError as exc:
            if not quiet:
                logger.error(
                    "pilot registry unavailable, pilots are not tracked this iteration: {}", exc
                )
            return None

    # --- submissions --------------------------------------------------------------------------

    def submitted(self, record: AccountingRecord) -> None:
        """Track the pilots of a successful submission (one per job id)."""
        if not record.job_ids or not self.settings.track:
            return
        pilots = [
            Pilot(
                job_id=job,
                backend=record.backend,
                endpoint=record.endpoint,
                group=record.group,
                submitted=record.time,
                state="waiting",
                changed=record.time,
                cores=self._group_cores.get((record.backend, record.group), 1),
            )
            for job in record.job_ids
        ]
        registry = self._registry(quiet=True)
        try:
            if registry is None:
                raise StateError("the state store is unavailable")
            holder = self.reservation_of(record.name) if record.name else ""
            if holder:  # registered and its room settled in one step (core/engine/sharing.py)
                registry.put_reserved(pilots, holder)
            else:
                registry.put(pilots)
        except StateError as exc:
            logger.error(
                "{} submitted pilot(s) on {} kept in memory until the state store "
                "answers (they count against the limits meanwhile): {}",
                len(pilots),
                record.endpoint,
                exc,
            )
            self.pending.unrecorded_pilots(pilots)
            self.intents.unrecorded(record.name)
            self.pending.save()  # pilots only this process knows: on disk before the next
        else:
            self.pending.recorded(pilots)  # the last known counts too
        with self._lock:
            row = self._states.setdefault(
                f"{record.backend}/{record.endpoint}", dict.fromkeys(PILOT_STATES, 0)
            )
            row["waiting"] += len(pilots)

    def submissions_done(self) -> None:
        """After the iteration's submissions: the last known counts to :data:`PENDING_FILE`
        once, not after each submission (issue 43: ~21 rewrites an iteration). The pilots the
        store did not take were written at once by :meth:`submitted`."""
        self.pending.save()

    # --- the start of an iteration -------------------------------------------------------------

    def prepare(self, demand: DemandRegistry, it: Iteration) -> DemandRegistry:
        """Poll what is due, cancel what waited too long, and return the demand trimmed to the
        limits; ``it.limits`` and ``it.pilots`` are set for the submissions and the summary.
        A bug here (or in a plugin it calls) costs the polling of one iteration, never the
        iteration, and never the limits: the demand is then trimmed to the last known counts."""
        try:
            return self._prepare(demand, it)
        except Exception as exc:
            logger.opt(exception=exc).error(
                "pilot tracking failed; the limits apply to the last known counts this iteration"
            )
            try:
                return self._prepare_blind(demand, it, self.settings, "pilot tracking failed")
            except Exception as again:  # the limits themselves failed: nothing left to apply
                logger.opt(exception=again).error(
                    "pilot limits failed; this iteration's demand is not trimmed"
                )
                it.limits = None
                return demand

    def _prepare(self, demand: DemandRegistry, it: Iteration) -> DemandRegistry:
        settings = self.settings
        self._states = {}
        if not settings.track:
            return demand
        self._group_cores = {(r.backend, r.group): cores_of(r) for r in demand.requests}
        self.group_credentials.learn(demand.requests, settings.keep_finished)
        self._iterations += 1
        self.pending.load()
        runtime = self.runtime
        hook = runtime.pm.hook
        registry = self._registry()
        counts: Counts | None = None
        if registry is not None:
            try:
                self.pending.write_back(registry)
                self._reconcile(registry, it)
                counts = registry.counts()
            except StateError as exc:
                logger.error("pilot registry unreadable: {}", exc)
        if registry is None or counts is None:
            return self._prepare_blind(demand, it, settings)
        # configured backends, those with demand, and those (extra plugins) with tracked pilots
        backends = list(
            dict.fromkeys(
                [
                    *(runtime.config.get("backends") or {}),
                    *(r.backend for r in demand.requests),
                    *(b for b, _e, _s in counts),
                ]
            )
        )
        infos: dict[str, BackendInfo] = {}
        for backend in backends:
            info = hook.gridgate_backend_info(backend=backend)
            if info is not None:
                infos[backend] = info
                # one only tracked pilots name (no demand, not configured) polls and cancels
                # with the credentials it needs too (Iteration.credentials_of)
                it.infos.setdefault(backend, info)
        now = runtime.clock.time()
        report = PilotReportDraft()
        retired = self.retired.find(counts, infos, it, now)
        moved_in: dict[str, int] = {}
        self.keeper.every = settings.keep_output
        try:
            polls = self._poll(registry, infos, it, settings, now, retired)
            polled_ok = {p.endpoint.key for p in polls if p.outcome == "ok"}
            for endpoints in retired.values():
                for endpoint in endpoints:
                    if endpoint.key in polled_ok:
                        self.retired.answered(endpoint, now)
                    else:
                        gone = self.retired.lost(registry, endpoint, settings, now)
                        if gone:
                            report.changed += gone
                            moved_in[endpoint.backend] = moved_in.get(endpoint.backend, 0) + gone
            for poll in polls:
                moved_in[poll.endpoint.backend] = (
                    moved_in.get(poll.endpoint.backend, 0) + poll.changed
                )
                report.polls.append(
                    PollReport(
                        backend=poll.endpoint.backend,
                        endpoint=poll.endpoint.name,
                        pilots=poll.pilots,
                        outcome=poll.outcome,
                        commands=poll.commands,
                        changed=poll.changed,
                    )
                )
                report.changed += poll.changed
                self._keep_poll(poll, now, settings)
                if poll.outcome == "ok":
                    self._last_ok_poll[poll.endpoint.backend] = self._iterations
                    self.failures.answered(poll.endpoint, it)
                    cancelled = self._cancel_old(
                        registry, poll, infos[poll.endpoint.backend], settings, now, it
                    )
                    if cancelled:
                        report.cancelled[poll.endpoint.key] = cancelled
                        moved_in[poll.endpoint.backend] = (
                            moved_in.get(poll.endpoint.backend, 0) + cancelled
                        )
                    if poll.endpoint.backend in retired and any(
                        poll.endpoint == e for e in retired[poll.endpoint.backend]
                    ):
                        continue  # no verdict on a server that is no longer in the config
                    if poll.changed and self.verdicts.judge(
                        registry, poll.endpoint, it, settings, now
                    ):
                        report.aborted.append(poll.endpoint.key)
            if settings.keep_output:
                self.keeper.keep(settings.keep_output_last)
            moved = report.changed or report.cancelled
            if self._prune(registry, settings, now) or moved:
                counts = registry.counts()
        except StateError as exc:
            logger.error(
                "pilot registry failed, the limits apply to the last known counts: {}", exc
            )
            it.pilots = report
            return self._prepare_blind(demand, it, settings)
        for backend in infos:
            if moved_in.get(backend) or backend not in self._last_change:
                self._last_change[backend] = (self._iterations, now)
        cores = self._waiting_cores(registry, settings, counts)
        self.pending.read(counts, cores)
        retired_keys = {e.key for endpoints in retired.values() for e in endpoints}
        return self._trim(demand, it, settings, counts, infos, report, retired_keys, cores)

    def _reconcile(self, registry: PilotRegistry, it: Iteration) -> None:
        """Before anything is counted: a store that came back empty is noticed (its fleet's
        pilots searched for on every endpoint, which gets no pilot until it was), and the
        submissions whose answer never came are looked for by name (:mod:`.intents`).

        :raises StateError: the store failed meanwhile."""
        hook = self.runtime.pm.hook
        endpoints: list[Endpoint] = []
        # configured backends and those demand named (asked when availability was)
        for backend in dict.fromkeys([*it.infos, *(self.runtime.config.get("backends") or {})]):
            info = it.infos.get(backend) or hook.gridgate_backend_info(backend=backend)
            if info is not None:
                endpoints.extend(info.endpoints)
        self.epoch.check(endpoints)
        it.unsearched = self.epoch.search(registry, endpoints)
        if not self.pending.unrecorded:
            self.intents.written_back()
        self.intents.reconcile(registry)

    def _waiting_cores(
        self, registry: PilotRegistry, settings: PilotSettings, counts: Counts
    ) -> dict[str, int] | None:
        """The cores of the pilots waiting on each endpoint, when a limit counts them (None
        otherwise: nothing to read); an unreadable registry counts the last known cores."""
        if not settings.counts_cores:
            return None
        try:
            cores: dict[str, int] = {}
            for (backend, endpoint, _group), (_n, c) in registry.waiting().items():
                key = f"{backend}/{endpoint}"
                cores[key] = cores.get(key, 0) + c
            return cores
        except StateError as exc:
            logger.error(
                "pilot registry: cannot read the waiting cores, using the last known: {}", exc
            )
            return self.pending.cores()

    def _trim(
        self,
        demand: DemandRegistry,
        it: Iteration,
        settings: PilotSettings,
        counts: Counts,
        infos: Mapping[str, BackendInfo],
        report: PilotReportDraft,
        retired: Iterable[str] = (),
        waiting_cores: Mapping[str, int] | None = None,
    ) -> DemandRegistry:
        blind = set(self._blind)
        if not self.runtime.pm.hook.gridgate_job_status.get_hookimpls():
            # no plugin at all can report a pilot's state: the limits would only block (what a
            # first poll would find out, one iteration late, with the finite defaults applied)
            blind.update(infos)
        # the pilots of submissions not settled yet count as waiting: a restart in the middle
        # of a submission sends no more than the limits allow
        flying, flying_cores = self.intents.in_flight()
        if flying:
            counts = dict(counts)
            for where, n in flying.items():
                counts[where] = counts.get(where, 0) + n
            if waiting_cores is not None:
                waiting_cores = dict(waiting_cores)
                for key, c in flying_cores.items():
                    waiting_cores[key] = waiting_cores.get(key, 0) + c
        limits = PilotRoom(
            settings, counts, infos, blind, retired, waiting_cores, reported_waiting(it.queues)
        )
        usable = {b: it.usable(info.endpoints) for b, info in infos.items()}
        # a group whose credential cannot be used on any endpoint now submits nothing, and
        # its pilots were not polled: the counts are stale, so a limit would be blamed for
        # what the credential stops. Its demand goes untrimmed to the plan, which skips it as
        # `credential`.
        blocked = [
            r
            for r in demand.requests
            if (info := infos.get(r.backend)) is not None
            and it.blocked_everywhere(info, r.credential)
        ]
        held = {id(r) for r in blocked}
        kept, cuts = limits.trim([r for r in demand.requests if id(r) not in held], usable)
        kept += blocked
        for request, limit, pilots in cuts:
            AttemptOutcome(it, request).skipped(limit, pilots).account(self.failures)
        self._stuck(settings, infos, kept, cuts, counts)
        self.pending.save()
        it.limits = limits
        # the same dicts the submissions update (room taken, pilots waiting): the summary says
        # what they are after the iteration's submissions
        report.states = self._states = state_counts(counts)
        report.trimmed = limits.trimmed
        it.pilots = report
        trimmed = DemandRegistry()
        for request in kept:
            trimmed.add(request)
        return trimmed

    # --- the store down: fail closed ----------------------------------------------------------------

    def _prepare_blind(
        self,
        demand: DemandRegistry,
        it: Iteration,
        settings: PilotSettings,
        why: str = "pilot registry unavailable",
    ) -> DemandRegistry:
        """No registry this iteration: nothing is polled, and the demand is trimmed to the
        limits on the last known counts and this process's own submissions since."""
        hook = self.runtime.pm.hook
        counts = self.pending.counts()
        problem = self.intents.unwritable() if settings.track else ""
        if problem:  # no result could be recorded anywhere: nothing is sent, said as such
            demand = self._unrecordable(demand, it, problem)
        backends = list(
            dict.fromkeys(
                [
                    *(self.runtime.config.get("backends") or {}),
                    *(r.backend for r in demand.requests),
                ]
            )
        )
        infos = {b: i for b in backends if (i := hook.gridgate_backend_info(backend=b)) is not None}
        report = PilotReportDraft(blind=why)
        logger.error(
            "{}: the limits apply to the last known counts plus {} pilot(s) submitted "
            "since; nothing is polled",
            why,
            self.pending.unrecorded,
        )
        cores = self.pending.cores() if settings.counts_cores else None
        return self._trim(demand, it, settings, counts, infos, report, (), cores)

    def _unrecordable(self, demand: DemandRegistry, it: Iteration, problem: str) -> DemandRegistry:
        """Neither the store nor the state folder takes a result: every demand request is
        skipped as a fault of this machine (``local_io``, its backend paused), told once per
        failing-cache period, before any limit could be blamed for it."""
        logger.error("{}", problem)
        told: set[str] = set()
        for request in demand.requests:
            AttemptOutcome(it, request).skipped("local_io").account(self.failures)
            info = it.infos.get(request.backend)
            if info is None or not info.endpoints or request.backend in told:
                continue
            told.add(request.backend)
            endpoint = info.endpoints[0]
            result = SubmitResult(endpoint, ok=False, local_fault=problem, message=problem)
            failure = Failure(kind="local_io", exclude=False, reason=problem, local=True)
            self.failures.local_fault(endpoint, failure, result, it)
        return DemandRegistry()

    # --- limits that do not move ------------------------------------------------------------------

    def _stuck(
        self,
        settings: PilotSettings,
        infos: Mapping[str, BackendInfo],
        kept: Sequence[SubmitRequest],
        cuts: Sequence[tuple[SubmitRequest, str, int]],
        counts: Counts,
    ) -> None:
        """Tell the stall watch which backends had their demand trimmed to zero by limits whose
        pilots changed no state for ``stall_iterations`` polls (the polls fail, the backend is
        paused, the store is down, or nothing starts): a trim that never ends is a stall.

        A full site is not one: when the backend's polls answer and some of its pilots run,
        the waiting ones wait for the slots those hold (long pilots change no state for hours),
        and the limit is doing its job."""
        limit = self.runtime.settings.stall_iterations
        now = self.runtime.clock.time()
        served = {r.backend for r in kept}
        stuck: dict[str, str] = {}
        for request, _limit, _n in cuts:
            backend = request.backend
            if backend in served or backend in stuck or backend not in infos:
                continue
            running = sum(
                n for (b, _e, state), n in counts.items() if b == backend and state == "running"
            )
            last_ok = self._last_ok_poll.get(backend)
            if running and last_ok is not None and self._iterations - last_ok < limit:
                continue
            # a director that never read the registry (the store down since it started)
            # counts from its first iteration
            since_it, since = self._last_change.setdefault(backend, (self._iterations, now))
            interval = self._interval(settings, backend)
            polls = self._iterations - since_it
            if polls >= limit and (interval is None or now - since >= limit * float(interval)):
                stuck[backend] = (
                    f"demand trimmed to zero by the pilot limits, and no pilot of "
                    f"{backend} changed state for {polls} iteration(s)"
                )
        if self.on_stuck is not None:
            self.on_stuck(stuck)

    # --- polling ---------------------------------------------------------------------------------

    def _poll(
        self,
        registry: PilotRegistry,
        infos: Mapping[str, BackendInfo],
        it: Iteration,
        settings: PilotSettings,
        now: float,
        retired: Mapping[str, Sequence[Endpoint]] | None = None,
    ) -> list[_Poll]:
        due: list[tuple[Endpoint, float, float | None]] = []
        gone = {e.key for endpoints in (retired or {}).values() for e in endpoints}
        for backend, info in infos.items():
            if it.paused(info):  # no endpoint's credential is usable (Iteration.paused): not asked
                continue
            interval = self._interval(settings, backend)
            timeout = self.runtime.timeout(info)
            # a server out of rotation is not asked (nor a banned one its backend cannot ask);
            # one no longer configured still is
            for endpoint in [*it.pollable(info), *(retired or {}).get(backend, ())]:
                due.append((endpoint, timeout, None if interval is None else float(interval)))
        if not due:
            return []
        threads = min(self.runtime.settings.max_threads, len(due))
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="status") as pool:
            futures = [
                pool.submit(
                    self._poll_one,
                    registry,
                    endpoint,
                    timeout,
                    interval,
                    it,
                    settings,
                    now,
                    endpoint.key in gone,
                )
                for endpoint, timeout, interval in due
            ]
            return [p for p in (f.result() for f in futures) if p is not None]

    def _interval(self, settings: PilotSettings, backend: str) -> float | None:
        """Seconds between two polls of one of ``backend``'s endpoints, None for every
        iteration. Unset, with ``demand_lock`` (several directors on one store), half a cycle
        among all of them: the atomic poll claim then keeps an endpoint's polls at most two a
        cycle however many directors there are, where each polled at every iteration before
        (4 directors: 72 polls became 256-288 for the same work, issue 43). Not longer: the
        limits count the registry's waiting pilots, so their states must be about as fresh
        as one cycle (DIRAC can poll every 10th cycle because its limits read the CE's own
        queue figures)."""
        interval = settings.for_backend(backend, "status_interval")
        if interval is None and self.runtime.settings.demand_lock:
            return self.runtime.settings.cycle_seconds / 2
        return None if interval is None else float(interval)

    def _due(self, endpoint: Endpoint, interval: float, now: float) -> bool:
        """Whether ``endpoint``'s last poll is ``interval`` seconds old or more (a read only;
        :meth:`_claim` decides among directors)."""
        try:
            held = clock_time(self.runtime.state.get(POLLED + endpoint.key), "poll claim")
            return held is None or now - held >= interval
        except (StateError, ValueError):
            with self._lock:
                last = self._last_poll.get(endpoint.key)
            return last is None or now - last >= interval

    def _claim(self, endpoint: Endpoint, interval: float, now: float) -> bool:
        """Whether this director polls ``endpoint`` now: its last poll (by any director on this
        store) is ``interval`` seconds old or more. The add is atomic, so of several directors
        one wins; a shortened interval takes effect at once."""
        key = POLLED + endpoint.key
        state = self.runtime.state
        try:
            if state.add_if_absent(key, repr(now), ttl=interval):
                return True
            held = clock_time(state.get(key), "poll claim")
            if held is not None and now - held < interval:
                return False
            state.delete(key)
            return state.add_if_absent(key, repr(now), ttl=interval)
        except (StateError, ValueError):  # no shared view: this process's own memory decides
            with self._lock:
                last = self._last_poll.get(endpoint.key)
                if last is not None and now - last < interval:
                    return False
                self._last_poll[endpoint.key] = now
                return True

    def _unclaim(self, endpoint: Endpoint, interval: float | None) -> None:
        if interval is None:
            return
        try:
            self.runtime.state.delete(POLLED + endpoint.key)
        except StateError:
            pass  # the claim was written with ttl=interval: it lapses by itself
        with self._lock:
            self._last_poll.pop(endpoint.key, None)

    def _poll_one(
        self,
        registry: PilotRegistry,
        endpoint: Endpoint,
        timeout: float,
        interval: float | None,
        it: Iteration,
        settings: PilotSettings,
        now: float,
        retired: bool = False,
    ) -> _Poll | None:
        """Poll ``endpoint``'s pilots, when it is due (None when not): admission, the status
        query, then what its answer says (no answer, an answer cut by gridgate's own output
        cap, a failure, or the pilots' states, written to the registry)."""
        live = self._pollable(registry, endpoint, interval, now)
        if not live:
            return None
        groups = self.group_credentials.of_backend(endpoint.backend)
        polls = []
        # each group's pilots asked with its own credential (a CE answers its creator only)
        for names, part in split_live(registry, endpoint, live, it, groups):
            with credentials_in_force(names):
                polls.append(
                    self._poll_part(
                        registry,
                        _Target(endpoint, part, retired),
                        timeout,
                        interval,
                        it,
                        settings,
                        now,
                    )
                )
        return polls[0] if len(polls) == 1 else _Poll.joined(polls)

    def _poll_part(
        self,
        registry: PilotRegistry,
        target: _Target,
        timeout: float,
        interval: float | None,
        it: Iteration,
        settings: PilotSettings,
        now: float,
    ) -> _Poll:
        """Ask about ``target``'s pilots (one credential's) and take in what the answer says."""
        asked = self._ask(target, timeout, interval)
        if isinstance(asked, _Poll):
            return asked
        if asked is None:
            return self._unanswered(target)
        command = asked.command
        if command is not None and command.stdout_truncated and not command.timed_out:
            return self._output_cut(target, asked, it)
        if not asked.ok:
            return self._poll_failed(target, asked, it)
        return self._apply(registry, target, asked, settings.lost_after, now)

    def _pollable(
        self, registry: PilotRegistry, endpoint: Endpoint, interval: float | None, now: float
    ) -> LiveStates:
        """``endpoint``'s live pilots (states and submission times) when this director polls it
        now; none when its backend cannot report states, its last poll (by any director) is
        recent, or none is live."""
        with self._lock:
            if self._blind_pm is not self.runtime.pm:  # plugins rebuilt: ask every backend again
                self._blind_pm, self._blind = self.runtime.pm, set()
            if endpoint.backend in self._blind:  # it said it cannot: no need to read its pilots
                return LiveStates()
        if interval is not None and not self._due(endpoint, interval, now):
            return LiveStates()  # polled recently (by any director): its pilots are not even read
        live = registry.live_states(endpoint.backend, endpoint.name)
        if not live:
            return LiveStates()
        if interval is not None and not self._claim(endpoint, interval, now):
            return LiveStates()
        return live

    def _ask(
        self, target: _Target, timeout: float, interval: float | None
    ) -> StatusResult | _Poll | None:
        """The backend's answer for ``target``'s pilots (None: no plugin answers), or the poll
        that ended before one: refused by admission control, or a plugin crash."""
        hook = self.runtime.pm.hook
        endpoint = target.endpoint
        answer = hook.gridgate_admit(
            request=AdmissionRequest(
                category="query",
                opcode="JOB_STATUS",
                size=len(target.ids),
                endpoint=endpoint,
                user=self.runtime.user,
            )
        )
        if isinstance(answer, Refusal):
            logger.info(
                "status poll of {} refused by admission control: {}", endpoint.key, answer.reason
            )
            self._unclaim(endpoint, interval)  # not polled: due again at the next iteration
            return target.poll("refused")
        try:
            result: StatusResult | None = hook.gridgate_job_status(
                endpoint=endpoint, job_ids=target.ids, timeout=timeout
            )
            return result
        except Exception as exc:  # a plugin bug must not stop the iteration
            logger.opt(exception=exc).error("status poll of {} crashed in a plugin", endpoint.key)
            return target.poll("plugin_error")
        finally:
            if answer is not None:
                hook.gridgate_release(grant=answer)

    def _unanswered(self, target: _Target) -> _Poll:
        """No plugin reports the states of ``target``'s pilots: its backend is blind from now
        on (said once), unless the endpoint is retired."""
        backend = target.endpoint.backend
        if target.retired:
            # the backend no longer knows this endpoint (an ARC CE leaves with its config):
            # that says nothing of its other endpoints, so the backend is not made blind
            return target.poll("unsupported")
        with self._lock:
            first = backend not in self._blind
            self._blind.add(backend)
        if first:
            logger.warning(
                "backend {} reports no pilot states: its pilots stay as submitted, "
                "and max_waiting / max_total are not applied to it",
                backend,
            )
        return target.poll("unsupported")

    def _output_cut(self, target: _Target, result: StatusResult, it: Iteration) -> _Poll:
        """gridgate's own cap cut the answer (of any backend): the ids past the cut would
        look unknown, then lost, and the server did nothing wrong. A fault of this machine's
        settings: no server blamed, one error per failing_expiry."""
        command = result.command
        assert command is not None
        why = (
            f"the output of {command.argv[0] if command.argv else 'the status command'} "
            f"passed gridgate's own output cap (director.max_output_bytes = "
            f"{self.runtime.settings.max_output_bytes}) and was cut by "
            "gridgate, not by the server; raise director.max_output_bytes"
        )
        if not target.retired:
            failed = failed_call(
                target.endpoint, result, "Job Status", message=why, local_fault=why
            )
            self.failures.server_failed(
                target.endpoint,
                failed,
                it,
                Failure(
                    kind="output_cap",
                    exclude=False,
                    notify=True,
                    transient=False,
                    local=True,
                    reason=why,
                ),
            )
        return target.poll("output_cap", result.commands)

    def _poll_failed(self, target: _Target, result: StatusResult, it: Iteration) -> _Poll:
        """The status query failed: down the failure path (a retired endpoint has no server
        to blame: a warning)."""
        endpoint = target.endpoint
        if target.retired:  # no server to blame: it left the config
            logger.warning(
                "status poll of {} (no longer configured) failed: {}",
                endpoint.key,
                result.local_fault or result.message or "no message",
            )
            return target.poll("failed", result.commands)
        # a fault of this machine (an id file it cannot write, gridgate's own output cap)
        # goes through the same path with local_fault set: kind local_io, the backend
        # paused, one error per failing_expiry, no server blamed
        failed = failed_call(endpoint, result, "Job Status")
        self.failures.server_failed(endpoint, failed, it)
        return target.poll("local_fault" if failed.local_fault else "failed", result.commands)

    def _apply(
        self,
        registry: PilotRegistry,
        target: _Target,
        result: StatusResult,
        lost_after: float,
        now: float,
    ) -> _Poll:
        """Write what the answer says of each pilot whose state it changes to the registry (one
        the backend has not known for ``lost_after`` seconds is lost).

        The answer is compared with the states the lean read gave: only the pilots it moves,
        and those still unknown (which may now be lost), are read whole and written, so a poll
        where nothing changed reads no row and writes nothing. A pilot's ``native`` and
        ``reason`` are what the backend said at its last change of state."""
        endpoint = target.endpoint
        get = result.statuses.get
        moving = [
            job
            for job, state in target.live.states.items()
            if (status := get(job)) is None or status.state != state or state == "unknown"
        ]
        changes: list[Pilot] = []
        ended: list[str] = []
        for pilot in registry.get_many(endpoint.backend, endpoint.name, moving):
            if pilot.terminal:  # ended since the lean read (cancelled by another director)
                ended.append(pilot.job_id)
                continue
            status = get(pilot.job_id)
            if status is None:
                new = pilot.moved("unknown", now, pilot.native, "no longer known to the backend")
            else:
                new = pilot.moved(status.state, now, status.native, status.reason)
            if (
                new.state == "unknown"
                and pilot.state == "unknown"
                and now - pilot.changed >= lost_after
            ):
                new = pilot.moved(
                    "lost",
                    now,
                    new.native,
                    f"unknown to the backend for {now - pilot.changed:.0f} s",
                )
            if new != pilot:
                changes.append(new)
        registry.put(changes)
        self.keeper.offer(changes)
        states, submitted = dict(target.live.states), dict(target.live.submitted)
        for job in [*ended, *(p.job_id for p in changes if p.terminal)]:
            del states[job], submitted[job]
        for pilot in changes:
            if not pilot.terminal:
                states[pilot.job_id] = pilot.state
        still = LiveStates(states, submitted)
        return _Poll(endpoint, len(target.ids), "ok", result.commands, len(changes), live=still)

    # --- waiting too long --------------------------------------------------------------------------

    def _keep_poll(self, poll: _Poll, now: float, settings: PilotSettings) -> None:
        if poll.outcome == "skipped":  # not due: the last poll is still the one kept
            return
        record = {
            "time": now,
            "outcome": poll.outcome,
            "pilots": poll.pilots,
            "changed": poll.changed,
        }
        try:
            self.runtime.state.set(
                LAST_POLL + poll.endpoint.key,
                json.dumps(record),
                ttl=settings.keep_finished,
            )
        except StateError as exc:
            logger.debug("last poll of {} not kept: {}", poll.endpoint.key, exc)

    def _cancel_old(
        self,
        registry: PilotRegistry,
        poll: _Poll,
        info: BackendInfo,
        settings: PilotSettings,
        now: float,
        it: Iteration | None = None,
    ) -> int:
        limit = settings.for_endpoint(poll.endpoint, "max_wait_time")
        if limit is None:
            return 0
        most = float(limit)
        submitted = poll.live.submitted
        ids = [
            job
            for job, state in poll.live.states.items()
            if state == "waiting" and now - submitted[job] > most
        ]
        if not ids:
            return 0
        rows = registry.get_many(poll.endpoint.backend, poll.endpoint.name, ids)
        old = [p for p in rows if p.state == "waiting"]  # the rows as they are now
        if not old:
            return 0
        timeout = self.runtime.timeout(info)
        reason = f"waited over max_wait_time ({float(limit):.0f} s); cancelled by gridgate"
        groups = self.group_credentials.of_backend(poll.endpoint.backend)
        names = (
            names_for(it.choice, poll.endpoint, info.credentials, groups)
            if it is not None and groups
            else None
        )
        done, problem = cancel_pilots(
            self.runtime, registry, poll.endpoint, old, timeout, reason, it, self.failures, names
        )
        if problem:
            logger.error("cancelling {} pilot(s) on {}: {}", len(old), poll.endpoint.key, problem)
        return len(done)

    def _prune(self, registry: PilotRegistry, settings: PilotSettings, now: float) -> int:
        keep = settings.keep_finished
        every = min(3600.0, keep / 10)
        if self._last_prune is not None and now - self._last_prune < every:
            return 0
        self._last_prune = now
        gone = registry.prune(before=now - keep)
        if gone:
            logger.info("forgot {} pilot(s) finished over {:.0f} s ago", gone, keep)
        return gone


def state_counts(counts: Counts) -> dict[str, dict[str, int]]:
    """``{"backend/endpoint": {state: n}}`` with every state present (0 when none)."""
    out: dict[str, dict[str, int]] = {}
    for (backend, endpoint, state), n in counts.items():
        out.setdefault(f"{backend}/{endpoint}", dict.fromkeys(PILOT_STATES, 0))[state] = n
    return dict(sorted(out.items()))
