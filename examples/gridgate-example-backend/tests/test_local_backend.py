"""Tests of the ``local`` backend, written the way a plugin author would: with the helpers of
``gridgate.core.testing`` and real stand-in commands, no mocks."""

from __future__ import annotations

import contextlib
import sys

import pytest
from gridgate_example_backend import LocalBackend

from gridgate.core import hookimpl
from gridgate.core.config import ConfigError
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.testing import (
    Collector,
    build_plugin,
    director_for,
    plugin_manager_with,
    section_for,
)


def local(command, **section):
    return build_plugin(LocalBackend, {"command": [str(c) for c in command], **section})


# --- the config section -----------------------------------------------------------------------


def test_section_defaults() -> None:
    section = section_for(LocalBackend, {"command": ["pilot"]})
    assert section["servers"] == ["slot1"] and section["busy_exit_codes"] == [75]
    assert section["pilots_per_submission"] == 1


@pytest.mark.parametrize(
    ("section", "path", "words"),
    [
        ({"command": ["pilot", "{slott}"]}, ("command", 1), "unknown placeholder {slott}"),
        (
            {"command": ["pilot"], "job_id_pattern": "JOBID ("},
            ("job_id_pattern",),
            "invalid regular",
        ),
        (
            {"command": ["pilot"], "job_id_pattern": "JOBID \\S+"},
            ("job_id_pattern",),
            "exactly one",
        ),
        ({"command": []}, ("command",), "should be non-empty"),
        ({"command": "pilot --now"}, ("command",), "is not of type 'array'"),
        ({"command": ["p"], "servers": ["a b"]}, ("servers", 0), "does not match"),
    ],
)
def test_section_errors_name_the_key(section, path, words) -> None:
    with pytest.raises(ConfigError) as caught:
        section_for(LocalBackend, section)
    found = [(p.path, p.message) for p in caught.value.problems]
    assert any(p == path and words in m for p, m in found), found


# --- hooks, one by one ------------------------------------------------------------------------


def test_gridgate_backend_info_lists_the_slots_and_ignores_other_backends() -> None:
    with plugin_manager_with(local(["p"], servers=["a", "b"], pilots_per_submission=5)) as pm:
        info = pm.hook.gridgate_backend_info(backend="local")
        assert info.endpoints == (Endpoint("local", "a"), Endpoint("local", "b"))
        assert info.pilots_per_submission == 5
        assert pm.hook.gridgate_backend_info(backend="wms_glite") is None


def test_gridgate_submit_runs_the_command_with_placeholders_and_reads_ids(
    gridgate_stand_in,
) -> None:
    pilot = gridgate_stand_in("pilot", stdout="starting\nJOBID a-{call}\nJOBID b-{call}\n")
    backend = local([pilot, "--slot={slot}", "{group}", "-n", "{count}"])
    request = SubmitRequest(backend="local", group="long queue", count=2)
    with plugin_manager_with(backend) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=Endpoint("local", "s1"), request=request, timeout=30
        )
        other = pm.hook.gridgate_submit(endpoint=Endpoint("lsf", "q"), request=request, timeout=30)
    assert result.ok and result.job_ids == ("a-1", "b-1")
    assert other is None
    assert pilot.calls()[0]["argv"] == ["--slot=s1", "long queue", "-n", "2"]


def test_gridgate_submit_failure_is_a_result_with_its_evidence(gridgate_stand_in) -> None:
    pilot = gridgate_stand_in("pilot", stdout="JOBID never-used\n", stderr="no disk\n", exit_code=1)
    with plugin_manager_with(local([pilot])) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=Endpoint("local", "s1"), request=SubmitRequest(backend="local"), timeout=30
        )
    assert not result.ok and result.job_ids == ()
    assert result.command.returncode == 1 and result.command.stderr == "no disk\n"


def test_gridgate_submit_exit_zero_without_an_id_is_a_failure(gridgate_stand_in) -> None:
    pilot = gridgate_stand_in("pilot", stdout="all good, trust me\n")
    with plugin_manager_with(local([pilot])) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=Endpoint("local", "s1"), request=SubmitRequest(backend="local"), timeout=30
        )
    assert not result.ok and "no job id" in result.message


def test_gridgate_submit_kills_a_hanging_pilot_and_keeps_its_output(gridgate_stand_in) -> None:
    pilot = gridgate_stand_in("pilot", stdout="JOBID half\n", sleep=600)
    with plugin_manager_with(local([pilot], command_timeout=0.5)) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=Endpoint("local", "s1"), request=SubmitRequest(backend="local"), timeout=120
        )
    assert not result.ok and result.command.timed_out
    assert result.command.stdout == "JOBID half\n"


def test_gridgate_submit_missing_program_is_a_launch_failure(tmp_path) -> None:
    with plugin_manager_with(local([tmp_path / "no-such-pilot"])) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=Endpoint("local", "s1"), request=SubmitRequest(backend="local"), timeout=30
        )
    assert not result.ok and result.command.launch_error


def test_gridgate_classify_failure_busy_exit_code_only(gridgate_stand_in) -> None:
    busy = gridgate_stand_in("busy", exit_code=75)
    broken = gridgate_stand_in("broken", exit_code=2)
    with plugin_manager_with(local([busy])) as pm:
        endpoint = Endpoint("local", "s1")
        failed = pm.hook.gridgate_submit(
            endpoint=endpoint, request=SubmitRequest(backend="local"), timeout=30
        )
        kind = pm.hook.gridgate_classify_failure(endpoint=endpoint, result=failed)
    assert (kind.kind, kind.exclude, kind.notify) == ("busy", True, False)
    with plugin_manager_with(local([broken])) as pm:
        failed = pm.hook.gridgate_submit(
            endpoint=endpoint, request=SubmitRequest(backend="local"), timeout=30
        )
        assert pm.hook.gridgate_classify_failure(endpoint=endpoint, result=failed) is None


