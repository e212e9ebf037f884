"""The slurm backend against the private cluster: real sbatch, squeue, scancel, real errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gridgate.core.backend import submission_of
from gridgate.core.model import Endpoint, IterationInfo, Resources, SubmitRequest
from gridgate.core.testing import build_plugin, plugin_manager_with
from gridgate.plugins.slurm.backend import (
    SlurmBackend,
    parse_parsable,
    parse_squeue,
    pilot_state,
)

BIN = Path(sys.executable).parent


def _squeue(cluster, *job_ids: str) -> dict[str, tuple[str, str, str]]:
    """id -> (partition, name, state) as the real squeue prints them."""
    out = cluster.command(
        ["squeue", "-h", "-r", "-t", "all", "-o", "%i %P %j %T", f"--jobs={','.join(job_ids)}"]
    )
    assert out.ok, out.stderr
    return {p[0]: (p[1], p[2], p[3]) for p in (ln.split() for ln in out.stdout.splitlines())}


def _notes(site) -> list[str]:
    folder = site.folder / "notes"
    return sorted(p.read_text() for p in folder.iterdir()) if folder.exists() else []


def _backend(site, **extra):
    section = site.doc(**extra)["backends"]["slurm"]
    return build_plugin(SlurmBackend, section)


# --- the director submits, real squeue sees -------------------------------------------------


def test_gridgate_run_submits_n_pilots_that_squeue_shows(slurm_site) -> None:
    summary = slurm_site.run_once(slurm_site.doc(pilots=3))
    assert summary["pilots_submitted"] == 3 and summary["failures"] == []
    ids = [i for s in summary["submitted"] for i in s["job_ids"]]
    assert len(ids) == 3
    seen = _squeue(slurm_site.cluster, *ids)
    assert sorted(seen) == sorted(ids)
    for record in summary["submitted"]:
        for job_id in record["job_ids"]:
            partition, name, state = seen[job_id]
            # named for its submission (issue 41): the director finds it again by name
            assert partition == record["endpoint"] and submission_of(name, "gridgate-pilot")
            assert state in ("PENDING", "RUNNING")


def test_pilots_per_submission_submits_an_array_with_one_id_per_pilot(slurm_site) -> None:
    summary = slurm_site.run_once(
        slurm_site.doc(partitions=["batch"], pilots=4, pilots_per_submission=4)
    )
    [record] = summary["submitted"]
    base = record["job_ids"][0].split("_")[0]
    assert record["job_ids"] == [f"{base}_{i}" for i in range(4)]
    assert sorted(_squeue(slurm_site.cluster, *record["job_ids"])) == sorted(record["job_ids"])


def test_a_bad_partition_is_the_sites_config_with_one_error(slurm_site) -> None:
    summary = slurm_site.run_once(slurm_site.doc(partitions=["nosuch"], pilots=3))
    assert summary["pilots_submitted"] == 0
    [failure] = summary["failures"]
    assert (failure["endpoint"], failure["kind"], failure["returncode"]) == ("nosuch", "config", 1)
    assert summary["excluded"] == ["nosuch"]
    assert [(n["level"], n["endpoint"]) for n in summary["notifications"]] == [("error", "nosuch")]
    [note] = _notes(slurm_site)
    assert "Invalid partition name specified" in note


def test_an_inactive_partition_is_drained_and_the_other_one_gets_the_pilots(slurm_site) -> None:
    slurm_site.cluster.set_partition_state("batch", "INACTIVE")
    summary = slurm_site.run_once(slurm_site.doc(pilots=4))
    # the partition says so before any sbatch (its queue is closed): drained, no failure
    assert summary["failures"] == []
    assert {s["endpoint"] for s in summary["submitted"]} == {"debug"}
    assert summary["unavailable"]["slurm/batch"]["state"] == "drained"
    # set aside, nobody paged: one notice (info) that the drain started
    assert [n["level"] for n in summary["notifications"]] == ["info"]
    # a partition that says nothing of its queue: sbatch is refused, and that is a drain too
    doc = slurm_site.doc(pilots=4, queue_state_interval=None)
    summary = slurm_site.run_once(doc)
    kinds = {(f["endpoint"], f["kind"]) for f in summary["failures"]}
    assert kinds <= {("batch", "drained")}
    assert {s["endpoint"] for s in summary["submitted"]} == {"debug"}


def test_a_request_over_the_partition_limit_is_refused_at_submission(slurm_site) -> None:
    # --time is the backend's (a demand group's resources.walltime) since issue 23: the
    # director's path is shown with a node-count limit, the time limit on the backend below
    cluster = slurm_site.cluster
    cluster.scontrol("update", "PartitionName=batch", "MaxNodes=1")
    try:
        doc = slurm_site.doc(partitions=["batch"], pilots=1)
        doc["backends"]["slurm"]["sbatch_options"].append("--nodes=2")
        summary = slurm_site.run_once(doc)
    finally:
        cluster.scontrol("update", "PartitionName=batch", "MaxNodes=UNLIMITED")
    [failure] = summary["failures"]
    assert failure["kind"] == "usage"
    assert "Node count specification invalid" in _notes(slurm_site)[0]


def test_a_walltime_over_the_partition_limit_is_usage(slurm_site) -> None:
    cluster = slurm_site.cluster
    cluster.scontrol("update", "PartitionName=batch", "MaxTime=10")
    try:
        backend = _backend(slurm_site, partitions=["batch"])
        endpoint = Endpoint("slurm", "batch")
        request = SubmitRequest("slurm", resources=Resources(walltime=1200))
        result = backend.gridgate_submit(endpoint=endpoint, request=request, timeout=60)
    finally:
        cluster.scontrol("update", "PartitionName=batch", "MaxTime=INFINITE")
    assert result is not None and not result.ok
    assert "--time=20" in result.command.argv
    assert "Requested time limit is invalid" in result.command.stderr
    assert backend.classify_failure(endpoint, result).kind == "usage"


def test_a_stopped_controller_takes_every_partition_out_and_escalates(slurm_site) -> None:
    slurm_site.impatient()  # each client call gives up after 1-2 s, not Slurm's 9-18
    slurm_site.cluster.stop_controller()
    summary = slurm_site.run_once(slurm_site.doc(pilots=4))
    assert summary["pilots_submitted"] == 0
    assert sorted(summary["excluded"]) == sorted(slurm_site.cluster.partitions)
    assert {f["kind"] for f in summary["failures"]} == {"unreachable"}
    assert sorted(n["endpoint"] for n in summary["notifications"]) == sorted(
        slurm_site.cluster.partitions
    )
    notes = _notes(slurm_site)
    assert all("Unable to contact slurm controller" in n for n in notes)
    # the second partition of the cluster was not made to wait for Slurm to give up again
    assert sum("not tried: partition" in n for n in notes) == 1
    # the hook's own view of the same outage: a failed query, not "no such jobs"
    backend = _backend(slurm_site)
    status = backend.gridgate_job_status(
        endpoint=Endpoint("slurm", "debug"), job_ids=["1", "2"], timeout=30
    )
    assert status is not None and not status.ok and status.commands == 1
    assert "Unable to contact slurm controller" in status.command.stderr
    # the sibling partition is not polled again in the same iteration, nor cancelled in
    sibling = backend.gridgate_job_status(
        endpoint=Endpoint("slurm", "batch"), job_ids=["3"], timeout=30
    )
    assert not sibling.ok and sibling.commands == 0 and sibling.command == status.command
    assert sibling.message.startswith("not tried: partition debug")
    cancel = backend.gridgate_cancel(endpoint=Endpoint("slurm", "batch"), job_ids=["3"], timeout=30)
    assert not cancel.ok and cancel.message.startswith("not tried: partition debug")
    # a new iteration tries again
    backend.gridgate_iteration_started(iteration=IterationInfo(number=2, started=0.0))
    assert (
        backend.gridgate_job_status(
            endpoint=Endpoint("slurm", "batch"), job_ids=["3"], timeout=30
        ).commands
        == 1
    )


def test_a_controller_that_does_not_answer_is_a_timeout(slurm_site) -> None:
    slurm_site.impatient()  # sbatch waits 2 s for an answer, not Slurm's default 10
    backend = _backend(slurm_site)
    slurm_site.cluster.pause_controller()
    try:
        with plugin_manager_with(backend) as pm:
            result = pm.hook.gridgate_submit(
                endpoint=Endpoint("slurm", "debug"),
                request=SubmitRequest(backend="slurm"),
                timeout=60,
            )
            failure = pm.hook.gridgate_classify_failure(
                endpoint=Endpoint("slurm", "debug"), result=result
            )
    finally:
        slurm_site.cluster.resume_controller()
    assert not result.ok
    assert "Socket timed out on send/recv operation" in result.command.stderr
    assert (failure.kind, failure.exclude, failure.transient) == ("timeout", True, True)
    assert "may have been queued anyway" in failure.reason


@pytest.mark.parametrize(
    ("script", "said", "kind"),
    [
        ("/nonexistent/pilot.sh", "Unable to open file /nonexistent/pilot.sh", "missing_input"),
        ("/bin/true", "This does not look like a batch script", "config"),
    ],
)
def test_a_bad_script_is_a_fault_of_this_machine(slurm_site, script, said, kind) -> None:
    backend = _backend(slurm_site, script=script)
    with plugin_manager_with(backend) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=Endpoint("slurm", "debug"), request=SubmitRequest(backend="slurm"), timeout=60
        )
        failure = pm.hook.gridgate_classify_failure(
            endpoint=Endpoint("slurm", "debug"), result=result
        )
    # the site's config names a script this machine cannot use: no partition is blamed
    assert (failure.kind, failure.local) == (kind, True)
    assert said in failure.reason


# --- tracking --------------------------------------------------------------------------------


def test_gridgate_job_status_and_gridgate_cancel_on_real_jobs(slurm_site) -> None:
    backend = _backend(slurm_site, pilots_per_submission=3)
    debug = Endpoint("slurm", "debug")
    with plugin_manager_with(backend) as pm:
        array = pm.hook.gridgate_submit(
            endpoint=debug, request=SubmitRequest(backend="slurm", count=3), timeout=60
        )
        single = pm.hook.gridgate_submit(
            endpoint=debug, request=SubmitRequest(backend="slurm"), timeout=60
        )
        assert array.ok and single.ok, (array, single)
        ids = [*array.job_ids, *single.job_ids]
        cancel = pm.hook.gridgate_cancel(endpoint=debug, job_ids=[single.job_ids[0]], timeout=60)
        assert cancel.ok and cancel.cancelled == single.job_ids
        status = pm.hook.gridgate_job_status(endpoint=debug, job_ids=[*ids, "999999"], timeout=60)
    assert status.ok and status.commands == 1
    assert set(status.statuses) == set(ids)  # 999999 is unknown to Slurm: omitted
    assert status.statuses[single.job_ids[0]].state == "cancelled"
    assert {status.statuses[i].state for i in array.job_ids} <= {"waiting", "running"}
    native = _squeue(slurm_site.cluster, *ids)
    assert all(status.statuses[i].native == native[i][2] for i in ids)


def test_an_odd_tracked_id_is_that_pilots_alone_and_never_reaches_slurm(slurm_site) -> None:
    # issue 40 item 4, round 5: one tracked id of no Slurm job id's form made every poll and
    # cancel of the partition fail, so its other pilots never got their verdict
    backend = _backend(slurm_site)
    debug = Endpoint("slurm", "debug")
    odd = "1; touch /tmp/gridgate-odd-id"
    with plugin_manager_with(backend) as pm:
        single = pm.hook.gridgate_submit(
            endpoint=debug, request=SubmitRequest(backend="slurm"), timeout=60
        )
        assert single.ok, single
        [job] = single.job_ids
        status = pm.hook.gridgate_job_status(endpoint=debug, job_ids=[odd, job], timeout=60)
        cancel = pm.hook.gridgate_cancel(endpoint=debug, job_ids=[odd, job], timeout=60)
        after = pm.hook.gridgate_job_status(endpoint=debug, job_ids=[job, odd], timeout=60)
    assert status.ok and status.commands == 1, status
    assert status.statuses[job].state in {"waiting", "running"}, status.statuses
    assert status.statuses[odd].state == "unknown"
    assert "not a Slurm job id" in status.statuses[odd].reason
    assert odd not in " ".join(status.command.argv)
    assert cancel.ok and cancel.cancelled == (job,), cancel
    assert cancel.command.argv == ("scancel", "--verbose", job)
    assert "not a Slurm job id" in cancel.message and odd in cancel.message
    assert after.ok and after.statuses[job].state == "cancelled", after
    assert after.statuses[odd].state == "unknown"


def test_one_id_gone_from_the_controller_is_an_answer_not_a_failure(slurm_site) -> None:
    status = _backend(slurm_site).gridgate_job_status(
        endpoint=Endpoint("slurm", "debug"), job_ids=["999999"], timeout=60
    )
    assert status.ok and dict(status.statuses) == {}
    assert "Invalid job id specified" in status.command.stderr


def test_a_long_id_list_is_split_into_several_squeue_calls(slurm_site) -> None:
    ids = [str(100000 + i) for i in range(30000)]
    status = _backend(slurm_site).gridgate_job_status(
        endpoint=Endpoint("slurm", "debug"), job_ids=ids, timeout=120
    )
    assert status.ok and status.commands > 1 and dict(status.statuses) == {}


# --- parsing and config ------------------------------------------------------------------------


def test_parse_parsable_with_and_without_cluster() -> None:
    assert parse_parsable("42\n") == ("42", "")
    assert parse_parsable("42;west\n") == ("42", "west")
    assert parse_parsable("Submitted batch job 42\n") is None


@pytest.mark.parametrize(
    "native, state",
    [
        ("PENDING", "waiting"),
        ("REQUEUE_HOLD", "waiting"),
        ("RUNNING", "running"),
        ("COMPLETING", "running"),
        ("SUSPENDED", "running"),
        ("COMPLETED", "done"),
        ("FAILED", "failed"),
        ("TIMEOUT", "failed"),
        ("OUT_OF_MEMORY", "failed"),
        ("CANCELLED", "cancelled"),
        ("CANCELLED by 0", "cancelled"),
        ("CANCELLED+", "cancelled"),
        ("BOGUS", "unknown"),
    ],
)
def test_pilot_state_follows_formats_md(native, state) -> None:
    assert pilot_state(native) == state


def test_parse_squeue_skips_cluster_headers_and_keeps_reasons() -> None:
    statuses = parse_squeue("CLUSTER: west\n12_3 PENDING Priority\n13 RUNNING None\n")
    assert statuses["12_3"].state == "waiting" and statuses["12_3"].reason == "Priority"
    assert statuses["13"].reason == ""
    assert set(statuses) == {"12_3", "13"}


def test_sbatch_argv_with_cluster_and_array(slurm_site) -> None:
    backend = _backend(slurm_site, partitions=["batch@west"])
    argv = backend.sbatch_argv(Endpoint("slurm", "batch@west"), SubmitRequest("slurm", count=5))
    assert argv[:6] == [
        "sbatch",
        "--parsable",
        "--partition=batch",
        "--job-name=gridgate-pilot",
        "--clusters=west",
        "--array=0-4",
    ]
    assert argv[-1] == str(slurm_site.script)


@pytest.mark.parametrize(
    "option",
    [
        "--partition=x",
        "-p",
        "-pbatch",
        "--parsable",
        "--array=1-3",
        "-M",
        "--clusters=a",
        "--job-name=x",
        "--wrap",
    ],
)
def test_options_the_backend_writes_itself_are_refused(option, tmp_path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        "backends:\n  slurm:\n    partitions: [debug]\n    script: /p.sh\n"
        f"    sbatch_options: ['--hold', '{option}']\n"
        "demand:\n  static:\n    slurm: 1\n"
    )
    out = subprocess.run(
        [str(BIN / "gridgate"), "config", "validate", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert f"{site}:5: backends.slurm.sbatch_options[1]:" in out.stderr
    assert "is written by the backend" in out.stderr


def test_config_errors_name_partition_and_script() -> None:
    problems = SlurmBackend.config_errors({"partitions": ["ok", "bad name", "ok"]})
    assert (
        ("partitions", 1),
        "'bad name' is not a Slurm partition (name or name@cluster)",
    ) in problems
    assert (("partitions", 2), "partition 'ok' is listed twice") in problems
    assert (("script",), "a pilot script is needed to submit to the partitions") in problems


def test_gridgate_cancel_cancels_real_jobs_and_names_unknown_ones_not_cancelled(
    slurm_site,
) -> None:
    backend = _backend(slurm_site, pilots_per_submission=2)
    batch = Endpoint("slurm", "batch")
    with plugin_manager_with(backend) as pm:
        array = pm.hook.gridgate_submit(
            endpoint=batch, request=SubmitRequest(backend="slurm", count=2), timeout=60
        )
        assert array.ok, array
        cancel = pm.hook.gridgate_cancel(
            endpoint=batch, job_ids=[*array.job_ids, "999999"], timeout=60
        )
        refused = pm.hook.gridgate_cancel(endpoint=batch, job_ids=["1; rm -rf /"], timeout=60)
    assert cancel.ok and cancel.cancelled == array.job_ids  # 999999: scancel --verbose names it
    assert "999999: Invalid job id specified" in cancel.message
    assert cancel.command.argv == ("scancel", "--verbose", *array.job_ids, "999999")
    # an odd id alone: nothing to ask Slurm, nothing run, the reason given (issue 40 item 4)
    assert refused.ok and refused.cancelled == () and refused.command is None, refused
    assert "not a Slurm job id" in refused.message
    # a pending array cancelled whole is kept by Slurm as one record under its base id
    base = array.job_ids[0].split("_")[0]
    assert _squeue(slurm_site.cluster, base)[base][2] == "CANCELLED"
    with plugin_manager_with(backend) as pm:
        status = pm.hook.gridgate_job_status(endpoint=batch, job_ids=array.job_ids, timeout=60)
    assert {s.state for s in status.statuses.values()} == {"cancelled"}
    assert set(status.statuses) == set(array.job_ids)


def test_gridgate_cancel_of_a_job_that_has_finished_does_not_report_it_cancelled(
    slurm_site,
) -> None:
    """A pilot that ended before its cancel is not recorded cancelled (that would hide how it
    ended): the real scancel --verbose names it, and the next poll says it is done."""
    from support.polling import until

    cluster = slurm_site.cluster
    partition = next(iter(cluster.partitions))
    out = cluster.command(
        ["sbatch", "--parsable", "-p", partition, "-o", "/dev/null", "--wrap", "true"]
    )
    assert out.ok, out.stderr
    job = out.stdout.strip().split(";")[0]
    assert until(lambda: _squeue(cluster, job).get(job, ("", "", ""))[2] == "COMPLETED", 60)
    backend = _backend(slurm_site)
    endpoint = Endpoint("slurm", partition)
    with plugin_manager_with(backend) as pm:
        cancel = pm.hook.gridgate_cancel(endpoint=endpoint, job_ids=[job], timeout=60)
        status = pm.hook.gridgate_job_status(endpoint=endpoint, job_ids=[job], timeout=60)
    assert cancel.ok and cancel.cancelled == ()
    assert f"{job}: Job/step already completing or completed" in cancel.message
    assert status.ok and status.statuses[job].state == "done"


def test_a_full_queue_is_overload_and_the_retrying_sbatch_is_killed_at_its_deadline(
    slurm_site,
) -> None:
    from gridgate.plugins.slurm.cluster import SlurmCluster

    # A controller at MaxJobCount (22.05 takes MaxJobCount - 1 jobs here): sbatch prints its
    # complaint and keeps retrying.
    with SlurmCluster(partitions=("only",), extra_conf=["MaxJobCount=2"]) as full:
        assert full.command(["sbatch", "--hold", "-o", "/dev/null", "--wrap", "true"]).ok
        backend = build_plugin(
            SlurmBackend,
            {
                "partitions": ["only"],
                "script": str(slurm_site.script),
                "command_timeout": 4,
                "sbatch_options": ["--hold", "--output=/dev/null"],
                "env": dict(full.env),
            },
        )
        endpoint = Endpoint("slurm", "only")
        with plugin_manager_with(backend) as pm:
            result = pm.hook.gridgate_submit(
                endpoint=endpoint, request=SubmitRequest(backend="slurm"), timeout=60
            )
            failure = pm.hook.gridgate_classify_failure(endpoint=endpoint, result=result)
    assert result.command.timed_out
    assert "Slurm temporarily unable to accept job, sleeping and retrying" in result.command.stderr
    assert (failure.kind, failure.exclude, failure.notify) == ("overload", True, False)
