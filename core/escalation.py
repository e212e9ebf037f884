"""The seed's failing and tickets caches as the default escalation plugin, flaws fixed.

A failing server enters the *failing cache* (``failing_expiry``); while it is there further
failures are recorded and nobody is told. The first failure of an episode sends an error and
puts the server in the *tickets cache* (``failing_expiry + ticket_expiry``). A server that
fails again after its failing entry expired but while its tickets entry lives raises an
alarm, and the tickets entry is refreshed, so a server that stays broken keeps raising alarms
at the failing-cache rhythm instead of alternating with error mails. The episode's first
failure time is kept in the state store, so "failing at least for N hours" is the truth, not
a number from config. The add to the failing cache is atomic: of many threads (or
directors sharing Redis) failing on one server at once, exactly one notifies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from gridgate.core import hookimpl
from gridgate.core.kinds import counts_toward_alarms
from gridgate.core.model import Endpoint, Escalation, Failure, SubmitResult
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.state import StateStore

FAILING = "failing/"
TICKETS = "tickets/"
EPISODE = "episode/"


def failing_key(endpoint: Endpoint) -> str:
    return FAILING + endpoint.key


class TwoCacheEscalation(Plugin):
    """Error on the first failure of an episode, alarm when it fails again within the
    tickets window, silence while it sits in the failing cache."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "description": "Expiries come from the director section (failing_expiry, ticket_expiry).",
        "properties": {},
        "additionalProperties": False,
    }

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        director = context.config.get("director", {}) if context.config else {}
        self.failing_expiry = float(director.get("failing_expiry", 3600))
        self.ticket_expiry = float(director.get("ticket_expiry", 3600))

    @property
    def _state(self) -> StateStore:
        if self.context.state is None:
            raise RuntimeError("the caches escalation plugin needs a state store")
        return self.context.state

    def _bump_episode(self, endpoint: Endpoint, now: float) -> tuple[float, int]:
        """Count this failure in the server's episode; start one if none is open."""
        key = EPISODE + endpoint.key
        window = self.failing_expiry + self.ticket_expiry
        fresh = json.dumps({"start": now, "failures": 1})
        if self._state.add_if_absent(key, fresh, ttl=window):
            return now, 1
        raw = self._state.get(key)
        episode = json.loads(raw) if raw else {"start": now, "failures": 0}
        episode["failures"] = int(episode.get("failures", 0)) + 1
        self._state.set(key, json.dumps(episode), ttl=window)
        return float(episode["start"]), episode["failures"]

    @hookimpl(trylast=True)
    def gridgate_escalate(
        self, endpoint: Endpoint, failure: Failure, result: SubmitResult
    ) -> Escalation:
        state = self._state
        now = self.context.clock.time()
        start, count = self._bump_episode(endpoint, now)
        entry = json.dumps({"since": now, "kind": failure.kind})
        won = state.add_if_absent(failing_key(endpoint), entry, ttl=self.failing_expiry)
        if not won:
            return Escalation(
                level=None,
                episode_start=start,
                failures=count,
                reason="already in the failing cache",
            )
        if not failure.notify:
            return Escalation(
                level=None,
                episode_start=start,
                failures=count,
                reason=f"{failure.kind}: the server is protecting itself; not notified",
            )
        tickets = TICKETS + endpoint.key
        window = self.failing_expiry + self.ticket_expiry
        if state.get(tickets) is not None:
            state.set(tickets, entry, ttl=window)
            if not counts_toward_alarms(failure.kind):  # the site's to fix: no ticket to the server
                return Escalation(
                    level="error",
                    episode_start=start,
                    failures=count,
                    reason=f"{failure.kind}: failed again; never an alarm",
                )
            return Escalation(
                level="alarm",
                episode_start=start,
                failures=count,
                reason="failed again within the tickets window",
            )
        state.set(tickets, entry, ttl=window)
        return Escalation(
            level="error", episode_start=start, failures=count, reason="first failure of an episode"
        )


#: The director's own note that a backend's command cannot start on its machine (a local fault).
LOCAL_FAULT = "local-fault/"


def _json(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def cache_view(state: StateStore, now: float) -> list[dict[str, Any]]:
    """Every server the caches know about, for ``gridgate servers list``.

    One dict per ``backend/name``: ``status`` is ``failing`` (out of rotation until
    ``failing_until``) or ``watched`` (back in rotation, but a failure before
    ``tickets_until`` raises an alarm); with the episode's start and failure count and the
    last failure kind. Local faults (``local-fault/<backend>/<kind>``) come as rows whose
    ``status`` is ``local_fault``.
    """
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
            entry, ttl = _json(raw), state.ttl(key)
            current = row(server)
            current[field] = now + ttl if ttl is not None else None
            current["kind"] = current["kind"] or str(entry.get("kind", ""))  # failing entry first
            if prefix == FAILING:
                current["status"] = "failing"
    for key, raw in state.items(EPISODE):
        server = key[len(EPISODE) :]
        if server in rows:
            entry = _json(raw)
            rows[server]["episode_start"] = entry.get("start")
            rows[server]["failures"] = int(entry.get("failures", 0))
    for key, raw in state.items(LOCAL_FAULT):
        backend, _, kind = key[len(LOCAL_FAULT) :].partition("/")
        ttl = state.ttl(key)
        try:
            since = float(raw)
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


def clear_servers(state: StateStore, names: list[str], everything: bool = False) -> list[str]:
    """Forget the failing, tickets and episode entries of the named servers (``backend/name``
    or a bare host name matching any backend), putting them back in rotation as new: the
    next failure starts a new episode with an error, not an alarm. ``everything`` clears every
    server and the local-fault entries too. Returns what was cleared (``backend/name``, and
    ``local-fault/...`` keys); a name that matches nothing is simply not returned."""
    known = {
        key[len(prefix) :]
        for prefix in (FAILING, TICKETS, EPISODE)
        for key, _ in state.items(prefix)
    }
    wanted = set(names)
    cleared = sorted(k for k in known if everything or k in wanted or k.split("/", 1)[-1] in wanted)
    for server in cleared:
        for prefix in (FAILING, TICKETS, EPISODE):
            state.delete(prefix + server)
    if everything:
        for key, _ in state.items(LOCAL_FAULT):
            state.delete(key)
            cleared.append(key)
    return cleared
