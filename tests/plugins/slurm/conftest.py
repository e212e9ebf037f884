"""A site whose director submits to the private Slurm cluster (tests/conftest.py starts it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

BIN = Path(sys.executable).parent


class SlurmSite:
    """A gridgate config for the ``slurm`` backend, and `gridgate run --once --json` on it."""

    def __init__(self, cluster, folder: Path) -> None:
        self.cluster = cluster
        self.folder = folder
        self.state_dir = folder / "state"
        self.script = cluster.jobs_dir / f"pilot-{os.getpid()}.sh"
        if not self.script.exists():
            self.script.write_text("#!/bin/sh\nsleep 600\n", encoding="utf-8")
            self.script.chmod(0o755)

    def doc(self, partitions: list[str] | None = None, pilots: int = 2, **backend: Any) -> dict:
        section = {
            "partitions": partitions or list(self.cluster.partitions),
            "script": str(self.script),
            "sbatch_options": [f"--output={self.cluster.jobs_dir}/%j.out"],
            "env": dict(self.cluster.env),
            **backend,
        }
        return {
            "director": {"state_dir": str(self.state_dir), "command_timeout": 60, "max_threads": 1},
            "state": {"driver": "sqlite", "path": str(self.state_dir / "state.db")},
            "backends": {"slurm": section},
            "demand": {"static": {"slurm": pilots}},
            "notifiers": {"files": {"folder": str(self.folder / "notes")}},
        }

    def write(self, doc: dict) -> Path:
        path = self.folder / "site.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        return path

    def run_once(self, doc: dict) -> dict:
        proc = subprocess.run(
            [str(BIN / "gridgate"), "run", "-c", str(self.write(doc)), "--once", "--json"],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        assert len(lines) == 1, proc.stdout
        return lines[0]


@pytest.fixture
def slurm_site(slurm, tmp_path) -> SlurmSite:
    return SlurmSite(slurm, tmp_path)
