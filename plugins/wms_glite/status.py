"""Pilot tracking on gLite WMS: ``glite-wms-job-status`` in bulk and ``glite-wms-job-cancel``.

One status command per endpoint and poll up to ``max_output_bytes // STATUS_BYTES_PER_JOB`` ids
(8,192 at the default 4 MiB), more commands past that so that each output fits gridgate's cap:
the ids go into a private file under the backend's own folder (never the system's temporary
folder) passed as ``--noint -i FILE`` (one id per line, as the client reads it), at verbosity 1,
the level that prints the status reason and the exit code. A file that cannot be written, and
an output cut by the cap, are faults of this machine (``local_fault``), not of the server. The parsers take any
text and never raise; they accept both spellings of the client (gLite 3.x ``Done (Success)``
with trailing spaces after other states, EMI ``Done(Success)``), parametric parents with their
indented children, and the ids the bookkeeping server no longer knows
(``Unable to retrieve the status for: <id>``, on stdout for EMI, on stderr for gLite 3.x).

Exit codes of the status command: 0 every id answered; 255 some answered and some not; 1 none
answered (or a bad option). An exit 1 whose every id is one the server says it never knew or
already purged is still an answer (none of them is known any more); any other exit 1 is a
failed query.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from gridgate.core.documents import convert
from gridgate.core.model import CancelResult, CommandResult, Endpoint, JobStatus, StatusResult

__all__ = [
    "JobBlock",
    "StatusOutput",
    "CancelOutput",
    "parse_status",
    "parse_cancel",
    "normalise",
    "status_result",
    "cancel_result",
    "write_id_file",
    "OPERATION_STATUS",
    "OPERATION_CANCEL",
]

OPERATION_STATUS = "Job Status"
OPERATION_CANCEL = "Job Cancel"
#: The verbosity that adds the reason, destination and exit code to id and state.
VERBOSITY = "1"

_ID = r"https://[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?:9000/[A-Za-z0-9_-]+"
_ID_LINE_RE = re.compile(rf"^(?P<indent>\s*)Status info for the Job\s*:\s*(?P<id>{_ID})\s*$")
_FIELD_RE = re.compile(
    r"^\s*(?P<label>Current Status|Exit code|Status Reason|Destination|Submitted|Parent Job|"
    r"Node Name)\s*:\s?(?P<value>.*)$"
)
_LOGGED_RE = re.compile(r"^\s*Logged Reason\(s\)\s*:\s*$")
_LOGGED_ITEM_RE = re.compile(r"^\s+-\s?(?P<reason>.*)$")
_NODES_RE = re.compile(r"^\s*-\s*Nodes information")
_RULE_RE = re.compile(r"^\s*=+(?:\s.*\s=+)?\s*$")
_DONE_RE = re.compile(r"^Done\s*\((?P<code>.*)\)$")
_UNRETRIEVABLE_RE = re.compile(rf"Unable to retrieve the status for:\s*(?P<id>{_ID})")
#: What the bookkeeping server says of an id it never knew (ENOENT) or already purged (EIDRM).
GONE_RE = re.compile(
    r"no matching jobs found|matching job already purged|Identifier removed|"
    r"No such file or directory",
    re.I,
)
_LOG_FILE_RE = re.compile(r"\*\*\* Log file created \*\*\*", re.I)

#: Native state (first word) -> core state; ``Done`` is decided with its suffix.
STATES: Mapping[str, str] = {
    "submitted": "waiting",
    "waiting": "waiting",
    "ready": "waiting",
    "scheduled": "waiting",
    "running": "running",
    "cleared": "done",
    "aborted": "failed",
    "cancelled": "cancelled",
    "unknown": "unknown",
}
#: States after which the job is gone from the server's point of view.
GONE_STATES = frozenset({"purged"})
#: Native states a cancel request is refused in because the job has already finished.
FINISHED = re.compile(r"^\s*(Done|Aborted|Cancelled|Cleared|Purged)\b", re.I)


@dataclass(frozen=True)
class JobBlock:
    """One ``Status info for the Job`` block as printed: the state text stripped of the
    client's trailing spaces, and ``parent`` the id of the parametric job it is a node of."""

    job_id: str
    native: str = ""
    reason: str = ""
    exit_code: int | None = None
    destination: str = ""
    submitted: str = ""
    logged_reasons: tuple[str, ...] = ()
    parent: str | None = None


@dataclass(frozen=True)
class StatusOutput:
    """What one status command printed: ``blocks`` by id, ``children`` parent -> node ids,
    ``unretrievable`` id -> the bookkeeping server's message."""

    blocks: Mapping[str, JobBlock] = field(default_factory=dict)
    children: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unretrievable: Mapping[str, str] = field(default_factory=dict)


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if re.fullmatch(r"-?[0-9]{1,9}", text) else None


