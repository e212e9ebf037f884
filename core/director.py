"""The submission director: each iteration re-reads its config, asks for demand, submits in
parallel to randomly chosen servers, and turns failures into exclusions and messages."""

from __future__ import annotations

import getpass
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pluggy
from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.compose import (
    CREDENTIAL,
    compose_credential,
    compose_failure,
    compose_local_fault,
)
from gridgate.core.config import Config, ConfigError, ConfigProblem, ConfigSource
from gridgate.core.config_checks import change_notification, submission_problems
from gridgate.core.contract import checked_submit, list_matches, no_list_match
from gridgate.core.failing import FailingCache
from gridgate.core.model import (
    AccountingRecord,
    AdmissionRequest,
    BackendInfo,
    CredentialRegistry,
    CredentialStatus,
    DemandRegistry,
    Endpoint,
    Failure,
    Grant,
    IterationInfo,
    IterationSummary,
    Notification,
    Outcome,
    Refusal,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import STATE_GROUP, PluginContext, build_plugin_manager, load_class
from gridgate.core.resilient import DeferredState, ResilientState
from gridgate.core.retry import RetryPolicy, retry_entry
from gridgate.core.runner import orphan_guard
from gridgate.core.stall import StallWatch
from gridgate.core.state import StateError, StateStore
from gridgate.core.tracking import PilotTracker

ACCOUNTING = "accounting"


def open_state(config: Config | Mapping[str, Any], clock: Clock = SYSTEM_CLOCK) -> StateStore:
    """Instantiate the state driver the config names (``state.driver``)."""
    section = dict(config.get("state") or {"driver": "sqlite"})
    driver = section.pop("driver", "sqlite")
    cls = load_class(STATE_GROUP, driver)
    return cls(section, clock=clock)


@dataclass
class _Iteration:
    """Mutable bookkeeping shared by the submission threads of one iteration."""

    info: IterationInfo
    failing: set[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    excluded: list[str] = field(default_factory=list)
    records: list[AccountingRecord] = field(default_factory=list)
    notifications: list[Notification] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: backends whose commands cannot run on this machine: paused for the rest of the iteration
    local_faults: set[str] = field(default_factory=set)
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(0, 0.0))
    retries: list[dict[str, Any]] = field(default_factory=list)
    #: room under max_waiting / max_total (gridgate.core.tracking.Limits), None when not tracking
    limits: Any = None
    #: what the pilot tracker did this iteration, for the summary
    pilots: dict[str, Any] = field(default_factory=dict)
    #: what each credential plugin reported before anything was polled or submitted
    credentials: tuple[CredentialStatus, ...] = ()
    #: credential kinds whose configured credential is unusable this iteration
    unusable: dict[str, CredentialStatus] = field(default_factory=dict)
    #: why the credential check itself failed (a plugin raised): nothing needing one submits
    credential_crash: str = ""

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
        with self.lock:
            if endpoint.key not in self.excluded:
                self.excluded.append(endpoint.key)

    def usable(self, endpoints: Iterable[Endpoint]) -> list[Endpoint]:
        with self.lock:
            gone = set(self.excluded) | self.failing
        return [e for e in endpoints if e.key not in gone]


class Director:
    """Runs iterations. Give it a :class:`ConfigSource` (re-read each iteration) or a fixed
    :class:`Config`. ``extra_plugins`` are registered after the configured ones (tests).
    ``serve_metrics=False`` leaves ``metrics_port`` alone, for a command that builds the
    plugins beside a running director (which holds that port)."""

    def __init__(
        self,
        source: ConfigSource | Config,
        *,
        clock: Clock = SYSTEM_CLOCK,
        extra_plugins: Iterable[object] = (),
        state: StateStore | None = None,
        serve_metrics: bool = True,
    ) -> None:
        self.source = source
        self.clock = clock
        self.extra_plugins = list(extra_plugins)
        self._own_state = state is None
        self.config = source.current if isinstance(source, ConfigSource) else source
        self._early_notes: list[Notification] = []
        self._reload_notes: list[Notification] = []  # accepted config changes, said at info
        #: notifications each notifier (by plugin name) failed to take since the start
        self.notify_failures: dict[str, int] = {}
        self._notify_lock = threading.Lock()
        self._accounting_pruned = -math.inf  # when accounting rows were last pruned
        self.state = ResilientState(
            # Deferred: a store that cannot be opened at start (read-only file, Redis down)
            # is one notification and a local view, not a crash.
            state or DeferredState(lambda: open_state(self.config, clock), clock),
            clock=clock,
            retry_every=float(self.config.director["state_retry_seconds"]),
            on_change=self._state_changed,
        )
        self.failing = FailingCache.from_config(self.state, clock, self.config.director)
        self.pm: pluggy.PluginManager
        self._plugins: list[object] = []
        self.metrics: Any = None
        self.metrics_port: int | None = None
        port = self.config.director.get("metrics_port")
        if port is not None and serve_metrics:
            self._start_metrics(int(port))
        self._build()
        self.tracker = PilotTracker(self)
        self.iteration = 0
        self.stop_event = threading.Event()
        #: Names this director in shared state (demand locks): host, pid and a random part.
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        where = (
            self.config.path.resolve() if self.config.path else "-"
        )  # the same file however named
        self.stall = StallWatch(self.state, clock, f"{socket.gethostname()}:{where}")

    # --- plugins and config --------------------------------------------------------------

    def _state_changed(self, degraded: bool, reason: str) -> None:
        """Tell people once when the state store fails, and once when it is back."""
        subject = (
            "gridgate: state store unavailable, running on a local view"
            if degraded
            else "gridgate: state store available again"
        )
        body = (
            (
                reason + "\n\nUntil it returns, failing-cache and escalation state is kept in this "
                "process only and accounting rows are held in memory.\n"
            )
            if degraded
            else reason + "\n"
        )
        note = Notification(
            level="error" if degraded else "info",
            subject=subject,
            body=body,
            created=self.clock.time(),
            key=f"state/{degraded}/{self.clock.time():.0f}",
        )
        if not hasattr(self, "pm"):  # the store failed while the notifiers were being built
            self._early_notes.append(note)
            return
        self.notify(note)

    def notify(self, note: Notification) -> None:
        """Give ``note`` to every notifier, each on its own (see :meth:`broadcast`)."""
        self.broadcast("gridgate_notify", "notifier", note.subject, notification=note)

    def broadcast(self, hook_name: str, role: str, what: str = "", **kwargs: Any) -> None:
        """Call every implementation of the broadcast hook ``hook_name``, each on its own.

        pluggy calls a broadcast hook's implementations in one loop and stops at the first
        exception, so one broken plugin (a notifier whose folder is gone, a lifecycle or demand
        plugin with a bug) would silence the rest and end the iteration, or ``gridgate run``.
        Here a failing one is logged (its traceback once) and counted in ``notify_failures``
        (by plugin name), the others are still called, and the director goes on.
        """
        hook = getattr(self.pm.hook, hook_name)
        impls = hook.get_hookimpls()
        if any(i.hookwrapper or i.wrapper for i in impls):
            # a wrapper must wrap the whole call: pluggy's own loop, guarded as a whole
            try:
                hook(**kwargs)
            except Exception as exc:
                logger.opt(exception=exc).error("{} hook {} failed: {}", role, hook_name, exc)
            return
        for impl in reversed(impls):  # pluggy's own order: last registered and tryfirst first
            try:
                impl.function(**{k: v for k, v in kwargs.items() if k in impl.argnames})
            except Exception as exc:
                with self._notify_lock:
                    count = self.notify_failures[impl.plugin_name] = (
                        self.notify_failures.get(impl.plugin_name, 0) + 1
                    )
                # the traceback once (a plugin bug needs it), then one line per call
                (logger.opt(exception=exc) if count == 1 else logger).error(
                    "{} {} failed ({} time{} so far), the others were still told: {}{}: {}",
                    role,
                    impl.plugin_name.split(":", 1)[-1],
                    count,
                    "" if count == 1 else "s",
                    f"{what}: " if what else "",
                    type(exc).__name__,
                    exc,
                )

    def _start_metrics(self, port: int) -> None:
        try:
            from gridgate.core.metrics import DirectorMetrics
        except ImportError as exc:
            raise RuntimeError(
                "director.metrics_port needs prometheus_client: pip install 'gridgate[metrics]'"
            ) from exc
        self.metrics = DirectorMetrics(self._gauges)
        self.metrics_port = self.metrics.serve(port)
        self.extra_plugins.append(self.metrics)
        logger.info("metrics on http://127.0.0.1:{}/metrics", self.metrics_port)

    def _gauges(self) -> dict[str, Any]:
        caches = self.failing.counts()
        outbox: dict[str, int] = {}
        for name, plugin in self.pm.list_name_plugin():
            pending = getattr(getattr(plugin, "outbox", None), "pending", None)
            if callable(pending):
                outbox[name.split(":", 1)[-1]] = len(pending())
        return {"caches": caches, "outbox": outbox}

    def _build(self) -> None:
        director = self.config.director
        #: the failing cache and episodes, with this config's expiries (rebuilt with it)
        self.failing = FailingCache.from_config(self.state, self.clock, director)
        context = PluginContext(
            clock=self.clock,
            state=self.state,
            state_dir=Path(director["state_dir"]),
            config=self.config.data,
            config_path=self.config.path,
            failing=self.failing,
        )
        pm, plugins = build_plugin_manager(self.config.data, context, self.extra_plugins)
        old = self._plugins
        self.pm, self._plugins = pm, plugins
        #: the context the configured plugins were built with (rebuilt with them at a config
        #: change); an in-process plugin given as ``extra_plugins`` may use it too
        self.context = context
        for plugin in old:
            _close(plugin)
        while self._early_notes:
            self.notify(self._early_notes.pop(0))

    def _reload(self) -> str | None:
        """Re-read the config; rebuild plugins if it changed. Returns a refusal, if any."""
        if not isinstance(self.source, ConfigSource):
            return None
        outcome = self.source.reload(vet=lambda new: submission_problems(new, self._answers))
        if outcome.changed:
            self.config = self.source.current
            self._build()
            assert outcome.previous is not None
            self._reload_notes.append(
                change_notification(outcome.previous, self.config, self.clock.time())
            )
        if self.metrics is not None and (outcome.changed or outcome.error is not None):
            self.metrics.config_reloaded(refused=outcome.error is not None)
        if outcome.error is not None:
            return _refusal_text(outcome.error)
        return None

    def _answers(self, backend: str) -> bool:
        """Whether a plugin given in-process (not through the config) submits to ``backend``."""
        for plugin in self.extra_plugins:
            info = getattr(plugin, "gridgate_backend_info", None)
            if callable(info) and info(backend=backend) is not None:
                return True
        return False

    def nothing_to_submit(self) -> list[ConfigProblem]:
        """Why the current config would submit nothing (empty when it would, or is paused)."""
        return submission_problems(self.config, self._answers)

    def close(self) -> None:
        for plugin in self._plugins:
            _close(plugin)
        self._plugins = []
        if self.metrics is not None:
            self.metrics.close()
        if self._own_state:
            self.state.close()

    # --- the loop ---------------------------------------------------------------------------

    def run(
        self,
        iterations: int | None = None,
        on_iteration: Callable[[IterationSummary], None] | None = None,
    ) -> None:
        """Iterate until ``iterations`` are done or :meth:`stop` is called.

        Commands in flight die with the director even when it is SIGKILLed (the runner's
        orphan guard is armed while this runs).
        """
        with orphan_guard():
            self._loop(iterations, on_iteration)

    def _loop(
        self,
        iterations: int | None,
        on_iteration: Callable[[IterationSummary], None] | None,
    ) -> None:
        done = 0
        while not self.stop_event.is_set():
            started = time.monotonic()
            summary = self.run_iteration()
            if on_iteration is not None:
                on_iteration(summary)
            done += 1
            if iterations is not None and done >= iterations:
                break
            pause = float(self.config.director["cycle_seconds"]) - (time.monotonic() - started)
            if pause > 0:
                self.stop_event.wait(pause)

    def stop(self) -> None:
        """Finish the commands in flight (each is killed at its deadline) and stop."""
        self.stop_event.set()

    def run_iteration(self) -> IterationSummary:
        refusal = self._reload()
        self.iteration += 1
        info = IterationInfo(number=self.iteration, started=self.clock.time())
        started = time.monotonic()
        config_note: Notification | None = None
        if refusal is not None:
            config_note = Notification(
                level="error",
                subject=f"gridgate: config {self.source.path} refused, previous settings kept",  # type: ignore[union-attr]
                body=refusal,
                created=info.started,
                key=f"config/{info.started:.0f}",
            )
            logger.error("config refused, the last good config stays in force:\n{}", refusal)
            self.notify(config_note)
        self.broadcast("gridgate_iteration_started", "plugin", "iteration started", iteration=info)
        demand = DemandRegistry()
        if not self.config.director["paused"]:  # paused on purpose: no demand, no stall
            self.broadcast(
                "gridgate_demand", "demand plugin", "demand", iteration=info, demand=demand
            )
        try:
            failing = self.failing.excluded()
        except StateError as exc:
            logger.error("state store unreadable, failing cache ignored this iteration: {}", exc)
            failing = set()
        it = _Iteration(
            info=info,
            failing=failing,
            retry=RetryPolicy.for_iteration(self.config.director, info.started),
        )
        if config_note is not None:
            it.notifications.append(config_note)
        while self._reload_notes:
            it.notifications.append(self._reload_notes.pop(0))
            self.notify(it.notifications[-1])
        self._check_credentials(it, demand)  # before any command could use one
        demand = self.tracker.prepare(demand, it)  # poll pilots, cancel, trim to the limits
        jobs = self._plan(demand, it)
        threads = int(self.config.director["max_threads"])
        if jobs:
            with ThreadPoolExecutor(
                max_workers=min(threads, len(jobs)), thread_name_prefix="submit"
            ) as pool:
                for future in [
                    pool.submit(self._submit_one, backend, request, it) for backend, request in jobs
                ]:
                    future.result()
        # a credential episode says everything itself (error, alarm, works again): not twice
        watched = [r for r in it.records if r.failure_kind != "credential"]
        for note in self.stall.observe(info, watched, self.config.director):
            it.notifications.append(note)
            self.notify(note)
        summary = IterationSummary(
            number=info.number,
            started=info.started,
            duration=time.monotonic() - started,
            records=tuple(it.records),
            excluded=tuple(it.excluded),
            notifications=tuple(it.notifications),
            failures=tuple(it.failures),
            config_error=refusal,
            retries=tuple(it.retries),
            pilots=it.pilots,
            credentials=it.credentials,
        )
        self._prune_accounting()
        self.broadcast(
            "gridgate_iteration_finished", "plugin", "iteration finished", summary=summary
        )
        return summary

    def _prune_accounting(self) -> None:
        """Drop accounting rows older than ``keep_accounting``, at most once an hour (or a
        tenth of the retention, when that is shorter): Redis holds them in memory."""
        keep = float(self.config.director["keep_accounting"])
        now = self.clock.time()
        if now - self._accounting_pruned < min(3600.0, keep / 10):
            return
        self._accounting_pruned = now
        try:
            dropped = self.state.prune_records(ACCOUNTING, before=now - keep)
        except StateError as exc:
            logger.warning("accounting rows not pruned this time: {}", exc)
            return
        if dropped:
            logger.info("pruned {} accounting rows older than {:.0f} s", dropped, keep)

    def _plan(
        self, demand: DemandRegistry, it: _Iteration
    ) -> list[tuple[BackendInfo, SubmitRequest]]:
        """Split demand into submissions of the backend's bulk size."""
        jobs: list[tuple[BackendInfo, SubmitRequest]] = []
        infos: dict[str, BackendInfo | None] = {}
        claims: dict[tuple[str, str], bool] = {}
        user = self.config.director.get("user") or _current_user()
        for request in demand.requests:
            if request.backend not in infos:
                infos[request.backend] = self.pm.hook.gridgate_backend_info(backend=request.backend)
                if infos[request.backend] is None:
                    logger.error(
                        "demand names backend {!r}, which is not configured", request.backend
                    )
            info = infos[request.backend]
            if info is None:
                self._account(
                    it, request, None, "skipped", request.count, failure_kind="no_backend"
                )
                continue
            blocked = it.credential_block(info)
            if blocked:  # before the demand lock: a director with a usable credential takes it over
                self._account(it, request, None, "skipped", request.count, failure_kind=blocked)
                continue
            if self.config.director["demand_lock"] and not self._claim(request, claims):
                self._account(
                    it, request, None, "skipped", request.count, failure_kind="claimed_elsewhere"
                )
                continue
            size = max(1, info.pilots_per_submission)
            list_match = info.list_match if request.list_match is None else request.list_match
            backend_plugin = self.pm.get_plugin(f"backends:{request.backend}")
            if list_match and backend_plugin is not None and not list_matches(backend_plugin):
                logger.error(
                    "demand group {}/{}: {}",
                    request.backend,
                    request.group,
                    no_list_match(request.backend),
                )
                self._account(it, request, None, "skipped", request.count, failure_kind="config")
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
            ttl = 1.5 * float(self.config.director["cycle_seconds"])
            try:
                mine = self.state.add_if_absent(key, self.instance, ttl=ttl)
                if not mine and self.state.get(key) == self.instance:
                    self.state.set(key, self.instance, ttl=ttl)
                    mine = True
            except StateError as exc:  # no shared view: filling twice beats filling never
                logger.error("demand lock unavailable, filling {}/{} anyway: {}", *group, exc)
                mine = True
            claims[group] = mine
        return claims[group]

    # --- credentials -------------------------------------------------------------------------

    def _check_credentials(self, it: _Iteration, demand: DemandRegistry) -> None:
        """Ask every credential plugin to check (and renew) its credential, pause the backends
        that need one that is unusable, and tell people about the episodes."""
        registry = CredentialRegistry()
        try:
            self.pm.hook.gridgate_check_credentials(
                iteration=it.info,
                timeout=float(self.config.director["command_timeout"]),
                credentials=registry,
            )
        except Exception as exc:  # a plugin bug: no credential is vouched for
            logger.opt(exception=exc).error(
                "the credential check crashed in a plugin: backends that "
                "need a credential submit nothing this iteration"
            )
            it.credential_crash = f"{type(exc).__name__}: {exc}"
        it.credentials = registry.statuses
        first: dict[str, CredentialStatus] = {}
        for (
            status
        ) in it.credentials:  # the first of a kind (config order) is what credential_env hands out
            first.setdefault(status.kind, status)
        it.unusable = {kind: status for kind, status in first.items() if not status.usable}
        infos: dict[str, BackendInfo] = {}
        if it.unusable or it.credential_crash or any(s.at_risk for s in it.credentials):
            infos = self._known_backends(demand)
        for info in infos.values():
            if it.credential_block(info):
                with it.lock:
                    it.local_faults.add(info.backend)  # nothing submitted, its pilots not polled
        for kind, status in it.unusable.items():
            logger.error(
                "{}: backends that need it submit nothing this iteration ({})",
                status.message,
                ", ".join(_needing(infos, kind)) or "none configured needs it",
            )
        for status in first.values():
            try:
                self._credential_episode(status, it, _needing(infos, status.kind))
            except StateError as exc:
                logger.error(
                    "credential episode of {} not recorded, state store failed: {}",
                    status.name,
                    exc,
                )

    def _known_backends(self, demand: DemandRegistry) -> dict[str, BackendInfo]:
        """The configured backends and those the demand asks for, with what they say of themselves."""
        names = dict.fromkeys(
            [*(self.config.get("backends") or {}), *(r.backend for r in demand.requests)]
        )
        infos = {name: self.pm.hook.gridgate_backend_info(backend=name) for name in names}
        return {name: info for name, info in infos.items() if info is not None}

    def _credential_episode(
        self, status: CredentialStatus, it: _Iteration, backends: list[str]
    ) -> None:
        """One error when a credential becomes unusable (of all the directors on this store), an
        alarm once the episode lasts ``ticket_expiry`` (again every ``failing_expiry``), one
        notice when it works again; an at-risk warning once per credential end time."""
        state, now = self.state, self.clock.time()
        failing_expiry = float(self.config.director["failing_expiry"])
        ticket_expiry = float(self.config.director["ticket_expiry"])
        window = failing_expiry + ticket_expiry
        scope = f"{status.name}:{status.path}"
        episode_key = f"{CREDENTIAL}episode/{scope}"
        host = socket.gethostname()
        notes: list[Notification] = []
        if not status.usable:
            episode = json.dumps({"since": now, "backends": backends})
            opened = state.add_if_absent(episode_key, episode, ttl=window)
            since = now
            if not opened:
                episode = state.get(episode_key) or episode
                since = float(_json_field(episode, "since", now))
                state.set(episode_key, episode, ttl=window)
            # while any host finds it unusable the episode stays open (expires if that host stops)
            state.set(f"{CREDENTIAL}bad/{scope}/{host}", f"{now:.3f}", ttl=failing_expiry)
            if opened:
                notes.append(
                    compose_credential(
                        status, "error", since, now, backends, ticket_expiry, failing_expiry, host
                    )
                )
            lasted = now - since
            if lasted >= ticket_expiry:
                repeat = int((lasted - ticket_expiry) // failing_expiry)
                if state.add_if_absent(
                    f"{CREDENTIAL}note/{scope}/{since:.3f}/alarm/{repeat}", "1", ttl=window
                ):
                    notes.append(
                        compose_credential(
                            status,
                            "alarm",
                            since,
                            now,
                            backends,
                            ticket_expiry,
                            failing_expiry,
                            host,
                        )
                    )
        else:
            state.delete(f"{CREDENTIAL}bad/{scope}/{host}")
            raw = state.get(episode_key)
            if raw is not None and not state.items(f"{CREDENTIAL}bad/{scope}/"):
                since = float(_json_field(raw, "since", now))
                if state.add_if_absent(
                    f"{CREDENTIAL}note/{scope}/{since:.3f}/resolved", "1", ttl=window
                ):
                    state.delete(episode_key)
                    paused = [str(b) for b in _json_field(raw, "backends", []) or []]
                    notes.append(
                        compose_credential(
                            status,
                            "info",
                            since,
                            now,
                            backends or paused,
                            ticket_expiry,
                            failing_expiry,
                            host,
                        )
                    )
            if status.at_risk and status.expires is not None:
                key = f"{CREDENTIAL}warning/{scope}/{status.expires:.0f}"
                if state.add_if_absent(
                    key, f"{now:.3f}", ttl=max(0.0, status.expires - now) + window
                ):
                    notes.append(
                        compose_credential(
                            status,
                            "warning",
                            now,
                            now,
                            backends,
                            ticket_expiry,
                            failing_expiry,
                            host,
                        )
                    )
        for note in notes:
            with it.lock:
                it.notifications.append(note)
            self.notify(note)

    # --- one submission ---------------------------------------------------------------------

    def _submit_one(self, info: BackendInfo, request: SubmitRequest, it: _Iteration) -> None:
        # a bulk submission shortened to the room of the server it went to leaves the rest,
        # which is submitted in turn (to a server with room, or skipped as trimmed)
        rest = [request]
        while rest:
            self._submit_whole(info, rest.pop(), it, rest)

    def _submit_whole(
        self, info: BackendInfo, request: SubmitRequest, it: _Iteration, rest: list[SubmitRequest]
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
                self._account(
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
        it: _Iteration,
        tried: list[Endpoint],
        attempt: int,
        failure: Failure,
    ) -> bool:
        others = [e for e in it.usable(info.endpoints) if e not in tried]
        outcome = it.retry.decide(
            failure, attempt, self.clock.time(), self._timeout(info), len(others)
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

    def _timeout(self, info: BackendInfo) -> float:
        return float(info.command_timeout or self.config.director["command_timeout"])

    def _attempt(
        self,
        info: BackendInfo,
        request: SubmitRequest,
        it: _Iteration,
        started: float,
        tried: list[Endpoint],
        attempt: int,
        rest: list[SubmitRequest],
    ) -> Failure | None:
        """One attempt; the failure when it failed (the caller may send it elsewhere). When the
        server has room for only part of a bulk request, this attempt sends that part and the
        remainder goes to ``rest``."""
        hook = self.pm.hook
        with it.lock:
            paused = info.backend in it.local_faults
        if paused:  # its command cannot start here: trying every server would only repeat that
            self._account(
                it,
                request,
                None,
                "skipped",
                request.count,
                failure_kind="local_fault",
                attempt=attempt,
            )
            return None
        candidates = [e for e in it.usable(info.endpoints) if e not in tried]
        if not candidates:
            self._account(
                it,
                request,
                None,
                "skipped",
                request.count,
                failure_kind="no_endpoint",
                attempt=attempt,
            )
            return None
        endpoint: Endpoint | None = None
        while candidates:
            if it.limits is not None:
                candidates = it.limits.with_room(candidates)
                if not candidates:
                    break
            endpoint = (
                hook.gridgate_select_endpoint(candidates=candidates, request=request)
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
            self._account(
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
            self._account(
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
        timeout = self._timeout(info)
        try:
            result = self._commands(endpoint, request, timeout)
        finally:
            # the token goes back as soon as the server is no longer being talked to
            if grant is not None:
                hook.gridgate_release(grant=grant)
        duration = time.monotonic() - started
        if result is None:
            self._account(
                it, request, endpoint, "no_match", request.count, duration=duration, attempt=attempt
            )
        elif result.ok:
            self._account(
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

    def _commands(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        """List-match (when asked) and submit; None when nothing matches on this server."""
        hook = self.pm.hook
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
        it: _Iteration,
        duration: float,
        attempt: int = 1,
    ) -> Failure:
        failure = self._server_failed(endpoint, result, it)
        self._account(
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

    def _server_failed(
        self,
        endpoint: Endpoint,
        result: SubmitResult,
        it: _Iteration,
        failure: Failure | None = None,
    ) -> Failure:
        """A failure of ``endpoint`` (a submission, a status query, aborting pilots):
        classified unless ``failure`` is given, then excluded, escalated and told."""
        hook = self.pm.hook
        if failure is None:
            failure = hook.gridgate_classify_failure(endpoint=endpoint, result=result) or Failure(
                kind="error"
            )
        override = self.config.director.get("notify_kinds", {}).get(failure.kind)
        if override is not None:
            failure = replace(failure, notify=override)
        command = result.command
        with it.lock:
            it.failures.append(
                {
                    "backend": endpoint.backend,
                    "endpoint": endpoint.name,
                    "kind": failure.kind,
                    "returncode": command.returncode if command else None,
                    "timed_out": bool(command and command.timed_out),
                    "command": list(command.argv) if command else [],
                    "operation": result.operation,
                }
            )
        if failure.local:
            self._local_fault(endpoint, failure, result, it)
        elif failure.exclude:
            it.exclude(endpoint)
            episode = self.failing.enter(endpoint, failure.kind)  # whichever plugin escalates
            escalation = hook.gridgate_escalate(
                endpoint=endpoint, failure=failure, result=result, episode=episode
            )
            if escalation is not None and escalation.level is not None:
                note = compose_failure(endpoint, failure, escalation, result, self.clock.time())
                with it.lock:
                    it.notifications.append(note)
                self.notify(note)
        return failure

    def _local_fault(
        self, endpoint: Endpoint, failure: Failure, result: SubmitResult, it: _Iteration
    ) -> None:
        """A command that cannot start on this machine: pause the backend, blame no server,
        and say so once per failing-cache period (the same rhythm as a failing server)."""
        with it.lock:
            it.local_faults.add(endpoint.backend)
        if not failure.notify:
            return
        now = self.clock.time()
        repeat_every = float(self.config.director["failing_expiry"])
        try:
            first = self.failing.local_fault(endpoint.backend, failure.kind)
        except StateError:  # no shared view: a repeated mail beats a silent outage
            first = True
        if not first:
            return
        note = compose_local_fault(endpoint, failure, result, now, repeat_every)
        with it.lock:
            it.notifications.append(note)
        self.notify(note)

    def _account(
        self,
        it: _Iteration,
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
        record = AccountingRecord(
            time=self.clock.time(),
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
            self.state.append_record(ACCOUNTING, record.as_dict())
        except StateError as exc:
            logger.error("accounting row lost, state store failed: {}", exc)
        if outcome == "submitted":
            self.tracker.submitted(record)
        self.broadcast(
            "gridgate_submission_finished", "plugin", "submission finished", record=record
        )


def summary_json(summary: IterationSummary) -> str:
    """The one-line JSON document ``gridgate run --json`` prints per iteration."""
    submitted = [
        {
            "backend": r.backend,
            "endpoint": r.endpoint,
            "job_ids": list(r.job_ids),
            "group": r.group,
            "pilots": r.pilots,
        }
        for r in summary.records
        if r.outcome == "submitted"
    ]
    counts: dict[str, int] = {}
    for record in summary.records:
        counts[record.outcome] = counts.get(record.outcome, 0) + 1
    doc = {
        "iteration": summary.number,
        "started": summary.started,
        "duration_s": round(summary.duration, 3),
        "submitted": submitted,
        "failures": list(summary.failures),
        "excluded": [key.split("/", 1)[1] for key in summary.excluded],
        "skipped": counts.get("skipped", 0),
        "refused": counts.get("refused", 0),
        "no_match": counts.get("no_match", 0),
        "pilots_submitted": sum(r.pilots for r in summary.records if r.outcome == "submitted"),
        "notifications": [
            {
                "level": n.level,
                "endpoint": n.endpoint.name if n.endpoint else None,
                "subject": n.subject,
            }
            for n in summary.notifications
        ],
        "config_error": summary.config_error,
        "retries": list(summary.retries),
        "pilots": dict(summary.pilots),
        "credentials": [status.as_dict() for status in summary.credentials],
    }
    return json.dumps(doc, sort_keys=False)


def _needing(infos: Mapping[str, BackendInfo], kind: str) -> list[str]:
    return sorted(name for name, info in infos.items() if kind in info.credentials)


def _json_field(raw: str | None, name: str, default: Any) -> Any:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return default
    return value.get(name, default) if isinstance(value, dict) else default


def _refusal_text(error: ConfigError) -> str:
    return (
        "The config file no longer validates; the last good config stays in force.\n\n"
        + str(error)
        + "\n"
    )


def _close(plugin: object) -> None:
    close = getattr(plugin, "close", None)
    if callable(close):
        try:
            close()
        except Exception as exc:  # closing one plugin must not leave the others open
            logger.opt(exception=exc).warning("closing plugin {} failed", type(plugin).__name__)


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
