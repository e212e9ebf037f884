"""The token daemon as a real process on real sockets, used by root and by ``nobody``."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest
import yaml
from support.polling import until
from support.ports import free_port
from support.uids import AS_NOBODY

from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient, ProxyUnavailable

PYTHON = sys.executable

pytestmark = pytest.mark.timeout(300)


def talk(path: str, *lines: bytes, timeout: float = 10) -> list[dict]:
    """Send raw lines, read one reply per line."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(b"".join(lines))
        return _read(sock, len(lines))


def _read(sock: socket.socket, count: int) -> list[dict]:
    data = b""
    while data.count(b"\n") < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return [json.loads(x) for x in data.splitlines()[:count]]


def hello(path: str) -> dict:
    return talk(path, b'{"v":1,"id":1,"op":"hello"}\n')[0]


def status(path: str) -> dict:
    (reply,) = talk(path, b'{"v":1,"id":1,"op":"status"}\n')
    assert reply["ok"], reply
    return reply["status"]


CLIENT = """
import json, sys
from gridgate.plugins.lsf_proxy.client.client import ProxyClient, Daemon, NoToken
c = ProxyClient([Daemon("d", {sock!r})], notoken_ntries={ntries}, when_unavailable="fail")
try:
    t = c.acquire({category!r}, {opcode!r}, 12)
except NoToken as exc:
    print(json.dumps({{"denied": exc.reason}}), flush=True)
    sys.exit(3)
print(json.dumps({{"token": t.id, "proceed": t.proceed, "reason": t.reason,
                  "privileged": t.privileged}}), flush=True)
{after}
"""


def client_code(sock, category="query", opcode="BATCH_JOB_QUERY", ntries=1, after="t.release()"):
    return CLIENT.format(
        sock=str(sock), category=category, opcode=opcode, ntries=ntries, after=after
    )


def test_identity_comes_from_peer_credentials(start_daemon, py_as):
    d = start_daemon({})
    root = hello(d.socket)
    assert (root["user"], root["admin"]) == ("root", True)
    code = (
        f"import socket; s=socket.socket(socket.AF_UNIX); s.connect({d.socket!r}); "
        's.sendall(b\'{"v":1,"id":1,"op":"hello","user":"root"}\\n\'); '
        "print(s.recv(4096).decode())"
    )
    out = py_as(code)
    reply = json.loads(out.stdout)
    assert (reply["user"], reply["admin"]) == ("nobody", False)  # a claimed user is ignored


def test_admin_commands_refused_to_ordinary_users(start_daemon, cli, py_as):
    d = start_daemon({})
    ops = [
        {"op": "status"},
        {"op": "block", "users": ["x"]},
        {"op": "unblock", "all": True},
        {"op": "disable", "category": "all"},
        {"op": "enable", "category": "query"},
        {"op": "blocklist"},
        {"op": "diagnose", "on": True},
        {"op": "reconfig"},
    ]
    lines = b"".join(
        json.dumps({"v": 1, "id": i, **op}).encode() + b"\n" for i, op in enumerate(ops)
    )
    code = (
        f"import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect({d.socket!r}); "
        f"s.sendall({lines!r}); data = b''\n"
        f"while data.count(b'\\n') < {len(ops)}:\n    data += s.recv(65536)\n"
        "sys.stdout.write(data.decode())"
    )
    out = py_as(code)
    replies = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["error"]["code"] for r in replies] == ["forbidden"] * len(ops), out.stderr
    for args in (["status"], ["block", "-u", "x"]):  # and the command line says so
        refused = cli(*args, "--socket", d.socket, user="nobody")
        assert refused.returncode == 1, (args, refused.stdout, refused.stderr)
        assert "permission denied" in refused.stderr
    assert cli("blocklist", "--socket", d.socket).returncode == 0
    after = status(d.socket)
    assert all(c["enabled"] for c in after["categories"].values())
    assert not after["diagnose"]


def test_configured_admin_accepted(start_daemon, cli):
    d = start_daemon({"admins": ["root", "nobody"]})
    done = cli("block", "-u", "user9", "--socket", d.socket, user="nobody")
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip()
        == f"Users <user9> added to the blocklist on lsfproxyd host <{d.info['name']}>"
    )


