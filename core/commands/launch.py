"""The ``gridgate`` console script: a fast path for commands that run in front of others.

Some commands run in front of every call of another program (``gridgate gate -- bjobs``): for
them the full command line (click, loguru, every plugin's commands) costs more than the work.
A distribution declares such a fast path in the entry-point group ``gridgate.cli_fast``: the
name is the subcommand, the target a function taking the arguments after it and returning an
exit status, or None to hand the call to the full command line (help, a usage error, any
option it does not know). The group is read from gridgate's own distribution metadata with
nothing but ``os`` (``importlib.metadata`` costs more than the gated command).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

FAST_GROUP = "gridgate.cli_fast"


def _entry_points_files() -> list[str]:
    found = []
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("gridgate-") and name.endswith((".dist-info", ".egg-info")):
                path = os.path.join(folder, name, "entry_points.txt")
                if os.path.isfile(path):
                    found.append(path)
        if found:
            break  # the first gridgate on sys.path is the one imported
    return found


def fast_target(command: str, files: Sequence[str] | None = None) -> str | None:
    """``module:function`` declared for ``command`` in :data:`FAST_GROUP`, or None."""
    for path in _entry_points_files() if files is None else files:
        try:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        group = ""
        for line in lines:
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                group = line[1:-1].strip()
            elif group == FAST_GROUP and "=" in line:
                name, _, target = line.partition("=")
                if name.strip() == command:
                    return target.strip()
    return None


def _load(target: str) -> Callable[[Sequence[str]], int | None]:
    module, _, attr = target.partition(":")
    __import__(module)
    value = sys.modules[module]
    for part in attr.split("."):
        value = getattr(value, part)
    return value  # type: ignore[return-value]


def main(argv: Sequence[str] | None = None) -> int | None:
    """Entry point: a declared fast path when it takes the call, else the full CLI."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-"):
        target = fast_target(args[0])
        if target is not None:
            code = _load(target)(args[1:])
            if code is not None:
                return code
    from gridgate.core.commands.app import main as full_main

    full_main(args)
    return None
