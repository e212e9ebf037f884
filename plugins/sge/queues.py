"""What a Grid Engine cluster queue says of itself (``gridgate_endpoint_state``): one read of
the cell (``qstat -g c``: each queue's slots; ``qstat -u * -s p -g d -r``: every user's pending
jobs and the queues they asked for; ``qconf -sq``: their ``h_rt`` and ``slots``) answers for all its queues during ``queue_state_interval``
seconds. A read that fails is kept as well (a qmaster out of reach is not asked again by each
queue): the queues then say nothing, and nothing changes for them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loguru import logger

from gridgate.core.backend import Deadline
from gridgate.core.documents import DocumentError
from gridgate.core.endpoint_state import EndpointState, StateCache
from gridgate.core.model import CommandResult
from gridgate.plugins.sge.parse import (
    QueueLimits,
    parse_cluster_queues,
    parse_named_qstat,
    parse_queue_limits,
    pending_per_queue,
)

#: what an answer says it read
SOURCE = "sge qstat -g c"
#: the cache's key of the one cell the backend's commands reach
CELL = "cell"


@dataclass(frozen=True)
class CellRead:
    """One read of the cell: each cluster queue's state, or why it could not be read."""

    queues: dict[str, EndpointState]
    problem: str = ""


class CellStates:
    """The reads of the cell, kept ``interval`` seconds (``run`` runs one argv with a deadline,
    ``command`` names a Grid Engine program as configured)."""

    def __init__(
        self,
        interval: float,
        run: Callable[[Sequence[str], Deadline], CommandResult],
        command: Callable[[str], str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._cache: StateCache[CellRead] = StateCache(interval)
        self._run = run
        self._command = command
        self._clock = clock

    def queue(self, name: str, timeout: float) -> EndpointState | None:
        """What cluster queue ``name`` says; None when the cell cannot be read now or has no
        such queue."""
        read = self._cache.get(CELL, lambda: self._read(timeout))
        return None if read.problem else read.queues.get(name)

    def _read(self, timeout: float) -> CellRead:
        deadline = Deadline.after(timeout)
        qstat = self._command("qstat")
        outputs = []
        for argv in ([qstat, "-g", "c"], [qstat, "-u", "*", "-s", "p", "-g", "d", "-r"]):
            outcome = self._run(argv, deadline)
            if not outcome.ok or outcome.stdout_truncated:
                why = (
                    "its output passed director.max_output_bytes"
                    if outcome.ok
                    else outcome.describe()
                )
                return self._failed(f"{' '.join(argv[1:])}: {why}")
            outputs.append(outcome.stdout)
        try:
            slots = parse_cluster_queues(outputs[0])
        except DocumentError as exc:
            return self._failed(str(exc))
        pending = pending_per_queue(parse_named_qstat(outputs[1]), slots)
        limits = self._limits(list(slots), deadline)
        now = self._clock()
        states = {}
        for name, queue in slots.items():
            # no instance of it takes a job (disabled, suspended, unknown, in error): its
            # running jobs go on, a new one would only wait
            closed = queue.total > 0 and queue.unusable >= queue.total
            states[name] = EndpointState(
                serving="draining" if closed else "production",
                waiting=pending[name],
                running=queue.used,
                free_slots=queue.available,
                max_walltime=limits[name].walltime if name in limits else None,
                max_cores=limits[name].slots if name in limits else None,
                read_at=now,
                source=SOURCE,
                reason=f"{queue.unusable} of {queue.total} slots cdsuE" if closed else "",
            )
        return CellRead(states)

    def _limits(self, names: list[str], deadline: Deadline) -> dict[str, QueueLimits]:
        """Each queue's limits (``qconf -sq``); none when they cannot be read (logged): the
        queues' other figures still hold."""
        if not names:
            return {}
        outcome = self._run([self._command("qconf"), "-sq", ",".join(names)], deadline)
        problem = outcome.describe() if not outcome.ok or outcome.stdout_truncated else ""
        if not problem:
            try:
                return parse_queue_limits(outcome.stdout)
            except DocumentError as exc:
                problem = str(exc)
        logger.warning("sge: the queues' limits cannot be read (qconf -sq): {}", problem)
        return {}

    def _failed(self, problem: str) -> CellRead:
        logger.warning("sge: the cell's queues say nothing of themselves for now: {}", problem)
        return CellRead({}, problem)