def parse_status(stdout: str, stderr: str = "") -> StatusOutput:
    """Read ``glite-wms-job-status`` output at verbosity 0 or 1 (2 and 3 add lines this
    reads past). Never raises."""
    if not isinstance(stdout, str):
        stdout = ""
    if not isinstance(stderr, str):
        stderr = ""
    blocks: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    stack: list[tuple[int, str]] = []  # (indent, id) of the blocks we are inside
    in_nodes = False
    current: dict[str, Any] | None = None
    logged: list[str] | None = None
    for raw in stdout.splitlines():
        if _LOG_FILE_RE.search(raw):
            break
        line = raw.rstrip("\r")
        found = _ID_LINE_RE.match(line)
        if found:
            indent = len(found.group("indent").expandtabs(4))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack and in_nodes else None
            if indent == 0:
                in_nodes = False  # a new top-level job: its nodes, if any, follow a new line
            job_id = found.group("id")
            current = {"job_id": job_id, "parent": parent, "logged": []}
            if job_id not in blocks:
                order.append(job_id)
            blocks[job_id] = current
            stack.append((indent, job_id))
            logged = None
            continue
        if _NODES_RE.match(line):
            in_nodes = True
            current, logged = None, None
            continue
        if current is None:
            continue
        if _RULE_RE.match(line) and "=" in line:
            current, logged = None, None
            continue
        if _LOGGED_RE.match(line):
            logged = current["logged"]
            continue
        field_match = _FIELD_RE.match(line)
        if field_match:
            logged = None
            current.setdefault(field_match.group("label"), field_match.group("value").strip())
            continue
        item = _LOGGED_ITEM_RE.match(line)
        if logged is not None and item:
            logged.append(item.group("reason").strip())
    out: dict[str, JobBlock] = {}
    children: dict[str, list[str]] = {}
    for job_id in order:
        if "Current Status" not in blocks[job_id]:
            continue  # an id line cut short: nothing known about it
        data: _Block = convert(blocks[job_id], _Block, kind="glite-wms-job-status block")
        out[job_id] = JobBlock(
            job_id=job_id,
            native=data.current,
            reason=data.reason,
            exit_code=_int(data.exit_code),
            destination=data.destination,
            submitted=data.submitted,
            logged_reasons=tuple(data.logged),
            parent=data.parent,
        )
        if data.parent:
            children.setdefault(data.parent, []).append(job_id)
    return StatusOutput(
        out, {k: tuple(v) for k, v in children.items()}, _unretrievable(f"{stdout}\n{stderr}")
    )


class _Block(msgspec.Struct):
    """One job's block as :func:`parse_status` gathers it: the labelled lines it reads (the
    others are left out), the reasons logged, and the collection it is a node of."""

    current: str = msgspec.field(name="Current Status")
    logged: list[str] = msgspec.field(default_factory=list)
    parent: str | None = None
    reason: str = msgspec.field(default="", name="Status Reason")
    exit_code: str = msgspec.field(default="", name="Exit code")
    destination: str = msgspec.field(default="", name="Destination")
    submitted: str = msgspec.field(default="", name="Submitted")


def _unretrievable(text: str) -> dict[str, str]:
    """Ids the client could not get a status for, each with the message on the next line."""
    lines = text.splitlines()
    found: dict[str, str] = {}
    for index, line in enumerate(lines):
        match = _UNRETRIEVABLE_RE.search(line)
        if not match:
            continue
        message = next(
            (
                ln.strip()
                for ln in lines[index + 1 : index + 3]
                if ln.strip() and not _UNRETRIEVABLE_RE.search(ln)
            ),
            "",
        )
        found.setdefault(match.group("id"), message)
    return found


def normalise(native: str, exit_code: int | None = None) -> str | None:
    """Core's state for a native state text; None for one the server no longer knows
    (``Purged``). ``Done (Success)``, ``Done(Success)`` and a bare ``Done`` with exit 0 are
    done; every other Done is failed (formats.md, "What the states mean")."""
    text = (native or "").strip()
    done = _DONE_RE.match(text)
    if done:
        return "done" if done.group("code").strip().lower() == "success" else "failed"
    word = text.split(None, 1)[0].lower() if text else ""
    if word == "done":
        return "done" if exit_code in (None, 0) else "failed"
    if word in GONE_STATES:
        return None
    return STATES.get(word, "unknown")


