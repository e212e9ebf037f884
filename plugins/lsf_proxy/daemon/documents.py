"""The documents the token daemon reads from outside itself, each decoded here once into typed
values (:mod:`gridgate.core.documents`): a peer's heartbeat (the ``heartbeat`` request, a peer's
reply to ours, or its key in the state store: its service state and its grants) and the
daemon's own persisted blocklist read back at start. Past these functions nothing checks a
shape again; a bad document is one :class:`~gridgate.core.documents.DocumentError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from gridgate.core.documents import DocumentError, convert, decode_json
from gridgate.plugins.lsf_proxy.commands import CATEGORY_WORDS
from gridgate.plugins.lsf_proxy.config import CATEGORIES
from gridgate.plugins.lsf_proxy.daemon.policy import BlockRule

__all__ = [
    "Beat",
    "OldAction",
    "old_acting",
    "diagnose_class",
    "enable_category",
    "PeerReply",
    "ServiceState",
    "heartbeat",
    "peer_grants",
    "peer_reply",
    "persisted_blocklist",
    "persisted_rules",
    "service_state",
    "stored_heartbeat",
]

#: the most users a peer's grants may name (the rest is dropped)
MOST_USERS = 100_000


@dataclass(frozen=True)
class ServiceState:
    """Which categories are enabled, and where that comes from.

    ``stamp`` is the wall time of the ``enable``/``disable`` it results from (0: nobody changed
    it since the daemon started), ``origin`` the daemon that took that command. Between two
    states the one with the later ``(stamp, origin)`` wins, so a daemon that (re)joins takes
    the state of a live peer, and one that missed a command takes it at the next heartbeat.
    """

    enabled: Mapping[str, bool]
    stamp: float = 0.0
    origin: str = ""

    def newer_than(self, other: ServiceState) -> bool:
        return (self.stamp, self.origin) > (other.stamp, other.origin)

    def to_json(self) -> dict[str, Any]:
        return {
            "enabled": {c: bool(self.enabled.get(c, True)) for c in CATEGORIES},
            "stamp": self.stamp,
            "origin": self.origin,
        }

    @classmethod
    def from_json(cls, data: Any) -> ServiceState:
        """:raises DocumentError: not a service state (:func:`service_state`)."""
        return service_state(data)


class _Service(msgspec.Struct):
    enabled: dict[str, bool]
    stamp: float = 0.0
    origin: str = ""


_SERVICE = "heartbeat's service state"


def service_state(data: Any) -> ServiceState:
    """A peer's service state (``{"enabled": {category: bool}, "stamp": wall time,
    "origin": name}``), every category given.

    :raises DocumentError: anything else.
    """
    state: _Service = convert(data, _Service, kind=_SERVICE)
    missing = [c for c in CATEGORIES if c not in state.enabled]
    if missing:
        raise DocumentError(_SERVICE, f"enabled gives no true or false for {', '.join(missing)}")
    return ServiceState({c: state.enabled[c] for c in CATEGORIES}, state.stamp, state.origin)


class _Heartbeat(msgspec.Struct):
    sender: str = msgspec.field(name="from")
    service: Any = None
    grants: Any = None
    leaving: Any = None


@dataclass(frozen=True)
class Beat:
    """A peer's ``heartbeat`` request: who sends it, its service state, its grants (None:
    none or unreadable, an older daemon sends none) and whether it is leaving."""

    sender: str
    service: ServiceState
    grants: dict[str, Any] | None
    leaving: bool


def heartbeat(message: Mapping[str, Any]) -> Beat:
    """A ``heartbeat`` request (the protocol's fields beside these are not read here).

    :raises DocumentError: no sender name, or a bad service state.
    """
    note: _Heartbeat = convert(message, _Heartbeat, kind="heartbeat")
    return Beat(
        note.sender, service_state(note.service), peer_grants(note.grants), note.leaving is True
    )


def _numbers(data: Any) -> dict[str, float]:
    """``{user: number}``: anything else in it is dropped."""
    if not isinstance(data, Mapping):
        return {}
    return {
        str(user): float(value)
        for user, value in list(data.items())[:MOST_USERS]
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def peer_grants(data: Any) -> dict[str, Any] | None:
    """A peer's grants as its heartbeat (or its answer) gave them: ``{"at": wall time,
    "covered": {user: cover}, "blocked": {user: until}}``, each user's value a number
    (others dropped, a ``blocked`` that is not a mapping blocks nobody); None when there is no
    ``at`` number or no ``covered`` mapping (an older daemon sends none)."""
    if not isinstance(data, Mapping):
        return None
    at, covered = data.get("at"), data.get("covered")
    if isinstance(at, bool) or not isinstance(at, int | float) or not isinstance(covered, Mapping):
        return None
    return {"at": float(at), "covered": _numbers(covered), "blocked": _numbers(data.get("blocked"))}


class _Stored(msgspec.Struct):
    service: Any = None
    grants: Any = None


def stored_heartbeat(value: str | bytes) -> dict[str, Any]:
    """A peer's key in the state store (``heartbeat_via: state``) as the reply a peer gives
    to a heartbeat (read by :func:`peer_reply`); a value that is not a JSON object gives a
    reply with neither a service state nor grants."""
    try:
        stored: _Stored = decode_json(value, _Stored, kind="stored heartbeat")
    except DocumentError:
        stored = _Stored()
    return {"ok": True, "service": stored.service, "grants": stored.grants}


class _Error(msgspec.Struct):
    message: Any = None


class _Reply(msgspec.Struct):
    ok: Any = None
    error: Any = None
    service: Any = None
    grants: Any = None


@dataclass(frozen=True)
class PeerReply:
    """A peer's answer to a heartbeat: whether it took it (else ``error``, its message), its
    service state (None with ``problem`` when that is unreadable) and its grants."""

    ok: bool
    error: Any
    service: ServiceState | None
    problem: str
    grants: dict[str, Any] | None


def peer_reply(reply: Mapping[str, Any]) -> PeerReply:
    """A peer's reply to a heartbeat (through the client, or :func:`stored_heartbeat`)."""
    try:
        got: _Reply = convert(reply, _Reply, kind="heartbeat reply")
    except DocumentError as exc:
        return PeerReply(False, str(exc), None, "", None)
    if not got.ok:
        try:
            error: Any = convert(got.error, _Error, kind="heartbeat reply's error").message
        except DocumentError:
            error = None
        return PeerReply(False, error, None, "", None)
    try:
        service: ServiceState | None = service_state(got.service)
        problem = ""
    except DocumentError as exc:
        service, problem = None, str(exc)
    return PeerReply(True, None, service, problem, peer_grants(got.grants))


