"""Cancelling pilots on a backend: under an admission grant of category ``other``, recorded as
cancelled in the registry with the reason. The tracker cancels what waited too long through it;
``gridgate pilots cancel`` cancels what the operator names.
"""

from __future__ import annotations

from collections.abc import Sequence

from loguru import logger

from gridgate.core.credential_names import credentials_in_force
from gridgate.core.engine.failure import FailurePath
from gridgate.core.engine.runtime import Iteration, Runtime
from gridgate.core.model import AdmissionRequest, Endpoint, Refusal, SubmitResult
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
) -> tuple[list[str], str]:
    """Cancel ``pilots`` of ``endpoint`` with one ``gridgate_cancel`` call under an admission
    grant of category ``other``, and record those cancelled (with ``reason``). A cancel that
    this machine could not even run (``local_fault``: a file it cannot write) is, within an
    iteration ``it``, a local fault through its ``failures`` path (told once per
    ``failing_expiry``).

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
    # within an iteration, the endpoint's credential (as its polls); else the first of each kind
    names = it.credentials_of(endpoint) if it is not None else {}
    try:
        with credentials_in_force(names):
            result = hook.gridgate_cancel(
                endpoint=endpoint, job_ids=[p.job_id for p in pilots], timeout=timeout
            )
    except Exception as exc:  # a plugin bug must not stop the iteration
        logger.opt(exception=exc).error("cancelling on {} crashed in a plugin", endpoint.key)
        return [], f"the backend plugin crashed: {type(exc).__name__}: {exc}"
    finally:
        if answer is not None:
            hook.gridgate_release(grant=answer)
    if result is None:
        return [], f"backend {endpoint.backend} cannot cancel"
    local = getattr(result, "local_fault", "") or ""
    if local and it is not None and failures is not None:
        failures.server_failed(
            endpoint,
            SubmitResult(
                endpoint=endpoint,
                ok=False,
                command=result.command,
                operation=result.operation or "Job Cancel",
                message=result.message,
                local_fault=local,
            ),
            it,
        )
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
