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


def rotation_cause(state: str, source: str) -> str:
    """The ``cause`` label of an endpoint an availability source put out of rotation: a GOCDB
    downtime is ``downtime``, any other its state (banned, drained, degraded)."""
    return "downtime" if source == "gocdb" else state


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
        self.skipped = Counter(
            "gridgate_pilots_skipped",
            "Pilots of demand not submitted, by cause: a limit (max_waiting, "
            "max_waiting_cores, max_total), claimed_elsewhere (another director's group), or "
            "what stopped them (credential, unavailable, no_endpoint, no_fit, local_fault, "
            "config)",
            ["backend", "cause"],
            registry=r,
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
            "gridgate_endpoints_excluded",
            "Endpoints excluded in the last iteration (an event count: an endpoint kept out by "
            "the failing cache is not tried, so not excluded again; alert on "
            "gridgate_endpoint_out_of_rotation)",
            registry=r,
        )
        self.out_of_rotation = Gauge(
            "gridgate_endpoint_out_of_rotation",
            "1 for each endpoint out of rotation now, by cause: failing (the failing cache, "
            "after failures of its submissions or polls), aborted (its pilots' verdict), "
            "downtime (GOCDB), banned, drained or degraded (an operator or another availability "
            "source); what `gridgate servers list` shows. The series goes when it is back",
            ["backend", "endpoint", "cause"],
            registry=r,
        )
        self.out_since = Gauge(
            "gridgate_endpoint_out_of_rotation_since_timestamp_seconds",
            "When each endpoint out of rotation went out (Unix time): for failing and aborted "
            "the start of its failure episode, kept across the tries the failing cache lets "
            "through; for the others when this director first saw it out",
            ["backend", "endpoint", "cause"],
            registry=r,
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
        # what a grid site alerts on (issue 32, item 3): availability, credential ends, demand
        self.availability = Gauge(
            "gridgate_endpoint_availability",
            "1 for each endpoint that is not fully available, by its merged state (degraded, "
            "drained, banned) and the sources that said so; the series goes when it is "
            "available again",
            ["backend", "endpoint", "state", "source"],
            registry=r,
        )
        self.credential_expiry = Gauge(
            "gridgate_credential_expiry_timestamp_seconds",
            "When each managed credential ends (Unix time), as its last check read it; no "
            "series while it cannot be read",
            ["name", "kind", "path"],
            registry=r,
        )
        self.credential_usable = Gauge(
            "gridgate_credential_usable",
            "1 when the managed credential was usable at the iteration's check, else 0",
            ["name", "kind", "path"],
            registry=r,
        )
        self.credential_renewal_due = Gauge(
            "gridgate_credential_renewal_due",
            "1 when the managed credential, still usable, has less than its min_lifetime left "
            "and this iteration's renewal did not extend it (it fails, or none is configured); "
            "the credential's own margin, for a 96 h proxy as for a 20 min token",
            ["name", "kind", "path"],
            registry=r,
        )
        self.demand_jobs = Gauge(
            "gridgate_demand_waiting_jobs",
            "Waiting work the demand source counted per group (the last good figure while "
            "the source fails)",
            ["group"],
            registry=r,
        )
        self.demand_pilots = Gauge(
            "gridgate_demand_pilots",
            "Pilots the demand asked for in the last iteration, before the limits",
            ["backend", "group"],
            registry=r,
        )
        self.last_iteration = Gauge(
            "gridgate_last_iteration_timestamp_seconds",
            "When the last iteration finished (Unix time)",
            registry=r,
        )
        self._series: dict[str, set[tuple[str, ...]]] = {}
        self._pilot_labels: set[tuple[str, str, str]] = set()
        self._out_since: dict[tuple[str, ...], float] = {}
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
        if record.outcome == "skipped":
            self.skipped.labels(record.backend, record.failure_kind or "skipped").inc(record.pilots)
        if record.outcome == "failed":
            self.failures.labels(record.backend, endpoint, record.failure_kind or "error").inc()
        if record.duration:
            self.duration.labels(record.backend).observe(record.duration)

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        self.notifications.labels(notification.level).inc()

    def failure_recorded(self, backend: str, endpoint: str, kind: str) -> None:
        """A failure found outside a submission (a status poll, a cancel, the pilots'
        verdict), as it is written to the failures table `gridgate report` reads: the same
        counter as a failed submission, so that the report and the metrics agree."""
        self.failures.labels(backend, endpoint or "-", kind or "error").inc()

    @hookimpl
    def gridgate_iteration_finished(self, summary: IterationSummary) -> None:
        self.iteration.observe(summary.duration)
        self.last_iteration.set(summary.started + summary.duration)
        self.excluded.set(len(summary.excluded))
        self._pilots(summary.pilots)
        self._site_gauges(summary)
        gauges = self.gauges_source() if self.gauges_source is not None else {}
        self._rotation(summary, gauges.get("failing", {}))  # not config: the gauges' source
        for cache, size in gauges.get("caches", {}).items():  # not config: the same
            self.cache.labels(cache).set(size)
        for notifier, depth in gauges.get("outbox", {}).items():  # not config: the same
            self.outbox.labels(notifier).set(depth)

    def _rotation(
        self, summary: IterationSummary, failing: dict[str, tuple[str, float | None]]
    ) -> None:
        """The endpoints out of rotation and since when: those the sources found not available
        this iteration, and those the failing cache holds (``failing``: endpoint key -> the
        kind of its last failure and the start of its episode)."""
        now = summary.started + summary.duration
        since: dict[tuple[str, ...], float] = {}
        for key, state in summary.unavailable.items():
            backend, _, endpoint = key.partition("/")
            labels = (backend, endpoint, rotation_cause(state.state, state.source))
            since[labels] = self._out_since.get(labels, now)
        for key, (kind, start) in failing.items():
            backend, _, endpoint = key.partition("/")
            labels = (backend, endpoint, "aborted" if kind == "aborted" else "failing")
            since[labels] = start if start is not None else now
        self._set("out_of_rotation", self.out_of_rotation, dict.fromkeys(since, 1.0))
        self._set("out_since", self.out_since, since)
        self._out_since = since

    def _site_gauges(self, summary: IterationSummary) -> None:
        """Availability, credential ends and demand of this iteration; the series of the last
        one that this one has not are removed (an endpoint available again, a credential no
        longer configured, a group without demand)."""
        availability: dict[tuple[str, ...], float] = {}
        for key, state in summary.unavailable.items():
            backend, _, endpoint = key.partition("/")
            availability[(backend, endpoint, state.state, state.source)] = 1
        expiry: dict[tuple[str, ...], float] = {}
        usable: dict[tuple[str, ...], float] = {}
        due: dict[tuple[str, ...], float] = {}
        for status in summary.credentials:
            labels = (status.name, status.kind, status.path)
            usable[labels] = 1 if status.usable else 0
            due[labels] = 1 if status.usable and status.renewal_due else 0
            if status.expires is not None:
                expiry[labels] = status.expires
        jobs: dict[tuple[str, ...], float] = {}
        pilots: dict[tuple[str, ...], float] = {}
        for figure in summary.demand:
            pilots[(figure.backend, figure.group)] = (
                pilots.get((figure.backend, figure.group), 0) + figure.pilots
            )
            if figure.jobs is not None:  # one figure per group, whichever backend it feeds
                jobs[(figure.group,)] = figure.jobs
        self._set("availability", self.availability, availability)
        self._set("credential_expiry", self.credential_expiry, expiry)
        self._set("credential_usable", self.credential_usable, usable)
        self._set("credential_renewal_due", self.credential_renewal_due, due)
        self._set("demand_jobs", self.demand_jobs, jobs)
        self._set("demand_pilots", self.demand_pilots, pilots)

    def _set(self, name: str, gauge: Gauge, values: dict[tuple[str, ...], float]) -> None:
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        for gone in self._series.get(name, set()) - values.keys():
            gauge.remove(*gone)
        self._series[name] = set(values)

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
