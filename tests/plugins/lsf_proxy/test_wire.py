"""One wire vocabulary (plugins/lsf_proxy/wire.py): the protocol's version and error codes as
docs/protocol.md states them, spoken alike by the daemon and both clients; the blocklist file
and the admin verbs the daemon hands its requests to."""

from __future__ import annotations

import ast
import os
import re
import time
from pathlib import Path
from typing import Any, cast

import pytest

from gridgate.plugins.lsf_proxy import protocol, wire
from gridgate.plugins.lsf_proxy.client import client, gateclient
from gridgate.plugins.lsf_proxy.daemon.admin import AdminVerbs
from gridgate.plugins.lsf_proxy.daemon.blockfile import BlocklistFile
from gridgate.plugins.lsf_proxy.daemon.policy import Blocklist, BlockRule
from gridgate.plugins.lsf_proxy.daemon.startup import StartupError

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "plugins" / "lsf_proxy"


def test_docs_protocol_lists_exactly_the_error_codes() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    listed = text.split("Error codes:", 1)[1].split("\n\n", 1)[0]
    listed = re.sub(r"\([^)]*\)", "", listed)  # what each means, in brackets
    assert set(re.findall(r"`([a-z_]+)`", listed)) == wire.ERROR_CODES
    assert f"must be `{wire.PROTOCOL_VERSION}`" in text


def test_every_error_the_plugin_raises_has_a_listed_code() -> None:
    raised = set()
    for path in PLUGIN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "ProtocolError"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                raised.add(node.args[0].value)
    assert raised and raised <= wire.ERROR_CODES, raised - wire.ERROR_CODES
    assert wire.BUSY_CODES <= wire.ERROR_CODES


def test_both_clients_and_the_daemon_speak_the_same_words() -> None:
    for module in (protocol, client, gateclient):
        assert module.PROTOCOL_VERSION is wire.PROTOCOL_VERSION
    for name in ("NoToken", "ProxyError", "ProxyUnavailable", "RequestFailed"):
        assert getattr(client, name) is getattr(gateclient, name) is getattr(wire, name)
    assert protocol.ProtocolError is wire.ProtocolError


def test_a_daemon_turning_a_connection_away_is_busy_to_either_client() -> None:
    reply = {"v": 1, "id": None, "ok": False, "error": {"code": "busy", "message": "full"}}
    busy = wire.turned_away("h1", reply)
    assert isinstance(busy, wire.DaemonBusy) and str(busy) == "h1: busy: full"
    assert wire.turned_away("h1", {**reply, "id": 3}) is None
    assert wire.turned_away("h1", {**reply, "error": {"code": "bad_request"}}) is None
    refused = wire.connect_failed("h1", "/x.sock", ConnectionRefusedError(111, "refused"))
    assert type(refused) is wire.ConnectionBroken
    assert isinstance(
        wire.connect_failed("h1", "/x", BlockingIOError(11, "again")), wire.DaemonBusy
    )
    assert isinstance(wire.connect_failed("h1", "/x", TimeoutError()), wire.DaemonBusy)


def test_every_admin_op_has_its_verb() -> None:
    assert set(AdminVerbs(cast(Any, None)).verbs) == protocol.ADMIN_OPS


def test_the_blocklist_file_keeps_the_rules_only_when_persisted(tmp_path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o755)
    complaints: list[tuple[Any, ...]] = []
    kept = BlocklistFile(folder / "blocklist.h1.json", True, lambda *a: complaints.append(a))
    assert kept.load().rules == ()  # nothing written yet
    rules = Blocklist([BlockRule.make(False, ["user1"], []), BlockRule.make(True, [], [])])
    kept.save(rules)
    assert os.stat(kept.path).st_mode & 0o777 == 0o600
    assert kept.load().rules == rules.rules
    unkept = BlocklistFile(folder / "other.json", False, lambda *a: complaints.append(a))
    unkept.save(rules)
    assert not unkept.path.exists() and unkept.load().rules == ()
    folder.chmod(0o777)  # others could plant a link there: nothing is read or written
    kept.save(Blocklist())
    assert len(complaints) == 1
    with pytest.raises(StartupError, match="cannot read the persisted blocklist"):
        kept.load()


# --- a daemon's bad reply is that daemon's bad answer (issue 39) ------------------------------


def _one_answer_daemon(path: str, answer: bytes) -> Any:
    """A real Unix socket that answers every line it reads with ``answer``."""
    import socket
    import threading

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                buffer = b""
                while b"\n" not in buffer:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    buffer += chunk
                try:
                    conn.sendall(answer)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.mark.parametrize(
    ("answer", "raised"),
    [
        (b"[1, 2]\n", wire.ProxyUnavailable),  # not an object: nobody answered
        (b'{"id": "one", "ok": true}\n', wire.ProxyUnavailable),  # an id of the wrong type
        (b'{"id": 1, "ok": true, "result": "granted", "waited": "long"}\n', wire.RequestFailed),
    ],
)
def test_a_reply_of_the_wrong_shape_is_the_daemons_bad_answer(
    tmp_path: Path, answer: bytes, raised: type[Exception]
) -> None:
    path = str(tmp_path / "d.sock")
    server = _one_answer_daemon(path, answer)
    try:
        proxy = client.ProxyClient(
            [client.Daemon("d", path)], when_unavailable="fail", reply_timeout=5
        )
        with pytest.raises(raised):
            proxy.acquire("query", "bjobs")
        proxy.close()
    finally:
        server.close()


