"""The token policy of the admission controller: pure state and rules, time from an injected clock.

No sockets and no threads here: the daemon (asyncio), the thread-safe :class:`LocalTokens`
wrapper and the tests all drive the same :class:`TokenPolicy`. A request is answered at once
(granted, denied, proceed without a token) or queued; :meth:`TokenPolicy.tick` later turns
queued requests into grants or denials and takes back expired leases, and
:meth:`TokenPolicy.next_wakeup` says when the next tick has something to do.
"""

from __future__ import annotations

import itertools
import math
import secrets
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import Any

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.plugins.lsf_proxy.config import CATEGORIES, Limits
from gridgate.plugins.lsf_proxy.settings import ProxydSettings

GRANTED = "granted"
QUEUED = "queued"
DENIED = "denied"
PROCEED = "proceed"  # category disabled: go ahead without a token

#: Metric rows of the status table, in the seed's order.
METRIC_NAMES: tuple[str, ...] = (
    *(f"requests.{c}" for c in CATEGORIES),
    *(f"rejected.{c}" for c in CATEGORIES),
    "blocked",
    "error",
    # denied for being over a user's rate (ratelimit.py); shown only where a rate is set
    *(f"ratelimited.{c}" for c in CATEGORIES),
)


@dataclass(frozen=True)
class Request:
    """One token request. ``id`` is unique among the requests a policy has pending."""

    id: str
    category: str
    opcode: str = ""
    user: str = ""
    host: str = ""
    size: int = 0


@dataclass(frozen=True)
class Token:
    """A granted token; ``expires_at`` is on the monotonic clock."""

    id: str
    category: str
    user: str
    host: str
    privileged: bool
    expires_at: float
    opcode: str = ""
    granted: float = 0.0  # monotonic, like expires_at
    #: a ride (:meth:`TokenPolicy.ride`): the token whose slot this one shares, else ""
    rides: str = ""


@dataclass(frozen=True)
class Decision:
    """The answer to a request. ``reason`` explains a denial (``blocked``, ``timeout``,
    ``queue_full``, ``shutdown``) or a proceed (``disabled``). Times: ``received``/``decided``
    are wall-clock epoch seconds; ``waited`` is seconds spent queued."""

    request: Request
    outcome: str
    token: Token | None = None
    reason: str = ""
    received: float = 0.0
    decided: float = 0.0
    waited: float = 0.0

    @property
    def final(self) -> bool:
        return self.outcome != QUEUED


@dataclass(frozen=True)
class TickResult:
    """What a tick decided: answers for queued requests, and leases taken back."""

    decisions: tuple[Decision, ...] = ()
    expired: tuple[Token, ...] = ()


# --- block rules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockRule:
    """What one ``block``/``unblock`` command names. ``kind`` is ``all``, ``users``, ``hosts``
    or ``pairs``; ``items`` holds the names in the order given (``user@host`` for pairs).

    Each named element is a rule of its own (:meth:`elements`): ``block -u "user1 user2"``
    blocks the user user1 and the user user2, and ``unblock -u user1`` then removes the first
    and leaves the second, as the seed's examples do. A user rule and a user@host rule are of
    different kinds: unblocking user1 leaves user1@host1 blocked.
    """

    kind: str
    items: tuple[str, ...] = ()

    @classmethod
    def make(
        cls, all_: bool = False, users: Iterable[str] = (), hosts: Iterable[str] = ()
    ) -> BlockRule:
        """The rule ``block [all] [-u users] [-m hosts]`` means.

        :raises ValueError: ``all`` with users or hosts, or nothing at all.
        """
        users, hosts = _unique(u for u in users if u), _unique(h for h in hosts if h)
        # "a b" would print as two names in "Users <a b>" and "u@h" would read as a pair:
        # refuse names an administrator could not tell apart in the blocklist
        odd = [n for n in (*users, *hosts) if any(c.isspace() for c in n) or "@" in n]
        if odd:
            raise ValueError(f"names cannot contain spaces or '@': {', '.join(map(repr, odd))}")
        if all_:
            if users or hosts:
                raise ValueError("'all' cannot be combined with -u or -m")
            return cls("all")
        if users and hosts:
            return cls("pairs", tuple(f"{u}@{h}" for u in users for h in hosts))
        if users:
            return cls("users", users)
        if hosts:
            return cls("hosts", hosts)
        raise ValueError('say what to block: all, -u "user ..." and/or -m "host ..."')

    def elements(self) -> tuple[BlockRule, ...]:
        """One rule per named element (``all`` is one element)."""
        if self.kind == "all":
            return (self,)
        return tuple(BlockRule(self.kind, (item,)) for item in self.items)

    def partition(self, done: Iterable[BlockRule]) -> tuple[BlockRule | None, BlockRule | None]:
        """This rule split into the elements in ``done`` and the others, each as one rule
        (None when empty), to say what a command changed and what it did not."""
        done = set(done)
        parts = (
            [e for e in self.elements() if e in done],
            [e for e in self.elements() if e not in done],
        )
        return tuple(  # type: ignore[return-value]
            (BlockRule(self.kind, tuple(i for e in part for i in e.items)) if part else None)
            for part in parts
        )

    def matches(self, user: str, host: str) -> bool:
        if self.kind == "all":
            return True
        if self.kind == "users":
            return user in self.items
        if self.kind == "hosts":
            return host in self.items
        return f"{user}@{host}" in self.items

    def describe(self) -> str:
        """The seed's wording: ``<all>``, ``Users <u1 u2>``, ``Hosts <h1>``, ``<u1@h1 ...>``."""
        names = " ".join(self.items)
        if self.kind == "all":
            return "<all>"
        if self.kind == "users":
            return f"Users <{names}>"
        if self.kind == "hosts":
            return f"Hosts <{names}>"
        return f"<{names}>"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "items": list(self.items)}


