"""Weighted endpoint choice: the weights a site gives its servers, the availability factor, a
weighted random choice without replacement, nginx's smooth weighted round robin, and a weight
from each endpoint's recent pilot throughput.

Weights come from a backend's section, ``weights: {ENDPOINT: N}`` (the endpoint's name as its
``servers`` list gives it, or its key ``backend/name`` as ``gridgate servers list`` shows it),
an integer from 0 to 1000, 1 when not given; 0 means never. Availability scales them: an
available endpoint counts in full, a degraded one half, a drained or banned one not at all.
Effective weights are integers in half units (:data:`UNIT` = 2 per configured unit), so halving
is exact and round robin's cycle stays whole.
"""

from __future__ import annotations

import heapq
import math
import random
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from gridgate.core._moved import moved_names
from gridgate.core.model import Availability, Endpoint

__all__ = ["SmoothWeightedRoundRobin", "effective_weights", "weighted_choice"]

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

#: The largest configured weight: a thousand to one is already "almost never".
MAX_WEIGHT = 1000
#: Effective weight units per configured unit (half units make "degraded halves" exact).
UNIT = 2
#: Half units per configured unit for each availability state.
FACTOR: Mapping[str, int] = {"available": 2, "degraded": 1, "drained": 0, "banned": 0}

WEIGHTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "default": {},
    "description": "Relative share of new pilots per endpoint (its name as in servers, or "
    "backend/name as gridgate servers list shows it): 0 to 1000, default 1, 0 means never. A "
    "degraded endpoint counts half, a drained or banned one not at all.",
    "propertyNames": {"minLength": 1, "maxLength": 512},
    "additionalProperties": {"type": "integer", "minimum": 0, "maximum": MAX_WEIGHT},
}


def configured_weight(endpoint: Endpoint, weights: Mapping[str, int]) -> int:
    """The weight the config gives ``endpoint``: by its key, else by its name, else 1."""
    if endpoint.key in weights:
        return int(weights[endpoint.key])
    return int(weights.get(endpoint.name, 1))


def weight_errors(weights: Mapping[str, Any], endpoints: Sequence[Endpoint]) -> list[str]:
    """What is wrong with one backend's ``weights`` for its ``endpoints``: a name none of them
    has, one endpoint given twice (by name and by key) with two weights, a weight that is not
    an integer from 0 to 1000. Empty when all is well."""
    errors = []
    names = {e.name: e for e in endpoints}
    keys = {e.key: e for e in endpoints}
    for name, value in weights.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WEIGHT:
            errors.append(f"weights.{name}: {value!r} is not an integer from 0 to {MAX_WEIGHT}")
        if name not in names and name not in keys:
            known = ", ".join(e.name for e in endpoints) or "none"
            errors.append(f"weights.{name}: no such endpoint in this backend (it has {known})")
    for endpoint in endpoints:
        if endpoint.key in weights and endpoint.name in weights:
            by_key, by_name = weights[endpoint.key], weights[endpoint.name]
            if by_key != by_name:
                errors.append(
                    f"weights: {endpoint.name} is given {by_name!r} and as {endpoint.key} "
                    f"{by_key!r}; give one"
                )
    return errors


def effective_weights(
    candidates: Sequence[Endpoint],
    weights: Mapping[str, int],
    availability: Mapping[str, Availability] | None = None,
) -> list[int]:
    """Each candidate's weight in half units (:data:`UNIT`): its configured weight times the
    factor of its state in ``availability`` (by ``Endpoint.key``; absent means available).
    Zero means the endpoint is not to be chosen.

    :param candidates: the endpoints to weigh (a selector's ``candidates``).
    :param weights: the backend's ``weights`` (by name or key; 1 when not given).
    :param availability: this iteration's states by key (a selector's ``availability``).
    """
    states = availability or {}
    out = []
    for endpoint in candidates:
        state = states.get(endpoint.key)
        factor = FACTOR["available"] if state is None else FACTOR[state.state]
        out.append(configured_weight(endpoint, weights) * factor)
    return out


def _checked(items: Sequence[T], weights: Sequence[float]) -> list[float]:
    if len(items) != len(weights):
        raise ValueError(f"{len(items)} items but {len(weights)} weights")
    out = []
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"a weight is a finite number >= 0, got {w!r}")
        out.append(float(w))
    return out


# --- weighted random choice ------------------------------------------------------------------