def job_status(block: JobBlock) -> JobStatus | None:
    state = normalise(block.native, block.exit_code)
    if state is None:
        return None
    reason = block.reason or (block.logged_reasons[-1] if block.logged_reasons else "")
    return JobStatus(
        block.job_id,
        state,  # type: ignore[arg-type]
        native=block.native,
        reason=reason,
        exit_code=block.exit_code,
    )


def status_result(endpoint: Endpoint, asked: Sequence[str], command: CommandResult) -> StatusResult:
    """The :class:`StatusResult` of one bulk status command for the ids ``asked``."""

    def failed(message: str) -> StatusResult:
        return StatusResult(
            endpoint, ok=False, command=command, operation=OPERATION_STATUS, message=message
        )

    if command.launch_error is not None or command.timed_out:
        return failed(command.describe())
    if command.stdout_truncated:
        # The ids past the cut would look unknown (and become lost): no answer is safer, and
        # the cut is gridgate's, not the server's (query_pilots splits so that it seldom is).
        message = cap_message(len(command.stdout.encode()), len(asked))
        return StatusResult(
            endpoint,
            ok=False,
            command=command,
            operation=OPERATION_STATUS,
            message=message,
            local_fault=message,
        )
    parsed = parse_status(command.stdout, command.stderr)
    statuses = {}
    for job_id, block in parsed.blocks.items():
        status = job_status(block)
        if status is not None:
            statuses[job_id] = status
    asked_set = set(asked)
    answered = asked_set & set(parsed.blocks)
    gone = {j for j, msg in parsed.unretrievable.items() if j in asked_set and GONE_RE.search(msg)}
    if command.returncode == 0:
        if asked_set and not answered:
            return failed("exit 0 but no status block for any job")
    elif command.returncode == 255:
        if not answered:
            return failed("exit code 255 without any status block")
    elif command.returncode == 1:
        # Nothing answered: an answer only when the server said it knows none of them.
        if not asked_set or gone != asked_set:
            reasons = sorted(set(parsed.unretrievable.values())) or [_last_line(command)]
            return failed(f"exit code 1: {'; '.join(r for r in reasons if r)[:300]}")
    else:
        return failed(command.describe())
    return StatusResult(
        endpoint, ok=True, statuses=statuses, command=command, operation=OPERATION_STATUS
    )


def _last_line(command: CommandResult) -> str:
    for text in (command.stderr, command.stdout):
        for line in reversed((text or "").splitlines()):
            if line.strip():
                return line.strip()
    return "no output"


# --- cancel -------------------------------------------------------------------------------------

_CANCEL_BANNER_RE = re.compile(r"=+ glite-wms-job-cancel Success =+")
_CANCELLED_RE = re.compile(rf"^\s*-\s*(?P<id>{_ID})\s*$")
_NOT_ALLOWED_RE = re.compile(rf"Cancel not allowed(?:\s*:\s*(?P<id>{_ID}))?")
_CURRENT_RE = re.compile(r"Current Job Status is\s+(?P<state>.+?)\s*$")


@dataclass(frozen=True)
class CancelOutput:
    """``cancelled`` ids listed after the success banner; ``finished`` ids the client refused
    to cancel because they have already finished (Done, Aborted, Cancelled, Cleared)."""

    cancelled: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()


def parse_cancel(stdout: str, stderr: str = "", asked: Sequence[str] = ()) -> CancelOutput:
    """Read ``glite-wms-job-cancel --noint`` output. A ``Cancel not allowed`` error that names
    no id (the single-id form) belongs to the one id asked. Never raises."""
    stdout = stdout if isinstance(stdout, str) else ""
    stderr = stderr if isinstance(stderr, str) else ""
    cancelled: list[str] = []
    if _CANCEL_BANNER_RE.search(stdout):
        after = stdout[_CANCEL_BANNER_RE.search(stdout).end() :]  # type: ignore[union-attr]
        cancelled = [m.group("id") for m in map(_CANCELLED_RE.match, after.splitlines()) if m]
    finished: list[str] = []
    lines = f"{stderr}\n{stdout}".splitlines()
    for index, line in enumerate(lines):
        refused = _NOT_ALLOWED_RE.search(line)
        if not refused:
            continue
        job_id = refused.group("id") or (asked[0] if len(asked) == 1 else None)
        state = next(
            (m.group("state") for m in map(_CURRENT_RE.search, lines[index : index + 3]) if m), ""
        )
        if job_id and FINISHED.match(state) and not state.lower().startswith("done(failed"):
            finished.append(job_id)
    return CancelOutput(tuple(dict.fromkeys(cancelled)), tuple(dict.fromkeys(finished)))


