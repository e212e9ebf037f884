"""Demand-source episodes: a source of waiting work (a Redis list, an HTTP count, a command)
that has failed longer than its group's ``keep_last`` leaves the group asking for no pilots.
That is told to people once per episode, of all the directors on one store: an error when the
group's last good figure runs out, a notice when the source answers again. Before, it was only
a log line, and nobody was mailed while the pilots stopped (issue 32, item 7).

Shared state: ``demand-source/episode/<source>/<group>`` holds the episode's start (wall
clock) and its problem while it lasts; ``demand-source/note/<source>/<group>/<since>/...``
claims each message for one director. An episode is also a row of the ``episodes`` table, so
``gridgate report`` shows it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from dataclasses import replace

from loguru import logger

from gridgate.core.engine.compose import compose_demand_source
from gridgate.core.engine.failure import FailurePath
from gridgate.core.engine.records import DemandSourceEpisode, read_record
from gridgate.core.engine.runtime import EPISODES, Iteration, Runtime
from gridgate.core.model import DemandFigure
from gridgate.core.state import StateError

__all__ = ["DEMAND_SOURCE", "DemandEpisodes"]

DEMAND_SOURCE = "demand-source/"


class DemandEpisodes:
    """Tells each stale demand source once, and when it answers again (see the module)."""

    def __init__(self, runtime: Runtime, failures: FailurePath) -> None:
        self.runtime = runtime
        self.failures = failures

    def check(self, it: Iteration, figures: Iterable[DemandFigure]) -> None:
        """After the demand hooks: open, keep or close the episode of each figure's source."""
        for figure in figures:
            if not figure.source or (figure.fresh and figure.jobs is None):
                continue  # a demand with no source of waiting work (static, file)
            try:
                self._episode(it, figure)
            except StateError as exc:
                logger.error(
                    "demand-source episode of group {} not recorded, state store failed: {}",
                    figure.group,
                    exc,
                )

    def _episode(self, it: Iteration, figure: DemandFigure) -> None:
        state, now = self.runtime.state, self.runtime.clock.time()
        director = self.runtime.settings
        window = director.failing_expiry + director.ticket_expiry
        scope = f"{figure.source}/{figure.group}"
        key = f"{DEMAND_SOURCE}episode/{scope}"
        host = socket.gethostname()
        if figure.stale:
            since = now - (figure.failing_for or 0.0)
            record = json.dumps({"since": since, "problem": figure.problem})
            if state.add_if_absent(key, record, ttl=window):
                self._row(figure, "unreadable", now)
                note = compose_demand_source(figure, "error", since, now, host)
                self.failures.tell(it, replace(note, logged=True))  # the tracker logged it
            else:
                state.set(key, state.get(key) or record, ttl=window)  # still on: kept alive
            return
        if not figure.fresh:
            return  # failing, but its last good figure still holds: the log line says so
        raw = state.get(key)
        if raw is None:
            return
        episode = read_record(raw, DemandSourceEpisode, f"demand-source episode {scope}")
        since = now if episode is None else episode.since
        if state.add_if_absent(f"{DEMAND_SOURCE}note/{scope}/{since:.3f}/back", "1", ttl=window):
            state.delete(key)
            self._row(figure, "available", now)
            note = compose_demand_source(figure, "info", since, now, host)
            self.failures.tell(it, replace(note, logged=True))  # "... answers again" is logged

    def _row(self, figure: DemandFigure, state: str, now: float) -> None:
        self.runtime.state.append_record(
            EPISODES,
            {
                "time": now,
                "what": "demand",
                "subject": f"group {figure.group}",
                "state": state,
                "source": figure.source,
                "reason": figure.problem,
            },
        )
