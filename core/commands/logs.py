"""Log sinks: configured by the ``gridgate`` command line and by the gate's shims only.

Kept apart from :mod:`gridgate.core.cli` so that a shim (run in front of every gated batch
command) sets up logging without importing click and the config machinery."""

from __future__ import annotations

import sys

from loguru import logger


def configure_logging(verbose: int, log_json: bool) -> None:
    """Send logs to stderr; stdout stays for machine-readable output."""
    logger.remove()
    level = "WARNING" if verbose == 0 else ("INFO" if verbose == 1 else "DEBUG")
    if log_json:
        logger.add(sys.stderr, level=level, serialize=True)
    else:
        logger.add(
            sys.stderr, level=level, format="{time:YYYY-MM-DD HH:mm:ss} {level: <7} {message}"
        )
