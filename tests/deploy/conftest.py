"""The token daemon's fixtures, for the tests that scrape it."""

from support.lsfproxyd import sockdir, start_daemon

__all__ = ["sockdir", "start_daemon"]
