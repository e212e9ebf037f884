"""Fixtures shared by the email and ggus notifier tests: real servers, a fake clock, a log
capture. Each folder's conftest imports the ones it uses
(``from support.notifiers import smtp_server, ...``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from loguru import logger

from gridgate.core.clock import FakeClock
from support.servers import HttpServer, SmtpServer


def _running(server):
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
    """A real aiosmtpd server on a free loopback port."""
    yield from _running(SmtpServer())


@pytest.fixture
def smtp(smtp_server: SmtpServer) -> SmtpServer:
    """The same server, under the name the email tests use."""
    return smtp_server


@pytest.fixture
def helpdesk() -> Iterator[HttpServer]:
    """A real HTTP server standing in for the GGUS REST API."""
    yield from _running(HttpServer())


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
