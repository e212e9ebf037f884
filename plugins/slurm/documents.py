"""The boundary of the Slurm commands' outputs: ``sbatch --parsable``, ``squeue -h -r -o
'%i %T %r'`` and ``scancel --verbose``, each read by one function here into typed values
(job ids that the next command would take, core's pilot states). Past these functions nothing
looks at the text again."""

from __future__ import annotations

import re

from gridgate.core.model import JobStatus

#: ``sbatch --parsable``: ``JOBID`` or ``JOBID;CLUSTER`` (the latter with ``--clusters``).
PARSABLE_RE = re.compile(r"([0-9]+)(?:;([A-Za-z0-9_.-]+))?")
#: Job ids as squeue and scancel take them: plain, array task ``<base>_<idx>``.
JOB_ID_RE = re.compile(r"[0-9]+(?:_[0-9]+)?")
#: What ``scancel --verbose`` prints for an id it did not cancel (exit 0 all the same): plain
#: scancel says nothing for a job already finished or unknown, verbose names each one.
KILL_ERROR_RE = re.compile(r"Kill job error on job id ([0-9]+(?:_[0-9]+)?): (.*)$", re.M)
#: Slurm's long job states (squeue %T) in core's pilot states; formats.md's Slurm section.
STATE_MAP: dict[str, str] = {
    **dict.fromkeys(
        ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"),
        "waiting",
    ),
    **dict.fromkeys(
        ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "SUSPENDED", "STOPPED"),
        "running",
    ),
    "COMPLETED": "done",
    **dict.fromkeys(
        (
            "FAILED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "BOOT_FAIL",
            "DEADLINE",
            "PREEMPTED",
            "SPECIAL_EXIT",
        ),
        "failed",
    ),
}


def pilot_state(native: str) -> str:
    """Core's state for a Slurm state text (``CANCELLED by 0`` and ``CANCELLED+`` included)."""
    text = native.strip().upper()
    if text.startswith("CANCELLED"):
        return "cancelled"
    return STATE_MAP.get(text.split()[0] if text else "", "unknown")


def refused_ids(stderr: str) -> dict[str, str]:
    """The ids ``scancel --verbose`` says it did not cancel (it exits 0 all the same), each
    with what it said."""
    return {job_id: why.strip() for job_id, why in KILL_ERROR_RE.findall(stderr)}


def parse_parsable(stdout: str) -> tuple[str, str] | None:
    """(job id, cluster) from ``sbatch --parsable`` output; None when there is no such line."""
    for line in stdout.splitlines():
        found = PARSABLE_RE.fullmatch(line.strip())
        if found:
            return found.group(1), found.group(2) or ""
    return None


def parse_squeue(stdout: str) -> dict[str, JobStatus]:
    """Read ``squeue -h -r -o '%i %T %r'`` lines (others, like ``CLUSTER: c2``, are skipped)."""
    statuses: dict[str, JobStatus] = {}
    for line in stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 2 or not JOB_ID_RE.fullmatch(parts[0]):
            continue
        reason = parts[2].strip() if len(parts) > 2 else ""
        statuses[parts[0]] = JobStatus(
            job_id=parts[0],
            state=pilot_state(parts[1]),  # type: ignore[arg-type]
            native=parts[1],
            reason="" if reason == "None" else reason,
        )
    return statuses
