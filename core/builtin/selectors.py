"""The built-in endpoint selectors: ``random`` (the seed's choice, the default), ``round_robin``
(smooth weighted round robin), ``throughput`` (weighted by each endpoint's recent pilot
throughput, read from the pilot registry) and ``free_slots`` (weighted by the free slots each
endpoint's queue reports of itself)."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.builtin.nokeys import NO_KEYS_SCHEMA, NoKeys
from gridgate.core.endpoint_state import EndpointState
from gridgate.core.model import (
    Availability,
    Endpoint,
    SubmitRequest,
)
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.settings import Settings
from gridgate.core.state import PilotRegistry, StateError
from gridgate.core.weights import SmoothWeightedRoundRobin, effective_weights, weighted_choice

K = TypeVar("K", bound=Hashable)

#: Seconds of finished pilots a throughput weight counts (see THROUGHPUT_SCHEMA).
DEFAULT_THROUGHPUT_WINDOW = 6 * 3600.0
#: Pilots per hour an endpoint counts as at least, so that a new or idle one is still tried.
DEFAULT_THROUGHPUT_FLOOR = 1.0

THROUGHPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "default": {},
    "description": "Choice weighted by each endpoint's recent throughput (done pilots per "
    "hour), times its configured weight and availability.",
    "properties": {
        "window": {
            "type": "number",
            "minimum": 600,
            "maximum": 7 * 86400,
            "default": DEFAULT_THROUGHPUT_WINDOW,
            "description": "Seconds of finished pilots counted: long enough to span a wave of "
            "pilots that end together, short enough to follow a site that slows down.",
        },
        "floor": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1000000,
            "default": DEFAULT_THROUGHPUT_FLOOR,
            "description": "Pilots per hour every endpoint counts as at least, so that a new or "
            "idle endpoint still gets a share and can show what it does.",
        },
        "max_pilots": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1000000,
            "default": 100000,
            "description": "At most this many finished pilots are read per endpoint (the rate "
            "is then a lower bound).",
        },
    },
    "additionalProperties": False,
}


# --- weights -------------------------------------------------------------------------------


def throughput(pilots: Iterable[Any], now: float, window: float) -> float:
    """Done pilots per hour among ``pilots`` (objects with ``state`` and ``changed``, as
    :class:`~gridgate.core.state.Pilot`) that finished within the last ``window`` seconds."""
    if not (math.isfinite(window) and window > 0):
        raise ValueError(f"window must be a positive number of seconds, got {window!r}")
    low = now - window
    done = sum(1 for p in pilots if p.state == "done" and low < p.changed <= now)
    return done * 3600.0 / window


def throughput_weights(
    rates: Mapping[K, float], floor: float = DEFAULT_THROUGHPUT_FLOOR
) -> dict[K, float]:
    """Each endpoint's rate, at least ``floor`` pilots per hour (a new endpoint has done
    nothing yet and must still be tried to show what it does)."""
    if not (math.isfinite(floor) and floor > 0):
        raise ValueError(f"floor must be a positive number of pilots per hour, got {floor!r}")
    return {key: max(float(rate), floor) for key, rate in rates.items()}


def read_throughput(
    registry: PilotRegistry,
    endpoints: Iterable[Endpoint],
    now: float,
    window: float = DEFAULT_THROUGHPUT_WINDOW,
    max_pilots: int = 100000,
) -> dict[Endpoint, float]:
    """Done pilots per hour of each endpoint over the last ``window`` seconds, read from the
    pilot registry (at most ``max_pilots`` finished pilots each: past that, a lower bound).

    :raises StateError: when the registry cannot be read.
    """
    return {
        e: throughput(
            registry.last_finished(e.backend, e.name, max_pilots, now - window), now, window
        )
        for e in endpoints
    }


def _uniform(weights: Sequence[int]) -> bool:
    """Whether every candidate weighs the same (the selectors then choose as they always did,
    so a seeded run's sequence is the one it was before weights existed)."""
    return len(set(weights)) <= 1


#: the random selectors' ``seed`` option
_SEED: dict[str, Any] = {
    "type": ["integer", "null"],
    "default": None,
    "description": "Fix the random sequence (tests, reproducible demos).",
}


RANDOM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"seed": _SEED},
    "additionalProperties": False,
}
THROUGHPUT_SELECTOR_SCHEMA: dict[str, Any] = {
    **THROUGHPUT_SCHEMA,
    "properties": {**THROUGHPUT_SCHEMA["properties"], "seed": _SEED},
}


