"""Fixtures for the ggus notifier tests; the real servers are shared with the email tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

sys.path.insert(0, str(Path(__file__).parents[1] / "notify_email"))

from gg_servers import HttpServer, SmtpServer  # noqa: E402

from gridgate.core.clock import FakeClock  # noqa: E402


@pytest.fixture
def helpdesk() -> Iterator[HttpServer]:
    server = HttpServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
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
