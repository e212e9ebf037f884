"""A durable, crash-safe directory queue of outgoing messages with retry, backoff and dead-letter:
the outbox any notifier can use (the ``email`` and ``ggus`` notifiers keep theirs here).

Layout of an outbox directory (0700, files 0600)::

    queue/<ms>-<seq>.json   one message waiting, everything needed to deliver it
    dead/<ms>-<seq>.json    a message refused for good, with the server's reply
    tmp/                    files being written (renamed into queue/ or dead/ when complete)
    .seq                    last enqueue time and sequence (names sort in enqueue order)
    records.json            a small expiring key store for plugins run without a state store

Every write goes to ``tmp/``, is fsynced and renamed, so a crash leaves either the old file or
the new one. A message is removed from ``queue/`` only after its transport accepted it. One
delivery pass runs at a time across threads and processes (``flock`` on ``.deliver.lock``).

What "delivered" means is up to a :class:`Transport` (SMTP, HTTP...): it answers each message
with a :class:`Delivery` saying sent, retry later, or dead. A transient failure of the whole
transport (server down) holds back every later message of that transport, so order is kept; a
failure of one message alone (a 4xx for one recipient) holds back only that message.

A notifier puts :data:`OUTBOX_SCHEMA_PROPERTIES` in its ``config_schema`` and builds its outbox
with :func:`configured_outbox`; the ``gridgate outbox`` commands find it through the notifier's
``make_outbox`` class method.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.documents import convert, decode_json
from gridgate.core.files import atomic_write, ensure_private_dir, fsync_dir
from gridgate.core.settings import Settings

__all__ = [
    "OUTBOX_SCHEMA_PROPERTIES",
    "Delivery",
    "FlushResult",
    "LocalRecord",
    "Message",
    "Outbox",
    "OutboxSettings",
    "OutboxWatch",
    "RetryPolicy",
    "Transport",
    "configured_outbox",
]

Status = Literal["sent", "retry", "dead"]
FORMAT_VERSION = 1

#: The outbox keys of a notifier's section (put them in its ``config_schema``):
#: ``retry_initial``, ``retry_max``, ``max_age``, ``poll_interval`` and ``send_thread``.
OUTBOX_SCHEMA_PROPERTIES: dict[str, Any] = {
    "retry_initial": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 30,
        "description": "First retry after this many seconds; doubles each time.",
    },
    "retry_max": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 1800,
        "description": "Longest pause between two attempts, in seconds.",
    },
    "max_age": {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 259200,
        "description": "A message still failing this many seconds after it was queued "
        "goes to dead-letter (default 3 days).",
    },
    "poll_interval": {
        "maximum": 86400,
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 5,
        "description": "Seconds between the sender thread's passes when idle.",
    },
    "send_thread": {
        "type": "boolean",
        "default": True,
        "description": "Deliver from a background thread; false: only when the "
        "director (or a test) calls flush().",
    },
}


@dataclass(frozen=True)
class OutboxSettings(Settings):
    """The outbox keys of a notifier's section (:data:`OUTBOX_SCHEMA_PROPERTIES`); a
    notifier's own settings class derives from it and hands itself to
    :func:`configured_outbox`."""

    section_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "properties": OUTBOX_SCHEMA_PROPERTIES,
    }

    retry_initial: float
    retry_max: float
    max_age: float
    poll_interval: float
    send_thread: bool


@dataclass(frozen=True)
class Delivery:
    """A transport's answer for one message.

    ``status``: ``sent`` (accepted; the message leaves the queue), ``retry`` (transient; try
    again after a backoff), ``dead`` (refused for good; moved to ``dead/`` with ``reply``).
    ``blocking`` says a retry concerns the whole transport (server down), so later messages of
    that transport wait behind it. A partial outcome carries the part of the payload still to
    retry (``retry_payload``) and the part refused for good (``dead_payload``).
    """

    status: Status
    reply: str = ""
    blocking: bool = True
    retry_payload: Mapping[str, Any] | None = None
    dead_payload: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Message:
    """One queued message as stored in its file. ``id`` is the file name without ``.json``."""

    id: str
    transport: str
    payload: Mapping[str, Any]
    enqueued: float
    summary: str = ""
    attempts: int = 0
    next_attempt: float = 0.0
    blocking: bool = False
    last_error: str = ""
    reply: str = ""
    dead_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The message as stored in its file."""
        return {
            "version": FORMAT_VERSION,
            "id": self.id,
            "transport": self.transport,
            "summary": self.summary,
            "enqueued": self.enqueued,
            "attempts": self.attempts,
            "next_attempt": self.next_attempt,
            "blocking": self.blocking,
            "last_error": self.last_error,
            "reply": self.reply,
            "dead_at": self.dead_at,
            "payload": dict(self.payload),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Message:
        """The message stored as ``data`` (what :meth:`to_json` wrote, parsed; older files
        lack the keys that have defaults).

        :raises gridgate.core.documents.DocumentError: ``data`` is not a stored message.
        """
        return convert(data, cls, kind=_MESSAGE_KIND)

    @classmethod
    def read(cls, data: bytes) -> Message:
        """The message stored as ``data`` (a message file's bytes).

        :raises gridgate.core.documents.DocumentError: ``data`` is not a stored message.
        """
        return decode_json(data, cls, kind=_MESSAGE_KIND)


#: What a message file is, for its :class:`~gridgate.core.documents.DocumentError`.
_MESSAGE_KIND = "outbox message"


class Transport(Protocol):
    """Delivers one message; must catch its own errors and answer with a :class:`Delivery`."""

    def deliver(self, message: Message) -> Delivery: ...

    def finish(self) -> None:
        """End of a delivery pass: close connections kept open for the pass."""


@dataclass
class PassResult:
    """What one delivery pass did."""

    sent: int = 0
    retried: int = 0
    dead: int = 0
    attempted: int = 0
    skipped_busy: bool = False

    def add(self, other: PassResult) -> None:
        self.sent += other.sent
        self.retried += other.retried
        self.dead += other.dead
        self.attempted += other.attempted


@dataclass(frozen=True)
class FlushResult:
    """What :meth:`Outbox.flush` did, and how many messages still wait (backoff, lock held)."""

    sent: int
    retried: int
    dead: int
    waiting: int


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff ``initial * 2**(attempts-1)`` capped at ``maximum``; a message still failing
    transiently ``max_age`` seconds after it was queued goes to dead-letter instead."""

    initial: float = 30.0
    maximum: float = 1800.0
    max_age: float = 3 * 86400.0

    def delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt."""
        return min(self.maximum, self.initial * (2 ** max(0, attempts - 1)))


@contextlib.contextmanager
def file_lock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path``; yields False when ``blocking`` is off and
    someone else holds it. Each call opens its own descriptor, so threads exclude each other
    as processes do."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


#: A record file: key -> (value, expiry time or None for ever).
_RecordFile = dict[str, tuple[str, float | None]]


class LocalRecord:
    """Expiring keys in one JSON file, with the atomic ``add_if_absent`` of a state store.

    Used for de-duplication and ticket bookkeeping when a plugin runs without a state store
    (command-line use); safe across threads and processes through an flock.
    """

    def __init__(self, directory: Path, clock: Clock = SYSTEM_CLOCK, name: str = "records") -> None:
        self.directory = Path(directory)
        self.clock = clock
        self.path = self.directory / f"{name}.json"
        self._lock_path = self.directory / f".{name}.lock"

    def _load(self, now: float) -> dict[str, list[Any]]:
        try:
            data: _RecordFile = decode_json(self.path.read_bytes(), _RecordFile, kind="record file")
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            logger.warning("ignoring unreadable record file {}: {}", self.path, exc)
            return {}
        return {k: list(v) for k, v in data.items() if v[1] is None or v[1] > now}

    def _save(self, data: Mapping[str, Any]) -> None:
        atomic_write(self.path, json.dumps(data, sort_keys=True).encode("utf-8"))

    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        """Store ``key`` for ``ttl`` seconds (None: for ever) unless present; True if stored."""
        ensure_private_dir(self.directory)
        with file_lock(self._lock_path):
            now = self.clock.time()
            data = self._load(now)
            if key in data:
                return False
            data[key] = [value, None if ttl is None else now + ttl]
            self._save(data)
            return True

    def get(self, key: str) -> str | None:
        """The value of ``key``, or None when absent or expired."""
        entry = self._load(self.clock.time()).get(key)
        return None if entry is None else str(entry[0])

    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it was there."""
        ensure_private_dir(self.directory)
        with file_lock(self._lock_path):
            data = self._load(self.clock.time())
            found = data.pop(key, None) is not None
            if found:
                self._save(data)
            return found


@dataclass
class _Sender:
    thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)


class OutboxWatch:
    """The messages an outbox queued while it was watched (:meth:`Outbox.watch`), and what
    their first delivery attempt answered: ``gridgate notify test`` says from this what
    really happened to its message, whichever thread delivered it."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.messages: list[Message] = []
        #: message id -> the transport's answer to its last attempt
        self.outcomes: dict[str, Delivery] = {}
        self._done = threading.Condition()

    def _queued(self, message: Message) -> None:
        with self._done:
            self.messages.append(message)

    def _settled(self, message_id: str, delivery: Delivery) -> None:
        with self._done:
            if any(m.id == message_id for m in self.messages):
                self.outcomes[message_id] = delivery
                self._done.notify_all()

    def __enter__(self) -> OutboxWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop recording."""
        with contextlib.suppress(ValueError):
            self.outbox._watches.remove(self)

    def wait(self, timeout: float) -> bool:
        """Deliver what is due and wait until every watched message has had an attempt (it
        may be the sender thread's); False when ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        while True:
            with self._done:
                if all(m.id in self.outcomes for m in self.messages):
                    return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.outbox.run_once()
            with self._done:
                self._done.wait(min(0.2, max(left, 0)))


class Outbox:
    """A directory queue with pluggable transports, retry with backoff and dead-letter.

    ``transports`` maps the transport name stored in each message to the object that delivers
    it; a message whose transport is not registered here waits untouched (another process, or
    a later config, may deliver it). ``clock`` drives backoff and expiry.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        transports: Mapping[str, Transport] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        retry: RetryPolicy | None = None,
        poll_interval: float = 5.0,
        name: str = "outbox",
    ) -> None:
        self.directory = Path(directory)
        self.queue_dir = self.directory / "queue"
        self.dead_dir = self.directory / "dead"
        self.tmp_dir = self.directory / "tmp"
        self.transports: dict[str, Transport] = dict(transports or {})
        self.clock = clock
        self.retry_policy = retry or RetryPolicy()
        self.poll_interval = poll_interval
        self.name = name
        self.records = LocalRecord(self.directory, clock)
        self._pass_lock = threading.Lock()
        self._sender = _Sender()
        self._sender_lock = threading.Lock()
        self._warned_unknown: set[str] = set()
        self._watches: list[OutboxWatch] = []
        for path in (self.directory, self.queue_dir, self.dead_dir, self.tmp_dir):
            ensure_private_dir(path)
        self._clean_tmp()

    def _clean_tmp(self, older_than: float = 3600.0) -> None:
        """Remove files a crash left half-written in ``tmp/`` (never complete messages: those
        were renamed). Real file ages, so a write in progress elsewhere is left alone."""
        limit = time.time() - older_than
        for path in self.tmp_dir.iterdir():
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < limit:
                    path.unlink()

    # --- writing ---------------------------------------------------------------------------

    def _write(self, folder: Path, message: Message) -> None:
        data = json.dumps(message.to_json(), ensure_ascii=False, indent=1).encode("utf-8")
        atomic_write(folder / f"{message.id}.json", data, tmp_dir=self.tmp_dir)

    def enqueue(self, transport: str, payload: Mapping[str, Any], summary: str = "") -> Message:
        """Store a message durably and wake the sender. Returns once the file is on disk.

        :raises OSError: the outbox cannot be written (the caller decides how to report it).
        """
        with file_lock(self.directory / ".enqueue.lock"):
            now = self.clock.time()
            seq_path = self.directory / ".seq"
            last_ms, seq = 0, 0
            with contextlib.suppress(FileNotFoundError, ValueError):
                parts = seq_path.read_text(encoding="ascii").split()
                last_ms, seq = int(parts[0]), int(parts[1])
            # Never go back in time, so names keep sorting in enqueue order even if the clock
            # (or a restarted process's clock) is behind the last enqueue.
            ms = max(int(now * 1000), last_ms)
            seq += 1
            atomic_write(seq_path, f"{ms} {seq}\n".encode("ascii"), tmp_dir=self.tmp_dir)
            message = Message(
                id=f"{ms:013d}-{seq:010d}",
                transport=transport,
                payload=dict(payload),
                enqueued=now,
                summary=summary,
                next_attempt=now,
            )
            self._write(self.queue_dir, message)
        for watch in list(self._watches):
            watch._queued(message)
        self.wake()
        return message

    def watch(self) -> OutboxWatch:
        """Record each message queued here from now on, and its first attempt's answer,
        until the watch is closed (use it as a context manager)."""
        watch = OutboxWatch(self)
        self._watches.append(watch)
        return watch

    # --- reading ---------------------------------------------------------------------------

    def _read(self, path: Path) -> Message:
        return Message.read(path.read_bytes())

    def _list(self, folder: Path) -> list[Message]:
        found = []
        for path in sorted(folder.glob("*.json")):
            try:
                found.append(self._read(path))
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as exc:
                found.append(
                    Message(
                        id=path.stem,
                        transport="?",
                        payload={},
                        enqueued=0.0,
                        last_error=f"unreadable: {exc}",
                    )
                )
        return found

    def pending(self) -> list[Message]:
        """Messages waiting in the queue, oldest first."""
        return self._list(self.queue_dir)

    def dead(self) -> list[Message]:
        """Dead-lettered messages, oldest first."""
        return self._list(self.dead_dir)

    # --- delivering ------------------------------------------------------------------------

    def run_once(self, stop: threading.Event | None = None) -> PassResult:
        """One delivery pass over the queue, oldest first; skipped when another thread or
        process is delivering from this outbox right now (``skipped_busy``)."""
        if not self._pass_lock.acquire(blocking=False):
            return PassResult(skipped_busy=True)
        try:
            with file_lock(self.directory / ".deliver.lock", blocking=False) as got:
                if not got:
                    return PassResult(skipped_busy=True)
                return self._pass(stop)
        finally:
            self._pass_lock.release()

    def _pass(self, stop: threading.Event | None) -> PassResult:
        result = PassResult()
        blocked: set[str] = set()
        used: set[str] = set()
        try:
            for path in sorted(self.queue_dir.glob("*.json")):
                if stop is not None and stop.is_set():
                    break
                try:
                    message = self._read(path)
                except FileNotFoundError:
                    continue
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    self._bury_unreadable(path, exc)
                    result.dead += 1
                    continue
                if message.transport in blocked:
                    continue
                transport = self.transports.get(message.transport)
                if transport is None:
                    if message.transport not in self._warned_unknown:
                        self._warned_unknown.add(message.transport)
                        logger.warning(
                            "{}: no transport {!r} here; its messages wait",
                            self.name,
                            message.transport,
                        )
                    blocked.add(message.transport)
                    continue
                now = self.clock.time()
                if message.next_attempt > now:
                    if message.blocking:
                        blocked.add(message.transport)
                    continue
                used.add(message.transport)
                result.attempted += 1
                try:
                    delivery = transport.deliver(message)
                except Exception as exc:  # a transport bug must not kill the sender
                    logger.exception(
                        "{}: transport {} failed on {}", self.name, message.transport, message.id
                    )
                    delivery = Delivery("retry", f"internal error: {type(exc).__name__}")
                self._settle(path, message, delivery, now, result)
                if delivery.status == "retry" and delivery.blocking:
                    blocked.add(message.transport)
        finally:
            for name in used:
                with contextlib.suppress(Exception):
                    self.transports[name].finish()
        return result

    def _settle(
        self, path: Path, message: Message, delivery: Delivery, now: float, result: PassResult
    ) -> None:
        for watch in list(self._watches):
            watch._settled(message.id, delivery)
        if delivery.dead_payload is not None:
            part = replace(
                message,
                id=f"{message.id}-part{message.attempts + 1}",
                payload=dict(delivery.dead_payload),
                reply=delivery.reply,
                dead_at=now,
                attempts=message.attempts + 1,
            )
            self._write(self.dead_dir, part)
            logger.error(
                "{}: {} ({}) partly refused for good, kept in {}: {}",
                self.name,
                message.id,
                message.summary,
                self.dead_dir,
                delivery.reply,
            )
        if delivery.status == "sent" and delivery.retry_payload is None:
            path.unlink()
            fsync_dir(self.queue_dir)
            result.sent += 1
            logger.info("{}: delivered {} ({})", self.name, message.id, message.summary)
            return
        if delivery.status == "dead":
            self._bury(path, message, delivery.reply, now)
            result.dead += 1
            return
        # retry (possibly after a partial success)
        if delivery.status == "sent":
            result.sent += 1
        attempts = message.attempts + 1
        payload = (
            dict(delivery.retry_payload) if delivery.retry_payload is not None else message.payload
        )
        updated = replace(
            message,
            payload=payload,
            attempts=attempts,
            last_error=delivery.reply,
            blocking=delivery.blocking,
        )
        if now - message.enqueued >= self.retry_policy.max_age:
            reply = (
                f"gave up after {attempts} attempts over "
                f"{(now - message.enqueued) / 3600:.1f} h; last reply: {delivery.reply}"
            )
            self._bury(path, updated, reply, now)
            result.dead += 1
            return
        delay = self.retry_policy.delay(attempts)
        self._write(self.queue_dir, replace(updated, next_attempt=now + delay))
        result.retried += 1
        logger.warning(
            "{}: {} ({}) not delivered, attempt {}, next in {:.0f} s: {}",
            self.name,
            message.id,
            message.summary,
            attempts,
            delay,
            delivery.reply,
        )

    def _bury(self, path: Path, message: Message, reply: str, now: float) -> None:
        self._write(self.dead_dir, replace(message, reply=reply, dead_at=now))
        path.unlink()
        fsync_dir(self.queue_dir)
        logger.error(
            "{}: {} ({}) refused for good, moved to {}: {}",
            self.name,
            message.id,
            message.summary,
            self.dead_dir,
            reply,
        )

    def _bury_unreadable(self, path: Path, exc: Exception) -> None:
        target = self.dead_dir / path.name
        os.replace(path, target)
        fsync_dir(self.queue_dir)
        logger.error(
            "{}: unreadable message {} moved to {}: {}", self.name, path.name, self.dead_dir, exc
        )

    def flush(self, timeout: float = 30.0) -> FlushResult:
        """Deliver everything that is due now; return when nothing due is left or after
        ``timeout`` seconds of real time (the bound of a wait for another process's pass)."""
        total = PassResult()
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        while True:
            result = self.run_once()
            total.add(result)
            if not result.skipped_busy and result.attempted == 0:
                break
            if time.monotonic() >= deadline:
                break
            if result.skipped_busy:
                pause.wait(0.05)
        return FlushResult(total.sent, total.retried, total.dead, len(self.pending()))

    # --- the sender thread -----------------------------------------------------------------

    def wake(self) -> None:
        """Ask the sender thread (if running) to make a pass now."""
        self._sender.wake.set()

    def start(self) -> None:
        """Start the sender thread if it is not running. Idempotent."""
        with self._sender_lock:
            sender = self._sender
            if sender.thread is not None and sender.thread.is_alive():
                return
            sender.stop.clear()
            sender.thread = threading.Thread(
                target=self._run, args=(sender,), name=f"gridgate-{self.name}", daemon=True
            )
            sender.thread.start()

    def _run(self, sender: _Sender) -> None:
        while not sender.stop.is_set():
            sender.wake.clear()
            try:
                self.run_once(stop=sender.stop)
            except Exception:
                logger.exception("{}: delivery pass failed", self.name)
            sender.wake.wait(self.poll_interval)

    @property
    def running(self) -> bool:
        """True while the sender thread runs."""
        thread = self._sender.thread
        return thread is not None and thread.is_alive()

    def close(self, timeout: float = 60.0) -> None:
        """Stop the sender thread after the message in hand; the queue stays as it is."""
        with self._sender_lock:
            sender = self._sender
            sender.stop.set()
            sender.wake.set()
            thread = sender.thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("{}: sender thread still busy after {:.0f} s", self.name, timeout)

    # --- management (the ``gridgate outbox`` commands) -------------------------------------

    def retry(self, ids: list[str] | None = None) -> int:
        """Put dead-lettered messages (all, or ``ids``) back in the queue, due now, and make
        waiting ones (of ``ids``, or all) due now. Returns how many were touched."""
        touched = 0
        now = self.clock.time()
        with file_lock(self.directory / ".deliver.lock"):
            listed = [
                (folder, sorted(folder.glob("*.json")))
                for folder in (self.dead_dir, self.queue_dir)
            ]
            for folder, paths in listed:
                for path in paths:
                    if ids and path.stem not in ids:
                        continue
                    try:
                        message = self._read(path)
                    except (OSError, ValueError, KeyError, TypeError):
                        continue
                    fresh = replace(
                        message,
                        next_attempt=now,
                        blocking=False,
                        reply="",
                        dead_at=None,
                        attempts=0 if folder == self.dead_dir else message.attempts,
                        enqueued=now if folder == self.dead_dir else message.enqueued,
                    )
                    self._write(self.queue_dir, fresh)
                    if folder == self.dead_dir:
                        path.unlink()
                    touched += 1
        self.wake()
        return touched

    def purge(self, ids: list[str] | None = None, dead: bool = False, waiting: bool = False) -> int:
        """Delete messages: those named in ``ids``, and/or every dead or waiting one."""
        removed = 0
        with file_lock(self.directory / ".deliver.lock"):
            for folder, everything in ((self.dead_dir, dead), (self.queue_dir, waiting)):
                for path in sorted(folder.glob("*.json")):
                    if everything or (ids and path.stem in ids):
                        path.unlink()
                        removed += 1
                fsync_dir(folder)
        return removed


def configured_outbox(
    directory: str | os.PathLike[str],
    transports: Mapping[str, Transport],
    section: OutboxSettings | Mapping[str, Any],
    clock: Clock = SYSTEM_CLOCK,
    name: str = "outbox",
) -> Outbox:
    """An :class:`Outbox` whose retry policy and polling come from a notifier's settings.

    :param directory: the outbox folder (created 0700 if missing).
    :param transports: transport name -> the object that delivers its messages.
    :param section: the notifier's :class:`OutboxSettings` (or its section as written, with
        the keys of :data:`OUTBOX_SCHEMA_PROPERTIES`: missing ones take their defaults).
    :param clock: drives backoff and expiry (``context.clock``).
    :param name: how the outbox is named in log lines.
    """
    settings = (
        section
        if isinstance(section, OutboxSettings)
        else OutboxSettings.of({k: v for k, v in section.items() if k in OUTBOX_SCHEMA_PROPERTIES})
    )
    return Outbox(
        directory,
        transports,
        clock=clock,
        retry=RetryPolicy(settings.retry_initial, settings.retry_max, settings.max_age),
        poll_interval=settings.poll_interval,
        name=name,
    )
