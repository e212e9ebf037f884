"""Limits that follow the scheduler (``proxyd.adaptive``): a category's max lowered while the
controller is slow and raised again as it recovers.

Two signals. ``source: sdiag``, the controller's own: sdiag's cumulative count and total time
per RPC type, read every ``interval``; the latency of an interval is the time the controller
spent on the category's RPC types divided by how many it served in that interval (its thread
count and agent queue may count as "slow" too). ``source: tokens``, the daemon's own: the
median time the category's ordinary tokens returned in the interval were held, i.e. what a
gated command took end to end (the controller's service, the client's own work and whatever
they waited for); it needs no scheduler, so it serves LSF and Grid Engine as well. With
``light_window``, what light users get counts too: the median hold of the tokens of users who
were not busy (``busy_after``) returned in that many seconds is the latency when it is the
higher. The interval's median is the flood's when one user floods, and its commands run niced:
on a 2-core host its squeues came back within a 1.2x target while a light user's, beside them,
took 1.3-1.5x (docs/performance.md).

The rule is AIMD, as TCP's congestion window and Netflix's concurrency-limits ``AIMDLimit``:
above ``target_ms`` the max is multiplied by ``backoff`` (0.75) or, when the latency is further
over, by target / latency (so a limit far too high is cut in one step, not seven); after
``grow_after`` intervals in a row at or below the target it grows by one; never above ``max``
(nor the category's max in ``policies``) nor below ``min``. Why not Envoy's gradient: it
estimates the latency without load from its own requests (a minimum RTT measured while it
shrinks its concurrency now and then), and gives a limit proportional to that ratio. Here the
target is given, the latency is an interval's figure over every client of a shared controller
(gridgate's tokens are only part of its load), and shrinking the limit to measure would cost
every user of the site; AIMD needs only "above or below the target", is stable with a delayed
and noisy signal, and converges when several daemons (each applying it to its share) act on
the same readings. What AIMD costs is its probing: each step up past the knee is an interval
in which every user is slower; ``grow_after`` makes those probes rarer.

Whatever the signal, one ordinary user never holds more than the limit less ``reserve``
(default 1): the limit shrinks around a flood, and without the reserve a flooding user would
hold every token it leaves, so a light user would wait for a release (measured: that wait was
most of what the adaptive limit cost it, docs/performance.md).

:class:`AdaptiveLimit` is the pure rule for one category; :class:`AdaptiveLimits` runs them in
the daemon and hands the current maxima to its settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loguru import logger

from gridgate.core.patterns import clip
from gridgate.core.scheduler import SchedulerRPCs
from gridgate.core.state import StateStore
from gridgate.plugins.lsf_proxy.commands import COMMANDS, QUERY
from gridgate.plugins.lsf_proxy.config import TOKENS, Limits
from gridgate.plugins.lsf_proxy.schedulers import ask, load_scheduler
from gridgate.plugins.lsf_proxy.settings import AdaptiveSettings, ProxydSettings

#: RPC types a category's commands make beyond their own opcode (squeue also asks for the
#: partitions, measured on 22.05).
EXTRA_TYPES = {QUERY: ("REQUEST_PARTITION_INFO", "REQUEST_JOB_INFO_SINGLE")}
#: ``light_window``: the fewest light users' holds that make a signal.
LIGHT_MIN = 3
#: Never part of the signal: the daemon's own reading of the statistics.
OWN_TYPES = frozenset({"REQUEST_STATS_INFO"})


def category_types(category: str) -> tuple[str, ...]:
    """The Slurm RPC types the category's commands make: their ``REQUEST_*`` opcodes."""
    own = {row.opcode for row in COMMANDS.values() if row.category == category and row.opcode}
    every = own | set(EXTRA_TYPES.get(category, ()))
    return tuple(sorted(t for t in every if t.startswith("REQUEST_") and t not in OWN_TYPES))


@dataclass(frozen=True)
class Decision:
    """One interval's verdict: the latency seen, the max before and after, and why."""

    at: float
    latency_ms: float | None
    requests: int
    before: int
    after: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 3),
            "requests": self.requests,
            "before": self.before,
            "after": self.after,
            "reason": self.reason,
        }


