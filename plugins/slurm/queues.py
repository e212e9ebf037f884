"""What a Slurm partition says of itself (``gridgate_endpoint_state``): one read of a cluster
(``scontrol -o show partition``, ``sinfo``, ``squeue`` of every user's pending and running jobs)
answers for all its partitions during ``queue_state_interval`` seconds, so that 50 partitions of
one cluster cost three commands an interval. A read that fails is kept as well (a dead controller
is not asked again by each partition): the partitions of that cluster then say nothing, and
nothing changes for them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loguru import logger

from gridgate.core.backend import Deadline
from gridgate.core.documents import DocumentError
from gridgate.core.endpoint_state import EndpointState, StateCache
from gridgate.core.model import CommandResult
from gridgate.plugins.slurm.documents import (
    PARTITION_STATES,
    QUEUE_FORMAT,
    SINFO_FORMAT,
    parse_partitions,
    parse_queue_counts,
    parse_sinfo_cpus,
)

#: what an answer says it read
SOURCE = "slurm scontrol/sinfo/squeue"


@dataclass(frozen=True)
class ClusterRead:
    """One read of a cluster: each partition's state, or why it could not be read."""

    partitions: dict[str, EndpointState]
    problem: str = ""


class ClusterStates:
    """The reads of each cluster (``""``: SLURM_CONF's), kept ``interval`` seconds.

    ``run`` runs one argv with a deadline (the backend's :meth:`~Backend.run`), ``command``
    names a Slurm program as configured, ``clock`` gives the time the figures were read."""

    def __init__(
        self,
        interval: float,
        run: Callable[[Sequence[str], Deadline], CommandResult],
        command: Callable[[str], str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._cache: StateCache[ClusterRead] = StateCache(interval)
        self._run = run
        self._command = command
        self._clock = clock

    def partition(self, partition: str, cluster: str, timeout: float) -> EndpointState | None:
        """What ``partition`` of ``cluster`` says; None when it cannot be read now (logged
        once a read) or the cluster has no such partition."""
        read = self._cache.get(cluster, lambda: self._read(cluster, timeout))
        if read.problem:
            return None
        return read.partitions.get(partition)

    def _read(self, cluster: str, timeout: float) -> ClusterRead:
        where = [f"--clusters={cluster}"] if cluster else []
        deadline = Deadline.after(timeout)
        argvs = (
            [self._command("scontrol"), *where, "-o", "show", "partition"],
            [self._command("sinfo"), *where, "-h", "-a", "-o", SINFO_FORMAT],
            [
                self._command("squeue"),
                *where,
                "-h",
                "-a",
                "-r",
                "-t",
                "PENDING,RUNNING",
                "-o",
                QUEUE_FORMAT,
            ],
        )
        outputs: list[str] = []
        for argv in argvs:
            outcome = self._run(argv, deadline)
            if not outcome.ok or outcome.stdout_truncated:
                why = (
                    "its output passed director.max_output_bytes"
                    if outcome.ok
                    else outcome.describe()
                )
                return self._failed(cluster, f"{argv[0]}: {why}")
            outputs.append(outcome.stdout)
        try:
            limits = parse_partitions(outputs[0])
            cpus = parse_sinfo_cpus(outputs[1])
            jobs = parse_queue_counts(outputs[2])
        except DocumentError as exc:
            return self._failed(cluster, str(exc))
        now = self._clock()
        states: dict[str, EndpointState] = {}
        for name, limit in limits.items():
            nodes = cpus.get(name)
            pending, running = jobs.get(name, (0, 0))
            cores = limit.max_cpus
            memory = limit.max_memory_mb
            if nodes is not None:  # a job runs on one node: no more than the largest has
                cores = nodes.node_cpus if cores is None else min(cores, nodes.node_cpus)
            per_cpu = limit.max_memory_per_cpu_mb
            if per_cpu is not None and cores is not None:
                memory = per_cpu * cores if memory is None else min(memory, per_cpu * cores)
            if nodes is not None:
                memory = (
                    nodes.node_memory_mb if memory is None else min(memory, nodes.node_memory_mb)
                )
            serving = PARTITION_STATES[limit.state]
            states[name] = EndpointState(
                serving=serving,
                waiting=pending,
                running=running,
                free_slots=nodes.idle if nodes is not None else None,
                max_walltime=limit.max_time,
                max_memory_mb=memory,
                max_cores=cores,
                read_at=now,
                source=SOURCE,
                reason="" if serving == "production" else f"State={limit.state}",
            )
        return ClusterRead(states)

    def _failed(self, cluster: str, problem: str) -> ClusterRead:
        logger.warning(
            "slurm: the partitions of cluster {} say nothing of their queues for now: {}",
            cluster or "of SLURM_CONF",
            problem,
        )
        return ClusterRead({}, problem)
