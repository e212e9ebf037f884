"""Several daemons as one service, pure parts on a FakeClock: who is alive, the share of the
live ones, the service state a (re)joining daemon takes, and the over-grant while views differ."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.polling import until
from support.ports import free_port
from support.uids import AS_NOBODY

from gridgate.core.clock import FakeClock
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.config import CATEGORIES, Limits
from gridgate.plugins.lsf_proxy.daemon.peers import (
    MISSES,
    BeatResult,
    Heartbeat,
    PeerView,
    ServiceState,
)
from gridgate.plugins.lsf_proxy.daemon.policy import (
    GRANTED,
    QUEUED,
    PolicySettings,
    Request,
    TokenPolicy,
)
from gridgate.plugins.lsf_proxy.settings import ProxydSettings

LIMITS = {c: Limits(8, 8, 0.0) for c in CATEGORIES}
_ids = itertools.count(1)


def test_a_new_daemon_counts_unheard_peers_for_three_intervals():
    clock = FakeClock()
    view = PeerView("pb", ["pa", "pb", "pc"], interval=10, clock=clock)
    assert view.live() == ["pa", "pb", "pc"]
    # the remainder goes to the first names: pa 3, pb 3, pc 2
    assert [
        PeerView(n, ["pa", "pb", "pc"], 10, clock).share(LIMITS)["query"].max
        for n in ("pa", "pb", "pc")
    ] == [3, 3, 2]
    view.failed("pa", refused=True)  # never heard: a refusal does not end the grace
    clock.advance(MISSES * 10 - 0.001)
    assert view.live() == ["pa", "pb", "pc"]
    clock.advance(0.001)
    assert view.live() == ["pb"]
    assert view.share(LIMITS)["query"] == Limits(8, 8, 0.0)


def test_a_peer_heard_then_refusing_is_dead_at_once_and_back_when_heard():
    clock = FakeClock()
    view = PeerView("pb", ["pa", "pb"], interval=30, clock=clock)
    view.heard("pa")
    view.failed("pa", refused=True)
    assert view.live() == ["pb"]
    assert view.share(LIMITS)["query"].max == 8
    view.heard("pa")
    assert view.live() == ["pa", "pb"]
    assert view.share(LIMITS)["query"].max == 4


def test_a_busy_peer_stays_until_it_missed_three_intervals():
    clock = FakeClock()
    view = PeerView("pa", ["pa", "pb"], interval=2, clock=clock)
    view.heard("pb")
    for _ in range(2):
        clock.advance(2)
        view.failed("pb", refused=False)  # timed out: alive but slow
        assert view.is_live("pb")
    clock.advance(2)
    assert not view.is_live("pb")
    assert view.status()["peers"]["pb"] == {"live": False, "heard_ago": 6.0}


def test_unknown_names_are_ignored_and_the_list_is_sorted():
    view = PeerView("b", ["c", "b", "a"], interval=1, clock=FakeClock())
    view.heard("stranger")
    assert view.names == ["a", "b", "c"]
    assert "stranger" not in view.status()["peers"]
    view.set_names(["b", "a"])  # reconfigured without c
    assert view.live() == ["a", "b"]


@given(st.integers(1, 500), st.integers(1, 100), st.lists(st.booleans(), min_size=1, max_size=7))
def test_property_daemons_that_agree_split_exactly(max_, nominal_cut, alive):
    """Daemons with the same view take shares that sum to the configured limits, whatever
    order their configs list the hosts in."""
    names = [f"h{i}" for i in range(len(alive))]
    limits = {c: Limits(max_, max(1, max_ * nominal_cut // 100), 0.001) for c in CATEGORIES}
    live = [n for n, up in zip(names, alive, strict=True) if up] or names[:1]
    clock = FakeClock()
    shares = []
    for me in live:
        order = list(reversed(names)) if me.endswith(("1", "3")) else names
        view = PeerView(me, order, interval=1, clock=clock)
        for other in live:
            view.heard(other)
        for other in set(names) - set(live):
            view.heard(other)
            view.failed(other, refused=True)
        shares.append(view.share(limits)["query"])
    assert sum(s.max for s in shares) == max_
    assert sum(s.nominal for s in shares) == limits["query"].nominal
    assert all(s.nominal <= s.max for s in shares)


# --- service state --------------------------------------------------------------------------


def test_rejoining_daemon_takes_the_service_state_of_a_live_peer():
    clock = FakeClock()
    pa = PeerView("pa", ["pa", "pb"], 1, clock)
    disabled = {**dict.fromkeys(CATEGORIES, True), "query": False}
    pa.local_change(disabled)
    fresh = PeerView("pb", ["pa", "pb"], 1, clock)  # restarted: all enabled, stamp 0
    assert fresh.offer(pa.service)
    assert fresh.service.enabled["query"] is False
    assert not pa.offer(fresh.service)  # the older state never wins back
    clock.advance(5)
    fresh.local_change(dict.fromkeys(CATEGORIES, True))  # a later enable on pb only
    assert pa.offer(fresh.service) and pa.service.enabled["query"] is True
    assert pa.service.origin == "pb"


def test_service_state_from_json_refuses_bad_input():
    good = ServiceState(dict.fromkeys(CATEGORIES, True), 3.0, "pa")
    assert ServiceState.from_json(good.to_json()) == good
    for bad in (
        None,
        [],
        {"enabled": {"query": True}},
        {"enabled": dict.fromkeys(CATEGORIES, 1)},
        {"enabled": dict.fromkeys(CATEGORIES, True), "stamp": "x"},
    ):
        with pytest.raises(ValueError):
            ServiceState.from_json(bad)


def test_a_peers_grants_and_blocks_keep_only_numbers_per_user():
    section = {"hosts": [{"name": "pa", "address": "/a"}, {"name": "pb", "address": "/b"}]}
    beat = Heartbeat("pa", ProxydSettings.of(section), FakeClock(), lambda _change: None)
    grants = {
        "at": 5,
        "covered": {"u": 2, "v": "x", "w": True},
        "blocked": {"rogue": 99.5, "other": None, "flag": False},
    }
    state = ServiceState(dict.fromkeys(CATEGORIES, True), 1.0, "pb")
    beat.answer({"from": "pb", "service": state.to_json(), "grants": grants})
    assert beat.peer_grants["pb"] == {"at": 5.0, "covered": {"u": 2.0}, "blocked": {"rogue": 99.5}}
    beat.keep_grants("pb", {"at": 6, "covered": {}, "blocked": "everyone"})
    assert beat.peer_grants["pb"]["blocked"] == {}, "a bad list blocks nobody"
    beat.keep_grants("pb", {"at": 7, "covered": {}})  # a daemon from before the blocks
    assert beat.peer_grants["pb"] == {"at": 7.0, "covered": {}, "blocked": {}}


def test_heartbeat_answer_and_round_report_changes():
    clock = FakeClock()
    section = {
        "hosts": [{"name": "pa", "address": "/a"}, {"name": "pb", "address": "/b"}],
        "heartbeat_interval": 1,
    }
    changes = []
    beat = Heartbeat("pa", ProxydSettings.of(section), clock, changes.append)
    assert beat.active and beat.last_live == ["pa", "pb"]
    state = ServiceState({**dict.fromkeys(CATEGORIES, True), "other": False}, 7.0, "pb")
    reply = beat.answer({"from": "pb", "service": state.to_json()})
    assert reply["name"] == "pa" and reply["live"] == ["pa", "pb"]
    assert changes == [{"query": True, "submission": True, "other": False}]
    with pytest.raises(ValueError, match="not another daemon"):
        beat.answer({"from": "intruder", "service": state.to_json()})
    beat.take([BeatResult("pb", error="connection refused")])
    assert changes[-1] is None and beat.last_live == ["pa"]
    beat.take([BeatResult("pb", reply={"ok": False, "error": {"message": "forbidden"}})])
    assert beat.last_live == ["pa", "pb"]  # it answered: it runs and grants its share
    assert len(changes) == 3
    beat.take([BeatResult("pb", reply={"ok": True, "service": state.to_json()})])
    assert len(changes) == 3  # nothing new
    beat.answer({"from": "pb", "service": state.to_json(), "leaving": True})
    assert beat.last_live == ["pa"] and changes[-1] is None  # a clean stop frees its share now


# --- over-grant while views differ ----------------------------------------------------------


def _policy(share: int, clock: FakeClock) -> TokenPolicy:
    limits = {c: Limits(share, share, 0.0) for c in CATEGORIES}
    return TokenPolicy(PolicySettings(limits, token_wait_time=15), clock=clock)


def _ask(policy: TokenPolicy) -> str:
    return policy.request(Request(f"r{next(_ids)}", "query", "", "u", "h")).outcome


def test_shrunk_share_keeps_granted_tokens_and_stops_new_grants():
    """The documented bound: a survivor at the whole limit keeps what it granted when the
    other daemon rejoins, so until those tokens come back the two hold at most
    max + (max - share) = 8 + 4; the survivor grants again only under its new share."""
    clock = FakeClock()
    limits = {c: Limits(8, 8, 0.0) for c in CATEGORIES}
    pb_view = PeerView("pb", ["pa", "pb"], 1, clock)
    pb_view.heard("pa")
    pb_view.failed("pa", refused=True)  # pa died
    pb = _policy(8, clock)
    pb.reconfigure(PolicySettings(pb_view.share(limits), token_wait_time=15))
    held = [pb.request(Request(f"r{next(_ids)}", "query", "", "u", "h")) for _ in range(8)]
    assert [d.outcome for d in held] == [GRANTED] * 8
    # pa restarts: it counts pb as alive (never heard yet) and takes 4 at once
    pa_view = PeerView("pa", ["pa", "pb"], 1, clock)
    pa = _policy(pa_view.share(limits)["query"].max, clock)
    assert [_ask(pa) for _ in range(5)] == [GRANTED] * 4 + [QUEUED]
    pb_view.heard("pa")  # pa's first heartbeat
    pb.reconfigure(PolicySettings(pb_view.share(limits), token_wait_time=15))
    assert pb.status()["categories"]["query"]["in_use"] == 8  # nothing revoked
    total = pa.status()["categories"]["query"]["in_use"] + 8
    assert total == 12 == 8 + (8 - 4)
    assert _ask(pb) == QUEUED
    for decision in held[:4]:
        pb.release(decision.token.id)
    assert pb.tick().decisions == ()  # in use 4: at its share, still no grant
    pb.release(held[4].token.id)
    assert [d.outcome for d in pb.tick().decisions] == [GRANTED]


# --- real daemons ---------------------------------------------------------------------------


def status(path: str) -> dict:
    with ProxyClient([Daemon("d", path)]) as client:
        (host,) = client.admin("status")
    assert host.reply is not None and host.reply["ok"], host
    return host.reply["status"]


HOLD = """
import json, sys
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
client = ProxyClient([Daemon("pb", sys.argv[1])], notoken_ntries=1, when_unavailable="fail")
tokens = [client.acquire("query", "bjobs") for _ in range(int(sys.argv[2]))]
print(json.dumps([t.privileged for t in tokens]), flush=True)
sys.stdin.readline()
"""


def two_daemons(start_daemon, sockdir, interval: float):
    """Daemons pa and pb sharing QUERY[max=8] from one site config, heartbeat every
    ``interval`` seconds; and that config's section, to start one of them again."""
    hosts = [
        {"name": "pa", "address": str(sockdir / "pa.sock")},
        {"name": "pb", "address": str(sockdir / "pb.sock")},
    ]
    section = {
        "hosts": hosts,
        "policies": "QUERY[max=8 nominal=8]",
        "heartbeat_interval": interval,
        "socket": "",
    }
    return (
        start_daemon(section, name="pa", config_name="site.yaml"),
        start_daemon(section, name="pb", config_name="site.yaml"),
        section,
    )


