"""The failure path: what happens to a failure of a server, whoever found it (a submission, a
status poll, pilots that abort, a cancel). Classify -> a local fault (the backend paused, no
server blamed, one message per ``failing_expiry``) or a server failure (excluded, into the
failing cache, escalation decides the level, people told) -> accounted. The iteration, the
pilot tracker and the credential check are given it; none of them calls another's insides."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from loguru import logger

from gridgate.core.engine.compose import compose_failure, compose_local_fault, compose_recovered
from gridgate.core.engine.runtime import ACCOUNTING, FAILURES, Iteration, Runtime
from gridgate.core.model import (
    AccountingRecord,
    CancelResult,
    Endpoint,
    Failure,
    FailureReport,
    Notification,
    Outcome,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.state import StateError


def row_key() -> str:
    """A key of its own for one accounting or failure row. Appends are idempotent by content
    (``StateStore.append_record``), so an append retried after a store stall keeps one row;
    two attempts alike in every field (two skips of one group in one iteration, two failures
    of one server at one clock reading) differ in this key and keep two."""
    return uuid.uuid4().hex[:16]


def failed_call(
    endpoint: Endpoint,
    result: StatusResult | CancelResult,
    operation: str,
    *,
    message: str | None = None,
    local_fault: str | None = None,
) -> SubmitResult:
    """A failed poll or cancel as the :class:`SubmitResult` the failure path classifies:
    its command, its operation (``operation`` when the backend named none), its message and
    its local fault (the result's own unless given)."""
    return SubmitResult(
        endpoint=endpoint,
        ok=False,
        command=result.command,
        operation=result.operation or operation,
        message=result.message if message is None else message,
        local_fault=(getattr(result, "local_fault", "") or "")
        if local_fault is None
        else local_fault,
    )


class FailurePath:
    """classify -> local fault or server failure -> failing cache -> escalation -> notify, and
    the accounting of every attempt. ``on_submitted`` hears of each successful submission (the
    pilot tracker tracks its pilots)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.on_submitted: Callable[[AccountingRecord], None] | None = None
        #: hears of each failure kept in ``FAILURES`` (backend, endpoint, kind): the metrics
        #: count what the report counts
        self.on_failure_recorded: Callable[[str, str, str], None] | None = None

    def tell(self, it: Iteration, note: Notification) -> None:
        """Send ``note`` to every notifier and keep it in the iteration's summary."""
        with it.lock:
            it.notifications.append(note)
        self.runtime.notify(note)

    def server_failed(
        self,
        endpoint: Endpoint,
        result: SubmitResult,
        it: Iteration,
        failure: Failure | None = None,
        *,
        submission: bool = False,
    ) -> Failure:
        """A failure of ``endpoint`` (a submission, a status query, aborting pilots):
        classified unless ``failure`` is given, then excluded, escalated and told. One that is
        no ``submission`` (whose caller writes its accounting row) is kept in ``FAILURES``."""
        hook = self.runtime.pm.hook
        if failure is None:
            failure = hook.gridgate_classify_failure(endpoint=endpoint, result=result) or Failure(
                kind="error"
            )
        overrides = self.runtime.settings.notify_kinds
        if failure.kind in overrides:
            failure = replace(failure, notify=overrides[failure.kind])
        command = result.command
        with it.lock:
            it.failures.append(
                FailureReport(
                    backend=endpoint.backend,
                    endpoint=endpoint.name,
                    kind=failure.kind,
                    returncode=command.returncode if command else None,
                    timed_out=bool(command and command.timed_out),
                    command=tuple(command.argv) if command else (),
                    operation=result.operation,
                )
            )
        if not submission:
            self._record_failure(endpoint, failure, result, it)
        if failure.local:
            self.local_fault(endpoint, failure, result, it)
        elif failure.exclude:
            it.exclude(endpoint)
            episode = self.runtime.failing.enter(
                endpoint, failure.kind
            )  # whichever plugin escalates
            escalation = hook.gridgate_escalate(
                endpoint=endpoint, failure=failure, result=result, episode=episode
            )
            if escalation is not None and escalation.level is not None:
                downtime = it.in_downtime(endpoint)
                if downtime is not None:  # the site said so already: counted, excluded, not told
                    logger.info(
                        "failure of {} ({}) not mailed: it is in a GOCDB downtime ({}); it "
                        "still counts and excludes",
                        endpoint.key,
                        failure.kind,
                        downtime.reason,
                    )
                else:
                    note = compose_failure(
                        endpoint, failure, escalation, result, self.runtime.clock.time()
                    )
                    self.tell(it, note)
        return failure

    def _record_failure(
        self, endpoint: Endpoint, failure: Failure, result: SubmitResult, it: Iteration
    ) -> None:
        try:
            self.runtime.state.append_record(
                FAILURES,
                {
                    "row": row_key(),
                    "time": self.runtime.clock.time(),
                    "backend": endpoint.backend,
                    "endpoint": endpoint.name,
                    "kind": failure.kind,
                    "operation": result.operation,
                    "iteration": it.info.number,
                },
            )
        except StateError as exc:
            logger.error("failure row lost, state store failed: {}", exc)
        if self.on_failure_recorded is not None:
            self.on_failure_recorded(endpoint.backend, endpoint.name, failure.kind)

    def answered(self, endpoint: Endpoint, it: Iteration) -> None:
        """``endpoint`` answered (a submission or a status poll succeeded): when its failures
        were told, or an operator cleared it, people hear once that it works again."""
        with it.lock:
            if endpoint.key not in it.troubled:
                return
            it.troubled.discard(endpoint.key)  # one look per iteration
        try:
            back = self.runtime.failing.recovered(endpoint)
        except StateError as exc:
            logger.debug("recovery of {} not checked: {}", endpoint.key, exc)
            return
        if back is None:
            return
        now = self.runtime.clock.time()
        self.tell(it, compose_recovered(endpoint, back.start, back.failures, back.cleared_by, now))

    def local_fault(
        self, endpoint: Endpoint, failure: Failure, result: SubmitResult, it: Iteration
    ) -> None:
        """A command that cannot start on this machine: pause the backend, blame no server,
        and say so once per failing-cache period (the same rhythm as a failing server)."""
        with it.lock:
            it.local_faults.add(endpoint.backend)
        if not failure.notify:
            return
        now = self.runtime.clock.time()
        repeat_every = self.runtime.settings.failing_expiry
        try:
            first = self.runtime.failing.local_fault(endpoint.backend, failure.kind)
        except StateError:  # no shared view: a repeated mail beats a silent outage
            first = True
        if not first:
            return
        note = compose_local_fault(endpoint, failure, result, now, repeat_every)
        self.tell(it, note)

    def record(self, it: Iteration, record: AccountingRecord) -> None:
        """Keep ``record`` (one attempt, :meth:`AttemptOutcome.account`'s): a row in the
        iteration and in the store's accounting table, the tracker told of a submission,
        ``gridgate_submission_finished`` broadcast."""
        with it.lock:
            it.records.append(record)
        try:
            self.runtime.state.append_record(ACCOUNTING, {**record.as_dict(), "row": row_key()})
        except StateError as exc:
            logger.error("accounting row lost, state store failed: {}", exc)
        if record.outcome == "submitted":
            self.answered(Endpoint(record.backend, record.endpoint), it)
            if self.on_submitted is not None:
                self.on_submitted(record)
        self.runtime.broadcast(
            "gridgate_submission_finished", "plugin", "submission finished", record=record
        )


@dataclass(frozen=True)
class AttemptOutcome:
    """What one attempt of a request came to, and its own accounting (:meth:`account`).

    Built once with what is known when the attempt starts (the iteration, the request, the
    attempt's number and ``time.monotonic()`` start); each step that ends the attempt states
    only what differs: the server it reached (:meth:`on`), then how it ended
    (:meth:`skipped`, :meth:`refused`, :meth:`no_match`, :meth:`submitted`, :meth:`failed`).
    A skipped attempt sent nothing: it takes no time. Any other takes the time from its start
    to :meth:`timed` (when the server was last talked to), or to :meth:`account`.
    """

    it: Iteration
    request: SubmitRequest
    attempt: int = 1
    #: ``time.monotonic()`` when the attempt started (None: nothing is timed)
    started: float | None = None
    endpoint: Endpoint | None = None
    outcome: Outcome = "skipped"
    failure_kind: str = ""
    job_ids: tuple[str, ...] = ()
    #: the pilots it accounts (None: the request's count)
    pilots: int | None = None
    #: its duration once known (None: measured at :meth:`account`)
    duration: float | None = None

    def on(self, endpoint: Endpoint, request: SubmitRequest) -> AttemptOutcome:
        """The attempt reached ``endpoint`` with ``request`` (the part of it that fitted)."""
        return replace(self, endpoint=endpoint, request=request)

    def timed(self) -> AttemptOutcome:
        """The attempt's duration fixed now (the server is no longer being talked to)."""
        return replace(self, duration=self._elapsed())

    def skipped(self, kind: str, pilots: int | None = None) -> AttemptOutcome:
        """Nothing was sent, because of ``kind`` (``pilots`` of the request, or all)."""
        return replace(self, outcome="skipped", failure_kind=kind, pilots=pilots, duration=0.0)

    def refused(self, kind: str) -> AttemptOutcome:
        """Admission control (``kind``) refused the attempt."""
        return replace(self, outcome="refused", failure_kind=kind)

    def no_match(self) -> AttemptOutcome:
        """The server had no resource matching the request."""
        return replace(self, outcome="no_match")

    def submitted(self, job_ids: tuple[str, ...]) -> AttemptOutcome:
        """The pilots were submitted, as ``job_ids``."""
        return replace(self, outcome="submitted", job_ids=job_ids)

    def failed(self, kind: str) -> AttemptOutcome:
        """The attempt failed with a failure of ``kind``."""
        return replace(self, outcome="failed", failure_kind=kind)

    def _elapsed(self) -> float:
        if self.duration is not None:
            return self.duration
        return 0.0 if self.started is None else time.monotonic() - self.started

    def account(self, path: FailurePath) -> None:
        """Account the attempt down ``path`` (:meth:`FailurePath.record`)."""
        path.record(
            self.it,
            AccountingRecord(
                time=path.runtime.clock.time(),
                backend=self.request.backend,
                endpoint=self.endpoint.name if self.endpoint else "",
                outcome=self.outcome,
                group=self.request.group,
                pilots=self.request.count if self.pilots is None else self.pilots,
                failure_kind=self.failure_kind,
                job_ids=self.job_ids,
                duration=round(self._elapsed(), 4),
                iteration=self.it.info.number,
                attempt=self.attempt,
                name=self.request.name if self.outcome != "skipped" else "",
            ),
        )