def test_a_status_bypass_block_is_read_typed_and_a_bad_one_is_said() -> None:
    from gridgate.plugins.lsf_proxy.cli import render

    good = {
        "scheduler": "slurm",
        "action": "block",
        "interval": 1,
        "windows": 3,
        "bypassing": {"bob": 12},
        "acting": {},
        "problem": None,
    }
    assert render.bypass_text(good) == [
        "  BYPASS_AUDIT: slurm every 1 s, action block, 3 windows; bypassing: bob=12"
    ]
    assert render.bypass_text({}) == [] and render.bypass_text(None) == []
    [said] = render.bypass_text({**good, "acting": {"bob": "blocked"}})
    assert said.startswith("  BYPASS_AUDIT: lsfproxyd bypass status: ") and "acting" in said


# --- issue 40 item 11: texts that cannot be misread ------------------------------------------


def test_no_name_prints_as_the_text_that_stands_for_none() -> None:
    """`bypassing: nobody` read as the user nobody; a user `-` read as the blocklist's "none".
    A sentinel is now a text no name prints as: odd names are quoted."""
    from gridgate.plugins.lsf_proxy.cli import render

    audit = {"scheduler": "slurm", "action": "block", "interval": 1, "windows": 3}
    [none] = render.bypass_text({**audit, "bypassing": {}})
    assert none.endswith("; bypassing: (no one)")
    [named] = render.bypass_text({**audit, "bypassing": {"nobody": 4, "(no one)": 2, "-": 1}})
    assert named.endswith('; bypassing: "(no one)"=2, "-"=1, nobody=4')
    daemon = client.Daemon("h1", "/x.sock")
    summary = {"all": False, "users": ["-", "alice"], "hosts": [], "pairs": ["a b@h"]}
    lines = render.blocklist_text([client.HostReply(daemon, {"ok": True, "blocklist": summary})])
    assert lines[2:] == [
        '  Blocked users:         "-" alice',
        "  Blocked hosts:         -",
        '  Blocked users@hosts:   "a b@h"',
    ]
    held = [{"user": "u", "host": "h", "opcode": "-", "category": "query", "held": 1, "left": 2}]
    assert '"-"' in render.held_text(held)[2]
    assert " - " in render.held_text([{**held[0], "opcode": ""}])[2]


def test_a_blocked_user_is_told_by_whom_why_and_until_when() -> None:
    until = 1_800_000_000.0
    end = time.strftime("%a %b %d %H:%M:%S", time.localtime(until))
    audit = {"by": "bypass", "rule": "users", "name": "bob", "until": until}
    assert wire.blocked_message("h1", {"block": audit}) == (
        f"h1: request blocked by the bypass audit until {end}: user bob's scheduler calls "
        "went around the gate (more than its tokens cover)"
    )
    assert "by the bypass audit of lsfproxyd h2 until" in wire.blocked_message(
        "h1", {"block": {**audit, "audit": "h2"}}
    )
    admin = {"by": "administrator", "rule": "hosts", "name": "n1", "until": None}
    assert wire.blocked_message("h1", {"block": admin}) == (
        "h1: request blocked by the lsfproxyd administrator (host n1 is on the blocklist, "
        "until an administrator unblocks it)"
    )
    assert "(all requests is" in wire.blocked_message("h1", {"block": {**admin, "rule": "all"}})
    # an older daemon, or a block of the wrong shape: said as not known, not made up
    assert wire.blocked_message("h1", {}) == (
        "h1: request blocked (this lsfproxyd does not say by whom or until when)"
    )
    odd = wire.blocked_message("h1", {"block": {"by": "bypass", "rule": 3, "until": 1e300}})
    assert odd == (
        "h1: request blocked by the bypass audit: this request's scheduler calls went around "
        "the gate (more than its tokens cover)"
    )


def test_trying_the_next_is_said_only_when_there_is_a_next(tmp_path) -> None:
    """With one daemon down, "trying the next" promised a daemon there is not."""
    down = [(f"h{i}", str(tmp_path / f"h{i}.sock")) for i in (1, 2)]
    for daemons, promised in ((down[:1], 0), (down, 1)):
        told: list[str] = []
        gate = gateclient.GateClient(daemons, warn=told.append)
        assert gate.acquire("query", "bjobs").reason == "unavailable"
        assert len(told) == len(daemons) + 1, told  # each daemon, then "proceeding"
        assert [m.endswith("; trying the next") for m in told[:-1]] == [True] * promised + [False]
    from loguru import logger

    seen: list[str] = []
    for daemons, promised in ((down[:1], 0), (down, 1)):
        seen.clear()
        sink = logger.add(lambda m: seen.append(m.record["message"]), level="WARNING")
        try:
            proxy = client.ProxyClient([client.Daemon(n, a) for n, a in daemons])
            assert proxy.acquire("query", "bjobs").reason == "unavailable"
        finally:
            logger.remove(sink)
        assert len(seen) == len(daemons) + 1, seen
        assert [m.endswith("; trying the next") for m in seen[:-1]] == [True] * promised + [False]
