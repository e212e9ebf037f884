"""Helpers of the reliability suite: site configs, the CLI as a process, the process table."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.proctable import alive, proc_table, processes_with

from gridgate.plugins.wms_glite.sim import install_commands, write_scenario

# alive, proc_table, processes_with: re-exported for the reliability tests
__all__ = [
    "HOSTS",
    "ROOT",
    "Site",
    "alive",
    "calls",
    "gridgate",
    "json_lines",
    "proc_table",
    "processes_with",
    "wait_for",
]

ROOT = Path(__file__).resolve().parents[2]

HOSTS = [f"wms{i:02d}.example.org" for i in range(1, 12)]


def wait_for(predicate: Callable[[], Any], bound: float, what: str, pause: float = 0.05) -> Any:
    """Poll ``predicate`` until it is truthy (returned) or ``bound`` seconds pass (fails)."""
    end = time.monotonic() + bound
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            pytest.fail(f"gave up waiting for {what} after {bound} s")
        time.sleep(pause)


def calls(path: Path) -> list[dict[str, Any]]:
    """The stand-ins' calls log as a list of events (start/end/grandchild lines)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line being written right now
    return events


class Site:
    """A site folder: stand-ins, a scenario, and a YAML config written from a dict."""

    def __init__(self, root: Path, hosts: list[str] | None = None) -> None:
        self.root = root
        self.hosts = list(hosts or HOSTS[:4])
        self.bin = install_commands(root / "bin")
        self.scenario_path = root / "scenario.json"
        self.calls_log = root / "calls.jsonl"
        self.state_dir = root / "state"
        self.notes = root / "notes"
        self.config_path = root / "site.yaml"
        self.scenario()

    def scenario(
        self,
        hosts: dict[str, Any] | None = None,
        default: dict[str, Any] | None = None,
        log_calls: bool = True,
    ) -> None:
        write_scenario(
            self.scenario_path,
            {
                "state_dir": str(self.root / "simstate"),
                "calls_log": str(self.calls_log) if log_calls else "",
                "default": dict(default or {"behaviour": "healthy"}),
                "hosts": dict(hosts or {}),
            },
        )

    def doc(self, **director: Any) -> dict[str, Any]:
        return {
            "director": {
                "cycle_seconds": 0.1,
                "max_threads": 4,
                "command_timeout": 5,
                "state_dir": str(self.state_dir),
                **director,
            },
            "state": {"driver": "sqlite", "path": str(self.state_dir / "state.db")},
            "backends": {
                "wms_glite": {
                    "servers": self.hosts,
                    "commands": {
                        "submit": str(self.bin / "glite-wms-job-submit"),
                        "list_match": str(self.bin / "glite-wms-job-list-match"),
                    },
                    "list_match": True,
                    "env": {"GRIDGATE_SIM_SCENARIO": str(self.scenario_path)},
                }
            },
            "demand": {"static": {"wms_glite": 8}},
            "notifiers": {"files": {"folder": str(self.notes)}},
        }

    def write(self, doc: dict[str, Any]) -> Path:
        self.config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        return self.config_path


def gridgate(
    exe: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the gridgate CLI to completion."""
    return subprocess.run(
        [exe, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
