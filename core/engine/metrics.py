"""Prometheus metrics of the director, served on ``director.metrics_port``.

A plugin like any other: it listens to the lifecycle hooks and counts. It has its own
registry, so two directors in one process (tests) never share series.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gridgate.core import hookimpl
from gridgate.core.metrics import serve_registry, stop_server
from gridgate.core.model import AccountingRecord, IterationSummary, Notification, PilotReport

DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class DirectorMetrics:
    """Counters and gauges of the director; ``serve(port)`` exposes them over HTTP.

    ``gauges_source`` is called at the end of each iteration and returns the sizes that
    are read rather than counted: cache entries, outbox depth per notifier.
    """

    def __init__(self, gauges_source: Callable[[], dict[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.submissions = Counter(
            "gridgate_submissions",
            "Submission attempts by outcome",
            ["backend", "endpoint", "outcome"],
            registry=r,
        )
        self.pilots = Counter(
            "gridgate_pilots_submitted", "Pilots submitted", ["backend", "endpoint"], registry=r
        )
        self.failures = Counter(
            "gridgate_failures", "Failures by kind", ["backend", "endpoint", "kind"], registry=r
        )
        self.duration = Histogram(
            "gridgate_command_duration_seconds",
            "Duration of a submission attempt",
            ["backend"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.iteration = Histogram(
            "gridgate_iteration_duration_seconds",
            "Duration of an iteration",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.excluded = Gauge(
            "gridgate_endpoints_excluded", "Endpoints excluded in the last iteration", registry=r
        )
        self.notifications = Counter(
            "gridgate_notifications", "Notifications by level", ["level"], registry=r
        )
        self.reloads = Counter(
            "gridgate_config_reloads",
            "Config re-reads that changed something",
            ["result"],
            registry=r,
        )
        self.cache = Gauge(
            "gridgate_cache_entries", "Live entries per cache", ["cache"], registry=r
        )
        self.outbox = Gauge(
            "gridgate_outbox_depth", "Messages waiting per notifier", ["notifier"], registry=r
        )
        self.pilot_states = Gauge(
            "gridgate_pilots",
            "Tracked pilots by state",
            ["backend", "endpoint", "state"],
            registry=r,
        )
        self.trimmed = Counter(
            "gridgate_demand_trimmed",
            "Pilots of demand not submitted because of a limit (max_waiting, max_total)",
            ["backend", "limit"],
            registry=r,
        )
        self.status_polls = Counter(
            "gridgate_status_polls",
            "Bulk status queries by outcome",
            ["backend", "endpoint", "outcome"],
            registry=r,
        )
        self._pilot_labels: set[tuple[str, str, str]] = set()
        self.gauges_source = gauges_source
        self._server: Any = None

    def serve(self, port: int, address: str = "127.0.0.1") -> int:
        """Start the HTTP exposition; returns the port (useful with port 0)."""
        self._server, bound = serve_registry(self.registry, port, address)
        return bound

    def close(self) -> None:
        stop_server(self._server)
        self._server = None

    def config_reloaded(self, refused: bool) -> None:
        self.reloads.labels(result="refused" if refused else "applied").inc()

    @hookimpl
    def gridgate_submission_finished(self, record: AccountingRecord) -> None:
        endpoint = record.endpoint or "-"
        self.submissions.labels(record.backend, endpoint, record.outcome).inc()
        if record.outcome == "submitted":
            self.pilots.labels(record.backend, endpoint).inc(record.pilots)
        if record.outcome == "failed":
            self.failures.labels(record.backend, endpoint, record.failure_kind or "error").inc()
        if record.duration:
            self.duration.labels(record.backend).observe(record.duration)

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        self.notifications.labels(notification.level).inc()

    @hookimpl
    def gridgate_iteration_finished(self, summary: IterationSummary) -> None:
        self.iteration.observe(summary.duration)
        self.excluded.set(len(summary.excluded))
        self._pilots(summary.pilots)
        if self.gauges_source is None:
            return
        gauges = self.gauges_source()
        for cache, size in gauges.get("caches", {}).items():
            self.cache.labels(cache).set(size)
        for notifier, depth in gauges.get("outbox", {}).items():
            self.outbox.labels(notifier).set(depth)

    def _pilots(self, report: PilotReport | None) -> None:
        """Pilots by state (a series that disappeared from the registry drops to 0), demand
        trimmed, and status polls, from the iteration's pilot report (None: no tracking)."""
        if report is None:
            return
        seen: set[tuple[str, str, str]] = set()
        for key, states in report.states.items():
            backend, _, endpoint = key.partition("/")
            for state, n in states.items():
                self.pilot_states.labels(backend, endpoint, state).set(n)
                seen.add((backend, endpoint, state))
        for labels in self._pilot_labels - seen:
            self.pilot_states.labels(*labels).set(0)
        self._pilot_labels = seen
        for backend, limits in report.trimmed.items():
            for limit, n in limits.items():
                self.trimmed.labels(backend, limit).inc(n)
        for poll in report.polls:
            self.status_polls.labels(poll.backend, poll.endpoint, poll.outcome).inc()
