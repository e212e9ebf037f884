"""The engine's own records read back (gridgate.core.engine.records): one that no director
wrote is that record's problem, read as absent or skipped, never an iteration's crash."""

from __future__ import annotations

import json

import pytest

from gridgate.core.clock import FakeClock
from gridgate.core.documents import DocumentError
from gridgate.core.engine.availability import TOLD, told_states
from gridgate.core.engine.pending import PENDING_FILE, PendingPilots
from gridgate.core.engine.records import clock_time
from gridgate.core.engine.section import DirectorSettings
from gridgate.core.engine.stall import StallWatch
from gridgate.core.model import AccountingRecord, IterationInfo
from gridgate.core.state import Pilot
from gridgate.core.stores.memory import MemoryState


def test_a_stall_episode_of_another_shape_starts_a_new_one() -> None:
    clock = FakeClock()
    state = MemoryState(clock=clock)
    watch = StallWatch(state, clock, "host:site.yaml")
    state.set(watch.key, json.dumps({"since": 1.0, "iterations": "many"}))
    refused = [
        AccountingRecord(
            time=0, backend="b", endpoint="e", outcome="refused", pilots=2, failure_kind="x"
        )
    ]
    director = DirectorSettings.of({"stall_iterations": 1})
    notes = watch.observe(IterationInfo(1, clock.time()), refused, director)
    assert [n.level for n in notes] == ["error"]
    episode = json.loads(state.get(watch.key) or "")
    assert episode["iterations"] == 1 and episode["since"] == clock.time()


def test_a_pending_file_keeps_its_good_pilots_and_skips_a_bad_one(tmp_path) -> None:
    good = Pilot("j1", "b", "e", submitted=5.0)
    (tmp_path / PENDING_FILE).write_text(
        json.dumps(
            {
                "known": [["b", "e", "waiting", 3]],
                "known_cores": {"b/e": 3},
                "unrecorded": [good.as_dict(), {"job_id": "j2", "state": "queued"}],
            }
        )
    )
    pending = PendingPilots(lambda: str(tmp_path))
    pending.load()
    assert pending.unrecorded == 1
    assert pending.counts() == {("b", "e", "waiting"): 4}


def test_a_told_availability_of_another_shape_is_left_out() -> None:
    state = MemoryState(clock=FakeClock())
    state.set(TOLD + "b/e1", json.dumps({"state": "banned", "since": 3.0, "reason": "r"}))
    state.set(TOLD + "b/e2", json.dumps({"state": "banned", "until": "tomorrow"}))
    state.set(TOLD + "b/e3", "[")
    told = told_states(state)
    assert list(told) == ["b/e1"] and told["b/e1"][1] == 3.0
    assert told["b/e1"][0] is not None and told["b/e1"][0].reason == "r"


def test_a_clock_time_is_a_finite_number() -> None:
    assert clock_time(repr(12.5), "t") == 12.5 and clock_time(None, "t") is None
    for bad in ("nan", "1e999", "soon", " 1_0"):
        with pytest.raises(DocumentError):
            clock_time(bad, "t")
