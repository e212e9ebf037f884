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
import socket as sock
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from support.polling import until
from support.uids import AS_NOBODY

from gridgate.plugins.lsf_proxy.gate import shim as lean
from gridgate.plugins.lsf_proxy.gate.compiled import MARK, CompileError, fallback_name
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


#: What the Python shim beside a compiled one prints first, in these tests: it ran.
HANDED_OVER = "test: the compiled shim handed the call to its Python shim"


@pytest.fixture(params=["python", "compiled"])
def kind(request) -> str:
    """Each behaviour through the Python shim and through the compiled one."""
    return request.param


def shims_for(folder: Path, *names: str, kind: str = "python", **options: str) -> dict[str, str]:
    """Shims of ``kind`` for ``names`` in ``folder``/shims; the environment to run them with (a
    PATH of the shims first, then the system's folders, and no token of the test's own). A
    compiled shim's Python shim is wrapped so that it says when it runs (:data:`HANDED_OVER`)."""
    shims = folder / "shims"
    written = install_shims(shims, list(names), kind=kind, **options)
    assert {k for _, _, k in written} == {kind}, written
    if kind == "compiled":
        for name in names:
            fallback = shims / fallback_name(name)
            fallback.rename(shims / f".real-{name}")
            fallback.write_text(
                f"#!/bin/sh\necho '{HANDED_OVER}' >&2\nexec '{shims}/.real-{name}' \"$@\"\n"
            )
            fallback.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GRIDGATE_GATE_TOKEN"}
    env["PATH"] = f"{shims}{os.pathsep}/usr/bin{os.pathsep}/bin"
    return env


def run_as_nobody(
    argv: list[str], env: dict[str, str], lean: bool = True
) -> subprocess.CompletedProcess:
    """``argv`` as nobody; ``lean``: a shim (found on ``env``'s PATH) that must not have handed
    the call to the full gate: a Python shim run under ``-X importtime`` (no gridgate import),
    a compiled one must not have run its Python shim at all."""
    compiled = False
    if lean:
        shim = shutil.which(argv[0], path=env["PATH"])
        assert shim and "/shims/" in shim
        compiled = not Path(shim).read_bytes().startswith(b"#!")
        if not compiled:
            argv = [PYTHON, "-I", "-S", "-X", "importtime", shim, *argv[1:]]
    done = subprocess.run(
        AS_NOBODY + argv, capture_output=True, text=True, timeout=120, env=env, cwd="/"
    )
    if lean:
        assert not [n for n in imported(done.stderr) if n.startswith("gridgate")], done.stderr
        assert HANDED_OVER not in done.stderr
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
    install_shims(shims, ["printenv"], socket_path=daemon.socket, kind="python")
    assert old.exists() and not gone.exists()
    assert (shims / code_name(shim_code())).exists()
    kept.unlink()
    install_shims(shims, ["printenv", "squeue"], socket_path=daemon.socket, kind="python")
    assert not old.exists()
    with pytest.raises(ValueError, match="not a command name"):
        install_shims(shims, [old.name], socket_path=daemon.socket)


def test_a_granted_call_carries_its_token_and_gives_it_back_at_the_end(
    start_daemon, sockdir, kind
) -> None:
    daemon = start_daemon({"policies": "OTHER[max=4 nominal=4]"})
    env = shims_for(sockdir, "sleep", "printenv", socket_path=daemon.socket, kind=kind)
    holder = subprocess.Popen(AS_NOBODY + ["sleep", "60"], env=env, cwd="/")
    try:
        assert until(lambda: in_use(daemon)["other"] == 1)
    finally:
        holder.kill()
        holder.wait(30)
    assert until(lambda: in_use(daemon)["other"] == 0)


def test_no_daemon_proceeds_with_a_warning_or_fails_as_configured(sockdir, kind) -> None:
    missing = str(sockdir / "nobody-here.sock")
    env = shims_for(sockdir, "printenv", socket_path=missing, kind=kind)
    done = run_as_nobody(["printenv", "PATH"], env)
    assert done.returncode == 0 and done.stdout.strip() == env["PATH"], done.stderr
    assert "did not answer" in done.stderr and "proceeding without a token" in done.stderr
    config = client_config(sockdir, {"socket": missing, "when_unavailable": "fail"})
    (sockdir / "closed").mkdir(mode=0o755)
    env = shims_for(sockdir / "closed", "printenv", config=config, kind=kind)
    done = run_as_nobody(["printenv", "PATH"], env)
    assert done.returncode == EXIT_UNAVAILABLE and done.stdout == "", done.stderr
    assert "printenv: not run: no lsfproxyd answered" in done.stderr
    assert "(when_unavailable: fail)" in done.stderr


