"""What a gated command runs: take a token, run the command, give the token back.

The run-time half of ``gridgate gate`` (:mod:`gridgate.plugins.lsf_proxy.gate` holds the
command line and ``--install-shims``). The shims import only this module, and this module
imports no click, no schema validation and no plugin loading, because it runs in front of
every gated ``bjobs`` a user types: start-up time is the gate's cost.

The command runs as an argv (never through a shell) with stdin, stdout and stderr inherited;
its exit status is the gate's. SIGINT, SIGTERM and SIGHUP are forwarded to it, and the token
goes back whatever happens: when the command ends, when it is killed, and (the daemon sees the
connection close) when the gate itself is killed. A command run through the gate gets
``GRIDGATE_GATE_TOKEN`` in its environment, so a gated script calling a shimmed ``bjobs`` does
not wait for a second token while holding the first.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gridgate.plugins.lsf_proxy.config import category_map, section_defaults

#: Exit codes of the gate itself (the command's own code is passed through otherwise).
EXIT_NO_TOKEN = 75  # EX_TEMPFAIL: refused a token; the command did not run
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: no daemon answered and when_unavailable is fail
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
TOKEN_ENV = "GRIDGATE_GATE_TOKEN"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: Other batch systems' commands, beside LSF's (config.DEFAULT_CATEGORY_MAP).
GATE_CATEGORIES: dict[str, tuple[str, ...]] = {
    "submission": ("sbatch", "srun", "salloc", "condor_submit", "qsub"),
    "query": ("squeue", "sinfo", "sacct", "sstat", "sprio", "sshare", "sdiag", "condor_q",
              "condor_status", "condor_history", "qstat"),
    "other": ("scancel", "scontrol"),
}
#: Commands whose category depends on their first word that is not an option:
#: ``scontrol show job 12`` only reads, ``scontrol update ...`` changes the cluster.
ARGUMENT_CATEGORIES: dict[str, dict[str, str]] = {
    "scontrol": {"show": "query"},
}
#: Commands ``--install-shims`` writes a wrapper for when they are on PATH.
SHIM_COMMANDS: tuple[str, ...] = (
    "bjobs", "bhosts", "bqueues", "bhist", "busers", "bsub", "bmod", "bswitch", "brestart",
    "squeue", "sinfo", "sacct", "sstat", "sprio", "sshare", "sdiag", "sbatch", "srun", "salloc",
    "scancel", "scontrol", "condor_q", "condor_status", "condor_submit", "qstat", "qsub",
)

def gate_category_map(section: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Command -> category: LSF's defaults, the other batch systems, then the config's own."""
    mapping = category_map(GATE_CATEGORIES)
    for category, names in ((section or {}).get("categories") or {}).items():
        for name in names:
            mapping[name] = category
    return mapping


def infer_category(command: str, section: Mapping[str, Any] | None = None,
                   args: Sequence[str] = ()) -> str:
    """The category of ``command`` (a name or a path) run with ``args``: submission, query or
    other. The config's ``categories`` win over everything, the arguments over the name."""
    name = os.path.basename(command)
    own = {n for names in ((section or {}).get("categories") or {}).values() for n in names}
    by_word = ARGUMENT_CATEGORIES.get(name)
    if by_word and name not in own:
        word = next((a for a in args if not a.startswith("-")), "")
        if word in by_word:
            return by_word[word]
    return gate_category_map(section).get(name, "other")


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def find_real(name: str, exclude: str | os.PathLike[str] | None = None,
              path: str | None = None) -> str | None:
    """``name`` on PATH, skipping the directory ``exclude`` (the shims' own)."""
    search = os.environ.get("PATH", os.defpath) if path is None else path
    dirs = [d for d in search.split(os.pathsep) if d]
    if exclude is not None:
        dirs = [d for d in dirs if not _same_dir(d, str(exclude))]
    return shutil.which(name, path=os.pathsep.join(dirs)) if dirs else None


