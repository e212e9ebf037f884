"""Pilot efficiency as an availability source, as DIRAC's Resource Status System judges a CE:
an endpoint whose recent finished pilots failed too often gets fewer new ones (``degraded``).

DIRAC's ``PilotEfficiencyPolicy`` computes ``done / (done + failed + aborted)`` over the pilots
its ``PilotAgentsDB`` summary counts (those whose last update is within the last day), takes no
decision on fewer than 10 pilots, and says ``Banned`` at an efficiency of 0.5 or less and
``Degraded`` at 0.9 or less. Here the same figures are failure shares (failed = 1 - efficiency):
a share of at least ``degrade_threshold`` (0.1, DIRAC's 0.9) degrades the endpoint. Taking it out
of rotation is not this module's: above ``pilots.abort_threshold`` (0.5, DIRAC's ban) the pilot
tracker's ``aborted`` verdict already does that through the failure path (failing cache, a
mail); this source says ``degraded`` there too, so that its answer never gets better as the
share grows, and a degraded endpoint is a notice, never a mail.

What "recent" is, precisely: the endpoint's terminal pilots whose state changed within the last
``window`` seconds (DIRAC's day) and not after now; of those, the ones that say how a pilot ended
(``done``; ``failed``; ``lost``, unless ``count_lost`` is false) and at most the ``last`` most
recently finished; ``cancelled`` is our own doing and never counts. Fewer than ``min_finished``
of them (DIRAC's 10): no judgement, the endpoint is available as far as this source goes.
``last`` (100) is gridgate's addition: DIRAC counts a whole day, which on a busy CE (the seed's
1000 pilots an hour over 11 servers is about 90 per server and hour) is two thousand pilots and
keeps a CE that recovered an hour ago degraded all day; the last 100 are about the last hour
there, and on a quiet endpoint the day bounds them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.builtin.gocdb import AvailabilityChange
from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.model import AVAILABLE, Availability, Endpoint
from gridgate.core.plugins import ConfigProblems, Plugin, PluginContext, section_settings
from gridgate.core.settings import Settings
from gridgate.core.state import Pilot, PilotRegistry, StateError

__all__ = [
    "DEFAULT_DEGRADE_THRESHOLD",
    "DEFAULT_LAST",
    "DEFAULT_MIN_FINISHED",
    "DEFAULT_REFRESH",
    "DEFAULT_WINDOW",
    "EFFICIENCY_SCHEMA",
    "Efficiency",
    "EfficiencySection",
    "EfficiencySettings",
    "EfficiencySource",
    "PilotEfficiency",
    "MAX_LAST",
    "judge",
    "recent_finished",
]

_DAY = 86400.0
#: DIRAC degrades at an efficiency of 0.9 or less: a failed share of 0.1 or more.
DEFAULT_DEGRADE_THRESHOLD = 0.1
#: DIRAC's pilot summary counts the pilots updated in the last day.
DEFAULT_WINDOW = _DAY
#: DIRAC judges nothing on fewer than 10 pilots.
DEFAULT_MIN_FINISHED = 10
#: gridgate's cap on the pilots judged (see the module's text).
DEFAULT_LAST = 100
#: Seconds between two readings of an endpoint whose pilots did not change: reading is the cost
#: (about 6 ms an endpoint on Redis with 100 finished pilots, so 6 s for 1,000 endpoints), and
#: ten minutes is under 1 % of the day the window spans.
DEFAULT_REFRESH = 600.0
#: The most pilots one verdict reads (a schema maximum for ``last``).
MAX_LAST = 10000

EFFICIENCY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Pilot efficiency (as DIRAC's RSS): an endpoint whose recent finished pilots "
    "failed at least degrade_threshold of the time is degraded (its weight halved, a notice); "
    "above pilots.abort_threshold the aborted verdict takes it out of rotation.",
    "properties": {
        "degrade_threshold": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "default": DEFAULT_DEGRADE_THRESHOLD,
            "description": "Degraded from this failed share of the recent finished pilots on "
            "(0.1: DIRAC's efficiency of 0.9); must be below pilots.abort_threshold.",
        },
        "window": {
            "type": "number",
            "minimum": 60,
            "maximum": 30 * _DAY,
            "default": DEFAULT_WINDOW,
            "description": "Seconds: only pilots that finished this recently count (a day, as "
            "DIRAC's pilot summary).",
        },
        "last": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LAST,
            "default": DEFAULT_LAST,
            "description": "At most this many of the most recently finished pilots count.",
        },
        "min_finished": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LAST,
            "default": DEFAULT_MIN_FINISHED,
            "description": "No verdict on fewer finished pilots than this (10, as DIRAC).",
        },
        "refresh": {
            "type": "number",
            "minimum": 0,
            "maximum": _DAY,
            "default": DEFAULT_REFRESH,
            "description": "Seconds after which an endpoint whose pilots did not change is "
            "judged again (the window slides); 0: every endpoint at every iteration.",
        },
        "count_lost": {
            "type": "boolean",
            "default": True,
            "description": "Count lost pilots (vanished from the backend) as failed.",
        },
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class EfficiencySection(Settings):
    """The ``availability.efficiency`` section as written (:data:`EFFICIENCY_SCHEMA`; defaults
    from there): the policy's own keys, without the tracker's ``abort_threshold``."""

    section_schema: ClassVar[dict[str, Any]] = EFFICIENCY_SCHEMA

    degrade_threshold: float
    window: float
    last: int
    min_finished: int
    refresh: float
    count_lost: bool


@dataclass(frozen=True)
class EfficiencySettings:
    """The policy's numbers (see the module's text); ``abort_threshold`` is the pilot tracker's
    ``pilots.abort_threshold``, the top of the degraded band."""

    degrade_threshold: float = DEFAULT_DEGRADE_THRESHOLD
    abort_threshold: float = 0.5
    window: float = DEFAULT_WINDOW
    last: int = DEFAULT_LAST
    min_finished: int = DEFAULT_MIN_FINISHED
    count_lost: bool = True
    refresh: float = DEFAULT_REFRESH

    def __post_init__(self) -> None:
        def number(name: str, low: float, high: float, low_open: bool = False) -> None:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and math.isfinite(value) and (value > low if low_open else value >= low)
            if not ok or value > high:
                bound = f"more than {low:g}" if low_open else f"at least {low:g}"
                raise ValueError(
                    f"pilot efficiency: {name} must be {bound} and at most {high:g}, got {value!r}"
                )

        number("degrade_threshold", 0, 1, low_open=True)
        number("abort_threshold", 0, 1)
        number("window", 60, 30 * _DAY)
        number("refresh", 0, _DAY)
        for name in ("last", "min_finished"):
            number(name, 1, MAX_LAST)
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"pilot efficiency: {name} must be an integer")
        if self.degrade_threshold >= self.abort_threshold:
            raise ValueError(
                f"pilot efficiency: degrade_threshold ({self.degrade_threshold:g}) must be below "
                f"pilots.abort_threshold ({self.abort_threshold:g}), or no endpoint is ever "
                "degraded before it is aborted"
            )
        if self.min_finished > self.last:
            raise ValueError(
                f"pilot efficiency: min_finished ({self.min_finished}) is more than last "
                f"({self.last}): no verdict could ever be taken"
            )

    @classmethod
    def from_config(
        cls, section: EfficiencySection | Mapping[str, Any], abort_threshold: float = 0.5
    ) -> EfficiencySettings:
        """From an ``efficiency`` section (typed, or as written: :data:`EFFICIENCY_SCHEMA`) and
        the tracker's ``pilots.abort_threshold``.

        :raises ValueError: when the two thresholds leave no degraded band, or min_finished is
            more than last.
        """
        typed = section if isinstance(section, EfficiencySection) else EfficiencySection.of(section)
        return cls(
            degrade_threshold=typed.degrade_threshold,
            abort_threshold=float(abort_threshold),
            window=typed.window,
            last=typed.last,
            min_finished=typed.min_finished,
            count_lost=typed.count_lost,
            refresh=typed.refresh,
        )

    @property
    def deciding(self) -> frozenset[str]:
        """The terminal states that say how a pilot ended."""
        return frozenset({"done", "failed", "lost"} if self.count_lost else {"done", "failed"})


@dataclass(frozen=True)
class Efficiency:
    """The verdict on one endpoint: ``done`` and ``failed`` of the recent finished pilots
    counted (``failed`` includes ``lost`` when they count), ``judged`` False when they were
    fewer than ``min_finished``, and ``state`` ``available`` or ``degraded``."""

    done: int
    failed: int
    judged: bool
    state: str
    reason: str = ""

    @property
    def finished(self) -> int:
        return self.done + self.failed

    @property
    def failed_share(self) -> float:
        """failed / finished (0 when none finished)."""
        return self.failed / self.finished if self.finished else 0.0

    @property
    def efficiency(self) -> float:
        """done / finished, DIRAC's figure (1 when none finished)."""
        return 1.0 - self.failed_share

    def availability(self) -> Availability:
        """As an availability source's answer (source ``pilot efficiency``, no known end: the
        next iteration judges again)."""
        if self.state == "available":
            return AVAILABLE
        return Availability(self.state, self.reason, None, "pilot efficiency")