# --- a whole director iteration -----------------------------------------------------------------


class FirstCandidate:
    """Pick the first usable slot, so the busy one is surely tried first."""

    @hookimpl
    def gridgate_select_endpoint(self, candidates, request):
        return candidates[0]


def test_director_iteration_skips_a_busy_slot_quietly_and_fills_the_others(tmp_path) -> None:
    # the pilot says "busy" (exit 75) on slot s1 and starts fine elsewhere
    script = tmp_path / "pilot.py"
    script.write_text(
        "import sys\n"
        "slot = sys.argv[1]\n"
        "if slot == 's1':\n"
        "    sys.exit(75)\n"
        "print('JOBID', slot + '-ok')\n"
    )
    backend = local([sys.executable, script, "{slot}"], servers=["s1", "s2", "s3"])
    collector = Collector()
    doc = {
        "director": {"max_threads": 1, "state_dir": str(tmp_path / "state")},
        "demand": {"static": {"local": 6}},
    }
    with contextlib.closing(director_for(doc, backend, FirstCandidate(), collector)) as director:
        summary = director.run_iteration()
    # the pilot that met the busy slot is sent to the next one in the same iteration
    assert [(r.outcome, r.endpoint, r.failure_kind) for r in summary.records] == (
        [("failed", "s1", "busy")] + [("submitted", "s2", "")] * 6
    )
    assert [(e.failed_on, e.outcome) for e in summary.retries] == [("s1", "retried")]
    assert {i for r in summary.records for i in r.job_ids} == {"s2-ok"}
    assert summary.excluded == ("local/s1",)
    assert collector.notes == []  # busy is not news


# --- finding pilots by name -------------------------------------------------------------------

#: A slot that starts its pilot (recorded in a jobs file under the job name gridgate gives it),
#: then hangs before it says the job id: the director's command timeout kills it, the answer
#: is lost, and only the name tells which job was made.
SLOW_SLOT = """import os, sys, time
jobs = sys.argv[1]
with open(jobs, "a") as f:
    f.write(f"job-{os.getpid()} {os.environ['GRIDGATE_JOB_NAME']} waiting\\n")
if sys.argv[2] == "slow":
    time.sleep(600)
print("JOBID", f"job-{os.getpid()}")
"""
LIST = "import sys\nprint(open(sys.argv[1]).read() if __import__('os').path.exists(sys.argv[1]) else '', end='')\n"


def slots(tmp_path, **section):
    (tmp_path / "pilot.py").write_text(SLOW_SLOT)
    (tmp_path / "list.py").write_text(LIST)
    jobs = tmp_path / "jobs.txt"
    return jobs, local(
        [sys.executable, tmp_path / "pilot.py", jobs, "{slot}"],
        list_command=[sys.executable, str(tmp_path / "list.py"), str(jobs)],
        **section,
    )


def test_find_pilots_lists_the_slot_and_matches_by_name(tmp_path) -> None:
    jobs, backend = slots(tmp_path, servers=["fast"])
    fast = Endpoint("local", "fast")
    names = [f"3fa2c1-{n:012x}" for n in (1, 2)]
    for name in names:
        request = SubmitRequest("local", name=name)
        assert backend.gridgate_submit(endpoint=fast, request=request, timeout=20).ok
    jobs.write_text(jobs.read_text() + "job-1 someone-else waiting\n")
    answer = backend.gridgate_find_pilots(
        endpoint=fast, names=(names[0], "3fa2c1-0000000000ff"), fleet="", timeout=20
    )
    assert answer.ok and list(answer.found) == [names[0]]
    fleet = backend.gridgate_find_pilots(endpoint=fast, names=(), fleet="3fa2c1", timeout=20)
    assert set(fleet.found) == set(names)
    assert (
        local(["pilot"]).gridgate_find_pilots(
            endpoint=Endpoint("local", "slot1"), names=names, fleet="", timeout=5
        )
        is None
    ), "without a list_command, jobs cannot be found by name"


def test_a_lost_answer_is_reconciled_through_find_pilots_alone(tmp_path) -> None:
    # the out-of-tree backend answers one hook, and the director adopts the pilot it made
    jobs, backend = slots(tmp_path, servers=["slow"], command_timeout=2)
    doc = {
        "director": {
            "max_threads": 1,
            "state_dir": str(tmp_path / "state"),
            "pilots": {"max_waiting": 1, "reconcile_for": 600},
        },
        "demand": {"static": {"local": 1}},
    }
    with contextlib.closing(director_for(doc, backend, FirstCandidate())) as director:
        first = director.run_iteration()
        assert [r.outcome for r in first.records] == ["failed"]  # killed: no answer
        assert len(jobs.read_text().splitlines()) == 1  # yet the slot made the pilot
        director.clock.advance(60)
        second = director.run_iteration()
        pilots = director.runtime.state.pilot_registry().active("local", "slow")
    made = jobs.read_text().split()[0]
    assert [p.job_id for p in pilots] == [made], "the pilot is adopted by its name"
    assert not [r for r in second.records if r.outcome == "submitted"], "and none sent beside it"
