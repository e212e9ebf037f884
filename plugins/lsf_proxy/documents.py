"""The client side's boundary: every document from outside that the LSF backend, the token
client and ``import-lsf`` read is decoded here, once, into typed values.

Three kinds come in: what LSF's commands print (``bsub``'s job id, ``bjobs`` in its custom
and classic forms, ``bkill``'s per-id lines; formats.md quotes them), the token daemon's
replies (docs/protocol.md), and a site's ``lsf.conf``/``lsb.params``. A row or reply is
checked through :mod:`gridgate.core.documents` (msgspec), so a bad one is a
:class:`~gridgate.core.documents.DocumentError` here and nothing downstream checks a shape
again. The gate's run-time path does not come here: it reads its replies with the standard
library alone (:mod:`.client.gateclient`, which must not pay for msgspec).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from gridgate.core.documents import DocumentError, convert, decode_json

__all__ = [
    "BypassStatus",
    "bypass_status",
    "envelope",
    "LsfConfError",
    "Param",
    "lsf_params",
    "positive",
    "BJOBS_STATES",
    "JOB_ID",
    "KillOutput",
    "NamedRow",
    "Row",
    "bjobs_not_found",
    "bjobs_states",
    "bkill_output",
    "bsub_job_id",
    "named_rows",
    "named_status_rows",
    "status_rows",
]

# --- LSF's commands ------------------------------------------------------------------------------

#: An LSF job id, or one element of a job array (``1234[5]``).
JOB_ID = r"[0-9]+(?:\[[0-9]+\])?"
JOB_ID_RE = re.compile(JOB_ID)
#: The production regex (formats.md): searched, not anchored, since banners may come first.
BSUB_JOB_ID_RE = re.compile(r"Job <([0-9]+)> is submitted to .*queue")
NOT_FOUND_RE = re.compile(rf"Job <({JOB_ID})> is not found")
_TERMINATED_RE = re.compile(rf"Job <({JOB_ID})> is being terminated")
_FINISHED_RE = re.compile(rf"Job <({JOB_ID})>: Job has already finished")
_NO_MATCH_RE = re.compile(rf"Job <({JOB_ID})>: No matching job found|Job <({JOB_ID})> is not found")

Stat = Literal[
    "PEND", "PROV", "PSUSP", "WAIT", "RUN", "USUSP", "SSUSP", "DONE", "EXIT", "UNKWN", "ZOMBI"
]
#: The STAT values the backend's own ``bjobs -o "jobid stat exec_host"`` query takes (it has
#: never counted PROV, a job whose host is still being provisioned).
BJOBS_STATES = ("PEND", "PSUSP", "RUN", "USUSP", "SSUSP", "DONE", "EXIT", "UNKWN", "WAIT", "ZOMBI")
_PENDING = ("PEND", "PSUSP", "WAIT")


class Row(msgspec.Struct, frozen=True):
    """One job as ``bjobs`` printed it."""

    job_id: Annotated[str, msgspec.Meta(pattern=rf"^{JOB_ID}\Z")]
    stat: Stat
    exec_host: str = ""
    exit_code: Annotated[int, msgspec.Meta(ge=0, le=99999)] | None = None
    reason: str = ""


def bsub_job_id(text: str) -> str | None:
    """The job id in ``bsub`` output, wherever its line is (None: no such line)."""
    match = BSUB_JOB_ID_RE.search(text)
    return match.group(1) if match else None


def bjobs_not_found(stderr: str) -> tuple[str, ...]:
    """The ids ``bjobs`` says it does not know (``Job <N> is not found``)."""
    return tuple(NOT_FOUND_RE.findall(stderr if isinstance(stderr, str) else ""))


def bjobs_states(
    stdout: str, stderr: str = ""
) -> tuple[dict[str, tuple[str, str]], tuple[str, ...]]:
    """``bjobs -noheader -o "jobid stat exec_host delimiter='^'"``: id -> (STAT, EXEC_HOST)
    of each good row (others are skipped), and the ids LSF does not know."""
    states: dict[str, tuple[str, str]] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("^")
        if len(parts) == 3 and parts[0].isdigit() and parts[1] in BJOBS_STATES:
            states[parts[0]] = (parts[1], parts[2])
    return states, bjobs_not_found(stderr)


def _value(text: str) -> str:
    text = text.strip()
    return "" if text == "-" else text


def _row(candidate: Mapping[str, object]) -> Row | None:
    try:
        return convert(candidate, Row, kind="bjobs row")
    except DocumentError:
        return None  # a banner, a header or junk between the rows


def _row_custom(line: str) -> Row | None:
    # jobid^stat^exec_host^exit_code^exit_reason: the reason may itself hold a '^'
    parts = line.strip().split("^", 4)
    if len(parts) < 2:
        return None
    parts += [""] * (5 - len(parts))
    code = _value(parts[3])
    return _row(
        {
            "job_id": parts[0],
            "stat": parts[1],
            "exec_host": _value(parts[2]),
            "exit_code": int(code) if re.fullmatch(r"[0-9]{1,5}", code) else None,
            "reason": _value(parts[4]),
        }
    )


def _row_table(line: str) -> Row | None:
    # ``bjobs -aw`` (wide: no column is cut, so none has a fixed width; LSF separates them by
    # blanks): JOBID USER STAT QUEUE FROM_HOST EXEC_HOST JOB_NAME SUBMIT_TIME. The first
    # three are never blank; EXEC_HOST may be '-' or blank for pending jobs.
    words = line.split()
    if len(words) < 3:
        return None
    exec_host = _value(words[5]) if len(words) >= 9 and words[2] not in _PENDING else ""
    return _row({"job_id": words[0], "stat": words[2], "exec_host": exec_host})


#: A live state wins over a finished one when an array shows several rows under one id.
_RANK: Mapping[str, int] = {
    **dict.fromkeys(("RUN", "USUSP", "SSUSP"), 0),
    **dict.fromkeys(("PEND", "PROV", "PSUSP", "WAIT"), 1),
    **dict.fromkeys(("UNKWN", "ZOMBI"), 2),
    "DONE": 3,
    "EXIT": 4,
}


def status_rows(stdout: str, table: bool = False) -> dict[str, Row]:
    """Rows by id of either ``bjobs`` output (custom ``-o`` or the classic ``-aw`` table);
    junk lines and the header are skipped. An id with several rows (a job array) keeps its
    liveliest one. Never raises."""
    rows: dict[str, Row] = {}
    parse = _row_table if table else _row_custom
    for line in (stdout if isinstance(stdout, str) else "").splitlines():
        row = parse(line)
        if row is None:
            continue
        known = rows.get(row.job_id)
        if known is None or _RANK[row.stat] < _RANK[known.stat]:
            rows[row.job_id] = row
    return rows


#: ``[k]`` ending an array element's job name: LSF names element k of ``NAME[1-N]`` ``NAME[k]``
#: and prints the array's id as the element's JOBID, so the name is where the index is.
_ELEMENT_RE = re.compile(r"\[([0-9]+)\]\Z")
#: What ``bjobs`` prints when nothing matches (with ``-a``, or without it).
NO_JOB_RE = re.compile(r"^No (?:unfinished )?job found\s*$", re.MULTILINE)


@dataclass(frozen=True)
class NamedRow:
    """One job of a listing that shows job names: ``name`` without an array element's
    ``[k]``, and its row, whose ``job_id`` is then the element's (``1234[k]``)."""

    name: str
    row: Row