def test_seed_block_unblock_sequence(start_daemon, cli, py_as):
    # no sample period ends during the test: "current" counts all of it
    d = start_daemon({"sample_period": 86400})
    name = d.info["name"]

    def run(*args):
        out = cli(*args, "--socket", d.socket)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert (
        run("block", "-u", "user1 user2", "-m", "host1")
        == f"<user1@host1 user2@host1> added to the blocklist on lsfproxyd host <{name}>"
    )
    assert (
        run("block", "-u", "user1")
        == f"Users <user1> added to the blocklist on lsfproxyd host <{name}>"
    )
    assert (
        run("block", "-m", "hostA hostB")
        == f"Hosts <hostA hostB> added to the blocklist on lsfproxyd host <{name}>"
    )
    assert (
        run("unblock", "-u", "user1")
        == f"Users <user1> removed from the blocklist on lsfproxyd host <{name}>"
    )
    assert (
        run("unblock", "all") == f"<all> is not a rule of the blocklist on lsfproxyd host <{name}>"
    )
    assert run("blocklist").splitlines() == [
        f"lsfproxyd host - {name}",
        "  Blocked all:           No",
        "  Blocked users:         -",
        "  Blocked hosts:         hostA hostB",
        "  Blocked users@hosts:   user1@host1 user2@host1",
    ]
    # a block rule really stops an ordinary user, with no retry
    assert run("block", "-u", "nobody").startswith("Users <nobody> added")
    out = py_as(client_code(d.socket, ntries=5))
    assert out.returncode == 3 and json.loads(out.stdout) == {"denied": "blocked"}
    assert run("block", "all") == f"<all> added to the blocklist on lsfproxyd host <{name}>"
    assert run("unblock", "all") == f"<all> removed from the blocklist on lsfproxyd host <{name}>"
    assert status(d.socket)["metrics"]["blocked"]["current"] == 1
    as_json = json.loads(cli("blocklist", "--json", "--socket", d.socket).stdout)
    assert as_json["hosts"][0]["reply"]["blocklist"]["users"] == ["nobody"]


def test_seed_block_examples_each_element_a_rule(start_daemon, cli):
    """The seed's block/unblock examples, as printed there; each named element is a rule."""
    d = start_daemon({})
    name = d.info["name"]

    def run(*args):
        out = cli(*args, "--socket", d.socket)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().replace(f"<{name}>", "<lsfproxydhost1>")

    assert run("block", "all") == "<all> added to the blocklist on lsfproxyd host <lsfproxydhost1>"
    assert (
        run("unblock", "all")
        == "<all> removed from the blocklist on lsfproxyd host <lsfproxydhost1>"
    )
    assert (
        run("block", "-u", "user1 user2")
        == "Users <user1 user2> added to the blocklist on lsfproxyd host <lsfproxydhost1>"
    )
    assert (
        run("unblock", "-u", "user1")
        == "Users <user1> removed from the blocklist on lsfproxyd host <lsfproxydhost1>"
    )
    assert (
        run("block", "-m", "hostA hostB")
        == "Hosts <hostA hostB> added to the blocklist on lsfproxyd host <lsfproxydhost1>"
    )
    assert run("block", "-u", "user1 user2", "-m", "hostA hostB") == (
        "<user1@hostA user1@hostB user2@hostA user2@hostB> added to the blocklist on "
        "lsfproxyd host <lsfproxydhost1>"
    )
    assert (
        run("unblock", "-u", "user1", "-m", "hostA hostB")
        == "<user1@hostA user1@hostB> removed from the blocklist on lsfproxyd host <lsfproxydhost1>"
    )
    # partly known: one line for what changed, one for what did not
    assert run("block", "-u", "user3 user2").splitlines() == [
        "Users <user3> added to the blocklist on lsfproxyd host <lsfproxydhost1>",
        "Users <user2> is already in the blocklist on lsfproxyd host <lsfproxydhost1>",
    ]
    assert run("blocklist").splitlines()[1:] == [
        "  Blocked all:           No",
        "  Blocked users:         user2 user3",  # in blocking order
        "  Blocked hosts:         hostA hostB",
        "  Blocked users@hosts:   user2@hostA user2@hostB",
    ]


def test_disable_means_proceed_without_token(start_daemon, cli, py_as):
    d = start_daemon({})
    out = cli("disable", "query", "--socket", d.socket)
    assert out.stdout.splitlines() == [
        "lsfproxyd service status:",
        "  QUERY:DISABLED",
        "  SUBMISSION:ENABLED",
        "  OTHER:ENABLED",
    ]
    got = json.loads(py_as(client_code(d.socket)).stdout)
    assert got == {"token": "", "proceed": True, "reason": "disabled", "privileged": False}
    got = json.loads(py_as(client_code(d.socket, "submission", "BATCH_JOB_SUB")).stdout)
    assert got["token"] and not got["proceed"]
    text = cli("status", "--socket", d.socket).stdout
    assert "  QUERY: DISABLED" in text and "  SUBMISSION: ENABLED" in text
    cli("enable", "all", "--socket", d.socket)
    assert all(c["enabled"] for c in status(d.socket)["categories"].values())


