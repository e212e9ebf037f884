"""A site whose director submits to the private Grid Engine cell (tests/plugins/sge/conftest.py
starts it): the ``sge`` backend's section for it, and ``gridgate run --once --json`` run as the
cell's submit user, as a site runs its director under a service account (Grid Engine refuses
root: ``min_uid``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

BIN = Path(sys.executable).parent


class SgeSite:
    """A gridgate config for the ``sge`` backend on ``cell``, kept in a folder of the cell's
    jobs folder (mode 1777) so that the director, run as the submit user, may write there."""

    def __init__(self, cell: Any, name: str) -> None:
        self.cell = cell
        self.folder = Path(cell.jobs_dir) / f"site-{os.getpid()}-{name}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o777)
        self.state_dir = self.folder / "state"
        self.queue = cell.queues[0]
        self.script = self.pilot("pilot.sh", "sleep 600\n")

    def pilot(self, name: str, body: str) -> Path:
        """A pilot script every user may read and run."""
        path = self.folder / name
        path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
        path.chmod(0o755)
        return path

    def as_user(self, name: str) -> Path:
        """A wrapper that runs the cell's ``name`` as the submit user: what a backend built in
        this (root) process runs, as a site whose director is root would have to (sudo)."""
        wrapper = self.folder / "as-user" / name
        if not wrapper.exists():
            wrapper.parent.mkdir(exist_ok=True)
            argv = [*self.cell.submit_prefix, str(Path(self.cell.bin_dir) / name)]
            wrapper.write_text(  # no shell: the words are passed on as they came
                f"#!{sys.executable}\nimport os, sys\n"
                f"argv = {argv!r}\nos.execvp(argv[0], argv + sys.argv[1:])\n",
                encoding="utf-8",
            )
            wrapper.chmod(0o755)
        return wrapper

    def section(self, *, in_process: bool = True, **backend: Any) -> dict[str, Any]:
        """The backend's section; ``in_process`` (a backend built in this root process) runs
        the commands through :meth:`as_user` wrappers, else the cell's own commands."""
        commands = ("qsub", "qstat", "qacct", "qdel", "qconf")
        return {
            "queues": list(self.cell.queues),
            "script": str(self.script),
            "qsub_options": ["-o", "/dev/null", "-j", "y"],
            "env": {k: v for k, v in self.cell.env.items() if k != "PATH"},
            "commands": {
                name: str(self.as_user(name) if in_process else Path(self.cell.bin_dir) / name)
                for name in commands
            },
            **backend,
        }

    def doc(self, pilots: int = 2, **backend: Any) -> dict[str, Any]:
        return {
            "director": {"state_dir": str(self.state_dir), "command_timeout": 60, "max_threads": 1},
            "state": {"driver": "sqlite", "path": str(self.state_dir / "state.db")},
            "backends": {"sge": self.section(in_process=False, **backend)},
            "demand": {"static": {"sge": pilots}},
            "notifiers": {"files": {"folder": str(self.folder / "notes")}},
        }

    def write(self, doc: dict[str, Any]) -> Path:
        path = self.folder / "site.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        path.chmod(0o644)
        return path

    def run_once(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``gridgate run --once --json`` as the cell's submit user (setpriv), in the site's
        folder, with this interpreter's ``gridgate`` (the venv is world-readable)."""
        argv = [
            *self.cell.submit_prefix,
            str(BIN / "gridgate"),
            "run",
            "-c",
            str(self.write(doc)),
            "--once",
            "--json",
        ]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(self.folder)}
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=240, cwd=self.folder, env=env
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        assert len(lines) == 1, proc.stdout
        return lines[0]

    def notes(self) -> list[str]:
        folder = self.folder / "notes"
        return sorted(p.read_text() for p in folder.iterdir()) if folder.exists() else []
