"""Fixtures for the ggus notifier tests; the real servers are shared with the email tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "notify_email"))

from notifier_fixtures import clock, helpdesk, logs, smtp_server  # noqa: E402, F401