def test_status_text_matches_the_seed(start_daemon, cli):
    d = start_daemon({"policies": "QUERY[max=100 nominal=50] SUBMISSION[max=30] OTHER[max=100]"})
    with ProxyClient([Daemon("d", d.socket)]) as client:
        held = [client.acquire("query", "BATCH_JOB_QUERY") for _ in range(3)]
        lines = cli("status", "--socket", d.socket).stdout.splitlines()
        for token in held:
            token.release()
    assert lines[:8] == [
        "",
        "lsfproxyd service status:",
        "  QUERY: ENABLED",
        "  SUBMISSION: ENABLED",
        "  OTHER: ENABLED",
        "",
        "lsfproxyd host status:",
        f"  HOSTNAME: {d.info['name']}",
    ]
    assert lines[8:14] == [
        "  STATUS: CONNECTED",
        f"  PID: {d.pid}",
        "             TOKEN_LIMIT  TOKENS_IN_USE_TOTAL  TOKENS_IN_USE_PRIVILEGED",
        "  QUERY      100          3                    3",
        "  SUBMISSION 30           0                    0",
        "  OTHER      100          0                    0",
    ]
    assert lines[15].startswith("lsfproxyd started:              ")
    assert lines[17] == "Sample period:                  60 Seconds"
    assert (
        lines[19]
        == "Metrics                                           Last         Max         Avg"
    )
    assert (
        lines[22]
        == "     Query                                           0           0           0"
    )
    # the seed's table ends with the Error row; the longest-held tokens follow it
    error = lines.index(
        "Error                                                0           0           0"
    )
    assert lines[error + 1 : error + 3] == [
        "",
        "  LONGEST_HELD  USER@HOST               COMMAND             CATEGORY    RETURNED_IN",
    ]
    assert len(lines) == error + 6
    for line in lines[error + 3 :]:
        assert line.split()[1].startswith("root@") and line.split()[2:4] == [
            "BATCH_JOB_QUERY",
            "QUERY",
        ]


def test_status_names_a_per_user_cap_below_the_seeds_table(start_daemon, cli):
    d = start_daemon({"policies": "QUERY[max=4 nominal=4 user_max=3] OTHER[max=100]"})
    lines = cli("status", "--socket", d.socket).stdout.splitlines()
    table = lines.index("  OTHER      100          0                    0")
    assert lines[table + 1] == "  TOKEN_LIMIT_PER_USER: QUERY=3"
    assert status(d.socket)["categories"]["query"]["user_max"] == 3


def test_killed_client_does_not_leak_its_token(start_daemon):
    d = start_daemon({})
    holder = subprocess.Popen(
        [*AS_NOBODY, PYTHON, "-c", client_code(d.socket, after="import time; time.sleep(600)")],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        got = json.loads(holder.stdout.readline())
        assert got["token"] and not got["privileged"]
        assert status(d.socket)["categories"]["query"]["in_use"] == 1
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert until(lambda: status(d.socket)["categories"]["query"]["in_use"] == 0)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)
        holder.stdout.close()


def test_sighup_and_reconfig_reload(start_daemon, cli):
    d = start_daemon({"policies": "QUERY[max=10]"})
    assert status(d.socket)["categories"]["query"]["token_limit"] == 10
    section = yaml.safe_load(d.config.read_text())["proxyd"]
    section["policies"] = {"query": {"max": 20, "nominal": 5}}
    d.config.write_text(yaml.safe_dump({"proxyd": section}))
    os.kill(d.pid, signal.SIGHUP)
    assert until(lambda: status(d.socket)["categories"]["query"]["token_limit"] == 20)
    # a broken file is refused, the old config stays, the daemon lives
    d.config.write_text("proxyd:\n  policies: 'QUERY[max=3 nominal=9]'\n")
    os.kill(d.pid, signal.SIGHUP)
    refused = cli("reconfig", "--socket", d.socket)
    assert refused.returncode == 1 and "nominal" in refused.stdout
    assert status(d.socket)["categories"]["query"]["token_limit"] == 20
    section["policies"] = "QUERY[max=7]"
    d.config.write_text(yaml.safe_dump({"proxyd": section}))
    done = cli("reconfig", "--socket", d.socket)
    assert done.returncode == 0, done.stdout + done.stderr
    assert status(d.socket)["categories"]["query"]["nominal"] == 7
    assert "config refused" in d.log()


