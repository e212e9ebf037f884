"""The words both ends of the wire protocol share: its version, its error codes and the errors
that the daemon and its two clients raise (docs/protocol.md).

The gate's client (``client/gateclient.py``) reads this module on every gated call, so it
imports nothing: :mod:`.protocol` (framing, signing) pulls in ``json``, ``hmac`` and the clock.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs the gate more to import than this whole module
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

PROTOCOL_VERSION = 1

#: Every ``error.code`` a reply may carry (docs/protocol.md, "Replies"; a test pins the two).
ERROR_CODES = frozenset(
    {
        "bad_json",
        "bad_request",
        "bad_version",
        "unknown_op",
        "line_too_long",
        "line_timeout",
        "forbidden",
        "unsigned",
        "bad_signature",
        "bad_challenge",
        "stale",
        "replayed",
        "bad_config",
        "io_error",
        "busy",
        "auth_timeout",
        "internal",
    }
)
#: Errors with which a daemon that is alive turns a connection away (then closes it).
BUSY_CODES = frozenset({"busy", "auth_timeout"})


class ProtocolError(Exception):
    """A message the daemon cannot serve; ``code`` is one of :data:`ERROR_CODES`."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


# --- what the clients raise ------------------------------------------------------------------


class ProxyError(Exception):
    """Base of the clients' errors."""


class ProxyUnavailable(ProxyError):
    """No daemon answered (and ``when_unavailable`` is ``fail``)."""


class NoToken(ProxyError):
    """Refused: blocked, or denied ``notoken_ntries`` times. ``reason`` is the last one."""

    def __init__(self, message: str, reason: str) -> None:
        self.reason = reason
        super().__init__(message)


class RequestFailed(ProxyError):
    """The daemon answered with an error (``code``: forbidden, bad_request, ...)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


class ConnectionBroken(Exception):
    """The connection failed (refused, reset, closed, timed out): try the next daemon."""


class DaemonBusy(ConnectionBroken):
    """The daemon is there but did not take or answer the request in time (listen backlog
    full, reply overdue, turned away with a :data:`BUSY_CODES` error). A reason to retry,
    never to run without a token: that is for daemons that are down."""


def connect_failed(name: str, address: str, exc: OSError) -> ConnectionBroken:
    """What a failed ``connect`` to daemon ``name`` means: a timeout or a full listen backlog
    (EAGAIN) is a daemon that is there, anything else one that is not."""
    busy = isinstance(exc, TimeoutError) or exc.errno == 11  # EAGAIN; errno costs an import
    return (DaemonBusy if busy else ConnectionBroken)(f"{name}: cannot connect to {address}: {exc}")


# --- the gate's reading of replies ----------------------------------------------------------------
# The gate's client reads the daemon's replies here, by hand: gridgate.core.documents (msgspec)
# would cost every gated call more than the gate itself. ProxyClient decodes them with types in
# gridgate.plugins.lsf_proxy.documents; these readers keep the same defaults.


def busy_nice(reply: dict[str, Any]) -> int:
    """The niceness a grant asks its command to run at (its user is busy), 0 for none; a
    value outside 1-19 is none."""
    nice = reply.get("nice")
    return nice if isinstance(nice, int) and 0 < nice < 20 else 0


def reply_error(reply: dict[str, Any]) -> tuple[str, str]:
    """A reply's error code (``error`` when none is given) and message (empty)."""
    error = reply.get("error")
    if not isinstance(error, dict):
        return "error", ""
    code, message = error.get("code"), error.get("message")
    return (
        code if isinstance(code, str) else "error",
        message if isinstance(message, str) else "",
    )


def busy_error(name: str, code: str, message: str) -> DaemonBusy | None:
    """The :class:`DaemonBusy` of an error with which daemon ``name`` turns a connection
    away for lack of room (:data:`BUSY_CODES`), else None."""
    return DaemonBusy(f"{name}: busy: {message}") if code in BUSY_CODES else None


def turned_away(name: str, reply: dict[str, Any]) -> DaemonBusy | None:
    """The :class:`DaemonBusy` of a reply with no ``id`` by which daemon ``name`` turns this
    connection away for lack of room (it closes it next), else None."""
    if reply.get("id") is not None:
        return None
    return busy_error(name, *reply_error(reply))


_RULE_WORDS = {"users": "user", "hosts": "host", "pairs": "user@host"}


def blocked_message(name: str, reply: dict[str, Any]) -> str:
    """What a user refused as ``blocked`` by daemon ``name`` is told: who blocked it, why and
    until when, from the reply's ``block`` (docs/protocol.md, ``acquire``); a daemon that
    sends none is said to give none."""
    block = reply.get("block")
    if not isinstance(block, dict):
        return f"{name}: request blocked (this lsfproxyd does not say by whom or until when)"
    kind, item, until = block.get("rule"), block.get("name"), block.get("until")
    what = (
        "all requests"
        if kind == "all"
        else f"{_RULE_WORDS[kind]} {item}"
        if kind in _RULE_WORDS and isinstance(item, str) and item
        else "this request"
    )
    if block.get("by") == "bypass":
        audit = block.get("audit")
        by = (
            f"the bypass audit of lsfproxyd {audit}"
            if isinstance(audit, str) and audit
            else ("the bypass audit")
        )
        reason = f"{what}'s scheduler calls went around the gate (more than its tokens cover)"
        end = _date(until)
        return f"{name}: request blocked by {by}{f' until {end}' if end else ''}: {reason}"
    return (
        f"{name}: request blocked by the lsfproxyd administrator ({what} is on the blocklist, "
        "until an administrator unblocks it)"
    )


def _date(epoch: object) -> str:
    """``epoch`` (seconds) as the admin commands print dates, or empty for no time."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)) or epoch <= 0:
        return ""
    import time

    try:
        return time.strftime("%a %b %d %H:%M:%S", time.localtime(epoch))
    except (OverflowError, OSError, ValueError):
        return ""


def next_daemon(i: int, order: Sequence[object]) -> str:
    """What a client says after daemon ``i`` of ``order`` failed: that it tries the next
    one, only when there is one."""
    return "; trying the next" if i + 1 < len(order) else ""
