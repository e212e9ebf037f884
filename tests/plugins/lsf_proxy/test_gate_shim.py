"""The shim ``--install-shims`` writes: one self-contained script that imports only what a
token exchange needs (read from ``-X importtime`` of a real run against a real daemon), and
keeps the gate's behaviours on its own path: the token carried and given back when the command
ends, fail-open or closed per ``when_unavailable``, blocked users, the grant's nice, the wait
limit, several daemons. Every call runs as ``nobody`` with a PATH the test sets."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.polling import until
from support.uids import AS_NOBODY

from gridgate.plugins.lsf_proxy.gate import shim as lean
from gridgate.plugins.lsf_proxy.gate.gate import CODE_PREFIX, code_name, install_shims, shim_code
from gridgate.plugins.lsf_proxy.gate.gating import EXIT_NO_TOKEN, EXIT_UNAVAILABLE

PYTHON = sys.executable

#: What a shim may import beyond what the interpreter's own start reports: the C socket module.
#: Not ``socket`` (enum, selectors), ``json`` or ``_json`` (a dynamic library: the shim reads the
#: daemon's compact replies itself), ``re``, ``os``, ``binascii`` or any gridgate module.
ALLOWED = {"_socket"}


def imported(stderr: str) -> list[str]:
    """Every module ``-X importtime`` reports, by its full name, in order."""
    names = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.append(name)
    return names


def shims_for(folder: Path, *names: str, **options: str) -> dict[str, str]:
    """Shims for ``names`` in ``folder``/shims; the environment to run them with (a PATH of
    the shims first, then the system's folders, and no token of the test's own)."""
    shims = folder / "shims"
    install_shims(shims, list(names), **options)
    env = {k: v for k, v in os.environ.items() if k != "GRIDGATE_GATE_TOKEN"}
    env["PATH"] = f"{shims}{os.pathsep}/usr/bin{os.pathsep}/bin"
    return env


def run_as_nobody(
    argv: list[str], env: dict[str, str], lean: bool = True
) -> subprocess.CompletedProcess:
    """``argv`` as nobody; ``lean``: a shim (found on ``env``'s PATH) run under ``-X
    importtime``, which must not have handed the call to the full gate (no gridgate import)."""
    if lean:
        shim = shutil.which(argv[0], path=env["PATH"])
        assert shim and "/shims/" in shim
        argv = [PYTHON, "-I", "-S", "-X", "importtime", shim, *argv[1:]]
    done = subprocess.run(
        AS_NOBODY + argv, capture_output=True, text=True, timeout=120, env=env, cwd="/"
    )
    if lean:
        assert not [n for n in imported(done.stderr) if n.startswith("gridgate")], done.stderr
    return done


def client_config(folder: Path, section: dict) -> str:
    """A config file holding only a ``proxyd:`` section, readable by everyone."""
    path = folder / f"client-{len(list(folder.glob('client-*')))}.yaml"
    path.write_text(yaml.safe_dump({"proxyd": section}), encoding="utf-8")
    path.chmod(0o644)
    return str(path)


def in_use(daemon) -> dict[str, int]:
    return {name: c["in_use"] for name, c in daemon.status()["categories"].items()}


def niceness(stat: str) -> int:
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_a_shim_imports_only_what_a_token_exchange_needs(start_daemon, sockdir) -> None:
    daemon = start_daemon({})
    env = shims_for(sockdir, "printenv", socket_path=daemon.socket)
    # the shebang's own flags, with -X importtime: the real run of a granted call
    done = run_as_nobody(["printenv", "GRIDGATE_GATE_TOKEN"], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the command ran without a token"
    bare = [PYTHON, "-I", "-S", "-X", "importtime", "-c", "pass"]
    base = set(imported(run_as_nobody(bare, env, lean=False).stderr))
    names = imported(done.stderr)
    assert set(names) - base - ALLOWED == set(), names
    assert not {"socket", "json", "enum", "re", "os"} & set(names)
    assert "_socket" in names
    # the token went back when the command ended (its holder saw it end)
    assert until(lambda: in_use(daemon)["other"] == 0)


def test_the_shim_is_a_script_of_its_settings_and_a_shared_code_file(start_daemon, sockdir) -> None:
    daemon = start_daemon({})
    env = shims_for(sockdir, "printenv", "squeue", socket_path=daemon.socket)
    shims = sockdir / "shims"
    text = (shims / "squeue").read_text()
    assert text.startswith(f"#!{PYTHON} -IS\n")
    head = text[: text.index("\nCONF = ")]
    assert [ln for ln in head.splitlines() if "import" in ln] == ["import marshal", "import sys"]
    conf = ast.literal_eval(text.split("\nCONF = ", 1)[1].split("\n", 1)[0])
    assert conf["request"] == {
        "query": '{"v":1,"id":1,"op":"acquire","category":"query","opcode":"squeue","size":'
    }
    assert conf["socket"] == daemon.socket and conf["real"] == shutil.which("squeue")
    # one code file for the folder, named in every shim, which only root may change
    (code,) = shims.glob(f"{CODE_PREFIX}*")
    assert code.name in text and code.name in (shims / "printenv").read_text()
    assert code.stat().st_mode & 0o777 == 0o644
    assert code.read_bytes() == shim_code() and code.name == code_name(shim_code())

    # an interpreter whose bytecode is another than the one the code was compiled for (Python
    # upgraded since install) runs the full gate instead: the call is still gated
    blob = code.read_bytes()
    code.write_bytes(b"\x00\x00\r\n" + blob[4:])
    done = run_as_nobody(["printenv", "GRIDGATE_GATE_TOKEN"], env, lean=False)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    # and so does a shim whose code file is gone
    code.unlink()
    done = run_as_nobody(["printenv", "GRIDGATE_GATE_TOKEN"], env, lean=False)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr


def test_installing_again_drops_the_code_no_shim_names(start_daemon, sockdir) -> None:
    daemon = start_daemon({})
    shims = sockdir / "shims"
    shims_for(sockdir, "printenv", "squeue", socket_path=daemon.socket)
    # the code of an older gridgate, still named by one of its shims
    old = shims / f"{CODE_PREFIX}0123456789abcdef.code"
    old.write_bytes(shim_code())
    kept = shims / "sleep"
    kept.write_text((shims / "squeue").read_text().replace(code_name(shim_code()), old.name))
    # and one no shim names
    gone = shims / f"{CODE_PREFIX}fedcba9876543210.code"
    gone.write_bytes(b"old")
    install_shims(shims, ["printenv"], socket_path=daemon.socket)
    assert old.exists() and not gone.exists()
    assert (shims / code_name(shim_code())).exists()
    kept.unlink()
    install_shims(shims, ["printenv", "squeue"], socket_path=daemon.socket)
    assert not old.exists()
    with pytest.raises(ValueError, match="not a command name"):
        install_shims(shims, [old.name], socket_path=daemon.socket)


def test_a_granted_call_carries_its_token_and_gives_it_back_at_the_end(
    start_daemon, sockdir
) -> None:
    daemon = start_daemon({"policies": "OTHER[max=4 nominal=4]"})
    env = shims_for(sockdir, "sleep", "printenv", socket_path=daemon.socket)
    holder = subprocess.Popen(AS_NOBODY + ["sleep", "60"], env=env, cwd="/")
    try:
        assert until(lambda: in_use(daemon)["other"] == 1)
    finally:
        holder.kill()
        holder.wait(30)
    assert until(lambda: in_use(daemon)["other"] == 0)


def test_no_daemon_proceeds_with_a_warning_or_fails_as_configured(sockdir) -> None:
    missing = str(sockdir / "nobody-here.sock")
    env = shims_for(sockdir, "printenv", socket_path=missing)
    done = run_as_nobody(["printenv", "PATH"], env)
    assert done.returncode == 0 and done.stdout.strip() == env["PATH"], done.stderr
    assert "did not answer" in done.stderr and "proceeding without a token" in done.stderr
    config = client_config(sockdir, {"socket": missing, "when_unavailable": "fail"})
    (sockdir / "closed").mkdir(mode=0o755)
    env = shims_for(sockdir / "closed", "printenv", config=config)
    done = run_as_nobody(["printenv", "PATH"], env)
    assert done.returncode == EXIT_UNAVAILABLE and done.stdout == "", done.stderr
    assert "printenv: not run: no lsfproxyd answered" in done.stderr
    assert "(when_unavailable: fail)" in done.stderr


def test_a_blocked_user_is_refused_and_the_command_does_not_run(start_daemon, cli, sockdir) -> None:
    daemon = start_daemon({})
    env = shims_for(sockdir, "touch", socket_path=daemon.socket)
    assert cli("block", "-u", "nobody", "--socket", daemon.socket).returncode == 0
    marker = sockdir / "ran"
    # the refusal's wording is gridgate's own (wire.blocked_message): imported only then
    done = run_as_nobody(["touch", str(marker)], env, lean=False)
    assert done.returncode == EXIT_NO_TOKEN, done.stderr
    assert "touch: no other token, not run" in done.stderr
    assert "(user nobody is on the blocklist, until an administrator unblocks it)" in done.stderr
    assert not marker.exists()


def test_a_call_that_waits_past_the_limit_is_refused(start_daemon, sockdir) -> None:
    daemon = start_daemon(
        {"policies": "OTHER[max=1 nominal=1]", "token_wait_time": 1, "notoken_ntries": 1}
    )
    env = shims_for(sockdir, "sleep", "touch", config=str(daemon.config))
    holder = subprocess.Popen(AS_NOBODY + ["sleep", "60"], env=env, cwd="/")
    try:
        assert until(lambda: in_use(daemon)["other"] == 1)
        marker = sockdir / "ran"
        done = run_as_nobody(["touch", str(marker)], env)
        assert done.returncode == EXIT_NO_TOKEN, done.stderr
        assert "no token after 1 attempt(s), last: timeout" in done.stderr
        assert not marker.exists()
    finally:
        holder.kill()
        holder.wait(30)


def test_a_busy_users_command_runs_at_the_grants_nice(start_daemon, sockdir) -> None:
    daemon = start_daemon({"policies": "OTHER[max=4 nominal=4]", "busy_after": 2, "busy_nice": 7})
    env = shims_for(sockdir, "sleep", "cat", socket_path=daemon.socket)
    alone = run_as_nobody(["cat", "/proc/self/stat"], env)
    assert alone.returncode == 0 and niceness(alone.stdout) == 0, alone.stderr
    # its token goes back from the shim's holder once the command ended, a moment later: the
    # next call counted beside it would be the user's second, and busy (seen once in CI)
    assert until(lambda: in_use(daemon)["other"] == 0)
    holder = subprocess.Popen(AS_NOBODY + ["sleep", "60"], env=env, cwd="/")
    try:
        assert until(lambda: in_use(daemon)["other"] == 1)
        busy = run_as_nobody(["cat", "/proc/self/stat"], env)
        assert busy.returncode == 0 and niceness(busy.stdout) == 7, busy.stderr
        # the holder, forked before the grant, keeps its own priority
        assert niceness(Path(f"/proc/{holder.pid}/stat").read_text()) == 0
    finally:
        holder.kill()
        holder.wait(30)


@pytest.mark.parametrize("path", ["shim", "full gate"])
def test_nice_caller_gives_a_busy_users_loop_the_grants_nice(start_daemon, sockdir, path) -> None:
    daemon = start_daemon({"policies": "OTHER[max=4 nominal=4]", "busy_after": 2, "busy_nice": 7})
    config = Path(client_config(sockdir, {"socket": daemon.socket, "nice_caller": True}))
    env = shims_for(sockdir, "sleep", "cat", config=str(config))
    if path == "full gate":  # a config changed since install: the shim hands the call over
        config.write_text(config.read_text() + "# changed\n")
    # the caller: a shell that runs a gated cat, then prints its own niceness
    loop = ["sh", "-c", "cat /dev/null; cat /proc/$$/stat"]
    alone = run_as_nobody(loop, env, lean=False)
    assert alone.returncode == 0 and niceness(alone.stdout) == 0, alone.stderr
    assert until(lambda: in_use(daemon)["other"] == 0)
    holder = subprocess.Popen(AS_NOBODY + ["sleep", "60"], env=env, cwd="/")
    try:
        assert until(lambda: in_use(daemon)["other"] == 1)
        busy = run_as_nobody(loop, env, lean=False)
        assert busy.returncode == 0 and niceness(busy.stdout) == 7, busy.stderr
        # without nice_caller only the command is niced, not the shell that ran it
        config.write_text(yaml.safe_dump({"proxyd": {"socket": daemon.socket}}))
        if path == "shim":
            install_shims(sockdir / "shims", ["sleep", "cat"], config=str(config))
        busy = run_as_nobody(loop, env, lean=False)
        assert busy.returncode == 0 and niceness(busy.stdout) == 0, busy.stderr
    finally:
        holder.kill()
        holder.wait(30)


def test_a_daemon_that_does_not_answer_is_passed_over_for_the_next(start_daemon, sockdir) -> None:
    daemon = start_daemon({})
    hosts = [
        {"name": "gone", "address": str(sockdir / "gone.sock")},
        {"name": "here", "address": daemon.socket},
    ]
    config = client_config(sockdir, {"hosts": hosts})
    env = shims_for(sockdir, "printenv", config=config)
    # either order of the random rotation: each run gets its token from the live one
    for _ in range(4):
        done = run_as_nobody(["printenv", "GRIDGATE_GATE_TOKEN"], env)
        assert done.returncode == 0 and done.stdout.strip(), done.stderr
        assert "proceeding without a token" not in done.stderr


@pytest.mark.parametrize(
    "line",
    [
        '{"v":1,"id":1,"ok":true,"result":"granted","category":"query","waited":0.0,'
        '"token":"5f3a9e01-17","lease":300.0,"privileged":false,"nice":7}',
        '{"v":1,"event":"queued","request":1,"ahead":3}',
        '{"v":1,"id":null,"ok":false,"error":{"code":"busy","message":"no room"}}',
        '{"v":1,"id":1,"ok":true,"result":"denied","reason":"blocked","block":{"by":"bypass",'
        '"rule":"users","name":"bob","until":1.7644e9,"audit":"h2"},"list":[1,-2.5,[],{}]}',
        '{"a":"caf\\u00e9 \\"q\\"","b":"é"}',
        '{ "spaced" : [ 1 , 2 ] }',
        "{}",
    ],
)
def test_the_shims_reader_reads_a_reply_as_json_does(line: str) -> None:
    assert lean.loads(line.encode()) == json.loads(line)


@pytest.mark.parametrize("line", ["{", "[1,2]", "{}x", '{"a":nul}', '{"a" 1}', "", "NaN"])
def test_the_shims_reader_refuses_what_is_not_one_object(line: str) -> None:
    with pytest.raises(ValueError):
        lean.loads(line.encode())