def test_sigterm_stops_cleanly_and_answers_waiters(start_daemon):
    d = start_daemon({"policies": "QUERY[max=1]", "token_wait_time": 600})
    holder = ProxyClient([Daemon("d", d.socket)])
    waiter = subprocess.Popen(
        [*AS_NOBODY, PYTHON, "-c", client_code(d.socket)],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(d.socket)
            token = holder.acquire("query")  # root's token counts: max=1 is reached
            assert until(lambda: status(d.socket)["categories"]["query"]["queued"] == 1)
            assert d.stop() == 0, d.log()
            assert json.loads(waiter.stdout.readline()) == {"denied": "shutdown"}
            assert waiter.wait(10) == 3
            assert not os.path.exists(d.socket)
            assert sock.recv(10) == b""  # connections are closed
        holder.release(token)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        waiter.wait(10)
        waiter.stdout.close()
        holder.close()


def test_malformed_and_oversized_lines_get_errors(start_daemon):
    d = start_daemon({"max_line_bytes": 1024})
    replies = talk(
        d.socket,
        b"garbage\n",
        b"[1,2]\n",
        b'{"v":9,"op":"hello"}\n',
        b'{"v":1,"id":4}\n',
        b'{"v":1,"id":5,"op":"nope"}\n',
        b'{"v":1,"id":6,"op":"acquire","category":"bogus"}\n',
        b'{"v":1,"id":7,"op":"acquire","category":"query","size":-1}\n',
        b"x" * 5000 + b"\n",
        b'{"v":1,"id":9,"op":"hello"}\n',
    )
    codes = [r.get("error", {}).get("code") for r in replies]
    assert codes == [
        "bad_json",
        "bad_request",
        "bad_version",
        "bad_request",
        "unknown_op",
        "bad_request",
        "bad_request",
        "line_too_long",
        None,
    ]
    assert replies[-1]["ok"] and replies[-1]["id"] == 9
    # a partial line growing without end is cut off too; the daemon keeps serving others
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(d.socket)
        sock.sendall(b"{" * 3000)
        (reply,) = _read(sock, 1)
        assert reply["error"]["code"] == "line_too_long"
    assert hello(d.socket)["ok"]
    assert status(d.socket)["metrics"]["error"]["current"] >= 8


def test_slow_sender_is_cut_off_idle_client_is_not(start_daemon):
    d = start_daemon({"line_timeout": 0.5})
    with socket.socket(socket.AF_UNIX) as slow, socket.socket(socket.AF_UNIX) as idle:
        slow.settimeout(20)
        idle.settimeout(20)
        slow.connect(d.socket)
        idle.connect(d.socket)
        slow.sendall(b'{"v":1,"id":1,')  # and never the rest
        (reply,) = _read(slow, 1)
        assert reply["error"]["code"] == "line_timeout"
        assert slow.recv(10) == b""  # closed
        idle.sendall(b'{"v":1,"id":2,"op":"hello"}\n')  # silent all along, still served
        assert _read(idle, 1)[0]["ok"]


def test_two_daemons_split_limits_and_client_fails_over(start_daemon, sockdir, cli):
    hosts = [
        {"name": "pa", "address": str(sockdir / "pa.sock")},
        {"name": "pb", "address": str(sockdir / "pb.sock")},
    ]
    section = {"hosts": hosts, "policies": "QUERY[max=5 nominal=3] SUBMISSION[max=9]"}
    # both read the same site file; each listens on its own address from proxyd.hosts
    a = start_daemon({**section, "socket": ""}, name="pa", config_name="site.yaml")
    b = start_daemon({**section, "socket": ""}, name="pb", config_name="site.yaml")
    assert (a.socket, b.socket) == (hosts[0]["address"], hosts[1]["address"])
    sa, sb = status(a.socket)["categories"], status(b.socket)["categories"]
    assert (sa["query"]["token_limit"], sb["query"]["token_limit"]) == (3, 2)
    assert (sa["query"]["nominal"], sb["query"]["nominal"]) == (2, 1)
    assert sa["submission"]["token_limit"] + sb["submission"]["token_limit"] == 9
    # admin commands go to every daemon listed in the config
    out = cli("block", "-u", "user1", "-m", "hostA", "-c", str(a.config))
    assert out.stdout.splitlines() == [
        "<user1@hostA> added to the blocklist on lsfproxyd host <pa>",
        "<user1@hostA> added to the blocklist on lsfproxyd host <pb>",
    ]
    client = ProxyClient([Daemon(h["name"], h["address"]) for h in hosts], when_unavailable="fail")
    used = {client.acquire("other").daemon for _ in range(40)}
    assert used == {"pa", "pb"}  # random pick spreads the load
    a.stop(signal.SIGKILL)
    tokens = [client.acquire("other") for _ in range(20)]
    assert {t.daemon for t in tokens} == {"pb"}
    for token in tokens:
        token.release()
    out = cli("blocklist", "-c", str(a.config))
    assert out.returncode == 1
    assert "lsfproxyd host - pa\n  Unable to contact <pa>" in out.stdout
    assert "lsfproxyd host - pb\n  Blocked all:           No" in out.stdout
    b.stop(signal.SIGKILL)
    with pytest.raises(ProxyUnavailable, match="no lsfproxyd answered"):
        client.acquire("other")
    proceeding = ProxyClient([Daemon(h["name"], h["address"]) for h in hosts])
    assert proceeding.acquire("other").proceed  # when_unavailable: proceed (the default)
    client.close()


def test_diagnostic_log(start_daemon, cli, py_as, sockdir):
    log = sockdir / "diag.log"
    d = start_daemon({"diagnose": True, "diagnose_file": str(log)})
    assert py_as(client_code(d.socket, "submission", "BATCH_JOB_SUB")).returncode == 0
    cli("block", "-u", "nobody", "--socket", d.socket)
    assert py_as(client_code(d.socket)).returncode == 3
    lines = log.read_text().splitlines()
    pattern = (
        r"^[A-Z][a-z]{2} \d{1,2} \d\d:\d\d:\d\d \d{4} "
        r"(QUERY|SUBMISSION|OTHER)_REQ,[A-Z_-]+,\w+,[\w.-]+,\d+,[01],\d{6},\d{6}$"
    )
    assert all(re.match(pattern, line) for line in lines), lines
    host = hello(d.socket)["host"]
    assert lines[0].split(" ", 4)[4].startswith(f"SUBMISSION_REQ,BATCH_JOB_SUB,nobody,{host},12,1,")
    assert lines[1].split(" ", 4)[4].startswith(f"QUERY_REQ,BATCH_JOB_QUERY,nobody,{host},12,0,")
    off = cli("diagnose", "off", "--socket", d.socket)
    assert "diagnostic log OFF" in off.stdout
    cli("unblock", "-u", "nobody", "--socket", d.socket)
    assert py_as(client_code(d.socket)).returncode == 0
    assert len(log.read_text().splitlines()) == 2
    cli("diagnose", "on", "--socket", d.socket)
    assert py_as(client_code(d.socket)).returncode == 0
    assert len(log.read_text().splitlines()) == 3


def test_sighup_reopens_the_diagnostic_log_after_rotation(start_daemon, py_as, sockdir):
    # What logrotate does without copytruncate: rename the file, then `systemctl reload`
    # (SIGHUP). The next lines must go to a new file at the configured path.
    log = sockdir / "diag.log"
    d = start_daemon({"diagnose": True, "diagnose_file": str(log)})
    assert py_as(client_code(d.socket)).returncode == 0
    rotated = log.rename(sockdir / "diag.log.1")
    os.kill(d.pid, signal.SIGHUP)
    assert until(lambda: log.exists())
    assert py_as(client_code(d.socket)).returncode == 0
    assert until(lambda: len(log.read_text().splitlines()) == 1)
    assert len(rotated.read_text().splitlines()) == 1  # nothing more went to the rotated file
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_tcp_requests_are_signed(start_daemon, sockdir):
    from gridgate.plugins.lsf_proxy.protocol import encode, sign

    key = sockdir / "key"
    key.write_text("s3cret\n")
    key.chmod(0o600)
    port = free_port()
    d = start_daemon(
        {
            "tcp": f"127.0.0.1:{port}",
            "key": {"file": str(key)},
            "addon_hosts": ["addonhost"],
            "policies": "QUERY[max=1]",
        }
    )
    address = f"127.0.0.1:{port}"
    trusted = ProxyClient([Daemon("t", address)], key="s3cret", user="alice", host="addonhost")
    first = trusted.acquire("query")
    second = trusted.acquire("query")
    assert first.privileged and second.privileged  # add-on host: beyond max
    assert status(d.socket)["categories"]["query"]["in_use_privileged"] == 2
    trusted.close()

    def tcp(*messages) -> list[dict]:
        """One connection: ``hello`` for its challenge, then each message (a function of the
        challenge and the daemon's name, or bytes) and its reply."""
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b'{"v":1,"id":0,"op":"hello"}\n')
            (hi,) = _read(sock, 1)
            assert hi["ok"] and len(hi["challenge"]) == 32 and hi["user"] == "", hi
            lines = [
                m if isinstance(m, bytes) else m(hi["challenge"], hi["name"]) for m in messages
            ]
            sock.sendall(b"".join(lines))
            return _read(sock, len(lines))

    def signed(message: dict, key: str = "s3cret", user: str = "bob", **kw):
        return lambda challenge, name: encode(
            sign(dict(message), key, user, "far", challenge=challenge, daemon=name, **kw)
        )

    unsigned = tcp(b'{"v":1,"id":1,"op":"acquire","category":"query"}\n')[0]
    assert unsigned["error"]["code"] == "unsigned"
    without_challenge = encode(sign({"v": 1, "id": 1, "op": "hello"}, "s3cret", "bob", "far"))
    assert tcp(without_challenge)[0]["error"]["code"] == "bad_challenge"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b'{"v":1,"id":0,"op":"hello"}\n')
        (hi,) = _read(sock, 1)
        once = signed({"v": 1, "id": 2, "op": "hello"})(hi["challenge"], hi["name"])
        sock.sendall(once + once)
        ok, replay = _read(sock, 2)
    assert (ok["user"], ok["host"], ok["admin"]) == ("bob", "far", False)
    assert replay["error"]["code"] == "replayed"
    assert tcp(once)[0]["error"]["code"] == "bad_challenge"  # another connection: refused
    forged = signed({"v": 1, "id": 3, "op": "status"}, key="wrong", user="root")
    assert tcp(forged)[0]["error"]["code"] == "bad_signature"

    def tampered(challenge, name):
        message = sign(
            {"v": 1, "id": 4, "op": "hello"},
            "s3cret",
            "bob",
            "far",
            challenge=challenge,
            daemon=name,
        )
        message["auth"]["user"] = "root"  # tampering breaks the signature
        return encode(message)

    assert tcp(tampered)[0]["error"]["code"] == "bad_signature"
    from gridgate.core.clock import FakeClock

    stale = signed({"v": 1, "id": 5, "op": "hello"}, clock=FakeClock(time.time() - 3600))
    assert tcp(stale)[0]["error"]["code"] == "stale"