def test_live_daemons_share_the_limits_and_the_service_state(start_daemon, sockdir, cli):
    a, b, section = two_daemons(start_daemon, sockdir, 1.0)
    limit = lambda d: status(d.socket)["categories"]["query"]["token_limit"]  # noqa: E731
    assert until(
        lambda: (
            status(a.socket)["peers"]["live"] == ["pa", "pb"]
            and status(b.socket)["peers"]["live"] == ["pa", "pb"]
        ),
        20,
    )
    assert until(lambda: (limit(a), limit(b)) == (4, 4), 20)
    text = cli("status", "-c", str(a.config)).stdout
    assert text.count("lsfproxyd service status:") == 2
    assert text.count("  LIVE DAEMONS: pa pb (heartbeat every 1 s)") == 2

    a.stop(signal.SIGKILL)
    assert until(lambda: limit(b) == 8, 20), status(b.socket)
    assert status(b.socket)["peers"]["live"] == ["pb"]
    # the survivor now grants the whole limit to an ordinary user
    holder = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", HOLD, b.socket, "8"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert holder.stdout.readline().strip() == json.dumps([False] * 8)
        assert status(b.socket)["categories"]["query"]["in_use"] == 8
        # a command while pa is down: pb confirms, pa is named as not reached
        out = cli("disable", "query", "-c", str(a.config))
        assert out.returncode == 1
        assert out.stdout.splitlines() == [
            "Unable to contact <pa>",
            "lsfproxyd service status on lsfproxyd host <pb>:",
            "  QUERY:DISABLED",
            "  SUBMISSION:ENABLED",
            "  OTHER:ENABLED",
        ]
        # pa comes back: it takes the service state from pb and both are at 4 again; pb keeps
        # the 8 tokens it granted (never revoked)
        a = start_daemon(section, name="pa", config_name="site.yaml")
        assert until(lambda: limit(b) == 4 and limit(a) == 4, 20)
        assert until(lambda: not status(a.socket)["categories"]["query"]["enabled"], 20)
        assert status(b.socket)["categories"]["query"]["in_use"] == 8
    finally:
        holder.stdin.close()
        holder.wait(20)
        holder.stdout.close()
    assert until(lambda: status(b.socket)["categories"]["query"]["in_use"] == 0, 20)
    out = cli("enable", "all", "-c", str(a.config))
    assert out.returncode == 0
    assert out.stdout.splitlines() == [
        "lsfproxyd service status on lsfproxyd host <pa>:",
        "  QUERY:ENABLED",
        "  SUBMISSION:ENABLED",
        "  OTHER:ENABLED",
        "lsfproxyd service status on lsfproxyd host <pb>:",
        "  QUERY:ENABLED",
        "  SUBMISSION:ENABLED",
        "  OTHER:ENABLED",
    ]
    text = cli("status", "-c", str(a.config)).stdout
    assert text.count("  QUERY: ENABLED") == 2


