"""Stand-in gLite WMS commands for tests and the demo, installed only where asked.

:func:`install_commands` writes ``glite-wms-job-submit``, ``glite-wms-job-list-match``,
``glite-wms-job-status``, ``glite-wms-job-cancel`` and ``glite-wms-job-output`` into a directory of the caller's choosing; nothing is ever put on PATH implicitly. Prepend
that directory to PATH of the commands you run (e.g. the backend's ``env`` config).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gridgate.plugins.wms_glite.sim.scenario import (
    CALLS_LOG_ENV,
    SCENARIO_ENV,
    STATE_ENV,
    Call,
    load_scenario,
    max_concurrency,
    read_calls,
    write_scenario,
)

COMMANDS = (
    "glite-wms-job-submit",
    "glite-wms-job-list-match",
    "glite-wms-job-status",
    "glite-wms-job-cancel",
    "glite-wms-job-output",
)

_WRAPPER = """#!{python}
# Stand-in written by gridgate.plugins.wms_glite.sim.install_commands: for tests and demos only.
import sys

from gridgate.plugins.wms_glite.sim.cli import main

sys.exit(main())
"""

__all__ = [
    "CALLS_LOG_ENV",
    "COMMANDS",
    "SCENARIO_ENV",
    "STATE_ENV",
    "Call",
    "commands_section",
    "install_commands",
    "load_scenario",
    "max_concurrency",
    "read_calls",
    "write_scenario",
]


def install_commands(bin_dir: Path) -> Path:
    """Write the stand-in executables into ``bin_dir`` (created if needed) and return it.

    The scripts run under this interpreter (``sys.executable``), so they find gridgate even
    when the caller's PATH has another Python first.
    """
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        target = bin_dir / name
        temporary = bin_dir / f".{name}.tmp{os.getpid()}"
        temporary.write_text(_WRAPPER.format(python=sys.executable), encoding="utf-8")
        temporary.chmod(0o755)
        # rename is atomic: a concurrent caller never runs a half-written script.
        temporary.replace(target)
    return bin_dir


def commands_section(bin_dir: Path) -> dict[str, str]:
    """The ``backends.wms_glite.commands`` of a site that runs the stand-ins in ``bin_dir``."""
    return {
        key: str(Path(bin_dir) / f"glite-wms-job-{command}")
        for key, command in (
            ("submit", "submit"),
            ("list_match", "list-match"),
            ("status", "status"),
            ("cancel", "cancel"),
            ("output", "output"),
        )
    }