def test_notoken_retries_then_gives_up(start_daemon, py_as):
    d = start_daemon(
        {
            "policies": "QUERY[max=1]",
            "token_wait_time": 0.2,
            "queue_limit_per_user": 1,
            "sample_period": 86400,
        }
    )  # "current" counts the whole test
    with ProxyClient([Daemon("d", d.socket)]) as root:
        token = root.acquire("query")  # root's token fills max=1
        out = py_as(client_code(d.socket, ntries=3))
        token.release()
    assert out.returncode == 3
    assert json.loads(out.stdout) == {"denied": "timeout"}
    assert len(re.findall(r"no token from d \(timeout\), attempt \d/3", out.stderr)) == 2
    assert status(d.socket)["metrics"]["rejected.query"]["current"] == 3


def test_config_errors_stop_serve(cli, sockdir):
    bad = sockdir / "bad.yaml"
    bad.write_text("proxyd:\n  policies: 'QUERY[max=10 nominal=20]'\n")
    out = cli("serve", "-c", str(bad))
    assert out.returncode == 2
    assert (
        f"{bad}:2: proxyd.policies.query.nominal: nominal (20) must not exceed max (10)"
        in out.stderr
    )


@pytest.mark.parametrize("persist", [False, True])
def test_blocklist_persistence(start_daemon, cli, persist):
    d = start_daemon({"persist_blocklist": persist})
    assert cli("block", "-u", "user1", "--socket", d.socket).returncode == 0
    assert d.stop() == 0
    d2 = start_daemon({"persist_blocklist": persist})
    (reply,) = talk(d2.socket, b'{"v":1,"id":1,"op":"blocklist"}\n')
    assert reply["blocklist"]["users"] == (["user1"] if persist else [])


