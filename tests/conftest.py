"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# Helper modules shared by every test folder (proctable.py, redis_server.py) live in tests/.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))


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


# --- real uids -------------------------------------------------------------------------------

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _checkout_problem() -> str | None:
    """Why ``nobody`` cannot run this checkout's gridgate (None when it can).

    The real-uid tests run clients as nobody with this checkout's .venv; in a clone inside a
    0700 folder (``mktemp -d``) they all fail with ``Permission denied`` and nothing says why.
    """
    if os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists():
        return None
    exe = BIN / "gridgate"
    probe = subprocess.run([*AS_NOBODY, str(BIN / "python"), "-c", "import gridgate.core.cli"],
                           capture_output=True, text=True, timeout=120, cwd="/")
    if probe.returncode == 0 and os.access(exe, os.X_OK):
        return None
    blocked = [str(p) for p in (ROOT, *ROOT.parents) if not os.stat(p).st_mode & 0o001]
    hint = (f"these folders are not world-executable: {', '.join(blocked)} "
            f"(chmod o+x them, or clone somewhere readable such as /srv or /tmp)"
            if blocked else "make the checkout and its .venv readable by other users (chmod -R o+rX)")
    return (f"the user 'nobody' cannot run {BIN / 'python'} of this checkout, so every test that "
            f"runs a client as a real ordinary uid would fail with 'Permission denied': {hint}. "
            f"What nobody saw: {probe.stderr.strip()[-300:]}")


def pytest_configure(config: pytest.Config) -> None:
    # Once per run, in the controlling process only (not in each xdist worker).
    if hasattr(config, "workerinput"):
        return
    problem = _checkout_problem()
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

    # MessageTimeout 4 s instead of 10: a stopped controller costs 3 s per command, not 9.
    cluster = SlurmCluster(message_timeout=4)
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
    """The session's cluster, healthy: controller running, partitions UP, no job left."""
    slurm_cluster.resume_controller()
    if slurm_cluster.controller_pid is None:
        slurm_cluster.start_controller()
    for partition in slurm_cluster.partitions:
        slurm_cluster.set_partition_state(partition, "UP")
    slurm_cluster.cancel_all()
    return slurm_cluster
