"""What a Slurm partition says of its queue (``gridgate_endpoint_state``), against the private
cluster: every user's pending jobs, the partition's state and limits, read once per cluster and
interval; and what the director does with it (issue 45)."""

from __future__ import annotations

import pytest
from support.uids import AS_NOBODY

from gridgate.core import runner
from gridgate.core.documents import DocumentError
from gridgate.core.model import Endpoint
from gridgate.core.testing import build_plugin
from gridgate.plugins.slurm.backend import SlurmBackend
from gridgate.plugins.slurm.documents import (
    parse_partitions,
    parse_queue_counts,
    parse_sinfo_cpus,
    slurm_seconds,
)

BATCH = Endpoint("slurm", "batch")
DEBUG = Endpoint("slurm", "debug")


def _backend(site, **extra):
    return build_plugin(SlurmBackend, site.doc(**extra)["backends"]["slurm"])


def _held_jobs_of_nobody(cluster, partition: str, n: int) -> list[str]:
    """``n`` jobs submitted held by the real uid nobody: they stay pending, not gridgate's."""
    ids = []
    for _ in range(n):
        out = cluster.command(
            [*AS_NOBODY, "sbatch", "--parsable", "--hold", "-p", partition]
            + ["-o", "/dev/null", "--wrap", "sleep 600"]
        )
        assert out.ok, out.stderr
        ids.append(out.stdout.strip())
    return ids


# --- the decoders ------------------------------------------------------------------------------

#: a line of Slurm 22.05's ``scontrol -o show partition``, as the private cluster prints it
PARTITION_LINE = (
    "PartitionName=batch AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
    "Default=NO QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 "
    "Hidden=NO MaxNodes=UNLIMITED MaxTime=1-02:03:00 MinNodes=0 LLN=NO MaxCPUsPerNode=2 "
    "Nodes=ggnode1 PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO "
    "OverTimeLimit=NONE PreemptMode=OFF State=DRAIN TotalCPUs=2 TotalNodes=1 "
    "SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=2000 "
    "TRES=cpu=2,mem=23849M,node=1,billing=2"
)


def test_the_decoders_read_what_slurm_writes() -> None:
    [(name, limits)] = parse_partitions(f"CLUSTER: c2\n{PARTITION_LINE}\n").items()
    assert name == "batch"
    assert (limits.state, limits.max_time, limits.max_memory_mb, limits.max_cpus) == (
        "DRAIN",
        (26 * 60 + 3) * 60,
        2000,
        2,
    )
    cpus = parse_sinfo_cpus("debug*|1/1/0/2|2|23849\nbatch|0/2/0/2|2|23849\nbatch|0/4/0/4|4+|900\n")
    assert (cpus["debug"].idle, cpus["batch"].idle, cpus["batch"].node_cpus) == (1, 6, 4)
    assert cpus["batch"].node_memory_mb == 23849
    counts = parse_queue_counts("batch|PD\nbatch|PD\nbatch,debug|PD\ndebug|R\n")
    assert counts == {"batch": (3, 0), "debug": (1, 1)}
    assert [slurm_seconds(t, kind="t") for t in ("30", "5:30", "1:00:00", "2-3", "UNLIMITED")] == [
        1800,
        330,
        3600,
        (2 * 24 + 3) * 3600,
        None,
    ]


@pytest.mark.parametrize(
    ("parse", "text", "says"),
    [
        (parse_partitions, "PartitionName=batch State=SLEEPY", "State='SLEEPY' is not one of"),
        (parse_partitions, "State=UP MaxTime=10", "names no partition"),
        (parse_partitions, "PartitionName=b State=UP MaxTime=soon", "'soon' is not a Slurm time"),
        (parse_partitions, "PartitionName=b State=UP MaxCPUsPerNode=-1", "not a count"),
        (parse_sinfo_cpus, "batch|0/2/0/2|2", "is not of the form '%R|%C|%c|%m'"),
        (parse_sinfo_cpus, "batch|0/x/0/2|2|100", "idle CPUs: 'x' is not a count"),
        (parse_sinfo_cpus, "batch|2|2|100", "are not allocated/idle/other/total"),
        (parse_queue_counts, "batch PD", "is not of the form '%P|%t'"),
        (parse_queue_counts, "batch|CG", "job state 'CG' is neither PD nor R"),
    ],
)
def test_the_decoders_refuse_what_slurm_does_not_write(parse, text, says) -> None:
    with pytest.raises(DocumentError, match="line 1") as caught:
        parse(text + "\n")
    assert says in str(caught.value)


# --- the backend against the cluster ----------------------------------------------------------


