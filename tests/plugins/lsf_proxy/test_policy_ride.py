"""The token policy's rules for what a client may choose (issue 21): a nested call rides on its
parent's token (same category, one at a time, never for a blocked user), hold limits per
category that no command name dodges, token privilege apart from admin rights (FakeClock; the
ride's wire fields against a real daemon at the end)."""

from __future__ import annotations

import itertools

from gridgate.core.clock import FakeClock
from gridgate.plugins.lsf_proxy.config import CATEGORIES, Limits
from gridgate.plugins.lsf_proxy.daemon.policy import (
    GRANTED,
    QUEUED,
    BlockRule,
    PolicySettings,
    Request,
    TokenPolicy,
)

_ids = itertools.count(1)


def make(max_=1, lease=300.0, hold=None, privileged=None, admins=("root", "svc")):
    limits = {c: Limits(max_, max_, 0.0) for c in CATEGORIES}
    settings = PolicySettings(
        limits,
        15.0,
        1000,
        lease,
        frozenset(admins),
        frozenset(),
        hold_limits=dict(hold or {}),
        privileged=None if privileged is None else frozenset(privileged),
    )
    clock = FakeClock()
    return TokenPolicy(settings, clock=clock), clock


def req(user="alice", category="query", opcode="squeue", host="h1"):
    return Request(f"q{next(_ids)}", category, opcode, user, host, 0)


def in_use(policy, category="query"):
    return policy.status()["categories"][category]["in_use"]


def test_a_ride_shares_its_parents_slot_one_at_a_time():
    policy, _ = make(max_=1)
    parent = policy.request(req()).token
    first = policy.ride(parent.id, req())
    assert first != "busy" and first.rides == parent.id
    assert in_use(policy) == 1  # the parent's slot, not a second one
    # eight nested calls at once: one rides, the others wait for it
    assert [policy.ride(parent.id, req()) for _ in range(7)] == ["busy"] * 7
    policy.release(first.id)
    second = policy.ride(parent.id, req())
    assert second.rides == parent.id and in_use(policy) == 1
    # a ride covers no further nesting: a call inside it takes a token of its own
    assert policy.ride(second.id, req()) == "not_live"
    # the parent's release ends its ride too; the slot is free once
    policy.release(parent.id)
    assert policy.release(second.id) is None
    assert in_use(policy) == 0 and policy.request(req()).outcome == GRANTED


def test_a_ride_is_of_its_parents_category_user_and_host_only():
    policy, _ = make(max_=1)
    parent = policy.request(req(category="query")).token
    assert policy.ride(parent.id, req(category="submission")) == "category"
    assert policy.ride(parent.id, req(category="other")) == "category"
    assert policy.ride(parent.id, req(user="mallory")) == "not_live"
    assert policy.ride(parent.id, req(host="h2")) == "not_live"
    assert policy.ride("made-up", req()) == "not_live"
    # the other category's own token is still there to take, and counted
    assert policy.request(req(category="other")).outcome == GRANTED
    assert in_use(policy, "other") == 1


def test_a_user_blocked_after_taking_the_token_rides_no_more():
    policy, _ = make(max_=1)
    parent = policy.request(req()).token
    policy.block(BlockRule("users", ("alice",)))
    assert policy.ride(parent.id, req()) == "blocked"
    policy.unblock(BlockRule("users", ("alice",)))
    assert policy.ride(parent.id, req()) != "blocked"


def test_a_ride_ends_at_its_parents_lease_at_the_latest():
    policy, clock = make(lease=30)
    parent = policy.request(req()).token
    clock.advance(20)
    ride = policy.ride(parent.id, req())
    assert ride.expires_at == parent.expires_at
    clock.advance(10)
    assert parent.id in {t.id for t in policy.tick().expired}
    assert dict(policy.tokens) == {} and in_use(policy) == 0


def test_a_category_hold_limit_is_not_dodged_by_another_command_name():
    policy, clock = make(max_=4, hold={"query": 60, "squeue": 30})
    named = {op: policy.request(req(opcode=op)).token for op in ("squeue", "X", "myq", "")}
    assert {op: t.expires_at - t.granted for op, t in named.items()} == {
        "squeue": 30,
        "X": 60,
        "myq": 60,
        "": 60,
    }
    # a command's own limit never raises the category's, nor lease_time
    policy2, _ = make(max_=2, lease=100, hold={"query": 50, "bjobs": 500})
    assert policy2.hold_limit("query", "bjobs") == 50
    assert policy2.hold_limit("other", "bjobs") == 100
    # an opcode spelt like a category is no category limit of another category
    policy3, _ = make(hold={"submission": 5})
    assert policy3.hold_limit("query", "submission") == 300


def test_admin_rights_and_token_privilege_are_apart():
    # the seed's rule by default: admins are privileged
    policy, _ = make(max_=1)
    policy.request(req("alice"))
    assert policy.request(req("svc")).token.privileged
    # privileged: [root] keeps the admin service account paced
    policy, _ = make(max_=1, privileged=["root"])
    policy.request(req("alice"))
    assert policy.request(req("svc")).outcome == QUEUED
    assert policy.is_root_or_admin("svc")  # still allowed the admin commands
    assert policy.request(req("root")).token.privileged
    # and a privileged user need not be an admin
    policy, _ = make(max_=1, privileged=["batchbot"])
    policy.request(req("alice"))
    assert policy.request(req("batchbot")).token.privileged
    assert not policy.is_root_or_admin("batchbot")


def test_a_ride_request_with_bad_fields_is_a_bad_request_and_a_connection_holds_its_ride(
    start_daemon,
) -> None:
    """The ride's own fields (category, opcode) over a real socket: every odd value a
    ``bad_request``, never ``internal``; a granted ride is held by its connection and goes back
    when that connection closes, and the parent's slot is all the category counts."""
    import json
    import socket

    from support.polling import until

    from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient

    daemon = start_daemon({"policies": "QUERY[max=1 nominal=1]"})

    def talk(sock, message):
        sock.sendall(json.dumps(message).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            data += sock.recv(65536)
        return json.loads(data)

    def in_use_and_tokens():
        with ProxyClient([Daemon("proxyd", daemon.socket)]) as admin:
            [reply] = admin.admin("status")
        status = reply.reply["status"]
        return status["categories"]["query"]["in_use"], len(status["longest_held"])

    with (
        ProxyClient([Daemon("proxyd", daemon.socket)]) as client,
        client.acquire("query", "squeue", 0) as parent,
    ):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(daemon.socket)
            base = {"v": 1, "id": 1, "op": "check", "token": parent.id}
            for bad in (
                {"category": ["query"]},
                {"category": {"q": 1}},
                {"category": "\ud800"},
                {"category": "queries"},
                {"category": "query", "opcode": ["x"]},
                {"category": "query", "opcode": "x" * 129},
                {"category": 7},
            ):
                reply = talk(sock, {**base, **bad})
                assert not reply["ok"] and reply["error"]["code"] == "bad_request", (bad, reply)
            ride = talk(sock, {**base, "category": "query", "opcode": "squeue"})
            assert ride["ok"] and ride["live"] and ride["rides"] == parent.id
            assert talk(sock, {**base, "category": "query"})["reason"] == "busy"
            assert in_use_and_tokens() == (1, 2)
        # the ride's connection closed: its token is back, the parent's still held
        assert until(lambda: in_use_and_tokens() == (1, 1))
    assert until(lambda: in_use_and_tokens() == (0, 0))
