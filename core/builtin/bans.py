"""Operator bans and drains: an endpoint taken out of rotation by hand, for a finite time, kept
in the state store so that every director on a shared store sees it.

``gridgate servers ban -c FILE ENDPOINT --for 2h --reason TEXT`` (and ``drain``, ``unban``) write
here; the director reads :meth:`OperatorAvailability.evaluate` once per iteration. One entry per
endpoint key (``Endpoint.key``, ``backend/name``) under :data:`PREFIX`, a JSON object holding the
state (``banned`` or ``drained``), who (the operator's login, as the caller gives it), why,
since and until. The entry is written with a TTL ending at ``until``, so it expires by itself,
and a reader also drops one whose ``until`` has passed on its own clock.

Concurrency: an entry is written with one ``StateStore.set`` of one whole JSON text, and every
driver makes ``set`` atomic (one SQL statement, one Redis ``SET``). Two operators banning the
same endpoint at once leave the entry of whichever wrote last, whole: last writer wins, never a
mix of the two. A ban and a drain of one endpoint are the same entry: the later command stands.
"""

from __future__ import annotations

import json
import math
import re
import threading
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.builtin.gocdb import AvailabilityChange, ChangeTracker
from gridgate.core.builtin.nokeys import NO_KEYS_SCHEMA, NoKeys
from gridgate.core.clock import Clock
from gridgate.core.documents import DocumentError, decode_json
from gridgate.core.model import AVAILABLE, Availability, Endpoint
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.state import StateError, StateStore

__all__ = [
    "MAX_DURATION",
    "MAX_REASON",
    "MAX_WHO",
    "OPERATOR_STATES",
    "PREFIX",
    "BanError",
    "OperatorAvailability",
    "OperatorBans",
    "OperatorEntry",
    "OperatorSource",
    "check_text",
    "parse_duration",
    "resolve_endpoint",
]

#: Where the entries live in the state store: ``PREFIX + Endpoint.key``.
PREFIX = "operator-availability/"
#: The states an operator can set.
OPERATOR_STATES = ("banned", "drained")
#: The longest ban or drain: a year. A ban has a finite end so that a forgotten one lifts by
#: itself; a year is long enough for a site that is gone and short enough to be seen again.
MAX_DURATION = 365 * 86400.0
#: The longest reason, in characters: a line or two in a table and a mail, not a document.
MAX_REASON = 500
#: The longest operator login (Linux allows 32; a federated identity a bit more).
MAX_WHO = 64
#: The longest endpoint key accepted (a URL-like name with its backend).
MAX_ENDPOINT = 512

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
# Cc: C0/C1 controls (newline, tab, escape: terminal tricks in a table); Cf: format characters
# (bidirectional overrides that make a reason read differently from what it holds); Zl/Zp:
# line and paragraph separators; Cs/Co/Cn: surrogates, private use and unassigned code points.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


