"""Keeps the director working when its state store fails (Redis gone, disk full, file
read-only): it falls back to a local in-memory view, says so once, and resynchronises when the
store answers again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.engine.records import PendingRecord, PendingRecords, read_record
from gridgate.core.files import atomic_write
from gridgate.core.state import StateError, StateStore
from gridgate.core.stores.memory import MemoryState

if TYPE_CHECKING:
    from gridgate.core.state import PilotRegistry

#: Keys never written back from the local view: the store's own identity (its epoch).
NOT_WRITTEN_BACK = "store/"
#: What a recovery writes to prove the store takes writes again (its time, a day's TTL).
PROBE_KEY = NOT_WRITTEN_BACK + "answered"


class ResilientState(StateStore):
    """A state store that survives the failure of the one it wraps.

    While the primary works, every write is mirrored into a local :class:`MemoryState`, so
    when the primary fails the local view already knows this process's failing servers and
    escalation history: no storm of duplicate mails. Reads and writes then go to the local
    view, accounting rows are kept in memory, and every ``retry_every`` seconds the primary
    is tried again. When it answers, the local keys are added to it (add-if-absent, so what
    other directors wrote meanwhile wins; never those under ``store/``, the store's own
    identity, see :mod:`gridgate.core.engine.epoch`), the kept rows are appended (an append
    is idempotent, so a write-back cut half way and tried again makes no second row), and
    normal service resumes. ``on_change(degraded, reason)`` is called once per transition.

    :meth:`close` tries the primary once more; the rows it still does not take are kept in
    ``pending_path`` (durable, private), which the next start reads back and appends at its
    first success, then removes.
    """

    def __init__(
        self,
        primary: StateStore,
        *,
        clock: Clock = SYSTEM_CLOCK,
        retry_every: float = 30.0,
        on_change: Callable[[bool, str], None] | None = None,
        max_kept_records: int = 100_000,
        pending_path: Path | None = None,
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
        #: where rows the primary did not take by :meth:`close` are kept until the next start
        self.pending_path = pending_path
        #: whether rows read from ``pending_path`` still wait for the primary
        self._replay = self._load_pending()

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

    def _maybe_recover(self, force: bool = False) -> bool:
        """Try the primary again if it is time (or ``force``); True when it is in service."""
        error: StateError | None = None
        with self._lock:
            if self._degraded_since is None and self._replay:
                error = self._replay_pending()
        if error is not None:
            self._degrade(error)
            return False
        with self._lock:
            if self._degraded_since is None:
                return True
            now = self.clock.monotonic()
            if not force and now - self._last_try < self.retry_every:
                return False
            self._last_try = now
            kept = len(self._kept)
            try:
                self._write_back_keys()
                self._write_back_rows()
                # a write that must land: write-backs of keys the store holds already change
                # nothing, and a full disk takes those (it failed twice in one outage)
                self.primary.set(PROBE_KEY, repr(self.clock.time()), ttl=86400)
            except StateError as exc:
                logger.debug("state store still failing: {}", exc)
                return False
            down_for = now - self._degraded_since
            self._degraded_since = None
            self._pending_written()
        message = (
            f"state store answers again after {down_for:.0f} s; {kept} accounting rows written back"
        )
        logger.info(message)  # good news: the failure was the error line
        if self.on_change:
            self.on_change(False, message)
        return True

    def _write_back_keys(self) -> None:
        for key, value in self.local.items():
            if key.startswith(NOT_WRITTEN_BACK):
                continue
            self.primary.add_if_absent(key, value, ttl=self.local.ttl(key))

    def _write_back_rows(self) -> None:
        """Append the kept rows in order; those written leave the list even when a later one
        fails (and one whose answer was lost is written again: appends are idempotent)."""
        done = 0
        try:
            for stream, record in self._kept:
                self.primary.append_record(stream, record)
                done += 1
        finally:
            del self._kept[:done]

    def write_back_local(self) -> None:
        """Add every key of the local view to the primary with add-if-absent, as recovery does
        (what the primary holds wins), except those under ``store/``: the store's epoch is kept
        there, and writing it back would hide a store that came back empty. For a primary that
        answers again without its data (gridgate.core.engine.epoch).

        :raises StateError: the primary failed part way (what was added stays)."""
        with self._lock:
            self._write_back_keys()

    # --- rows kept across a stop --------------------------------------------------------------

    def _load_pending(self) -> bool:
        path = self.pending_path
        if path is None:
            return False
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return False
        except OSError as exc:
            logger.error("{} unreadable: {} (the rows it holds stay there)", path, exc)
            return False
        pending = read_record(raw, PendingRecords, str(path))
        if pending is None:
            return False
        self._kept.extend((row.stream, row.record) for row in pending.rows)
        logger.info(
            "{} accounting row(s) the last run could not store read from {}; appended when "
            "the store answers",
            len(pending.rows),
            path,
        )
        return True

    def _replay_pending(self) -> StateError | None:
        """Append the rows read from ``pending_path`` (caller holds the lock)."""
        try:
            self._write_back_rows()
        except StateError as exc:
            return exc
        self._pending_written()
        return None

    def _pending_written(self) -> None:
        """Every kept row is in the primary: the file of the last run's rows is done with."""
        self._replay = False
        if self.pending_path is None:
            return
        try:
            self.pending_path.unlink(missing_ok=True)
        except OSError as exc:
            logger.error("cannot remove {} (its rows are stored): {}", self.pending_path, exc)

    def _save_pending(self) -> None:
        path = self.pending_path
        if path is None or not self._kept:
            if self._kept:
                logger.error(
                    "state store still failing at stop: {} accounting row(s) lost", len(self._kept)
                )
            return
        rows = [PendingRecord(stream=s, record=r) for s, r in self._kept]
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write(path, msgspec.json.encode(PendingRecords(rows=rows)), durable=True)
        except OSError as exc:
            logger.error(
                "state store still failing at stop, and {} accounting row(s) cannot be kept in "
                "{}: {}; they are lost",
                len(rows),
                path,
                exc,
            )
            return
        logger.warning(
            "state store still failing at stop: {} accounting row(s) kept in {}, appended at "
            "the next start",
            len(rows),
            path,
        )

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

    def renew(self, key: str, value: str, ttl: float | None) -> bool:
        # only the shared store can say who holds a lease: the local view never grants one
        if not self._maybe_recover():
            raise StateError("the state store is unavailable")
        try:
            renewed = self.primary.renew(key, value, ttl)
        except StateError as exc:
            self._degrade(exc)
            raise
        if renewed:
            self.local.set(key, value, ttl)
        return renewed

    def delete_if(self, key: str, value: str) -> bool:
        self.local.delete_if(key, value)
        if not self._maybe_recover():
            raise StateError("the state store is unavailable")
        try:
            return self.primary.delete_if(key, value)
        except StateError as exc:
            self._degrade(exc)
            raise

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
        """Try the primary once more (whatever ``retry_every`` says), keep what it still does
        not take in ``pending_path``, and close both views."""
        if self.degraded or self._replay:
            self._maybe_recover(force=True)
        with self._lock:
            if self._kept:
                self._save_pending()
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

    def opened(self) -> StateStore | None:
        """The store once opened; None while it could not be."""
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

    def renew(self, key: str, value: str, ttl: float | None) -> bool:
        return self._open().renew(key, value, ttl)

    def delete_if(self, key: str, value: str) -> bool:
        return self._open().delete_if(key, value)

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
