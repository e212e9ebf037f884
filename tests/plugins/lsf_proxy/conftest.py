"""Fixtures for the token daemon tests: they live in tests/support/lsfproxyd.py, shared with
the daemon reliability tests (and a real SMTP server, for what the daemon mails)."""

from support.lsfproxyd import cli, py_as, sockdir, start_daemon  # noqa: F401
from support.notifiers import smtp_server  # noqa: F401
