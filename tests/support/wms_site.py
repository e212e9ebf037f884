"""A director site on the stand-in gLite WMS whose one server accepts every pilot: what the
tests of ``gridgate run`` (the process, its metrics, its stop) start from."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def healthy_wms(folder: Path) -> dict[str, Any]:
    """The ``backends.wms_glite`` section of one healthy stand-in server, its commands and
    scenario installed under ``folder``."""
    from gridgate.plugins.wms_glite.sim import install_commands, write_scenario

    bin_dir = install_commands(folder / "bin")
    scenario = write_scenario(
        folder / "scenario.json",
        {"state_dir": str(folder / "simstate"), "default": {"behaviour": "healthy"}},
    )
    return {
        "servers": ["wms01.example.org"],
        "commands": {"submit": str(bin_dir / "glite-wms-job-submit")},
        "list_match": False,
        "env": {"GRIDGATE_SIM_SCENARIO": str(scenario)},
    }


def director_section(folder: Path, cycle_seconds: float, **more: Any) -> dict[str, Any]:
    """A ``director`` section with its state under ``folder``."""
    return {
        "cycle_seconds": cycle_seconds,
        "max_threads": 2,
        "command_timeout": 30,
        "state_dir": str(folder / "state"),
        **more,
    }
