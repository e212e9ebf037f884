"""Fixtures for the core tests: a real redis-server and a real PostgreSQL cluster, each shared
by one test process, and what core logs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from loguru import logger
from support.postgres_server import PostgresServer
from support.redis_server import RedisServer
from support.tcp import serve  # noqa: F401 - a fixture of these tests


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server per test process (each xdist worker has its own); tests keep apart by
    using their own key prefix."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL cluster per test process (each xdist worker has its own); tests keep
    apart by using their own schema."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def logs() -> Iterator[list[tuple[str, str]]]:
    """(level, message) of what core logs at INFO and above during the test."""
    lines: list[tuple[str, str]] = []
    sink = logger.add(
        lambda m: lines.append((m.record["level"].name, m.record["message"])), level="INFO"
    )
    try:
        yield lines
    finally:
        logger.remove(sink)
