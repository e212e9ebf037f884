"""The ``aborted`` verdict: an endpoint whose last finished pilots failed too often fails with
kind ``aborted`` through the director's failure path (failing cache, error, alarm), as a server
whose submissions fail does."""

from __future__ import annotations

from loguru import logger

from gridgate.core.engine.failure import FailurePath
from gridgate.core.engine.limits import PilotSettings
from gridgate.core.engine.records import clock_time
from gridgate.core.engine.runtime import Iteration, Runtime
from gridgate.core.model import Endpoint, Failure, SubmitResult
from gridgate.core.state import PilotRegistry, StateError

#: Where the time of an endpoint's last ``aborted`` verdict is kept: the next verdict counts
#: only pilots that finished after it.
VERDICT = "aborted-verdict/"
#: States whose share decides whether an endpoint's pilots abort (``cancelled`` was our own
#: doing, ``lost`` says nothing of how the pilot ended).
DECIDING = ("done", "failed")


class AbortVerdicts:
    """Judges an endpoint whose pilots changed state at a poll."""

    def __init__(self, runtime: Runtime, failures: FailurePath) -> None:
        self.runtime = runtime
        self.failures = failures

    def judge(
        self,
        registry: PilotRegistry,
        endpoint: Endpoint,
        it: Iteration,
        settings: PilotSettings,
        now: float,
    ) -> bool:
        """Whether the endpoint's last finished pilots failed too often; if so it fails with kind
        ``aborted`` through the director's failure path (failing cache, error, alarm)."""
        state = self.runtime.state
        try:
            after = clock_time(state.get(VERDICT + endpoint.key), "abort verdict") or 0.0
        except (StateError, ValueError):
            after = 0.0
        window = settings.abort_window
        finished = [
            p
            for p in registry.last_finished(endpoint.backend, endpoint.name, 3 * window, after)
            if p.state in DECIDING
        ][:window]
        failed = [p for p in finished if p.state == "failed"]
        if len(finished) < settings.abort_min_finished:
            return False
        if len(failed) / len(finished) <= settings.abort_threshold:
            return False
        try:
            state.set(VERDICT + endpoint.key, repr(now), ttl=settings.keep_finished)
        except StateError as exc:
            logger.error("aborted verdict on {} not kept: {}", endpoint.key, exc)
        sample: list[str] = []
        for pilot in failed:
            text = " - ".join(t for t in (pilot.native, pilot.reason) if t) or "(no reason given)"
            if text not in sample:
                sample.append(text)
        sample = sample[: settings.abort_sample]
        reason = f"{len(failed)} of its last {len(finished)} finished pilots failed"
        lines = [
            f"Pilots: {len(failed)} failed, {len(finished) - len(failed)} done, of the last "
            f"{len(finished)} that finished on {endpoint.name} "
            f"(threshold: more than {settings.abort_threshold:.0%} failed)"
        ]
        if sample:
            lines += ["Reasons given by the backend (a sample):", *(f"  {s}" for s in sample)]
        result = SubmitResult(
            endpoint=endpoint, ok=False, operation="Pilot Jobs", message="\n".join(lines)
        )
        self.failures.server_failed(endpoint, result, it, Failure(kind="aborted", reason=reason))
        logger.warning("{}: {}; out of rotation", endpoint.key, reason)
        return True
