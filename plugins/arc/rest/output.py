"""A pilot's output read from its job's session folder over A-REX's REST interface
(``GET jobs/ID/session/FILE``): its stdout and stderr by the names its description gave them
(``pilot.out``, ``pilot.err``), or another file of the session. A 404 is told apart by one
``status`` of the job: the CE no longer holds the job, or the job holds no such file.
"""

from __future__ import annotations

from gridgate.core.backend import Deadline
from gridgate.core.model import OutputStream, PilotOutput
from gridgate.plugins.arc.parse import STDERR, STDOUT
from gridgate.plugins.arc.rest.client import ArexClient, ArexError
from gridgate.plugins.arc.rest.jobs import ce_id

__all__ = ["SESSION_NAMES", "session_output"]

#: The session file of each stream, as the pilot's description names it.
SESSION_NAMES: dict[str, str] = {"stdout": STDOUT, "stderr": STDERR}


def session_output(
    client: ArexClient,
    job_id: str,
    stream: OutputStream,
    name: str,
    size: int,
    from_end: bool,
    deadline: Deadline,
) -> PilotOutput:
    """At most ``size`` bytes of ``stream`` of pilot ``job_id`` (``name`` for a ``file``: the
    caller has refused a name with a slash or ``..``) from its session folder on the CE."""
    identifier = ce_id(job_id)
    file = name if stream == "file" else SESSION_NAMES[stream]
    label = name if stream == "file" else ""
    try:
        where = client.session_url(identifier, file, deadline)
        found = client.file_part(identifier, file, size, from_end, deadline)
        if found is None:
            (entry,), _ = client.manage("status", [identifier], deadline)
    except ArexError as exc:
        return PilotOutput(
            job_id, stream, ok=False, name=label, command=exc.command, message=str(exc)
        )
    if found is None:
        message = (
            f"the CE no longer holds job {identifier}"
            if entry.code == 404
            else f"job {identifier} ({entry.state or entry.reason}) holds no {file} in its session"
        )
        return PilotOutput(job_id, stream, held=False, where=where, name=label, message=message)
    data, total = found
    return PilotOutput(
        job_id,
        stream,
        where=where,
        text=data.decode("utf-8", "replace"),
        cut=total > len(data),
        size=total,
        from_end=from_end,
        name=label,
    )
