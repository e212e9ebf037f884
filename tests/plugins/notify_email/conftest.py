"""Fixtures for the email notifier tests: a real SMTP server, a fake clock, a log capture."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

sys.path.insert(0, str(Path(__file__).parent))

from gg_servers import SmtpServer  # noqa: E402

from gridgate.core.clock import FakeClock  # noqa: E402


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    server = SmtpServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_790_000_000.0)


@pytest.fixture
def logs() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="DEBUG")
    try:
        yield lines
    finally:
        logger.remove(sink)