def _named(job_id: str, name: str, row: Row | None) -> NamedRow | None:
    if row is None:
        return None
    element = _ELEMENT_RE.search(name)
    if element is None or not job_id.isdigit():
        return NamedRow(name, row)
    return NamedRow(
        name[: element.start()], msgspec.structs.replace(row, job_id=f"{job_id}[{element[1]}]")
    )


def _named_custom(line: str) -> NamedRow | None:
    # jobid^job_name^stat^exec_host^exit_code^exit_reason (the reason may hold a '^')
    parts = line.strip().split("^", 2)
    if len(parts) < 3:
        return None
    job_id, name = parts[0], parts[1]
    return _named(job_id, name, _row_custom(f"{job_id}^{parts[2]}"))


def _named_table(line: str) -> NamedRow | None:
    # JOBID USER STAT QUEUE FROM_HOST [EXEC_HOST] JOB_NAME SUBMIT_TIME (3 words): the name is
    # the fourth word from the end whether or not EXEC_HOST is blank
    words = line.split()
    if len(words) < 9:
        return None
    return _named(words[0], words[-4], _row_table(line))


def named_rows(stdout: str, table: bool = False) -> list[NamedRow]:
    """Every job row of ``bjobs -o "jobid job_name stat exec_host exit_code exit_reason
    delimiter='^'"`` (or of the classic ``-aw`` table) with its job name, an array's
    elements each on their own (``1234[k]``); junk lines and the header are skipped.
    Never raises."""
    parse = _named_table if table else _named_custom
    rows = []
    for line in (stdout if isinstance(stdout, str) else "").splitlines():
        named = parse(line)
        if named is not None:
            rows.append(named)
    return rows


