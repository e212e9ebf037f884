"""Fixtures for the email notifier tests: a real SMTP server, a fake clock, a log capture."""

from support.notifiers import clock, logs, smtp, smtp_server  # noqa: F401
