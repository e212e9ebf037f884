"""Pilot efficiency (gridgate.core.builtin.efficiency): DIRAC's thresholds and minimum sample, what
"recent" means (window, last N, which states count), the properties that matter (never a
verdict below the minimum sample; monotone in the failed share), the schema's bounds, and the
source over a real sqlite pilot registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gridgate.core.builtin.efficiency import (
    EFFICIENCY_SCHEMA,
    EfficiencySettings,
    PilotEfficiency,
    judge,
)
from gridgate.core.clock import FakeClock
from gridgate.core.model import AVAILABLE, Endpoint
from gridgate.core.state import MemoryPilots, Pilot, StateError
from gridgate.core.stores.sqlite import SqliteState

NOW = 1_700_000_000.0
DEFAULT = EfficiencySettings()


def pilots(done: int, failed: int, *, state: str = "failed", start: float = NOW) -> list[Pilot]:
    """``done`` done and ``failed`` pilots of one endpoint, finished a second apart before
    ``start`` (the failed ones most recently)."""
    out = []
    for i in range(done + failed):
        out.append(
            Pilot(
                job_id=f"j{i}",
                backend="slurm",
                endpoint="ce01",
                state=state if i < failed else "done",
                submitted=start - 10_000,
                changed=start - i,
            )
        )
    return out


# --- DIRAC's figures -------------------------------------------------------------------------


def test_defaults_are_diracs() -> None:
    # PilotEfficiencyPolicy: efficiency <= 0.9 Degraded, <= 0.5 Banned, no decision below 10
    # pilots; its summary counts the last day
    assert DEFAULT.degrade_threshold == pytest.approx(1 - 0.9)
    assert DEFAULT.abort_threshold == 0.5
    assert DEFAULT.min_finished == 10
    assert DEFAULT.window == 86400


@pytest.mark.parametrize(
    "done, failed, state",
    [
        (10, 0, "available"),
        (91, 9, "available"),  # efficiency 0.91
        (90, 10, "degraded"),  # 0.90: DIRAC's "<= 0.9" is degraded
        (60, 40, "degraded"),
        (50, 50, "degraded"),  # the tracker's aborted verdict starts above 0.5
        (10, 90, "degraded"),  # never better as the share grows
    ],
)
def test_verdict_by_share(done: int, failed: int, state: str) -> None:
    verdict = judge(pilots(done, failed), NOW, DEFAULT)
    assert verdict.judged and verdict.state == state
    assert (verdict.done, verdict.failed) == (done, failed)
    if state == "degraded":
        assert f"{failed} of its last 100 finished pilots" in verdict.reason
        assert verdict.availability().source == "pilot efficiency"
        assert verdict.availability().until is None


def test_below_the_minimum_sample_nothing_is_judged() -> None:
    verdict = judge(pilots(0, 9), NOW, DEFAULT)
    assert not verdict.judged and verdict.state == "available"
    assert verdict.availability() == AVAILABLE


def test_recent_is_the_window_and_the_last_n() -> None:
    settings = EfficiencySettings(window=3600, last=20, min_finished=10)
    old = pilots(0, 30, start=NOW - 3600)  # finished exactly a window ago or earlier
    assert not judge(old, NOW, settings).judged
    # 20 recent done pilots hide 30 older failures: only the last 20 count
    recent = [
        Pilot(f"d{i}", "slurm", "ce01", state="done", changed=NOW - i / 10) for i in range(20)
    ]
    verdict = judge(recent + pilots(0, 30, start=NOW - 100), NOW, settings)
    assert (verdict.done, verdict.failed, verdict.state) == (20, 0, "available")
    # pilots that changed after now (another director's clock ahead) do not count
    assert not judge(pilots(0, 30, start=NOW + 1000), NOW, settings).judged


def test_which_states_count() -> None:
    assert judge(pilots(0, 20, state="cancelled"), NOW, DEFAULT).judged is False
    assert judge(pilots(0, 20, state="lost"), NOW, DEFAULT).state == "degraded"
    no_lost = EfficiencySettings(count_lost=False)
    assert judge(pilots(0, 20, state="lost"), NOW, no_lost).judged is False
    # running and waiting pilots have not finished
    assert judge(pilots(0, 20, state="running"), NOW, DEFAULT).judged is False


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"degrade_threshold": 0.5, "abort_threshold": 0.5}, "must be below pilots.abort"),
        ({"degrade_threshold": 0}, "degrade_threshold must be more than 0"),
        ({"window": 10}, "window must be at least 60"),
        ({"last": 5, "min_finished": 10}, "min_finished .10. is more than last .5."),
        ({"last": 2.5}, "last must be an integer"),
    ],
)
def test_settings_refuse_what_cannot_work(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EfficiencySettings(**kwargs)  # type: ignore[arg-type]


def test_schema_defaults_build_the_defaults_and_every_number_has_a_maximum() -> None:
    Draft202012Validator.check_schema(EFFICIENCY_SCHEMA)
    props = EFFICIENCY_SCHEMA["properties"]
    defaults = {k: v["default"] for k, v in props.items()}
    assert EfficiencySettings.from_config(defaults) == DEFAULT
    for name, prop in props.items():
        if prop["type"] in ("number", "integer"):
            assert "maximum" in prop, name
    validator = Draft202012Validator(EFFICIENCY_SCHEMA)
    assert list(validator.iter_errors({"last": 10001}))
    assert list(validator.iter_errors({"degrade_threshold": 1.5}))


# --- properties ------------------------------------------------------------------------------

thresholds = st.tuples(
    st.floats(min_value=0.01, max_value=0.98), st.floats(min_value=0.01, max_value=0.99)
).filter(lambda t: t[0] < t[1])


@given(st.integers(0, 200), st.integers(0, 200), st.integers(1, 50), thresholds)
def test_never_degrades_below_the_minimum_sample(
    done: int, failed: int, minimum: int, bounds: tuple[float, float]
) -> None:
    settings = EfficiencySettings(bounds[0], bounds[1], last=200, min_finished=minimum)
    verdict = judge(pilots(done, failed), NOW, settings)
    if done + failed < minimum:
        assert verdict.state == "available" and not verdict.judged
    else:
        assert verdict.judged


@given(st.integers(10, 150), st.data(), thresholds)
def test_monotone_in_the_failed_share(
    n: int, data: st.DataObject, bounds: tuple[float, float]
) -> None:
    settings = EfficiencySettings(bounds[0], bounds[1], last=150)
    low = data.draw(st.integers(0, n))
    high = data.draw(st.integers(low, n))
    rank = {"available": 0, "degraded": 1}
    less = judge(pilots(n - low, low), NOW, settings)
    more = judge(pilots(n - high, high), NOW, settings)
    assert rank[less.state] <= rank[more.state]
    assert (more.state == "degraded") == (high / n >= bounds[0])


# --- the source over a real registry ---------------------------------------------------------


def test_source_over_a_sqlite_registry_says_changes_once(tmp_path: Path) -> None:
    clock = FakeClock(NOW)
    store = SqliteState({"path": str(tmp_path / "state.db")}, clock=clock)
    try:
        registry = store.pilot_registry()
        ce01, ce02 = Endpoint("slurm", "ce01"), Endpoint("slurm", "ce02")
        source = PilotEfficiency(EfficiencySettings(), clock=clock)
        registry.put(pilots(80, 20))  # ce01: efficiency 0.8
        # ce02: 30 cancelled pilots finished last must not crowd out its 15 done ones
        registry.put(
            [Pilot(f"c{i}", "slurm", "ce02", state="cancelled", changed=NOW) for i in range(30)]
            + [Pilot(f"d{i}", "slurm", "ce02", state="done", changed=NOW - 50) for i in range(15)]
        )
        states, changes = source.evaluate(registry, [ce01, ce02])
        assert states["slurm/ce01"].state == "degraded"
        assert states["slurm/ce02"] == AVAILABLE
        assert [(c.endpoint, c.kind) for c in changes] == [("slurm/ce01", "started")]
        clock.advance(10)
        registry.put([Pilot("late", "slurm", "ce01", state="failed", changed=NOW + 5)])
        states, changes = source.evaluate(registry, [ce01, ce02])
        assert states["slurm/ce01"].state == "degraded" and changes == []  # reason moved only
        clock.advance(86400)  # the day passes: nothing recent, no verdict
        states, changes = source.evaluate(registry, [ce01, ce02])
        assert states["slurm/ce01"] == AVAILABLE
        assert [(c.endpoint, c.kind) for c in changes] == [("slurm/ce01", "ended")]
    finally:
        store.close()


def test_only_changed_or_stale_endpoints_are_read_again() -> None:
    clock = FakeClock(NOW)
    registry = MemoryPilots()
    ce01 = Endpoint("slurm", "ce01")
    source = PilotEfficiency(EfficiencySettings(refresh=600), clock=clock)
    registry.put(pilots(80, 20))
    assert source.evaluate(registry, [ce01])[0][ce01.key].state == "degraded"
    # 200 done pilots later ce01 is fine, but nothing said its pilots changed: not read
    registry.put(
        [Pilot(f"n{i}", "slurm", "ce01", state="done", changed=NOW + 1) for i in range(200)]
    )
    clock.advance(2)
    assert source.evaluate(registry, [ce01], changed=set())[0][ce01.key].state == "degraded"
    states, changes = source.evaluate(registry, [ce01], changed={ce01.key})
    assert states[ce01.key] == AVAILABLE and [c.kind for c in changes] == ["ended"]
    # unchanged, but judged refresh seconds ago: read again (the window slides)
    registry.put(
        [Pilot(f"f{i}", "slurm", "ce01", state="failed", changed=NOW + 2) for i in range(100)]
    )  # finished now: read, they would count
    assert source.evaluate(registry, [ce01], changed=set())[0][ce01.key] == AVAILABLE
    clock.advance(600)
    assert source.evaluate(registry, [ce01], changed=set())[0][ce01.key].state == "degraded"


class _Flaky(MemoryPilots):
    """A real in-memory registry whose reads fail while ``down`` is set."""

    down = False

    def last_finished(self, backend: str, endpoint: str, n: int, after: float = 0.0) -> list[Pilot]:
        if self.down:
            raise StateError("redis://127.0.0.1:1/0: connection refused")
        return super().last_finished(backend, endpoint, n, after)


def test_registry_down_keeps_the_last_verdict() -> None:
    clock = FakeClock(NOW)
    registry = _Flaky()
    ce01 = Endpoint("slurm", "ce01")
    source = PilotEfficiency(EfficiencySettings(refresh=0), clock=clock)
    registry.put(pilots(50, 50))
    assert source.evaluate(registry, [ce01])[0][ce01.key].state == "degraded"
    registry.down = True
    states, changes = source.evaluate(registry, [ce01])
    assert states[ce01.key].state == "degraded" and changes == []
    registry.down = False
    clock.advance(86400)
    assert source.evaluate(registry, [ce01])[0][ce01.key] == AVAILABLE
