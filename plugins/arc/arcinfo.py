"""What an ARC CE's queue says of itself (``gridgate_endpoint_state``) through the ARC client
(``interface: cli``): one ``arcinfo -l -c URL`` of the CE answers for every endpoint on it (each
queue of the CE is a share) during ``queue_state_interval`` seconds. A run that fails is kept as
well (a CE that does not answer is not asked again by each of its queues): its endpoints then
say nothing, and nothing changes for them.

arcinfo prints fewer figures than the GLUE2 document the REST interface reads: a share's free
slots, its wall-time limit and the serving state of its endpoints, but no count of waiting or
running jobs (:func:`.documents.arcinfo_shares`); those stay None."""

from __future__ import annotations

import time
from collections.abc import Callable

from loguru import logger

from gridgate.core.documents import DocumentError
from gridgate.core.endpoint_state import EndpointState, StateCache
from gridgate.plugins.arc.ces import CE
from gridgate.plugins.arc.classify import clip
from gridgate.plugins.arc.cli import CliInterface
from gridgate.plugins.arc.documents import arcinfo_shares
from gridgate.plugins.arc.rest.shares import CeRead

__all__ = ["SOURCE", "ArcinfoStates"]

#: what an answer says it read
SOURCE = "arcinfo -l share"


class ArcinfoStates:
    """The arcinfo runs of each CE (by its URL), kept ``interval`` seconds."""

    def __init__(
        self, cli: CliInterface, interval: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._cli = cli
        self._cache: StateCache[CeRead] = StateCache(interval)
        self._clock = clock

    def share(self, ce: CE, timeout: float) -> EndpointState | None:
        """What the share of ``ce``'s queue says (the CE's only share when no queue is
        configured); None when the CE cannot be read now or has no such share."""
        read = self._cache.get(ce.endpoint.url, lambda: self._read(ce, timeout))
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
            free_slots=share.free_slots,
            max_walltime=share.max_walltime,
            read_at=read.read_at,
            source=SOURCE,
            reason="" if share.serving == "production" else f"Serving state {share.serving}",
        )

    def _read(self, ce: CE, timeout: float) -> CeRead:
        outcome = self._cli.arcinfo(ce, timeout)
        if not outcome.ok or outcome.stdout_truncated:
            last = outcome.stderr.strip().splitlines()[-1:]
            why = outcome.describe() if not outcome.ok else "its output passed the cap"
            return self._failed(ce, "; ".join(["arcinfo " + why, *last]))
        try:
            shares = arcinfo_shares(outcome.stdout)
        except DocumentError as exc:
            return self._failed(ce, str(exc))
        return CeRead(tuple(shares), self._clock())

    def _failed(self, ce: CE, problem: str) -> CeRead:
        logger.warning(
            "arc: {} says nothing of its queues for now: {}", ce.endpoint.url, clip(problem)
        )
        return CeRead((), self._clock(), problem)
