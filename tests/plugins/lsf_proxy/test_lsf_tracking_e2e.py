"""End to end: the director tracks its pilots on the stand-in LSF (real processes, sqlite
state). A queue whose every pilot exits non-zero leaves rotation at the first poll that sees
it, with one error notification; every poll is one bjobs per queue. The director's clock and
the stand-in's clock file move together; nothing sleeps."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gridgate.core.clock import FakeClock, write_file_time
from gridgate.core.engine.director import Director
from gridgate.core.testing import Collector, make_config
from gridgate.plugins.lsf_proxy.sim import install_commands, write_scenario

T0 = 1_800_000_000.0


@pytest.fixture
def world(tmp_path: Path):
    bin_dir = install_commands(tmp_path / "bin")
    clock_file, calls = tmp_path / "clock", tmp_path / "calls.jsonl"
    write_file_time(clock_file, T0)
    scenario = write_scenario(
        tmp_path / "scenario.json",
        {
            "state_dir": str(tmp_path / "lsf"),
            "clock_file": str(clock_file),
            "calls_log": str(calls),
            "queues": {
                "normal": {"pilots": {"pend": 2, "run": 30, "outcome": "done"}},
                "broken": {"pilots": {"pend": 1, "run": 1, "outcome": "exit", "exit_code": 127}},
            },
        },
    )
    clock = FakeClock(T0)
    collector = Collector()
    doc = {
        "director": {
            "cycle_seconds": 1,
            "max_threads": 4,
            "command_timeout": 20,
            "failing_expiry": 3600,
            "ticket_expiry": 3600,
            "state_dir": str(tmp_path / "state"),
        },
        "state": {"driver": "sqlite", "path": str(tmp_path / "state" / "state.db")},
        "backends": {
            "lsf": {
                "queues": ["normal", "broken"],
                "tokens": False,
                "commands": {n: str(bin_dir / n) for n in ("bsub", "bjobs", "bkill")},
                "env": {"GRIDGATE_LSF_SCENARIO": str(scenario)},
            }
        },
        "demand": {"static": {"lsf": 20}},
        "selectors": {"round_robin": {}},
    }
    director = Director(make_config(doc), clock=clock, extra_plugins=[collector])

    def advance(seconds: float) -> None:
        clock.advance(seconds)
        write_file_time(clock_file, clock.time())

    def bjobs_per_queue() -> Counter[str]:
        lines = calls.read_text().splitlines() if calls.exists() else []
        return Counter(e["queue"] for e in map(json.loads, lines) if e["command"] == "bjobs")

    yield director, collector, advance, bjobs_per_queue
    director.close()


def test_a_queue_whose_every_pilot_exits_leaves_rotation_with_one_error(world) -> None:
    director, collector, advance, bjobs_per_queue = world
    first = director.run_iteration()
    assert Counter(r.endpoint for r in first.records if r.outcome == "submitted") == {
        "normal": 10,
        "broken": 10,
    }
    advance(5)
    second = director.run_iteration()
    assert bjobs_per_queue() == {"normal": 1, "broken": 1}
    assert (
        "lsf/broken" in second.excluded
        and second.pilots is not None
        and second.pilots.aborted == ("lsf/broken",)
    )
    assert {r.endpoint for r in second.records if r.outcome == "submitted"} == {"normal"}
    [note] = collector.notes
    assert note.level == "error" and note.endpoint.name == "broken" and "EXIT" in note.body
    advance(5)
    director.run_iteration()
    assert bjobs_per_queue() == {"normal": 2, "broken": 1}
    assert len(collector.notes) == 1
    counts = director.state.pilot_registry().counts()
    assert counts.get(("lsf", "broken", "failed")) == 10
    # 10 of the first iteration and 20 of the second run; the third's 20 wait
    assert counts.get(("lsf", "normal", "running")) == 30
    assert counts.get(("lsf", "normal", "waiting")) == 20


@pytest.mark.parametrize("tracked", [1, 5000])
def test_one_bjobs_per_queue_and_poll_whatever_the_number_of_pilots(
    world, tmp_path, tracked
) -> None:
    from gridgate.core.state import Pilot

    director, _, advance, bjobs_per_queue = world
    # ``tracked`` pilots on `normal`, as if submitted earlier: in the director's registry and in
    # the stand-in's job table (thousands of bsubs would only slow the test)
    ids = [str(500000 + n) for n in range(tracked)]
    (tmp_path / "lsf").mkdir(exist_ok=True)
    with open(tmp_path / "lsf" / "jobs.jsonl", "a", encoding="utf-8") as handle:
        handle.writelines(
            json.dumps(
                {
                    "id": int(j),
                    "user": "pilot",
                    "queue": "normal",
                    "name": "p",
                    "stat": "PEND",
                    "submitted": T0,
                    "host": "h",
                    "command": ["pilot.sh"],
                }
            )
            + "\n"
            for j in ids
        )
    director.state.pilot_registry().put(
        Pilot(job_id=j, backend="lsf", endpoint="normal", submitted=T0, state="waiting", changed=T0)
        for j in ids
    )
    advance(5)  # PEND 2 s, then RUN
    summary = director.run_iteration()
    assert bjobs_per_queue() == {"normal": 1}
    [poll] = [p for p in summary.pilots.polls if p.endpoint == "normal"]
    assert poll.pilots == tracked and poll.commands == 1 and poll.changed == tracked
    assert director.state.pilot_registry().counts().get(("lsf", "normal", "running")) == tracked