FREE_SLOTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Choice weighted by the free slots each endpoint's queue reports of itself "
    "(gridgate_endpoint_state: Slurm's idle CPUs, an ARC share's FreeSlots, a Grid Engine "
    "queue's available slots), times its configured weight and availability.",
    "properties": {
        "floor": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1000000,
            "default": 1.0,
            "description": "Slots every endpoint counts as at least, so that a full one still "
            "gets a small share (its pilots wait there) and can show when it frees up.",
        },
        "seed": _SEED,
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class RandomSettings(Settings):
    """The ``random`` selector's section."""

    section_schema: ClassVar[dict[str, Any]] = RANDOM_SCHEMA

    seed: int | None


@dataclass(frozen=True)
class ThroughputSettings(Settings):
    """The ``throughput`` selector's section."""

    section_schema: ClassVar[dict[str, Any]] = THROUGHPUT_SELECTOR_SCHEMA

    window: float
    floor: float
    max_pilots: int
    seed: int | None


@dataclass(frozen=True)
class FreeSlotsSettings(Settings):
    """The ``free_slots`` selector's section."""

    section_schema: ClassVar[dict[str, Any]] = FREE_SLOTS_SCHEMA

    floor: float
    seed: int | None


def free_slot_weights(
    candidates: Sequence[Endpoint], queues: Mapping[str, EndpointState], floor: float
) -> list[float]:
    """Each candidate's free slots as its queue said (at least ``floor``); one whose queue
    said nothing (a backend that cannot say, a read that failed) counts as the mean of those
    that did, so it is neither favoured nor starved; all 1.0 when none did.

    :param candidates: the endpoints to weigh.
    :param queues: what their queues said (by ``Endpoint.key``).
    :param floor: the fewest slots an endpoint counts as.
    """
    known = {
        e.key: max(float(q.free_slots), floor)
        for e in candidates
        if (q := queues.get(e.key)) is not None and q.free_slots is not None
    }
    if not known:
        return [1.0] * len(candidates)
    mean = sum(known.values()) / len(known)
    return [known.get(e.key, mean) for e in candidates]


def _rng(seed: int | None) -> random.Random:
    """The sequence ``seed`` fixes, else the system's."""
    return random.Random(seed) if seed is not None else random.SystemRandom()


class RandomSelector(Plugin):
    """Pick the endpoint at random, as the seed's director did: uniformly, or in proportion to
    the backend's ``weights`` times the availability factor (a degraded endpoint counts half),
    given by the hook's ``weights`` and ``availability`` arguments."""

    config_schema: ClassVar[dict[str, Any]] = RANDOM_SCHEMA
    settings_class = RandomSettings
    settings: RandomSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._random = _rng(self.settings.seed)

    @hookimpl(trylast=True)
    def gridgate_select_endpoint(
        self,
        candidates: Sequence[Endpoint],
        request: SubmitRequest,
        weights: Mapping[str, int],
        availability: Mapping[str, Availability],
    ) -> Endpoint | None:
        if not candidates:
            return None
        shares = effective_weights(candidates, weights, availability)
        if _uniform(shares):
            return self._random.choice(list(candidates))
        return weighted_choice(list(candidates), shares, self._random)


class RoundRobinSelector(Plugin):
    """Take the usable endpoints in turn: every server gets its share in the same order each
    time, for sites that prefer an even spread to a random one (and for reproducible runs).
    With ``weights`` (or a degraded endpoint, which counts half) the turns follow nginx's smooth
    weighted round robin: weights 3, 1 give a a b a, spread out."""

    config_schema: ClassVar[dict[str, Any]] = {**NO_KEYS_SCHEMA}
    settings_class = NoKeys

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._next = 0
        self._lock = threading.Lock()
        self._weighted = SmoothWeightedRoundRobin()

    @hookimpl
    def gridgate_select_endpoint(
        self,
        candidates: Sequence[Endpoint],
        request: SubmitRequest,
        weights: Mapping[str, int],
        availability: Mapping[str, Availability],
    ) -> Endpoint | None:
        if not candidates:
            return None
        shares = effective_weights(candidates, weights, availability)
        if not _uniform(shares):
            return self._weighted.choose(list(candidates), shares)
        with self._lock:
            turn = self._next
            self._next += 1
        return list(candidates)[turn % len(candidates)]


