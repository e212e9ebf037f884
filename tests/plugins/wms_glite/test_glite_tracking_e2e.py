"""End to end: the director tracks its pilots on the stand-in gLite WMS (real processes, real
sqlite state). A server that accepts every submission while every pilot it takes aborts
leaves rotation within 2 status polls of the aborts becoming visible, with one error
notification; each poll is one glite-wms-job-status per server, for 1 or 5,000 pilots.
The director's clock and the stand-ins' clock file move together; nothing sleeps."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.model import Endpoint
from gridgate.core.state import Pilot
from gridgate.core.testing import Collector, make_config
from gridgate.plugins.wms_glite.sim import commands_section, read_calls
from gridgate.plugins.wms_glite.sim.jobs import JobTable, set_clock

GOOD, ABORTS = "wms01.example.org", "wms02.example.org"
T0 = 1_800_000_000.0


@pytest.fixture
def world(request: Any, tmp_path: Path, sim_bin: Path, scenario: Any) -> Any:
    failing_expiry = getattr(request, "param", 3600)
    clock_file = tmp_path / "simclock"
    set_clock(clock_file, T0)
    path = scenario(
        hosts={GOOD: {"pilots": {"outcome": "done"}}, ABORTS: {"pilots": {"outcome": "aborted"}}},
        clock_file=str(clock_file),
    )
    clock = FakeClock(T0)
    collector = Collector()
    doc = {
        "director": {
            "cycle_seconds": 1,
            "max_threads": 4,
            "command_timeout": 20,
            "failing_expiry": failing_expiry,
            "ticket_expiry": 3600,
            "state_dir": str(tmp_path / "state"),
        },
        "state": {"driver": "sqlite", "path": str(tmp_path / "state" / "state.db")},
        "backends": {
            "wms_glite": {
                "servers": [GOOD, ABORTS],
                "commands": commands_section(sim_bin),
                "list_match": False,
                "work_dir": str(tmp_path),
                "env": {"GRIDGATE_SIM_SCENARIO": str(path)},
            }
        },
        "demand": {"static": {"wms_glite": 20}},
        "selectors": {"round_robin": {}},
    }
    director = Director(make_config(doc), clock=clock, extra_plugins=[collector])

    def advance(seconds: float) -> None:
        clock.advance(seconds)
        set_clock(clock_file, clock.time())

    yield director, collector, advance, tmp_path
    director.close()


def status_calls(log: Path, since: int = 0) -> Counter[str]:
    calls = [c for c in read_calls(log) if c.command == "glite-wms-job-status"][since:]
    return Counter(c.host for c in calls)


def test_a_server_whose_every_pilot_aborts_leaves_rotation_with_one_error(world, calls_log) -> None:
    director, collector, advance, _ = world
    first = director.run_iteration()
    assert Counter(r.endpoint for r in first.records if r.outcome == "submitted") == {
        GOOD: 10,
        ABORTS: 10,
    }
    assert status_calls(calls_log) == Counter()  # nothing was tracked when it began
    advance(10)  # the aborting server's pilots aborted after 3 s; the good ones still run
    second = director.run_iteration()
    # the first poll that could see the aborts took the server out of rotation
    assert status_calls(calls_log) == {GOOD: 1, ABORTS: 1}
    assert f"wms_glite/{ABORTS}" in second.excluded
    assert second.pilots is not None and second.pilots.aborted == (f"wms_glite/{ABORTS}",)
    assert {r.endpoint for r in second.records if r.outcome == "submitted"} == {GOOD}
    [note] = collector.notes
    assert note.level == "error" and note.endpoint.name == ABORTS
    assert "aborted" in note.body
    assert "Cannot plan: BrokerHelper: no compatible resources" in note.body
    advance(10)
    third = director.run_iteration()
    assert status_calls(calls_log) == {GOOD: 2, ABORTS: 1}  # out of rotation: not even asked
    assert {r.endpoint for r in third.records if r.outcome == "submitted"} == {GOOD}
    assert len(collector.notes) == 1  # one error for the episode
    counts = director.state.pilot_registry().counts()
    assert counts.get(("wms_glite", ABORTS, "failed")) == 10
    assert (
        counts.get(("wms_glite", GOOD, "running"), 0)
        + counts.get(("wms_glite", GOOD, "waiting"), 0)
        > 0
    )


@pytest.mark.parametrize("tracked", [1, 5000])
def test_one_status_query_per_server_and_poll_whatever_the_number_of_pilots(
    world, calls_log, tracked
) -> None:
    director, _, advance, tmp_path = world
    # ``tracked`` pilots on the good server, as if submitted earlier: in the director's
    # registry and in the stand-in's bookkeeping (thousands of submissions would only slow
    # the test); the director's own submissions of this iteration come on top.
    table = JobTable(tmp_path / "simstate")
    url = Endpoint("wms_glite", GOOD, f"https://{GOOD}:7443/glite_wms_wmproxy_server").url
    ids = [f"https://lb01.example.org:9000/Tracked{n:015d}" for n in range(tracked)]
    for job_id in ids:
        table.add(url, job_id, [], T0)
    director.state.pilot_registry().put(
        Pilot(
            job_id=j, backend="wms_glite", endpoint=GOOD, submitted=T0, state="waiting", changed=T0
        )
        for j in ids
    )
    advance(20)  # every tracked pilot has finished (done) by now
    summary = director.run_iteration()
    calls = [c for c in read_calls(calls_log) if c.command == "glite-wms-job-status"]
    assert [(c.host, c.ids) for c in calls] == [(GOOD, tracked)]
    assert summary.pilots is not None
    [poll] = [p for p in summary.pilots.polls if p.endpoint == GOOD]
    assert poll.pilots == tracked and poll.commands == 1 and poll.changed == tracked
    assert director.state.pilot_registry().counts().get(("wms_glite", GOOD, "done")) == tracked


@pytest.mark.parametrize("world", [60], indirect=True)
def test_an_alarm_when_the_aborting_persists_after_the_failing_cache(world, calls_log) -> None:
    director, collector, advance, _ = world
    director.run_iteration()
    advance(10)
    director.run_iteration()  # out of rotation, the error
    assert collector.levels() == ["error"]
    advance(60)  # the failing cache has expired: the server is back, takes pilots again
    back = director.run_iteration()
    assert ABORTS in {r.endpoint for r in back.records if r.outcome == "submitted"}
    advance(10)
    again = director.run_iteration()
    assert f"wms_glite/{ABORTS}" in again.excluded
    assert collector.levels() == ["error", "alarm"]
    assert collector.notes[-1].endpoint.name == ABORTS


def test_separate_processes_restart_summary_and_cancel(
    tmp_path, sim_bin, scenario, gridgate_exe
) -> None:
    """`gridgate run --once` twice (a restart between: the second process polls the pilots the
    first submitted), then `gridgate pilots summary` and `gridgate pilots cancel` from others."""
    import json
    import subprocess

    import yaml

    clock_file = tmp_path / "simclock"
    set_clock(clock_file, T0)
    path = scenario(
        hosts={
            GOOD: {"pilots": {"outcome": "done", "running": 1000}},
            ABORTS: {"pilots": {"outcome": "aborted"}},
        },
        clock_file=str(clock_file),
    )
    site = tmp_path / "site.yaml"
    site.write_text(
        yaml.safe_dump(
            {
                "director": {
                    "cycle_seconds": 0.1,
                    "max_threads": 4,
                    "command_timeout": 20,
                    "state_dir": str(tmp_path / "state"),
                },
                "state": {"driver": "sqlite", "path": str(tmp_path / "state" / "state.db")},
                "backends": {
                    "wms_glite": {
                        "servers": [GOOD, ABORTS],
                        "list_match": False,
                        "commands": {"submit": str(sim_bin / "glite-wms-job-submit")},
                        "env": {"GRIDGATE_SIM_SCENARIO": str(path)},
                    }
                },
                "demand": {"static": {"wms_glite": 4}},
                "selectors": {"round_robin": {}},
            }
        ),
        encoding="utf-8",
    )

    def gridgate(*args: str) -> Any:
        proc = subprocess.run([gridgate_exe, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1] if args[0] == "run" else proc.stdout)

    first = gridgate("run", "-c", str(site), "--once", "--json")
    assert len(first["submitted"]) == 4
    set_clock(clock_file, T0 + 10)  # wms02's pilots have aborted; wms01's run
    gridgate(
        "run", "-c", str(site), "--once", "--json"
    )  # a new process: polls what the first submitted
    summary = gridgate("pilots", "summary", "-c", str(site), "--json")["endpoints"]
    assert summary[f"wms_glite/{ABORTS}"]["failed"] == 2
    assert (
        summary[f"wms_glite/{GOOD}"]["running"] == 2
        and summary[f"wms_glite/{GOOD}"]["waiting"] == 2
    )
    running = gridgate(
        "pilots", "list", "-c", str(site), "--endpoint", GOOD, "--state", "running", "--json"
    )
    ids = [p["job_id"] for p in running["pilots"]]
    assert len(ids) == 2 and {p["native"] for p in running["pilots"]} == {"Running"}
    cancelled = gridgate("pilots", "cancel", *ids, "-c", str(site), "--json")
    assert sorted(cancelled["cancelled"][f"wms_glite/{GOOD}"]) == sorted(ids)
    cancel_calls = [
        c for c in read_calls(tmp_path / "calls.jsonl") if c.command == "glite-wms-job-cancel"
    ]
    assert [(c.host, c.ids) for c in cancel_calls] == [(GOOD, 2)]
