"""Log sinks: configured by the ``gridgate`` command line and by the gate's shims only.

Kept apart from :mod:`gridgate.core.cli` so that a shim (run in front of every gated batch
command) sets up logging without importing click and the config machinery."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from loguru import logger

from gridgate.core.text import printable


def _printable(record: Any) -> None:
    # a log line quotes what CEs, feeds, pilots and users wrote: their escapes, BELs and bidi
    # overrides are shown as \x1b, \u202e..., not acted on by the terminal or the journal viewer
    record["message"] = printable(record["message"])


def configure_logging(verbose: int, log_json: bool) -> None:
    """Send logs to stderr; stdout stays for machine-readable output. Every message has its
    control, format and bidi characters escaped (:func:`gridgate.core.text.printable`)."""
    logger.remove()
    logger.configure(patcher=_printable)
    level = "WARNING" if verbose == 0 else ("INFO" if verbose == 1 else "DEBUG")
    if log_json:
        logger.add(sys.stderr, level=level, serialize=True)
    else:
        logger.add(
            sys.stderr, level=level, format="{time:YYYY-MM-DD HH:mm:ss} {level: <7} {message}"
        )


def on_journal(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` is connected to systemd's journal (``JOURNAL_STREAM`` names its
    device and inode, as systemd sets it for a unit's stdout and stderr): the journal stamps
    each line itself, anywhere else a line needs its own time."""
    environ = os.environ if environ is None else environ
    value = environ.get("JOURNAL_STREAM", "")  # not config: the environment systemd sets
    device, _, inode = value.partition(":")
    try:
        info = os.fstat(stream.fileno())
        return (info.st_dev, info.st_ino) == (int(device), int(inode))
    except (ValueError, OSError, AttributeError):
        return False
