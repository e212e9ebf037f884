"""What an ARC CE's queue says of itself (``gridgate_endpoint_state``) over REST: one ``GET
/rest/1.0/info`` of the CE (its GLUE2 document) answers for every endpoint on it (each queue of
the CE is a ComputingShare) during ``queue_state_interval`` seconds. A read that fails is kept as
well (a CE that does not answer is not asked again by each of its queues): its endpoints then
say nothing, and nothing changes for them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from loguru import logger

from gridgate.core.documents import DocumentError
from gridgate.core.endpoint_state import EndpointState, StateCache
from gridgate.plugins.arc.ces import CE
from gridgate.plugins.arc.documents import GlueShare, glue_shares
from gridgate.plugins.arc.rest.client import ArexError
from gridgate.plugins.arc.rest.interface import RestInterface

#: what an answer says it read
SOURCE = "A-REX GLUE2 ComputingShare"


@dataclass(frozen=True)
class CeRead:
    """One read of a CE: its shares, or why they could not be read."""

    shares: tuple[GlueShare, ...]
    read_at: float
    problem: str = ""


class ShareStates:
    """The reads of each CE (by its service URL), kept ``interval`` seconds."""

    def __init__(
        self, rest: RestInterface, interval: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._rest = rest
        self._cache: StateCache[CeRead] = StateCache(interval)
        self._clock = clock

    def share(self, ce: CE, timeout: float) -> EndpointState | None:
        """What the share of ``ce``'s queue says (the CE's only share when no queue is
        configured); None when the CE cannot be read now or has no such share."""
        service = self._rest.service(ce)
        if not service:
            return None
        read = self._cache.get(service, lambda: self._read(service, timeout))
        if read.problem:
            return None
        if ce.queue:
            found = [s for s in read.shares if ce.queue in (s.queue, s.name)]
        else:
            found = list(read.shares) if len(read.shares) == 1 else []
        if not found:
            return None
        share = found[0]
        return EndpointState(
            serving=share.serving,
            waiting=share.waiting,
            running=share.running,
            free_slots=share.free_slots,
            max_walltime=share.max_walltime,
            max_memory_mb=share.max_memory_mb,
            max_cores=share.max_slots,
            read_at=read.read_at,
            source=SOURCE,
            reason="" if share.serving == "production" else f"ServingState {share.serving}",
        )

    def _read(self, service: str, timeout: float) -> CeRead:
        credential = self._rest.credential()
        if credential.problem:
            return self._failed(service, credential.problem)
        client = self._rest.client(service, credential)
        deadline = self._rest.settings.deadline(timeout)
        try:
            shares = glue_shares(client.info(deadline))
        except (ArexError, DocumentError) as exc:
            return self._failed(service, str(exc))
        return CeRead(tuple(shares), self._clock())

    def _failed(self, service: str, problem: str) -> CeRead:
        logger.warning("arc: {} says nothing of its queues for now: {}", service, problem)
        return CeRead((), self._clock(), problem)
