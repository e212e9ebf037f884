"""The daemon's wire protocol: newline-delimited JSON, versioned, HMAC-signed over TCP.

docs/protocol.md describes it for writers of other clients; this module is the reference
implementation of framing, signing and replay protection used by both ends. The version and
the error vocabulary are in :mod:`.wire`, which the gate's client reads without this module's
imports.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections import deque
from collections.abc import Mapping
from typing import Any

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.text import parse_json
from gridgate.plugins.lsf_proxy.wire import PROTOCOL_VERSION, ProtocolError

DEFAULT_MAX_LINE = 16384

#: Operations anyone may call; every other operation is an admin command.
PUBLIC_OPS = frozenset({"hello", "acquire", "release", "check"})
ADMIN_OPS = frozenset(
    {
        "status",
        "enable",
        "disable",
        "block",
        "unblock",
        "blocklist",
        "diagnose",
        "reconfig",
        "heartbeat",
    }
)


def encode(message: Mapping[str, Any]) -> bytes:
    """One message as one line (compact JSON, ``\\n``-terminated)."""
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        # a lone surrogate: escaped, the line is still valid JSON (and never an exception)
        return json.dumps(message, separators=(",", ":")).encode("ascii") + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line (without its newline) into a request.

    :raises ProtocolError: not UTF-8 JSON, not an object, wrong version, or no ``op``.
    """
    try:
        message = parse_json(line)  # "[[[[..." past the recursion limit is a ValueError too
    except ValueError as exc:
        raise ProtocolError("bad_json", f"not a JSON line: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("bad_request", "a message must be a JSON object")
    if (b"\\ud" in line or b"\\uD" in line) and _has_surrogate(message):
        # valid JSON, but no UTF-8 can carry it: it could be neither echoed nor logged
        raise ProtocolError(
            "bad_request",
            "a string holds a lone UTF-16 surrogate (\\ud800-\\udfff): not valid Unicode",
        )
    version = message.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            "bad_version",
            f"protocol version {version!r} is not supported "
            f"(this daemon speaks v={PROTOCOL_VERSION})",
        )
    if not isinstance(message.get("op"), str):
        raise ProtocolError("bad_request", 'missing "op" (a string)')
    return message


def _has_surrogate(message: Any) -> bool:
    # iterative: a line may nest as deep as json.loads allows
    stack = [message]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if any("\ud800" <= ch <= "\udfff" for ch in value):
                return True
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def canonical(message: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the message without ``auth.mac``, keys sorted, compact."""
    body = dict(message)
    auth = dict(body.get("auth") or {})
    auth.pop("mac", None)
    body["auth"] = auth
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode(
        "ascii"
    )


def sign(
    message: dict[str, Any],
    key: str,
    user: str,
    host: str,
    clock: Clock = SYSTEM_CLOCK,
    challenge: str | None = None,
    daemon: str | None = None,
) -> dict[str, Any]:
    """Add ``auth`` (user, host, timestamp, nonce, HMAC-SHA256) to ``message`` and return it.

    ``challenge`` and ``daemon`` are the ``challenge`` and ``name`` of the connection's
    ``hello`` reply: a daemon refuses a signature that does not cover them.
    """
    message["auth"] = {
        "user": user,
        "host": host,
        "ts": clock.time(),
        "nonce": secrets.token_hex(16),
    }
    if challenge is not None:
        message["auth"]["challenge"] = challenge
    if daemon is not None:
        message["auth"]["daemon"] = daemon
    mac = hmac.new(key.encode("utf-8"), canonical(message), hashlib.sha256).hexdigest()
    message["auth"]["mac"] = mac
    return message


class Verifier:
    """Checks signed requests: a valid MAC, a fresh timestamp, a nonce never seen before, and,
    for a daemon (``daemon`` set), its own name and the connection's challenge under the MAC.

    The challenge is what stops a captured request from being replayed to another daemon that
    shares the key, or to this one after a restart, inside the clock window. Nonces are remembered for twice the allowed skew (a replay older than that fails the
    timestamp check anyway); at most ``capacity`` are kept, the oldest forgotten first.
    """

    def __init__(
        self,
        key: str,
        max_skew: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
        capacity: int = 200_000,
        daemon: str | None = None,
    ) -> None:
        self._key = key.encode("utf-8")
        self.daemon = daemon
        self.max_skew = max_skew
        self.clock = clock
        self.capacity = capacity
        self._seen: dict[str, float] = {}
        self._order: deque[tuple[float, str]] = deque()

    def verify(self, message: Mapping[str, Any], challenge: str | None = None) -> tuple[str, str]:
        """:return: (user, host) the signed request states.

        :param challenge: the challenge this connection's ``hello`` handed out (None: none yet).
        :raises ProtocolError: ``unsigned``, ``bad_signature``, ``bad_challenge``, ``stale``
            or ``replayed``.
        """
        auth = message.get("auth")
        if not isinstance(auth, Mapping) or not isinstance(auth.get("mac"), str):
            raise ProtocolError("unsigned", "requests over TCP must be signed (auth.mac)")
        user, host, ts, nonce = (
            auth.get("user"),
            auth.get("host"),
            auth.get("ts"),
            auth.get("nonce"),
        )
        if not (
            isinstance(user, str)
            and user
            and isinstance(host, str)
            and host
            and isinstance(ts, int | float)
            and isinstance(nonce, str)
            and 8 <= len(nonce) <= 128
        ):
            raise ProtocolError("unsigned", "auth needs user, host, ts and nonce")
        expected = hmac.new(self._key, canonical(message), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, auth["mac"]):
            raise ProtocolError("bad_signature", "signature does not match")
        if self.daemon is not None:
            if challenge is None:
                raise ProtocolError(
                    "bad_challenge",
                    "send hello first: over TCP a signature "
                    "covers the challenge of the connection's hello",
                )
            if auth.get("challenge") != challenge or auth.get("daemon") != self.daemon:
                raise ProtocolError(
                    "bad_challenge",
                    f"signed for another connection or daemon, "
                    f"not this one ({self.daemon}): replay refused",
                )
        now = self.clock.time()
        if abs(now - ts) > self.max_skew:
            raise ProtocolError(
                "stale", f"timestamp is {now - ts:.0f} s off (allowed {self.max_skew:.0f} s)"
            )
        self._forget(now)
        if nonce in self._seen:
            raise ProtocolError("replayed", "this request was already received")
        self._seen[nonce] = now
        self._order.append((now, nonce))
        return user, host

    def _forget(self, now: float) -> None:
        horizon = now - 2 * self.max_skew
        while self._order and (self._order[0][0] < horizon or len(self._order) > self.capacity):
            _, nonce = self._order.popleft()
            self._seen.pop(nonce, None)
