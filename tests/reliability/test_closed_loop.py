"""The closed loop against a batch system driven by real commands: ``max_waiting`` holds on
every partition while demand exceeds what runs, and a partition whose every pilot fails leaves
rotation within 2 status polls, with one error, then an alarm when it persists.

The batch system is small and written for this test: its ``submit`` and ``status`` commands
are real executables (``gridgate.core.testing.stand_in_command``) run through the runner, one
status command per partition per poll with every tracked job id in its argv; the test plays
the scheduler between iterations (2 slots per good partition; on partition ``bad`` every job
fails as soon as it is scheduled) and rewrites what ``status`` prints, in the
``squeue -h -o "%i %T %r"`` shape. The same checks on the real Slurm cluster are
tests/plugins/slurm/test_closed_loop_slurm.py; this one is fast and needs no cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.config import validate_document
from gridgate.core.engine.director import Director
from gridgate.core.model import (
    BackendInfo,
    Endpoint,
    JobStatus,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.runner import argv_chunks, run
from gridgate.core.state import Pilot
from gridgate.core.stores.sqlite import SqliteState
from gridgate.core.testing import Collector, StandIn, stand_in_command

BACKEND = "minibatch"
PARTITIONS = ("good1", "good2", "bad")
STATES = {"PENDING": "waiting", "RUNNING": "running", "COMPLETED": "done", "FAILED": "failed"}


class MiniBatch:
    """A backend plugin for the two stand-in commands."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.submit = stand_in_command(bin_dir, "submit", stdout="Submitted batch job {call}\n")
        self.status = self.write_status("")

    def write_status(self, text: str) -> StandIn:
        return stand_in_command(self.bin_dir, "status", stdout=text)

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        if backend != BACKEND:
            return None
        return BackendInfo(BACKEND, tuple(Endpoint(BACKEND, p) for p in PARTITIONS))

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend != BACKEND:
            return None
        result = run([str(self.submit), endpoint.name], timeout=timeout)
        if not result.ok:
            return SubmitResult(endpoint, ok=False, command=result)
        return SubmitResult(endpoint, ok=True, job_ids=(result.stdout.split()[-1],), command=result)

    @hookimpl
    def gridgate_job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        if endpoint.backend != BACKEND:
            return None
        statuses: dict[str, JobStatus] = {}
        chunks = argv_chunks([str(self.status), endpoint.name], list(job_ids))
        for argv in chunks:
            result = run(argv, timeout=timeout)
            if not result.ok:
                return StatusResult(endpoint, ok=False, command=result, commands=len(chunks))
            wanted = set(argv[2:])
            for line in result.stdout.splitlines():
                job, native, reason = (line.split(" ", 2) + ["", ""])[:3]
                if job in wanted:
                    statuses[job] = JobStatus(job, STATES[native], native=native, reason=reason)  # type: ignore[arg-type]
        return StatusResult(endpoint, ok=True, statuses=statuses, commands=len(chunks))


class Scheduler:
    """Plays the batch system between iterations: reads what was submitted from the submit
    command's call log, starts jobs on free slots, finishes them."""

    def __init__(self, batch: MiniBatch, slots: int = 2) -> None:
        self.batch, self.slots = batch, slots
        self.jobs: dict[str, list[str]] = {}  # id -> [partition, native state]
        self.seen_calls = 0

    def pending(self) -> dict[str, int]:
        self._learn()
        out = dict.fromkeys(PARTITIONS, 0)
        for partition, state in self.jobs.values():
            out[partition] += state == "PENDING"
        return out

    def _learn(self) -> None:
        calls = self.batch.submit.calls()
        for number, call in enumerate(calls[self.seen_calls :], start=self.seen_calls + 1):
            self.jobs[str(number)] = [call["argv"][0], "PENDING"]
        self.seen_calls = len(calls)

    def tick(self) -> int:
        """One scheduling pass; returns how many jobs failed."""
        self._learn()
        failed = 0
        for job in self.jobs.values():
            if job[1] == "RUNNING":
                job[1] = "COMPLETED"
        for partition in PARTITIONS:
            queue = [j for j in self.jobs.values() if j[0] == partition and j[1] == "PENDING"]
            start = queue if partition == "bad" else queue[: self.slots]
            for job in start:
                job[1] = "FAILED" if partition == "bad" else "RUNNING"
                failed += partition == "bad"
        lines = []
        for number, (_partition, state) in self.jobs.items():
            reason = (
                "NonZeroExitCode"
                if state == "FAILED"
                else "Resources"
                if state == "PENDING"
                else "None"
            )
            lines.append(f"{number} {state} {reason}")
        self.batch.write_status("\n".join(lines) + "\n")
        return failed


