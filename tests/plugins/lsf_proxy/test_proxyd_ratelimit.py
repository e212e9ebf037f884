"""The per-user rate limit (Slurm's rl_* token buckets) in front of the token policy, on a
FakeClock: bursts, refills, waits within the wait limit, denials in their own row, fairness."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridgate.core.clock import FakeClock
from gridgate.core.config import load_config
from gridgate.plugins.lsf_proxy.config import CATEGORIES, Limits
from gridgate.plugins.lsf_proxy.daemon.policy import (
    DENIED,
    GRANTED,
    PROCEED,
    QUEUED,
    BlockRule,
    PolicySettings,
    Request,
)
from gridgate.plugins.lsf_proxy.daemon.ratelimit import (
    RatedSettings,
    RateLimit,
    RateLimitedPolicy,
    rate_limits_from,
)
from gridgate.plugins.lsf_proxy.settings import ProxydSettings

_ids = itertools.count(1)


def make(bucket=3, rate=1, period=10.0, max_=100, wait=15.0, bound=1000, clock=None):
    limits = {c: Limits(max_, max_, 0.0) for c in CATEGORIES}
    base = PolicySettings(limits, wait, bound, 300.0, frozenset({"root"}), frozenset({"addon"}))
    rated = RatedSettings.extend(base, {"query": RateLimit(bucket, rate, period)})
    clock = clock or FakeClock()
    return RateLimitedPolicy(rated, clock=clock), clock


def req(user="alice", category="query", host="h1"):
    return Request(f"q{next(_ids)}", category, "BATCH_JOB_QUERY", user, host, 1)


def outcomes(decisions):
    return [d.outcome for d in decisions]


def test_burst_then_one_request_per_refill():
    policy, clock = make(bucket=3, rate=1, period=10)
    assert outcomes(policy.request(req()) for _ in range(3)) == [GRANTED] * 3
    late = [policy.request(req()) for _ in range(2)]
    assert outcomes(late) == [QUEUED, QUEUED]
    assert policy.status()["categories"]["query"]["rate_waiting"] == 2
    assert policy.next_wakeup() == pytest.approx(clock.monotonic() + 10)
    clock.advance(9.99)
    assert policy.tick().decisions == ()
    clock.advance(0.01)
    (first,) = policy.tick().decisions
    assert (first.request.id, first.outcome) == (late[0].request.id, GRANTED)
    assert first.waited == pytest.approx(10)
    # other categories have no rate limit
    assert outcomes(policy.request(req(category="other")) for _ in range(10)) == [GRANTED] * 10


def test_over_rate_waits_then_is_denied_in_its_own_row():
    policy, clock = make(bucket=1, rate=1, period=60, wait=15)
    assert policy.request(req()).outcome == GRANTED
    waiting = policy.request(req())
    assert waiting.outcome == QUEUED
    assert policy.next_wakeup() == pytest.approx(clock.monotonic() + 15)  # before the refill
    clock.advance(15)
    (denied,) = policy.tick().decisions
    assert (denied.request.id, denied.outcome, denied.reason) == (
        waiting.request.id,
        DENIED,
        "rate_limited",
    )
    rows = policy.status()["metrics"]
    assert rows["ratelimited.query"]["current"] == 1
    assert rows["rejected.query"]["current"] == 0
    assert policy.status()["rate_limits"]["query"]["bucket_size"] == 1


def test_rate_and_token_wait_share_one_wait_limit():
    """Delayed 10 s by the rate, then queued for a token: denied 15 s after it was received."""
    policy, clock = make(bucket=1, rate=1, period=10, max_=1, wait=15)
    assert policy.request(req("holder")).outcome == GRANTED  # the only token
    first = policy.request(req())  # through the rate, waits for a token
    second = policy.request(req())  # waits for the rate
    assert outcomes([first, second]) == [QUEUED, QUEUED]
    clock.advance(10)
    assert policy.tick().decisions == ()  # the refill let it on to the token queue
    status = policy.status()["categories"]["query"]
    assert (status["queued"], status["rate_waiting"]) == (2, 0)
    clock.advance(5)
    denied = policy.tick().decisions
    assert [(d.request.id, d.reason) for d in denied] == [
        (first.request.id, "timeout"),
        (second.request.id, "timeout"),
    ]
    assert denied[1].waited == pytest.approx(15)


def test_fair_across_users_a_flood_never_slows_a_light_user():
    policy, clock = make(bucket=2, rate=1, period=1, wait=1000)
    granted = {"flood": 0, "light": 0}

    def count(decision):
        if decision.outcome == GRANTED:
            granted[decision.request.user] += 1
            policy.release(decision.token.id)  # the command is quick
        return decision

    for second in range(100):
        for _ in range(50):
            count(policy.request(req("flood")))
        decision = count(policy.request(req("light")))
        assert decision.outcome == GRANTED, second  # at one request a second, never delayed
        clock.advance(1)
        for decision in policy.tick().decisions:
            count(decision)
    # the flood got its burst and then its rate: 2 + 1 per refill, no more
    assert granted == {"flood": 2 + 100, "light": 100}


def test_privileged_users_are_not_rate_limited():
    policy, _clock = make(bucket=1, rate=1, period=60)
    assert outcomes(policy.request(req("root")) for _ in range(5)) == [GRANTED] * 5
    assert outcomes(policy.request(req("bob", host="addon")) for _ in range(5)) == [GRANTED] * 5
    assert policy.request(req("bob")).outcome == GRANTED
    assert policy.request(req("bob")).outcome == QUEUED


def test_disable_block_cancel_shutdown_answer_rate_waiters():
    policy, clock = make(bucket=1, rate=1, period=60)
    policy.request(req("a"))
    policy.request(req("b"))
    wa, wb, wb2 = policy.request(req("a")), policy.request(req("b")), policy.request(req("b"))
    assert outcomes([wa, wb, wb2]) == [QUEUED] * 3
    assert policy.has_waiters()
    assert policy.cancel(wb2.request.id) and not policy.cancel(wb2.request.id)
    added, blocked = policy.block(BlockRule.make(users=["b"]))
    assert added and [(d.request.id, d.reason) for d in blocked] == [(wb.request.id, "blocked")]
    assert policy.status()["metrics"]["blocked"]["current"] == 1
    answered = policy.set_enabled("query", False)
    assert [(d.request.id, d.outcome) for d in answered] == [(wa.request.id, PROCEED)]
    policy.set_enabled("query", True)
    policy.unblock(BlockRule.make(users=["b"]))
    late = policy.request(req("a"))
    assert late.outcome == QUEUED
    (stopped,) = policy.shutdown()
    assert (stopped.request.id, stopped.reason) == (late.request.id, "shutdown")
    assert not policy.has_waiters()


def test_a_shrunk_bucket_holds_no_more_than_its_new_size():
    policy, clock = make(bucket=10, rate=1, period=60)
    assert policy.request(req()).outcome == GRANTED  # alice's bucket exists, 9 left
    policy.reconfigure(RatedSettings.extend(policy.settings, {"query": RateLimit(2, 1, 60)}))
    assert outcomes(policy.request(req()) for _ in range(3)) == [GRANTED, GRANTED, QUEUED]


def test_ahead_counts_the_requests_queued_before():
    policy, _clock = make(bucket=1, rate=1, period=60, max_=1)
    policy.request(req("holder"))  # the only token; holder's bucket is its own
    first = policy.request(req())  # through the rate, waits for a token
    rated = [policy.request(req()) for _ in range(3)]  # wait for alice's rate
    assert policy.ahead(first.request.id) == 0
    assert [policy.ahead(d.request.id) for d in rated] == [0, 1, 2]
    other = policy.request(req("bob"))  # bob's bucket is full: on to the token queue
    assert policy.ahead(other.request.id) == 1
    assert policy.ahead("unknown") == 0


def test_queue_bound_applies_to_the_rate_stage():
    policy, _clock = make(bucket=1, rate=1, period=60, bound=2)
    policy.request(req())
    assert outcomes(policy.request(req()) for _ in range(3)) == [QUEUED, QUEUED, DENIED]
    assert policy.status()["metrics"]["rejected.query"]["current"] == 1


def test_reconfigured_without_a_rate_limit_lets_waiters_through():
    policy, _clock = make(bucket=1, rate=1, period=60)
    policy.request(req())
    waiting = policy.request(req())
    policy.reconfigure(RatedSettings.extend(policy.settings, {}))
    (decision,) = policy.tick().decisions
    assert (decision.request.id, decision.outcome) == (waiting.request.id, GRANTED)


def test_rate_limits_from_the_config_split_over_live_daemons(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(
        "proxyd:\n  rate_limit:\n    query: {bucket_size: 10, refill_rate: 4}\n"
        "    submission: {enable: false}\n"
    )
    section = load_config(path)["proxyd"]
    rates = ProxydSettings.of(section).rate_limit
    assert rate_limits_from(rates) == {"query": RateLimit(10, 4, 1)}
    assert rate_limits_from(rates, 2) == {"query": RateLimit(5, 2, 1)}
    assert rate_limits_from(rates, 20) == {"query": RateLimit(1, 0.2, 1)}  # one at least
    bad = tmp_path / "bad.yaml"
    bad.write_text("proxyd:\n  rate_limit:\n    query: {bucket_size: 0}\n")
    with pytest.raises(Exception, match=r"bad.yaml:3: proxyd.rate_limit.query.bucket_size"):
        load_config(bad)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["u1", "u2", "u3"]), st.floats(0, 3)), max_size=80),
    st.integers(1, 5),
    st.integers(1, 3),
    st.sampled_from([0.5, 1.0, 2.5]),
)
def test_property_grants_never_exceed_the_bucket(arrivals, bucket, rate, period):
    """Over any window from the start, a user's grants <= bucket + rate x whole periods; and
    a request is answered by the wait limit at the latest."""
    policy, clock = make(bucket=bucket, rate=rate, period=period, wait=4)
    start = clock.monotonic()
    grants: dict[str, int] = {}
    asked: dict[str, float] = {}
    answered: set[str] = set()

    def note(decisions):
        for d in decisions:
            answered.add(d.request.id)
            assert clock.monotonic() - asked[d.request.id] <= 4 + 1e-9
            if d.outcome == GRANTED:
                grants[d.request.user] = grants.get(d.request.user, 0) + 1
                periods = int((clock.monotonic() - start) / period + 1e-9)
                assert grants[d.request.user] <= bucket + rate * periods

    def run_for(gap):
        # a daemon ticks at every wakeup the policy announces
        wake = policy.next_wakeup()
        while wake is not None and wake <= clock.monotonic() + gap:
            step = max(0.0, wake - clock.monotonic())
            gap -= step
            clock.advance(step)
            note(policy.tick().decisions)
            wake = policy.next_wakeup()
        clock.advance(gap)
        note(policy.tick().decisions)

    for user, gap in arrivals:
        run_for(gap)
        r = req(user)
        asked[r.id] = clock.monotonic()
        d = policy.request(r)
        if d.final:
            note([d])
    run_for(5)
    assert answered == set(asked)
