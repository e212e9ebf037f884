"""What a hostile test of the released token daemon found (issue 21, items 1 and 7): a root
daemon writing where an admin says, request text reaching its logs, and requests that cannot be
echoed costing a traceback each."""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest
from daemonkit import free_port, lsf_fixtures, read_replies, status, talk

from gridgate.plugins.lsf_proxy.protocol import sign

sockdir = lsf_fixtures.sockdir
start_daemon = lsf_fixtures.start_daemon
py_as = lsf_fixtures.py_as
cli = lsf_fixtures.cli

pytestmark = pytest.mark.timeout(300)

#: every field a client chooses, as a JSON string holding a lone surrogate (valid JSON, no
#: valid UTF-8 can carry it)
SURROGATE = "\\ud800"
UNECHOABLE = [
    b'{"v":1,"id":"%s","op":"hello"}' % SURROGATE.encode(),
    b'{"v":1,"id":1,"op":"%s"}' % SURROGATE.encode(),
    b'{"v":1,"id":1,"op":"acquire","opcode":"b%s"}' % SURROGATE.encode(),
    b'{"v":1,"id":1,"op":"acquire","category":"%s"}' % SURROGATE.encode(),
    b'{"v":1,"id":1,"op":"release","token":"%s"}' % SURROGATE.encode(),
    b'{"v":1,"id":1,"op":"block","users":["u%s"]}' % SURROGATE.encode(),
    b'{"v":1,"id":1,"op":"diagnose","on":true,"file":"x%s"}' % SURROGATE.encode(),
    b'{"v":1,"id":1,"op":"hello","%s":1}' % SURROGATE.encode(),
    b'{"v":1,"id":["\\udfff",{"k":"\\udbff"}],"op":"check"}',
]
LOG_BOUND = 16 * 1024


def test_unencodable_strings_get_bad_request_and_cost_no_traceback(start_daemon, sockdir):
    """Before: the reply to an id of "\\ud800" could not be encoded, the error reply neither:
    the connection died with a 14 kB traceback per 37-byte request, without rate limit."""
    key = sockdir / "key"
    key.write_text("k3y\n")
    key.chmod(0o600)
    port = free_port()
    d = start_daemon({"tcp": f"127.0.0.1:{port}", "key": {"file": str(key)}})
    before = d.stderr.stat().st_size
    rounds = 20
    lines = [line + b"\n" for line in UNECHOABLE] * rounds
    replies = talk(d.socket, *lines)
    assert len(replies) == len(lines), replies[-3:]
    for reply in replies:
        assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
        assert reply["id"] is None
    # over TCP, signed by a key holder: the signature is good, the text still refused
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b'{"v":1,"id":"hi","op":"hello"}\n')
        (hi,) = read_replies(sock, 1)
        signed = sign(
            {"v": 1, "id": 7, "op": "hello"},
            "k3y",
            "\ud800",
            "h\udfff",
            challenge=hi["challenge"],
            daemon=hi["name"],
        )
        sock.sendall(json.dumps(signed).encode() + b"\n")
        (reply,) = read_replies(sock, 1)
        assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
    # nested past the interpreter's limit: was a RecursionError, an "internal" reply and a
    # traceback each
    deep = talk(
        d.socket,
        *[b"[" * 5000 + b"\n", b'{"v":1,"op":"hello","x":' + b"[" * 3000 + b"]" * 3000 + b"}\n"]
        * rounds,
    )
    assert {r["error"]["code"] for r in deep} == {"bad_json"}, deep[:2]
    # still serving, every bad line counted once in the Error row
    after = status(d.socket)
    assert after["metrics"]["error"]["current"] == len(lines) + 1 + len(deep)
    grown = d.stderr.stat().st_size - before
    assert "Traceback" not in d.log()
    assert grown < LOG_BOUND, d.log()[-3000:]


def _admin_nobody(sockdir) -> dict:
    return {"admins": ["root", "nobody"], "policies": "QUERY[max=4 nominal=4]"}


