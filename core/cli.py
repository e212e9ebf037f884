"""What a plugin that adds sub-commands uses of the ``gridgate`` command line: loading the config
a command is given, the exit code of a config that cannot be used, and printing text that came
from outside. The command line itself is :mod:`gridgate.core.commands`."""

from __future__ import annotations

from typing import Any

import click

from gridgate.core._moved import moved_names
from gridgate.core.config import ConfigError, load_config
from gridgate.core.text import printable

__all__ = ["EXIT_CONFIG", "echo", "load_config_or_exit"]

#: Exit code for a config that cannot be used (file, line and key are printed).
EXIT_CONFIG = 2


def load_config_or_exit(path: str) -> Any:
    """Load the config file at ``path`` for a command; on failure print every problem
    (``FILE:LINE: key: message``) on stderr and exit 2."""
    try:
        return load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(str(problem), err=True)
        raise SystemExit(EXIT_CONFIG) from None


def echo(text: str = "", err: bool = False) -> None:
    """``click.echo(text)`` with its control, format and bidi characters escaped
    (:func:`gridgate.core.text.printable`): for a line that quotes what a CE, a feed, a
    server or another user wrote (a ban's reason, a GOCDB description, an SMTP reply), so that
    it cannot move the cursor, clear the screen or reorder what the operator reads.

    :param text: the line (newlines are kept).
    :param err: to stderr instead of stdout.
    """
    click.echo(printable(text), err=err)


#: the command line of API 1.4 (the group, main) is gridgate.core.commands.app now
__getattr__ = moved_names(__name__)
