"""A wall-clock deadline over a whole exchange that a library reads with per-read timeouts.

smtplib, redis-py, urllib3's connections (under :mod:`gridgate.core.http`) and a plain socket
take a ``timeout`` that bounds each read: a server that sends a byte every second before it
runs out (a greeting line by line, a reply a byte at a time) holds the caller for as long as
it likes. :func:`cut_after` runs ``action`` (close the
socket, disconnect the pool) when ``seconds`` have passed and the block has not ended, so the
blocked read fails at once; the caller then says the exchange did not finish in time.

One watchdog thread serves every cutoff of the process (started on first use), the HTTP
client's included: entering and leaving a block costs a lock and a heap push, not a thread,
so a state store may guard each call.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from loguru import logger

__all__ = ["Cutoff", "cut_after"]


@dataclass
class Cutoff:
    """One guarded block: ``fired`` is true once ``action`` ran (the block overran)."""

    deadline: float
    action: Callable[[], object]
    fired: bool = False
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Watchdog:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Cutoff]] = []
        self._wake = threading.Condition()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, cutoff: Cutoff) -> None:
        with self._wake:
            heapq.heappush(self._heap, (cutoff.deadline, next(self._order), cutoff))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="gridgate-cutoff", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is cutoff:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)  # ended in time: dropped lazily
                if not self._heap:
                    self._wake.wait(60)
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                _when, _n, due = heapq.heappop(self._heap)
            with due.lock:
                if due.done:
                    continue
                due.fired = True
            try:
                due.action()
            except Exception as exc:  # noqa: BLE001 - the watchdog must outlive any action
                logger.warning("a cutoff's action failed: {}", exc)


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def cut_after(seconds: float, action: Callable[[], object]) -> Iterator[Cutoff]:
    """Run ``action`` from the watchdog thread if the block is still running after
    ``seconds`` (wall clock). ``action`` must make the block's blocking call fail (shut a
    socket down, disconnect a pool); it is never run once the block has left.

    :param seconds: the whole exchange's budget.
    :param action: what cuts the exchange.
    """
    cutoff = Cutoff(time.monotonic() + max(0.0, seconds), action)
    _WATCHDOG.add(cutoff)
    try:
        yield cutoff
    finally:
        with cutoff.lock:
            cutoff.done = True
