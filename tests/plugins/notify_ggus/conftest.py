"""Fixtures for the ggus notifier tests; the real servers are shared with the email tests."""

from support.notifiers import clock, helpdesk, logs, smtp_server  # noqa: F401
