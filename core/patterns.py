"""A pattern table: the lines a batch system's commands print, and the failure each one means.

A backend reads its failures from its client's own messages: ``Unable to contact slurm
controller`` is ``unreachable``, ``Invalid partition name specified`` is the site's ``config``.
It lists them, most specific first, as :class:`Pattern` values in a :class:`PatternTable`;
:meth:`PatternTable.classify` then turns a failed command into a
:class:`~gridgate.core.model.Failure` of the catalogue (:mod:`gridgate.core.kinds`) quoting the
line that gave it away, and names what no pattern knows in the catalogue's generic kinds
(``launch``, ``timeout``, ``bad_output``, ``error``):

.. code-block:: python

    TABLE = PatternTable((
        Pattern("unreachable", re.compile(r"Unable to contact slurm controller"),
                "the Slurm controller cannot be contacted", tags=frozenset({"cluster"})),
        Pattern("config", re.compile(r"Invalid partition name"), "the partition does not exist",
                transient=False),
    ))

    def classify_failure(self, endpoint, result):
        return TABLE.classify(result.command, result.message)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gridgate.core.kinds import KINDS
from gridgate.core.model import CommandResult, Failure

__all__ = ["MAX_QUOTE", "Pattern", "PatternTable", "clip", "first_line"]

#: The longest quote of a command's output a failure's reason carries.
MAX_QUOTE = 200


def clip(line: str, limit: int = MAX_QUOTE) -> str:
    """``line`` on one line (runs of blanks made one space), cut to ``limit`` with ``...``.

    :param line: a line (or lines) a command printed.
    :param limit: the most characters kept, ``...`` included.
    """
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def first_line(command: CommandResult) -> str:
    """The first non-blank line the command printed (stderr first); ``no output`` if none.

    :param command: the command's result.
    """
    text = f"{command.stderr}\n{command.stdout}"
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "no output")


@dataclass(frozen=True)
class Pattern:
    """A line a command prints and what it means.

    ``kind`` is a catalogued failure kind; ``regex`` is searched line by line; ``label``
    says in words what the line means (the failure's reason is ``label: 'the line'``). The
    flags are the :class:`~gridgate.core.model.Failure`'s. ``tags`` are the backend's own
    marks on a pattern (Slurm's ``cluster``: every partition of the cluster is affected).
    """

    kind: str
    regex: re.Pattern[str]
    label: str
    exclude: bool = True
    notify: bool = True
    transient: bool = True
    local: bool = False
    tags: frozenset[str] = field(default_factory=frozenset)

    def failure(self, line: str) -> Failure:
        """The failure this pattern means, quoting ``line``."""
        return KINDS[self.kind].failure(
            clip(f"{self.label}: {line!r}"),
            exclude=self.exclude,
            notify=self.notify,
            transient=self.transient,
            local=self.local,
        )


class PatternTable:
    """Patterns in order: the first one found in the output decides (specific before general)."""

    def __init__(self, patterns: Iterable[Pattern]) -> None:
        self.patterns: tuple[Pattern, ...] = tuple(patterns)
        unknown = sorted({p.kind for p in self.patterns} - set(KINDS))
        if unknown:
            raise ValueError(f"pattern kinds not in the catalogue: {', '.join(unknown)}")

    def match(self, text: str) -> tuple[Pattern, str] | None:
        """The first pattern found in ``text``, with the line (stripped) that matched."""
        lines = text.splitlines()
        for pattern in self.patterns:
            for line in lines:
                if pattern.regex.search(line):
                    return pattern, line.strip()
        return None

    def match_output(self, command: CommandResult) -> tuple[Pattern, str] | None:
        """The first pattern found in what ``command`` printed (stderr, then stdout)."""
        return self.match(f"{command.stderr}\n{command.stdout}")

    def classify(
        self,
        command: CommandResult | None,
        message: str = "",
        *,
        search_message: bool = False,
        bad_output: str = "exit 0 but no job id in the output",
        said: Callable[[CommandResult], str] = first_line,
    ) -> Failure:
        """What a failed command means.

        ``command`` None: nothing was run, so no endpoint is to blame (``config``, not
        excluded, with ``message`` as the reason). A program that could not start is
        ``launch``; then the table decides (``search_message``: the backend's own ``message``
        is searched first, before the output); else a killed command is ``timeout``, exit 0
        ``bad_output`` (``bad_output`` says what was missing) and anything else ``error``,
        quoting the line ``said`` picks.
        """
        if command is None:
            return KINDS["config"].failure(clip(message or "nothing was run"), exclude=False)
        if command.launch_error is not None:
            return KINDS["launch"].failure(
                clip(f"could not start {command.argv[0]}: {command.launch_error}")
            )
        found = (self.match(message) if search_message else None) or self.match_output(command)
        if found is not None:
            pattern, line = found
            return pattern.failure(line)
        if command.timed_out:
            return KINDS["timeout"].failure(
                f"timed out after {command.duration:.1f} s and was killed"
            )
        if command.returncode == 0:
            return KINDS["bad_output"].failure(clip(bad_output))
        return KINDS["error"].failure(clip(f"exit code {command.returncode}: {said(command)!r}"))
