"""Cancelling pilots on a backend: under an admission grant of category ``other``, recorded as
cancelled in the registry with the reason. The tracker cancels what waited too long through it;
``gridgate pilots cancel`` cancels what the operator names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from loguru import logger

from gridgate.core.credential_names import credentials_in_force
from gridgate.core.engine.failure import FailurePath, failed_call
from gridgate.core.engine.pilot_credentials import split_pilots
from gridgate.core.engine.runtime import Iteration, Runtime
from gridgate.core.model import AdmissionRequest, CancelResult, Endpoint, Refusal
from gridgate.core.state import Pilot, PilotRegistry


def cancel_pilots(
    runtime: Runtime,
    registry: PilotRegistry,
    endpoint: Endpoint,
    pilots: Sequence[Pilot],
    timeout: float,
    reason: str,
    it: Iteration | None = None,
    failures: FailurePath | None = None,
    names: Callable[[str], Mapping[str, str]] | None = None,
) -> tuple[list[str], str]:
    """Cancel ``pilots`` of ``endpoint`` with one ``gridgate_cancel`` call under an admission
    grant of category ``other``, and record those cancelled (with ``reason``). A cancel that
    this machine could not even run (``local_fault``: a file it cannot write) is, within an
    iteration ``it``, a local fault through its ``failures`` path (told once per
    ``failing_expiry``). The pilots of each credential (``names``: a demand group's kind ->
    credential name; default: the endpoint's within an iteration, else the first of each
    kind) are cancelled with it, one call each.

    :return: the ids cancelled, and what went wrong ('' when nothing did).
    """
    hook = runtime.pm.hook
    answer = hook.gridgate_admit(
        request=AdmissionRequest(
            category="other",
            opcode="JOB_CANCEL",
            size=len(pilots),
            endpoint=endpoint,
            user=runtime.user,
        )
    )
    if isinstance(answer, Refusal):
        return [], f"refused by admission control: {answer.reason}"
    # each group's pilots with its group's credential (as its polls)
    if names is None and it is not None:
        chosen = it.credentials_of(endpoint)
        names = lambda _group: chosen  # noqa: E731
    parts = split_pilots(pilots, names) if names is not None else [({}, list(pilots))]
    results: list[CancelResult | None] = []
    try:
        for credentials, part in parts:
            with credentials_in_force(credentials):
                results.append(
                    hook.gridgate_cancel(
                        endpoint=endpoint, job_ids=[p.job_id for p in part], timeout=timeout
                    )
                )
    except Exception as exc:  # a plugin bug must not stop the iteration
        logger.opt(exception=exc).error("cancelling on {} crashed in a plugin", endpoint.key)
        return [], f"the backend plugin crashed: {type(exc).__name__}: {exc}"
    finally:
        if answer is not None:
            hook.gridgate_release(grant=answer)
    answered = [r for r in results if r is not None]
    if not answered:
        return [], f"backend {endpoint.backend} cannot cancel"
    result = answered[0] if len(answered) == 1 else _joined(endpoint, answered)
    local = getattr(result, "local_fault", "") or ""
    if local and it is not None and failures is not None:
        failures.server_failed(endpoint, failed_call(endpoint, result, "Job Cancel"), it)
    wanted = {p.job_id for p in pilots}
    done = sorted(wanted & set(result.cancelled))
    now = runtime.clock.time()
    registry.put(
        p.moved("cancelled", now, p.native, reason) for p in pilots if p.job_id in set(done)
    )
    problem = ""
    if not result.ok or len(done) < len(pilots):
        why = result.message or (result.command.describe() if result.command else "")
        problem = f"{len(pilots) - len(done)} not cancelled" + (f": {why}" if why else "")
    return done, problem


def _joined(endpoint: Endpoint, results: Sequence[CancelResult]) -> CancelResult:
    """One answer made of the calls of each credential."""
    failed = next((r for r in results if not r.ok or r.local_fault), None)
    return CancelResult(
        endpoint=endpoint,
        ok=all(r.ok for r in results),
        cancelled=tuple(i for r in results for i in r.cancelled),
        command=(failed or results[0]).command,
        operation=(failed or results[0]).operation,
        message="; ".join(r.message for r in results if r.message),
        local_fault=next((r.local_fault for r in results if r.local_fault), ""),
    )