@dataclass
class AdaptiveLimit:
    """The AIMD rule for one category, on readings handed to it. ``ceiling`` is the
    category's max in ``policies``: the limit never goes above it either."""

    category: str
    settings: AdaptiveSettings
    ceiling: int
    limit: int = 0
    last: SchedulerRPCs | None = None
    decisions: list[Decision] = field(default_factory=list)
    #: one ordinary user's cap as last applied (None: no cap)
    user_max: int | None = None
    #: intervals in a row within the target since the max last moved
    good: int = 0

    #: the RPC types whose time counts: those given, or the category's commands'
    rpc_types: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.rpc_types = self.settings.rpc_types or category_types(self.category)
        if not self.limit:
            self.limit = self.top  # start where the configuration puts it, lower on signal

    @property
    def top(self) -> int:
        return max(self.settings.low, min(self.settings.high, self.ceiling))

    def observe(self, reading: SchedulerRPCs, at: float) -> Decision | None:
        """The decision for the interval ending with ``reading``; None for no signal (the
        first reading, a reset of the counters, an unread controller)."""
        if not reading.ok:
            return None
        last, self.last = self.last, reading
        if last is None or reading.since != last.since:
            return None
        count = 0
        total = 0.0
        for name in self.rpc_types:
            now, then = reading.by_type.get(name), last.by_type.get(name)
            if now is None:
                continue
            d_count = now.count - (then.count if then else 0)
            d_total = now.total_ms - (then.total_ms if then else 0.0)
            if d_count < 0 or d_total < 0:  # counters dropped: a new baseline
                return None
            count += d_count
            total += d_total
        latency = total / count if count else None
        slow = []
        threads = reading.load.get("server_threads")
        if self.settings.max_server_threads is not None and threads is not None:
            if threads > self.settings.max_server_threads:
                slow.append(f"{threads:g} server threads")
        queue = reading.load.get("agent_queue")
        if self.settings.max_agent_queue is not None and queue is not None:
            if queue > self.settings.max_agent_queue:
                slow.append(f"agent queue {queue:g}")
        return self._decide(latency, count, f"average over {count} RPCs", slow, at)

    def observe_holds(
        self, holds: list[float], at: float, light: list[float] | None = None
    ) -> Decision:
        """The decision for an interval in which the category's tokens came back after
        ``holds`` seconds each (``source: tokens``): their median is the latency; or, with
        ``light_window``, the median of ``light`` (the holds of light users' tokens in that
        window, when there are :data:`LIGHT_MIN` of them) when it is the higher."""
        count = len(holds)
        latency = statistics.median(holds) * 1000 if holds else None
        what = f"median hold of {count} tokens"
        if light is not None and len(light) >= LIGHT_MIN and latency is not None:
            seen = statistics.median(light) * 1000
            if seen > latency:
                window = self.settings.light_window or 0
                latency = seen
                what = f"median hold of {len(light)} light users' tokens in {window:g} s"
        return self._decide(latency, count, what, [], at)

    def _decide(
        self, latency: float | None, count: int, what: str, slow: list[str], at: float
    ) -> Decision:
        signal = latency is not None and count >= self.settings.min_requests
        #: the latency over the target, when it is a signal
        over = latency if signal and latency and latency > self.settings.target_ms else None
        if over is not None:
            slow.insert(0, f"{over:.1f} ms {what}")
        before = min(self.limit, self.top)
        if not slow and signal:
            self.good += 1
        else:
            self.good = 0
        if slow:
            factor = self.settings.backoff
            if over is not None:
                factor = min(factor, self.settings.target_ms / over)
            after = max(self.settings.low, int(before * factor))
            reason = f"slow: {', '.join(slow)} (target {self.settings.target_ms:g} ms)"
        elif not signal:
            unit = (
                "tokens returned"
                if self.settings.source == TOKENS
                else "RPCs of the category's types"
            )
            after, reason = before, f"no signal: {count} {unit}"
        elif self.good >= self.settings.grow_after:
            self.good = 0
            after = min(self.top, before + 1)
            reason = f"{latency:.1f} ms {what}, within the target"
        else:
            after = before
            reason = (
                f"{latency:.1f} ms {what}, within the target "
                f"({self.good} of {self.settings.grow_after} intervals before it grows)"
            )
        self.limit = after
        decision = Decision(at, latency, count, before, after, reason)
        self.decisions = [*self.decisions[-19:], decision]
        return decision

    def cap(self, limits: Limits) -> Limits:
        """``limits`` with the max lowered to the current limit (nominal not above it) and
        one user's share kept ``reserve`` tokens under it: a flood of one user, which the
        limit shrinks around, never leaves a newcomer waiting for its release."""
        top = min(limits.max, max(self.settings.low, self.limit))
        share = min(limits.per_user, top)
        room = max(1, top - self.settings.reserve)
        user_max = room if room < share else (None if limits.user_max is None else share)
        self.user_max = user_max
        if top >= limits.max and user_max == limits.user_max:
            return limits
        return replace(limits, max=top, nominal=min(limits.nominal, top), user_max=user_max)

    def status(self) -> dict[str, Any]:
        last = self.decisions[-1] if self.decisions else None
        return {
            "source": self.settings.source,
            "limit": self.limit,
            "min": self.settings.low,
            "max": self.top,
            "reserve": self.settings.reserve,
            "user_max": self.user_max,
            "target_ms": self.settings.target_ms,
            "rpc_types": list(self.rpc_types),
            "last": last.to_json() if last else None,
            "decisions": [d.to_json() for d in self.decisions[-5:]],
        }


