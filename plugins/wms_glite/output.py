"""``gridgate_pilot_output`` of the gLite backend: a pilot's output sandbox, handed over by
``glite-wms-job-output`` and kept.

The WMS hands a job's output sandbox over once, after Done, and then clears the job (Cleared,
"user retrieved output sandbox"; a second retrieval is refused). So the first read of a pilot's
stdout, stderr or a file of its sandbox retrieves the whole sandbox into a private folder
beside the backend's state (``STATE_DIR/<backend>-output/<digest of the job id>``) and every
read after it reads that folder; a read of 0 bytes (``pilots show``) never retrieves. The
folder the client names is taken only inside the temporary folder it was given, and files are
read through :func:`gridgate.core.backend.file_output` (never through a link).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gridgate.core.backend import file_output
from gridgate.core.files import ensure_private_dir
from gridgate.core.model import Endpoint, OutputStream, PilotOutput
from gridgate.plugins.wms_glite.parse import client_messages

#: The line after which the client prints the folder it stored the sandbox in.
STORED = "have been successfully retrieved and stored in the directory:"


def kept_folder(backend: Any, job_id: str) -> Path:
    """Where the sandbox of ``job_id`` is kept once retrieved."""
    digest = hashlib.sha256(job_id.encode("utf-8")).hexdigest()[:32]
    return Path(backend.context.state_dir) / f"{backend.name}-output" / digest


def stored_folder(stdout: str) -> str | None:
    """The folder ``glite-wms-job-output`` says it stored the sandbox in, or None."""
    lines = stdout.splitlines()
    for index, line in enumerate(lines[:-1]):
        if line.strip() == STORED:
            return lines[index + 1].strip() or None
    return None


def pilot_output(
    backend: Any,
    endpoint: Endpoint,
    job_id: str,
    stream: OutputStream,
    name: str,
    size: int,
    from_end: bool,
    timeout: float,
) -> PilotOutput:
    settings = backend.settings
    file_name = {"stdout": settings.std_output, "stderr": settings.std_error}.get(stream, name)
    kept = kept_folder(backend, job_id)
    if not kept.is_dir():
        if size == 0:  # pilots show: retrieving would clear the job on the WMS
            return PilotOutput(
                job_id,
                stream,
                name=name,
                where=f"the output sandbox on {endpoint.name}",
                message="not retrieved yet: the WMS hands it over once, at the first read",
            )
        refused = _retrieve(backend, job_id, stream, name, kept, timeout)
        if refused is not None and not kept.is_dir():  # (another read may have kept it)
            return refused
    return file_output(job_id, stream, str(kept / file_name), size, from_end, name)


def _retrieve(
    backend: Any, job_id: str, stream: OutputStream, name: str, kept: Path, timeout: float
) -> PilotOutput | None:
    """Retrieve the sandbox of ``job_id`` into ``kept``; None when it is there, else why not."""
    ensure_private_dir(kept.parent)
    temporary = tempfile.mkdtemp(prefix=".retrieving-", dir=kept.parent)
    try:
        argv = [backend.commands()["output"], "--noint", "--dir", temporary]
        if backend.settings.config_file:
            argv += ["-c", backend.settings.config_file]
        outcome = backend.run([*argv, job_id], backend.deadline(timeout))
        if not outcome.ok:
            refusal = next(
                (
                    m
                    for m in client_messages(outcome.stderr)
                    if m.level == "error" and m.header.endswith("not allowed")
                ),
                None,
            )
            if refusal is not None:  # the WMS answered: nothing to hand over (now)
                said = " / ".join(refusal.text.splitlines())
                return PilotOutput(
                    job_id,
                    stream,
                    name=name,
                    held=False,
                    command=outcome,
                    message=f"the WMS hands no output sandbox over: {said}",
                )
            return PilotOutput(
                job_id, stream, name=name, ok=False, command=outcome, message=outcome.describe()
            )
        folder = stored_folder(outcome.stdout)
        inside = os.path.realpath(temporary) + os.sep
        if (
            folder is None
            or not os.path.realpath(folder).startswith(inside)
            or os.path.islink(folder)
            or not os.path.isdir(folder)
        ):
            return PilotOutput(
                job_id,
                stream,
                name=name,
                ok=False,
                command=outcome,
                message=f"no folder inside {temporary} in glite-wms-job-output's answer",
            )
        os.rename(folder, kept)
        return None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
