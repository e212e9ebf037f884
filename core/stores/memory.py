"""The ``memory`` state driver: a dict behind a lock, for tests and single-shot runs; nothing
survives the process (its pilot registry is the store's default, in this process too)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.state import (
    StateStore,
    check_key,
    check_value,
    encode_record,
    expires_at,
    parse_count,
)
from gridgate.core.stores.records import readable, stream_record


class MemoryState(StateStore):
    """A dict behind a lock, for tests and single-shot runs; nothing survives the process."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "description": "In-process state: nothing is kept across restarts or shared.",
        "properties": {},
        "additionalProperties": False,
    }

    #: Expired keys are dropped at most this often (clock seconds), not on every call.
    PRUNE_EVERY = 60.0

    def __init__(
        self, config: Mapping[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        super().__init__(config, clock)
        self._lock = threading.Lock()
        self._data: dict[str, tuple[str, float | None]] = {}
        self._records: dict[str, list[tuple[float, str]]] = {}
        #: the (time, text) of each stream's records, so an identical append is seen at once
        self._seen: dict[str, set[tuple[float, str]]] = {}
        self._last_prune = clock.time()

    def _live(self, key: str, now: float) -> tuple[str, float | None] | None:
        entry = self._data.get(key)
        if entry is None:
            return None
        if entry[1] is not None and entry[1] <= now:
            del self._data[key]
            return None
        return entry

    def _maybe_prune(self, now: float) -> None:
        if now - self._last_prune < self.PRUNE_EVERY:
            return
        self._last_prune = now
        dead = [k for k, (_v, exp) in self._data.items() if exp is not None and exp <= now]
        for k in dead:
            del self._data[k]

    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        with self._lock:
            now = self.clock.time()
            self._maybe_prune(now)
            if self._live(key, now) is not None:
                return False
            self._data[key] = (value, expires)
            return True

    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        with self._lock:
            self._maybe_prune(self.clock.time())
            self._data[key] = (value, expires)

    def get(self, key: str) -> str | None:
        with self._lock:
            entry = self._live(key, self.clock.time())
            return None if entry is None else entry[0]

    def delete(self, key: str) -> bool:
        with self._lock:
            live = self._live(key, self.clock.time()) is not None
            self._data.pop(key, None)
            return live

    def renew(self, key: str, value: str, ttl: float | None) -> bool:
        expires = expires_at(self.clock, ttl)
        with self._lock:
            entry = self._live(key, self.clock.time())
            if entry is None or entry[0] != value:
                return False
            self._data[key] = (value, expires)
            return True

    def delete_if(self, key: str, value: str) -> bool:
        with self._lock:
            entry = self._live(key, self.clock.time())
            if entry is None or entry[0] != value:
                return False
            del self._data[key]
            return True

    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        with self._lock:
            now = self.clock.time()
            return sorted(
                (k, v)
                for k, (v, exp) in self._data.items()
                if k.startswith(prefix) and (exp is None or exp > now)
            )

    def ttl(self, key: str) -> float | None:
        with self._lock:
            now = self.clock.time()
            entry = self._live(key, now)
            if entry is None or entry[1] is None:
                return None
            return entry[1] - now

    def increment(self, key: str, by: int = 1) -> int:
        check_key(key)
        with self._lock:
            entry = self._live(key, self.clock.time())
            total = parse_count(key, None if entry is None else entry[0]) + int(by)
            self._data[key] = (str(total), None)
            return total

    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        check_key(stream)
        when, text = encode_record(record)
        with self._lock:
            seen = self._seen.setdefault(stream, set())
            if (when, text) in seen:
                return  # the same record appended again (a retry): kept once
            seen.add((when, text))
            self._records.setdefault(stream, []).append((when, text))

    def prune_records(self, stream: str, before: float) -> int:
        with self._lock:
            rows = self._records.get(stream, [])
            kept = [r for r in rows if r[0] >= before]
            self._records[stream] = kept
            self._seen[stream] = set(kept)
            return len(rows) - len(kept)

    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self._lock:
            rows = [r for r in self._records.get(stream, []) if r[0] >= since]
        rows.sort(key=lambda r: r[0])  # stable: equal times stay in append order
        return readable((text for _when, text in rows), stream_record, f"state records {stream}")