def director_for(
    tmp_path: Path, batch: MiniBatch, clock: FakeClock, collector: Collector, max_waiting: int
) -> Director:
    doc = {
        "director": {
            "cycle_seconds": 1,
            "max_threads": 4,
            "command_timeout": 30,
            "failing_expiry": 3600,
            "ticket_expiry": 3600,
            "state_dir": str(tmp_path / "state"),
            "pilots": {"max_waiting": max_waiting},
        },
        "state": {"driver": "memory"},
        "demand": {"static": {BACKEND: 20}},
        "selectors": {"round_robin": {}},
    }
    state = SqliteState({"path": str(tmp_path / "state" / "state.db")}, clock=clock)
    return Director(
        validate_document(doc), clock=clock, extra_plugins=[batch, collector], state=state
    )


def status_calls(batch: MiniBatch) -> list[str]:
    return [c["argv"][0] for c in batch.status.calls()]


def test_max_waiting_holds_and_an_all_failing_partition_leaves_rotation(tmp_path, figures) -> None:
    width = 5
    batch, clock, collector = MiniBatch(tmp_path / "bin"), FakeClock(), Collector()
    scheduler = Scheduler(batch)
    director = director_for(tmp_path, batch, clock, collector, max_waiting=width)
    peak = dict.fromkeys(PARTITIONS, 0)
    visible_at_poll = out_at_poll = None
    try:
        for iteration in range(1, 11):
            summary = director.run_iteration()
            bad_polls = status_calls(batch).count("bad")
            if (
                out_at_poll is None
                and summary.pilots is not None
                and f"{BACKEND}/bad" in summary.pilots.aborted
            ):
                out_at_poll = bad_polls
            for partition, n in scheduler.pending().items():
                peak[partition] = max(peak[partition], n)
                assert n <= width, f"iteration {iteration}: {n} pending on {partition}"
            if scheduler.tick() and visible_at_poll is None:
                visible_at_poll = bad_polls + 1  # the next poll is the first to see them
            clock.advance(60)
        assert peak["good1"] == peak["good2"] == width  # demand (20) always exceeded the room
        assert out_at_poll is not None and out_at_poll - visible_at_poll + 1 <= 2
        assert [(n.level, n.endpoint.name) for n in collector.notes] == [("error", "bad")]
        (note,) = collector.notes
        assert note.failure.kind == "aborted" and "NonZeroExitCode" in note.body
        assert "Pilots: 10 failed, 0 done" in note.body
        # one status command per partition per poll (iterations 2..10: the first had nothing
        # tracked yet), whatever the number of pilots
        per_poll = {p: status_calls(batch).count(p) for p in PARTITIONS}
        assert per_poll["good1"] == per_poll["good2"] == 9
        # it persists: back in rotation after failing_expiry, its new pilots fail again -> alarm
        clock.advance(3600)
        for _ in range(4):
            director.run_iteration()
            scheduler.tick()
            clock.advance(60)
        assert [(n.level, n.endpoint.name) for n in collector.notes] == [
            ("error", "bad"),
            ("alarm", "bad"),
        ]
        assert "It has been failing at least for" in collector.notes[-1].body
    finally:
        director.close()
        director.state.close()
    figures(
        max_waiting=width,
        peak_pending=peak,
        polls_until_out=out_at_poll - visible_at_poll + 1,
        notifications=[n.level for n in collector.notes],
    )


def test_one_status_command_per_endpoint_for_5000_tracked_pilots(tmp_path, figures) -> None:
    batch, clock, collector = MiniBatch(tmp_path / "bin"), FakeClock(), Collector()
    director = director_for(tmp_path, batch, clock, collector, max_waiting=0)
    try:
        registry = director.state.pilot_registry()
        for count, partition in ((1, "good1"), (5000, "good2")):
            registry.put(
                Pilot(
                    f"{partition}-{i}",
                    BACKEND,
                    partition,
                    submitted=clock.time(),
                    changed=clock.time(),
                )
                for i in range(count)
            )
        batch.write_status(
            "".join(f"good2-{i} RUNNING None\n" for i in range(5000)) + "good1-0 PENDING Priority\n"
        )
        director.run_iteration()
        calls = batch.status.calls()
        per_endpoint = {p: [c for c in calls if c["argv"][0] == p] for p in ("good1", "good2")}
        assert [len(per_endpoint["good1"]), len(per_endpoint["good2"])] == [1, 1]
        assert len(per_endpoint["good2"][0]["argv"]) == 1 + 5000
        assert registry.counts() == {
            (BACKEND, "good1", "waiting"): 1,
            (BACKEND, "good2", "running"): 5000,
        }
    finally:
        director.close()
        director.state.close()
    figures(status_commands_per_poll={"1 pilot": 1, "5000 pilots": 1})
