"""Token daemon security: kernel identity on the Unix socket, signed TCP, admin refusal, file modes."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from daemonkit import (
    free_port,
    hello_as_nobody_code,
    in_use,
    lsf_fixtures,
    read_replies,
    status,
    talk,
)

from gridgate.core.clock import FakeClock
from gridgate.plugins.lsf_proxy.protocol import ADMIN_OPS, encode, sign

sockdir = lsf_fixtures.sockdir
start_daemon = lsf_fixtures.start_daemon
py_as = lsf_fixtures.py_as

pytestmark = pytest.mark.timeout(120)

# Every way a request might claim to be someone else: top-level fields, a forged auth block
# (signed with a guessed key), and a host that is an add-on host (privileged) in the config.
CLAIMS = {
    "user": "root",
    "uid": 0,
    "host": "addonhost",
    "auth": {
        "user": "root",
        "host": "addonhost",
        "ts": 0,
        "nonce": "0123456789abcdef",
        "mac": "00" * 32,
    },
}


def test_unix_peer_cannot_claim_another_user_or_root(start_daemon, py_as, sockdir):
    log = sockdir / "diag.log"
    d = start_daemon(
        {
            "policies": "QUERY[max=1] SUBMISSION[max=1] OTHER[max=1]",
            "admins": ["root", "alice"],
            "addon_hosts": ["addonhost"],
            "token_wait_time": 0.5,
            "diagnose": True,
            "diagnose_file": str(log),
        }
    )
    lines = [
        {"v": 1, "id": 1, "op": "hello", **CLAIMS},
        {"v": 1, "id": 2, "op": "acquire", "category": "query", "size": 1, **CLAIMS},
        # root would be granted beyond max at once; nobody must wait and be denied
        {
            "v": 1,
            "id": 3,
            "op": "acquire",
            "category": "query",
            "size": 2,
            **CLAIMS,
            "user": "alice",
        },
        {"v": 1, "id": 4, "op": "status", **CLAIMS},
    ]
    out = py_as(hello_as_nobody_code(d.socket, lines, 4))
    assert out.returncode == 0, out.stderr
    replies = {r["id"]: r for r in json.loads(out.stdout)}
    assert (replies[1]["user"], replies[1]["admin"]) == ("nobody", False)
    assert replies[1]["host"] == status(d.socket)["host"]
    assert replies[2]["result"] == "granted" and replies[2]["privileged"] is False
    assert (replies[3]["result"], replies[3]["reason"]) == ("denied", "timeout")
    assert replies[4]["error"]["code"] == "forbidden"
    query = status(d.socket)["categories"]["query"]
    # the connection closed: its token went back; nothing was ever counted as privileged
    assert (query["in_use"], query["in_use_privileged"]) == (0, 0)
    logged = log.read_text().splitlines()
    assert len(logged) == 2 and all(",nobody," in line for line in logged), logged
    assert not any("root" in line or "alice" in line or "addonhost" in line for line in logged)


def test_admin_commands_refused_to_ordinary_users(start_daemon, py_as):
    d = start_daemon({"policies": "QUERY[max=3]"})
    args = {
        "enable": {"category": "all"},
        "disable": {"category": "all"},
        "block": {"all": True},
        "unblock": {"all": True},
        "diagnose": {"on": True},
        "heartbeat": {
            "from": "pa",
            "service": {
                "enabled": {"query": False, "submission": False, "other": False},
                "stamp": 4e9,
                "origin": "pa",
            },
        },
    }
    lines = [
        {"v": 1, "id": i, "op": op, **args.get(op, {}), **CLAIMS}
        for i, op in enumerate(sorted(ADMIN_OPS), 1)
    ]
    out = py_as(hello_as_nobody_code(d.socket, lines, len(lines)))
    assert out.returncode == 0, out.stderr
    replies = json.loads(out.stdout)
    assert len(replies) == len(ADMIN_OPS) == 9
    assert {r["error"]["code"] for r in replies} == {"forbidden"}
    # nothing changed: service enabled, nothing blocked, diagnose still off
    after = status(d.socket)
    assert all(cat["enabled"] for cat in after["categories"].values())
    assert after["diagnose"] is False
    assert (
        py_as(
            hello_as_nobody_code(
                d.socket, [{"v": 1, "id": 1, "op": "acquire", "category": "query"}], 1
            )
        ).returncode
        == 0
    )
    assert status(d.socket)["metrics"]["blocked"]["current"] == 0


class Session:
    """One TCP connection that has said ``hello``: its challenge and the daemon's name."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.sock.sendall(b'{"v":1,"id":0,"op":"hello"}\n')
        (hello,) = read_replies(self.sock, 1)
        self.challenge, self.name = hello["challenge"], hello["name"]

    def sign(self, message: dict, key: str = "k3y-for-tcp", user: str = "alice", **kw) -> dict:
        return sign(dict(message), key, user, "h", challenge=self.challenge, daemon=self.name, **kw)

    def send(self, *lines: bytes) -> list[dict]:
        self.sock.sendall(b"".join(lines))
        return read_replies(self.sock, len(lines))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_tcp_refuses_unsigned_forged_stale_and_replayed(start_daemon, sockdir):
    key = sockdir / "key"
    key.write_text("k3y-for-tcp\n")
    key.chmod(0o600)
    port = free_port()
    d = start_daemon(
        {
            "tcp": f"127.0.0.1:{port}",
            "key": {"file": str(key)},
            "policies": "QUERY[max=5]",
            "max_clock_skew": 30,
        }
    )

    def tcp(*messages) -> list[dict]:
        with Session(port) as session:
            return session.send(*(m(session) if callable(m) else m for m in messages))

    acquire = {"v": 1, "op": "acquire", "category": "query", "size": 1}
    cases = {
        "unsigned": encode({**acquire, "id": 1}),
        "unsigned-claims": encode({**acquire, "id": 2, "auth": {"user": "root", "host": "h"}}),
        "bad_signature": lambda s: encode(s.sign({**acquire, "id": 3}, "not-the-key", "root")),
        "stale": lambda s: encode(
            s.sign({**acquire, "id": 4}, clock=FakeClock(time.time() - 31 * 60))
        ),
        "future": lambda s: encode(
            s.sign({**acquire, "id": 5}, clock=FakeClock(time.time() + 31 * 60))
        ),
        "unbound": encode(sign({**acquire, "id": 8}, "k3y-for-tcp", "alice", "h")),
    }

    def tampered(s: Session) -> bytes:
        message = s.sign({**acquire, "id": 6})
        message["auth"]["user"] = "root"
        return encode(message)

    def extended(s: Session) -> bytes:
        message = s.sign({**acquire, "id": 7})
        message["size"] = 10**6  # a field changed after signing
        return encode(message)

    cases["tampered"], cases["extended"] = tampered, extended
    expected = {
        "unsigned": "unsigned",
        "unsigned-claims": "unsigned",
        "bad_signature": "bad_signature",
        "stale": "stale",
        "future": "stale",
        "unbound": "bad_challenge",
        "tampered": "bad_signature",
        "extended": "bad_signature",
    }
    replies = tcp(*cases.values())
    assert [r["error"]["code"] for r in replies] == [expected[name] for name in cases]
    assert in_use(d.socket)["query"] == 0

    # a valid signed acquire is served once; the same bytes again, on this connection or on
    # another one, are refused and grant nothing
    with Session(port) as holder:
        good = encode(holder.sign({**acquire, "id": 8}))
        first, again = holder.send(good, good)
        assert first["result"] == "granted" and again["error"]["code"] == "replayed"
        assert tcp(good)[0]["error"]["code"] == "bad_challenge"
        assert in_use(d.socket)["query"] == 1
    assert until_zero(d.socket)

    # a signed ordinary user may not administer; a signed admin may (it holds the key)
    user_block = lambda s: encode(s.sign({"v": 1, "id": 9, "op": "block", "all": True}))  # noqa: E731
    assert tcp(user_block)[0]["error"]["code"] == "forbidden"
    assert status(d.socket)["metrics"]["blocked"]["current"] == 0