def cancel_result(endpoint: Endpoint, asked: Sequence[str], command: CommandResult) -> CancelResult:
    """The :class:`CancelResult` of one cancel command: ok when it exited 0, or when every id
    it did not cancel had already finished. Only the ids it cancelled are ``cancelled``: one
    refused because it had finished is left out (its next poll records how it ended)."""
    parsed = parse_cancel(command.stdout, command.stderr, asked)
    cancelled = tuple(j for j in parsed.cancelled if j in set(asked))
    finished = [j for j in parsed.finished if j in set(asked) and j not in set(cancelled)]
    answered = set(cancelled) | set(finished)
    ok = command.ok or (command.returncode == 1 and bool(asked) and answered == set(asked))
    message = "" if ok else command.describe() + f": {_last_line(command)}"[:300]
    if ok and finished:
        message = f"not cancelled: {len(finished)} had already finished"
    return CancelResult(
        endpoint,
        ok=ok,
        cancelled=cancelled,
        command=command,
        operation=OPERATION_CANCEL,
        message=message,
    )


# --- running the commands ------------------------------------------------------------------------

#: A generous size of one id's block at verbosity 1 (about 350 bytes as printed): a poll asks at
#: most ``max_output_bytes // STATUS_BYTES_PER_JOB`` ids per command, so that its output fits.
STATUS_BYTES_PER_JOB = 512
#: How often a cut output may halve its id list before the poll gives up (2**12 = 4096 times
#: smaller: only a parametric job with thousands of nodes per id gets that far).
MAX_HALVINGS = 12


def cap_message(max_output: int, ids: int) -> str:
    """What a cut output is: gridgate's own cap, not anything the server did."""
    return (
        f"the status output for {ids} id(s) passed gridgate's own output cap "
        f"(director.max_output_bytes = {max_output}) and was cut by gridgate, not by the "
        "server; raise director.max_output_bytes"
    )


#: Id files are named ``gridgate-ids-<pid>-<random>.txt``: the pid says whose they are, so the
#: files of a director killed with a poll in flight can be told from those of a running one.
IDS_NAME_RE = re.compile(r"gridgate-ids-(\d+)-[^/]*\.txt")


def ids_folder(backend: Any) -> tuple[Path, bool]:
    """Where id files go: the backend's private folder under the state folder (the JDL folder,
    ``<state_dir>/<name>-jdl``), or its configured ``work_dir``; and whether gridgate owns it
    (then it is created 0700). The first time, the id files of killed directors go."""
    configured = backend.config.get("work_dir")
    folder = backend.jdl_dir()
    if getattr(backend, "_ids_swept", None) != folder:
        remove_leftover_id_files(folder)
        backend._ids_swept = folder
    return folder, not configured


def remove_leftover_id_files(folder: Path) -> list[Path]:
    """Remove the id files of directors that are no longer running; those of a live process
    (this one included) are left to it. Returns what went."""
    removed: list[Path] = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed  # no folder yet, or unreadable: the write will say so
    for entry in entries:
        found = IDS_NAME_RE.fullmatch(entry.name)
        if found is None or process_alive(int(found.group(1))):
            continue
        try:
            entry.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed


def run_with_ids(
    argv: Sequence[str],
    job_ids: Sequence[str],
    timeout: float,
    *,
    env: Mapping[str, str] | None,
    max_output: int,
    work_dir: str | os.PathLike[str],
    private: bool = False,
) -> CommandResult | str:
    """Run ``argv + ["-i", FILE]`` with the ids in a private file in ``work_dir`` (created
    0700 when ``private``); a str says why nothing was run: this machine could not write the
    file (the folder and the OS error), a local fault."""
    from gridgate.core.files import ensure_private_dir
    from gridgate.core.runner import run

    try:
        if private:
            ensure_private_dir(Path(work_dir))
        path = write_id_file(job_ids, work_dir)
    except OSError as exc:
        why = f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)
        return f"cannot write the job id file in {work_dir}: {why}"
    try:
        return run([*argv, "-i", path], timeout, env=env, max_output=max_output)
    finally:
        Path(path).unlink(missing_ok=True)


# --- the id file ----------------------------------------------------------------------------------


