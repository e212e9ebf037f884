"""Stand-in LSF commands (``bsub``, ``bjobs``, ``bkill``) and a stand-in master daemon, for tests and demos.

:func:`install_commands` writes the commands into a directory of the caller's choosing; nothing
is put on PATH implicitly. Their behaviour comes from the scenario file named by
``GRIDGATE_LSF_SCENARIO`` (see :mod:`gridgate.plugins.lsf_proxy.sim.cli`); the master daemon
is started with :func:`start_master` or ``python -m gridgate.plugins.lsf_proxy.sim.master``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridgate.plugins.lsf_proxy.sim.cli import (
    MASTER_ENV,
    SCENARIO_ENV,
    call,
    load_scenario,
    write_scenario,
)

COMMANDS = ("bsub", "bjobs", "bkill")

_WRAPPER = """#!{python}
# Stand-in written by gridgate.plugins.lsf_proxy.sim.install_commands: for tests and demos only.
# The module is loaded by path, so any Python >= 3.10 runs it, with or without gridgate.
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("gridgate_lsf_standin", {cli!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.exit(module.main())
"""

__all__ = [
    "COMMANDS",
    "MASTER_ENV",
    "SCENARIO_ENV",
    "Master",
    "Proxyd",
    "install_commands",
    "load_scenario",
    "start_master",
    "start_proxyd",
    "write_scenario",
]


def install_commands(bin_dir: Path, mode: int = 0o755, python: str | None = None) -> Path:
    """Write the stand-in executables into ``bin_dir`` (created if needed) and return it.

    They run under ``python`` (default: this interpreter); give a system-wide one when other
    users must run them and this interpreter is private (a virtualenv under /root).
    """
    from gridgate.plugins.lsf_proxy.sim import cli

    wrapper = _WRAPPER.format(
        python=python or sys.executable, cli=str(Path(cli.__file__).resolve())
    )
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        temporary = bin_dir / f".{name}.tmp{os.getpid()}"
        temporary.write_text(wrapper, encoding="utf-8")
        temporary.chmod(mode)
        temporary.replace(bin_dir / name)  # atomic: nobody runs a half-written script
    return bin_dir


@dataclass
class _Child:
    """A helper daemon started as a child process: stopped with SIGTERM, then SIGKILL."""

    proc: subprocess.Popen[bytes]
    socket: str

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout)
        if self.proc.stdout:
            self.proc.stdout.close()
        return code

    def __enter__(self) -> _Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ready_line(proc: subprocess.Popen[bytes], timeout: float, failure: str) -> dict[str, Any]:
    """The JSON line a child prints once it listens; kill it and raise if none comes."""
    line: list[bytes] = []
    reader = threading.Thread(
        target=lambda: line.append(proc.stdout.readline()),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    reader.join(timeout)
    if not line or not line[0]:
        proc.kill()
        proc.wait(10)
        raise RuntimeError(failure)
    return json.loads(line[0])


@dataclass
class Master(_Child):
    """A running stand-in master daemon (a child process)."""

    def stats(self) -> dict[str, Any]:
        return call(self.socket, {"op": "stats"})

    def reset(self) -> None:
        call(self.socket, {"op": "reset"})


def start_master(
    socket_path: str | os.PathLike[str],
    base: float = 0.01,
    knee: float = 8.0,
    ready_timeout: float = 30.0,
) -> Master:
    """Start the master daemon as a child process and wait until it listens.

    :raises RuntimeError: it did not report ready within ``ready_timeout`` seconds.
    """
    argv = [
        sys.executable,
        "-m",
        "gridgate.plugins.lsf_proxy.sim.master",
        "--socket",
        str(socket_path),
        "--base",
        str(base),
        "--knee",
        str(knee),
        "--exit-with-parent",
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )
    info = _ready_line(proc, ready_timeout, "the stand-in master daemon did not start")
    return Master(proc, info["socket"])


@dataclass
class Proxyd(_Child):
    """A token daemon started by :func:`start_proxyd` (a child process)."""

    info: dict[str, Any] = field(default_factory=dict)


def start_proxyd(folder: Path, section: dict[str, Any], ready_timeout: float = 30.0) -> Proxyd:
    """Start ``gridgate lsfproxyd serve`` on a private socket in ``folder`` (demos, benches).

    :raises RuntimeError: it did not report ready (its stderr is in ``folder/proxyd.stderr``).
    """
    import yaml

    folder = Path(folder)
    config = folder / "proxyd.yaml"
    section = {"socket": str(folder / "proxyd.sock"), **section}
    config.write_text(yaml.safe_dump({"proxyd": section}), encoding="utf-8")
    config.chmod(0o644)
    exe = Path(sys.executable).parent / "gridgate"
    argv = (
        [str(exe), "lsfproxyd", "serve", "-c", str(config), "--json"]
        if exe.exists()
        else [
            sys.executable,
            "-m",
            "gridgate.core.commands.app",
            "lsfproxyd",
            "serve",
            "-c",
            str(config),
            "--json",
        ]
    )
    with open(folder / "proxyd.stderr", "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    info = _ready_line(
        proc, ready_timeout, f"the token daemon did not start; see {folder / 'proxyd.stderr'}"
    )
    return Proxyd(proc, info["socket"], info)
