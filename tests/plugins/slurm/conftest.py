"""A site whose director submits to the private Slurm cluster (tests/conftest.py starts it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
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
        #: what the site's Slurm clients need (``impatient`` points them at a conf of their own)
        self.env = dict(cluster.env)
        self.script = cluster.jobs_dir / f"pilot-{os.getpid()}.sh"
        if not self.script.exists():
            self.script.write_text("#!/bin/sh\nsleep 600\n", encoding="utf-8")
            self.script.chmod(0o755)

    def doc(self, partitions: list[str] | None = None, pilots: int = 2, **backend: Any) -> dict:
        section = {
            "partitions": partitions or list(self.cluster.partitions),
            "script": str(self.script),
            "sbatch_options": [f"--output={self.cluster.jobs_dir}/%j.out"],
            "env": dict(self.env),
            **backend,
        }
        return {
            "director": {"state_dir": str(self.state_dir), "command_timeout": 60, "max_threads": 1},
            "state": {"driver": "sqlite", "path": str(self.state_dir / "state.db")},
            "backends": {"slurm": section},
            "demand": {"static": {"slurm": pilots}},
            "notifiers": {"files": {"folder": str(self.folder / "notes")}},
        }

    def impatient(self, message_timeout: int = 2) -> None:
        """Point this site's Slurm clients (never the daemons) at a copy of the cluster's
        slurm.conf whose MessageTimeout is ``message_timeout``: they give up on a stopped
        controller after about ``message_timeout - 1`` s a try, and on one that does not answer
        after ``message_timeout`` s, instead of the cluster's 10 (Slurm's default). For the tests
        that stop or pause the controller: they wait for nothing but that."""
        text, swapped = re.subn(
            r"(?m)^MessageTimeout=\d+$",
            f"MessageTimeout={message_timeout}",
            self.cluster.conf.read_text(encoding="utf-8"),
        )
        assert swapped == 1, f"no MessageTimeout line in {self.cluster.conf}"
        conf = self.folder / "slurm-client.conf"
        conf.write_text(text, encoding="utf-8")
        self.env = {**self.cluster.env, "SLURM_CONF": str(conf)}

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


#: Slurm starts pending batch jobs at most every batch_sched_delay seconds (default 3): a test
#: that waits for a queue of short pilots to drain, iteration after iteration, sets it to 0 on a
#: cluster of its own (the scheduler then runs about once a second, on its own timer).
PROMPT_SCHEDULER = "SchedulerParameters=batch_sched_delay=0"


@pytest.fixture
def prompt_slurm_site(tmp_path) -> Iterator[SlurmSite]:
    """A site on a private cluster of its own (about 1.5 s to start and stop) whose scheduler
    starts pending jobs as soon as it runs, not every 3 s: same daemons, partitions and node."""
    from gridgate.plugins.slurm.cluster import ClusterError, SlurmCluster

    cluster = SlurmCluster(extra_conf=[PROMPT_SCHEDULER])
    try:
        cluster.start()
    except ClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield SlurmSite(cluster, tmp_path)
    finally:
        cluster.stop()