def write_id_file(job_ids: Iterable[str], work_dir: str | os.PathLike[str]) -> str:
    """Write the ids one per line into a new private (0600) file in ``work_dir`` (never the
    system's temporary folder); the caller removes it.

    :raises OSError: the file cannot be created or written.
    """
    fd, path = tempfile.mkstemp(
        prefix=f"gridgate-ids-{os.getpid()}-", suffix=".txt", dir=os.fspath(work_dir)
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write("".join(f"{job_id}\n" for job_id in job_ids))
    except OSError:
        Path(path).unlink(missing_ok=True)
        raise
    return path


# --- the backend's hooks ----------------------------------------------------------------------------

#: The tracking commands and their names; the gLite UI installs them beside the submit command.
TRACKING_COMMANDS = {
    "status": "glite-wms-job-status",
    "cancel": "glite-wms-job-cancel",
    "output": "glite-wms-job-output",
}


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` is alive (another user's counts as alive): files named after a
    director's pid are its own until it is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def sibling_commands(submit: str, configured: Mapping[str, str]) -> dict[str, str]:
    """The tracking commands not configured: beside ``submit`` when it is a path (a UI in
    ``$GLITE_LOCATION/bin``), else their names, looked up on PATH."""
    folder = os.path.dirname(submit)
    return {
        key: configured.get(key) or (os.path.join(folder, name) if folder else name)
        for key, name in TRACKING_COMMANDS.items()
    }


def _base_argv(backend: Any, which: str) -> list[str]:
    argv = [backend.commands()[which], "--noint"]
    if which == "status":
        argv += ["-v", VERBOSITY]
    if backend.config.get("config_file"):
        argv += ["-c", backend.config["config_file"]]
    return argv


def query_pilots(
    backend: Any, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
) -> StatusResult:
    """``gridgate_job_status`` of the gLite backend: the ids split so that each command's
    output fits ``max_output_bytes`` (one command up to ``max_output_bytes //
    STATUS_BYTES_PER_JOB`` ids); an output cut all the same is asked again in halves. A cut
    that no split can avoid is gridgate's cap (a local fault), never the server's failure."""

    ids = list(dict.fromkeys(str(j) for j in job_ids))
    if not ids:
        return StatusResult(endpoint, ok=True, commands=0, operation=OPERATION_STATUS)
    max_output = int(backend.context.max_output_bytes)
    per_command = max(1, max_output // STATUS_BYTES_PER_JOB)
    pending = [(ids[i : i + per_command], 0) for i in range(0, len(ids), per_command)]
    folder, private = ids_folder(backend)
    deadline = backend.deadline(timeout)
    statuses: dict[str, JobStatus] = {}
    commands = 0
    last: CommandResult | None = None
    while pending:
        chunk, halvings = pending.pop(0)
        outcome = run_with_ids(
            _base_argv(backend, "status"),
            chunk,
            deadline.left(),
            env=backend.environment(),
            max_output=max_output,
            work_dir=folder,
            private=private,
        )
        if isinstance(outcome, str):
            return StatusResult(
                endpoint,
                ok=False,
                commands=commands,
                command=last,
                operation=OPERATION_STATUS,
                message=outcome,
                local_fault=outcome,
            )
        commands += 1
        last = outcome
        if outcome.stdout_truncated and not outcome.timed_out and outcome.launch_error is None:
            if len(chunk) > 1 and halvings < MAX_HALVINGS:
                half = (len(chunk) + 1) // 2
                pending[:0] = [(chunk[:half], halvings + 1), (chunk[half:], halvings + 1)]
                continue
            message = cap_message(max_output, len(chunk))
            return StatusResult(
                endpoint,
                ok=False,
                commands=commands,
                command=outcome,
                operation=OPERATION_STATUS,
                message=message,
                local_fault=message,
            )
        part = status_result(endpoint, chunk, outcome)
        if not part.ok:
            return replace(part, commands=commands)
        statuses.update(part.statuses)
    return StatusResult(
        endpoint,
        ok=True,
        statuses=statuses,
        command=last,
        commands=commands,
        operation=OPERATION_STATUS,
    )


def cancel_pilots(
    backend: Any, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
) -> CancelResult:
    """``gridgate_cancel`` of the gLite backend: ``glite-wms-job-cancel --noint -i FILE``."""
    ids = list(dict.fromkeys(str(j) for j in job_ids))
    if not ids:
        return CancelResult(endpoint, ok=True, operation=OPERATION_CANCEL)
    folder, private = ids_folder(backend)
    outcome = run_with_ids(
        _base_argv(backend, "cancel"),
        ids,
        backend.deadline(timeout).left(),
        env=backend.environment(),
        max_output=backend.context.max_output_bytes,
        work_dir=folder,
        private=private,
    )
    if isinstance(outcome, str):
        return CancelResult(
            endpoint, ok=False, operation=OPERATION_CANCEL, message=outcome, local_fault=outcome
        )
    return cancel_result(endpoint, ids, outcome)