def test_a_partition_reports_the_pending_jobs_of_another_user(slurm_site) -> None:
    cluster = slurm_site.cluster
    _held_jobs_of_nobody(cluster, "batch", 3)
    cluster.scontrol("update", "PartitionName=batch", "MaxTime=90", "MaxMemPerNode=1000")
    try:
        backend = _backend(slurm_site)
        batch = backend.gridgate_endpoint_state(endpoint=BATCH, timeout=30)
        debug = backend.gridgate_endpoint_state(endpoint=DEBUG, timeout=30)
    finally:
        cluster.scontrol("update", "PartitionName=batch", "MaxTime=INFINITE")
        cluster.scontrol("update", "PartitionName=batch", "MaxMemPerNode=0")  # UNLIMITED
    assert batch is not None and debug is not None
    assert (batch.serving, batch.waiting, batch.running) == ("production", 3, 0)
    assert (batch.max_walltime, batch.max_memory_mb) == (90 * 60, 1000)
    assert batch.max_cores is not None and batch.max_cores >= 2  # the node's CPUs
    assert batch.free_slots == batch.max_cores  # held jobs take no CPU
    assert (debug.waiting, debug.max_walltime) == (0, None)
    assert backend.gridgate_endpoint_state(endpoint=Endpoint("other", "batch"), timeout=30) is None


@pytest.mark.parametrize(("state", "serving"), [("DRAIN", "draining"), ("DOWN", "queueing")])
def test_a_partitions_state_is_its_serving_state(slurm_site, state, serving) -> None:
    slurm_site.cluster.set_partition_state("batch", state)
    said = _backend(slurm_site).gridgate_endpoint_state(endpoint=BATCH, timeout=30)
    assert said is not None and (said.serving, said.reason) == (serving, f"State={state}")
    assert not said.accepts


def test_one_read_of_a_cluster_answers_for_all_its_partitions(slurm_site, monkeypatch) -> None:
    ran: list[str] = []
    real = runner.run

    def counted(argv, *args, **kwargs):
        ran.append(argv[0])
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(runner, "run", counted)
    backend = _backend(slurm_site)
    for _ in range(3):
        for endpoint in (BATCH, DEBUG, Endpoint("slurm", "nosuch")):
            backend.gridgate_endpoint_state(endpoint=endpoint, timeout=30)
    assert ran == ["scontrol", "sinfo", "squeue"]
    # null: the partitions say nothing, and nothing is run
    ran.clear()
    quiet = _backend(slurm_site, queue_state_interval=None)
    assert quiet.gridgate_endpoint_state(endpoint=BATCH, timeout=30) is None and ran == []


def test_a_stopped_controller_says_nothing(slurm_site) -> None:
    slurm_site.impatient()
    slurm_site.cluster.stop_controller()
    backend = _backend(slurm_site)
    assert backend.gridgate_endpoint_state(endpoint=BATCH, timeout=30) is None


# --- the director ------------------------------------------------------------------------------


def test_another_users_pending_jobs_fill_max_waiting_and_stop_submission(slurm_site) -> None:
    _held_jobs_of_nobody(slurm_site.cluster, "batch", 2)
    doc = slurm_site.doc(pilots=4)
    doc["director"]["pilots"] = {"max_waiting": 2}
    summary = slurm_site.run_once(doc)
    # batch's queue holds 2 waiting jobs (nobody's): none of the 4 pilots go there
    assert {s["endpoint"] for s in summary["submitted"]} == {"debug"}
    assert summary["pilots_submitted"] == 2
    assert summary["failures"] == [] and summary["unavailable"] == {}
    # the same with the partitions saying nothing: batch counts gridgate's own pilots (none)
    doc["backends"]["slurm"]["queue_state_interval"] = None
    blind = slurm_site.run_once(doc)
    assert "batch" in {s["endpoint"] for s in blind["submitted"]}


@pytest.mark.parametrize(("state", "serving"), [("DRAIN", "draining"), ("DOWN", "queueing")])
def test_a_partition_not_in_production_gets_none_and_shows_so(slurm_site, state, serving) -> None:
    slurm_site.cluster.set_partition_state("batch", state)
    summary = slurm_site.run_once(slurm_site.doc(pilots=3))
    assert {s["endpoint"] for s in summary["submitted"]} == {"debug"}
    assert summary["pilots_submitted"] == 3 and summary["failures"] == []
    shown = summary["unavailable"]["slurm/batch"]
    assert (shown["state"], shown["source"]) == ("drained", "queue")
    assert f"its queue is {serving} (State={state})" in shown["reason"]
    # told once, as a notice (never a mail): the start of the drain
    [note] = summary["notifications"]
    assert note["level"] == "info" and "slurm/batch drained (queue)" in note["subject"]


def test_pilots_asking_more_walltime_than_the_partition_allows_go_elsewhere(slurm_site) -> None:
    cluster = slurm_site.cluster
    cluster.scontrol("update", "PartitionName=batch", "MaxTime=30")
    try:
        doc = slurm_site.doc()
        group = {"group": "long", "pilots": 3, "resources": {"walltime": 3600}}
        doc["demand"] = {"static": {"slurm": [group]}}
        summary = slurm_site.run_once(doc)
    finally:
        cluster.scontrol("update", "PartitionName=batch", "MaxTime=INFINITE")
    assert {s["endpoint"] for s in summary["submitted"]} == {"debug"}
    assert summary["pilots_submitted"] == 3 and summary["failures"] == []
    [note] = summary["notifications"]
    assert note["level"] == "error" and note["subject"] == (
        "gridgate: slurm/batch cannot run group long's pilots"
    )
