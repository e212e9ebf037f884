"""A daemon's Prometheus series (``metrics_port``), on a registry of their own: decisions, waits
and errors counted as they happen, tokens in use and queues read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gridgate.core.text import printable
from gridgate.plugins.lsf_proxy.commands import CATEGORIES
from gridgate.plugins.lsf_proxy.daemon.policy import DENIED, GRANTED, Decision, TokenPolicy
from gridgate.plugins.lsf_proxy.daemon.startup import StartupError

#: Wait-time histogram buckets (seconds): token_wait_time defaults to 15 s.
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300)


class DaemonMetrics:
    """Prometheus series of one daemon, on their own registry.

    Decisions and errors are counted as they happen; tokens in use and queue lengths are
    read from the policy at scrape time (the HTTP server runs in its own thread, so it only
    reads plain integers and never calls into the policy, which would roll its periods).
    """

    def __init__(self, policy: TokenPolicy) -> None:
        try:
            import prometheus_client as prom
            from prometheus_client.core import GaugeMetricFamily
        except ImportError:
            raise StartupError(
                "proxyd.metrics_port is set but prometheus_client is not "
                "installed: pip install 'gridgate[metrics]'"
            ) from None
        self._prom = prom
        self.policy = policy
        self.registry = r = prom.CollectorRegistry()
        self.grants = prom.Counter(
            "gridgate_proxyd_grants", "Tokens granted", ["category"], registry=r
        )
        self.rejections = prom.Counter(
            "gridgate_proxyd_rejections",
            "Requests denied for lack of a token (queue full or waited token_wait_time)",
            ["category", "reason"],
            registry=r,
        )
        self.blocked = prom.Counter(
            "gridgate_proxyd_blocked", "Requests denied by the blocklist", ["category"], registry=r
        )
        self.rate_limited = prom.Counter(
            "gridgate_proxyd_rate_limited",
            "Requests denied for being over the user's rate (proxyd.rate_limit)",
            ["category"],
            registry=r,
        )
        self.errors = prom.Counter(
            "gridgate_proxyd_errors",
            "The status table's Error row: bad or cut-off requests "
            "(protocol) and leases taken back (lease_expired)",
            ["kind"],
            registry=r,
        )
        self.wait = prom.Histogram(
            "gridgate_proxyd_wait_seconds",
            "Seconds from request to grant or denial",
            ["category", "outcome"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        for category in CATEGORIES:
            # series exist from the start, so a rate over the first grant is right
            self.grants.labels(category)
            self.blocked.labels(category)
            self.rate_limited.labels(category)
            for reason in ("timeout", "queue_full"):
                self.rejections.labels(category, reason)
        for kind in ("protocol", "lease_expired"):
            self.errors.labels(kind)
        self._gauge = GaugeMetricFamily
        #: the bypass audit's last window, user -> RPCs beyond the tokens' cover (set by the
        #: daemon when proxyd.bypass audits: a dict replaced, never changed, so a scrape in the
        #: server's thread reads a whole one)
        self.bypassing: Callable[[], Mapping[str, float]] | None = None
        #: with proxyd.adaptive: category -> (its adaptive max now, its low), read at scrape
        self.adaptive: Callable[[], Mapping[str, tuple[int, int]]] | None = None
        r.register(self)
        self._server: Any = None

    def collect(self) -> list[Any]:
        """The gauges, read now (called by the registry at each scrape)."""
        gauges = {
            "in_use": self._gauge(
                "gridgate_proxyd_tokens_in_use", "Tokens held now", labels=["category"]
            ),
            "privileged": self._gauge(
                "gridgate_proxyd_tokens_in_use_privileged",
                "Tokens held now by root, admins and add-on hosts",
                labels=["category"],
            ),
            "queue": self._gauge(
                "gridgate_proxyd_queue_length", "Requests waiting now", labels=["category"]
            ),
            "limit": self._gauge(
                "gridgate_proxyd_token_limit", "The category's max", labels=["category"]
            ),
        }
        for name, cat in list(self.policy.categories.items()):
            gauges["in_use"].add_metric([name], cat.in_use)
            gauges["privileged"].add_metric([name], cat.in_use_privileged)
            gauges["queue"].add_metric([name], cat.queue.size)
            gauges["limit"].add_metric([name], cat.limits.max)
        if self.bypassing is not None:
            gauges["bypass"] = self._gauge(
                "gridgate_bypass_rpcs",
                "Scheduler RPCs a user made in the last audit window beyond what its tokens "
                "cover (proxyd.bypass); users within their tokens are not listed",
                labels=["user"],
            )
            for user, excess in sorted(self.bypassing().items()):
                gauges["bypass"].add_metric([printable(user, newlines=False)], excess)
        if self.adaptive is not None:
            gauges["adaptive"] = self._gauge(
                "gridgate_proxyd_adaptive_limit",
                "The max proxyd.adaptive sets now (under the category's configured max)",
                labels=["category"],
            )
            gauges["adaptive_low"] = self._gauge(
                "gridgate_proxyd_adaptive_low",
                "The lowest max proxyd.adaptive may set (its entry's min)",
                labels=["category"],
            )
            for category, (limit, low) in sorted(self.adaptive().items()):
                gauges["adaptive"].add_metric([category], limit)
                gauges["adaptive_low"].add_metric([category], low)
        return list(gauges.values())

    def decided(self, decision: Decision) -> None:
        """Count one final decision and observe how long its request waited."""
        req = decision.request
        if decision.outcome == GRANTED:
            self.grants.labels(req.category).inc()
        elif decision.outcome == DENIED:
            if decision.reason == "blocked":
                self.blocked.labels(req.category).inc()
            elif decision.reason in ("timeout", "queue_full"):
                self.rejections.labels(req.category, decision.reason).inc()
            elif decision.reason == "rate_limited":
                self.rate_limited.labels(req.category).inc()
        else:
            return
        self.wait.labels(req.category, decision.outcome).observe(max(0.0, decision.waited))

    def serve(self, port: int, address: str) -> int:
        """Start the HTTP exposition; returns the port (useful with port 0)."""
        from gridgate.core.metrics import serve_registry

        try:
            self._server, bound = serve_registry(self.registry, port, address)
        except OSError as exc:
            raise StartupError(f"cannot serve metrics on {address}:{port}: {exc}") from None
        return bound

    def close(self) -> None:
        from gridgate.core.metrics import stop_server

        stop_server(self._server)
        self._server = None
