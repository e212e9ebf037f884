"""Keeps the director working when its state store fails (Redis gone, disk full, file
read-only): it falls back to a local in-memory view, says so once, and resynchronises when the
store answers again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.state import StateError, StateStore
from gridgate.core.stores.memory import MemoryState

if TYPE_CHECKING:
    from gridgate.core.state import PilotRegistry


class ResilientState(StateStore):
    """A state store that survives the failure of the one it wraps.

    While the primary works, every write is mirrored into a local :class:`MemoryState`, so
    when the primary fails the local view already knows this process's failing servers and
    escalation history: no storm of duplicate mails. Reads and writes then go to the local
    view, accounting rows are kept in memory, and every ``retry_every`` seconds the primary
    is tried again. When it answers, the local keys are added to it (add-if-absent, so what
    other directors wrote meanwhile wins), the kept rows are appended, and normal service
    resumes. ``on_change(degraded, reason)`` is called once per transition.
    """

    def __init__(
        self,
        primary: StateStore,
        *,
        clock: Clock = SYSTEM_CLOCK,
        retry_every: float = 30.0,
        on_change: Callable[[bool, str], None] | None = None,
        max_kept_records: int = 100_000,
    ) -> None:
        super().__init__({}, clock)
        self.primary = primary
        self.local = MemoryState(clock=clock)
        self.retry_every = retry_every
        self.on_change = on_change
        self.max_kept_records = max_kept_records
        self._lock = threading.RLock()
        self._degraded_since: float | None = None
        self._last_try = 0.0
        self._kept: list[tuple[str, dict[str, Any]]] = []
        self.dropped_records = 0

    @property
    def degraded(self) -> bool:
        return self._degraded_since is not None

    # --- mode switching ---------------------------------------------------------------------

    def _degrade(self, exc: BaseException) -> None:
        with self._lock:
            if self._degraded_since is not None:
                return
            self._degraded_since = self.clock.monotonic()
            self._last_try = self._degraded_since
        reason = f"{type(self.primary).__name__}: {exc}"
        logger.error("state store failed, continuing on a local view: {}", reason)
        if self.on_change:
            self.on_change(True, reason)

    def _maybe_recover(self) -> bool:
        """Try the primary again if it is time; True when it is back in service."""
        with self._lock:
            if self._degraded_since is None:
                return True
            now = self.clock.monotonic()
            if now - self._last_try < self.retry_every:
                return False
            self._last_try = now
            try:
                for key, value in self.local.items():
                    self.primary.add_if_absent(key, value, ttl=self.local.ttl(key))
                for stream, record in self._kept:
                    self.primary.append_record(stream, record)
            except StateError as exc:
                logger.debug("state store still failing: {}", exc)
                return False
            down_for = now - self._degraded_since
            kept = len(self._kept)
            self._kept.clear()
            self._degraded_since = None
        message = (
            f"state store answers again after {down_for:.0f} s; {kept} accounting rows written back"
        )
        logger.warning(message)
        if self.on_change:
            self.on_change(False, message)
        return True

    def _learn(self, key: str, value: str) -> None:
        """Copy into the local view, with its expiry, a key another process wrote.

        Without it, a director that lost an add to another director (or never tried: the
        server was already excluded) would forget that server is failing when the store
        fails, and mail about it again from its local view.
        """
        if self.local.get(key) is not None:
            return
        try:
            ttl = self.primary.ttl(key)
        except StateError:
            return  # the next operation on the primary notices the failure
        if ttl is not None and ttl <= 0:
            return
        self.local.set(key, value, ttl)

    def _read(self, name: str, *args: Any) -> Any:
        if self._maybe_recover():
            try:
                result = getattr(self.primary, name)(*args)
            except StateError as exc:
                self._degrade(exc)
            else:
                if name == "get" and result is not None:
                    self._learn(args[0], result)
                elif name == "items":
                    for key, value in result:
                        self._learn(key, value)
                return result
        return getattr(self.local, name)(*args)

    # --- the StateStore contract ---------------------------------------------------------------

    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        if self._maybe_recover():
            try:
                won = self.primary.add_if_absent(key, value, ttl)
            except StateError as exc:
                self._degrade(exc)
            else:
                if won:
                    self.local.set(key, value, ttl)
                else:
                    try:
                        held = self.primary.get(key)
                    except StateError:
                        held = None
                    if held is not None:
                        self._learn(key, held)
                return won
        return self.local.add_if_absent(key, value, ttl)

    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        if self._maybe_recover():
            try:
                self.primary.set(key, value, ttl)
            except StateError as exc:
                self._degrade(exc)
        self.local.set(key, value, ttl)

    def delete(self, key: str) -> bool:
        removed_locally = self.local.delete(key)
        if self._maybe_recover():
            try:
                return self.primary.delete(key)
            except StateError as exc:
                self._degrade(exc)
        return removed_locally

    def get(self, key: str) -> str | None:
        return self._read("get", key)

    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        return self._read("items", prefix)

    def ttl(self, key: str) -> float | None:
        return self._read("ttl", key)

    def increment(self, key: str, by: int = 1) -> int:
        """The primary's count, mirrored locally; while the primary fails the local view counts
        on from the last number it saw (so numbers go on rising in this process, though another
        director may use the same ones meanwhile), and a primary that lost the key (a Redis
        restarted empty) takes the local count back when it answers again."""
        if self._maybe_recover():
            try:
                total = self.primary.increment(key, by)
            except StateError as exc:
                self._degrade(exc)
            else:
                self.local.set(key, str(total))
                return total
        return self.local.increment(key, by)

    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        if self._maybe_recover():
            try:
                self.primary.append_record(stream, record)
                return
            except StateError as exc:
                self._degrade(exc)
        with self._lock:
            if len(self._kept) >= self.max_kept_records:
                self.dropped_records += 1
                return
            self._kept.append((stream, dict(record)))

    def prune_records(self, stream: str, before: float) -> int:
        with self._lock:  # rows kept while the primary failed age the same way
            kept = [(s, r) for s, r in self._kept if s != stream or _time(r) >= before]
            dropped = len(self._kept) - len(kept)
            self._kept[:] = kept
        if self._maybe_recover():
            try:
                return dropped + self.primary.prune_records(stream, before)
            except StateError as exc:
                self._degrade(exc)
        return dropped

    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        if self._maybe_recover():
            try:
                return self.primary.records(stream, since)
            except StateError as exc:
                self._degrade(exc)
        with self._lock:
            return [dict(r) for s, r in self._kept if s == stream and _time(r) >= since]

    def pilot_registry(self) -> PilotRegistry:
        """The primary's registry: pilots are not mirrored into the local view, so while the
        store fails this raises :class:`StateError`. The pilot tracker then applies the limits
        to the last counts it read plus the pilots it submitted since (kept in its memory), and
        writes those pilots back when the store answers again (core/engine/tracking.py)."""
        return self.primary.pilot_registry()

    def close(self) -> None:
        self.primary.close()
        self.local.close()


class DeferredState(StateStore):
    """A state store opened on first use, and tried again at each use until it opens.

    Lets the director start on its local view when the store cannot be opened yet (a read-only
    or unreachable state file, Redis down at boot): the first operation raises
    :class:`StateError`, which :class:`ResilientState` turns into one notification and retries.
    """

    def __init__(self, opener: Callable[[], StateStore], clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__({}, clock)
        self._opener = opener
        self._store: StateStore | None = None
        self._lock = threading.Lock()
        try:
            self._open()
        except StateError as exc:
            logger.error("state store cannot be opened, starting on a local view: {}", exc)

    def _open(self) -> StateStore:
        with self._lock:
            if self._store is None:
                self._store = self._opener()
            return self._store

    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        return self._open().add_if_absent(key, value, ttl)

    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        self._open().set(key, value, ttl)

    def get(self, key: str) -> str | None:
        return self._open().get(key)

    def delete(self, key: str) -> bool:
        return self._open().delete(key)

    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        return self._open().items(prefix)

    def ttl(self, key: str) -> float | None:
        return self._open().ttl(key)

    def increment(self, key: str, by: int = 1) -> int:
        return self._open().increment(key, by)

    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        self._open().append_record(stream, record)

    def prune_records(self, stream: str, before: float) -> int:
        return self._open().prune_records(stream, before)

    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        return self._open().records(stream, since)

    def pilot_registry(self) -> PilotRegistry:
        return self._open().pilot_registry()

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()


def _time(record: Mapping[str, Any]) -> float:
    """A record's clock time, as this process appended it (0 for one that has none)."""
    return float(record.get("time", 0))  # not config: a record kept in this process
