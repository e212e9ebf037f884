"""The last line of defence: a director whose demand asks for pilots and which submits none
for ``stall_iterations`` iterations in a row says so, whatever the cause.

Every other message names one cause (a server failing, a program missing on this machine, a
config refused). This one names none in advance: it counts, per iteration, why each
submission was not made (the accounting records' outcome and failure kind) and sends

- one ``error`` when the stall reaches ``stall_iterations`` iterations in a row;
- an ``alarm`` when it has lasted ``ticket_expiry`` seconds, repeated every
  ``failing_expiry`` while it lasts (the rhythm of a server that stays broken);
- one ``info`` "submitting again" when an iteration submits again, if the error was sent.

An iteration with no demand (or whose every demand group is filled by another director, or
trimmed because enough pilots already wait) neither counts nor ends a stall, except a demand
trimmed to zero by limits that are stuck: the pilot tracker says (:meth:`StallWatch.limits_stuck`)
which backends' pilots changed no state for ``stall_iterations`` polls (their polls fail, the
backend is paused, the state store is down), and their trims count. The episode lives in the state store under
``stall/<host>:<config file>``, so a restarted director carries on counting (no second error
for the same stall, the "submitting again" notice after a restart), and each message is sent
once even when two directors with the same host and config share the store. The episode
expires ``failing_expiry + ticket_expiry`` after its last stalled iteration.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from loguru import logger

from gridgate.core.clock import Clock
from gridgate.core.engine.records import StallEpisode, read_record
from gridgate.core.model import AccountingRecord, IterationInfo, Notification, elapsed_text
from gridgate.core.state import StateError, StateStore

if TYPE_CHECKING:
    from gridgate.core.engine.section import DirectorSettings

STALL = "stall/"
#: Skips that are not a failure to submit: the group is another director's, or enough pilots
#: already wait (the pilot limits of the registry trimmed the demand).
NOT_ASKED = frozenset({"claimed_elsewhere", "max_waiting", "max_total"})
STALL_NOTE = "stall-note/"

#: What an outcome/kind pair usually means, for the operator reading the error.
HINTS: Mapping[str, str] = {
    "skipped/no_endpoint": "every server of the backend is in the failing cache "
    "(gridgate servers list; earlier error mails say why)",
    "skipped/local_fault": "the backend was paused after a fault of this machine "
    "(see the local-fault error)",
    "skipped/no_backend": "the demand names a backend that is not configured",
    "refused/admission": "admission control refused the submission token",
    "no_match": "no resource matched the requirements on the server asked",
    "failed/plugin_error": "a plugin raised an exception (see the log)",
    "skipped/max_waiting": "max_waiting is full and no pilot changed state for many polls "
    "(status polls failing? gridgate pilots summary; earlier errors say why)",
    "skipped/max_total": "max_total is full and no pilot changed state for many polls "
    "(status polls failing? gridgate pilots summary; earlier errors say why)",
}


def _reason(record: AccountingRecord) -> str:
    return record.outcome + (f"/{record.failure_kind}" if record.failure_kind else "")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class StallWatch:
    """Watches the iterations of one director (``scope`` names it in the state store)."""

    def __init__(self, state: StateStore, clock: Clock, scope: str | None = None) -> None:
        self.state, self.clock = state, clock
        self.scope = scope or socket.gethostname()
        self.key = STALL + self.scope
        #: backend -> why its limits are stuck (set by the pilot tracker each iteration)
        self._stuck: dict[str, str] = {}

    def limits_stuck(self, backends: Mapping[str, str]) -> None:
        """The backends whose demand this iteration was trimmed to zero by limits that do not
        move (``backend -> why``): their trims count as stalled submissions."""
        self._stuck = dict(backends)

    def observe(
        self,
        iteration: IterationInfo,
        records: Iterable[AccountingRecord],
        director: DirectorSettings,
    ) -> list[Notification]:
        """Account one finished iteration; returns the notifications to send (already
        claimed in the store, so the caller just sends them)."""
        stuck, self._stuck = self._stuck, {}
        asked = [
            r
            for r in records
            if r.failure_kind not in NOT_ASKED
            or (r.failure_kind in ("max_waiting", "max_total") and r.backend in stuck)
        ]
        if not asked:
            return []
        try:
            if any(r.outcome == "submitted" for r in asked):
                return self._ended()
            return self._stalled(iteration, asked, director)
        except StateError as exc:
            logger.error("stall watch: state store failed, this iteration is not counted: {}", exc)
            return []

    # --- the two transitions ------------------------------------------------------------

    def _load(self) -> dict[str, Any] | None:
        """The open episode, as the dict that is updated and written back (None: none, or
        one that is no stall episode: a new one starts)."""
        episode = read_record(self.state.get(self.key), StallEpisode, f"stall episode {self.key}")
        return None if episode is None else msgspec.to_builtins(episode)

    def _claim(self, episode: Mapping[str, Any], what: str, ttl: float) -> bool:
        """Whether this director sends ``what`` for ``episode`` (atomic: one of several)."""
        return self.state.add_if_absent(
            f"{STALL_NOTE}{self.scope}/{episode['since']:.3f}/{what}", "1", ttl=ttl
        )

    def _ended(self) -> list[Notification]:
        episode = self._load()
        if episode is None:
            return []
        self.state.delete(self.key)
        if not episode.get("error_sent") or not self._claim(episode, "resumed", 3600):
            return []
        now = self.clock.time()
        lasted = elapsed_text(now - float(episode["since"]))
        body = (
            f"gridgate on {self.scope} submits pilots again, after {episode['iterations']} "
            f"iteration(s) with demand and no submission (since {_iso(episode['since'])}, "
            f"{lasted}).\n"
        )
        return [
            Notification(
                level="info",
                subject=f"gridgate: {self.scope} is submitting again",
                body=body,
                created=now,
                key=f"{self.key}/resumed/{episode['since']:.0f}",
            )
        ]

    def _stalled(
        self, iteration: IterationInfo, asked: list[AccountingRecord], director: DirectorSettings
    ) -> list[Notification]:
        now = self.clock.time()
        failing_expiry = director.failing_expiry
        ticket_expiry = director.ticket_expiry
        ttl = failing_expiry + ticket_expiry
        episode = self._load() or {
            "since": now,
            "iterations": 0,
            "pilots": 0,
            "reasons": {},
            "error_sent": False,
            "alarm_at": None,
        }
        last: dict[str, list[int]] = {}
        for record in asked:
            for counts in (
                episode["reasons"].setdefault(_reason(record), [0, 0]),
                last.setdefault(_reason(record), [0, 0]),
            ):
                counts[0] += 1
                counts[1] += record.pilots
        episode["iterations"] += 1
        # a retry elsewhere (attempt 2, 3...) asks again for the same pilots
        episode["pilots"] += sum(r.pilots for r in asked if r.attempt == 1)
        episode["last"] = {"number": iteration.number, "reasons": last}
        notes: list[Notification] = []
        limit = director.stall_iterations
        if episode["iterations"] >= limit:
            if not episode["error_sent"]:
                episode["error_sent"] = True
                if self._claim(episode, "error", ttl):
                    notes.append(self._compose("error", episode, now))
            lasted = now - float(episode["since"])
            alarm_at = episode.get("alarm_at")
            due = lasted >= ticket_expiry and (alarm_at is None or now - alarm_at >= failing_expiry)
            if due:
                episode["alarm_at"] = now
                if self._claim(episode, f"alarm/{now:.0f}", ttl):
                    notes.append(self._compose("alarm", episode, now))
        self.state.set(self.key, json.dumps(episode), ttl=ttl)
        return notes

    def _compose(self, level: str, episode: Mapping[str, Any], now: float) -> Notification:
        since = float(episode["since"])
        lines = []
        if level == "alarm":
            lines += [
                "Submit GGUS Ticket for this error if not already opened",
                f"It has been failing at least for {elapsed_text(now - since)}",
                "",
            ]
        lines += [
            f"gridgate on {self.scope} has submitted no pilot for {episode['iterations']} "
            f"iteration(s) in a row although the demand asked for pilots "
            f"({episode['pilots']} in all, since {_iso(since)}).",
            "",
            "Why each submission was not made, since the stall began (outcome/kind: "
            "attempts, pilots):",
        ]
        lines += _reason_lines(episode["reasons"])
        last = episode.get("last") or {}
        if last:
            lines += ["", f"In the last iteration (#{last['number']}):"]
            lines += _reason_lines(last["reasons"])
        lines += [
            "",
            "This message is sent whatever the cause; the messages above it in your "
            "mailbox, `gridgate servers list` and the log say more. A "
            '"submitting again" notice follows when pilots are submitted again.',
        ]
        subject = (
            f"gridgate: {self.scope} has submitted no pilot for {episode['iterations']} iterations"
        )
        return Notification(
            level=level,  # type: ignore[arg-type]
            subject=subject,
            body="\n".join(lines) + "\n",
            created=now,
            episode_start=since,
            key=f"{self.key}/{level}/{since:.0f}/{now:.0f}",
        )


def _reason_lines(reasons: Mapping[str, list[int]]) -> list[str]:
    lines = []
    for reason, (attempts, pilots) in sorted(reasons.items(), key=lambda kv: (-kv[1][0], kv[0])):
        hint = HINTS.get(reason)
        lines.append(
            f"- {reason}: {attempts} attempt(s), {pilots} pilot(s)"
            + (f" -- {hint}" if hint else "")
        )
    return lines