def test_captured_admin_requests_cannot_be_replayed_elsewhere_or_after_a_restart(
    start_daemon, sockdir, figures
):
    """Root's signed ``disable all`` and ``block all``, captured off the wire of daemon A, sent
    again inside the clock window to daemon B (same key) and to A restarted."""
    key = sockdir / "key"
    key.write_text("k3y-for-tcp\n")
    key.chmod(0o600)
    ports = {"pa": free_port(), "pb": free_port()}
    hosts = [{"name": n, "address": f"127.0.0.1:{p}"} for n, p in ports.items()]

    def section(name: str) -> dict:
        return {
            "tcp": f"127.0.0.1:{ports[name]}",
            "key": {"file": str(key)},
            "hosts": hosts,
            "name": name,
            "socket": str(sockdir / f"{name}.sock"),
        }

    a, b = start_daemon(section("pa"), name="pa"), start_daemon(section("pb"), name="pb")
    with Session(ports["pa"]) as wire:
        captured = [
            encode(wire.sign({"v": 1, "id": 1, "op": "block", "all": True}, user="root")),
            encode(wire.sign({"v": 1, "id": 2, "op": "disable", "category": "all"}, user="root")),
        ]
        # the captured requests are good where they were signed...
        assert [r["ok"] for r in wire.send(*captured)] == [True, True]
    assert status(a.socket)["categories"]["query"]["enabled"] is False
    talk(
        a.socket,
        b'{"v":1,"id":1,"op":"enable","category":"all"}\n',
        b'{"v":1,"id":2,"op":"unblock","all":true}\n',
    )

    def replay(port: int) -> list[str]:
        with Session(port) as other:
            return [r.get("error", {}).get("code", "accepted") for r in other.send(*captured)]

    # ... and nowhere else: on daemon B, which shares the key
    on_b = replay(ports["pb"])
    assert on_b == ["bad_challenge", "bad_challenge"], on_b
    # ... nor on A again, on a new connection, nor after A restarts (within the 30 s window)
    on_a = replay(ports["pa"])
    assert a.stop() == 0
    a2 = start_daemon(section("pa"), name="pa", config_name="pa-again.yaml")
    on_restarted = replay(ports["pa"])
    assert on_a == on_restarted == ["bad_challenge", "bad_challenge"], (on_a, on_restarted)
    for d in (b, a2):
        after = status(d.socket)
        assert all(cat["enabled"] for cat in after["categories"].values()), d.socket
        (listed,) = talk(d.socket, b'{"v":1,"id":1,"op":"blocklist"}\n')
        assert listed["blocklist"]["all"] is False
    figures(
        replayed_to_second_daemon=on_b,
        replayed_same_daemon=on_a,
        replayed_after_restart=on_restarted,
    )


