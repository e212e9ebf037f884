"""gridgate_find_pilots on the private cluster: jobs named for their submission, found by name
and by fleet in every state squeue holds them in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gridgate.core.model import Endpoint, SubmitRequest, SubmitResult
from gridgate.core.testing import build_plugin, plugin_manager_with
from gridgate.plugins.slurm.backend import SlurmBackend
from gridgate.plugins.slurm.documents import parse_named_jobs

FLEET, OTHER = "3fa2c1", "77aa00"
SINGLE, ARRAY, UNKNOWN = f"{FLEET}-9b8e7d6c5a4f", f"{FLEET}-0123456789ab", f"{FLEET}-ffffffffffff"
ELSEWHERE = f"{OTHER}-aaaaaaaaaaaa"
DEBUG = Endpoint("slurm", "debug")


@dataclass
class Submitted:
    cluster: Any
    script: Path
    backend: SlurmBackend
    single: SubmitResult
    array: SubmitResult
    elsewhere: SubmitResult
    plain: SubmitResult
    by_hand: str


@pytest.fixture(scope="module")
def submitted(slurm_cluster, tmp_path_factory) -> Submitted:
    """One named job, a named array of 3, a job of another fleet, one without a name and one
    sbatch'ed by hand, all submitted once for the module's tests (and just submitted: the
    first test looks them up at once)."""
    slurm_cluster.resume_controller()
    slurm_cluster.ensure_running()
    for partition in slurm_cluster.partitions:
        slurm_cluster.set_partition_state(partition, "UP")
    slurm_cluster.cancel_all()
    script = tmp_path_factory.mktemp("find") / "pilot.sh"
    script.write_text("#!/bin/sh\nsleep 600\n", encoding="utf-8")
    script.chmod(0o755)
    section = {
        "partitions": list(slurm_cluster.partitions),
        "script": str(script),
        "sbatch_options": [f"--output={slurm_cluster.jobs_dir}/%j.out"],
        "env": dict(slurm_cluster.env),
    }
    backend = build_plugin(SlurmBackend, section)
    with plugin_manager_with(backend) as pm:

        def submit(name: str, count: int = 1) -> SubmitResult:
            request = SubmitRequest(backend="slurm", count=count, name=name)
            result = pm.hook.gridgate_submit(endpoint=DEBUG, request=request, timeout=60)
            assert result.ok, result
            return result

        single, array, elsewhere, plain = (
            submit(SINGLE),
            submit(ARRAY, 3),
            submit(ELSEWHERE),
            submit(""),
        )
    # a job of the same user whose name only looks like gridgate's
    by_hand = slurm_cluster.command(
        [
            "sbatch",
            "--parsable",
            "--partition=debug",
            "--job-name=gridgate-pilot",
            f"--output={slurm_cluster.jobs_dir}/%j.out",
            str(script),
        ]
    )
    assert by_hand.ok, by_hand.stderr
    return Submitted(
        slurm_cluster, script, backend, single, array, elsewhere, plain, by_hand.stdout.strip()
    )


def _find(s: Submitted, names=(), fleet="", endpoint=DEBUG):
    with plugin_manager_with(s.backend) as pm:
        return pm.hook.gridgate_find_pilots(
            endpoint=endpoint, names=list(names), fleet=fleet, timeout=60
        )


def _ids(found, name: str) -> set[str]:
    return {status.job_id for status in found.found[name]}


def test_jobs_a_moment_old_are_found_by_name_one_status_per_array_task(submitted) -> None:
    found = _find(submitted, [SINGLE, ARRAY, UNKNOWN])
    assert found.ok, found
    assert set(found.found) == {SINGLE, ARRAY}  # the unknown name is absent
    assert _ids(found, SINGLE) == set(submitted.single.job_ids)
    assert _ids(found, ARRAY) == set(submitted.array.job_ids)
    states = {s.state for statuses in found.found.values() for s in statuses}
    assert states <= {"waiting", "running"}, found.found
    # only these names were asked of the controller
    assert any(word.startswith("--name=") for word in found.command.argv)


def test_the_job_name_is_the_submissions_and_plain_requests_keep_the_base(submitted) -> None:
    out = submitted.cluster.command(
        ["squeue", "-h", "-r", "-t", "all", "-o", "%i %j", "--partition=debug"]
    )
    assert out.ok, out.stderr
    names = dict(line.split(None, 1) for line in out.stdout.splitlines())
    assert names[submitted.single.job_ids[0]] == f"gridgate-pilot-{SINGLE}"
    assert {names[i] for i in submitted.array.job_ids} == {f"gridgate-pilot-{ARRAY}"}
    assert names[submitted.plain.job_ids[0]] == "gridgate-pilot"


def test_a_fleet_finds_its_submissions_only(submitted) -> None:
    found = _find(submitted, fleet=FLEET)
    assert found.ok, found
    # not the other fleet's job, nor the ones without a submission name (by hand or plain)
    assert set(found.found) == {SINGLE, ARRAY}
    assert _ids(found, ARRAY) == set(submitted.array.job_ids)
    other = _find(submitted, fleet=OTHER)
    assert other.ok and set(other.found) == {ELSEWHERE}
    listed = {s.job_id for statuses in other.found.values() for s in statuses}
    assert submitted.by_hand not in listed and submitted.plain.job_ids[0] not in listed


def test_a_job_that_ended_but_squeue_still_lists_is_found(submitted) -> None:
    [job] = submitted.elsewhere.job_ids
    with plugin_manager_with(submitted.backend) as pm:
        cancel = pm.hook.gridgate_cancel(endpoint=DEBUG, job_ids=[job], timeout=60)
    assert cancel.ok and cancel.cancelled == (job,), cancel
    found = _find(submitted, [ELSEWHERE])
    assert found.ok, found
    [status] = found.found[ELSEWHERE]
    assert (status.job_id, status.state) == (job, "cancelled")
    # by fleet too (no --name: every job of the partition is listed)
    assert [s.state for s in _find(submitted, fleet=OTHER).found[ELSEWHERE]] == ["cancelled"]


def test_a_failing_squeue_is_not_ok(submitted, tmp_path) -> None:
    # squeue pointed at a slurm.conf that is not there: it cannot ask any controller
    section = {
        "partitions": ["debug"],
        "script": str(submitted.script),
        "env": {**submitted.cluster.env, "SLURM_CONF": str(tmp_path / "missing.conf")},
    }
    backend = build_plugin(SlurmBackend, section)
    with plugin_manager_with(backend) as pm:
        found = pm.hook.gridgate_find_pilots(endpoint=DEBUG, names=[SINGLE], fleet="", timeout=10)
    assert not found.ok and not found.found, found
    assert found.command is not None and found.command.returncode != 0
    assert found.message


def test_parse_named_jobs_keeps_the_name_whole_and_the_states() -> None:
    text = (
        "CLUSTER: c2\n"
        "12_0\tPENDING\tPriority\tgridgate-pilot-3fa2c1-9b8e7d6c5a4f\n"
        "13\tCANCELLED by 1000\tNone\ta name\twith a tab\n"
        "junk line\n"
    )
    [(first, pending), (second, cancelled)] = parse_named_jobs(text)
    assert first == "gridgate-pilot-3fa2c1-9b8e7d6c5a4f"
    assert (pending.job_id, pending.state, pending.reason) == ("12_0", "waiting", "Priority")
    assert second == "a name\twith a tab"
    assert (cancelled.job_id, cancelled.state, cancelled.reason) == ("13", "cancelled", "")