def _section(config_path: str | None) -> dict[str, Any]:
    if not config_path:
        return section_defaults()
    from gridgate.core.cli import load_config_or_exit

    config = load_config_or_exit(config_path)
    return dict(config.get("proxyd") or section_defaults())


def _say(message: str) -> None:
    print(f"gridgate gate: {message}", file=sys.stderr, flush=True)


def run_gated(argv: Sequence[str], category: str, opcode: str, section: Mapping[str, Any],
              socket_path: str | None = None) -> int:
    """Take a token, run ``argv``, give the token back; return the exit status to use.

    A command killed by a signal makes this return ``-signal`` (the caller re-raises it).
    """
    from gridgate.plugins.lsf_proxy.client import (
        NoToken,
        ProxyClient,
        ProxyError,
        ProxyUnavailable,
    )

    program = argv[0]
    if os.sep not in program:
        found = shutil.which(program)
        if found is None:
            _say(f"{program}: command not found")
            return EXIT_NOT_FOUND
        program = found
    if not os.path.exists(program):
        _say(f"{argv[0]}: command not found")
        return EXIT_NOT_FOUND
    if os.path.isdir(program):
        _say(f"{argv[0]}: is a directory")
        return EXIT_CANNOT_EXECUTE
    name = os.path.basename(argv[0])
    if os.environ.get(TOKEN_ENV):
        # already inside a gated command: its token covers this one
        return _run_child([program, *argv[1:]], None, name)
    client = ProxyClient.from_section(section, socket_path)
    try:
        try:
            token = client.acquire(category, opcode or name)
        except KeyboardInterrupt:
            _say(f"{name}: interrupted while waiting for a {category} token")
            return 128 + signal.SIGINT
        except NoToken as exc:
            _say(f"{name}: no {category} token, not run: {exc}")
            return EXIT_NO_TOKEN
        except ProxyUnavailable as exc:
            _say(f"{name}: not run: {exc} (when_unavailable: fail)")
            return EXIT_UNAVAILABLE
        except ProxyError as exc:
            _say(f"{name}: not run: {exc}")
            return EXIT_NO_TOKEN
        try:
            return _run_child([program, *argv[1:]], token.id or "proceed", name)
        finally:
            token.release()
    finally:
        client.close()


def _run_child(argv: list[str], token: str | None, name: str) -> int:
    env = dict(os.environ)
    if token is not None:
        env[TOKEN_ENV] = token
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        if child is None:
            pending.append(signum)
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        try:
            child = subprocess.Popen(argv, env=env)
        except FileNotFoundError:
            _say(f"{name}: command not found")
            return EXIT_NOT_FOUND
        except OSError as exc:
            _say(f"{name}: cannot execute: {exc.strerror or exc}")
            return EXIT_CANNOT_EXECUTE
        for signum in pending:
            child.send_signal(signum)
        while True:
            try:
                return child.wait()
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_like(status: int) -> int:
    """Exit the way the command did: re-raise its signal on ourselves, else return its code."""
    if status >= 0:
        return status
    signum = -status
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    except (OSError, ValueError):
        pass
    return 128 + signum


def shim_main(name: str, real: str | None, shim_dir: str, config: str | None = None,
              socket: str | None = None) -> int:
    """What a shim runs: the real ``name`` (never a shim) through the gate, argv from sys.argv."""
    from gridgate.core.logs import configure_logging

    configure_logging(0, False)
    if not real or not os.access(real, os.X_OK) or _same_dir(os.path.dirname(real), shim_dir):
        real = find_real(name, shim_dir)
    if real is None:
        print(f"gridgate gate: {name}: command not found (outside {shim_dir})", file=sys.stderr)
        return EXIT_NOT_FOUND
    section = _section(config)
    status = run_gated([real, *sys.argv[1:]], infer_category(name, section, sys.argv[1:]), name,
                       section, socket)
    return exit_like(status)
