"""Who holds which token, for how long: the daemon's ``check`` operation, hold limits, and the
longest-held tokens in ``status``. Pure functions of a :class:`~.policy.TokenPolicy`.

- ``check``: a gated command's child shows the token it inherited (``GRIDGATE_GATE_TOKEN``);
  it is good only while live and held by the same user (and host, over TCP). A guessed,
  forged, released or expired token is not. Asked with a ``category`` (and ``opcode``), the
  check is a *ride* (:meth:`~.policy.TokenPolicy.ride`): the nested call gets a token of its
  own on the parent's slot, held by its connection like a grant, one at a time, of the
  parent's category only, never for a blocked user. Without one it only answers: it covers
  nothing (a gate of an older release that ran on it would fan out).
- Hold limit: every token goes back at ``lease_time`` seconds at the latest, or earlier at
  ``hold_limits`` of its category or of the command (opcode) it was taken for, whichever is
  lowest (:meth:`~.policy.TokenPolicy.hold_limit`). The diagnostic log says so
  (:func:`hold_limit_line`), as the daemon's own log does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gridgate.plugins.lsf_proxy.commands import CATEGORIES, CATEGORY_WORDS
from gridgate.plugins.lsf_proxy.config import LSF_NAMES
from gridgate.plugins.lsf_proxy.daemon.diagnose import log_field
from gridgate.plugins.lsf_proxy.daemon.policy import Request, Token, TokenPolicy
from gridgate.plugins.lsf_proxy.wire import ProtocolError

#: How many tokens ``status`` lists, longest held first.
LONGEST_SHOWN = 5


def check(
    policy: TokenPolicy, message: Mapping[str, Any], user: str, host: str, tcp: bool
) -> dict[str, Any]:
    """The ``check`` reply: ``live`` true when ``token`` is held now by ``user`` (at ``host``
    over TCP, where the host is stated); its category when so. With ``category`` in
    ``message``, a ride: ``token`` in the reply is the ride's own (the daemon holds it for
    this connection), else ``live`` false and a ``reason``."""
    token_id = message.get("token")
    if not isinstance(token_id, str) or not token_id or len(token_id) > 128:
        raise ProtocolError("bad_request", "token must be a non-empty string")
    token = policy.tokens.get(token_id)
    if token is None or token.user != user or (tcp and token.host != host):
        return {"live": False, "reason": "not_live"}
    word = message.get("category")
    if word is None:
        return {"live": True, "category": token.category}
    category = CATEGORY_WORDS.get(word, word) if isinstance(word, str) else None
    opcode = message.get("opcode") or ""
    if category not in CATEGORIES:
        raise ProtocolError("bad_request", f"category must be one of {', '.join(CATEGORIES)}")
    if not isinstance(opcode, str) or len(opcode) > 128:
        raise ProtocolError("bad_request", "opcode must be a string of at most 128 characters")
    ride = policy.ride(token_id, Request("ride", category, opcode, user, token.host))
    if isinstance(ride, str):
        return {"live": False, "reason": ride, "category": token.category}
    return {"live": True, "category": ride.category, "token": ride.id, "rides": token_id}


def longest_held(
    policy: TokenPolicy, now: float | None = None, count: int = LONGEST_SHOWN
) -> list[dict[str, Any]]:
    """The ``count`` tokens held longest: user, host, command, category, seconds held and
    seconds left before the hold limit takes them back."""
    now = policy.clock.monotonic() if now is None else now
    tokens = sorted(policy.tokens.values(), key=lambda t: t.granted)[:count]
    return [
        {
            "user": t.user,
            "host": t.host,
            "opcode": t.opcode,
            "category": t.category,
            "held": round(now - t.granted, 3),
            "left": round(t.expires_at - now, 3),
        }
        for t in tokens
    ]


def hold_limit_line(token: Token, wall: float) -> str:
    """The diagnostic-log line of a token taken back at its hold limit, beside the request
    lines (same date stamp and comma-separated fields)::

        Feb 8 07:58:12 2023 QUERY_HOLD_LIMIT,squeue,user1,host1,60,075712,075812

    fields: category, command, user, host, seconds held, granted at, returned at.
    """
    done = time.localtime(wall)
    held = max(0.0, token.expires_at - token.granted)
    stamp = f"{time.strftime('%b', done)} {done.tm_mday} {time.strftime('%H:%M:%S %Y', done)}"
    granted = time.strftime("%H%M%S", time.localtime(wall - held))
    fields = [  # escaped as the request lines are
        f"{LSF_NAMES[token.category]}_HOLD_LIMIT",
        log_field(token.opcode) or "-",
        log_field(token.user),
        log_field(token.host),
        f"{held:.0f}",
        granted,
        time.strftime("%H%M%S", done),
    ]
    return f"{stamp} {','.join(fields)}"
