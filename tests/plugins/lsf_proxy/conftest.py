"""Fixtures for the token daemon tests: they live in tests/support/lsfproxyd.py, shared with
the daemon reliability tests."""

from support.lsfproxyd import cli, py_as, sockdir, start_daemon  # noqa: F401