def named_status_rows(stdout: str, table: bool = False) -> dict[str, Row]:
    """Rows by id of a listing with job names (:func:`named_rows`): an array element under
    its own id (``1234[k]``), and every id (an array's too) with its liveliest row, as
    :func:`status_rows` gives it. Never raises."""
    rows: dict[str, Row] = {}
    for named in named_rows(stdout, table):
        row = named.row
        rows[row.job_id] = row
        base = row.job_id.split("[")[0]
        known = rows.get(base)
        if base != row.job_id and (known is None or _RANK[row.stat] < _RANK[known.stat]):
            rows[base] = msgspec.structs.replace(row, job_id=base)
    return rows


@dataclass(frozen=True)
class KillOutput:
    """``bkill`` per id: being terminated, already finished, unknown."""

    terminated: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    seen: frozenset[str] = field(default_factory=frozenset)


def bkill_output(stdout: str, stderr: str = "") -> KillOutput:
    """What ``bkill`` said of each id, from its lines on either stream."""
    text = (
        f"{stdout if isinstance(stdout, str) else ''}\n{stderr if isinstance(stderr, str) else ''}"
    )
    terminated = tuple(dict.fromkeys(_TERMINATED_RE.findall(text)))
    finished = tuple(dict.fromkeys(_FINISHED_RE.findall(text)))
    unknown = tuple(dict.fromkeys(a or b for a, b in _NO_MATCH_RE.findall(text)))
    return KillOutput(terminated, finished, unknown, frozenset((*terminated, *finished, *unknown)))


# --- the token daemon's replies (docs/protocol.md) ------------------------------------------------

#: The longest reply line read (a status of many daemons' users is some kilobytes).
MAX_REPLY_BYTES = 16 * 1024 * 1024


class ReplyError(msgspec.Struct, frozen=True):
    """A reply's ``error``: one of the protocol's codes, and what the daemon said."""

    code: str = "error"
    message: str = ""


class Envelope(msgspec.Struct, frozen=True):
    """What every line from the daemon has: the request it answers (none: an event, or a
    connection turned away), whether it succeeded, and why not."""

    id: int | None = None
    ok: bool | None = None
    event: str | None = None
    error: ReplyError | None = None


class Hello(msgspec.Struct, frozen=True):
    """The answer to ``hello`` over TCP: the connection's challenge and the daemon's name,
    which every later signature on the connection covers."""

    challenge: str | None = None
    name: str | None = None


class TokenReply(msgspec.Struct, frozen=True):
    """The answer to ``acquire``: granted (a token), proceed (no token needed) or denied."""

    result: str | None = None
    token: str = ""
    category: str = ""
    waited: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    privileged: bool = False
    nice: int = 0
    reason: str | None = None

    @property
    def niceness(self) -> int:
        """The niceness the grant asks its command to run at (its user is busy), 0 for none;
        a value outside 1-19 is none."""
        return self.nice if 0 < self.nice < 20 else 0


class Acting(msgspec.Struct, frozen=True):
    """A user the bypass action holds: how, and until when (epoch seconds)."""

    action: str = "?"
    until: float = 0.0


class BypassStatus(msgspec.Struct, frozen=True):
    """The ``bypass`` block of a daemon's ``status`` (``proxyd.bypass``): the audit's
    scheduler, action and interval, the windows judged, who went around the gate in the last
    one (RPCs beyond their tokens), whom the action holds, and the audit's last problem."""

    scheduler: str | None = None
    action: str | None = None
    interval: float = 0.0
    windows: int = 0
    bypassing: dict[str, float] = {}
    acting: dict[str, Acting] = {}
    problem: str | None = None


