"""The director's closed loop on the real Slurm cluster: ``max_waiting`` bounds what real squeue
shows pending per partition while demand exceeds what runs, and a partition whose every pilot
fails leaves rotation within 2 status polls, with one error and then an alarm.

The director runs in this process (so a collector sees its notifications) with the ``slurm``
backend from its entry point, sqlite state and a FakeClock for its caches and registry; sbatch,
squeue and scancel are the real ones against the private cluster (one node, 2 CPUs shared by
partitions ``debug`` and ``batch``). Between iterations the test waits for Slurm to have run
what it could (never for an expiry: those follow the FakeClock).
"""

from __future__ import annotations

import json

from support.polling import until

from gridgate.core.clock import FakeClock
from gridgate.core.config import validate_document
from gridgate.core.engine.director import Director, summary_json
from gridgate.core.testing import Collector


def squeue(cluster, states: str = "all") -> list[tuple[str, str, str]]:
    """(id, partition, state) of every job the controller holds."""
    out = cluster.command(["squeue", "-h", "-r", "-t", states, "-o", "%i %P %T"])
    assert out.ok, out.stderr
    return [tuple(line.split()) for line in out.stdout.splitlines() if line.strip()]


def pending(cluster) -> dict[str, int]:
    counts = dict.fromkeys(cluster.partitions, 0)
    for _job, partition, _state in squeue(cluster, "PENDING"):
        counts[partition] += 1
    return counts


def director(
    site, script, clock: FakeClock, collector: Collector, pilots: int, **settings
) -> Director:
    doc = site.doc(pilots=pilots)
    doc["backends"]["slurm"]["script"] = str(script)
    doc["director"].update(
        {"max_threads": 4, "failing_expiry": 3600, "ticket_expiry": 3600, "pilots": settings}
    )
    doc["selectors"] = {"round_robin": {}}
    doc.pop("notifiers")
    return Director(validate_document(doc), clock=clock, extra_plugins=[collector])


def pilot_script(cluster, name: str, body: str):
    path = cluster.jobs_dir / name
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(0o755)
    return path


def test_max_waiting_bounds_pending_jobs_in_real_squeue(slurm_site, figures) -> None:
    cluster, width = slurm_site.cluster, 3
    script = pilot_script(cluster, "pilot-runs.sh", "sleep 600\n")
    clock, collector = FakeClock(), Collector()
    loop = director(slurm_site, script, clock, collector, pilots=12, max_waiting=width)
    peak = dict.fromkeys(cluster.partitions, 0)
    trimmed = 0
    try:
        for iteration in range(1, 11):
            summary = loop.run_iteration()
            doc = json.loads(summary_json(summary))
            assert doc["failures"] == [], doc["failures"]
            trimmed += sum(doc["pilots"]["trimmed"].get("slurm", {}).values())
            for when in ("after submitting", "after Slurm started what fits"):
                for partition, n in pending(cluster).items():
                    peak[partition] = max(peak[partition], n)
                    assert n <= width, f"iteration {iteration}, {when}: {n} pending on {partition}"
                # the node's 2 CPUs run 2 pilots; demand (12 per iteration) far exceeds it
                running = until(lambda: len(squeue(cluster, "RUNNING")) == 2, timeout=60)
                assert running, squeue(cluster)
            clock.advance(60)
        running = squeue(cluster, "RUNNING")
        assert peak == dict.fromkeys(cluster.partitions, width)
        assert trimmed >= 10 * 12 - (2 + 2 * width) - 2 * width  # nearly all demand was held back
        assert collector.notes == []
    finally:
        loop.close()
        cluster.cancel_all()
    figures(
        max_waiting=width,
        peak_pending=peak,
        running=len(running),
        iterations=10,
        demand_per_iteration=12,
        trimmed_pilots=trimmed,
    )