class ThroughputSelector(Plugin):
    """Pick the endpoint at random in proportion to its recent throughput (done pilots per
    hour over ``window``, at least ``floor``) times its configured weight and availability:
    servers that finish pilots get more of them. The rates are read from the pilot registry at
    most once a minute (one read per endpoint); while it cannot be read every endpoint counts
    as ``floor``, so the choice falls back to the weights alone."""

    config_schema: ClassVar[dict[str, Any]] = THROUGHPUT_SELECTOR_SCHEMA
    settings_class = ThroughputSettings
    settings: ThroughputSettings
    #: seconds the rates read from the registry are used before they are read again
    REFRESH: ClassVar[float] = 60.0

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._random = _rng(self.settings.seed)
        self.window = self.settings.window
        self.floor = self.settings.floor
        self.max_pilots = self.settings.max_pilots
        self._rates: dict[Endpoint, float] = {}
        self._read_at: dict[Endpoint, float] = {}
        self._lock = threading.Lock()
        self._failing = False

    def rates(self, candidates: Sequence[Endpoint]) -> dict[Endpoint, float]:
        """Each candidate's done pilots per hour (at least ``floor``), read again when older
        than :attr:`REFRESH` seconds."""
        now = self.context.clock.time()
        with self._lock:
            stale = [e for e in candidates if now - self._read_at.get(e, -math.inf) >= self.REFRESH]
            if stale and self.context.state is not None:
                try:
                    registry = self.context.state.pilot_registry()
                    read = read_throughput(registry, stale, now, self.window, self.max_pilots)
                except StateError as exc:
                    if not self._failing:
                        logger.error(
                            "throughput selector: cannot read the pilot registry ({}); "
                            "choosing by the weights alone",
                            exc,
                        )
                    self._failing = True
                else:
                    self._failing = False
                    self._rates.update(read)
                    self._read_at.update(dict.fromkeys(read, now))
            known = {e: self._rates.get(e, 0.0) for e in candidates}
        return throughput_weights(known, self.floor)

    @hookimpl
    def gridgate_select_endpoint(
        self,
        candidates: Sequence[Endpoint],
        request: SubmitRequest,
        weights: Mapping[str, int],
        availability: Mapping[str, Availability],
    ) -> Endpoint | None:
        if not candidates:
            return None
        items = list(candidates)
        shares = effective_weights(items, weights, availability)
        rates = self.rates(items)
        return weighted_choice(
            items, [w * rates[e] for e, w in zip(items, shares, strict=True)], self._random
        )


class FreeSlotsSelector(Plugin):
    """Pick the endpoint at random in proportion to the free slots its queue reports
    (``gridgate_endpoint_state``, read once an iteration), times its configured weight and
    availability: a CE with room gets the pilots that can start now, a full one few. An
    endpoint whose queue says nothing counts as the mean of the others (:func:`free_slot_weights`);
    with none saying anything the choice is by the weights alone."""

    config_schema: ClassVar[dict[str, Any]] = FREE_SLOTS_SCHEMA
    settings_class = FreeSlotsSettings
    settings: FreeSlotsSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._random = _rng(self.settings.seed)

    @hookimpl
    def gridgate_select_endpoint(
        self,
        candidates: Sequence[Endpoint],
        request: SubmitRequest,
        weights: Mapping[str, int],
        availability: Mapping[str, Availability],
        queues: Mapping[str, EndpointState],
    ) -> Endpoint | None:
        if not candidates:
            return None
        items = list(candidates)
        shares = effective_weights(items, weights, availability)
        slots = free_slot_weights(items, queues, self.settings.floor)
        return weighted_choice(
            items, [w * f for w, f in zip(shares, slots, strict=True)], self._random
        )