def test_defaults_without_config_for_an_ordinary_user(gridgate_exe, sockdir, cli, py_as):
    """serve with no -c and no --socket: $XDG_RUNTIME_DIR/gridgate/proxyd.sock; the admin
    commands find it the same way; the owner may administer it but is throttled like anyone."""
    runtime = sockdir / "xdg"
    runtime.mkdir()
    os.chown(runtime, 65534, 65534)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("GRIDGATE_PROXYD_SOCKET", None)
    proc = subprocess.Popen(
        [*AS_NOBODY, gridgate_exe, "lsfproxyd", "serve", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd="/",
    )
    try:
        info = json.loads(proc.stdout.readline())
        assert info["socket"] == str(runtime / "gridgate" / "proxyd.sock")
        out = cli("status", "--json", user="nobody", env={"XDG_RUNTIME_DIR": str(runtime)})
        assert out.returncode == 0, out.stderr
        reply = json.loads(out.stdout)["hosts"][0]["reply"]["status"]
        assert reply["categories"]["query"]["token_limit"] == 100  # the seed's default
        # the environment variable wins over the runtime directory, for root too
        assert cli("status", env={"GRIDGATE_PROXYD_SOCKET": info["socket"]}).returncode == 0
        got = json.loads(py_as(client_code(info["socket"])).stdout)
        assert got["token"] and not got["privileged"]
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
        proc.stdout.close()


def test_second_daemon_on_the_same_socket_is_refused(start_daemon, cli, sockdir):
    d = start_daemon({})
    out = cli("serve", "--socket", d.socket)
    assert out.returncode == 1 and "already listens" in out.stderr
    assert hello(d.socket)["ok"]  # the first one is untouched
    with socket.socket() as busy:  # a TCP port in use: clear error, no socket left behind
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        key = sockdir / "k"
        key.write_text("k")
        key.chmod(0o600)
        config = sockdir / "tcp.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "proxyd": {
                        "socket": str(sockdir / "tcp.sock"),
                        "tcp": f"127.0.0.1:{port}",
                        "key": {"file": str(key)},
                    }
                }
            )
        )
        out = cli("serve", "-c", str(config))
    assert out.returncode == 1 and "address already in use" in out.stderr.lower()
    assert not (sockdir / "tcp.sock").exists()


