"""What a failed ``bsub``, ``bjobs`` or ``bkill`` means, read from the lines LSF prints
(formats.md): the one table the LSF backend and its pilot tracking both classify with.

Apart from :mod:`.backend` so that :mod:`.tracking` (which the backend calls) can tell daemon
trouble from an answer without importing the backend.
"""

from __future__ import annotations

import re

from gridgate.core.kinds import KINDS
from gridgate.core.model import CommandResult, Failure
from gridgate.core.patterns import Pattern, PatternTable

__all__ = ["PATTERNS", "TABLE", "classify", "daemon_trouble"]


def _pattern(kind: str, regex: re.Pattern[str], transient: bool, label: str) -> Pattern:
    """A line LSF prints and what it means, with its kind's flags; a ``transient`` one is not
    told at once: only when it persists (``classify_failure``)."""
    known = KINDS[kind]
    return Pattern(
        kind,
        regex,
        label,
        exclude=known.exclude,
        notify=known.notify and not transient,
        transient=known.transient,
        local=known.local,
    )


#: Order matters: the first pattern found in the output decides.
PATTERNS: tuple[Pattern, ...] = (
    _pattern("config", re.compile(r"No such queue"), False, "the queue does not exist"),
    _pattern(
        "usage",
        re.compile(r"Too many processors requested"),
        False,
        "more processors than the queue allows",
    ),
    _pattern(
        "usage",
        re.compile(
            r"Error in rusage section|[Rr]esource requirement syntax|"
            r"Bad resource requirement"
        ),
        False,
        "the resource requirement string is wrong",
    ),
    _pattern(
        "unreachable",
        re.compile(r"Request from non-LSF host rejected"),
        True,
        "this host is not an LSF client of the cluster",
    ),
    _pattern(
        "daemon",
        re.compile(
            r"LIM is down|LIM\) not responding|Master LIM is down|"
            r"batch system daemon not responding"
        ),
        True,
        "LSF daemons are not answering",
    ),
)

TABLE = PatternTable(PATTERNS)


def classify(command: CommandResult | None, message: str = "") -> Failure:
    """What a failed ``bsub``/``bjobs`` means (``notify`` of transient kinds is decided later)."""
    return TABLE.classify(command, message, bad_output="exit 0 but no 'Job <N> is submitted' line")


def daemon_trouble(command: CommandResult) -> bool:
    """Whether a failed command's output says LSF itself is in trouble (not an answer)."""
    return classify(command).kind != "error"