def test_heartbeat_over_signed_tcp(start_daemon, sockdir):
    """Daemons on two hosts talk TCP: the heartbeat is signed with the shared key like any
    admin command, and the split follows it."""
    ports = [free_port() for _ in range(2)]
    key = sockdir / "key"
    key.write_text("s3cret\n")
    key.chmod(0o600)  # a key others can read is refused
    hosts = [
        {"name": "pa", "address": f"127.0.0.1:{ports[0]}"},
        {"name": "pb", "address": f"127.0.0.1:{ports[1]}"},
    ]
    common = {
        "hosts": hosts,
        "policies": "QUERY[max=8 nominal=8]",
        "heartbeat_interval": 1.0,
        "key": {"file": str(key)},
    }

    def start(name, port):
        return start_daemon({**common, "tcp": f"127.0.0.1:{port}"}, name=name)

    a, b = start("pa", ports[0]), start("pb", ports[1])
    limit = lambda d: status(d.socket)["categories"]["query"]["token_limit"]  # noqa: E731
    assert until(
        lambda: all(
            status(d.socket)["peers"]["peers"][o]["heard_ago"] is not None
            for d, o in ((a, "pb"), (b, "pa"))
        ),
        20,
    )
    assert until(lambda: (limit(a), limit(b)) == (4, 4), 20)
    a.stop(signal.SIGKILL)
    assert until(lambda: limit(b) == 8, 20), status(b.socket)
    a = start("pa", ports[0])
    assert until(lambda: limit(a) == 4 and limit(b) == 4, 20)
    assert "heartbeat to pa not accepted" not in b.log()  # a forbidden or unsigned heartbeat


