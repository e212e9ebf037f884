"""Fixtures for the core tests: a real redis-server shared by one test process."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/ holds helper modules shared by every test folder (redis_server.py).
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from redis_server import RedisServer  # noqa: E402


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server per test process (each xdist worker has its own); tests keep apart by
    using their own key prefix."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server
