"""Expiring keys with atomic add-if-absent, and an append-only accounting log.

The failing and tickets caches, the list-match cache, escalation history, notification
de-duplication and the per-submission accounting rows all live here. Drivers are found
through the ``gridgate.state`` entry-point group; every driver passes the same contract
tests (tests/core/test_state_contract.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from gridgate.core.clock import SYSTEM_CLOCK, Clock


class StateError(Exception):
    """The state store cannot be read or written (disk full, read-only, server gone)."""


class StateStore(ABC):
    """Contract every state driver implements.

    Values are strings (callers encode JSON). ``ttl`` is in seconds, None for no expiry;
    expiry is measured on the injected clock's wall time, so it survives restarts.
    All methods are safe to call from many threads; drivers that share state between
    processes (sqlite, redis) are safe across processes too.
    """

    config_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def __init__(self, config: Mapping[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = dict(config or {})
        self.clock = clock

    @abstractmethod
    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        """Store ``value`` under ``key`` only if no live value is there. Atomic: of many
        concurrent callers exactly one gets True."""

    @abstractmethod
    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        """Store ``value`` under ``key``, replacing any value and its expiry."""

    @abstractmethod
    def get(self, key: str) -> str | None:
        """The live value under ``key``, or None (absent or expired)."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove ``key``; True if a live value was removed."""

    @abstractmethod
    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        """Live (key, value) pairs whose key starts with ``prefix``, sorted by key."""

    @abstractmethod
    def ttl(self, key: str) -> float | None:
        """Seconds until ``key`` expires; None when absent or without expiry."""

    @abstractmethod
    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        """Append a JSON-serialisable record (must hold a float ``time``) to ``stream``."""

    @abstractmethod
    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        """Records of ``stream`` whose ``time`` >= ``since``, oldest first."""

    def close(self) -> None:
        """Release connections and files."""
