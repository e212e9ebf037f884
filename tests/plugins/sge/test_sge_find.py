"""gridgate_find_pilots on the private cell: jobs named for their submission, found by name and
by fleet with their full names (``qstat -r``), in the queue they were submitted to only."""

from __future__ import annotations

import pytest
from support.sge_site import SgeSite

from gridgate.core.model import Endpoint, JobStatus, SubmitRequest, SubmitResult
from gridgate.core.testing import build_plugin, plugin_manager_with
from gridgate.plugins.sge.backend import SgeBackend
from gridgate.plugins.sge.parse import parse_named_qstat

FLEET, OTHER = "3fa2c1", "77aa00"
SINGLE, ARRAY, UNKNOWN = f"{FLEET}-9b8e7d6c5a4f", f"{FLEET}-0123456789ab", f"{FLEET}-ffffffffffff"
ELSEWHERE = f"{OTHER}-aaaaaaaaaaaa"


@pytest.fixture
def site(sge, tmp_path) -> SgeSite:
    return SgeSite(sge, tmp_path.name)


def _submit(backend: SgeBackend, queue: str, name: str, count: int = 1) -> SubmitResult:
    with plugin_manager_with(backend) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=Endpoint("sge", queue),
            request=SubmitRequest(backend="sge", count=count, name=name),
            timeout=60,
        )
    assert result.ok, result
    return result


def _find(backend: SgeBackend, queue: str, names=(), fleet=""):
    with plugin_manager_with(backend) as pm:
        return pm.hook.gridgate_find_pilots(
            endpoint=Endpoint("sge", queue), names=list(names), fleet=fleet, timeout=60
        )


def _ids(found, name: str) -> set[str]:
    return {status.job_id for status in found.found[name]}


def test_named_jobs_are_found_by_name_and_fleet_in_their_own_queue(site) -> None:
    backend = build_plugin(SgeBackend, site.section())
    first, second = site.cell.queues[:2]
    single = _submit(backend, first, SINGLE)
    array = _submit(backend, first, ARRAY, 3)
    elsewhere = _submit(backend, second, ELSEWHERE)
    plain = _submit(backend, first, "")
    # qsub was given the name in full
    names = {
        job.status.job_id: job.name
        for job in parse_named_qstat(
            site.cell.run(["qstat", "-u", "*", "-g", "d", "-r"], as_user=False).stdout
        )
    }
    assert names[single.job_ids[0]] == f"gridgate-pilot-{SINGLE}"
    assert {names[i] for i in array.job_ids} == {f"gridgate-pilot-{ARRAY}"}
    assert names[plain.job_ids[0]] == "gridgate-pilot"

    found = _find(backend, first, [SINGLE, ARRAY, UNKNOWN])
    assert found.ok, found
    assert set(found.found) == {SINGLE, ARRAY}  # the unknown name is absent
    assert _ids(found, SINGLE) == set(single.job_ids)
    assert _ids(found, ARRAY) == set(array.job_ids)  # one status per task
    assert {s.state for v in found.found.values() for s in v} <= {"waiting", "running"}

    by_fleet = _find(backend, first, fleet=FLEET)
    assert by_fleet.ok and set(by_fleet.found) == {SINGLE, ARRAY}, by_fleet
    # the other queue's job is that queue's: found there, not here
    assert _find(backend, first, fleet=OTHER).found == {}
    there = _find(backend, second, fleet=OTHER)
    assert there.ok and _ids(there, ELSEWHERE) == set(elsewhere.job_ids), there
    # nothing asked, nothing run
    nothing = _find(backend, first)
    assert nothing.ok and nothing.found == {} and nothing.command is None


def test_a_stopped_qmaster_is_not_ok(site) -> None:
    backend = build_plugin(SgeBackend, site.section(command_timeout=5))
    site.cell.stop_qmaster()
    found = _find(backend, site.queue, [SINGLE])
    assert not found.ok and not found.found, found
    assert found.command is not None and found.message


def test_parse_named_qstat_reads_the_full_name_and_queue_of_each_task() -> None:
    text = (
        "job-ID  prior   name       user         state submit/start at     queue"
        "                          slots ja-task-ID \n"
        "-------------------------------------------------------------------------\n"
        "      1 0.50000 gridgate-p nobody       r     12/05/2026 07:13:34 pilots.q@vm"
        "                        1 2\n"
        "       Full jobname:     gridgate-pilot-3fa2c1-9b8e7d6c5a4f\n"
        "       Master Queue:     pilots.q@vm\n"
        "       Hard requested queues: pilots.q\n"
        "      2 0.00000 other-job  nobody       qw    12/05/2026 07:13:30"
        "                                    1        \n"
        "       Hard requested queues: short.q,pilots.q\n"
        "      3 0.00000 held       nobody       hqw   12/05/2026 07:13:31"
        "                                    1        \n"
        "       Full jobname:     held\n"
    )
    [first, third] = parse_named_qstat(text)  # job 2 has no full name: left out
    assert first.name == "gridgate-pilot-3fa2c1-9b8e7d6c5a4f" and first.queues == ("pilots.q",)
    assert first.status == JobStatus("1.2", "running", "r", "in pilots.q@vm")
    assert (third.name, third.queues, third.status.state) == ("held", (), "waiting")