def test_a_blocked_user_is_refused_and_the_command_does_not_run(
    start_daemon, cli, sockdir, kind
) -> None:
    daemon = start_daemon({})
    env = shims_for(sockdir, "touch", socket_path=daemon.socket, kind=kind)
    assert cli("block", "-u", "nobody", "--socket", daemon.socket).returncode == 0
    marker = sockdir / "ran"
    # the refusal's wording is gridgate's own (wire.blocked_message): imported only then
    done = run_as_nobody(["touch", str(marker)], env, lean=False)
    assert done.returncode == EXIT_NO_TOKEN, done.stderr
    assert "touch: no other token, not run" in done.stderr
    assert "(user nobody is on the blocklist, until an administrator unblocks it)" in done.stderr
    assert not marker.exists()
    assert (HANDED_OVER in done.stderr) == (kind == "compiled")


def test_a_call_that_waits_past_the_limit_is_refused(start_daemon, sockdir, kind) -> None:
    daemon = start_daemon(
        {"policies": "OTHER[max=1 nominal=1]", "token_wait_time": 1, "notoken_ntries": 1}
    )
    env = shims_for(sockdir, "sleep", "touch", config=str(daemon.config), kind=kind)
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


def test_a_busy_users_command_runs_at_the_grants_nice(start_daemon, sockdir, kind) -> None:
    daemon = start_daemon({"policies": "OTHER[max=4 nominal=4]", "busy_after": 2, "busy_nice": 7})
    env = shims_for(sockdir, "sleep", "cat", socket_path=daemon.socket, kind=kind)
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


@pytest.mark.parametrize("path", ["shim", "compiled", "full gate"])
def test_nice_caller_gives_a_busy_users_loop_the_grants_nice(start_daemon, sockdir, path) -> None:
    daemon = start_daemon({"policies": "OTHER[max=4 nominal=4]", "busy_after": 2, "busy_nice": 7})
    config = Path(client_config(sockdir, {"socket": daemon.socket, "nice_caller": True}))
    kind = "compiled" if path == "compiled" else "python"
    env = shims_for(sockdir, "sleep", "cat", config=str(config), kind=kind)
    if path == "full gate":  # a config changed since install: the shim hands the call over
        config.write_text(config.read_text() + "# changed\n")
    # the caller: a shell that runs a gated cat, then prints its own niceness with a builtin.
    # Not a second gated cat: the first one's token goes back from its holder a moment after
    # it ended, and a compiled shim asks for the next so soon that nobody had two in flight,
    # busy at busy_after 2 (CI, 2026-12-07: the "alone" shell came out niced)
    loop = ["sh", "-c", 'cat /dev/null; read -r line < /proc/$$/stat; echo "$line"']
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
        if path != "full gate":
            shims_for(sockdir, "sleep", "cat", config=str(config), kind=kind)
        busy = run_as_nobody(loop, env, lean=False)
        assert busy.returncode == 0 and niceness(busy.stdout) == 0, busy.stderr
    finally:
        holder.kill()
        holder.wait(30)


def test_a_daemon_that_does_not_answer_is_passed_over_for_the_next(
    start_daemon, sockdir, kind
) -> None:
    daemon = start_daemon({})
    hosts = [
        {"name": "gone", "address": str(sockdir / "gone.sock")},
        {"name": "here", "address": daemon.socket},
    ]
    config = client_config(sockdir, {"hosts": hosts})
    env = shims_for(sockdir, "printenv", config=config, kind=kind)
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


@pytest.mark.parametrize(
    "line", ["{", "[1,2]", "{}x", '{"a":nul}', '{"a" 1}', "", "NaN", '{"a":1,}', '{"a":[1,]}']
)
def test_the_shims_reader_refuses_what_is_not_one_object(line: str) -> None:
    with pytest.raises(ValueError):
        lean.loads(line.encode())


def test_a_compiled_shim_hands_the_rare_calls_to_its_python_shim(start_daemon, sockdir) -> None:
    daemon = start_daemon({})
    config = Path(client_config(sockdir, {"socket": daemon.socket}))
    env = shims_for(sockdir, "printenv", config=str(config), kind="compiled")
    shims = sockdir / "shims"
    assert MARK in (shims / "printenv").read_bytes()
    assert not (shims / "printenv").read_bytes().startswith(b"#!")
    token = ["printenv", "GRIDGATE_GATE_TOKEN"]
    done = run_as_nobody(token, env)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    # a call inside a gated command (here with a token the daemon never gave), a socket named
    # in the environment, a config changed since install: the Python shim, every call gated
    ride = run_as_nobody(token, {**env, "GRIDGATE_GATE_TOKEN": "outer"}, lean=False)
    named = run_as_nobody(token, {**env, "GRIDGATE_PROXYD_SOCKET": daemon.socket}, lean=False)
    config.write_text(config.read_text() + "# changed\n")
    changed = run_as_nobody(token, env, lean=False)
    for done in (ride, named, changed):
        assert HANDED_OVER in done.stderr
    for done in (ride, named, changed):
        assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert until(lambda: in_use(daemon)["other"] == 0)


