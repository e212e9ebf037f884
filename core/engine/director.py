"""The submission director: builds the plugins from the config, re-reads it each iteration,
and runs the iterations (each one top to bottom in :mod:`gridgate.core.engine.iteration`); it tells
people through every notifier, each on its own."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import pluggy
from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.config import Config, ConfigError, ConfigProblem
from gridgate.core.engine.compose import printable_note
from gridgate.core.engine.config_checks import change_notification, submission_problems
from gridgate.core.engine.credential_episodes import CredentialEpisodes
from gridgate.core.engine.failure import FailurePath
from gridgate.core.engine.iteration import IterationRunner
from gridgate.core.engine.loader import build_plugin_manager, new_plugin_manager
from gridgate.core.engine.reload import ConfigSource
from gridgate.core.engine.resilient import DeferredState, ResilientState
from gridgate.core.engine.runtime import ACCOUNTING, EPISODES, FAILURES, Runtime
from gridgate.core.engine.section import DirectorSettings
from gridgate.core.engine.stall import StallWatch
from gridgate.core.engine.tracking import PilotTracker
from gridgate.core.failing import FailingCache
from gridgate.core.model import IterationInfo, IterationSummary, Notification
from gridgate.core.plugins import PluginContext
from gridgate.core.runner import orphan_guard
from gridgate.core.state import StateError, StateStore, open_state

#: open_state is gridgate.core.state's, kept importable from here for the commands that use it
__all__ = ["ACCOUNTING", "FAILURES", "ITERATIONS", "Director", "open_state", "summary_json"]

#: The state store's count of iterations run on it (by every director that shares it).
ITERATIONS = "director/iterations"
#: Under ``director.state_dir``: accounting rows the store did not take by the stop.
PENDING_RECORDS = "records-pending.json"


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
        first = source.current if isinstance(source, ConfigSource) else source
        settings = DirectorSettings.of_config(first)
        self._early_notes: list[Notification] = []
        self._reload_notes: list[Notification] = []  # accepted config changes, said at info
        #: notifications each notifier (by plugin name) failed to take since the start
        self.notify_failures: dict[str, int] = {}
        #: notifiers that failed and whose failure the others were told of (by plugin name)
        self._undelivering: dict[str, Exception] = {}
        self._delivered: set[str] = set()  # notifiers that took one since the last check
        self._notify_lock = threading.Lock()
        self._accounting_pruned = -math.inf  # when accounting rows were last pruned
        self._built = False  # whether the notifiers exist yet
        self.state = ResilientState(
            # Deferred: a store that cannot be opened at start (read-only file, Redis down)
            # is one notification and a local view, not a crash.
            state or DeferredState(lambda: _open_store(self._current(first), clock), clock),
            clock=clock,
            retry_every=settings.state_retry_seconds,
            on_change=self._state_changed,
            pending_path=Path(settings.state_dir) / PENDING_RECORDS,
        )
        #: what the iteration and its collaborators read; a config reload updates it in place
        self.runtime = Runtime(
            config=first,
            pm=new_plugin_manager(),  # until _build registers the configured plugins
            failing=_failing_cache(self.state, clock, settings),
            state=self.state,
            clock=clock,
            notify=self.notify,
            broadcast=self.broadcast,
            _parsed=(first, settings),
        )
        self._plugins: list[object] = []
        self.metrics: Any = None
        self.metrics_port: int | None = None
        if settings.metrics_port is not None and serve_metrics:
            self._start_metrics(settings.metrics_port)
        self._build()
        self.iteration = 0
        self.stop_event = threading.Event()
        #: Names this director in shared state (demand locks): host, pid and a random part.
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        where = (
            self.config.path.resolve() if self.config.path else "-"
        )  # the same file however named
        self.stall = StallWatch(self.state, clock, f"{socket.gethostname()}:{where}")
        #: the failure path every part of an iteration shares (gridgate.core.engine.iteration)
        self.failures = FailurePath(self.runtime)
        self.tracker = PilotTracker(
            self.runtime, self.failures, self.stall.limits_stuck, self.instance
        )
        self.failures.on_submitted = self.tracker.submitted
        if self.metrics is not None:  # the report's failures are the metrics' failures
            self.failures.on_failure_recorded = self.metrics.failure_recorded
        self.credentials = CredentialEpisodes(self.runtime, self.failures)
        self.runner = IterationRunner(
            self.runtime, self.failures, self.credentials, self.tracker, self.stall, self.instance
        )

    def _current(self, first: Config) -> Config:
        runtime: Runtime | None = getattr(self, "runtime", None)  # None while it is being built
        return first if runtime is None else runtime.config

    @property
    def config(self) -> Config:
        """The config in force (replaced when a changed file validates)."""
        return self.runtime.config

    @config.setter
    def config(self, config: Config) -> None:
        self.runtime.config = config

    @property
    def pm(self) -> pluggy.PluginManager:
        """The plugin manager of the plugins built from :attr:`config`."""
        return self.runtime.pm

    @property
    def failing(self) -> FailingCache:
        """The failing cache and episodes, with :attr:`config`'s expiries."""
        return self.runtime.failing

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
            logged=True,  # the store's line says it (core/engine/resilient.py)
        )
        if not self._built:  # the store failed while the notifiers were being built
            self._early_notes.append(note)
            return
        self.notify(note)

    def notify(self, note: Notification) -> None:
        """Give ``note`` to every notifier, each on its own (see :meth:`broadcast`), with the
        outside text it quotes escaped (:func:`~gridgate.core.engine.compose.printable_note`)."""
        note = printable_note(note)
        failed: dict[str, Exception] = {}
        self.broadcast("gridgate_notify", "notifier", note.subject, failed, notification=note)
        self._tell_others(note, failed)

    def _tell_others(self, note: Notification, failed: Mapping[str, Exception]) -> None:
        """Tell the notifiers that took ``note`` of each one that failed to (its folder on a
        full disk, its outbox unwritable), once per episode: the log already said it, and a
        site that reads only its mail must learn that some notifications go nowhere. The
        episode ends at the failed notifier's next success (logged at info)."""
        with self._notify_lock:
            for name in self._undelivering.keys() - failed.keys():
                if name in self._delivered:
                    del self._undelivering[name]
                    logger.info("notifier {} delivers again", name.split(":", 1)[-1])
            new = {n: e for n, e in failed.items() if n not in self._undelivering}
            self._undelivering.update(new)
            self._delivered.clear()
        for name, exc in new.items():
            short = name.split(":", 1)[-1]
            told = Notification(
                level="error",
                subject=f"notifier {short} cannot deliver notifications",
                body=(
                    f"The notifier {short} failed to take a notification "
                    f"({note.subject!r}): {type(exc).__name__}: {exc}\n\n"
                    "Until it takes one again, what it should deliver is only in the log and "
                    "in the other notifiers. This is said once; its recovery is logged.\n"
                ),
                created=self.clock.time(),
                key=f"notifier/{short}/undelivering/{self.clock.time():.0f}",
            )
            self.broadcast(
                "gridgate_notify",
                "notifier",
                told.subject,
                skip=set(self._undelivering),
                notification=printable_note(told),
            )

    def broadcast(
        self,
        hook_name: str,
        role: str,
        what: str = "",
        failed: dict[str, Exception] | None = None,
        *,
        skip: Collection[str] = (),
        **kwargs: Any,
    ) -> list[tuple[str, Any]]:
        """Call every implementation of the broadcast hook ``hook_name``, each on its own, and
        give back each one's answer that is not None as (plugin name, answer), in call order.
        ``failed`` gets the plugins that raised (by plugin name); those in ``skip`` are not
        called.

        pluggy calls a broadcast hook's implementations in one loop and stops at the first
        exception, so one broken plugin (a notifier whose folder is gone, a lifecycle or demand
        plugin with a bug) would silence the rest and end the iteration, or ``gridgate run``.
        Here a failing one is logged (its traceback once) and counted in ``notify_failures``
        (by plugin name), the others are still called, and the director goes on.
        """
        hook = getattr(self.pm.hook, hook_name)
        impls = hook.get_hookimpls()
        answers: list[tuple[str, Any]] = []
        if any(i.hookwrapper or i.wrapper for i in impls):
            # a wrapper must wrap the whole call: pluggy's own loop, guarded as a whole
            try:
                result = hook(**kwargs)
            except Exception as exc:
                logger.opt(exception=exc).error("{} hook {} failed: {}", role, hook_name, exc)
                return answers
            return [("", r) for r in result or () if r is not None]
        for impl in reversed(impls):  # pluggy's own order: last registered and tryfirst first
            if impl.plugin_name in skip:
                continue
            try:
                answer = impl.function(**{k: v for k, v in kwargs.items() if k in impl.argnames})
                if answer is not None:
                    answers.append((impl.plugin_name, answer))
                if failed is not None:
                    with self._notify_lock:
                        self._delivered.add(impl.plugin_name)
            except Exception as exc:
                if failed is not None:
                    failed[impl.plugin_name] = exc
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
        return answers

    def _start_metrics(self, port: int) -> None:
        try:
            from gridgate.core.engine.metrics import DirectorMetrics
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
        try:
            failing = self.failing.failing_episodes()
        except StateError as exc:
            logger.debug("failing cache not read for the metrics: {}", exc)
            failing = {}
        return {"caches": caches, "outbox": outbox, "failing": failing}

    def _build(self) -> None:
        settings = self.runtime.settings
        failing = _failing_cache(self.state, self.clock, settings)
        context = PluginContext(
            clock=self.clock,
            state=self.state,
            state_dir=Path(settings.state_dir),
            config=self.config.data,
            config_path=self.config.path,
            failing=failing,
        )
        pm, plugins = build_plugin_manager(self.config.data, context, self.extra_plugins)
        old = self._plugins
        self.runtime.pm, self.runtime.failing, self._plugins = pm, failing, plugins
        self._built = True
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
        self.runner.share.stop()  # hands its demand groups back to the other directors
        # the store first: its last try may find it back, and the notifiers still say so
        if self._own_state:
            self.state.close()
        for plugin in self._plugins:
            _close(plugin)
        self._plugins = []
        if self.metrics is not None:
            self.metrics.close()

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
            pause = self.runtime.settings.cycle_seconds - (time.monotonic() - started)
            if pause > 0:
                self.stop_event.wait(pause)

    def stop(self) -> None:
        """Finish the commands in flight (each is killed at its deadline) and stop."""
        self.stop_event.set()

    def run_iteration(self) -> IterationSummary:
        """Re-read the config, then run one iteration (:class:`IterationRunner`)."""
        refusal = self._reload()
        self.iteration = self._next_number()
        info = IterationInfo(number=self.iteration, started=self.clock.time())
        sent: list[Notification] = []
        if refusal is not None:
            config_note = Notification(
                level="error",
                subject=f"gridgate: config {self.source.path} refused, previous settings kept",
                body=refusal,
                created=info.started,
                key=f"config/{info.started:.0f}",
                logged=True,
            )
            logger.error("config refused, the last good config stays in force:\n{}", refusal)
            self.notify(config_note)
            sent.append(config_note)
        unsent, self._reload_notes = self._reload_notes, []
        summary = self.runner.run(info, sent, unsent, config_error=refusal)
        self._prune_accounting()
        self.broadcast(
            "gridgate_iteration_finished", "plugin", "iteration finished", summary=summary
        )
        return summary

    def _next_number(self) -> int:
        """The next iteration's number, counted in the state store (:data:`ITERATIONS`): a
        ``gridgate run --once`` from cron counts on from the last run, and directors sharing
        a store each get their own numbers. A store that cannot count (a value that is not
        a count under the key) leaves the number counted in this process, said in the log."""
        try:
            return self.state.increment(ITERATIONS)
        except (StateError, ValueError) as exc:
            logger.error("iteration numbered in this process only: {}", exc)
            return self.iteration + 1

    def _prune_accounting(self) -> None:
        """Drop accounting and failure rows older than ``keep_accounting``, at most once an hour
        (or a tenth of the retention, when that is shorter): Redis holds them in memory."""
        keep = self.runtime.settings.keep_accounting
        now = self.clock.time()
        if now - self._accounting_pruned < min(3600.0, keep / 10):
            return
        self._accounting_pruned = now
        try:
            dropped = self.state.prune_records(ACCOUNTING, before=now - keep)
            dropped += self.state.prune_records(FAILURES, before=now - keep)
            dropped += self.state.prune_records(EPISODES, before=now - keep)
        except StateError as exc:
            logger.warning("accounting rows not pruned this time: {}", exc)
            return
        if dropped:
            logger.info("pruned {} accounting rows older than {:.0f} s", dropped, keep)


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
        "failures": [failure.as_dict() for failure in summary.failures],
        "excluded": [key.split("/", 1)[1] for key in summary.excluded],
        **{outcome: counts.get(outcome, 0) for outcome in ("skipped", "refused", "no_match")},
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
        "retries": [retry.as_dict() for retry in summary.retries],
        "pilots": summary.pilots.as_dict() if summary.pilots is not None else {},
        "credentials": [status.as_dict() for status in summary.credentials],
        "credential_users": {k: list(v) for k, v in summary.credential_users.items()},
        "unavailable": {key: state.as_dict() for key, state in summary.unavailable.items()},
        "demand": [dataclasses.asdict(figure) for figure in summary.demand],
    }
    return json.dumps(doc, sort_keys=False)


def _open_store(config: Config, clock: Clock) -> StateStore:
    """The configured store, opened; a driver that can tell it keeps nothing across a restart
    (``persistence_problem``: a Redis with neither AOF nor RDB) says so, once, as a warning."""
    store = open_state(config, clock)
    check = getattr(store, "persistence_problem", None)
    if callable(check):
        problem = check()
        if problem:
            logger.warning(problem)
    return store


def _failing_cache(state: StateStore, clock: Clock, settings: DirectorSettings) -> FailingCache:
    """The failing cache with the expiries of ``settings``."""
    return FailingCache(state, clock, settings.failing_expiry, settings.ticket_expiry)


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
