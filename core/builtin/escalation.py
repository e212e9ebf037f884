"""The seed's failing and tickets caches as the default escalation plugin, flaws fixed.

The director puts a failing server in the failing cache (``failing_expiry``, see
:mod:`gridgate.core.failing`) and counts its episode; this plugin only decides what people are
told. While the server is in the failing cache further failures are recorded and nobody is
told. The first failure of an episode sends an error and keeps the server *watched* (the
tickets cache, ``failing_expiry + ticket_expiry``). A server that fails again after its
failing entry expired but while it is watched raises an alarm, and the watch is refreshed, so
a server that stays broken keeps raising alarms at the failing-cache rhythm instead of
alternating with error mails. The episode's first failure time is kept in the state store, so
"failing at least for N hours" is the truth, not a number from config. The add to the failing
cache is atomic: of many threads (or directors sharing Redis) failing on one server at once,
exactly one notifies.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gridgate.core import hookimpl
from gridgate.core.builtin.nokeys import NO_KEYS_SCHEMA, NoKeys
from gridgate.core.failing import FailingCache
from gridgate.core.kinds import counts_toward_alarms
from gridgate.core.model import Endpoint, Episode, Escalation, Failure, SubmitResult
from gridgate.core.plugins import Plugin


class TwoCacheEscalation(Plugin):
    """Error on the first failure of an episode, alarm when it fails again within the
    tickets window, silence while it sits in the failing cache."""

    config_schema: ClassVar[dict[str, Any]] = {
        **NO_KEYS_SCHEMA,
        "description": "Expiries come from the director section (failing_expiry, ticket_expiry).",
    }
    settings_class = NoKeys

    @property
    def _failing(self) -> FailingCache:
        if self.context.failing is None:
            raise RuntimeError("the caches escalation plugin needs a state store")
        return self.context.failing

    @hookimpl(trylast=True)
    def gridgate_escalate(
        self, endpoint: Endpoint, failure: Failure, result: SubmitResult, episode: Episode
    ) -> Escalation:
        start, count = episode.start, episode.failures
        if not episode.entered:
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
        failing = self._failing
        again = failing.watched(endpoint)
        failing.watch(endpoint, failure.kind)
        if not again:
            return Escalation(
                level="error",
                episode_start=start,
                failures=count,
                reason="first failure of an episode",
            )
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
