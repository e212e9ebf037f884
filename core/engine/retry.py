"""Sending a failed submission elsewhere in the same iteration.

When several threads choose a server shortly before it is found failing, their pilots would
be lost for the iteration. Instead the director tries each failed submission again on
another usable server, bounded three ways:

- at most ``director.retries_per_pilot`` more attempts per submission (0 turns retries off);
- never to a server excluded or in the failing cache, nor to one this submission already
  tried;
- never past the iteration's deadline: a retry starts only when its command's own deadline
  (now + the command timeout) falls within ``director.retry_within_seconds`` of the
  iteration's start, measured on the director's clock.

Only failures whose kind is worth retrying elsewhere (``Failure.transient``) and that are not
a fault of this machine (``Failure.local``) are retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gridgate.core.model import Failure, RetryReport

if TYPE_CHECKING:
    from gridgate.core.engine.section import DirectorSettings


@dataclass(frozen=True)
class ResubmitPolicy:
    """The bounds of one iteration's retries (see the module docstring)."""

    retries: int
    deadline: float

    @classmethod
    def for_iteration(cls, director: DirectorSettings, started: float) -> ResubmitPolicy:
        """The policy of an iteration that started at ``started`` (clock time)."""
        return cls(
            retries=director.retries_per_pilot,
            deadline=started + director.retry_within_seconds,
        )

    def decide(
        self, failure: Failure, attempt: int, now: float, timeout: float, others: int
    ) -> str | None:
        """What to do after attempt number ``attempt`` (1 = the first try) failed with
        ``failure`` and ``others`` usable servers remain untried: ``"retried"``, or
        ``"not retried: <why>"``, or None when the failure is not one to retry at all (a
        local fault, a kind not worth retrying elsewhere), which is not reported."""
        if failure.local or not failure.transient:
            return None
        if attempt > self.retries:
            return "not retried: " + (
                f"{self.retries} retries done" if self.retries else "retries are off"
            )
        if now + timeout > self.deadline:
            return "not retried: it would run past the iteration's deadline"
        if others == 0:
            return "not retried: no other usable server"
        return "retried"


def retry_entry(
    request_backend: str,
    group: str,
    pilots: int,
    endpoint: str,
    kind: str,
    attempt: int,
    outcome: str,
) -> RetryReport:
    """One line of the iteration's retry report (``gridgate run --json``'s ``retries``):
    which submission failed where, and what was done about it (``retried``, or why not)."""
    return RetryReport(
        backend=request_backend,
        group=group,
        pilots=pilots,
        failed_on=endpoint,
        kind=kind,
        attempt=attempt,
        outcome=outcome,
    )