def _unique(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


class Blocklist:
    """The block rules in force, one per blocked element, in the order they were blocked, each
    with who holds it (:meth:`holder`): "" for an operator's block, else the id of the change
    that made it (the bypass audit's), so that its undo lifts only a block it still holds."""

    def __init__(
        self, rules: Iterable[BlockRule] = (), holders: Mapping[BlockRule, str] | None = None
    ) -> None:
        self._rules: dict[BlockRule, str] = {}  # insertion-ordered: element -> its holder
        for rule in rules:
            self.add(rule)
        for element, by in (holders or {}).items():
            if element in self._rules:
                self._rules[element] = by

    @property
    def rules(self) -> tuple[BlockRule, ...]:
        return tuple(self._rules)

    def holder(self, element: BlockRule) -> str | None:
        """Who holds the block of ``element`` ("": an operator), None when it is not blocked."""
        return self._rules.get(element)

    def holders(self) -> dict[BlockRule, str]:
        """The elements held by a change (not an operator's), with its id."""
        return {rule: by for rule, by in self._rules.items() if by}

    def add(self, rule: BlockRule, by: str = "") -> tuple[BlockRule, ...]:
        """Block each element of ``rule`` for ``by`` (""; an operator); returns those that
        were not blocked yet, and those an operator's block takes over from a change."""
        added = tuple(
            e for e in rule.elements() if e not in self._rules or (not by and self._rules[e])
        )
        for element in added:
            self._rules[element] = by
        return added

    def remove(self, rule: BlockRule) -> tuple[BlockRule, ...]:
        """Unblock each element of ``rule``; returns those that were blocked."""
        removed = tuple(e for e in rule.elements() if e in self._rules)
        for element in removed:
            del self._rules[element]
        return removed

    def blocks(self, user: str, host: str) -> bool:
        rules = self._rules
        return (
            BlockRule("all") in rules
            or BlockRule("users", (user,)) in rules
            or BlockRule("hosts", (host,)) in rules
            or BlockRule("pairs", (f"{user}@{host}",)) in rules
        )

    def summary(self) -> dict[str, Any]:
        """What ``blocklist`` shows: all, users, hosts, user@host pairs, in blocking order."""
        out: dict[str, Any] = {"all": False, "users": [], "hosts": [], "pairs": []}
        for rule in self._rules:
            if rule.kind == "all":
                out["all"] = True
            else:
                out[rule.kind].extend(rule.items)
        return out


# --- metrics --------------------------------------------------------------------------------


class Metrics:
    """Counts per sample period: the last complete period, the max of any, the average."""

    def __init__(self, period: float, start: float) -> None:
        self.period = period
        self.start = start
        self._index = 0
        self._current = dict.fromkeys(METRIC_NAMES, 0)
        self._last = dict.fromkeys(METRIC_NAMES, 0)
        self._max = dict.fromkeys(METRIC_NAMES, 0)
        self._total = dict.fromkeys(METRIC_NAMES, 0)
        self._done = 0

    def count(self, name: str, now: float, n: int = 1) -> None:
        self.roll(now)
        self._current[name] += n

    def roll(self, now: float) -> None:
        index = int((now - self.start) // self.period)
        if index <= self._index:
            return
        for name, value in self._current.items():
            self._max[name] = max(self._max[name], value)
            self._total[name] += value
        self._last = self._current
        skipped = index - self._index - 1
        if skipped:
            # whole periods with no activity at all: their counts are zero
            self._last = dict.fromkeys(METRIC_NAMES, 0)
        self._done += 1 + skipped
        self._current = dict.fromkeys(METRIC_NAMES, 0)
        self._index = index

    def snapshot(self, now: float) -> dict[str, Any]:
        """Rows of (last, max, avg) and the end of the last complete period (monotonic)."""
        self.roll(now)
        done = self._done
        rows = {
            name: {
                "last": self._last[name],
                "max": self._max[name],
                "avg": round(self._total[name] / done) if done else 0,
                "current": self._current[name],
            }
            for name in METRIC_NAMES
        }
        return {
            "rows": rows,
            "periods": done,
            "period_end": self.start + self._index * self.period if done else None,
        }


# --- the policy -----------------------------------------------------------------------------


class _Pending:
    __slots__ = ("request", "received", "received_wall", "user", "live")

    def __init__(self, request: Request, received: float, received_wall: float) -> None:
        self.request = request
        self.received = received
        self.received_wall = received_wall
        self.user = request.user
        self.live = True


class _Queue:
    """Waiting requests of one category: FIFO per user, round-robin across users."""

    #: users whose last grant is remembered for the rotation; the oldest are forgotten first
    #: (a forgotten user counts as never served, which is where it stood anyway)
    SERVED_MEMORY = 4096

    def __init__(self) -> None:
        self.users: OrderedDict[str, deque[_Pending]] = OrderedDict()
        self.arrivals: deque[_Pending] = deque()
        self.counts: dict[str, int] = {}
        self.size = 0
        #: user -> sequence number of its last grant, oldest first (kept after its queue
        #: empties: a user who comes back is not new)
        self.served: dict[str, int] = {}
        self._serial = itertools.count(1)

    def push(self, item: _Pending) -> None:
        queue = self.users.get(item.user)
        if queue is None:
            queue = self.users[item.user] = deque()
        queue.append(item)
        self.arrivals.append(item)
        self.counts[item.user] = self.counts.get(item.user, 0) + 1
        self.size += 1

    def drop(self, item: _Pending) -> None:
        """Take a live item out (granted, denied, cancelled); its slots are cleaned lazily."""
        item.live = False
        self.size -= 1
        left = self.counts[item.user] - 1
        if left:
            self.counts[item.user] = left
        else:
            del self.counts[item.user]
        queue = self.users.get(item.user)
        while queue and not queue[0].live:
            queue.popleft()
        if queue is not None and not queue:
            del self.users[item.user]

    def next(self, held: Mapping[str, int], cap: int | None = None) -> _Pending | None:
        """The head of the waiting user holding the fewest tokens; among equals, the one
        served least recently (a user never served first). None when nobody waits, or when
        every waiting user holds ``cap`` tokens already.

        Plain rotation would let a user who is busy holding a token lose turns to one with
        64 requests queued; preferring the least-served waiter keeps shares even (max-min).
        The tie-break is by last grant, not by place in a list: a user who arrives while
        another's 32 requests wait gets the next free token, not the one after.
        """
        best: tuple[int, int] | None = None
        best_user, empty = None, []
        for user, queue in self.users.items():
            while queue and not queue[0].live:
                queue.popleft()
            if not queue:
                empty.append(user)
                continue
            count = held.get(user, 0)
            if cap is not None and count >= cap:
                continue
            rank = (count, self.served.get(user, 0))
            if best is None or rank < best:
                best, best_user = rank, user
                if rank == (0, 0):
                    break  # holds nothing and was never served: nobody ranks before it
        for user in empty:
            del self.users[user]
        if best_user is None:
            return None
        return self.users[best_user][0]

    def granted(self, user: str) -> None:
        """``user`` was just given a token: it goes to the back of the rotation."""
        self.served.pop(user, None)
        self.served[user] = next(self._serial)
        if len(self.served) > self.SERVED_MEMORY:
            for name in list(itertools.islice(self.served, self.SERVED_MEMORY // 2)):
                del self.served[name]

    def grantable(self, held: Mapping[str, int], cap: int | None) -> bool:
        """Whether some waiting user is below ``cap`` (a free token could go to someone)."""
        if cap is None:
            return self.size > 0
        return any(held.get(user, 0) < cap for user in self.counts)

    def oldest(self) -> _Pending | None:
        while self.arrivals and not self.arrivals[0].live:
            self.arrivals.popleft()
        return self.arrivals[0] if self.arrivals else None

    def live_items(self) -> list[_Pending]:
        return [p for p in self.arrivals if p.live]


#: hold times a category keeps between two readings of the adaptive limit
HOLDS_KEPT = 4096


@dataclass
class _Category:
    limits: Limits
    enabled: bool = True
    in_use: int = 0
    in_use_privileged: int = 0
    last_grant: float = float("-inf")
    queue: _Queue = field(default_factory=_Queue)
    held: dict[str, int] = field(default_factory=dict)  # tokens in use per user
    #: seconds each ordinary token was held, as it came back (not rides, not lapsed leases):
    #: the signal of ``proxyd.adaptive``'s ``source: tokens``, taken by :meth:`take_holds`
    holds: deque[float] = field(default_factory=lambda: deque(maxlen=HOLDS_KEPT))
    #: (returned at, seconds held) of the ordinary tokens of users who were not busy
    #: (``busy_after``) when they came back: ``adaptive``'s ``light_window``
    light: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HOLDS_KEPT))


#: the schema's defaults, the one place they are written (PolicySettings' keywords take them)
_DEFAULT = ProxydSettings.of(None)


@dataclass(frozen=True)
class PolicySettings:
    """Everything a reload may change: the limits in force (this daemon's share, capped by
    the adaptive maxima) and the ``proxyd:`` keys the policy reads. The daemon builds it from
    its :class:`~gridgate.plugins.lsf_proxy.settings.ProxydSettings` (:meth:`of`); a keyword
    left out takes the schema's default."""

    limits: Mapping[str, Limits]
    token_wait_time: float = _DEFAULT.token_wait_time
    queue_limit_per_user: int = _DEFAULT.queue_limit_per_user
    lease_time: float = _DEFAULT.lease_time
    admins: frozenset[str] = _DEFAULT.admins
    addon_hosts: frozenset[str] = _DEFAULT.addon_hosts
    #: users never paced (root always); None: root and the admins, the seed's rule
    privileged: frozenset[str] | None = _DEFAULT.privileged
    #: per command (opcode): seconds its token may be held, instead of ``lease_time``
    hold_limits: Mapping[str, float] = field(default_factory=lambda: dict(_DEFAULT.hold_limits))
    #: requests of a user in flight in a category (held + waiting) from which it is busy;
    #: None: never
    busy_after: int | None = _DEFAULT.busy_after
    busy_nice: int = _DEFAULT.busy_nice

    @classmethod
    def of(cls, settings: ProxydSettings, limits: Mapping[str, Limits]) -> PolicySettings:
        """The policy's part of ``settings``, with ``limits`` in force."""
        return cls(
            limits=dict(limits),
            token_wait_time=settings.token_wait_time,
            queue_limit_per_user=settings.queue_limit_per_user,
            lease_time=settings.lease_time,
            admins=settings.admins,
            addon_hosts=settings.addon_hosts,
            privileged=settings.privileged,
            hold_limits=dict(settings.hold_limits),
            busy_after=settings.busy_after,
            busy_nice=settings.busy_nice,
        )


class TokenPolicy:
    """Tokens per category with max / nominal / throttle, round-robin among waiting users."""

    def __init__(
        self,
        settings: PolicySettings,
        clock: Clock = SYSTEM_CLOCK,
        sample_period: float = 60.0,
        blocklist: Blocklist | None = None,
    ) -> None:
        self.clock = clock
        self.settings = settings
        self.categories = {c: _Category(settings.limits[c]) for c in CATEGORIES}
        self.blocklist = blocklist or Blocklist()
        self.started_wall = clock.time()
        self._mono_start = clock.monotonic()
        self.metrics = Metrics(sample_period, self._mono_start)
        self._tokens: dict[str, Token] = {}
        self._leases: list[tuple[float, str]] = []
        self._pending: dict[str, tuple[str, _Pending]] = {}
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)
        self._riders: dict[str, str] = {}  # token id -> the id of the one ride on it
        #: called with every token granted (rides too) and every token returned or taken
        #: back: the bypass audit's ledger
        self.on_grant: Callable[[Token], None] | None = None
        self.on_release: Callable[[Token], None] | None = None

    # -- helpers

    def _now(self, now: float | None) -> float:
        return self.clock.monotonic() if now is None else now

    def _wall(self, mono: float) -> float:
        return self.started_wall + (mono - self._mono_start)

    def is_root_or_admin(self, user: str) -> bool:
        return user == "root" or user in self.settings.admins

    def is_privileged(self, user: str, host: str) -> bool:
        """Never paced (but counted): root, ``privileged`` (default: the admins), add-on
        hosts. Admin rights are apart: a service account that must be an admin for the
        daemons' heartbeats is still paced when ``privileged`` leaves it out."""
        chosen = self.settings.privileged
        if chosen is None:
            return self.is_root_or_admin(user) or host in self.settings.addon_hosts
        return user == "root" or user in chosen or host in self.settings.addon_hosts

    def is_blocked(self, user: str, host: str) -> bool:
        """Blocks apply to ordinary users and add-on hosts, never to root or admins."""
        return not self.is_root_or_admin(user) and self.blocklist.blocks(user, host)

    def _grant(
        self,
        cat: _Category,
        req: Request,
        privileged: bool,
        now: float,
        received: float,
        received_wall: float,
    ) -> Decision:
        token = Token(
            id=f"{self._prefix}-{next(self._ids)}",
            category=req.category,
            user=req.user,
            host=req.host,
            privileged=privileged,
            opcode=req.opcode,
            granted=now,
            expires_at=now + self.hold_limit(req.category, req.opcode),
        )
        cat.in_use += 1
        cat.held[req.user] = cat.held.get(req.user, 0) + 1
        if privileged:
            cat.in_use_privileged += 1
        else:
            cat.last_grant = now
            cat.queue.granted(req.user)
        self._tokens[token.id] = token
        heappush(self._leases, (token.expires_at, token.id))
        self.metrics.count(f"requests.{req.category}", now)
        if self.on_grant is not None:
            self.on_grant(token)
        return Decision(
            req,
            GRANTED,
            token=token,
            received=received_wall,
            decided=self._wall(now),
            waited=now - received,
        )

    def _deny(
        self, req: Request, reason: str, now: float, received: float, received_wall: float
    ) -> Decision:
        if reason == "blocked":
            self.metrics.count("blocked", now)
        elif reason in ("timeout", "queue_full"):
            self.metrics.count(f"rejected.{req.category}", now)
        return Decision(
            req,
            DENIED,
            reason=reason,
            received=received_wall,
            decided=self._wall(now),
            waited=now - received,
        )

    @staticmethod
    def _can_grant(cat: _Category, now: float) -> bool:
        if cat.in_use < cat.limits.nominal:
            return True
        # the same expression next_wakeup() reports: ``now - last >= throttle`` can be false
        # at the very instant ``last + throttle`` (floating point at epoch magnitudes), and a
        # daemon woken at that instant would then spin without granting
        return cat.in_use < cat.limits.max and now >= cat.last_grant + cat.limits.throttle

    # -- requests

    def request(self, req: Request, now: float | None = None) -> Decision:
        """Answer ``req`` at once, or queue it (outcome ``queued``; a tick answers it later).

        :raises ValueError: unknown category, or an id already pending.
        """
        now = self._now(now)
        wall = self._wall(now)
        cat = self.categories.get(req.category)
        if cat is None:
            raise ValueError(f"unknown category {req.category!r} (query, submission, other)")
        if req.id in self._pending:
            raise ValueError(f"request id {req.id!r} is already waiting")
        self.metrics.roll(now)
        if not cat.enabled:
            return Decision(req, PROCEED, reason="disabled", received=wall, decided=wall)
        if self.is_blocked(req.user, req.host):
            return self._deny(req, "blocked", now, now, wall)
        if self.is_privileged(req.user, req.host):
            return self._grant(cat, req, True, now, now, wall)
        cap = cat.limits.user_max
        if (
            self._can_grant(cat, now)
            and cat.held.get(req.user, 0) < cat.limits.per_user
            and not cat.queue.grantable(cat.held, cap)
        ):
            # nobody waiting could take this token first: the waiters are at their user_max
            return self._grant(cat, req, False, now, now, wall)
        if cat.queue.counts.get(req.user, 0) >= self.settings.queue_limit_per_user:
            return self._deny(req, "queue_full", now, now, wall)
        item = _Pending(req, now, wall)
        cat.queue.push(item)
        self._pending[req.id] = (req.category, item)
        return Decision(req, QUEUED, received=wall, decided=wall)

    def ride(self, parent_id: str, req: Request, now: float | None = None) -> Token | str:
        """A nested gated call rides on its parent's token (``parent_id``, the one its gated
        script holds): a token of its own that shares the parent's slot, so the category's
        counts do not change. Only on a live token of the same user, host and category, not
        itself a ride, one ride at a time, and never for a user blocked now.

        :return: the ride's token, or why not: ``not_live``, ``category`` (another
            category: take a token of its own), ``busy`` (ridden now: wait for it),
            ``blocked``, ``disabled``.
        """
        now = self._now(now)
        parent = self._tokens.get(parent_id)
        if parent is None or parent.rides or parent.user != req.user or parent.host != req.host:
            return "not_live"
        if parent.category != req.category:
            return "category"
        cat = self.categories[req.category]
        if not cat.enabled:
            return "disabled"
        if self.is_blocked(req.user, req.host):
            self.metrics.count("blocked", now)
            return "blocked"
        if parent_id in self._riders:
            return "busy"
        token = Token(
            id=f"{self._prefix}-{next(self._ids)}",
            category=req.category,
            user=req.user,
            host=req.host,
            privileged=parent.privileged,
            opcode=req.opcode,
            granted=now,
            expires_at=min(parent.expires_at, now + self.hold_limit(req.category, req.opcode)),
            rides=parent_id,
        )
        self._tokens[token.id] = token
        self._riders[parent_id] = token.id
        heappush(self._leases, (token.expires_at, token.id))
        self.metrics.count(f"requests.{req.category}", now)
        if self.on_grant is not None:
            self.on_grant(token)
        return token

    def hold_limit(self, category: str, opcode: str) -> float:
        """Seconds a token of ``category`` taken for ``opcode`` may be held: ``lease_time``,
        lowered by ``hold_limits`` for the category and for the command. The command's name
        is the client's word, so a limit set for the category is never dodged by another
        name (``--opcode X``, a renamed copy of squeue): the lowest of the three wins."""
        limits = self.settings.hold_limits
        return min(
            self.settings.lease_time,
            limits.get(category, math.inf),
            limits.get(opcode, math.inf) if opcode not in CATEGORIES else math.inf,
        )

    def cancel(self, request_id: str) -> bool:
        """Forget a queued request (its client went away); False when it is not queued."""
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return False
        self.categories[entry[0]].queue.drop(entry[1])
        return True

    def nice_for(self, token: Token) -> int:
        """The niceness the gate should run ``token``'s command at: ``busy_nice`` when its
        ordinary user has ``busy_after`` or more requests of the category in flight (held,
        this one included, and waiting), else 0. Tokens bound the controller's work; this
        keeps a user's flood of gated clients from taking the CPU of the host they share."""
        if token.privileged or not self._busy(self.categories[token.category], token.user):
            return 0
        return self.settings.busy_nice

    def _busy(self, cat: _Category, user: str) -> bool:
        """``user`` has ``busy_after`` or more requests of ``cat`` in flight (held, this one
        included, and waiting); never, without ``busy_after``."""
        after = self.settings.busy_after
        return after is not None and cat.held.get(user, 0) + cat.queue.counts.get(user, 0) >= after

    def release(self, token_id: str) -> Token | None:
        """Return a token; the freed slot goes to the next waiter at the next tick.

        :return: the token, or None when it is not (or no longer) held.
        """
        token = self._tokens.pop(token_id, None)
        if token is None:
            return None
        if self.on_release is not None:
            self.on_release(token)
        if token.rides:  # its parent's slot: no count of its own
            self._riders.pop(token.rides, None)
            return token
        rider = self._riders.pop(token_id, None)
        if rider is not None:  # the nested call's cover ends with its parent's
            ridden = self._tokens.pop(rider, None)
            if ridden is not None and self.on_release is not None:
                self.on_release(ridden)
        if len(self._leases) > 2 * len(self._tokens) + 1024:
            # released tokens leave their lease entries behind; drop them now and then so the
            # heap stays proportional to the tokens actually held
            self._leases = [(t.expires_at, t.id) for t in self._tokens.values()]
            heapify(self._leases)
        cat = self.categories[token.category]
        # light: not busy (as nice_for reads it) when it comes back; nobody without busy_after
        light = (
            not token.privileged
            and self.settings.busy_after is not None
            and not self._busy(cat, token.user)
        )
        cat.in_use -= 1
        left = cat.held.get(token.user, 1) - 1
        if left > 0:
            cat.held[token.user] = left
        else:
            cat.held.pop(token.user, None)
        if token.privileged:
            cat.in_use_privileged -= 1
        else:
            now = self.clock.monotonic()
            if now < token.expires_at:  # a lapsed lease is a client gone, not a hold time
                cat.holds.append(max(0.0, now - token.granted))
                if light:
                    cat.light.append((now, max(0.0, now - token.granted)))
        return token

    def light_holds(self, category: str, window: float) -> list[float]:
        """How long (seconds) each ordinary token of a user who was not busy was held, of
        those of ``category`` returned in the last ``window`` seconds (older ones are dropped)."""
        light = self.categories[category].light
        since = self.clock.monotonic() - window
        while light and light[0][0] < since:
            light.popleft()
        return [hold for _, hold in light]

    def take_holds(self, category: str) -> list[float]:
        """How long (seconds) each ordinary token of ``category`` returned since the last
        call was held: the time its command took, the controller's service in it."""
        holds = self.categories[category].holds
        taken = list(holds)
        holds.clear()
        return taken

    def tick(self, now: float | None = None) -> TickResult:
        """Take back expired leases, deny requests past the wait limit, grant what fits."""
        now = self._now(now)
        self.metrics.roll(now)
        expired: list[Token] = []
        while self._leases and self._leases[0][0] <= now:
            _, token_id = heappop(self._leases)
            token = self.release(token_id)
            if token is not None:
                self.metrics.count("error", now)
                expired.append(token)
        decisions: list[Decision] = []
        wait = self.settings.token_wait_time
        for cat in self.categories.values():
            queue = cat.queue
            while (item := queue.oldest()) is not None and now - item.received >= wait:
                decisions.append(self._take(cat, item, now, DENIED, "timeout"))
            while queue.size and self._can_grant(cat, now):
                item = queue.next(cat.held, cat.limits.user_max)
                if item is None:
                    break
                decisions.append(self._take(cat, item, now, GRANTED))
        return TickResult(tuple(decisions), tuple(expired))

    def _take(
        self, cat: _Category, item: _Pending, now: float, outcome: str, reason: str = ""
    ) -> Decision:
        cat.queue.drop(item)
        self._pending.pop(item.request.id, None)
        if outcome == GRANTED:
            return self._grant(cat, item.request, False, now, item.received, item.received_wall)
        if outcome == PROCEED:
            return Decision(
                item.request,
                PROCEED,
                reason=reason,
                received=item.received_wall,
                decided=self._wall(now),
                waited=now - item.received,
            )
        return self._deny(item.request, reason, now, item.received, item.received_wall)

    def next_wakeup(self, now: float | None = None) -> float | None:
        """When (monotonic) a tick will next have work; None when nothing is waiting or held."""
        now = self._now(now)
        times: list[float] = []
        if self._leases:
            times.append(self._leases[0][0])
        for cat in self.categories.values():
            oldest = cat.queue.oldest()
            if oldest is None:
                continue
            times.append(oldest.received + self.settings.token_wait_time)
            if not cat.queue.grantable(cat.held, cat.limits.user_max):
                continue  # every waiter is at its user_max: a release pokes the ticker
            if cat.in_use < cat.limits.nominal:
                times.append(now)
            elif cat.in_use < cat.limits.max:
                times.append(cat.last_grant + cat.limits.throttle)
        return min(times) if times else None

    # -- admin

    def set_enabled(self, category: str, enabled: bool, now: float | None = None) -> list[Decision]:
        """Enable or disable a category (``all`` for every one). Disabling answers its waiting
        requests with ``proceed`` at once.

        :raises ValueError: unknown category.
        """
        now = self._now(now)
        names = CATEGORIES if category == "all" else (category,)
        out: list[Decision] = []
        for name in names:
            cat = self.categories.get(name)
            if cat is None:
                raise ValueError(f"unknown category {name!r} (all, query, submission, other)")
            cat.enabled = enabled
            if not enabled:
                for item in cat.queue.live_items():
                    out.append(self._take(cat, item, now, PROCEED, "disabled"))
        return out

    def block(
        self, rule: BlockRule, now: float | None = None, by: str = ""
    ) -> tuple[tuple[BlockRule, ...], list[Decision]]:
        """Block each element of ``rule`` for ``by`` (:meth:`Blocklist.add`; returned: those
        newly blocked or taken over); waiting requests it now blocks are denied at once."""
        now = self._now(now)
        added = self.blocklist.add(rule, by)
        out: list[Decision] = []
        for cat in self.categories.values():
            for item in cat.queue.live_items():
                if self.is_blocked(item.request.user, item.request.host):
                    out.append(self._take(cat, item, now, DENIED, "blocked"))
        return added, out

    def unblock(self, rule: BlockRule) -> tuple[BlockRule, ...]:
        """Unblock each element of ``rule``; returns those that were blocked."""
        return self.blocklist.remove(rule)

    def count_error(self, now: float | None = None) -> None:
        """A protocol or client error worth showing in the ``Error`` row."""
        self.metrics.count("error", self._now(now))

    def reconfigure(self, settings: PolicySettings) -> None:
        """New limits and lists; tokens, queues, blocks and metrics stay."""
        self.settings = settings
        for name, cat in self.categories.items():
            cat.limits = settings.limits[name]

    def shutdown(self, now: float | None = None) -> list[Decision]:
        """Deny everything still waiting (the daemon is stopping)."""
        now = self._now(now)
        out: list[Decision] = []
        for cat in self.categories.values():
            for item in cat.queue.live_items():
                out.append(self._take(cat, item, now, DENIED, "shutdown"))
        return out

    def has_waiters(self) -> bool:
        """Whether any request is queued (a released token may let one through)."""
        return any(cat.queue.size for cat in self.categories.values())

    @property
    def tokens(self) -> Mapping[str, Token]:
        return self._tokens

    def status(self, now: float | None = None) -> dict[str, Any]:
        """Everything ``status`` shows, as plain data (JSON-ready)."""
        now = self._now(now)
        snap = self.metrics.snapshot(now)
        end = snap["period_end"]
        return {
            "started": self.started_wall,
            "sample_period": self.metrics.period,
            "period_end": self._wall(end) if end is not None else None,
            "categories": {
                name: {
                    "enabled": cat.enabled,
                    "token_limit": cat.limits.max,
                    "user_max": cat.limits.user_max,
                    "nominal": cat.limits.nominal,
                    "throttle_ms": round(cat.limits.throttle * 1000),
                    "in_use": cat.in_use,
                    "in_use_privileged": cat.in_use_privileged,
                    "queued": cat.queue.size,
                }
                for name, cat in self.categories.items()
            },
            "metrics": snap["rows"],
        }


class LocalTokens:
    """A thread-safe, blocking front to a :class:`TokenPolicy` (admission in-process).

    ``acquire`` blocks the calling thread until its request is decided; whichever waiting
    thread wakes first runs the tick and hands every decision to its owner.
    """

    def __init__(self, policy: TokenPolicy) -> None:
        self.policy = policy
        self._cond = threading.Condition()
        self._answers: dict[str, Decision] = {}
        self._ids = itertools.count(1)

    def acquire(
        self, category: str, opcode: str = "", user: str = "", host: str = "", size: int = 0
    ) -> Decision:
        """Block until granted, denied or told to proceed; never longer than the wait limit
        plus one throttle step (on the policy's clock)."""
        with self._cond:
            req = Request(f"local-{next(self._ids)}", category, opcode, user, host, size)
            decision = self.policy.request(req)
            while not decision.final:
                self._tick()
                if req.id in self._answers:
                    decision = self._answers.pop(req.id)
                    break
                wake = self.policy.next_wakeup()
                delay = 0.05 if wake is None else max(0.0, wake - self.policy.clock.monotonic())
                self._cond.wait(timeout=min(delay, 0.5) or 0.0005)
            return decision

    def in_use(self, category: str | None = None) -> int:
        """Tokens held now: of ``category``, or of every category (None), read under the lock
        the deciding threads hold."""
        with self._cond:
            categories = self.policy.categories
            chosen = categories.values() if category is None else [categories[category]]
            return sum(c.in_use for c in chosen)

    def release(self, token_id: str) -> bool:
        with self._cond:
            found = self.policy.release(token_id) is not None
            self._tick()
            return found

    def _tick(self) -> None:
        result = self.policy.tick()
        for decision in result.decisions:
            self._answers[decision.request.id] = decision
        if result.decisions:
            self._cond.notify_all()