def test_rejoin_keeps_granted_tokens_and_the_total_stays_within_the_bound(start_daemon, sockdir):
    """The bound of docs/proxyd.md reached, not passed: the survivor holds 8 when the other
    daemon rejoins and takes 4, so 12 = max + max/2 are out; neither grants beyond that, and
    the survivor grants again only once its use is under its new share."""
    a, b, section = two_daemons(start_daemon, sockdir, 1.0)
    query = lambda d: status(d.socket)["categories"]["query"]  # noqa: E731
    a.stop(signal.SIGKILL)
    assert until(lambda: query(b)["token_limit"] == 8, 20)

    def hold(daemon, count):
        proc = subprocess.Popen(
            [*AS_NOBODY, sys.executable, "-c", HOLD, daemon.socket, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        procs.append(proc)
        return proc

    procs: list[subprocess.Popen] = []
    try:
        assert hold(b, 8).stdout.readline().strip() == json.dumps([False] * 8)
        a = start_daemon(section, name="pa", config_name="site.yaml")
        assert until(lambda: query(b)["token_limit"] == 4, 20)
        assert hold(a, 4).stdout.readline().strip() == json.dumps([False] * 4)
        assert query(a)["in_use"] + query(b)["in_use"] == 12
        # one more on each: both wait (pa is at its share, pb above it)
        hold(a, 1)
        waiting_b = hold(b, 1)
        assert until(lambda: query(a)["queued"] == 1 and query(b)["queued"] == 1, 20)
        assert query(a)["in_use"] + query(b)["in_use"] == 12
        procs[0].stdin.close()  # the 8 on pb come back; its waiter is served under 4
        assert waiting_b.stdout.readline().strip() == json.dumps([False])
        # the 8 come back one connection at a time: the waiter may be served once 5 are back,
        # beside 3 not yet returned, but never above pb's share of 4
        assert query(b)["in_use"] <= 4
        assert until(lambda: query(b)["in_use"] == 1, 20)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(20)
            proc.stdout.close()
            if not proc.stdin.closed:
                proc.stdin.close()


def test_a_daemon_that_stops_cleanly_frees_its_share_at_once(start_daemon, sockdir):
    """SIGTERM: the last heartbeat says it leaves, so the survivor does not wait for its own
    next heartbeat (30 s here) to take the whole limit."""
    a, b, section = two_daemons(start_daemon, sockdir, 30)
    assert until(lambda: status(b.socket)["peers"]["peers"]["pa"]["heard_ago"] is not None, 20)
    assert status(b.socket)["categories"]["query"]["token_limit"] == 4
    assert a.stop(signal.SIGTERM) == 0
    # no heartbeat of pb's own is due for 30 s: only pa's farewell can have done this
    assert status(b.socket)["peers"]["live"] == ["pb"]
    assert status(b.socket)["categories"]["query"]["token_limit"] == 8


def test_a_hung_daemon_is_left_out_after_three_intervals_and_back_when_it_answers(
    start_daemon, sockdir
):
    """SIGSTOP: connections still open (the kernel queues them) but nothing answers, so the
    heartbeats time out; pb drops pa only when it has missed 3 intervals, and takes it back at
    its first answer after SIGCONT."""
    a, b, section = two_daemons(start_daemon, sockdir, 1.0)
    peer = lambda: status(b.socket)["peers"]["peers"]["pa"]  # noqa: E731
    assert until(lambda: peer()["heard_ago"] is not None, 20)
    a.proc.send_signal(signal.SIGSTOP)
    try:
        assert until(lambda: not peer()["live"], 30)
        # dropped for silence, not for a refusal: it was last heard 3 intervals ago or more
        assert peer()["heard_ago"] >= 3 * 1.0
        assert status(b.socket)["categories"]["query"]["token_limit"] == 8
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert until(lambda: peer()["live"], 30)
    # pb may hear pa before pa, just resumed, has heard pb again
    assert until(
        lambda: (
            (
                status(b.socket)["categories"]["query"]["token_limit"],
                status(a.socket)["categories"]["query"]["token_limit"],
            )
            == (4, 4)
        ),
        20,
    )


def test_heartbeat_through_the_sites_redis(gridgate_exe, sockdir, tmp_path):
    """heartbeat_via: state: each daemon keeps a key with a TTL in the site's Redis (the
    state: section the directors share); a killed daemon's key runs out, a restarted one's
    comes back, and the service state travels in the keys too."""
    import yaml
    from support.redis_server import RedisServer

    hosts = [
        {"name": "pa", "address": str(sockdir / "pa.sock")},
        {"name": "pb", "address": str(sockdir / "pb.sock")},
    ]
    procs: dict[str, subprocess.Popen] = {}

    def start(name):
        err = open(sockdir / f"{name}.err", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            [gridgate_exe, "-v", "lsfproxyd", "serve", "-c", str(config), "--name", name, "--json"],
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
        err.close()
        procs[name] = proc
        line = proc.stdout.readline()
        assert line, (sockdir / f"{name}.err").read_text()
        return json.loads(line)["socket"]

    with RedisServer(tmp_path / "redis") as server:
        config = sockdir / "site.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "state": {"driver": "redis", "url": server.url, "prefix": "gg-peers:"},
                    "proxyd": {
                        "hosts": hosts,
                        "policies": "QUERY[max=8 nominal=8]",
                        # 1 s: keys live 3 s, long enough on a loaded machine
                        "heartbeat_interval": 1.0,
                        "heartbeat_via": "state",
                    },
                }
            )
        )
        try:
            a, b = start("pa"), start("pb")
            limit = lambda path: status(path)["categories"]["query"]["token_limit"]  # noqa: E731
            heard = lambda path, other: status(path)["peers"]["peers"][other]["heard_ago"]  # noqa: E731
            assert until(lambda: heard(a, "pb") is not None and heard(b, "pa") is not None, 20)
            assert sorted(k.decode() for k in server.client().keys("gg-peers:kv:proxyd.*")) == [
                "gg-peers:kv:proxyd.heartbeat.pa",
                "gg-peers:kv:proxyd.heartbeat.pb",
            ]
            # (pa may have taken 8 while it was alone, before pb's key came)
            assert until(lambda: (limit(a), limit(b)) == (4, 4), 20)
            procs["pa"].send_signal(signal.SIGKILL)
            procs["pa"].wait(20)
            assert until(lambda: limit(b) == 8, 20)  # its key ran out (3 intervals)
            with ProxyClient([Daemon("pb", b)]) as client:
                client.admin("disable", category="query")
            a = start("pa")
            assert until(lambda: limit(a) == 4 and limit(b) == 4, 20)
            assert until(lambda: not status(a)["categories"]["query"]["enabled"], 20)
            procs["pa"].send_signal(signal.SIGTERM)  # a clean stop deletes its key at once
            assert procs["pa"].wait(20) == 0
            assert server.client().get("gg-peers:kv:proxyd.heartbeat.pa") is None
            assert until(lambda: limit(b) == 8, 20)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
                proc.stdout.close()


