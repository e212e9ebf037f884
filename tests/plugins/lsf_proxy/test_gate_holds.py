"""Hold limits on the injected clock: a token held past its command's limit goes back and the
next user is served; the daemon writes it in the diagnostic log and status lists the
longest-held tokens."""

from __future__ import annotations

from support.polling import until
from test_proxyd_clock import admin_status, fake_daemon  # noqa: F401  (a fixture)

from gridgate.core.clock import FakeClock
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.config import Limits
from gridgate.plugins.lsf_proxy.daemon.holding import longest_held
from gridgate.plugins.lsf_proxy.daemon.policy import (
    GRANTED,
    QUEUED,
    PolicySettings,
    Request,
    TokenPolicy,
)


def test_a_long_held_token_is_returned_at_the_hold_limit_while_another_user_is_served() -> None:
    clock = FakeClock()
    limits = {"query": Limits(max=1, nominal=1), "submission": Limits(), "other": Limits()}
    policy = TokenPolicy(
        PolicySettings(limits, token_wait_time=120, lease_time=300, hold_limits={"squeue": 30}),
        clock=clock,
    )
    alice = policy.request(Request("a", "query", "squeue", "alice", "ui1"))
    assert alice.outcome == GRANTED
    bob = policy.request(Request("b", "query", "bjobs", "bob", "ui2"))
    assert bob.outcome == QUEUED
    clock.advance(29)
    assert policy.tick().decisions == ()
    [held] = longest_held(policy)
    assert (held["user"], held["opcode"], held["held"], held["left"]) == ("alice", "squeue", 29, 1)
    clock.advance(1)
    result = policy.tick()
    assert [t.user for t in result.expired] == ["alice"]
    [served] = result.decisions
    assert (served.request.user, served.outcome, served.waited) == ("bob", GRANTED, 30)
    # bjobs has no override: its token may be held for lease_time
    assert served.token is not None and served.token.expires_at == clock.monotonic() + 300
    assert [h["user"] for h in longest_held(policy)] == ["bob"]


def test_the_daemon_takes_a_token_back_at_its_hold_limit_and_logs_it(
    fake_daemon,  # noqa: F811
    sockdir,
) -> None:
    log = sockdir / "diag.log"
    daemon, clock = fake_daemon(hold_limits={"squeue": 30}, diagnose=True, diagnose_file=str(log))
    with ProxyClient([Daemon("d", daemon.socket_path)]) as client:
        long = client.acquire("query", "squeue")
        short = client.acquire("query", "bjobs")
        clock.advance(10)
        held = admin_status(daemon.socket_path)["longest_held"]
        assert [(h["opcode"], h["held"], h["left"]) for h in held] == [
            ("squeue", 10, 20),
            ("bjobs", 10, 290),
        ]
        clock.advance(20)
        daemon.wake()
        assert until(lambda: admin_status(daemon.socket_path)["categories"]["query"]["in_use"] == 1)
        assert [h["opcode"] for h in admin_status(daemon.socket_path)["longest_held"]] == ["bjobs"]
        lines = until(lambda: [ln for ln in log.read_text().splitlines() if "HOLD_LIMIT" in ln])
        fields = lines[0].split(" ")[-1].split(",")
        assert fields[:5] == ["QUERY_HOLD_LIMIT", "squeue", "root", daemon.local_host, "30"]
        short.release()
        long.release()  # late: harmless