def until_zero(path: str) -> bool:
    end = time.monotonic() + 20
    while in_use(path)["query"] != 0:
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_socket_connectable_by_users_in_an_owner_only_directory(start_daemon, py_as, sockdir):
    nested = sockdir / "run" / "gridgate"
    d = start_daemon({"socket": str(nested / "proxyd.sock")})
    folder = os.stat(nested)
    assert folder.st_uid == os.geteuid() == 0
    assert stat.S_IMODE(folder.st_mode) & 0o022 == 0, oct(folder.st_mode)
    sock = os.stat(d.socket)
    assert stat.S_ISSOCK(sock.st_mode)
    out = py_as(hello_as_nobody_code(d.socket, [{"v": 1, "id": 1, "op": "hello"}], 1))
    assert out.returncode == 0 and json.loads(out.stdout)[0]["user"] == "nobody", out.stderr
    # nobody can neither remove the socket nor put another in its place
    replace = (
        "import os, socket, sys\n"
        f"p = {d.socket!r}\n"
        "try:\n    os.unlink(p)\nexcept OSError as e:\n    print('unlink', e.errno)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.bind(p + '.evil')\nexcept OSError as e:\n    print('bind', e.errno)\n"
    )
    out = py_as(replace)
    assert out.stdout.split() == ["unlink", "13", "bind", "13"], out
    assert os.path.exists(d.socket) and not os.path.exists(d.socket + ".evil")


@pytest.mark.parametrize(
    "mode,owner",
    [(0o777, 0), (0o1777, 0), (0o775, 0), (0o755, 65534)],
    ids=["world-writable", "sticky-tmp", "group-writable", "other-owner"],
)
def test_daemon_refuses_a_directory_others_can_write(gridgate_exe, sockdir, mode, owner):
    folder = sockdir / "shared"
    folder.mkdir()
    folder.chmod(mode)
    os.chown(folder, owner, owner)
    config = sockdir / "proxyd.yaml"
    config.write_text(yaml.safe_dump({"proxyd": {"socket": str(folder / "proxyd.sock")}}))
    done = subprocess.run(
        [gridgate_exe, "lsfproxyd", "serve", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "socket directory" in done.stderr and str(folder) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(folder.iterdir()) == []


def test_diagnostic_log_and_blocklist_are_private(start_daemon, sockdir, py_as):
    log = sockdir / "diag.log"
    log.write_text("")
    log.chmod(0o600)
    blocklist = sockdir / "blocklist.json"
    d = start_daemon(
        {
            "diagnose": True,
            "diagnose_file": str(log),
            "persist_blocklist": True,
            "blocklist_file": str(blocklist),
        }
    )
    fresh = sockdir / "logs" / "fresh.log"
    d2 = start_daemon({"diagnose": True, "diagnose_file": str(fresh)}, name="second")
    assert (
        py_as(
            hello_as_nobody_code(
                d.socket, [{"v": 1, "id": 1, "op": "acquire", "category": "query"}], 1
            )
        ).returncode
        == 0
    )
    (blocked,) = talk(d.socket, b'{"v":1,"id":1,"op":"block","users":["mallory"]}\n')
    assert blocked["ok"], blocked
    for path in (log, fresh, blocklist):
        assert path.exists(), path
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    assert log.read_text().count(",nobody,") == 1
    assert stat.S_IMODE(Path(d2.socket).parent.stat().st_mode) & 0o022 == 0