def test_heartbeat_via_state_needs_a_shared_store(gridgate_exe, sockdir):
    import yaml

    config = sockdir / "site.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state": {"driver": "memory"},
                "proxyd": {
                    "hosts": [
                        {"name": "pa", "address": str(sockdir / "pa.sock")},
                        {"name": "pb", "address": str(sockdir / "pb.sock")},
                    ],
                    "heartbeat_via": "state",
                },
            }
        )
    )
    out = subprocess.run(
        [gridgate_exe, "lsfproxyd", "serve", "-c", str(config), "--name", "pa"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "needs a store the daemons share" in out.stderr
    assert "Traceback" not in out.stderr


def test_an_unreachable_state_store_keeps_the_peers_counted():
    """The store failing is no news of the daemons: they stay counted (the smaller share),
    where taking their silence for death would let every daemon grant the whole limit."""
    from gridgate.core.stores.redis import RedisState

    port = free_port()  # a port nothing listens on
    clock = FakeClock()
    section = {
        "hosts": [{"name": "pa", "address": "/a"}, {"name": "pb", "address": "/b"}],
        "heartbeat_interval": 1,
    }
    beat = Heartbeat("pa", ProxydSettings.of(section), clock, lambda _s: None)
    beat.view.heard("pb")
    beat.store = RedisState({"url": f"redis://127.0.0.1:{port}/0", "socket_timeout": 1}, clock)
    for _ in range(5):
        clock.advance(1)
        results = beat._store_round(beat.payload())
        assert [(r.name, r.reply["ok"]) for r in results] == [("pb", False)]
        assert "state store" in results[0].reply["error"]["message"]
        beat.take(results)
    assert beat.last_live == ["pa", "pb"]