class BanError(ValueError):
    """An operator command's input that cannot be used (a duration, a reason, a login, an
    endpoint): the message names the bad text and says what is accepted."""


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``2h``, ``90m``, ``1d12h``, ``1.5h`` or ``30s``: one or more
    numbers each followed by a unit (``s``, ``m``, ``h``, ``d``), more than zero and at most a
    year (:data:`MAX_DURATION`).

    :raises BanError: naming ``text`` when it is not such a duration or out of range.
    """
    if not isinstance(text, str):
        raise BanError(f"duration {text!r}: a text such as 2h, 90m or 1d12h")
    raw = text.strip()
    pos, total = 0, 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not raw or pos != len(raw):
        raise BanError(
            f"duration {text[:40]!r}: not a duration; give numbers with units s, m, h or d "
            "(2h, 90m, 1d12h, 1.5h)"
        )
    if not math.isfinite(total) or total <= 0:
        raise BanError(f"duration {text[:40]!r}: must be more than zero")
    if total > MAX_DURATION:
        raise BanError(f"duration {text[:40]!r}: longer than a year (365d), the longest allowed")
    return total


def check_text(what: str, text: str, limit: int) -> str:
    """``text`` without surrounding blanks, if it is non-empty, at most ``limit`` characters
    and free of control and format characters (newlines, escapes, bidirectional overrides).

    :raises BanError: naming ``what`` and the first bad character's position.
    """
    if not isinstance(text, str):
        raise BanError(f"{what}: a text, got {type(text).__name__}")
    clean = text.strip()
    if not clean:
        raise BanError(f"{what}: required, and not only blanks")
    if len(clean) > limit:
        raise BanError(f"{what}: {len(clean)} characters, more than the {limit} allowed")
    for index, char in enumerate(clean):
        if unicodedata.category(char) in _REFUSED_CATEGORIES:
            raise BanError(
                f"{what}: control or format character U+{ord(char):04X} at position "
                f"{index + 1}; write it on one line of plain text"
            )
    return clean


def _check_endpoint(key: str) -> str:
    clean = check_text("endpoint", key, MAX_ENDPOINT)
    backend, _, name = clean.partition("/")
    if not backend or not name:
        raise BanError(
            f"endpoint {clean[:80]!r}: not backend/name (as gridgate servers list shows)"
        )
    return clean


def resolve_endpoint(given: str, endpoints: Iterable[Endpoint]) -> Endpoint:
    """The configured endpoint an operator means by ``given``: its key (``backend/name``) or its
    bare name when only one backend has an endpoint of that name.

    :raises BanError: for a name no backend has, or one that several backends have (naming
        their keys, so the operator can give one).
    """
    text = check_text("endpoint", given, MAX_ENDPOINT)
    found = [e for e in endpoints if e.key == text]
    if not found:
        found = [e for e in endpoints if e.name == text]
    if not found:
        raise BanError(f"endpoint {text[:80]!r}: no configured backend has it")
    if len(found) > 1:
        keys = ", ".join(sorted(e.key for e in found))
        raise BanError(f"endpoint {text[:80]!r}: several backends have it ({keys}); give one")
    return found[0]


@dataclass(frozen=True)
class OperatorEntry:
    """One endpoint banned or drained by an operator: ``endpoint`` is its key
    (``backend/name``), ``state`` ``banned`` or ``drained``, ``who`` the operator's login,
    ``why`` the reason, ``since`` and ``until`` clock times (``until`` always finite)."""

    endpoint: str
    state: str
    who: str
    why: str
    since: float
    until: float

    def __post_init__(self) -> None:
        if self.state not in OPERATOR_STATES:
            raise BanError(f"operator state {self.state!r} is not one of {OPERATOR_STATES}")
        for name in ("since", "until"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise BanError(f"operator entry: {name} is {value!r}, not a clock time")
            if not math.isfinite(value):
                raise BanError(f"operator entry: {name} is {value!r}, not a finite clock time")
        if self.until <= self.since:
            raise BanError("operator entry: it ends before it starts")

    def availability(self) -> Availability:
        """This entry as an availability source's answer (source ``operator:LOGIN``)."""
        return Availability(
            self.state,
            reason=f"{self.state} by {self.who}: {self.why}",
            until=self.until,
            source=f"operator:{self.who}",
        )

    def as_dict(self) -> dict[str, Any]:
        """The entry as stored, and as ``gridgate servers list --json`` shows it."""
        return {
            "endpoint": self.endpoint,
            "state": self.state,
            "who": self.who,
            "why": self.why,
            "since": self.since,
            "until": self.until,
        }

    def encode(self) -> str:
        """The JSON text stored under ``PREFIX + endpoint``."""
        return json.dumps(self.as_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def decode(cls, key: str, text: str) -> OperatorEntry:
        """The entry stored under ``key`` (a store key, with :data:`PREFIX`).

        :raises BanError: for text that is not a whole entry of that endpoint.
        """
        try:
            entry: OperatorEntry = decode_json(text, cls, kind=key)
        except DocumentError as exc:
            raise BanError(str(exc)) from None
        if PREFIX + entry.endpoint != key:
            raise BanError(f"{key}: holds the entry of {entry.endpoint!r}")
        return entry


class OperatorBans:
    """Bans and drains in a state store, through its public methods only (``set``, ``get``,
    ``delete``, ``items``), so that they work alike on every driver and are shared by every
    director on a shared store. Time comes from ``clock`` (the store's own by default)."""

    def __init__(self, store: StateStore, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = store.clock if clock is None else clock
        self._warned: set[str] = set()

    def put(
        self, endpoint: str, state: str, *, who: str, why: str, duration: float
    ) -> OperatorEntry:
        """Ban or drain ``endpoint`` (a key, ``backend/name``) for ``duration`` seconds from now,
        replacing any ban or drain of it; the entry that now stands.

        :raises BanError: for a bad endpoint, state, login, reason or duration.
        :raises StateError: when the store cannot be written.
        """
        key = _check_endpoint(endpoint)
        if state not in OPERATOR_STATES:
            raise BanError(f"state {state!r}: one of {', '.join(OPERATOR_STATES)}")
        login = check_text("who", who, MAX_WHO)
        reason = check_text("reason", why, MAX_REASON)
        if isinstance(duration, bool) or not isinstance(duration, (int, float)):
            raise BanError(f"duration {duration!r}: a number of seconds")
        if not math.isfinite(duration) or not 0 < duration <= MAX_DURATION:
            raise BanError(f"duration {duration!r}: more than 0 and at most a year (365d)")
        now = self.clock.time()
        entry = OperatorEntry(key, state, login, reason, now, now + float(duration))
        self.store.set(PREFIX + key, entry.encode(), ttl=float(duration))
        return entry

    def ban(self, endpoint: str, *, who: str, why: str, duration: float) -> OperatorEntry:
        """Ban ``endpoint``: no new pilots, and not polled when its backend says it cannot be."""
        return self.put(endpoint, "banned", who=who, why=why, duration=duration)

    def drain(self, endpoint: str, *, who: str, why: str, duration: float) -> OperatorEntry:
        """Drain ``endpoint``: no new pilots; the ones there are still tracked."""
        return self.put(endpoint, "drained", who=who, why=why, duration=duration)

    def get(self, endpoint: str) -> OperatorEntry | None:
        """The ban or drain of ``endpoint`` in force now, or None.

        :raises StateError: when the store cannot be read.
        """
        key = PREFIX + _check_endpoint(endpoint)
        text = self.store.get(key)
        return None if text is None else self._live(key, text, self.clock.time())

    def unban(self, endpoint: str) -> OperatorEntry | None:
        """Lift the ban or drain of ``endpoint``; the entry that stood (None: there was none).

        :raises StateError: when the store cannot be read or written.
        """
        key = PREFIX + _check_endpoint(endpoint)
        text = self.store.get(key)
        self.store.delete(key)
        return None if text is None else self._live(key, text, self.clock.time())

    def entries(self) -> list[OperatorEntry]:
        """Every ban and drain in force now, by endpoint key (for ``gridgate servers list``).
        A stored value that is not a whole entry is left out, with one warning per value.

        :raises StateError: when the store cannot be read.
        """
        now = self.clock.time()
        found = []
        for key, text in self.store.items(PREFIX):
            entry = self._live(key, text, now)
            if entry is not None:
                found.append(entry)
        return found

    def _live(self, key: str, text: str, now: float) -> OperatorEntry | None:
        try:
            entry = OperatorEntry.decode(key, text)
        except BanError as exc:
            if text not in self._warned:
                if len(self._warned) >= 1024:  # bounded: a store full of junk warns again
                    self._warned.clear()
                self._warned.add(text)
                logger.warning(
                    "operator bans: ignoring a stored value that is not an entry: {}", exc
                )
            return None
        # the store's TTL ends it too; this keeps a reader on another clock from using it late
        return entry if entry.until > now else None

    def availability(self, endpoints: Iterable[str]) -> dict[str, Availability]:
        """What the operators say of each endpoint key: its entry's state, else available.

        :raises StateError: when the store cannot be read.
        """
        by_key = {e.endpoint: e for e in self.entries()}
        return {k: (by_key[k].availability() if k in by_key else AVAILABLE) for k in endpoints}


class OperatorAvailability:
    """The operators' bans and drains as one availability source, asked once per iteration.

    :meth:`evaluate` never raises: while the store cannot be read it keeps the entries it read
    last (each still ending at its own ``until``: an entry cannot outlive what the operator
    said), with one error when such an episode starts and one notice when it ends. An unban
    made meanwhile is seen when the store is back.
    """

    def __init__(self, store: StateStore, clock: Clock | None = None) -> None:
        self.bans = OperatorBans(store, clock)
        self.clock = self.bans.clock
        self.tracker = ChangeTracker()
        self._last: Sequence[OperatorEntry] = ()
        self._failing = False
        self._lock = threading.Lock()

    def evaluate(
        self, endpoints: Iterable[str]
    ) -> tuple[dict[str, Availability], list[AvailabilityChange]]:
        """Every endpoint key's state now, and the bans and drains that started, changed or
        ended since the last call (one change per endpoint, for one notice each)."""
        with self._lock:
            try:
                entries: Sequence[OperatorEntry] = self.bans.entries()
            except StateError as exc:
                if not self._failing:
                    self._failing = True
                    logger.error(
                        "operator bans: cannot read the state store ({}); keeping the {} "
                        "ban(s)/drain(s) read last, each until its own end",
                        exc,
                        len(self._last),
                    )
                now = self.clock.time()
                entries = [e for e in self._last if e.until > now]
            else:
                if self._failing:
                    self._failing = False
                    logger.info("operator bans: the state store is readable again")
            self._last = tuple(entries)
            by_key = {e.endpoint: e for e in entries}
            states = {
                k: (by_key[k].availability() if k in by_key else AVAILABLE) for k in endpoints
            }
            return states, self.tracker.update(states)


class OperatorSource(Plugin):
    """The ``operator`` availability source (always on): the bans and drains operators set
    with ``gridgate servers ban/drain``, read from the state store once per iteration, so that
    every director on a shared store honours them. Without a state store it says nothing."""

    config_schema: ClassVar[dict[str, Any]] = {
        **NO_KEYS_SCHEMA,
        "description": "Operator bans and drains (gridgate servers ban/drain/unban), kept in "
        "the state store; always on.",
    }
    settings_class = NoKeys

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self.source = (
            None if context.state is None else OperatorAvailability(context.state, context.clock)
        )

    @hookimpl
    def gridgate_endpoint_availability(
        self, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, Availability] | None:
        if self.source is None:
            return None
        states, _changes = self.source.evaluate(e.key for e in endpoints)
        return {k: a for k, a in states.items() if a.state != "available"}
