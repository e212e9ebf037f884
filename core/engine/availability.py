"""Endpoint availability in the director's loop: the answers of every availability source merged
per endpoint (the worst state wins), and one notice for each start, change and end of an
endpoint's merged state, told once of all the directors on one state store and across
restarts: what was told is kept in the store (``availability-told/``), and the director that
tells a change first claims it there (``add_if_absent``), as the failure and credential
episodes are. While the store cannot be read, each director tells what it saw itself (a repeated
notice beats a silent downtime)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from loguru import logger

from gridgate.core.documents import DocumentError
from gridgate.core.engine.failure import FailurePath
from gridgate.core.engine.records import ToldAvailability, clock_time, read_record
from gridgate.core.engine.runtime import EPISODES, Iteration, Runtime
from gridgate.core.model import AVAILABILITY_STATES, Availability, Notification
from gridgate.core.state import StateError, StateStore

#: What was last told of each endpoint (by key): its merged state and since when.
TOLD = "availability-told/"
#: One key per change told (the endpoint, the episode it ends and the state it starts): of
#: several directors, the one that adds it tells the change.
CLAIMED = "availability-change/"
#: When a director last merged the availability answers (clock time): how old the view is.
CHECKED = "availability-checked"
#: Seconds a told "available" is kept (the change records of endpoints in a downtime are kept
#: while it lasts, and this long after).
KEEP_AVAILABLE = 30 * 86400.0

#: What each state does, for the notice's body.
_EFFECT = {
    "degraded": "It gets fewer new pilots (its weight is halved); its pilots are tracked.\n",
    "drained": "It gets no new pilots; its pilots are still tracked.\n",
    "banned": "It gets no new pilots; its pilots are polled unless its backend cannot ask it.\n",
}


def same(a: Availability, b: Availability) -> bool:
    # the reason's counts move at every look (pilot efficiency): a notice per start and end
    return (a.state, a.source, a.until) == (b.state, b.source, b.until)


def merge_availability(
    answers: Iterable[tuple[str, Any]], endpoints: Iterable[str]
) -> dict[str, Availability]:
    """The answers of ``gridgate_endpoint_availability`` merged per endpoint key: the worst
    state wins (banned > drained > degraded > available) with its reason and end (of equal
    states, the first answer's); ``source`` names every source that said the endpoint was not
    available, worst first. Only keys in ``endpoints`` are kept, available ones are left out;
    an answer that is not a mapping of keys to :class:`Availability` is logged and skipped."""
    known = set(endpoints)
    said: dict[str, list[Availability]] = {}
    for plugin, answer in answers:
        if not isinstance(answer, Mapping):
            logger.error(
                "availability source {} answered {}, not a mapping: ignored",
                plugin,
                type(answer).__name__,
            )
            continue
        for key, state in answer.items():
            if not isinstance(state, Availability):
                logger.error(
                    "availability source {}: {!r} is not an Availability: ignored", plugin, key
                )
                continue
            if key in known and state.state != "available":
                source = state.source or plugin.split(":", 1)[-1]
                said.setdefault(key, []).append(replace(state, source=source))
    merged: dict[str, Availability] = {}
    for key, states in said.items():
        ordered = sorted(states, key=lambda a: -AVAILABILITY_STATES.index(a.state))
        sources = ",".join(dict.fromkeys(a.source for a in ordered))
        merged[key] = replace(ordered[0], source=sources)
    return merged


def _fingerprint(state: Availability | None) -> str:
    if state is None:
        return "available"
    return f"{state.state}|{state.source}|{state.until}"


class AvailabilityNotices:
    """The notices of one director's loop (see the module's docstring)."""

    def __init__(self, runtime: Runtime, failures: FailurePath) -> None:
        self.runtime = runtime
        self.failures = failures
        #: what this director told last, for the iterations the store cannot be read in
        self._local: dict[str, Availability] = {}
        self._store_down = False

    def tell_changes(self, it: Iteration) -> None:
        """One notice (level info) per endpoint whose merged state starts, changes or ends."""
        now = self.runtime.clock.time()
        after = it.availability
        try:
            told = self._told()
            self.runtime.state.set(CHECKED, repr(now))
            shared = True
            self._store_down = False
        except StateError as exc:
            if not self._store_down:
                logger.error(
                    "availability notices: the state store cannot be read ({}); this director "
                    "tells what it sees itself until it can",
                    exc,
                )
            self._store_down = True
            told = {key: (a, 0.0) for key, a in self._local.items()}
            shared = False
        keys = [*after, *(k for k in told if k not in after)]
        for key in keys:
            old, since = told.get(key, (None, 0.0))
            new = after.get(key)
            if old is None and new is None:
                continue
            if old is not None and new is not None and same(old, new):
                continue
            if shared and not self._claim(key, old, since, new, now):
                continue  # another director told it (and wrote what it told)
            self._tell(it, key, old, new, now)
        self._local = dict(after)

    def _told(self) -> dict[str, tuple[Availability | None, float]]:
        return told_states(self.runtime.state)

    def _claim(
        self,
        key: str,
        old: Availability | None,
        since: float,
        new: Availability | None,
        now: float,
    ) -> bool:
        """Whether this director is the one to tell ``key``'s change (it then writes it as
        told). A store that fails here: tell it (a repeated notice beats none)."""
        state = self.runtime.state
        change = f"{CLAIMED}{key}/{_fingerprint(old)}@{since:.6f}>{_fingerprint(new)}"
        cycle = self.runtime.settings.cycle_seconds
        try:
            if not state.add_if_absent(change, repr(now), ttl=max(600.0, 3 * cycle)):
                return False
            record: dict[str, Any] = {"state": "available", "since": now}
            ttl: float | None = KEEP_AVAILABLE
            if new is not None:
                record = {**new.as_dict(), "since": now}
                ttl = None
            state.set(TOLD + key, json.dumps(record, sort_keys=True), ttl=ttl)
        except StateError as exc:
            logger.error("availability notice of {} not kept in the state store: {}", key, exc)
        return True

    def _tell(
        self,
        it: Iteration,
        key: str,
        old: Availability | None,
        new: Availability | None,
        now: float,
    ) -> None:
        if new is None:
            assert old is not None
            subject = f"gridgate: {key} available again (was {old.state}: {old.source})"
            body = f"{key} was {old.state} ({old.source}): {old.reason}\nIt is available again.\n"
            state = "available"
        else:
            until = (
                "no known end"
                if new.until is None
                else time.strftime("until %Y-%m-%d %H:%M UTC", time.gmtime(new.until))
            )
            subject = f"gridgate: {key} {new.state} ({new.source}), {until}"
            body = (
                f"{key} is {new.state}, {until}, says {new.source}:\n{new.reason}\n\n"
                + _EFFECT[new.state]
            )
            state = new.state
        episode = {
            "time": now,
            "what": "availability",
            "subject": key,
            "state": state,
            "source": new.source if new is not None else "",
            "reason": new.reason if new is not None else "",
        }
        try:
            self.runtime.state.append_record(EPISODES, episode)
        except StateError as exc:
            logger.error("availability episode of {} not kept for the report: {}", key, exc)
        self.failures.tell(
            it,
            Notification(
                level="info",
                subject=subject,
                body=body,
                created=now,
                key=f"availability/{key}/{state}/{now:.0f}",
            ),
        )


def told_states(state: StateStore) -> dict[str, tuple[Availability | None, float]]:
    """Endpoint key -> (what the directors on ``state`` last told of it, None for available;
    since when), as :class:`AvailabilityNotices` keeps it.

    :raises StateError: when the store cannot be read.
    """
    out: dict[str, tuple[Availability | None, float]] = {}
    for key, value in state.items(TOLD):
        data = read_record(value, ToldAvailability, f"availability record {key}")
        if data is None:
            continue  # a record that is not ours: told again, once
        told = (
            None
            if data.state == "available"
            else Availability(
                state=data.state, reason=data.reason, until=data.until, source=data.source
            )
        )
        out[key[len(TOLD) :]] = (told, data.since)
    return out


def unavailable_view(state: StateStore) -> tuple[float | None, list[dict[str, Any]]]:
    """What ``gridgate servers list`` shows of availability: when a director last merged the
    sources' answers (None: never, on this store), and one row per endpoint it found not
    available (endpoint, state, source, reason, since, until), by endpoint.

    :raises StateError: when the store cannot be read.
    """
    try:
        checked = clock_time(state.get(CHECKED), "availability check time")
    except DocumentError:
        checked = None
    rows = [
        {"endpoint": key, **told.as_dict(), "since": since}
        for key, (told, since) in sorted(told_states(state).items())
        if told is not None
    ]
    return checked, rows
