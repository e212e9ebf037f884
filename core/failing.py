"""The failing cache and the servers' failure episodes: core's memory of which servers are out of
rotation, shared by every director on one state store and read by anyone through this class.

The director's failure path (:mod:`gridgate.core.engine.iteration`) puts a server that failed in the
failing cache with :meth:`FailingCache.enter`: out of rotation for ``failing_expiry`` seconds,
and its *episode* (first failure time, failures so far) counted. The escalation plugin is told
that episode and decides the level; it may also keep a server *watched* for a while after its
failing entry expired (the default ``caches`` plugin's tickets window). The director excludes
:meth:`FailingCache.excluded` at the start of each iteration, the ``servers`` CLI shows
:meth:`FailingCache.view` and clears with :meth:`FailingCache.clear`, a backend asks
:meth:`FailingCache.episode`. Which escalation plugin is configured changes none of that.

When a server whose failures were told answers again (a submission or a poll succeeds),
:meth:`FailingCache.recovered` says so once per episode, so that people hear that it works again;
:meth:`FailingCache.clear` leaves a note for that too.

The keys (``failing/``, ``tickets/``, ``episode/``, ``recovered/``, ``cleared/``,
``local-fault/``) are this module's own: no other module reads or writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import msgspec
from loguru import logger

from gridgate.core import model
from gridgate.core._moved import moved_names
from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.documents import DocumentError, decode_json
from gridgate.core.model import Endpoint
from gridgate.core.state import StateError, StateStore

if TYPE_CHECKING:
    from gridgate.core.model import Episode

__all__ = ["FailingCache"]

FAILING = "failing/"
TICKETS = "tickets/"
EPISODE = "episode/"
#: A told episode's end, said once (``recovered/<server>/<episode start>``), and the note
#: ``servers clear`` leaves for the notice of a server put back by hand.
RECOVERED = "recovered/"
CLEARED = "cleared/"
#: The director's own note that a backend's command cannot start on its machine (a local fault).
LOCAL_FAULT = "local-fault/"


class FailingCache:
    """The failing cache and the episodes in a :class:`StateStore`.

    ``failing_expiry`` is how long a failed server stays out of rotation, ``ticket_expiry`` how
    much longer its episode (and a watched entry) outlives that. Methods that read or write the
    store raise :class:`StateError` when it fails, except :meth:`counts`.
    """

    def __init__(
        self,
        state: StateStore,
        clock: Clock = SYSTEM_CLOCK,
        failing_expiry: float = 3600.0,
        ticket_expiry: float = 3600.0,
    ) -> None:
        self.state = state
        self.clock = clock
        self.failing_expiry = float(failing_expiry)
        self.ticket_expiry = float(ticket_expiry)

    @classmethod
    def from_config(
        cls, state: StateStore, clock: Clock, director: Mapping[str, Any]
    ) -> FailingCache:
        """One with the expiries of a ``director`` section (one it does not name: the default)."""
        expiries = {
            k: float(director[k]) for k in ("failing_expiry", "ticket_expiry") if k in director
        }
        return cls(state, clock, **expiries)

    @property
    def window(self) -> float:
        """How long an episode, and a watched entry, outlive their last failure."""
        return self.failing_expiry + self.ticket_expiry

    # --- a failing server ------------------------------------------------------------------

    def enter(self, endpoint: Endpoint, kind: str) -> Episode:
        """Count a failure of ``endpoint`` of ``kind`` in its episode (one starts when none is
        open) and put it in the failing cache. The add is atomic: of many threads (or
        directors sharing the store) failing on one server at once, exactly one is told
        ``entered``."""
        now = self.clock.time()
        start, count = self._bump_episode(endpoint, now)
        entry = json.dumps({"since": now, "kind": kind})
        entered = self.state.add_if_absent(FAILING + endpoint.key, entry, ttl=self.failing_expiry)
        return model.Episode(start=start, failures=count, entered=entered)

    def _bump_episode(self, endpoint: Endpoint, now: float) -> tuple[float, int]:
        key = EPISODE + endpoint.key
        fresh = json.dumps({"start": now, "failures": 1})
        if self.state.add_if_absent(key, fresh, ttl=self.window):
            return now, 1
        # one that is no episode (a hand edit) starts again here
        open_ = _read(self.state.get(key), EpisodeRecord) or EpisodeRecord(start=now, failures=0)
        start, failures = open_.start, open_.failures + 1
        self.state.set(key, json.dumps({"start": start, "failures": failures}), ttl=self.window)
        return start, failures

    def contains(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint`` is in the failing cache (out of rotation) now."""
        return self.state.get(FAILING + endpoint.key) is not None

    def excluded(self) -> set[str]:
        """The keys (``backend/name``) of every server in the failing cache now."""
        return {key[len(FAILING) :] for key, _ in self.state.items(FAILING)}

    def episode(self, endpoint: Endpoint) -> Episode | None:
        """``endpoint``'s open episode, None when it has none (it has not failed lately)."""
        entry = _read(self.state.get(EPISODE + endpoint.key), EpisodeRecord)
        if entry is None:
            return None
        return model.Episode(start=entry.start, failures=entry.failures)

    def failing_episodes(self) -> dict[str, tuple[str, float | None]]:
        """Every server in the failing cache now: the kind of its failure and the start of its
        episode (None when it has none). Two reads of the store, whatever the number of
        servers (what :meth:`view` says of them, without its expiry times)."""
        starts = {
            key[len(EPISODE) :]: episode.start
            for key, raw in self.state.items(EPISODE)
            if (episode := _read(raw, EpisodeRecord)) is not None
        }
        failing: dict[str, tuple[str, float | None]] = {}
        for key, raw in self.state.items(FAILING):
            server = key[len(FAILING) :]
            entry = _read(raw, EntryRecord)
            failing[server] = (entry.kind if entry is not None else "", starts.get(server))
        return failing

    def troubled(self) -> set[str]:
        """The keys of every server with an open episode or cleared by hand since its last
        one: those a success should be checked against (:meth:`recovered`)."""
        return {
            key[len(prefix) :]
            for prefix in (EPISODE, CLEARED)
            for key, _ in self.state.items(prefix)
        }

    def recovered(self, endpoint: Endpoint) -> Recovery | None:
        """``endpoint`` answered (a submission or a status poll succeeded): its recovery, when
        its failures were told (it is watched) or an operator cleared it by hand, once per
        episode of all the directors on the store; None otherwise."""
        cleared = _read(self.state.get(CLEARED + endpoint.key), ClearedRecord)
        if cleared is not None:
            self.state.delete(CLEARED + endpoint.key)
            return Recovery(cleared.start, cleared.failures, cleared.who)
        episode = self.episode(endpoint)
        told = _read(self.state.get(TICKETS + endpoint.key), EntryRecord)
        # an answer does not disprove pilots that abort: their verdict says when that ends
        if episode is None or told is None or told.kind == "aborted":
            return None
        once = f"{RECOVERED}{endpoint.key}/{episode.start:.0f}"
        if not self.state.add_if_absent(once, "1", ttl=self.window):
            return None
        return Recovery(episode.start, episode.failures)

    # --- watched after the failing entry expired (the default plugin's tickets window) --------

    def watched(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint`` is watched (see :meth:`watch`)."""
        return self.state.get(TICKETS + endpoint.key) is not None

    def watch(self, endpoint: Endpoint, kind: str) -> None:
        """Keep ``endpoint`` watched for ``failing_expiry + ticket_expiry`` from now: back in
        rotation once its failing entry expires, but listed by ``gridgate servers list``
        (``watched``, with when that ends). An escalation plugin uses it to remember that a
        failure was told (the default raises an alarm when a watched server fails again)."""
        entry = json.dumps({"since": self.clock.time(), "kind": kind})
        self.state.set(TICKETS + endpoint.key, entry, ttl=self.window)

    # --- a backend whose commands cannot start on this machine ----------------------------------

    def local_fault(self, backend: str, kind: str) -> bool:
        """Note that ``backend``'s commands cannot start here (``kind``); true for the first
        note of a ``failing_expiry`` period (of every director on the store): the one to tell."""
        now = self.clock.time()
        key = f"{LOCAL_FAULT}{backend}/{kind}"
        return self.state.add_if_absent(key, f"{now:.3f}", ttl=self.failing_expiry)

    # --- for people: metrics and the servers CLI ----------------------------------------------

    def counts(self) -> dict[str, int]:
        """How many servers are ``failing`` and ``tickets`` (watched) and how many ``episodes``
        are open; a count the store cannot give is left out."""
        out: dict[str, int] = {}
        for name, prefix in (("failing", FAILING), ("tickets", TICKETS), ("episodes", EPISODE)):
            try:
                out[name] = len(self.state.items(prefix))
            except StateError:
                continue
        return out

    def view(self, now: float | None = None) -> list[dict[str, Any]]:
        """Every server the cache knows about, for ``gridgate servers list``.

        One dict per ``backend/name``: ``status`` is ``failing`` (out of rotation until
        ``failing_until``) or ``watched`` (back in rotation, but a failure before
        ``tickets_until`` is a repeat); with the episode's start and failure count and the
        last failure kind. Local faults come as rows whose ``status`` is ``local_fault``.
        """
        state = self.state
        now = self.clock.time() if now is None else now
        rows: dict[str, dict[str, Any]] = {}

        def row(key: str) -> dict[str, Any]:
            return rows.setdefault(
                key,
                {
                    "server": key,
                    "status": "watched",
                    "kind": "",
                    "episode_start": None,
                    "failures": 0,
                    "failing_until": None,
                    "tickets_until": None,
                },
            )

        for prefix, field in ((FAILING, "failing_until"), (TICKETS, "tickets_until")):
            for key, raw in state.items(prefix):
                server = key[len(prefix) :]
                entry, ttl = _read(raw, EntryRecord), state.ttl(key)
                current = row(server)
                current[field] = now + ttl if ttl is not None else None
                if entry is not None:  # one that is no entry still holds the server: kept
                    current["kind"] = current["kind"] or entry.kind  # failing first
                if prefix == FAILING:
                    current["status"] = "failing"
        for key, raw in state.items(EPISODE):
            server = key[len(EPISODE) :]
            episode = _read(raw, EpisodeRecord)
            if server in rows and episode is not None:
                rows[server]["episode_start"] = episode.start
                rows[server]["failures"] = episode.failures
        for key, raw in state.items(LOCAL_FAULT):
            backend, _, kind = key[len(LOCAL_FAULT) :].partition("/")
            ttl = state.ttl(key)
            try:
                since: float | None = float(raw)
            except ValueError:
                since = None
            row(f"{backend} (this machine)").update(
                status="local_fault",
                kind=kind,
                episode_start=since,
                failing_until=now + ttl if ttl is not None else None,
            )
        order = {"local_fault": 0, "failing": 1, "watched": 2}
        return sorted(rows.values(), key=lambda r: (order[r["status"]], r["server"]))

    def clear(self, names: list[str], everything: bool = False, who: str = "") -> list[str]:
        """Forget the failing, watched and episode entries of the named servers
        (``backend/name`` or a bare host name matching any backend), putting them back in
        rotation as new: the next failure starts a new episode. ``everything`` clears every
        server and the local-fault entries too. Returns what was cleared (``backend/name``,
        and ``local-fault/...`` keys); a name that matches nothing is simply not returned.
        A server whose failures were told keeps a note (``who`` cleared it) until it answers
        again, when :meth:`recovered` says it works again."""
        state = self.state
        prefixes = (FAILING, TICKETS, EPISODE)
        known = {key[len(prefix) :] for prefix in prefixes for key, _ in state.items(prefix)}
        wanted = set(names)
        cleared = sorted(
            k for k in known if everything or k in wanted or k.split("/", 1)[-1] in wanted
        )
        for server in cleared:
            episode = _read(state.get(EPISODE + server), EpisodeRecord)
            if episode is not None and state.get(TICKETS + server) is not None:
                note = {"start": episode.start, "failures": episode.failures, "who": who}
                state.set(CLEARED + server, json.dumps(note), ttl=self.window)
            for prefix in prefixes:
                state.delete(prefix + server)
        if everything:
            for key, _ in state.items(LOCAL_FAULT):
                state.delete(key)
                cleared.append(key)
        return cleared


# --- the cache's records, read back ----------------------------------------------------------

R = TypeVar("R")


class EntryRecord(msgspec.Struct):
    """A ``failing/`` or ``tickets/`` value: since when, and the failure's kind."""

    since: float
    kind: str


class ClearedRecord(msgspec.Struct):
    """A ``cleared/`` value: the episode an operator cleared, and who."""

    start: float
    failures: int
    who: str = ""


@dataclass(frozen=True)
class Recovery:
    """A server that answers again after told failures: its episode's start and failures, and
    who cleared it by hand ("" when it came back by itself)."""

    start: float
    failures: int
    cleared_by: str = ""


class EpisodeRecord(msgspec.Struct):
    """An ``episode/`` value: when the episode started, and its failures so far."""

    start: float
    failures: Annotated[int, msgspec.Meta(ge=0)]


def _read(raw: str | None, kind: type[R]) -> R | None:
    """The record ``raw`` (None when absent); one that is not a ``kind`` (a hand edit, a cut
    value) is said in the log and read as absent."""
    if raw is None:
        return None
    try:
        record: R = decode_json(raw, kind, kind=f"failing cache {kind.__name__}")
    except DocumentError as exc:
        logger.warning("{}; read as absent", exc)
        return None
    return record


#: Episode, until 2.0: it lives in gridgate.core.model (a DeprecationWarning says so)
__getattr__ = moved_names(__name__)