class _Rule(msgspec.Struct):
    kind: Literal["all", "users", "hosts", "pairs"]
    items: list[str] = []
    by: str = ""


class _Blocklist(msgspec.Struct):
    rules: list[_Rule] = []


def persisted_rules(text: str | bytes) -> list[BlockRule]:
    """The rules of a persisted blocklist (``{"rules": [{"kind": ..., "items": [...]}]}``).

    :raises DocumentError: not such a file.
    """
    return list(persisted_blocklist(text))


def persisted_blocklist(text: str | bytes) -> dict[BlockRule, str]:
    """The rules of a persisted blocklist, in order, each with who holds it (``by``: the id
    of the change that made it; "" for an operator's, or a file of an older version).

    :raises DocumentError: not such a file.
    """
    kept: _Blocklist = decode_json(text, _Blocklist, kind="persisted blocklist")
    return {BlockRule(r.kind, tuple(dict.fromkeys(r.items))): r.by for r in kept.rules}


# --- admin requests ------------------------------------------------------------------------------


class _Enable(msgspec.Struct):
    category: str = "all"


def enable_category(message: Mapping[str, Any]) -> str:
    """The category an ``enable``/``disable`` request names (``all`` when it names none), as
    the policy calls it (``sub`` is ``submission``).

    :raises DocumentError: not one of :data:`~gridgate.plugins.lsf_proxy.commands.CATEGORY_WORDS`.
    """
    kind = "enable request"
    enable: _Enable = convert(message, _Enable, kind=kind)
    word = enable.category
    if word not in CATEGORY_WORDS:
        raise DocumentError(kind, "category must be all, query, sub or other")
    return CATEGORY_WORDS[word]


class _Diagnose(msgspec.Struct):
    class_: Literal["requests", "bypass"] = msgspec.field(default="requests", name="class")


def diagnose_class(message: Mapping[str, Any]) -> Literal["requests", "bypass"]:
    """What a ``diagnose`` request traces (``requests`` when it says nothing).

    :raises DocumentError: another class.
    """
    try:
        asked: _Diagnose = convert(message, _Diagnose, kind="diagnose request")
    except DocumentError:
        raise DocumentError("diagnose request", "class must be requests or bypass") from None
    return asked.class_


# --- what versions before the journal kept for the audit to undo ---------------------------------


class OldAction(msgspec.Struct, frozen=True):
    """One user's block or denial as versions before the journal kept it (``from``: the peer
    whose audit's block this daemon adopted)."""

    action: Literal["block", "deny_partition"]
    until: float
    from_: str = msgspec.field(default="", name="from")


def old_acting(text: str | bytes) -> dict[str, OldAction]:
    """The file versions before the journal kept (``{user: {"action", "until", "from"}}``):
    an entry that is not an action is dropped.

    :raises DocumentError: not a JSON object.
    """
    kind = "bypass actions file"
    entries: dict[str, Any] = decode_json(text, dict[str, Any], kind=kind)
    out: dict[str, OldAction] = {}
    for user, value in entries.items():
        try:
            out[user] = convert(value, OldAction, kind=kind)
        except DocumentError:
            continue
    return out
