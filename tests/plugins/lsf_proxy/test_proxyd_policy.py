"""The token policy on a FakeClock: the seed's rules one by one, then hypothesis properties."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gridgate.core.clock import FakeClock
from gridgate.plugins.lsf_proxy.commands import category_of
from gridgate.plugins.lsf_proxy.config import (
    CATEGORIES,
    Limits,
    PolicyError,
    parse_policies,
    resolve_policies,
    split_limits,
)
from gridgate.plugins.lsf_proxy.daemon.policy import (
    DENIED,
    GRANTED,
    PROCEED,
    QUEUED,
    Blocklist,
    BlockRule,
    LocalTokens,
    PolicySettings,
    Request,
    TokenPolicy,
)

_ids = itertools.count(1)


def make(
    max_=4,
    nominal=2,
    throttle=0.01,
    wait=15.0,
    bound=1000,
    lease=300.0,
    admins=("root", "boss"),
    addon=("addon1",),
    clock=None,
    period=60.0,
):
    limits = {c: Limits(max_, nominal, throttle) for c in CATEGORIES}
    settings_ = PolicySettings(limits, wait, bound, lease, frozenset(admins), frozenset(addon))
    clock = clock or FakeClock()
    return TokenPolicy(settings_, clock=clock, sample_period=period), clock


def req(user="alice", host="h1", category="query", opcode="BATCH_JOB_QUERY"):
    return Request(f"q{next(_ids)}", category, opcode, user, host, 100)


# --- limits ---------------------------------------------------------------------------------


def test_policy_string_verbatim():
    text = 'PROXYD_POLICIES="QUERY[max=100 nominal=50 throttle=1] SUBMISSION[max=30] OTHER[nominal=150]"'
    limits = resolve_policies(text)
    assert limits["query"] == Limits(100, 50, 0.001)
    assert limits["submission"] == Limits(30, 30, 0.001)  # max < 50, nominal unset -> max
    assert limits["other"] == Limits(150, 150, 0.001)  # max unset, nominal > 100 -> nominal
    assert parse_policies("QUERY[ max=7 ]") == {"query": {"max": 7}}


@pytest.mark.parametrize(
    "text, path, words",
    [
        ("QUERY[max=10 nominal=20]", ("query", "nominal"), "must not exceed max"),
        ("SUBMISSION[max=0]", ("submission", "max"), "positive"),
        ("OTHER[throttle=-3]", ("other", "throttle"), "positive"),
        ("QUERY[max=ten]", ("query", "max"), "not an integer"),
        ("QUERIES[max=1]", (), "unknown category"),
        ("QUERY[speed=1]", ("query",), "unknown attribute"),
        ("QUERY[max=1", (), "cannot parse"),
    ],
)
def test_policy_errors_name_the_field(text, path, words):
    with pytest.raises(PolicyError) as info:
        resolve_policies(text)
    assert info.value.path == path
    assert words in str(info.value)


def test_category_map_defaults():
    assert [category_of(c) for c in ("bsub", "brestart", "bmod", "bswitch")] == ["submission"] * 4
    assert category_of("/usr/bin/bjobs") == "query"
    assert category_of("BATCH_JOB_QUERY") == "query"
    assert category_of("bkill") == "other"


# --- granting -------------------------------------------------------------------------------


def test_below_nominal_grants_at_once_then_throttles_then_waits_at_max():
    policy, clock = make(max_=4, nominal=2, throttle=0.5)
    d1, d2 = policy.request(req()), policy.request(req())
    assert (d1.outcome, d2.outcome) == (GRANTED, GRANTED)
    # in_use == nominal: one grant per throttle step
    d3 = policy.request(req())
    assert d3.outcome == QUEUED
    assert policy.next_wakeup() == pytest.approx(clock.monotonic() + 0.5)
    clock.advance(0.5)
    assert [d.outcome for d in policy.tick().decisions] == [GRANTED]
    d4 = policy.request(req())
    assert d4.outcome == QUEUED
    clock.advance(0.49)
    assert policy.tick().decisions == ()
    clock.advance(0.01)
    assert [d.outcome for d in policy.tick().decisions] == [GRANTED]
    assert policy.status()["categories"]["query"]["in_use"] == 4
    # at max: wait even after many throttle steps, until a release
    d5 = policy.request(req())
    clock.advance(5)
    assert policy.tick().decisions == ()
    policy.release(d1.token.id)
    granted = policy.tick().decisions
    assert [(d.request.id, d.outcome) for d in granted] == [(d5.request.id, GRANTED)]
    assert granted[0].waited == pytest.approx(5)


def test_round_robin_across_users_fifo_within_user():
    policy, clock = make(max_=1, nominal=1, throttle=0.0)
    held = policy.request(req("holder"))
    heavy = [policy.request(req("heavy")) for _ in range(500)]
    light = policy.request(req("light"))
    order = []
    token = held.token
    for _ in range(4):
        policy.release(token.id)
        (decision,) = policy.tick().decisions
        order.append(decision)
        token = decision.token
    users = [d.request.user for d in order]
    assert users == ["heavy", "light", "heavy", "heavy"]
    heavy_ids = [d.request.id for d in order if d.request.user == "heavy"]
    assert heavy_ids == [h.request.id for h in heavy[:3]]
    assert light.outcome == QUEUED


def test_wait_limit_denies_explicitly_and_counts_rejected():
    policy, clock = make(max_=1, nominal=1, wait=15)
    policy.request(req("a"))
    waiting = policy.request(req("b"))
    assert waiting.outcome == QUEUED
    assert policy.next_wakeup() == pytest.approx(clock.monotonic() + 15)
    clock.advance(14.9)
    assert policy.tick().decisions == ()
    clock.advance(0.1)
    (denied,) = policy.tick().decisions
    assert (denied.outcome, denied.reason) == (DENIED, "timeout")
    clock.advance(60)
    assert policy.status()["metrics"]["rejected.query"]["last"] == 1


def test_per_user_queue_bound_refuses_at_once():
    policy, _ = make(max_=1, nominal=1, bound=3)
    policy.request(req("a"))
    outcomes = [policy.request(req("greedy")).outcome for _ in range(5)]
    assert outcomes == [QUEUED] * 3 + [DENIED] * 2
    other = policy.request(req("modest"))
    assert other.outcome == QUEUED  # the bound is per user


def test_privileged_always_granted_and_counted():
    policy, _ = make(max_=2, nominal=1, throttle=0)
    for user in ("u1", "u2"):
        policy.request(req(user))
    assert policy.request(req("u3")).outcome == QUEUED
    root = policy.request(req("root"))
    boss = policy.request(req("boss"))
    addon = policy.request(req("anyone", host="addon1"))
    assert all(d.outcome == GRANTED and d.token.privileged for d in (root, boss, addon))
    row = policy.status()["categories"]["query"]
    assert (row["in_use"], row["in_use_privileged"], row["token_limit"]) == (5, 3, 2)
    policy.release(root.token.id)
    assert policy.status()["categories"]["query"]["in_use_privileged"] == 2
    # still above max: the ordinary waiter keeps waiting
    assert policy.tick().decisions == ()


def test_disabled_category_proceeds_without_token_and_frees_waiters():
    policy, _ = make(max_=1, nominal=1)
    policy.request(req("a"))
    waiting = policy.request(req("b"))
    answers = policy.set_enabled("query", False)
    assert [(d.request.id, d.outcome, d.reason) for d in answers] == [
        (waiting.request.id, PROCEED, "disabled")
    ]
    assert policy.request(req("c")).outcome == PROCEED
    assert policy.request(req("c", category="submission")).outcome == GRANTED
    policy.set_enabled("all", True)
    assert policy.request(req("c")).outcome == QUEUED
    with pytest.raises(ValueError):
        policy.set_enabled("queries", False)


def test_lease_expiry_takes_token_back_as_error():
    policy, clock = make(lease=30)
    granted = policy.request(req("sloppy", host="hx"))
    clock.advance(29)
    assert policy.tick().expired == ()
    clock.advance(1)
    (expired,) = policy.tick().expired
    assert (expired.id, expired.user, expired.host) == (granted.token.id, "sloppy", "hx")
    assert policy.status()["categories"]["query"]["in_use"] == 0
    assert policy.release(granted.token.id) is None  # a late release is harmless
    clock.advance(60)
    assert policy.status()["metrics"]["error"]["last"] == 1


def test_cancelled_waiter_is_skipped():
    policy, _ = make(max_=1, nominal=1, throttle=0)
    held = policy.request(req("a"))
    gone = policy.request(req("b"))
    stays = policy.request(req("c"))
    assert policy.cancel(gone.request.id)
    policy.release(held.token.id)
    (decision,) = policy.tick().decisions
    assert decision.request.id == stays.request.id


def test_metrics_last_max_average():
    policy, clock = make(max_=100, nominal=100, period=60)
    for count in (3, 7, 2):
        for _ in range(count):
            policy.request(req())
        clock.advance(60)
    row = policy.status()["metrics"]["requests.query"]
    assert (row["last"], row["max"], row["avg"]) == (2, 7, 4)
    clock.advance(120)  # two idle periods
    row = policy.status()["metrics"]["requests.query"]
    assert (row["last"], row["max"], row["avg"]) == (0, 7, 2)


# --- blocks ---------------------------------------------------------------------------------


def test_seed_block_sequence():
    policy, _ = make()
    rule1 = BlockRule.make(users=["user1", "user2"], hosts=["host1"])
    rule2 = BlockRule.make(users=["user1"])
    assert policy.block(rule1)[0] and policy.block(rule2)[0]
    assert policy.request(req("user1", "host9")).reason == "blocked"
    assert policy.unblock(BlockRule.make(users=["user1"]))
    assert policy.request(req("user1", "host9")).outcome == GRANTED
    assert policy.request(req("user1", "host1")).reason == "blocked"  # rule 1 stays
    assert policy.request(req("user2", "host1")).reason == "blocked"
    # each element of rule 1 is a rule of its own: user1@host1 can be unblocked alone
    assert policy.unblock(BlockRule.make(users=["user1"], hosts=["host1"])) == (
        BlockRule("pairs", ("user1@host1",)),
    )
    assert policy.request(req("user1", "host1")).outcome == GRANTED
    assert policy.request(req("user2", "host1")).reason == "blocked"


def test_unblock_one_user_of_a_block_of_two():
    """The seed: ``block -u "user1 user2"`` then ``unblock -u user1`` removes user1."""
    policy, _ = make()
    both = BlockRule.make(users=["user1", "user2"])
    added, _ = policy.block(both)
    assert both.partition(added) == (both, None)
    removed = policy.unblock(BlockRule.make(users=["user1"]))
    assert [r.describe() for r in removed] == ["Users <user1>"]
    assert policy.request(req("user1")).outcome == GRANTED
    assert policy.request(req("user2")).reason == "blocked"
    # unblocking one blocked and one unknown name: says which was which
    mixed = BlockRule.make(users=["user2", "user9"])
    done, kept = mixed.partition(policy.unblock(mixed))
    assert (done.describe(), kept.describe()) == ("Users <user2>", "Users <user9>")
    assert policy.blocklist.rules == ()


def test_blocklist_lists_names_in_blocking_order():
    blocklist = Blocklist()
    blocklist.add(BlockRule.make(users=["zed", "amy"]))
    blocklist.add(BlockRule.make(users=["bob"], hosts=["h2", "h1"]))
    blocklist.add(BlockRule.make(hosts=["hz", "ha"]))
    blocklist.add(BlockRule.make(users=["amy"]))  # already blocked: keeps its place
    assert blocklist.summary() == {
        "all": False,
        "users": ["zed", "amy"],
        "hosts": ["hz", "ha"],
        "pairs": ["bob@h2", "bob@h1"],
    }
    assert BlockRule.make(users=["user2", "user1"]).describe() == "Users <user2 user1>"


def test_unblock_all_removes_only_block_all():
    policy, _ = make()
    policy.block(BlockRule.make(users=["u1"]))
    policy.block(BlockRule.make(all_=True))
    assert policy.request(req("u2")).reason == "blocked"
    assert policy.request(req("root")).outcome == GRANTED  # never root or admins
    assert policy.request(req("boss")).outcome == GRANTED
    assert policy.request(req("x", host="addon1")).reason == "blocked"  # add-on hosts are
    assert policy.unblock(BlockRule.make(all_=True))
    assert policy.request(req("u2")).outcome == GRANTED
    assert policy.request(req("u1")).reason == "blocked"
    assert policy.status()["metrics"]["blocked"]["current"] == 3


def test_block_denies_waiting_requests():
    policy, _ = make(max_=1, nominal=1)
    policy.request(req("a"))
    waiting = policy.request(req("bad"))
    _, answers = policy.block(BlockRule.make(users=["bad"]))
    assert [(d.request.id, d.reason) for d in answers] == [(waiting.request.id, "blocked")]


def test_block_rule_shapes():
    with pytest.raises(ValueError):
        BlockRule.make()
    with pytest.raises(ValueError):
        BlockRule.make(all_=True, users=["u"])
    assert (
        BlockRule.make(users=["u1", "u2"], hosts=["a", "b"]).describe() == "<u1@a u1@b u2@a u2@b>"
    )
    assert BlockRule.make(users=["user1", "user2"]).describe() == "Users <user1 user2>"
    assert BlockRule.make(hosts=["hostA", "hostB"]).describe() == "Hosts <hostA hostB>"
    for odd in (["a b"], ["tab\there"], ["user1@hostA"]):
        with pytest.raises(ValueError, match="cannot contain"):
            BlockRule.make(users=odd)
    with pytest.raises(ValueError, match="cannot contain"):
        BlockRule.make(users=["u"], hosts=["host a"])


# --- the thread-safe wrapper ------------------------------------------------------------------


def test_local_tokens_threads_share_limits():
    import threading

    from gridgate.core.clock import SYSTEM_CLOCK

    # real threads waiting on each other need real time (nothing here waits for an expiry)
    policy, _ = make(max_=2, nominal=2, throttle=0, clock=SYSTEM_CLOCK)
    local = LocalTokens(policy)
    peak, lock, in_use = [0], threading.Lock(), [0]

    def worker():
        for _ in range(20):
            decision = local.acquire("query", user="t")
            assert decision.outcome == GRANTED
            with lock:
                in_use[0] += 1
                peak[0] = max(peak[0], in_use[0])
            with lock:
                in_use[0] -= 1
            local.release(decision.token.id)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert peak[0] <= 2
    assert policy.status()["categories"]["query"]["in_use"] == 0


# --- properties -----------------------------------------------------------------------------

users_st = st.sampled_from(["u1", "u2", "u3", "root", "boss"])
hosts_st = st.sampled_from(["h1", "h2", "addon1"])
event_st = st.one_of(
    st.tuples(st.just("req"), users_st, hosts_st, st.sampled_from(CATEGORIES)),
    st.tuples(st.just("rel"), st.integers(0, 50)),
    st.tuples(st.just("wait"), st.floats(0, 20)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(event_st, max_size=120),
    max_=st.integers(1, 6),
    nominal_cut=st.integers(0, 6),
    throttle=st.sampled_from([0.0, 0.001, 0.25, 2.0]),
    wait=st.sampled_from([1.0, 15.0]),
)
def test_property_limits_and_answer_time(events, max_, nominal_cut, throttle, wait):
    """Ordinary grants never take in_use above max; every request is answered within the wait
    limit plus one throttle step, when ticks happen at next_wakeup."""
    nominal = max(1, min(max_, nominal_cut))
    policy, clock = make(max_=max_, nominal=nominal, throttle=throttle, wait=wait, lease=1e9)
    tokens, waiting = [], {}

    def check(decision):
        cat = policy.status()["categories"][decision.request.category]
        if decision.outcome == GRANTED:
            tokens.append(decision.token)
            if not decision.token.privileged:
                assert cat["in_use"] <= max_
        if decision.final:
            waiting.pop(decision.request.id, None)
            assert decision.waited <= wait + throttle + 1e-9
        else:
            waiting[decision.request.id] = decision

    def advance_to(target):
        # a daemon ticks at every next_wakeup; do the same on the way to ``target``
        ticks = 0
        while (wake := policy.next_wakeup()) is not None and wake <= target:
            ticks += 1
            assert ticks < 10_000, (
                f"tick at next_wakeup {wake} makes no progress: a daemon would spin"
            )
            clock.advance(max(0.0, wake - clock.monotonic()))
            for d in policy.tick().decisions:
                check(d)
        clock.advance(max(0.0, target - clock.monotonic()))
        for d in policy.tick().decisions:
            check(d)

    for event in events:
        if event[0] == "req":
            check(policy.request(req(event[1], event[2], event[3])))
        elif event[0] == "rel" and tokens:
            policy.release(tokens.pop(event[1] % len(tokens)).id)
        elif event[0] == "cancel" and waiting:
            rid = sorted(waiting)[event[1] % len(waiting)]
            assert policy.cancel(rid)
            waiting.pop(rid)
        elif event[0] == "wait":
            advance_to(clock.monotonic() + event[1])
    advance_to(clock.monotonic() + wait + throttle + 0.001)
    assert waiting == {}


def test_throttle_step_is_granted_at_the_wakeup_it_announces():
    # found by the property above: at epoch-sized clock values ``now - last >= 0.001`` was
    # false at ``last + 0.001``, so the daemon's wakeup granted nothing and came again at once
    policy, clock = make(max_=2, nominal=1, throttle=0.001, wait=1.0, lease=1e9)
    assert policy.request(req("u1")).outcome == GRANTED
    assert policy.request(req("u1")).outcome != GRANTED  # at nominal: throttled
    wake = policy.next_wakeup()
    clock.advance(wake - clock.monotonic())
    assert [d.outcome for d in policy.tick().decisions] == [GRANTED]


@settings(max_examples=60, deadline=None)
@given(heavy=st.integers(5, 200), light_users=st.integers(1, 4), max_=st.integers(1, 4))
def test_property_round_robin_share(heavy, light_users, max_):
    """At saturation each user with something waiting gets a turn before any user a second."""
    policy, clock = make(max_=max_, nominal=max_, throttle=0, wait=1e9)
    held = [policy.request(req("holder")).token for _ in range(max_)]
    for _ in range(heavy):
        policy.request(req("heavy"))
    lights = [f"light{i}" for i in range(light_users)]
    for name in lights:
        for _ in range(3):
            policy.request(req(name))
    granted = Counter()
    rounds = 3 * (light_users + 1)
    for _ in range(rounds):
        policy.release(held.pop(0).id)
        for d in policy.tick().decisions:
            granted[d.request.user] += 1
            held.append(d.token)
    for name in lights:
        assert granted[name] == 3
    assert granted["heavy"] == rounds - 3 * light_users


rule_st = st.one_of(
    st.just(("all",)),
    st.tuples(st.just("u"), st.frozensets(st.sampled_from(["a", "b", "c"]), min_size=1)),
    st.tuples(st.just("m"), st.frozensets(st.sampled_from(["x", "y"]), min_size=1)),
    st.tuples(
        st.just("um"),
        st.frozensets(st.sampled_from(["a", "b"]), min_size=1),
        st.frozensets(st.sampled_from(["x", "y"]), min_size=1),
    ),
)


def _rule(spec):
    if spec[0] == "all":
        return BlockRule.make(all_=True)
    if spec[0] == "u":
        return BlockRule.make(users=sorted(spec[1]))
    if spec[0] == "m":
        return BlockRule.make(hosts=sorted(spec[1]))
    return BlockRule.make(users=sorted(spec[1]), hosts=sorted(spec[2]))


def _elements(spec):
    """The model: the element rules a spec names."""
    if spec[0] == "all":
        return {("all",)}
    if spec[0] == "u":
        return {("u", u) for u in spec[1]}
    if spec[0] == "m":
        return {("m", h) for h in spec[1]}
    return {("um", f"{u}@{h}") for u in spec[1] for h in spec[2]}


def _model_blocks(model, user, host):
    return bool({("all",), ("u", user), ("m", host), ("um", f"{user}@{host}")} & model)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), rule_st), max_size=30))
def test_property_block_algebra(ops):
    """Blocked iff some element rule in force matches; block adds and unblock removes each
    named element, and says exactly which changed."""
    blocklist, model = Blocklist(), set()
    for is_block, spec in ops:
        rule, elements = _rule(spec), _elements(spec)
        if is_block:
            assert {_key(r) for r in blocklist.add(rule)} == elements - model
            model |= elements
        else:
            assert {_key(r) for r in blocklist.remove(rule)} == elements & model
            model -= elements
        assert {_key(r) for r in blocklist.rules} == model
        for user in "abcd":
            for host in "xyz":
                assert blocklist.blocks(user, host) == _model_blocks(model, user, host)


def _key(rule):
    kind = {"all": "all", "users": "u", "hosts": "m", "pairs": "um"}[rule.kind]
    return (kind,) if kind == "all" else (kind, *rule.items)


@given(max_=st.integers(1, 10_000), nominal_cut=st.integers(1, 10_000), n=st.integers(1, 64))
def test_property_split_sums_to_limits(max_, nominal_cut, n):
    nominal = min(max_, nominal_cut)
    total = {"query": Limits(max_, nominal, 0.001)}
    shares = [split_limits(total, i, n)["query"] for i in range(n)]
    assert sum(s.max for s in shares) == max_
    assert sum(s.nominal for s in shares) == nominal
    assert all(s.nominal <= s.max for s in shares)
    assert max(s.max for s in shares) - min(s.max for s in shares) <= 1


def test_waiter_holding_fewer_tokens_goes_first():
    policy, _ = make(max_=3, nominal=3, throttle=0)
    heavy_tokens = [policy.request(req("heavy")).token for _ in range(2)]
    light_token = policy.request(req("light")).token
    for _ in range(3):
        policy.request(req("heavy"))  # queued first: first in the rotation
    light_waiting = policy.request(req("light"))
    policy.release(light_token.id)
    (decision,) = policy.tick().decisions
    # heavy still holds 2, light holds none: light's turn although heavy queued first
    assert decision.request.id == light_waiting.request.id
    policy.release(heavy_tokens[0].id)
    (decision,) = policy.tick().decisions
    assert decision.request.user == "heavy"


def test_released_tokens_do_not_pile_up_lease_entries():
    policy, _ = make(max_=10, nominal=10, throttle=0)
    for _ in range(20_000):
        policy.release(policy.request(req()).token.id)
    held = [policy.request(req()).token for _ in range(5)]
    assert len(policy._leases) <= 2 * len(held) + 1025
    assert policy.status()["categories"]["query"]["in_use"] == 5


# --- fairness beyond the seed: the rotation's tie-break, user_max, busy users -----------------


def handover(policy, token):
    """Give ``token`` back; the one decision the next tick makes."""
    policy.release(token.id)
    (decision,) = policy.tick().decisions
    return decision


def test_a_user_who_arrives_behind_a_flood_gets_the_next_token():
    # one token, a user with 31 requests queued holds it; a light user asks: when the token
    # comes back, both hold none, and the light user, served less recently, goes first
    # (the rotation used to put a newcomer behind the user it had just served)
    policy, _ = make(max_=1, nominal=1, throttle=0)
    token = policy.request(req("heavy")).token
    for _ in range(31):
        policy.request(req("heavy"))
    light = policy.request(req("light"))
    decision = handover(policy, token)
    assert decision.request.id == light.request.id
    assert handover(policy, decision.token).request.user == "heavy"


def test_a_user_served_a_moment_ago_comes_back_behind_one_who_waits():
    policy, _ = make(max_=1, nominal=1, throttle=0)
    first = policy.request(req("alice")).token  # alice served, then her queue is empty
    bob = policy.request(req("bob"))
    again = policy.request(req("alice"))
    decision = handover(policy, first)
    assert decision.request.id == bob.request.id
    assert handover(policy, decision.token).request.id == again.request.id


def capped(max_=3, user_max=2, **kwargs):
    policy, clock = make(max_=max_, nominal=max_, throttle=0, **kwargs)
    policy.reconfigure(
        PolicySettings(
            {c: Limits(max_, max_, 0.0, user_max=user_max) for c in CATEGORIES},
            15.0,
            1000,
            300.0,
            frozenset({"root", "boss"}),
            frozenset({"addon1"}),
        )
    )
    return policy, clock


def test_user_max_keeps_a_token_for_another_user():
    policy, clock = capped(max_=3, user_max=2)
    heavy = [policy.request(req("heavy")) for _ in range(5)]
    assert [d.outcome for d in heavy] == [GRANTED, GRANTED, QUEUED, QUEUED, QUEUED]
    # a token is free but heavy is at its user_max: nothing to do, and no busy wakeup
    assert policy.tick().decisions == ()
    assert policy.next_wakeup() == pytest.approx(clock.monotonic() + 15.0)
    assert policy.status()["categories"]["query"]["user_max"] == 2
    # another user is granted at once although heavy's requests queued first
    light = policy.request(req("light"))
    assert light.outcome == GRANTED
    # heavy gives one back: its own next request takes it, still at most 2 held
    policy.release(heavy[0].token.id)
    (decision,) = policy.tick().decisions
    assert decision.request.id == heavy[2].request.id
    assert policy.categories["query"].held["heavy"] == 2
    # light gives its token back: heavy stays capped, the token stays free
    policy.release(light.token.id)
    assert policy.tick().decisions == ()
    assert policy.categories["query"].in_use == 2
    # root and the admins are never capped
    assert [policy.request(req("root")).outcome for _ in range(3)] == [GRANTED] * 3


def test_user_max_in_the_policy_string_and_its_errors():
    limits = resolve_policies("QUERY[max=4 nominal=4 user_max=3]")
    assert limits["query"].user_max == 3 and limits["query"].per_user == 3
    assert limits["submission"].user_max is None and limits["submission"].per_user == 100
    with pytest.raises(PolicyError) as err:
        resolve_policies({"query": {"max": 4, "user_max": 5}})
    assert err.value.path == ("query", "user_max") and "must not exceed max (4)" in str(err.value)
    with pytest.raises(PolicyError) as err:
        resolve_policies("QUERY[max=4 user_max=0]")
    assert err.value.path == ("query", "user_max")
    # split over daemons like max, never below one token nor above the daemon's max
    shares = [
        split_limits(resolve_policies("QUERY[max=5 user_max=3]"), i, 3)["query"] for i in range(3)
    ]
    assert [(s.max, s.user_max) for s in shares] == [(2, 1), (2, 1), (1, 1)]


def test_a_busy_user_is_told_to_run_niced():
    policy, _ = make(max_=2, nominal=2, throttle=0)
    policy.reconfigure(
        PolicySettings(
            policy.settings.limits,
            15.0,
            1000,
            300.0,
            frozenset({"root"}),
            frozenset(),
            busy_after=3,
            busy_nice=12,
        )
    )
    first = policy.request(req("heavy"))
    assert policy.nice_for(first.token) == 0  # one in flight
    second = policy.request(req("heavy"))
    assert policy.nice_for(second.token) == 0  # two
    policy.request(req("heavy"))  # a third waits: heavy is busy
    assert policy.nice_for(second.token) == 12
    root = policy.request(req("root"))
    assert policy.nice_for(root.token) == 0
    policy.reconfigure(PolicySettings(policy.settings.limits, busy_after=None))
    assert policy.nice_for(second.token) == 0


def test_a_block_keeps_who_holds_it_across_a_restart_and_an_operator_takes_it_over(
    tmp_path,
) -> None:
    """Issue 40 item 10: the audit's block is held by its change (the undo lifts only that);
    an operator blocking the same user takes it over, and the file keeps who holds each."""
    from gridgate.plugins.lsf_proxy.daemon.blockfile import BlocklistFile

    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    rogue, other = BlockRule.make(users=["rogue"]), BlockRule.make(users=["other"])
    blocklist = Blocklist()
    assert blocklist.add(rogue, by="change-1") == (rogue,)
    assert blocklist.add(other) == (other,)
    kept = BlocklistFile(folder / "blocklist.json", True, lambda *a: None)
    kept.save(blocklist)
    again = kept.load()
    assert again.rules == (rogue, other)
    assert again.holder(rogue) == "change-1" and again.holder(other) == ""
    assert again.add(rogue) == (rogue,), "the operator's block takes it over"
    assert again.holder(rogue) == "" and again.add(rogue) == (), "theirs already"
    assert again.add(other, by="change-2") == () and again.holder(other) == ""
    assert again.holder(BlockRule.make(users=["nobody"])) is None
