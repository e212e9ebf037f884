"""What the token daemon reads from outside itself, decoded at one boundary
(plugins/lsf_proxy/daemon/documents.py): peers' heartbeats and the persisted blocklist."""

from __future__ import annotations

import json

import pytest

from gridgate.core.documents import DocumentError
from gridgate.plugins.lsf_proxy.config import CATEGORIES
from gridgate.plugins.lsf_proxy.daemon.blockfile import BlocklistFile
from gridgate.plugins.lsf_proxy.daemon.documents import (
    ServiceState,
    heartbeat,
    peer_reply,
    persisted_rules,
    stored_heartbeat,
)
from gridgate.plugins.lsf_proxy.daemon.policy import BlockRule
from gridgate.plugins.lsf_proxy.daemon.startup import StartupError

STATE = ServiceState(dict.fromkeys(CATEGORIES, True), 2.0, "pb")


def test_a_heartbeat_is_its_sender_state_grants_and_leaving() -> None:
    grants = {"at": 5, "covered": {"u": 2, "v": "x"}}
    beat = heartbeat(
        {"op": "heartbeat", "from": "pb", "service": STATE.to_json(), "grants": grants}
    )
    assert (beat.sender, beat.service, beat.leaving) == ("pb", STATE, False)
    assert beat.grants == {"at": 5.0, "covered": {"u": 2.0}, "blocked": {}}
    assert heartbeat({"from": "pb", "service": STATE.to_json(), "leaving": True}).leaving
    for bad in ({"from": 7, "service": STATE.to_json()}, {"from": "pb", "service": None}):
        with pytest.raises(DocumentError):
            heartbeat(bad)


def test_a_peers_reply_or_stored_key_that_is_not_a_heartbeat_brings_nothing() -> None:
    for value in ("[1, 2]", "not json", json.dumps({"service": {"enabled": {}}})):
        reply = peer_reply(stored_heartbeat(value))
        assert reply.ok and reply.service is None and reply.grants is None
    refused = peer_reply({"ok": False, "error": {"message": "forbidden"}})
    assert not refused.ok and refused.error == "forbidden"
    taken = peer_reply(stored_heartbeat(json.dumps({"service": STATE.to_json()})))
    assert taken.service == STATE and taken.problem == ""


def test_the_persisted_blocklist_is_read_back_as_rules(tmp_path) -> None:
    text = json.dumps({"rules": [{"kind": "users", "items": ["a", "a", "b"]}, {"kind": "all"}]})
    assert persisted_rules(text) == [BlockRule("users", ("a", "b")), BlockRule("all")]
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    for bad in ('{"rules": [{"kind": "everyone"}]}', '{"rules": {}}', "[", '{"rules": [7]}'):
        (folder / "b.json").write_text(bad)
        with pytest.raises(StartupError, match="cannot read the persisted blocklist"):
            BlocklistFile(folder / "b.json", True, lambda *a: None).load()