def test_diagnose_file_is_a_name_in_the_log_folder(start_daemon, sockdir, cli):
    """Before: `diagnose on -f /ABS/PATH` from an admin made the root daemon open any path,
    through symlinks, append to it and chmod it 0600."""
    elsewhere = sockdir / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    victim = elsewhere / "victim"
    victim.write_text("keep\n")
    victim.chmod(0o644)
    d = start_daemon(_admin_nobody(sockdir))

    def unchanged() -> bool:
        info = victim.stat()
        return victim.read_text() == "keep\n" and stat.S_IMODE(info.st_mode) == 0o644

    for user in ("nobody", "root"):
        out = cli("diagnose", "on", "-f", str(victim), "--socket", d.socket, user=user)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "bare name" in out.stdout + out.stderr
        assert unchanged()
    # a name in the folder that is a link (placed by root here: the folder is root's 0755)
    (sockdir / "link.log").symlink_to(victim)
    out = cli("diagnose", "on", "-f", "link.log", "--socket", d.socket, user="nobody")
    assert out.returncode == 1, out.stdout + out.stderr
    assert unchanged() and not status(d.socket)["diagnose"]
    # names outside the safe alphabet
    for name in ("..", ".hidden", "a b", "a;b", "x\n"):
        out = cli("diagnose", "on", "-f", name, "--socket", d.socket, user="nobody")
        assert out.returncode == 1, (name, out.stdout + out.stderr)
    # an existing file of the folder: appended to, its mode left as its owner set it
    shared = sockdir / "shared.log"
    shared.write_text("")
    shared.chmod(0o640)
    out = cli("diagnose", "on", "-f", "shared.log", "--socket", d.socket, user="nobody")
    assert out.returncode == 0, out.stdout + out.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o640
    cli("diagnose", "off", "--socket", d.socket)
    # one that others may read is not used (nor chmodded): it would show them every request
    shared.chmod(0o644)
    out = cli("diagnose", "on", "-f", "shared.log", "--socket", d.socket, user="nobody")
    assert out.returncode == 1 and "readable or writable by others" in out.stdout, out.stdout
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644
    # a new one is created 0600
    out = cli("diagnose", "on", "-f", "new.log", "--socket", d.socket, user="nobody")
    assert out.returncode == 0, out.stdout + out.stderr
    assert stat.S_IMODE((sockdir / "new.log").stat().st_mode) == 0o600
    assert (sockdir / "new.log").stat().st_uid == 0
    assert d.proc.poll() is None and "Traceback" not in d.log()


def test_configured_diagnose_file_is_not_followed(start_daemon, sockdir):
    """A config's diagnose_file that is a link, or in a folder others can write, is not opened:
    the daemon serves without its diagnostic log and says why."""
    victim = sockdir / "victim"
    victim.write_text("keep\n")
    victim.chmod(0o644)
    (sockdir / "diag.log").symlink_to(victim)
    d = start_daemon({"diagnose": True, "diagnose_file": str(sockdir / "diag.log")})
    assert not status(d.socket)["diagnose"]
    assert victim.read_text() == "keep\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert "diag.log" in d.log() and "Traceback" not in d.log()
    loose = sockdir / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    d2 = start_daemon({"diagnose": True, "diagnose_file": str(loose / "diag.log")}, name="d2")
    assert not status(d2.socket)["diagnose"]
    assert not (loose / "diag.log").exists()
    assert "writable by others" in d2.log()


