"""Weighted endpoint choice (gridgate.core.weights): configured weights and the availability
factor, a weighted random choice without replacement whose frequencies match the weights
(chi-square over a seeded RNG), nginx's smooth weighted round robin (exact over a cycle, never
an excluded endpoint, within two picks of its share whatever came before), and the throughput
weight read from a real sqlite pilot registry."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gridgate.core.builtin.selectors import (
    THROUGHPUT_SCHEMA,
    read_throughput,
    throughput,
    throughput_weights,
)
from gridgate.core.clock import FakeClock
from gridgate.core.model import Availability, Endpoint
from gridgate.core.state import Pilot
from gridgate.core.stores.sqlite import SqliteState
from gridgate.core.weights import (
    UNIT,
    WEIGHTS_SCHEMA,
    SmoothWeightedRoundRobin,
    configured_weight,
    effective_weights,
    weight_errors,
    weighted_choice,
    weighted_order,
)

A, B, C, D = (Endpoint("wms_glite", n) for n in ("a", "b", "c", "d"))


def chi2_critical(df: int, z: float = 3.719) -> float:
    """The chi-square quantile for ``df`` degrees of freedom at the normal quantile ``z``
    (3.719: one in 10,000), by Wilson and Hilferty's approximation (good to a few per cent for
    df >= 1, far closer than the margin between a right and a wrong weighting here)."""
    h = 2 / (9 * df)
    return df * (1 - h + z * math.sqrt(h)) ** 3


def chi2(observed: Mapping[Any, int], expected: Mapping[Any, float]) -> float:
    assert set(observed) <= set(expected), set(observed) - set(expected)
    return sum((observed.get(k, 0) - e) ** 2 / e for k, e in expected.items())


# --- configured and effective weights --------------------------------------------------------


def test_weights_by_name_or_key_default_one() -> None:
    weights = {"a": 3, "wms_glite/b": 0}
    assert [configured_weight(e, weights) for e in (A, B, C)] == [3, 0, 1]


def test_availability_factor_halves_degraded_and_drops_drained_and_banned() -> None:
    states = {
        B.key: Availability("degraded", "GOCDB WARNING"),
        C.key: Availability("drained", "operator"),
        D.key: Availability("banned", "operator"),
    }
    assert effective_weights([A, B, C, D], {"a": 3, "b": 3}, states) == [6, 3, 0, 0]
    assert effective_weights([A], {}, None) == [UNIT]


def test_weight_errors_name_what_is_wrong() -> None:
    assert weight_errors({"a": 3, "wms_glite/b": 2}, [A, B]) == []
    errors = weight_errors({"x": 1, "a": 1001, "b": 2, "wms_glite/b": 3}, [A, B])
    assert any("weights.x: no such endpoint in this backend (it has a, b)" in e for e in errors)
    assert any("weights.a: 1001 is not an integer from 0 to 1000" in e for e in errors)
    assert any("b is given 2 and as wms_glite/b 3" in e for e in errors)


def test_schemas() -> None:
    for schema in (WEIGHTS_SCHEMA, THROUGHPUT_SCHEMA):
        Draft202012Validator.check_schema(schema)
    weights = Draft202012Validator(WEIGHTS_SCHEMA)
    assert not list(weights.iter_errors({"a": 0, "wms_glite/b": 1000}))
    for bad in ({"a": 1001}, {"a": -1}, {"a": 1.5}, {"a": True}, {"": 1}):
        assert list(weights.iter_errors(bad)), bad
    for name, prop in THROUGHPUT_SCHEMA["properties"].items():
        assert "maximum" in prop, name


# --- weighted random choice ------------------------------------------------------------------


def test_frequencies_of_one_choice_match_the_weights() -> None:
    rng = random.Random(20261201)
    items = [A, B, C, D]
    weights = [6, 3, 0, 1]  # c never
    draws = 40_000
    seen = Counter(weighted_choice(items, weights, rng) for _ in range(draws))
    assert C not in seen
    expected = {A: draws * 0.6, B: draws * 0.3, D: draws * 0.1}
    assert chi2(seen, expected) < chi2_critical(df=2)
    # the same statistic rejects a uniform choice over the same three: the test can fail
    uniform = Counter(rng.choice([A, B, D]) for _ in range(draws))
    assert chi2(uniform, expected) > chi2_critical(df=2)


def test_without_replacement_the_second_draw_follows_the_weights_left() -> None:
    rng = random.Random(7)
    items, weights = ["a", "b", "c"], [5.0, 3.0, 2.0]
    draws = 30_000
    seen: Counter[object] = Counter(
        tuple(weighted_order(items, weights, rng, k=2)) for _ in range(draws)
    )
    total = sum(weights)
    expected: dict[object, float] = {}
    for (i, wi), (j, wj) in itertools.permutations(zip(items, weights, strict=True), 2):
        expected[(i, j)] = draws * (wi / total) * (wj / (total - wi))
    assert chi2(seen, expected) < chi2_critical(df=len(expected) - 1)


@given(
    st.lists(st.integers(0, 1000), min_size=0, max_size=12),
    st.integers(0, 2**32 - 1),
    st.one_of(st.none(), st.integers(0, 15)),
)
def test_order_is_distinct_positive_items_only(
    weights: list[int], seed: int, k: int | None
) -> None:
    items = list(range(len(weights)))
    order = weighted_order(items, weights, random.Random(seed), k)
    positive = [i for i in items if weights[i] > 0]
    assert len(order) == len(set(order))
    assert set(order) <= set(positive)
    assert len(order) == (len(positive) if k is None else min(k, len(positive)))


@pytest.mark.parametrize("weights", [[1, -1], [1, math.nan], [1, math.inf], [1]])
def test_bad_weights_are_refused(weights: Sequence[float]) -> None:
    with pytest.raises(ValueError):
        weighted_order(["a", "b"], weights, random.Random(1))


def test_none_when_no_weight() -> None:
    assert weighted_choice(["a", "b"], [0, 0], random.Random(1)) is None


# --- smooth weighted round robin -------------------------------------------------------------


def test_nginx_sequence() -> None:
    # nginx's own example: weights 5, 1, 1 give a a b a c a a, spread out
    wrr = SmoothWeightedRoundRobin()
    picks = "".join(str(wrr.choose(list("abc"), [5, 1, 1])) for _ in range(14))
    assert picks == "aabacaa" * 2


@given(st.lists(st.integers(0, 30), min_size=1, max_size=8), st.integers(1, 3))
def test_exact_proportions_over_a_cycle(weights: list[int], cycles: int) -> None:
    wrr = SmoothWeightedRoundRobin()
    items = list(range(len(weights)))
    picks = Counter(wrr.choose(items, weights) for _ in range(cycles * sum(weights)))
    assert picks == Counter({i: cycles * w for i, w in enumerate(weights) if w})
    assert all(v == 0 for v in wrr.current().values())  # back where it started


history = st.lists(st.lists(st.booleans(), min_size=8, max_size=8), max_size=60)


@given(st.lists(st.integers(0, 20), min_size=1, max_size=8), history, st.integers(1, 200))
def test_excluded_never_picked_and_within_two_of_its_share(
    weights: list[int], calls: list[list[bool]], run: int
) -> None:
    wrr = SmoothWeightedRoundRobin()
    items = list(range(len(weights)))
    for mask in calls:  # endpoints excluded and back, in any pattern
        present = [i for i in items if mask[i]]
        picked = wrr.choose(present, [weights[i] for i in present])
        assert picked is None or (picked in present and weights[picked] > 0)
        assert picked is not None or all(weights[i] == 0 for i in present)
        assert sum(wrr.current().values()) == 0
    total = sum(weights)
    if total == 0:
        return
    # whatever came before, over any run every endpoint is within two picks of its share
    picks = Counter(wrr.choose(items, weights) for _ in range(run))
    for i, w in enumerate(weights):
        assert abs(picks[i] - run * w / total) < 2, (i, picks, weights)


def test_retain_forgets_servers_and_restarts_the_cycle_when_it_must() -> None:
    wrr = SmoothWeightedRoundRobin()
    wrr.choose(["a", "b"], [1, 1])  # a picked: a -1, b +1
    wrr.retain(["a", "b", "c"])
    assert wrr.current() == {"a": -1, "b": 1}
    wrr.retain(["a"])  # b held +1: dropping it would break the zero sum
    assert wrr.current() == {}


def test_round_robin_refuses_bad_weights() -> None:
    wrr = SmoothWeightedRoundRobin()
    for bad in ([1, -1], [1, 1.5], [1, True]):
        with pytest.raises(ValueError):
            wrr.choose(["a", "b"], bad)  # type: ignore[arg-type]


# --- throughput ------------------------------------------------------------------------------


def test_throughput_from_a_sqlite_registry(tmp_path: Path) -> None:
    clock = FakeClock()
    now = clock.time()
    store = SqliteState({"path": str(tmp_path / "state.db")}, clock=clock)
    try:
        registry = store.pilot_registry()
        rows = [
            Pilot(f"d{i}", "slurm", "ce01", state="done", changed=now - 60 * i) for i in range(12)
        ]
        rows += [Pilot(f"f{i}", "slurm", "ce01", state="failed", changed=now) for i in range(5)]
        rows += [Pilot("old", "slurm", "ce01", state="done", changed=now - 7 * 3600)]
        rows += [Pilot("run", "slurm", "ce02", state="running", changed=now)]
        registry.put(rows)
        ce01, ce02 = Endpoint("slurm", "ce01"), Endpoint("slurm", "ce02")
        rates = read_throughput(registry, [ce01, ce02], now, window=6 * 3600)
        assert rates == {ce01: 2.0, ce02: 0.0}  # 12 done in 6 h; the new one has none
        assert throughput_weights(rates, floor=1.0) == {ce01: 2.0, ce02: 1.0}
    finally:
        store.close()


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=10), st.floats(0.001, 100))
def test_throughput_weights_never_below_the_floor(rates: list[float], floor: float) -> None:
    out = throughput_weights(dict(enumerate(rates)), floor)
    assert all(out[i] == max(r, floor) for i, r in enumerate(rates))


def test_throughput_refuses_a_bad_window_or_floor() -> None:
    with pytest.raises(ValueError, match="window"):
        throughput([], 0.0, 0)
    with pytest.raises(ValueError, match="floor"):
        throughput_weights({"a": 1.0}, 0)


def test_arc_weights_name_endpoints_as_servers_list_does_not_their_urls(tmp_path) -> None:
    """ARC's `endpoints` are URLs; its endpoints are named by host (or `name:`). A weight keyed
    by that name was refused ("no such endpoint ... it has https://...") and one keyed by the
    URL accepted, though it never took effect (found writing the ARC example site)."""
    from gridgate.core.config import ConfigError, validate_document

    section = {
        "endpoints": [
            "https://ce1.example.org/arex",
            {"url": "https://ce2.example.org/arex", "queue": "long", "name": "ce2-long"},
        ],
        "script": "/p.sh",
    }
    doc = {"director": {"state_dir": str(tmp_path)}, "demand": {"static": {"arc": 1}}}
    validate_document(
        {**doc, "backends": {"arc": {**section, "weights": {"ce1.example.org": 2, "ce2-long": 0}}}}
    )
    with pytest.raises(ConfigError) as refused:
        validate_document(
            {
                **doc,
                "backends": {"arc": {**section, "weights": {"https://ce1.example.org/arex": 2}}},
            }
        )
    assert "it has ce1.example.org, ce2-long" in str(refused.value)