def test_category_from_opcode_with_site_additions(start_daemon):
    d = start_daemon({"categories": {"query": ["mytool"], "submission": ["BATCH_MY_SUB"]}})
    asks = [
        ("bsub", "submission"),
        ("/usr/bin/bjobs", "query"),
        ("mytool", "query"),
        ("BATCH_MY_SUB", "submission"),
        ("bkill", "other"),
        ("BATCH_JOB_QUERY", "query"),
    ]
    lines = [
        json.dumps(
            {"v": 1, "id": i, "op": "acquire", "category": None, "opcode": opcode, "size": 1}
        ).encode()
        + b"\n"
        for i, (opcode, _) in enumerate(asks)
    ]
    replies = talk(d.socket, *lines)
    assert [(r["result"], r["category"]) for r in replies] == [("granted", c) for _, c in asks]


def test_one_user_cannot_take_every_connection(start_daemon, py_as):
    d = start_daemon({"max_connections_per_user": 5})
    code = (
        "import json, socket\n"
        "socks = []\n"
        "for i in range(6):\n"
        "    s = socket.socket(socket.AF_UNIX); s.settimeout(10)\n"
        f"    s.connect({d.socket!r}); socks.append(s)\n"
        "    try:\n"
        '        s.sendall(b\'{"v":1,"id":1,"op":"hello"}\\n\')\n'
        "    except BrokenPipeError:\n"
        "        pass  # a refused connection may be closed before we speak\n"
        "print(json.dumps([json.loads(s.recv(4096).split(b'\\n')[0]).get('ok') for s in socks]))\n"
    )
    out = py_as(code)
    assert json.loads(out.stdout) == [True] * 5 + [False], out.stderr
    assert hello(d.socket)["ok"]  # root is not limited, nor is anybody else
    # the first run's connections were given back when it exited
    assert until(lambda: json.loads(py_as(code).stdout) == [True] * 5 + [False])


def test_a_swamped_daemon_is_a_refusal_not_a_pass_without_token(start_daemon, py_as):
    # The daemon holds the request longer than the client will wait for its reply: the client
    # must count that as "busy" and retry, never run its command without a token (which is
    # what "no daemon answered" + when_unavailable: proceed would do).
    d = start_daemon({"policies": "QUERY[max=1]", "token_wait_time": 30})
    code = (
        "import json\n"
        "from gridgate.plugins.lsf_proxy.client.client import ProxyClient, Daemon, NoToken\n"
        f"c = ProxyClient([Daemon('d', {d.socket!r})], notoken_ntries=2, when_unavailable='proceed',\n"
        "                reply_timeout=0.5, backoff=(0.05, 0.1))\n"
        "try:\n"
        "    t = c.acquire('query', 'BATCH_JOB_QUERY', 1)\n"
        "    print(json.dumps({'token': t.id, 'proceed': t.proceed, 'reason': t.reason}))\n"
        "except NoToken as exc:\n"
        "    print(json.dumps({'denied': exc.reason}))\n"
    )
    with ProxyClient([Daemon("d", d.socket)]) as root:
        token = root.acquire("query")  # root fills max=1 for the whole test
        out = py_as(code)
        token.release()
    assert json.loads(out.stdout) == {"denied": "busy"}, out.stderr
    assert "proceeding without a token" not in out.stderr


