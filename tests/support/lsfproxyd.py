"""Fixtures for the token daemon: a world-traversable socket dir, daemons as real processes,
and commands run as root or as the unprivileged ``nobody``.

Used by tests/plugins/lsf_proxy (its conftest imports them) and by the daemon reliability
tests (through tests/reliability/daemonkit.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

from support.uids import AS_NOBODY

__all__ = [
    "AS_NOBODY",
    "PYTHON",
    "Daemon",
    "cli",
    "install_shims",
    "py_as",
    "sockdir",
    "start_daemon",
    "system_bin",
    "system_tool",
]

PYTHON = sys.executable


@pytest.fixture
def sockdir():
    """A directory ``nobody`` can reach (pytest's tmp_path is 0700 under /tmp/pytest-of-root)."""
    path = Path(tempfile.mkdtemp(prefix="ggproxyd-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Daemon:
    def __init__(self, proc: subprocess.Popen, info: dict, config: Path, stderr: Path) -> None:
        self.proc, self.info, self.config, self.stderr = proc, info, config, stderr
        self.socket = info["socket"]
        self.pid = info["pid"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def log(self) -> str:
        return self.stderr.read_text(encoding="utf-8", errors="replace")

    def status(self) -> dict:
        """The daemon's ``status`` admin answer."""
        from gridgate.plugins.lsf_proxy.client.client import Daemon as Endpoint
        from gridgate.plugins.lsf_proxy.client.client import ProxyClient

        with ProxyClient([Endpoint("proxyd", self.socket)]) as client:
            [reply] = client.admin("status")
        return reply.reply["status"]


@pytest.fixture
def start_daemon(gridgate_exe, sockdir):
    """Start ``gridgate lsfproxyd serve -c FILE`` and wait until it listens."""
    started: list[Daemon] = []

    def start(
        section: dict,
        name: str = "",
        config_name: str = "",
        argv_prefix: tuple[str, ...] = (),
        extra: dict | None = None,
    ) -> Daemon:
        """``argv_prefix``: run the daemon under it (e.g. ``prlimit --nofile=256``);
        ``extra``: other top-level sections of its config file (``notifiers``, ``state``)."""
        section = dict(section)
        section.setdefault("socket", str(sockdir / f"{name or 'proxyd'}.sock"))
        config = sockdir / (config_name or f"{name or 'proxyd'}.yaml")
        document = {**(extra or {}), "proxyd": section}
        config.write_text(yaml.safe_dump(document), encoding="utf-8")
        config.chmod(0o644)
        stderr = sockdir / f"{name or 'proxyd'}.stderr"
        args = [*argv_prefix, gridgate_exe, "-v", "lsfproxyd", "serve", "-c", str(config), "--json"]
        if name:
            args += ["--name", name]
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=err, start_new_session=True
            )
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        if not line or not line[0]:
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"daemon did not start: {stderr.read_text()}")
        daemon = Daemon(proc, json.loads(line[0]), config, stderr)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()
        if daemon.proc.stdout:
            daemon.proc.stdout.close()


@pytest.fixture
def cli(gridgate_exe):
    """Run ``gridgate lsfproxyd ARGS`` (as ``nobody`` with user="nobody")."""

    def run(*args: str, user: str = "root", env: dict | None = None) -> subprocess.CompletedProcess:
        cmd = [gridgate_exe, "lsfproxyd", *args]
        if user == "nobody":
            cmd = AS_NOBODY + cmd
        full_env = {**os.environ, **(env or {})}
        # nobody cannot enter root's 0700 tmp_path, the test's working directory
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=60, env=full_env, cwd="/"
        )

    return run


@pytest.fixture
def py_as():
    """Run a python snippet as root or ``nobody``; returns the completed process."""

    def run(code: str, user: str = "nobody", timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [PYTHON, "-c", code]
        if user == "nobody":
            cmd = AS_NOBODY + cmd
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")

    return run


def system_tool(tool: str) -> str:
    """The system's own ``tool`` (from /usr/bin or /bin, never what PATH may put first)."""
    found = shutil.which(tool, path="/usr/bin:/bin")
    assert found, f"{tool} is not installed"
    return found


def system_bin(folder: Path, *tools: str) -> Path:
    """A folder of links to just ``tools`` from the system's folders: a PATH that holds what
    the test needs and nothing else the machine may have (Grid Engine's qstat, LSF's bjobs)."""
    folder.mkdir(mode=0o755)
    for tool in tools:
        (folder / tool).symlink_to(system_tool(tool))
    return folder


def install_shims(
    gridgate_exe: str, folder: Path, daemon: Daemon, *tools: str, kind: str = "python"
) -> tuple[str, str, Path]:
    """Shims of ``kind`` (``--shim-kind``) for ``tools`` in ``folder``/shims, gated by
    ``daemon``, in front of links to the real commands in ``folder``/system (and setpriv): the
    PATH to run them with, what ``--install-shims`` printed, and the folder of the links.
    Compiled shims are built with the system's ``gcc`` (named by ``$CC``: the PATH holds only
    the links)."""
    shims = folder / "shims"
    real = system_bin(folder / "system", "setpriv", *tools)
    path = f"{shims}{os.pathsep}{real}"
    env = {**os.environ, "PATH": path}
    if kind == "compiled":
        env["CC"] = system_tool("gcc")
    done = subprocess.run(
        [
            *(gridgate_exe, "gate", "--install-shims", str(shims)),
            *("--socket", daemon.socket, "--shim-kind", kind),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return path, done.stdout, real
