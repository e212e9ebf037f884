"""Fixtures for the core tests: a real redis-server shared by one test process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server per test process (each xdist worker has its own); tests keep apart by
    using their own key prefix."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server