def test_client_tries_a_dead_daemon_last(start_daemon, sockdir):
    from loguru import logger

    hosts = [
        {"name": "pa", "address": str(sockdir / "pa.sock")},
        {"name": "pb", "address": str(sockdir / "pb.sock")},
    ]
    section = {"hosts": hosts, "policies": "QUERY[max=50]"}
    a = start_daemon({**section, "socket": ""}, name="pa", config_name="site.yaml")
    start_daemon({**section, "socket": ""}, name="pb", config_name="site.yaml")
    a.stop(signal.SIGKILL)
    misses: list[str] = []
    sink = logger.add(
        lambda m: misses.append(m),
        level="WARNING",
        filter=lambda r: "did not answer" in r["message"],
    )
    try:
        with ProxyClient(
            [Daemon("pa", hosts[0]["address"]), Daemon("pb", hosts[1]["address"])]
        ) as client:
            for _ in range(20):
                client.acquire("query").release()
    finally:
        logger.remove(sink)
    assert len(misses) == 1  # the dead daemon was tried once, then last (never reached again)


def test_diagnose_options_and_gated_commands_logged_with_opcode_and_size(
    start_daemon, cli, sockdir, gridgate_exe
):
    """`diagnose on -t MINUTES -f FILE` as badmin's; a gated bhosts and bjobs are logged as the
    seed's log has them: BATCH_HOST_INFO, BATCH_JOB_QUERY, with their request size."""
    d = start_daemon({})
    name = d.info["name"]
    tools = sockdir / "bin"
    tools.mkdir(mode=0o755)
    for tool in ("bhosts", "bjobs"):
        (tools / tool).write_text("#!/bin/sh\necho ok\n")
        (tools / tool).chmod(0o755)
    out = cli("diagnose", "on", "-t", "30", "-f", "badmin.log", "--socket", d.socket)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(
        rf"lsfproxyd diagnostic log ON \({sockdir}/badmin.log\) until "
        rf"\w{{3}} \w{{3}} \d\d \d\d:\d\d:\d\d on lsfproxyd host <{name}>",
        out.stdout.strip(),
    ), out.stdout
    runs = [[str(tools / "bhosts")], [str(tools / "bjobs"), "-u", "all", "-w"]]
    for argv in runs:
        gated = subprocess.run(
            [*AS_NOBODY, gridgate_exe, "gate", "--socket", d.socket, "--", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert gated.returncode == 0 and gated.stdout == "ok\n", gated.stderr
    host = hello(d.socket)["host"]
    logged = [line.split(" ", 4)[4] for line in (sockdir / "badmin.log").read_text().splitlines()]
    sizes = [sum(len(a) + 1 for a in argv) for argv in runs]
    assert logged[0].startswith(f"QUERY_REQ,BATCH_HOST_INFO,nobody,{host},{sizes[0]},1,"), logged
    assert logged[1].startswith(f"QUERY_REQ,BATCH_JOB_QUERY,nobody,{host},{sizes[1]},1,"), logged
    assert status(d.socket)["diagnose_file"] == str(sockdir / "badmin.log")
    off = cli("diagnose", "off", "--socket", d.socket)
    assert "diagnostic log OFF" in off.stdout
    assert status(d.socket)["diagnose_file"].endswith(f"info.lsfproxydlog.{host}")
    bad = cli("diagnose", "on", "-f", "../escape.log", "--socket", d.socket)
    assert bad.returncode == 1 and "give a bare name" in bad.stdout, bad.stdout + bad.stderr
    assert cli("diagnose", "off", "-t", "5", "--socket", d.socket).returncode == 2


def test_diagnose_takes_its_config_as_config_and_c_as_badmin_s_class(start_daemon, cli) -> None:
    """Issue 40 item 8: the `-c, --config FILE` diagnose's help listed was refused (-c was
    also the class, and click warned at every run). Now --config FILE finds the daemon and
    -c is badmin diagnose's class only, with no warning."""
    d = start_daemon({})
    on = cli("diagnose", "on", "--config", str(d.config))
    assert on.returncode == 0 and "diagnostic log ON" in on.stdout, on.stdout + on.stderr
    assert on.stderr == ""
    assert status(d.socket)["diagnose"] is True
    off = cli("diagnose", "off", "-c", "requests", "--config", str(d.config))
    assert off.returncode == 0 and "diagnostic log OFF" in off.stdout and off.stderr == ""
    bypass = cli("diagnose", "on", "--class", "bypass", "--config", str(d.config))
    assert bypass.returncode == 1 and "proxyd.bypass.scheduler" in bypass.stdout + bypass.stderr
    as_class = cli("diagnose", "on", "-c", str(d.config))
    assert as_class.returncode == 2 and "'requests', 'bypass'" in as_class.stderr
    assert "used more than once" not in as_class.stderr
    help_text = cli("diagnose", "--help").stdout
    assert "--config FILE" in help_text and "-c, --config" not in help_text