def judge(pilots: Iterable[Pilot], now: float, settings: EfficiencySettings) -> Efficiency:
    """The efficiency verdict over one endpoint's pilots (any of them: the recent finished ones
    are picked here as the module's text says). Pure: the same pilots and ``now`` give the same
    verdict."""
    low = now - settings.window
    deciding = settings.deciding
    recent = [p for p in pilots if p.state in deciding and low < p.changed <= now]
    recent.sort(key=lambda p: (p.changed, p.job_id), reverse=True)
    counted = recent[: settings.last]
    failed = sum(1 for p in counted if p.state != "done")
    done = len(counted) - failed
    if len(counted) < settings.min_finished:
        return Efficiency(done, failed, False, "available")
    share = failed / len(counted)
    if share < settings.degrade_threshold:
        return Efficiency(done, failed, True, "available")
    hours = settings.window / 3600
    reason = (
        f"pilot efficiency {1 - share:.2f}: {failed} of its last {len(counted)} finished pilots "
        f"(within {hours:g} h) failed, at or above degrade_threshold "
        f"{settings.degrade_threshold:g}"
    )
    if share > settings.abort_threshold:
        reason += f" and above abort_threshold {settings.abort_threshold:g}"
    return Efficiency(done, failed, True, "degraded", reason)


