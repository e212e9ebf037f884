"""A pilot's resources in sbatch's words (issue 23): ``--cpus-per-task``, ``--mem``,
``--time`` and the tags ``constraint``/``gres``; the sbatch options they would collide with
are refused; on the private cluster ``scontrol show job`` shows what was asked."""

from __future__ import annotations

import re

import pytest
from support.redis_server import RedisServer

from gridgate.core.model import Endpoint, Resources, SubmitRequest
from gridgate.core.testing import build_plugin
from gridgate.plugins.slurm.backend import SlurmBackend, slurm_time

SECTION = {"partitions": ["debug"], "script": "/p.sh"}


def _argv(resources: Resources | None) -> list[str]:
    backend = build_plugin(SlurmBackend, SECTION)
    request = SubmitRequest("slurm", resources=resources)
    return backend.sbatch_argv(Endpoint("slurm", "debug"), request)


def test_each_value_has_its_sbatch_option_before_the_script() -> None:
    argv = _argv(
        Resources(
            cores=8,
            memory_mb=16000,
            walltime=172800,
            tags={"constraint": "haswell&ib", "gres": "gpu:1"},
        )
    )
    assert argv[-6:] == [
        "--cpus-per-task=8",
        "--mem=16000M",
        "--time=2-00:00:00",
        "--constraint=haswell&ib",
        "--gres=gpu:1",
        "/p.sh",
    ]


def test_nothing_asked_adds_no_option() -> None:
    assert (
        _argv(None)
        == _argv(Resources())
        == [
            "sbatch",
            "--parsable",
            "--partition=debug",
            "--job-name=gridgate-pilot",
            "/p.sh",
        ]
    )


@pytest.mark.parametrize(
    ("seconds", "time"),
    [
        (1, "1"),
        (60, "1"),
        (61, "2"),
        (3599, "1:00:00"),
        (3540, "59"),
        (3600, "1:00:00"),
        (3601, "1:01:00"),
        (86399, "1-00:00:00"),
        (86340, "23:59:00"),
        (86400, "1-00:00:00"),
        (90061, "1-01:02:00"),
    ],
)
def test_walltime_is_whole_minutes_rounded_up(seconds: int, time: str) -> None:
    assert slurm_time(seconds) == time
    assert f"--time={time}" in _argv(Resources(walltime=seconds))


@pytest.mark.parametrize(
    ("word", "owned"),
    [
        ("--cpus-per-task=2", "--cpus-per-task"),
        ("-c2", "-c"),
        ("-Hc2", "-c"),
        ("--cpus=2", "--cpus-per-task"),
        ("--mem=4G", "--mem"),
        ("--mem-per-cpu=2000", "--mem-per-cpu"),
        ("--mem-per-gpu=2000", "--mem-per-gpu"),
        ("--time=10", "--time"),
        ("-t10", "-t"),
        ("-Cssd", "-C"),
        ("--constraint=ssd", "--constraint"),
        ("--gres=gpu:1", "--gres"),
    ],
)
def test_options_of_the_resources_are_refused_in_sbatch_options(word: str, owned: str) -> None:
    [(path, message)] = SlurmBackend.config_errors({**SECTION, "sbatch_options": [word]})
    assert path == ("sbatch_options", 0)
    assert message.startswith(f"{owned} is written by the backend (resources.")


@pytest.mark.parametrize(
    "name", ["SBATCH_TIMELIMIT", "SBATCH_MEM_PER_CPU", "SBATCH_MEM_PER_NODE", "SBATCH_GRES"]
)
def test_the_variables_sbatch_reads_for_them_are_refused_in_env(name: str) -> None:
    [(path, message)] = SlurmBackend.config_errors({**SECTION, "env": {name: "1"}})
    assert path == ("env", name) and "is written by the backend" in message


def test_words_near_them_are_still_accepted() -> None:
    options = ["--time-min=10", "--comment=mem", "--hold", "-Aproject-c", "--output=/dev/null"]
    assert SlurmBackend.config_errors({**SECTION, "sbatch_options": options}) == []


def test_the_backend_declares_what_it_maps() -> None:
    info = build_plugin(SlurmBackend, SECTION).backend_info()
    assert info.resources == ("cores", "memory_mb", "walltime")
    assert info.resource_tags == ("constraint", "gres")


def _scontrol_job(cluster, job_id: str) -> dict[str, str]:
    out = cluster.scontrol("show", "job", "-o", job_id)
    assert out.ok, out.stderr
    return dict(re.findall(r"(\S+?)=(\S*)", out.stdout))


def test_a_two_core_pilot_is_a_two_cpu_job_on_the_real_cluster(slurm_site) -> None:
    cluster = slurm_site.cluster
    node = cluster.scontrol("show", "node", "-o", cluster.node_name)
    assert node.ok and int(re.search(r"CPUTot=(\d+)", node.stdout).group(1)) >= 2
    section = slurm_site.doc(partitions=["debug"] if "debug" in cluster.partitions else None)
    backend = build_plugin(SlurmBackend, section["backends"]["slurm"])
    endpoint = Endpoint("slurm", section["backends"]["slurm"]["partitions"][0])
    request = SubmitRequest(
        "slurm", group="mc", resources=Resources(cores=2, memory_mb=700, walltime=3601)
    )
    result = backend.gridgate_submit(endpoint=endpoint, request=request, timeout=60)
    assert result is not None and result.ok, result
    [job_id] = result.job_ids
    try:
        job = _scontrol_job(cluster, job_id)
        assert job["NumCPUs"] == "2" and job["CPUs/Task"] == "2"
        assert job["MinMemoryNode"] == "700M"
        assert job["TimeLimit"] == "01:01:00"  # 3601 s: 61 minutes, rounded up
    finally:
        backend.gridgate_cancel(endpoint=endpoint, job_ids=[job_id], timeout=60)


def test_a_queue_demand_group_with_two_cores_gives_two_cpu_jobs(slurm_site, tmp_path) -> None:
    """The whole path: `gridgate run` with a queue demand group (its waiting work a real Redis
    list) asking ``cores: 2``: every job it submits is a 2-CPU job in scontrol."""
    with RedisServer(tmp_path / "redis") as redis:
        redis.client().rpush("tq:mc", "job-1", "job-2")
        doc = slurm_site.doc(partitions=[slurm_site.cluster.partitions[0]])
        doc["demand"] = {
            "queue": {
                "groups": {
                    "mc": {
                        "backend": "slurm",
                        "source": {"redis": {"url": redis.url, "key": "tq:mc"}},
                        "jobs_per_pilot": 1,
                        "resources": {"cores": 2, "walltime": 600},
                    }
                }
            }
        }
        summary = slurm_site.run_once(doc)
    ids = [i for row in summary["submitted"] for i in row["job_ids"]]
    assert summary["failures"] == [] and len(ids) == 2, summary
    for job_id in ids:
        job = _scontrol_job(slurm_site.cluster, job_id)
        assert (job["NumCPUs"], job["CPUs/Task"], job["TimeLimit"]) == ("2", "2", "00:10:00")