def test_a_partition_whose_every_pilot_fails_leaves_rotation_then_alarms(
    prompt_slurm_site, figures
) -> None:
    slurm_site = prompt_slurm_site  # each iteration waits for Slurm to run all it holds
    cluster = slurm_site.cluster
    script = pilot_script(
        cluster,
        "pilot-debug-fails.sh",
        'if [ "$SLURM_JOB_PARTITION" = debug ]; then\n'
        '  echo "pilot: no usable software area" >&2; exit 1\nfi\nsleep 1\n',
    )
    clock, collector = FakeClock(), Collector()
    # debug's 5 a poll reach the verdict's 10 finished pilots in 2 polls; batch, which keeps
    # working, needs only a few to show it goes on getting pilots (fewer to wait for)
    loop = director(
        slurm_site,
        script,
        clock,
        collector,
        pilots=10,
        max_waiting=5,
        backends={"slurm": {"endpoints": {"batch": {"max_waiting": 2}}}},
    )

    def settled() -> bool:  # Slurm has run what it holds: nothing pending or running any more
        return not squeue(cluster, "PENDING,RUNNING,CONFIGURING,COMPLETING")

    polls_of_debug = 0
    visible_at = out_at = None
    try:
        for _ in range(6):
            summary = loop.run_iteration()
            doc = json.loads(summary_json(summary))
            if any(p["endpoint"] == "debug" for p in doc["pilots"]["polls"]):
                polls_of_debug += 1
            if out_at is None and "slurm/debug" in doc["pilots"]["aborted"]:
                out_at = polls_of_debug
                break
            assert until(settled, timeout=120), squeue(cluster)
            if visible_at is None and any(
                s == "FAILED" and p == "debug" for _j, p, s in squeue(cluster)
            ):
                visible_at = polls_of_debug + 1  # the next poll is the first that can see them
            clock.advance(60)
        assert visible_at is not None and out_at is not None, (visible_at, out_at)
        polls_until_out = out_at - visible_at + 1
        assert polls_until_out <= 2
        assert [(n.level, n.endpoint.name) for n in collector.notes] == [("error", "debug")]
        (note,) = collector.notes
        assert note.failure.kind == "aborted" and "FAILED - NonZeroExitCode" in note.body
        assert "Pilots: 10 failed, 0 done" in note.body
        # out of rotation: the next iterations submit to batch only
        for _ in range(2):
            assert until(settled, timeout=120)
            clock.advance(60)
            records = loop.run_iteration().records
            assert {r.endpoint for r in records if r.outcome == "submitted"} == {"batch"}
        # it persists: back after failing_expiry, its new pilots fail again -> an alarm
        clock.advance(3600)
        for _ in range(4):
            loop.run_iteration()
            if len(collector.notes) > 1:
                break
            assert until(settled, timeout=120)
            clock.advance(60)
        assert [(n.level, n.endpoint.name) for n in collector.notes] == [
            ("error", "debug"),
            ("alarm", "debug"),
        ]
        batch = loop.state.pilot_registry().query("slurm", "batch")
        assert batch and {p.state for p in batch} <= {"done", "waiting", "running"}
    finally:
        loop.close()
        cluster.cancel_all()
    figures(
        polls_until_out=polls_until_out,
        notifications=[n.level for n in collector.notes],
        sample=note.body.split("(a sample):\n")[1].split("\nEpisode:")[0].strip(),
    )


def test_a_restarted_director_process_keeps_tracking_its_pilots(slurm_site) -> None:
    """Two `gridgate run --once` processes on one sqlite state: the second polls what the first
    submitted and fills only the room max_waiting leaves."""
    cluster = slurm_site.cluster
    doc = slurm_site.doc(partitions=["batch"], pilots=3)
    doc["director"]["pilots"] = {"max_waiting": 3}
    try:
        first = slurm_site.run_once(doc)
        ids = [i for s in first["submitted"] for i in s["job_ids"]]
        assert len(ids) == 3 and first["pilots"]["polls"] == []
        assert until(lambda: len(squeue(cluster, "RUNNING")) == 2, timeout=60), squeue(cluster)
        second = slurm_site.run_once(doc)  # a new process: it knows the pilots from the state file
        (poll,) = second["pilots"]["polls"]
        assert (poll["endpoint"], poll["pilots"], poll["outcome"]) == ("batch", 3, "ok")
        assert second["pilots_submitted"] == 2  # 1 of the first's 3 still waits: room for 2
        assert second["pilots"]["trimmed"] == {"slurm": {"max_waiting": 1}}
        assert pending(cluster)["batch"] <= 3
    finally:
        cluster.cancel_all()