def test_log_fields_keep_to_a_safe_alphabet(start_daemon, sockdir, py_as):
    """Before: the diagnostic log carried another user's request text with `;`, `$(...)` and
    quotes intact."""
    log = sockdir / "diag.log"
    d = start_daemon(
        {"diagnose": True, "diagnose_file": str(log), "policies": "QUERY[max=4 nominal=4]"}
    )
    evil = "b;$(touch /tmp/p)`id`\"'\\|&<>*?"
    code = (
        "import json, socket\n"
        "s = socket.socket(socket.AF_UNIX); s.settimeout(20)\n"
        f"s.connect({d.socket!r})\n"
        f"s.sendall(json.dumps({{'v': 1, 'id': 1, 'op': 'acquire', 'category': 'query', "
        f"'opcode': {evil!r}}}).encode() + b'\\n')\n"
        "print(s.recv(65536).decode())\n"
    )
    out = py_as(code)
    assert out.returncode == 0 and '"granted"' in out.stdout, out.stdout + out.stderr
    text = log.read_text()
    line = [x for x in text.splitlines() if "QUERY_REQ" in x][-1]
    fields = line.split(" ", 4)[-1].split(",")
    assert all(ch.isalnum() or ch in "._-+@:" for field in fields for ch in field), line
    assert fields[1] == "p__id__________", line  # the opcode is the name's last part
    assert os.stat(log).st_mode & 0o077 == 0


def test_names_from_requests_reach_no_log_as_they_are(start_daemon, sockdir):
    """The other places where request text became log text: block names (logged, persisted,
    printed to admins) and a key holder's signed user and host (in every line of its
    requests)."""
    key = sockdir / "key"
    key.write_text("k3y\n")
    key.chmod(0o600)
    port = free_port()
    d = start_daemon({"tcp": f"127.0.0.1:{port}", "key": {"file": str(key)}})
    for name in ("$(id)", "a;b", "q'\"", "\x1b[2J", "x" * 129):
        (reply,) = talk(
            d.socket, json.dumps({"v": 1, "id": 1, "op": "block", "users": [name]}).encode() + b"\n"
        )
        assert reply["ok"] is False and reply["error"]["code"] == "bad_request", (name, reply)
    assert status(d.socket)["metrics"]["blocked"]["current"] == 0
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b'{"v":1,"id":"hi","op":"hello"}\n')
        (hi,) = read_replies(sock, 1)
        signed = sign(
            {"v": 1, "id": 7, "op": "acquire", "category": "query"},
            "k3y",
            "alice;$(id)",
            "ui01",
            challenge=hi["challenge"],
            daemon=hi["name"],
        )
        sock.sendall(json.dumps(signed).encode() + b"\n")
        (reply,) = read_replies(sock, 1)
        assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
    assert "$(id)" not in d.log()


def test_the_blocklist_is_written_only_in_a_private_folder(start_daemon, sockdir):
    """`persist_blocklist` writes through a predictable temporary name: in a folder others can
    write, a link placed there would have the root daemon write through it: the daemon does
    not start on such a folder (as for its socket's)."""
    loose = sockdir / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(AssertionError, match="writable by others"):
        start_daemon({"persist_blocklist": True, "blocklist_file": str(loose / "bl.json")})
    assert os.listdir(loose) == []


def test_a_failing_diagnostic_log_is_told_once_not_per_request(start_daemon, sockdir):
    """Every error path any client can repeat is rate-limited: the diagnostic log on a full
    disk (here: a file over the daemon's RLIMIT_FSIZE; Python ignores SIGXFSZ) failed each
    request's line and logged an error per request."""
    log = sockdir / "diag.log"
    log.write_bytes(b"x" * 65536)
    log.chmod(0o600)
    d = start_daemon(
        {"diagnose": True, "diagnose_file": str(log), "policies": "QUERY[max=4 nominal=4]"},
        argv_prefix=("prlimit", "--fsize=32768"),
    )
    before = d.log().count("diagnostic log")
    pairs = 100
    lines = [b'{"v":1,"id":%d,"op":"acquire","category":"query"}\n' % i for i in range(pairs)]
    replies = talk(d.socket, *lines)
    assert [r["result"] for r in replies] == ["granted"] * pairs
    assert status(d.socket)["diagnose"]
    told = d.log().count("diagnostic log") - before
    assert told == 1, d.log()[-2000:]
    assert "Traceback" not in d.log()
