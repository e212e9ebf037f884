"""Reading one stream of a tracked pilot from its CE (``gridgate pilots output`` and ``show``):
one ``gridgate_pilot_output`` call under an admission grant of category ``query``, with the
credential of the pilot's demand group in force, the text cut at the cap and, with a tail,
trimmed to its last lines. The text is returned as the CE gave it: the command escapes it.
When the CE no longer holds the pilot, the copy ``director.pilots.keep_output`` kept of it
(:mod:`.kept_output`) is the answer, if there is one.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

from loguru import logger

from gridgate.core.backend import file_output
from gridgate.core.credential_names import CredentialChoice, credentials_in_force
from gridgate.core.documents import DocumentError, decode_json
from gridgate.core.engine.pilot_credentials import GroupCredentials, configured_kinds, names_for
from gridgate.core.engine.records import KeptOutputMeta
from gridgate.core.engine.runtime import Runtime
from gridgate.core.model import AdmissionRequest, Endpoint, OutputStream, PilotOutput, Refusal
from gridgate.core.state import Pilot

#: Where ``director.pilots.keep_output`` keeps pilots' output, under the director's state_dir,
#: and the file beside each pilot's streams that says whose they are.
KEPT_FOLDER = "pilot-output"
KEPT_META = "meta.json"
#: The default cap of ``gridgate pilots output``, in bytes.
DEFAULT_CAP = 1 << 20
#: The largest cap it takes.
MAX_CAP = 64 << 20


def file_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a file of a job's own folder; None when it can. A name is one
    path component: no ``/``, not ``.`` or ``..``, no NUL or control character."""
    if not name:
        return "the file name is empty"
    if "/" in name or "\\" in name:
        return f"{name!r} holds a slash: name a file of the job's own folder, not a path"
    if name == "." or ".." in name:
        return f"{name!r} is not a file name (no '.' and no '..')"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return f"{name!r} holds a control character"
    return None


def last_lines(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text`` (a final newline ends the last line, not a new
    one)."""
    if lines <= 0:
        return ""
    body = text[:-1] if text.endswith("\n") else text
    kept = body.split("\n")[-lines:]
    return "\n".join(kept) + ("\n" if text.endswith("\n") else "")


def read_output(
    runtime: Runtime,
    pilot: Pilot,
    stream: OutputStream,
    *,
    name: str = "",
    cap: int = DEFAULT_CAP,
    tail: int | None = None,
) -> PilotOutput:
    """Read ``stream`` of ``pilot`` through its backend's ``gridgate_pilot_output``.

    At most ``cap`` bytes are read: the stream's start, or with ``tail`` its end, of which the
    last ``tail`` lines are kept. ``cap`` 0 only asks where the stream is and whether it is
    still there. Every answer is a :class:`PilotOutput` (``ok`` False with a message when the
    backend is gone, cannot read, was refused by admission control or crashed).

    :raises ValueError: ``name`` is not one file name (:func:`file_name_problem`).
    """
    if stream == "file":
        problem = file_name_problem(name)
        if problem is not None:
            raise ValueError(problem)
    hook = runtime.pm.hook

    def failed(message: str) -> PilotOutput:
        return PilotOutput(pilot.job_id, stream, ok=False, name=name, message=message)

    info = hook.gridgate_backend_info(backend=pilot.backend)
    if info is None:
        return failed(f"backend {pilot.backend} is no longer configured")
    # an endpoint no longer in the config is still the backend's: asked by job id all the same
    endpoint = next((e for e in info.endpoints if e.name == pilot.endpoint), None) or Endpoint(
        pilot.backend, pilot.endpoint
    )
    timeout = float(info.command_timeout or runtime.config.director["command_timeout"])
    choice = CredentialChoice.from_config(runtime.config, configured_kinds(runtime))
    groups = GroupCredentials(runtime).of_backend(pilot.backend)
    credentials = names_for(choice, endpoint, info.credentials, groups)(pilot.group)
    answer = hook.gridgate_admit(
        request=AdmissionRequest(
            category="query", opcode="JOB_OUTPUT", size=1, endpoint=endpoint, user=runtime.user
        )
    )
    if isinstance(answer, Refusal):
        return failed(f"refused by admission control: {answer.reason}")
    try:
        with credentials_in_force(credentials):
            result = hook.gridgate_pilot_output(
                endpoint=endpoint,
                job_id=pilot.job_id,
                stream=stream,
                name=name if stream == "file" else "",
                size=cap,
                from_end=tail is not None,
                timeout=timeout,
            )
    except Exception as exc:  # a plugin bug is this command's error, not a traceback
        logger.opt(exception=exc).error("reading {}'s output crashed in a plugin", pilot.job_id)
        return failed(f"the backend plugin crashed: {type(exc).__name__}: {exc}")
    finally:
        if answer is not None:
            hook.gridgate_release(grant=answer)
    if result is None:
        return failed(f"backend {pilot.backend} cannot read a pilot's {stream}")
    if not isinstance(result, PilotOutput):
        return failed(f"backend {pilot.backend} answered {type(result).__name__}, not output")
    if not result.held and stream != "file":  # what director.pilots.keep_output kept of it
        state_dir = Path(runtime.settings.state_dir)
        result = kept_output(state_dir, pilot, stream, cap, tail is not None) or result
    if len(result.text.encode("utf-8", "replace")) > cap:
        # a backend that read more than asked: the cap holds all the same
        data = result.text.encode("utf-8", "replace")
        data = data[-cap:] if tail is not None else data[:cap]
        result = replace(result, text=data.decode("utf-8", "replace"), cut=True)
    if tail is not None:
        text = result.text
        if result.cut and "\n" in text[:-1]:  # the end of a longer stream: drop its broken line
            text = text[text.index("\n") + 1 :]
        result = replace(result, text=last_lines(text, tail))
    return result


def pilot_folder(state_dir: Path, pilot: Pilot) -> Path:
    """Where ``director.pilots.keep_output`` keeps ``pilot``'s output (kept or not)."""
    digest = hashlib.sha256(pilot.job_id.encode("utf-8")).hexdigest()[:32]
    endpoint = quote(pilot.endpoint, safe="") or "_"
    return state_dir / KEPT_FOLDER / quote(pilot.backend, safe="") / endpoint / digest


def kept_output(
    state_dir: Path, pilot: Pilot, stream: OutputStream, size: int, from_end: bool
) -> PilotOutput | None:
    """``stream`` of ``pilot`` as the director kept it (at most ``size`` bytes, the end with
    ``from_end``); None when it kept none."""
    folder = pilot_folder(state_dir, pilot)
    try:
        data = (folder / KEPT_META).read_bytes()
        meta: KeptOutputMeta = decode_json(data, KeptOutputMeta, kind=str(folder / KEPT_META))
    except (OSError, DocumentError):
        return None
    if meta.job_id != pilot.job_id or not (folder / stream).is_file():
        return None
    kept = file_output(pilot.job_id, stream, str(folder / stream), size, from_end)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(meta.kept))
    cut = " (cut when kept)" if meta.cut.get(stream) else ""
    where = meta.where.get(stream) or "the CE"
    message = f"kept by the director on {when} from {where}{cut}; the CE no longer holds it"
    return replace(kept, message=message)
