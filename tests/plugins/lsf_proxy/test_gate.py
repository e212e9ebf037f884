"""`gridgate gate`: category inference, passthrough of argv, streams and exit status, signals
forwarded, tokens returned whatever happens, refusals, and shims that never recurse."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.polling import until
from support.uids import AS_NOBODY

from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.gate.gate import find_real, infer_category, install_shims

PYTHON = sys.executable
#: An interpreter every user may run (this one may live in root's private home).
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or PYTHON


@pytest.mark.parametrize(
    ("command", "category"),
    [
        ("bsub", "submission"),
        ("/opt/lsf/bin/bmod", "submission"),
        ("brestart", "submission"),
        ("bswitch", "submission"),
        ("bjobs", "query"),
        ("bhosts", "query"),
        ("bqueues", "query"),
        ("bhist", "query"),
        ("sbatch", "submission"),
        ("squeue", "query"),
        ("sinfo", "query"),
        ("condor_submit", "submission"),
        ("condor_q", "query"),
        ("condor_status", "query"),
        ("qsub", "submission"),
        ("qstat", "query"),
        ("bkill", "other"),
        ("ls", "other"),
    ],
)
def test_category_inferred_from_the_command_name(command, category) -> None:
    assert infer_category(command) == category


def test_a_shim_loads_no_cli_schema_or_plugin_machinery() -> None:
    # A shim runs in front of every gated bjobs: what it imports is its start-up cost.
    probe = (
        "import sys, gridgate.plugins.lsf_proxy.gate.gating, gridgate.plugins.lsf_proxy.client.client\n"
        "heavy = ('click', 'jsonschema', 'yaml', 'stevedore', 'gridgate.core.config',"
        " 'gridgate.core.plugins', 'gridgate.core.cli')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    done = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_section_defaults_are_the_schema_defaults_the_config_loader_fills() -> None:
    from gridgate.core.config import apply_defaults
    from gridgate.plugins.lsf_proxy.config import SECTION_SCHEMA, section_defaults

    filled: dict = {}
    apply_defaults(filled, SECTION_SCHEMA)
    assert section_defaults() == filled
    section_defaults()["admins"].append("mallory")  # each call gets its own copy
    assert section_defaults()["admins"] == ["root"]


def test_config_categories_extend_the_map() -> None:
    assert infer_category("mystat", {"categories": {"query": ["mystat"]}}) == "query"


def in_use(_cli, socket: str) -> dict[str, int]:
    """Tokens in use per category, asked in-process (no CLI start-up on a loaded machine)."""
    with ProxyClient([Daemon("proxyd", socket)]) as client:
        [reply] = client.admin("status")
    cats = reply.reply["status"]["categories"]
    return {name: c["in_use"] for name, c in cats.items()}


def gate(exe: str, socket: str, *command: str, user: str = "root", **kwargs):
    argv = [exe, "gate", "--socket", socket, "--", *command]
    if user == "nobody":
        argv = AS_NOBODY + argv
    return subprocess.run(argv, capture_output=True, timeout=60, cwd="/", **kwargs)


def test_streams_argv_and_exit_code_pass_through(start_daemon, gridgate_exe) -> None:
    daemon = start_daemon({})
    code = (
        "import sys; data = sys.stdin.read(); print(sys.argv[1:], data.upper()); "
        "print('to stderr', file=sys.stderr); sys.exit(3)"
    )
    proc = gate(
        gridgate_exe,
        daemon.socket,
        PYTHON,
        "-c",
        code,
        "a b",
        "$(touch /x)",
        "'*'",
        input=b"hello\n",
    )
    assert proc.returncode == 3
    assert proc.stdout.decode() == "['a b', '$(touch /x)', \"'*'\"] HELLO\n\n"
    assert proc.stderr.decode().endswith("to stderr\n")
    assert not Path("/x").exists()


def test_the_command_sees_its_token_and_returns_it(start_daemon, gridgate_exe, cli) -> None:
    daemon = start_daemon({})
    proc = gate(gridgate_exe, daemon.socket, "printenv", "GRIDGATE_GATE_TOKEN", user="nobody")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    # the token holder gives it back as the command ends (just after, seen from here)
    assert until(lambda: in_use(cli, daemon.socket) == {"query": 0, "submission": 0, "other": 0})


def test_missing_command_takes_no_token(start_daemon, gridgate_exe) -> None:
    daemon = start_daemon({"diagnose": True})
    proc = gate(gridgate_exe, daemon.socket, "no-such-command-here")
    assert proc.returncode == 127
    assert b"no-such-command-here: command not found" in proc.stderr


def test_a_blocked_user_is_refused_with_a_clear_message(
    start_daemon, gridgate_exe, cli, sockdir
) -> None:
    daemon = start_daemon({})
    assert cli("block", "-u", "nobody", "--socket", daemon.socket).returncode == 0
    marker = sockdir / "ran"
    proc = gate(gridgate_exe, daemon.socket, "/usr/bin/touch", str(marker), user="nobody")
    assert proc.returncode == 75
    assert b"touch: no other token, not run" in proc.stderr and b"blocked" in proc.stderr
    # who blocked it and until when (issue 40 item 11): an administrator's rule, no end
    assert (
        b"request blocked by the lsfproxyd administrator (user nobody is on the blocklist, "
        b"until an administrator unblocks it)" in proc.stderr
    ), proc.stderr
    assert not marker.exists()
    assert cli("unblock", "-u", "nobody", "--socket", daemon.socket).returncode == 0
    assert cli("block", "all", "--socket", daemon.socket).returncode == 0
    proc = gate(gridgate_exe, daemon.socket, "/usr/bin/touch", str(marker), user="nobody")
    assert proc.returncode == 75 and b"(all requests is on the blocklist" in proc.stderr
    # one daemon: nothing promises another one (it warns "did not answer" and proceeds)
    daemon.stop()
    proc = gate(gridgate_exe, daemon.socket, "/usr/bin/touch", str(marker))
    assert proc.returncode == 0 and b"did not answer" in proc.stderr, proc.stderr
    assert b"trying the next" not in proc.stderr


def _start_waiting_child(exe: str, socket: str, sockdir: Path, trap: bool):
    ready = sockdir / "ready"
    got = sockdir / "got"
    code = (
        "import os, signal, sys, time\n"
        f"got = {str(got)!r}\n"
        "def on(sig, frame):\n"
        "    open(got, 'a').write(signal.Signals(sig).name + '\\n')\n"
        "    sys.exit(7)\n"
        + (
            "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, on)\n"
            if trap
            else ""
        )
        + f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [exe, "gate", "--socket", socket, "--category", "query", "--", PYTHON, "-c", code],
        cwd="/",
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "child never started"
        time.sleep(0.05)
    return proc, got


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signals_are_forwarded_to_the_command(
    start_daemon, gridgate_exe, cli, sockdir, sig
) -> None:
    daemon = start_daemon({})
    proc, got = _start_waiting_child(gridgate_exe, daemon.socket, sockdir, trap=True)
    assert in_use(cli, daemon.socket)["query"] == 1
    os.kill(proc.pid, sig)  # only the gate is signalled: the child hears it from the gate
    assert proc.wait(120) == 7
    assert got.read_text().split() == [sig.name]
    assert until(lambda: in_use(cli, daemon.socket)["query"] == 0)


def test_token_returned_when_the_command_is_killed(
    start_daemon, gridgate_exe, cli, sockdir
) -> None:
    daemon = start_daemon({})
    proc, _ = _start_waiting_child(gridgate_exe, daemon.socket, sockdir, trap=False)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(120) == -signal.SIGTERM  # the gate dies the way its command did
    assert until(lambda: in_use(cli, daemon.socket)["query"] == 0)


def test_token_returned_when_the_gate_itself_is_killed(
    start_daemon, gridgate_exe, cli, sockdir
) -> None:
    daemon = start_daemon({})
    proc, _ = _start_waiting_child(gridgate_exe, daemon.socket, sockdir, trap=False)
    assert in_use(cli, daemon.socket)["query"] == 1
    os.killpg(proc.pid, signal.SIGKILL)  # gate and command, as a crash or the OOM killer would
    proc.wait(30)
    deadline = time.monotonic() + 20
    while in_use(cli, daemon.socket)["query"] and time.monotonic() < deadline:
        time.sleep(0.1)  # the daemon notices the closed connection asynchronously
    assert in_use(cli, daemon.socket)["query"] == 0


# --- shims -----------------------------------------------------------------------------------


@pytest.fixture
def real_bin(sockdir) -> Path:
    """A directory of 'real' batch commands that print their argv and gate token."""
    folder = sockdir / "real"
    folder.mkdir()
    folder.chmod(0o755)
    for name in ("bjobs", "bsub", "squeue"):
        path = folder / name
        path.write_text(
            f"#!{SYSTEM_PYTHON}\nimport json, os, sys\n"
            f"print(json.dumps({{'real': {name!r}, 'argv': sys.argv[1:], "
            "'token': os.environ.get('GRIDGATE_GATE_TOKEN')}))\n"
        )
        path.chmod(0o755)
    return folder


def test_install_shims_wraps_what_is_on_path(real_bin, sockdir, monkeypatch) -> None:
    shims = sockdir / "shims"
    # Only the test's own folders: the machine may have real batch commands (Slurm's
    # squeue, sbatch, sinfo...) in /usr/bin, which would be shimmed too.
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{real_bin}")
    written = {name: real for name, real, _kind in install_shims(shims)}
    assert written == {
        "bjobs": str(real_bin / "bjobs"),
        "bsub": str(real_bin / "bsub"),
        "squeue": str(real_bin / "squeue"),
    }
    # the shims' own directory is never where the real command is looked for
    assert find_real("bjobs") == str(shims / "bjobs")
    assert find_real("bjobs", shims) == str(real_bin / "bjobs")


def test_shims_run_the_real_command_through_the_gate(
    start_daemon, real_bin, sockdir, gridgate_exe
) -> None:
    log = sockdir / "diag.log"
    daemon = start_daemon({"diagnose": True, "diagnose_file": str(log)})
    shims = sockdir / "shims"
    # PATH holds the shims, the stand-ins and setpriv, nothing the machine may have besides
    # (Debian's gridengine-client puts a real qstat in /usr/bin)
    system = sockdir / "system"
    system.mkdir(mode=0o755)
    (system / "setpriv").symlink_to(
        shutil.which("setpriv", path="/usr/bin:/bin") or "/usr/bin/setpriv"
    )
    path = f"{shims}{os.pathsep}{real_bin}{os.pathsep}{system}"
    out = subprocess.run(
        [
            gridgate_exe,
            "gate",
            "--install-shims",
            str(shims),
            "--socket",
            daemon.socket,
            "--shim",
            "bjobs",
            "--shim",
            "squeue",
            "--shim",
            "qstat",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": path},
    )
    assert out.returncode == 0, out.stderr
    assert "qstat -> (looked up on PATH when run)" in out.stdout
    env = {**os.environ, "PATH": path}
    env.pop("GRIDGATE_GATE_TOKEN", None)
    run = subprocess.run(
        AS_NOBODY + ["bjobs", "-u", "all", "a b"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/",
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["real"] == "bjobs" and answer["argv"] == ["-u", "all", "a b"] and answer["token"]
    assert " QUERY_REQ,BATCH_JOB_QUERY,nobody," in log.read_text()
    missing = subprocess.run(["qstat"], capture_output=True, text=True, timeout=60, env=env)
    assert missing.returncode == 127 and "qstat: command not found" in missing.stderr
    # a shim found again inside a gated command runs the real one at once, with no new token
    nested = subprocess.run(
        [gridgate_exe, "gate", "--socket", daemon.socket, "--", "squeue"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert nested.returncode == 0, nested.stderr
    assert json.loads(nested.stdout)["real"] == "squeue"
    # logged twice: the outer request (it waited for its grant) and the nested call's ride on
    # that token, a grant of no wait (issue 31, item 9: rides are logged and counted)
    lines = [ln for ln in log.read_text().splitlines() if ",REQUEST_JOB_INFO," in ln]
    assert len(lines) == 2 and lines[1].split(",")[4:6] == ["0", "1"]


def test_the_fast_path_spells_each_option_as_the_gate_command_does() -> None:
    """`gridgate gate` has two parsers: the launcher's fast path and click's command (for
    help, usage errors, --install-shims). Each flag the fast path takes is the click
    command's, for the same parameter (issue 40 item 8's class: one option, one meaning)."""
    from gridgate.plugins.lsf_proxy.gate import gating
    from gridgate.plugins.lsf_proxy.gate.gate import gate_command

    by_flag = {flag: p.name for p in gate_command.params for flag in p.opts}
    taken = {**gating._VALUED, "-q": "quiet", "--quiet": "quiet"}
    assert {flag: by_flag.get(flag) for flag in taken} == taken