def recent_finished(
    registry: PilotRegistry, endpoint: Endpoint, now: float, settings: EfficiencySettings
) -> list[Pilot]:
    """The registry's terminal pilots of ``endpoint`` that finished within the window, enough of
    them to hold the ``last`` deciding ones (cancelled ones are read and skipped: the read grows
    while they crowd the deciding ones out, up to 64 times ``last``)."""
    want = settings.last
    limit = want
    while True:
        got = registry.last_finished(endpoint.backend, endpoint.name, limit, now - settings.window)
        usable = sum(1 for p in got if p.state in settings.deciding)
        if usable >= want or len(got) < limit or limit >= 64 * want:
            return got
        limit *= 4


class PilotEfficiency:
    """Pilot efficiency as one availability source, asked once per iteration.

    :meth:`evaluate` never raises: an endpoint whose pilots cannot be read keeps the verdict it
    had (one error per episode of such failures). A change is a change of state only: the
    reason's counts move at every iteration, and one notice per start and end is the point."""

    def __init__(self, settings: EfficiencySettings, clock: Clock = SYSTEM_CLOCK) -> None:
        self.settings = settings
        self.clock = clock
        self._last: dict[str, Availability] = {}
        self._read_at: dict[str, float] = {}
        self._failing = False
        self._lock = threading.Lock()

    def evaluate(
        self,
        registry: PilotRegistry,
        endpoints: Iterable[Endpoint],
        changed: Collection[str] | None = None,
    ) -> tuple[dict[str, Availability], list[AvailabilityChange]]:
        """Every endpoint's state by its key, and the ones whose verdict changed since the
        last call (for one notice each: a degraded endpoint is a notice, not a mail).

        :param changed: the keys of the endpoints whose pilots changed state since the last
            call (the tracker's polls know them): only those, the ones never judged and the
            ones judged ``refresh`` seconds ago or more are read again, the others keep their
            verdict. None: read every endpoint.
        """
        with self._lock:
            now = self.clock.time()
            states: dict[str, Availability] = {}
            problem: str | None = None
            for endpoint in endpoints:
                key = endpoint.key
                read_at = self._read_at.get(key)
                fresh = read_at is not None and now - read_at < self.settings.refresh
                if fresh and changed is not None and key not in changed and key in self._last:
                    states[key] = self._last[key]
                    continue
                try:
                    pilots = recent_finished(registry, endpoint, now, self.settings)
                except StateError as exc:
                    problem = str(exc)
                    states[key] = self._last.get(key, AVAILABLE)
                    continue
                self._read_at[key] = now
                states[key] = judge(pilots, now, self.settings).availability()
            self._read_at = {k: v for k, v in self._read_at.items() if k in states}
            if problem is not None and not self._failing:
                logger.error(
                    "pilot efficiency: cannot read the pilot registry ({}); endpoints keep "
                    "their last verdict",
                    problem,
                )
            elif problem is None and self._failing:
                logger.info("pilot efficiency: the pilot registry is readable again")
            self._failing = problem is not None
            changes = [
                AvailabilityChange(key, before, after)
                for key, after in states.items()
                if (before := self._last.get(key, AVAILABLE)).state != after.state
            ]
            self._last = states
            return states, changes


