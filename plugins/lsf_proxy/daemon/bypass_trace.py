"""``lsfproxyd diagnose on -c bypass``: for a bounded window the scheduler's controller logs
every request (Slurm's ``DebugFlags=Protocol``, the counterpart of LSF's ``LSB_DEBUG_MBD``),
and the daemon writes each one to its diagnostic log with whether its user held a token then
(the seed's ``LSF_DEBUG_PROXYD`` class for token-less requests).

:class:`HeldLedger` keeps when each token was held (wall clock: the controller's log is on
the wall clock); :class:`RequestTrace` switches the trace on through the
``gridgate_scheduler_trace`` hook, reads ``gridgate_scheduler_requests`` while it lasts, and
switches it back however the window ends (its time is up, ``diagnose off -c bypass``, the
daemon stops; a daemon killed during a trace ends it when it starts again; an end that failed
is tried again at each audit).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import Any

from loguru import logger

from gridgate.core.patterns import clip
from gridgate.core.scheduler import SchedulerChange, SchedulerRequest, SchedulerRequests
from gridgate.plugins.lsf_proxy.daemon.diagnose import log_field, stamp
from gridgate.plugins.lsf_proxy.daemon.policy import Token
from gridgate.plugins.lsf_proxy.schedulers import ask

#: Seconds around a token's grant and return within which a request still counts as covered:
#: the controller's log has milliseconds, and the gate takes its token just before the command.
SLACK = 0.25
#: How long a returned token is remembered (a trace reads the log every second).
KEEP = 120.0
#: The longest bypass diagnosis, in minutes (the default when none is given: 10).
MAX_MINUTES = 60.0
DEFAULT_MINUTES = 10.0
#: Seconds between two reads of the controller's log during a trace.
READ_EVERY = 1.0


class HeldLedger:
    """When each user held a token: (granted, returned) on the wall clock, live ones open."""

    def __init__(self) -> None:
        self._spans: dict[str, tuple[str, float, float | None]] = {}

    def granted(self, token: Token) -> None:
        self._spans[token.id] = (token.user, time.time(), None)

    def released(self, token: Token) -> None:
        span = self._spans.get(token.id)
        if span is not None:
            self._spans[token.id] = (span[0], span[1], time.time())
        self._prune()

    def _prune(self) -> None:
        old = time.time() - KEEP
        for key in [k for k, (_, _, end) in self._spans.items() if end is not None and end < old]:
            del self._spans[key]

    def held(self, user: str, at: float) -> bool:
        now = time.time()
        return any(
            who == user and start - SLACK <= at <= (now if end is None else end) + SLACK
            for who, start, end in self._spans.values()
        )


def request_line(request: SchedulerRequest, held: bool) -> str:
    """A controller's request in the request lines' columns: ``Dec 3 13:37:05 2026
    SCHEDULER_REQ,REQUEST_JOB_INFO,user1,10.0.0.7,0,HELD,133705,133705`` (HELD: 1 when its
    user held a token at that moment, 0 when it went around the gate)."""
    hhmmss = time.strftime("%H%M%S", time.localtime(request.at))
    fields = [
        "SCHEDULER_REQ",
        log_field(request.opcode) or "-",
        log_field(request.user) or "-",
        log_field(request.host) or "-",
        "0",
        "1" if held else "0",
        hhmmss,
        hhmmss,
    ]
    return f"{stamp(request.at)} {','.join(fields)}"


class RequestTrace:
    """The bypass class of ``diagnose``, for one daemon's :class:`BypassWatch` (``watch``)."""

    def __init__(self, watch: Any) -> None:
        self.watch = watch
        self.ledger = HeldLedger()
        self.until: float | None = None  # wall clock
        self.on = False
        self.problem = ""
        self.requests = 0
        self.without_token = 0
        #: the window ended and the controller's flags could not be put back: tried again by
        #: :meth:`retry_off` at each audit (the scheduler plugin's journal keeps what to undo)
        self.left_on = False
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def _hook(self, on: bool) -> SchedulerChange:
        name = self.watch.settings.scheduler
        return ask(
            self.watch.manager,
            "gridgate_scheduler_trace",
            lambda why: SchedulerChange(name, ok=False, message=why),
            scheduler=name,
            on=on,
            timeout=self.watch.settings.timeout,
        )

    def _read(self) -> SchedulerRequests:
        name = self.watch.settings.scheduler
        return ask(
            self.watch.manager,
            "gridgate_scheduler_requests",
            lambda why: SchedulerRequests(name, ok=False, message=why),
            scheduler=name,
            timeout=self.watch.settings.timeout,
        )

    async def clean_start(self) -> None:
        """End a trace a killed daemon left on (a no-op when there is none)."""
        change = await asyncio.to_thread(self._hook, False)
        if change.ok and change.changed:
            logger.warning("proxyd.bypass: a request trace left on was ended: {}", change.message)

    def start(self, minutes: float | None) -> float:
        """Start (or lengthen) the window; its end on the wall clock.

        :raises ValueError: more than :data:`MAX_MINUTES`.
        """
        minutes = DEFAULT_MINUTES if minutes is None else minutes
        if minutes > MAX_MINUTES:
            raise ValueError(
                f"a bypass diagnosis lasts at most {MAX_MINUTES:g} minutes: every request "
                "the controller serves is logged meanwhile"
            )
        self.until = time.time() + minutes * 60
        if self._task is None or self._task.done():
            self._stop = asyncio.Event()
            self._task = asyncio.ensure_future(self._run())
        return self.until

    def stop(self) -> None:
        """End the window now (``diagnose off -c bypass``)."""
        self._stop.set()

    async def finish(self, timeout: float) -> None:
        """The daemon stops: end the trace, switching the controller's flags back."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout)

    async def _run(self) -> None:
        change = await asyncio.to_thread(self._hook, True)
        if not change.ok:
            self.problem = change.message
            self.until = None
            logger.error("proxyd.bypass: no request trace: {}", clip(change.message))
            return
        self.on, self.problem = True, ""
        logger.info(
            "proxyd.bypass: request trace on until {}: {}", stamp(self.until or 0), change.message
        )
        try:
            while not self._stop.is_set() and time.time() < (self.until or 0):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), READ_EVERY)
                await self._take()
        finally:
            await self._take()
            back = await asyncio.to_thread(self._hook, False)
            # on until the controller's flags are back (or could not be put back)
            self.on, self.until = False, None
            self.left_on = not back.ok
            if back.ok:
                logger.info("proxyd.bypass: request trace off: {}", back.message)
            else:
                self.problem = back.message
                logger.error(
                    "proxyd.bypass: the request trace could not be switched off: {} "
                    "(tried again at the next audit)",
                    clip(back.message),
                )

    async def retry_off(self) -> None:
        """Put the controller's flags back after a window whose end could not (called at
        every audit; nothing when no end failed)."""
        if not self.left_on or self.on:
            return
        back = await asyncio.to_thread(self._hook, False)
        if back.ok:
            self.left_on, self.problem = False, ""
            logger.info("proxyd.bypass: request trace off at last: {}", back.message)
        elif back.message != self.problem:
            self.problem = back.message
            logger.error("proxyd.bypass: the request trace is still on: {}", clip(back.message))

    async def _take(self) -> None:
        got = await asyncio.to_thread(self._read)
        if not got.ok:
            if got.message != self.problem:
                logger.error("proxyd.bypass: request trace: {}", clip(got.message))
            self.problem = got.message
            return
        self.write(got.requests)

    def write(self, requests: Iterable[SchedulerRequest]) -> None:
        log = self.watch.daemon.diagnostics
        for request in requests:
            held = self.ledger.held(request.user, request.at)
            self.requests += 1
            if not held and not self.watch.exempt(request.user):  # root needs none
                self.without_token += 1
            if log.on:
                log.write(request_line(request, held))

    def status(self) -> dict[str, Any]:
        return {
            "on": self.on,
            "until": self.until,
            "requests": self.requests,
            "without_token": self.without_token,
            "problem": self.problem,
        }
