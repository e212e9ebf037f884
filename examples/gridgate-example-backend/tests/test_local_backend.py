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
