"""Fixtures for the email notifier tests: a real SMTP server, a fake clock, a log capture."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from notifier_fixtures import clock, logs, smtp, smtp_server  # noqa: E402, F401
