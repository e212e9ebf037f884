"""A rate as well as a concurrency: per-user token buckets in front of the token policy.

max / nominal / throttle bound how many requests run at once; they do not bound how often one
user may ask. This adds Slurm's per-user rate limit (slurmctld 23.02: ``rl_enable``,
``rl_bucket_size``, ``rl_refill_rate``, ``rl_refill_period``) per category: every user has a
bucket of ``bucket_size`` requests that gains ``refill_rate`` every ``refill_period`` seconds.
A request finding its user's bucket empty waits (FIFO per user) until the bucket refills; one
that has waited ``token_wait_time`` is denied (reason ``rate_limited``, its own metrics row).
A request that gets through then queues for a token as before, and its time in both stages
counts against the one wait limit. Buckets are per user, so one user's flood never uses
another's rate; root, admins and add-on hosts are not rate limited (the seed exempts them from
every limit). Time comes from the policy's injected clock.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gridgate.plugins.lsf_proxy.config import CATEGORIES
from gridgate.plugins.lsf_proxy.daemon.policy import (
    PROCEED,
    QUEUED,
    BlockRule,
    Decision,
    PolicySettings,
    Request,
    TickResult,
    TokenPolicy,
)
from gridgate.plugins.lsf_proxy.settings import RateLimits

#: Evict idle full buckets once this many are kept (they are the same as a new bucket).
_SWEEP_AT = 4096


@dataclass(frozen=True)
class RateLimit:
    """One category's bucket shape in force (``proxyd.rate_limit``, this daemon's share)."""

    bucket_size: float
    refill_rate: float
    refill_period: float


def rate_limits_from(settings: RateLimits, daemons: int = 1) -> dict[str, RateLimit]:
    """The enabled rate limits of ``proxyd.rate_limit``, split over ``daemons`` live daemons
    (as max and nominal are: a user spread over them gets the configured rate in all). A
    share of the bucket is never below one request, or nobody could ever be served."""
    return {
        category: RateLimit(
            max(1.0, spec.bucket_size / daemons),
            spec.refill_rate / daemons,
            spec.refill_period,
        )
        for category, spec in settings.enabled().items()
    }


@dataclass(frozen=True)
class RatedSettings(PolicySettings):
    """:class:`PolicySettings` with the rate limits per category."""

    rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)

    @classmethod
    def extend(cls, base: PolicySettings, rate_limits: Mapping[str, RateLimit]) -> RatedSettings:
        values = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        values["rate_limits"] = dict(rate_limits)
        return cls(**values)


class Bucket:
    """One user's bucket: full at first, refilled in whole periods (as slurmctld does)."""

    __slots__ = ("tokens", "last")

    def __init__(self, limit: RateLimit, now: float) -> None:
        self.tokens = limit.bucket_size
        self.last = now

    def refill(self, limit: RateLimit, now: float) -> None:
        period = limit.refill_period
        periods = int((now - self.last) // period)
        # the same expression next_token() reports, so a wakeup at that instant refills
        while now >= self.last + (periods + 1) * period:
            periods += 1
        if periods > 0:
            self.tokens += periods * limit.refill_rate
            self.last += periods * period
        # also when the bucket shrank (a reload, another daemon joining)
        self.tokens = min(limit.bucket_size, self.tokens)

    def take(self, limit: RateLimit, now: float) -> bool:
        self.refill(limit, now)
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def next_token(self, limit: RateLimit) -> float:
        """When (monotonic) the bucket next holds a whole request."""
        if self.tokens >= 1:
            return self.last
        periods = -(-(1 - self.tokens) // limit.refill_rate)  # ceil
        return self.last + max(1, int(periods)) * limit.refill_period

    def full(self, limit: RateLimit) -> bool:
        return self.tokens >= limit.bucket_size


class _Waiting:
    __slots__ = ("request", "received", "received_wall")

    def __init__(self, request: Request, received: float, received_wall: float) -> None:
        self.request = request
        self.received = received
        self.received_wall = received_wall


class RateLimitedPolicy(TokenPolicy):
    """A :class:`TokenPolicy` whose settings may carry rate limits (:class:`RatedSettings`);
    with none it behaves exactly as the plain policy."""

    def __init__(self, settings: PolicySettings, *args: Any, **kwargs: Any) -> None:
        super().__init__(settings, *args, **kwargs)
        self._rates: dict[str, RateLimit] = dict(getattr(settings, "rate_limits", {}))
        self._buckets: dict[str, dict[str, Bucket]] = {c: {} for c in CATEGORIES}
        self._rate_queues: dict[str, dict[str, deque[_Waiting]]] = {c: {} for c in CATEGORIES}
        self._rate_pending: dict[str, tuple[str, _Waiting]] = {}

    def rate_limit(self, category: str) -> RateLimit | None:
        return self._rates.get(category)

    def reconfigure(self, settings: PolicySettings) -> None:
        super().reconfigure(settings)
        self._rates = dict(getattr(settings, "rate_limits", {}))

    def _bucket(self, category: str, user: str, limit: RateLimit, now: float) -> Bucket:
        buckets = self._buckets[category]
        bucket = buckets.get(user)
        if bucket is None:
            if len(buckets) >= _SWEEP_AT:
                self._sweep(category, limit, now)
            bucket = buckets[user] = Bucket(limit, now)
        return bucket

    def _sweep(self, category: str, limit: RateLimit, now: float) -> None:
        buckets, queues = self._buckets[category], self._rate_queues[category]
        for user in list(buckets):
            bucket = buckets[user]
            bucket.refill(limit, now)
            if bucket.full(limit) and user not in queues:
                del buckets[user]

    # -- requests

    def request(self, req: Request, now: float | None = None) -> Decision:
        limit = self._rates.get(req.category)
        if limit is None:  # the plain policy's path, at its cost
            return super().request(req, now)
        now = self._now(now)
        cat = self.categories.get(req.category)
        if (
            cat is None
            or not cat.enabled
            or self.is_blocked(req.user, req.host)
            or self.is_privileged(req.user, req.host)
        ):
            return super().request(req, now)
        if req.id in self._rate_pending:
            raise ValueError(f"request id {req.id!r} is already waiting")
        queues = self._rate_queues[req.category]
        waiting = queues.get(req.user)
        if not waiting and self._bucket(req.category, req.user, limit, now).take(limit, now):
            return super().request(req, now)
        wall = self._wall(now)
        if waiting is not None and len(waiting) >= self.settings.queue_limit_per_user:
            return self._deny(req, "queue_full", now, now, wall)
        item = _Waiting(req, now, wall)
        queues.setdefault(req.user, deque()).append(item)
        self._rate_pending[req.id] = (req.category, item)
        return Decision(req, QUEUED, received=wall, decided=wall)

    def _enter(self, item: _Waiting, now: float) -> Decision | None:
        """Pass a request the bucket now admits on to the token queue, its wait so far kept."""
        decision = super().request(item.request, now)
        if decision.outcome == QUEUED:
            entry = self._pending.get(item.request.id)
            if entry is not None:
                entry[1].received = item.received
                entry[1].received_wall = item.received_wall
            return None
        return dataclasses.replace(
            decision, received=item.received_wall, waited=now - item.received
        )

    def _end(self, item: _Waiting, now: float, outcome: str, reason: str) -> Decision:
        req = item.request
        self._rate_pending.pop(req.id, None)
        if outcome == PROCEED:
            return Decision(
                req,
                PROCEED,
                reason=reason,
                received=item.received_wall,
                decided=self._wall(now),
                waited=now - item.received,
            )
        if reason == "rate_limited":
            self.metrics.count(f"ratelimited.{req.category}", now)
        return self._deny(req, reason, now, item.received, item.received_wall)

    def tick(self, now: float | None = None) -> TickResult:
        if not self._rate_pending:
            return super().tick(now)
        now = self._now(now)
        wait = self.settings.token_wait_time
        decisions: list[Decision] = []
        for category, queues in self._rate_queues.items():
            limit = self.rate_limit(category)
            for user in list(queues):
                waiting = queues[user]
                while waiting and now - waiting[0].received >= wait:
                    decisions.append(self._end(waiting.popleft(), now, "denied", "rate_limited"))
                if limit is None:  # the limit was configured away: let them all through
                    passed = len(waiting)
                else:
                    bucket = self._bucket(category, user, limit, now)
                    passed = 0
                    while passed < len(waiting) and bucket.take(limit, now):
                        passed += 1
                for _ in range(passed):
                    item = waiting.popleft()
                    self._rate_pending.pop(item.request.id, None)
                    decision = self._enter(item, now)
                    if decision is not None:
                        decisions.append(decision)
                if not waiting:
                    del queues[user]
        result = super().tick(now)
        if not decisions:
            return result
        return TickResult((*decisions, *result.decisions), result.expired)

    def next_wakeup(self, now: float | None = None) -> float | None:
        if not self._rate_pending:
            return super().next_wakeup(now)
        now = self._now(now)
        times: list[float] = []
        base = super().next_wakeup(now)
        if base is not None:
            times.append(base)
        wait = self.settings.token_wait_time
        for category, queues in self._rate_queues.items():
            limit = self.rate_limit(category)
            for user, waiting in queues.items():
                times.append(waiting[0].received + wait)
                bucket = self._buckets[category].get(user)
                times.append(now if limit is None or bucket is None else bucket.next_token(limit))
        return min(times) if times else None

    def cancel(self, request_id: str) -> bool:
        entry = self._rate_pending.pop(request_id, None)
        if entry is None:
            return super().cancel(request_id)
        category, item = entry
        queues = self._rate_queues[category]
        waiting = queues.get(item.request.user)
        if waiting is not None:
            waiting.remove(item)
            if not waiting:
                del queues[item.request.user]
        return True

    def _drain(
        self, categories: tuple[str, ...], now: float, keep: Any, outcome: str, reason: str
    ) -> list[Decision]:
        out: list[Decision] = []
        for category in categories:
            queues = self._rate_queues[category]
            for user in list(queues):
                left = deque(i for i in queues[user] if keep(i))
                out += [self._end(i, now, outcome, reason) for i in queues[user] if not keep(i)]
                if left:
                    queues[user] = left
                else:
                    del queues[user]
        return out

    # -- admin

    def set_enabled(self, category: str, enabled: bool, now: float | None = None) -> list[Decision]:
        now = self._now(now)
        out = super().set_enabled(category, enabled, now)
        if not enabled:
            names = CATEGORIES if category == "all" else (category,)
            out += self._drain(names, now, lambda _i: False, PROCEED, "disabled")
        return out

    def block(
        self, rule: BlockRule, now: float | None = None, by: str = ""
    ) -> tuple[tuple[BlockRule, ...], list[Decision]]:
        now = self._now(now)
        added, out = super().block(rule, now, by)
        out += self._drain(
            CATEGORIES,
            now,
            lambda i: not self.is_blocked(i.request.user, i.request.host),
            "denied",
            "blocked",
        )
        return added, out

    def shutdown(self, now: float | None = None) -> list[Decision]:
        now = self._now(now)
        out = self._drain(CATEGORIES, now, lambda _i: False, "denied", "shutdown")
        return out + super().shutdown(now)

    def ahead(self, request_id: str) -> int:
        """How many requests wait before one just queued: its user's earlier ones when it
        waits for the rate, else everyone queued for a token (it is the last of them)."""
        entry = self._rate_pending.get(request_id)
        if entry is not None:
            category, item = entry
            return self._rate_queues[category][item.request.user].index(item)
        pending = self._pending.get(request_id)
        if pending is None:
            return 0
        return max(0, self.categories[pending[0]].queue.size - 1)

    def has_waiters(self) -> bool:
        return bool(self._rate_pending) or super().has_waiters()

    def status(self, now: float | None = None) -> dict[str, Any]:
        now = self._now(now)
        status = super().status(now)
        for category, row in status["categories"].items():
            row["rate_waiting"] = sum(len(q) for q in self._rate_queues[category].values())
        status["rate_limits"] = {
            c: {**dataclasses.asdict(limit), "users": len(self._buckets[c])}
            for c in CATEGORIES
            if (limit := self.rate_limit(c)) is not None
        }
        return status