def abort_threshold_of(config: Mapping[str, Any]) -> float:
    """``director.pilots.abort_threshold`` of a whole config (the schema's default when not
    given)."""
    return float(section_settings(config, "director").pilots.abort_threshold)


class EfficiencySource(Plugin):
    """The ``efficiency`` availability source: ``availability: {efficiency: {}}``. An endpoint
    whose recent finished pilots failed at least ``degrade_threshold`` of the time is degraded
    (a notice, never a mail), read from the pilot registry (only the endpoints whose pilots
    changed at the last polls, and each again after ``refresh`` seconds). While the registry
    cannot be read every endpoint keeps its last verdict."""

    config_schema: ClassVar[dict[str, Any]] = EFFICIENCY_SCHEMA
    settings_class = EfficiencySection
    settings: EfficiencySection

    @classmethod
    def document_errors(
        cls, document: Mapping[str, Any], classes: Mapping[tuple[str, str], type]
    ) -> ConfigProblems:
        """``degrade_threshold`` not below ``director.pilots.abort_threshold`` (or
        ``min_finished`` above ``last``)."""
        section = (document.get("availability") or {}).get("efficiency")
        if not isinstance(section, Mapping):
            return []
        try:
            EfficiencySettings.from_config(section, abort_threshold_of(document))
        except (TypeError, ValueError) as exc:
            return [(("availability", "efficiency", "degrade_threshold"), str(exc))]
        return []

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        settings = EfficiencySettings.from_config(self.settings, abort_threshold_of(context.config))
        self.source = PilotEfficiency(settings, context.clock)
        self._last: dict[str, Availability] = {}
        self._down = False

    @hookimpl
    def gridgate_endpoint_availability(
        self, endpoints: Sequence[Endpoint], changed: frozenset[str] | None
    ) -> Mapping[str, Availability] | None:
        if self.context.state is None:
            return None
        try:
            registry = self.context.state.pilot_registry()
        except StateError as exc:
            if not self._down:  # once per episode; PilotEfficiency says when it reads again
                self._down = True
                logger.error(
                    "pilot efficiency: cannot open the pilot registry ({}); {} endpoint(s) "
                    "keep their last verdict",
                    exc,
                    len(self._last),
                )
            return dict(self._last)
        self._down = False
        states, _changes = self.source.evaluate(registry, endpoints, changed)
        self._last = {k: a for k, a in states.items() if a.state != "available"}
        return dict(self._last)