def bypass_status(block: object) -> BypassStatus | None:
    """The ``bypass`` block of a ``status`` reply (None: no audit runs).

    :raises DocumentError: a field of the wrong type.
    """
    if not block:
        return None
    return convert(block, BypassStatus, kind="lsfproxyd bypass status")


def reply_line(line: bytes) -> dict[str, object]:
    """One line from the daemon as a JSON object (its fields read by the types above).

    :raises DocumentError: not one JSON object.
    """
    return decode_json(line, dict[str, object], kind="lsfproxyd reply", max_bytes=MAX_REPLY_BYTES)


def envelope(reply: Mapping[str, object]) -> Envelope:
    """The envelope of a reply read by :func:`reply_line`.

    :raises DocumentError: ``id``, ``ok``, ``event`` or ``error`` of the wrong type.
    """
    return convert(reply, Envelope, kind="lsfproxyd reply")


def hello_reply(reply: Mapping[str, object]) -> Hello:
    """:raises DocumentError: a challenge or name that is not a string."""
    return convert(reply, Hello, kind="lsfproxyd hello reply")


def token_reply(reply: Mapping[str, object]) -> TokenReply:
    """:raises DocumentError: a field of the grant of the wrong type."""
    return convert(reply, TokenReply, kind="lsfproxyd acquire reply")


# --- a site's lsf.conf and lsb.params -------------------------------------------------------------
# Read in LSF's syntax: ``NAME=value`` lines, ``#`` comments (whole lines, or after a blank
# outside quotes), values in double or single quotes, a ``\\`` at the end of a line continuing
# it on the next, and in ``lsb.params`` only what stands between ``Begin Parameters`` and
# ``End Parameters``.


@dataclass(frozen=True)
class Param:
    """One parameter as the file defines it (the last definition wins, as in LSF)."""

    name: str
    value: str
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}"


class LsfConfError(DocumentError):
    """A file that cannot be read as LSF configuration: ``where`` is ``FILE:LINE`` (or the
    file), so the message reads ``FILE:LINE: what is wrong``."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(where, problem)


_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines joined over ``\\`` continuations, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def _conf_value(text: str, file: str, line: int) -> str:
    """The value after ``=``: unquoted, an unquoted trailing comment dropped."""
    text = text.strip()
    if text[:1] in ("'", '"'):
        quote = text[0]
        end = text.find(quote, 1)
        if end < 0:
            raise LsfConfError(f"{file}:{line}", f"unclosed {quote} quote")
        rest = text[end + 1 :].strip()
        if rest and not rest.startswith("#"):
            raise LsfConfError(f"{file}:{line}", f"unexpected {rest[:20]!r} after the quoted value")
        return text[1:end]
    comment = re.search(r"\s#", text)
    return (text[: comment.start()] if comment else text).strip()


def lsf_params(text: str, file: str, sectioned: bool = False) -> dict[str, Param]:
    """Parameters of an ``lsf.conf`` (``sectioned=False``) or ``lsb.params`` file.

    :raises LsfConfError: a line that is not ``NAME=value``, an unclosed quote or section.
    """
    params: dict[str, Param] = {}
    inside = not sectioned
    for number, line in _logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if sectioned:
            words = stripped.split()
            if len(words) >= 2 and words[0].lower() in ("begin", "end"):
                opening = words[0].lower() == "begin"
                if words[1].lower() == "parameters":
                    if opening == inside:
                        raise LsfConfError(
                            f"{file}:{number}",
                            f"{stripped!r} "
                            + ("inside" if inside else "without")
                            + " a Begin Parameters section",
                        )
                    inside = opening
                continue
            if not inside:
                continue
        match = _NAME.fullmatch(stripped)
        if not match:
            raise LsfConfError(f"{file}:{number}", f"expected NAME=value, not {stripped[:40]!r}")
        name = match.group(1).upper()
        params[name] = Param(name, _conf_value(match.group(2), file, number), file, number)
    if sectioned and inside:
        raise LsfConfError(file, "Begin Parameters without End Parameters")
    return params


def positive(param: Param) -> int:
    """``param``'s value as a positive integer.

    :raises LsfConfError: anything else.
    """
    if not re.fullmatch(r"\+?\d+", param.value) or int(param.value) < 1:
        raise LsfConfError(
            f"{param.file}:{param.line}", f"{param.name}={param.value!r} is not a positive integer"
        )
    return int(param.value)