def weighted_order(
    items: Sequence[T], weights: Sequence[float], rng: random.Random, k: int | None = None
) -> list[T]:
    """Up to ``k`` (default: all) of ``items`` drawn at random without replacement, each draw
    choosing among those left with probability proportional to its weight; items of weight 0
    are never drawn, so fewer than ``k`` come back when fewer have a weight.

    The first item is the weighted choice; the rest are where to go next when it fails. Drawn
    as Efraimidis and Spirakis do (each item keyed ``log(u) / w`` for a uniform ``u``, the
    largest keys first), which gives the same distribution as drawing one at a time and
    removing it, in O(n log k) rather than O(n k).

    :raises ValueError: for a weight that is negative, not finite, or a count mismatch.
    """
    checked = _checked(items, weights)
    if k is not None and k <= 0:
        return []
    keyed = []
    for index, w in enumerate(checked):
        if w > 0:
            # 1 - random() is in (0, 1]: log is finite; log(u) / w is exact where u ** (1 / w)
            # would round to 1.0 for large weights
            keyed.append((math.log(1.0 - rng.random()) / w, index))
    want = len(keyed) if k is None else min(k, len(keyed))
    return [items[i] for _key, i in heapq.nlargest(want, keyed)]


def weighted_choice(items: Sequence[T], weights: Sequence[float], rng: random.Random) -> T | None:
    """One of ``items`` with probability proportional to its weight; None when none has one.

    :param items: what to choose from.
    :param weights: one number >= 0 per item (0: never chosen).
    :param rng: the random source (a seeded ``random.Random`` for reproducible runs).
    """
    order = weighted_order(items, weights, rng, k=1)
    return order[0] if order else None


# --- smooth weighted round robin -------------------------------------------------------------


class SmoothWeightedRoundRobin:
    """nginx's smooth weighted round robin (``ngx_http_upstream_get_peer``): at each pick every
    eligible item's current weight grows by its weight, the largest current weight wins (ties:
    the first in the order given) and gives back the sum of the weights. Deterministic; over
    any ``sum(weights)`` picks from a fresh start (or from :meth:`reset`) with the same items
    and weights each item is picked exactly its weight times, spread out (weights 5, 1, 1 give
    a a b a c a a, not a a a a a b c).

    State carries between calls, one current weight per item. An item of weight 0 or absent
    from a call is skipped and its current weight kept, as nginx keeps a down peer's, so the
    current weights of all items always sum to zero and the shares come back when it returns.
    Thread-safe.
    """

    def __init__(self) -> None:
        self._current: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def choose(self, items: Sequence[K], weights: Sequence[int]) -> K | None:
        """The next of ``items`` (weights are integers >= 0); None when every weight is 0.

        :param items: the eligible items (hashable: their current weights are kept by item).
        :param weights: one integer >= 0 per item.

        :raises ValueError: for a weight that is not an integer >= 0, or a count mismatch.
        """
        if len(items) != len(weights):
            raise ValueError(f"{len(items)} items but {len(weights)} weights")
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, int) or w < 0:
                raise ValueError(f"a round-robin weight is an integer >= 0, got {w!r}")
        with self._lock:
            best: K | None = None
            best_current = 0
            total = 0
            seen: set[Hashable] = set()
            for item, w in zip(items, weights, strict=True):
                if w == 0 or item in seen:
                    continue
                seen.add(item)
                current = self._current.get(item, 0) + w
                self._current[item] = current
                total += w
                if best is None or current > best_current:
                    best, best_current = item, current
            if best is not None:
                self._current[best] -= total
            return best

    def current(self) -> dict[Hashable, int]:
        """A copy of the current weights (for tests and diagnostics)."""
        with self._lock:
            return dict(self._current)

    def reset(self) -> None:
        """Start a new cycle: every current weight back to zero."""
        with self._lock:
            self._current.clear()

    def retain(self, items: Iterable[Hashable]) -> None:
        """Forget items not in ``items`` (servers no longer configured). When one of them had a
        current weight, the sum would no longer be zero, so a new cycle starts."""
        keep = set(items)
        with self._lock:
            gone = [i for i in self._current if i not in keep]
            if any(self._current[i] for i in gone):
                self._current.clear()
            else:
                for i in gone:
                    del self._current[i]


# --- throughput ------------------------------------------------------------------------------


#: names of API 1.4 that moved to gridgate.core.builtin.selectors (a DeprecationWarning says where)
__getattr__ = moved_names(__name__)