class AdaptiveLimits:
    """The adaptive maxima of one daemon: one :class:`AdaptiveLimit` per category in
    ``proxyd.adaptive``, fed from one reading of the controller per tick.

    ``changed`` is called (from the event loop) when a max changed, so the daemon reapplies
    its settings; :meth:`cap` is what those settings use.
    """

    def __init__(
        self,
        settings: ProxydSettings,
        folder: Path,
        changed: Any,
        manager: Any = None,
        config_folder: Path | None = None,
        holds: Callable[[str], list[float]] | None = None,
        state: StateStore | None = None,
        light: Callable[[str, float], list[float]] | None = None,
    ) -> None:
        """``settings``: the daemon's; the entries of ``adaptive``, capped by the limits of
        ``policies``, reading the scheduler of :attr:`ProxydSettings.adaptive_scheduler`
        with ``bypass.scheduler_options`` and ``bypass.audit.timeout``; ``state``: the store
        the daemons share, if they do, for the scheduler plugin's journal."""
        ceilings = settings.limits
        self.limits = {
            c: AdaptiveLimit(c, entry, ceilings[c].max)
            for c, entry in settings.adaptive.entries().items()
        }
        self.scheduler = settings.adaptive_scheduler
        self.manager = manager
        if settings.adaptive.read_sources() and manager is None:
            self.manager = load_scheduler(
                self.scheduler,
                settings.bypass.scheduler_options,
                folder,
                config_folder,
                state=state,
            )
        #: the hold times of a category's tokens since the last call (the daemon's policy)
        self.holds = holds or (lambda category: [])
        #: the holds of light users' tokens of a category in the last seconds given
        self.light = light or (lambda category, window: [])
        self.timeout = settings.bypass.timeout
        self.changed = changed
        self.problem = ""

    @property
    def tick(self) -> float:
        return min(lim.settings.interval for lim in self.limits.values())

    def cap(self, limits: Mapping[str, Limits]) -> dict[str, Limits]:
        out = dict(limits)
        for category, limit in self.limits.items():
            limit.ceiling = limits[category].max
            out[category] = limit.cap(limits[category])
        return out

    def read(self) -> SchedulerRPCs:
        name = self.scheduler
        return ask(
            self.manager,
            "gridgate_scheduler_rpcs",
            lambda why: SchedulerRPCs(name, ok=False, message=why),
            scheduler=name,
            timeout=self.timeout,
        )

    def decide(
        self, reading: SchedulerRPCs | None, due: set[str], at: float
    ) -> list[tuple[str, bool]]:
        """Feed the categories ``due`` now, ``reading`` (None: no category due reads the
        scheduler) or their tokens' hold times; the log lines of the changes, each with
        whether it brought the limit down to its ``low`` (a WARNING: the controller is slow
        however few requests pass; every other step is INFO, the loop doing its work)."""
        lines = []
        for category in sorted(due):
            limit = self.limits[category]
            if limit.settings.source == TOKENS:
                window = limit.settings.light_window
                light = None if window is None else self.light(category, window)
                decision: Decision | None = limit.observe_holds(self.holds(category), at, light)
            elif reading is None:
                continue
            elif not reading.ok:
                if reading.message != self.problem:
                    logger.error(
                        "proxyd.adaptive: cannot read {}'s statistics: {} (the maxima stay)",
                        self.scheduler,
                        clip(reading.message),
                    )
                self.problem = reading.message
                continue
            else:
                self.problem = ""
                decision = limit.observe(reading, at)
            if decision is not None and decision.after != decision.before:
                floor = decision.after < decision.before and decision.after <= limit.settings.low
                lines.append(
                    (
                        f"{category} max {decision.before} -> {decision.after}: "
                        f"{decision.reason}" + (" (its low)" if floor else ""),
                        floor,
                    )
                )
        return lines

    async def run(self, stop: asyncio.Event) -> None:
        for category, limit in sorted(self.limits.items()):
            source = limit.settings.source
            logger.info(
                "proxyd.adaptive: {} follows {}",
                category,
                "its tokens' hold times" if source == TOKENS else f"{self.scheduler}'s {source}",
            )
        next_at = {c: 0.0 for c in self.limits}
        while not stop.is_set():
            now = time.monotonic()
            due = {c for c, t in next_at.items() if t <= now}
            if due:
                asks = any(self.limits[c].settings.source != TOKENS for c in due)
                reading = await asyncio.to_thread(self.read) if asks else None
                lines = self.decide(reading, due, time.time())
                for category in due:
                    next_at[category] = now + self.limits[category].settings.interval
                for line, floor in lines:
                    logger.log("WARNING" if floor else "INFO", "proxyd.adaptive: {}", line)
                if lines:
                    self.changed()
            wait = max(0.05, min(next_at.values()) - time.monotonic())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    def status(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler,
            "problem": self.problem,
            **{c: lim.status() for c, lim in sorted(self.limits.items())},
        }
