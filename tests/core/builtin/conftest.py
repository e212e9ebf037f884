"""Fixtures of the built-in plugins' tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def queue(redis_server) -> Iterator[tuple[Any, str]]:
    """A Redis client and a fresh key on the suite's real redis-server (a task queue: a list,
    or a hash of requirements), deleted afterwards."""
    client = redis_server.client()
    key = f"tq:{uuid.uuid4().hex}"
    yield client, key
    client.delete(key)
