"""Pure parsers for what the gLite WMS client prints: job ids, CE ids, the no-match banner.

Every function takes any text and never raises: the client's output is untrusted (garbage,
truncated, half-written by a killed process), and a parser that throws would turn a server
fault into a director crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

from gridgate.core.documents import DocumentError, decode_json

#: A job id is the logging-and-bookkeeping URL on port 9000 followed by a base64url token
#: (22 characters on real servers; accept any length so a longer id is not silently cut).
JOB_ID_RE = re.compile(r"https://[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?:9000/[A-Za-z0-9_-]+")
#: The consumer regex that worked in production (formats.md), one CE id per line.
CE_ID_RE = re.compile(r"^\s*-\s*(\S+:(?:2119|8443)/\S+)\s*$", re.MULTILINE)
NO_MATCH_TEXT = "No Computing Element matching your job requirements has been found!"
_NO_MATCH_BANNER_RE = re.compile(r"=+ glite-wms-job-list-match failure =+")
_ERROR_HEADER_RE = re.compile(r"^Error - (.*)$")
_WARNING_RE = re.compile(r"^Warning - (.*)$")
BANNER_WIDTH = 74


@dataclass(frozen=True)
class ClientMessage:
    """One error or warning block of the client's stderr: ``Error - <header>`` + its lines."""

    level: str
    header: str
    lines: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return "\n".join((self.header, *self.lines)).strip()


def banner(program: str, word: str) -> str:
    """The 74-column banner the client builds from its own name: ``=== <prog> <word> ===``."""
    middle = f" {program} {word} "
    pad = max(0, BANNER_WIDTH - len(middle))
    left = pad // 2
    return "=" * left + middle + "=" * (pad - left)


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


class _SubmitAnswer(msgspec.Struct):
    """``glite-wms-job-submit --json``'s answer (formats.md): ``jobid`` of a single job, or the
    ``parent`` of a parametric one with its ``children`` (by node name, or listed)."""

    jobid: str | None = None
    parent: str | None = None
    children: dict[str, str] | list[str] | None = None


def _json_job_ids(text: str) -> tuple[str, ...] | None:
    """Job ids from ``--json`` output; None when the text is not that format (then it is read
    as text)."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    try:
        answer: _SubmitAnswer = decode_json(
            stripped, _SubmitAnswer, kind="glite-wms-job-submit --json"
        )
    except DocumentError:
        return None
    # Children first: the director counts pilots, and a parametric parent is not a pilot.
    children = answer.children
    listed = list(children.values()) if isinstance(children, dict) else list(children or ())
    ids = [v for v in listed if JOB_ID_RE.fullmatch(v)]
    if ids:
        return _unique(ids)
    for value in (answer.jobid, answer.parent):
        if value is not None and JOB_ID_RE.fullmatch(value.strip()):
            return (value.strip(),)
    return ()


def parse_job_ids(text: str) -> tuple[str, ...]:
    """Job ids in submit output of any format: default text, ``--nomsg``, ``--json``, or the
    ``-o`` file (``###Submitted Job Ids###``). Empty when there is none.

    Only ``https://<lb>:9000/<id>`` URLs count; the ``:7443`` WMS endpoint the client also
    prints is never a job id.
    """
    if not isinstance(text, str):
        return ()
    from_json = _json_job_ids(text)
    if from_json is not None:
        return from_json
    return _unique(JOB_ID_RE.findall(text))


def parse_ce_ids(text: str) -> tuple[str, ...]:
    """CE ids listed by ``glite-wms-job-list-match`` (CREAM :8443 and LCG-CE :2119)."""
    if not isinstance(text, str):
        return ()
    return _unique(CE_ID_RE.findall(text))


def is_no_match(text: str) -> bool:
    """True when list-match output says no CE matches (the client still exits 0)."""
    if not isinstance(text, str):
        return False
    return NO_MATCH_TEXT in text or _NO_MATCH_BANNER_RE.search(text) is not None


def client_messages(stderr: str) -> tuple[ClientMessage, ...]:
    """Split the client's stderr into its ``Error - ...`` / ``Warning - ...`` blocks."""
    if not isinstance(stderr, str):
        return ()
    messages: list[ClientMessage] = []
    level = header = ""
    lines: list[str] = []

    def flush() -> None:
        if level:
            messages.append(ClientMessage(level, header, tuple(lines)))

    for raw in stderr.splitlines():
        line = raw.rstrip()
        error, warning = _ERROR_HEADER_RE.match(line), _WARNING_RE.match(line)
        if error or warning:
            flush()
            level = "error" if error else "warning"
            header = (error or warning).group(1).strip()  # type: ignore[union-attr]
            lines = []
        elif level and line.strip():
            lines.append(line.strip())
        elif level and lines:
            # A blank line ends the block's message (the client prints "\n\n" after it).
            flush()
            level, lines = "", []
    flush()
    return tuple(messages)


def first_line_matching(text: str, pattern: re.Pattern[str]) -> str | None:
    """The first line of ``text`` that ``pattern`` searches successfully, stripped."""
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        if pattern.search(line):
            return line.strip()
    return None


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (what a killed command said last), or ''."""
    if not isinstance(text, str):
        return ""
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""
