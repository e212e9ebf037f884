"""The token daemon's fixtures, for the tests that scrape it, and a real Prometheus."""

from support.lsfproxyd import sockdir, start_daemon
from support.prometheus import prometheus_factory

__all__ = ["prometheus_factory", "sockdir", "start_daemon"]
