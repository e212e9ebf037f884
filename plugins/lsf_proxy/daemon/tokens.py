"""Tokens by connection: which connection waits for which request and holds which token, the
``acquire``, ``check`` and ``release`` operations on one, and every decision of the policy
delivered to the connection that waits for it.

A token belongs to the connection that acquired it: when that closes, its tokens go back and
its waiting requests are withdrawn (:meth:`TokenDesk.closed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from loguru import logger

from gridgate.plugins.lsf_proxy.commands import (
    CATEGORIES,
    CATEGORY_WORDS,
    category_map,
    category_of,
)
from gridgate.plugins.lsf_proxy.daemon import holding
from gridgate.plugins.lsf_proxy.daemon.connections import Conn
from gridgate.plugins.lsf_proxy.daemon.diagnose import DiagnosticLog, diagnose_line
from gridgate.plugins.lsf_proxy.daemon.metrics import DaemonMetrics
from gridgate.plugins.lsf_proxy.daemon.policy import (
    GRANTED,
    QUEUED,
    BlockRule,
    Decision,
    Request,
    Token,
)
from gridgate.plugins.lsf_proxy.daemon.ratelimit import RateLimitedPolicy
from gridgate.plugins.lsf_proxy.wire import PROTOCOL_VERSION, ProtocolError


class TokenDesk:
    """The daemon's tokens and waiting requests, each with its connection.

    :param send: sends a connection a message (an event).
    :param reply: answers a connection's request ``msg_id`` with the given fields.
    :param poke: makes the daemon's ticker look at the policy now.
    """

    def __init__(
        self,
        policy: RateLimitedPolicy,
        diagnostics: DiagnosticLog,
        *,
        send: Callable[[Conn, Mapping[str, Any]], None],
        reply: Callable[..., None],
        poke: Callable[[], None],
    ) -> None:
        self.policy = policy
        self.diagnostics = diagnostics
        self._send = send
        self._reply = reply
        self._poke = poke
        #: the Prometheus series, when the daemon has them
        self.metrics: DaemonMetrics | None = None
        #: command or opcode -> category, for a request that names no category
        self.categories: Mapping[str, str] = category_map()
        self._waiters: dict[str, Conn] = {}
        self._owners: dict[str, Conn] = {}
        self._ids = 0
        #: user -> the bypass audit's block of it in force (``until``, ``from`` a peer), or
        #: None: set by proxyd.bypass, for what a blocked user is told (:meth:`block_of`)
        self.audit_block: Callable[[str], Mapping[str, Any] | None] = lambda _user: None

    def acquire(
        self, conn: Conn, message: Mapping[str, Any], msg_id: Any, user: str, host: str
    ) -> None:
        """``acquire``: answered now, or once it is decided (:meth:`deliver`)."""
        opcode = message.get("opcode") or ""
        category = message.get("category") or None
        size = message.get("size") or 0
        if not isinstance(opcode, str) or len(opcode) > 128:
            raise ProtocolError("bad_request", "opcode must be a string of at most 128 characters")
        if category is None:
            category = category_of(opcode, self.categories)
        category = CATEGORY_WORDS.get(category, category) if isinstance(category, str) else category
        if category not in CATEGORIES:
            raise ProtocolError("bad_request", f"category must be one of {', '.join(CATEGORIES)}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProtocolError("bad_request", "size must be a non-negative integer")
        self._ids += 1
        req = Request(f"r{self._ids}", category, opcode, user, host, size)
        conn.waiting[req.id] = msg_id
        self._waiters[req.id] = conn
        decision = self.policy.request(req)
        if decision.outcome == QUEUED:
            # the client may tell its user why it waits, and behind how many
            self._send(
                conn,
                {
                    "v": PROTOCOL_VERSION,
                    "event": "queued",
                    "request": msg_id,
                    "ahead": self.policy.ahead(req.id),
                },
            )
            self._poke()
            return
        self.deliver(decision)

    def check(self, conn: Conn, message: Mapping[str, Any], user: str, host: str) -> dict[str, Any]:
        """The ``check`` reply (holding.py); a ride is held by ``conn``, as a grant: it is
        logged in the diagnostic log and counted among the grants like one."""
        reply = holding.check(self.policy, message, user, host, conn.tcp)
        if reply.get("reason") == "blocked":
            reply["block"] = self.block_of(user, host)
        if "token" in reply:
            conn.tokens.add(reply["token"])
            self._owners[reply["token"]] = conn
            token = self.policy.tokens.get(reply["token"])
            if token is not None:
                now = self.policy.clock.time()
                ride = Request(token.id, token.category, token.opcode, token.user, token.host)
                granted = Decision(ride, GRANTED, token, "ride", received=now, decided=now)
                if self.metrics is not None:
                    self.metrics.decided(granted)
                self.diagnostics.write(diagnose_line(granted))
        return reply

    def release(self, conn: Conn, message: Mapping[str, Any]) -> dict[str, Any]:
        """The ``release`` reply: ``released`` false when ``conn`` does not hold the token."""
        token_id = message.get("token")
        if not isinstance(token_id, str):
            # a list or object here used to end as an "internal" TypeError (unhashable)
            raise ProtocolError("bad_request", "token must be a string")
        held = token_id in conn.tokens
        if held:
            conn.tokens.discard(token_id)
            self._owners.pop(token_id, None)
            self.policy.release(token_id)
            if self.policy.has_waiters():
                self._poke()
        return {"released": held}

    def deliver(self, decision: Decision) -> None:
        """Send a decided request its answer (and log it), or give back a token granted to a
        connection that has closed."""
        req = decision.request
        conn = self._waiters.pop(req.id, None)
        if self.metrics is not None:
            self.metrics.decided(decision)
        if decision.outcome in ("granted", "denied"):
            self.diagnostics.write(diagnose_line(decision))
        if conn is None:
            return
        msg_id = conn.waiting.pop(req.id, None)
        if conn.closed:
            if decision.token is not None:
                self.policy.release(decision.token.id)
            return
        fields: dict[str, Any] = {
            "result": decision.outcome,
            "category": req.category,
            "waited": round(decision.waited, 6),
        }
        if decision.token is not None:
            conn.tokens.add(decision.token.id)
            self._owners[decision.token.id] = conn
            fields.update(
                token=decision.token.id,
                lease=self.policy.settings.lease_time,
                privileged=decision.token.privileged,
            )
            nice = self.policy.nice_for(decision.token)
            if nice:
                fields["nice"] = nice
        if decision.reason:
            fields["reason"] = decision.reason
        if decision.reason == "blocked":
            fields["block"] = self.block_of(req.user, req.host)
        self._reply(conn, msg_id, **fields)

    def block_of(self, user: str, host: str) -> dict[str, Any]:
        """The ``block`` of a ``blocked`` refusal (docs/protocol.md): the rule that blocks
        ``user`` at ``host`` and who made it; the audit's (with its end) only when no rule of
        an administrator's blocks it too, as that one outlasts it."""
        rules = self.policy.blocklist.rules
        for rule in (
            BlockRule("all"),
            BlockRule("hosts", (host,)),
            BlockRule("pairs", (f"{user}@{host}",)),
            BlockRule("users", (user,)),
        ):
            if rule not in rules:
                continue
            held = self.audit_block(user) if rule.kind == "users" else None
            block: dict[str, Any] = {
                "by": "bypass" if held else "administrator",
                "rule": rule.kind,
                "name": rule.items[0] if rule.items else "",
                "until": held["until"] if held else None,
            }
            if held and held.get("from"):
                block["audit"] = held["from"]
            return block
        return {"by": "administrator", "rule": "", "name": "", "until": None}

    def taken_back(self, expired: Iterable[Token], wall: float) -> None:
        """Tokens the policy took back at their hold limit (``wall``: now, epoch seconds): the
        holder is told, and the logs say who held what."""
        expired = list(expired)
        if self.metrics is not None and expired:
            # the policy counted them in its Error row
            self.metrics.errors.labels("lease_expired").inc(len(expired))
        for token in expired:
            owner = self._owners.pop(token.id, None)
            logger.warning(
                "lease of token {} ({} {}) held by {}@{} expired after {:.0f} s "
                "(its hold limit): taken back",
                token.id,
                token.category,
                token.opcode or "-",
                token.user,
                token.host,
                token.expires_at - token.granted,
            )
            self.diagnostics.write(holding.hold_limit_line(token, wall))
            if owner is not None:
                owner.tokens.discard(token.id)
                self._send(owner, {"v": PROTOCOL_VERSION, "event": "expired", "token": token.id})

    def closed(self, conn: Conn) -> None:
        """``conn`` is closed: its waiting requests are withdrawn, its tokens go back."""
        for request_id in list(conn.waiting):
            self.policy.cancel(request_id)
            self._waiters.pop(request_id, None)
        conn.waiting.clear()
        for token_id in list(conn.tokens):
            if self.policy.release(token_id) is not None:
                logger.info(
                    "token {} of {}@{} returned: connection closed", token_id, conn.user, conn.host
                )
            self._owners.pop(token_id, None)
        conn.tokens.clear()