def test_a_compiled_shims_settings_are_data_not_c(start_daemon, sockdir) -> None:
    # a daemon whose socket path holds what C would read: quotes, backslashes, a trigraph
    odd = sockdir / 'q"\\??=%s'
    odd.mkdir(mode=0o755)
    daemon = start_daemon({"socket": str(odd / "p.sock")})
    env = shims_for(sockdir, "printenv", socket_path=daemon.socket, kind="compiled")
    done = run_as_nobody(["printenv", "GRIDGATE_GATE_TOKEN"], env)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert until(lambda: in_use(daemon)["other"] == 0)


class HandDaemon:
    """A Unix socket that answers every request with the lines given (what no real daemon
    says: the compiled shim's reader against lines it must read, or leave to the Python one)."""

    def __init__(self, path: Path, lines: list[str]) -> None:
        self.lines = lines
        self.server = sock.socket(sock.AF_UNIX, sock.SOCK_STREAM)
        self.server.bind(str(path))
        path.chmod(0o777)
        self.server.listen(16)
        self.requests: list[bytes] = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn: sock.socket) -> None:
        with conn:
            request = conn.makefile("rb").readline()
            self.requests.append(request)
            if b'"op":"acquire"' in request:
                conn.sendall("".join(f"{line}\n" for line in self.lines).encode())
                conn.recv(4096)  # the release, or the end of the connection


@pytest.mark.parametrize(
    ("lines", "token"),
    [
        # what the compiled shim reads: the grant among other keys, after a queued event
        (
            [
                '{"v":1,"event":"queued","request":1,"ahead":2}',
                '{"v":1,"id":1,"ok":true,"result":"granted","note":"caf\\u00e9 \\"q\\"",'
                '"limits":{"a":[1,-2.5e3,{}],"b":null},"waited":0.25,"token":"t-1","nice":0}',
            ],
            "t-1",
        ),
        (['{ "id" : 1 , "ok" : true , "result" : "granted" , "token" : "t-2" }'], "t-2"),
        # what it leaves to the Python shim: escapes in the token, a line that is not one object
        (['{"v":1,"id":1,"ok":true,"result":"granted","token":"t\\u002d3"}'], "t-3"),
        (['{"v":1,"id":1,"ok":true,"result":"granted","token":"t-4"} x'], ""),
        (['{"v":1,"id":1,"ok":true,"result":"granted","token":"t-5",}'], ""),
    ],
)
def test_the_compiled_shims_reader_takes_a_grant_or_leaves_the_line(
    sockdir, lines: list[str], token: str
) -> None:
    hand = HandDaemon(sockdir / "hand.sock", lines)
    env = shims_for(sockdir, "printenv", socket_path=str(sockdir / "hand.sock"), kind="compiled")
    done = run_as_nobody(["printenv", "GRIDGATE_GATE_TOKEN"], env, lean=False)
    handed = HANDED_OVER in done.stderr
    if token and not handed:  # read by the compiled shim itself
        assert done.returncode == 0 and done.stdout.strip() == token, done.stderr
        assert lines[-1].endswith("}") and "\\u002d" not in lines[-1]
    elif token:  # the Python shim read the line json's way
        assert done.returncode == 0 and done.stdout.strip() == token, done.stderr
        assert "\\u002d" in lines[-1]
    else:  # nobody reads it: not a JSON line, the call proceeds without a token (fail-open)
        assert handed and "not a JSON line" in done.stderr, done.stderr
        assert done.returncode == 1 and done.stdout == "", done.stderr
    assert hand.requests and all(b'"opcode":"printenv"' in r for r in hand.requests[:1])


def test_a_compiler_that_fails_leaves_the_shims_as_they_were(sockdir, monkeypatch) -> None:
    shims = sockdir / "shims"
    install_shims(shims, ["printenv"], socket_path=str(sockdir / "p.sock"), kind="python")
    before = {p.name: p.read_bytes() for p in shims.iterdir()}
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(CompileError, match="no C compiler"):
        install_shims(shims, ["printenv", "cat"], socket_path="/x.sock", kind="compiled")
    monkeypatch.setenv("CC", shutil.which("false", path="/usr/bin:/bin") or "/bin/false")
    with pytest.raises(CompileError, match="failed"):
        install_shims(shims, ["printenv", "cat"], socket_path="/x.sock", kind="compiled")
    assert {p.name: p.read_bytes() for p in shims.iterdir()} == before
    # auto without a compiler: Python shims, said so
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert install_shims(shims, ["cat"], socket_path="/x.sock") == [
        ("cat", shutil.which("cat"), "python")
    ]
