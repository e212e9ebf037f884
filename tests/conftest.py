"""Fixtures shared by the whole suite."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# No per-example deadline anywhere: on a loaded 2-core machine one example may stall for more
# than hypothesis's default 200 ms, which it reports as a failure (DeadlineExceeded or Flaky)
# though nothing is wrong. Tests that want fewer examples still say so themselves.
settings.register_profile("gridgate", deadline=None)
settings.load_profile("gridgate")
BIN = Path(sys.executable).parent
# Helper modules shared by every test folder live in tests/support/, importable as
# ``support`` through ``pythonpath = ["tests"]`` in pyproject.toml.


@pytest.fixture
def gridgate_exe() -> str:
    """The installed ``gridgate`` console script of the environment running the tests."""
    exe = BIN / "gridgate"
    assert exe.exists(), f"gridgate is not installed in {BIN}"
    return str(exe)


@pytest.fixture
def write(tmp_path: Path):
    """Write a text file under tmp_path and return its path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    return _write


@pytest.fixture(autouse=True)
def _private_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths in configs (./gridgate-state) land in the test's own folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", os.environ.get("HOME", str(tmp_path)))


# --- real uids ---------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    # Once per run, in the controlling process only (not in each xdist worker).
    if hasattr(config, "workerinput"):
        return
    from support.checkout import checkout_problem

    problem = checkout_problem(ROOT, BIN)
    if problem is not None:
        pytest.exit(f"unusable checkout: {problem}", returncode=4)


# --- a private Slurm cluster -----------------------------------------------------------------


@pytest.fixture(scope="session")
def slurm_cluster():
    """One private Slurm cluster per test process (xdist worker), started on first use.

    Tests that change it (a partition set DOWN, the controller stopped) ask for ``slurm``
    instead, which puts it back first. A missing Slurm package fails the test, never skips.
    """
    from gridgate.plugins.slurm.cluster import ClusterError, SlurmCluster

    # Slurm's default MessageTimeout (10 s): shorter ones made a loaded machine's slow answers
    # look like a hung controller.
    cluster = SlurmCluster()
    try:
        cluster.start()
    except ClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster):
    """The session's cluster, healthy: daemons running, partitions UP, no job left."""
    slurm_cluster.resume_controller()
    slurm_cluster.ensure_running()
    for partition in slurm_cluster.partitions:
        slurm_cluster.set_partition_state(partition, "UP")
    slurm_cluster.cancel_all()
    return slurm_cluster


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Record measured figures for docs/reliability.md: one JSON line per call, appended to
    the file named by GRIDGATE_RELIABILITY_FIGURES (nothing is written when it is unset)."""

    def note(**values: Any) -> None:
        path = os.environ.get("GRIDGATE_RELIABILITY_FIGURES")
        if path:
            with open(path, "a", encoding="utf-8") as sink:
                sink.write(
                    json.dumps(
                        {
                            "test": request.node.name,
                            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                            **values,
                        }
                    )
                    + "\n"
                )

    return note
