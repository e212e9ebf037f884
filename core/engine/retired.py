"""Endpoints no longer configured (a retired server or partition) whose pilots are still
tracked: the first time one is seen its pilots leave the limits, with a notice; they are still
polled, and go ``lost`` when the backend cannot say what became of them ``lost_after`` seconds
after that."""

from __future__ import annotations

from collections.abc import Mapping

from loguru import logger

from gridgate.core.engine.failure import FailurePath
from gridgate.core.engine.limits import PilotSettings
from gridgate.core.engine.records import clock_time
from gridgate.core.engine.runtime import Iteration, Runtime
from gridgate.core.model import TERMINAL_STATES, BackendInfo, Endpoint, Notification
from gridgate.core.state import Counts, PilotRegistry, StateError

#: When this director first saw pilots of an endpoint that is no longer configured.
RETIRED = "pilots-retired/"
#: When the backend last answered for a retired endpoint's pilots: ``lost_after`` counts from it.
RETIRED_OK = "pilots-retired-ok/"


class RetiredEndpoints:
    """The retired endpoints of one director's pilot tracker."""

    def __init__(self, runtime: Runtime, failures: FailurePath) -> None:
        self.runtime = runtime
        self.failures = failures

    @property
    def settings(self) -> PilotSettings:
        """``director.pilots`` of the config in force (built once per config)."""
        return self.runtime.settings.pilots

    def answered(self, endpoint: Endpoint, now: float) -> None:
        """The backend answered for ``endpoint``'s pilots at ``now``: ``lost_after`` counts
        from here."""
        ttl = self.settings.keep_finished
        try:
            self.runtime.state.set(RETIRED_OK + endpoint.key, repr(now), ttl=ttl)
        except StateError:
            pass  # lost_after then counts from the notice: sooner, not never

    def find(
        self, counts: Counts, infos: Mapping[str, BackendInfo], it: Iteration, now: float
    ) -> dict[str, list[Endpoint]]:
        """Endpoints of configured backends that still hold non-terminal pilots but are no
        longer in the config. The first time one is seen, a notice names it: its pilots leave
        the limits (they still count in ``gridgate pilots``), are still polled, and go
        ``lost`` when the backend cannot say what became of them."""
        out: dict[str, list[Endpoint]] = {}
        held: dict[str, int] = {}
        for (backend, name, state), n in counts.items():
            info = infos.get(backend)
            if info is None or state in TERMINAL_STATES or n <= 0:
                continue
            if any(e.name == name for e in info.endpoints):
                continue
            key = f"{backend}/{name}"
            if key not in held:
                out.setdefault(backend, []).append(Endpoint(backend, name))
            held[key] = held.get(key, 0) + n
        ttl = self.settings.keep_finished
        for endpoints in out.values():
            for endpoint in endpoints:
                try:
                    first = self.runtime.state.add_if_absent(
                        RETIRED + endpoint.key, repr(now), ttl=ttl
                    )
                except StateError:
                    first = False
                if first:
                    self._notice(endpoint, held[endpoint.key], it, now)
        return out

    def _notice(self, endpoint: Endpoint, n: int, it: Iteration, now: float) -> None:
        lost_after = self.settings.lost_after
        body = (
            f"{n} non-terminal pilot(s) of {endpoint.key} are tracked, but {endpoint.name} is "
            f"no longer in the config of backend {endpoint.backend}.\n"
            f"They no longer count against max_waiting / max_total. They are still polled "
            f"while the backend can say what became of them; if it cannot, they become lost "
            f"{lost_after:.0f} s (lost_after) from now.\n"
            f"To cancel them: gridgate pilots cancel --all --endpoint {endpoint.name}\n"
        )
        note = Notification(
            level="info",
            subject=f"gridgate: {n} pilot(s) of {endpoint.key}, "
            "no longer configured, leave the limits",
            body=body,
            created=now,
            endpoint=endpoint,
            key=f"{RETIRED}{endpoint.key}/{now:.0f}",
            logged=True,
        )
        logger.warning("{}", note.subject)
        self.failures.tell(it, note)

    def lost(
        self, registry: PilotRegistry, endpoint: Endpoint, settings: PilotSettings, now: float
    ) -> int:
        """Pilots of a retired endpoint that the backend has not answered for: ``lost`` once
        ``lost_after`` has passed since the endpoint was first seen retired and since the
        backend last answered for it (a poll not due yet is no silence)."""
        try:
            since = (
                max(
                    clock_time(self.runtime.state.get(key), "retired endpoint time") or 0.0
                    for key in (RETIRED + endpoint.key, RETIRED_OK + endpoint.key)
                )
                or now
            )
        except (StateError, ValueError):
            return 0
        lost_after = settings.lost_after
        if now - since < lost_after:
            return 0
        active = registry.active(endpoint.backend, endpoint.name)
        reason = (
            f"endpoint no longer configured, and the backend has not said what became of "
            f"the pilot for {now - since:.0f} s"
        )
        registry.put(p.moved("lost", now, p.native, reason) for p in active)
        if active:
            logger.warning(
                "{} pilot(s) of {} (no longer configured) are lost: {}",
                len(active),
                endpoint.key,
                reason,
            )
        return len(active)
