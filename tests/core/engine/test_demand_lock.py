"""Several directors on one Redis share the demand groups (core/engine/sharing.py, issue 43):
each group is filled by one of the live directors, the holder of its lease; the groups are
split fairly; a director that stops (dead: its leases lapse; clean: handed back) leaves its
groups to the others; a lease that lapsed stops a director's tail; while the store is down
each director keeps only the groups it held."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from support.director import BACKEND, ScriptedBackend, TrackingBackend
from support.redis_server import RedisServer

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.engine.sharing import LEASE, DemandShare, assign
from gridgate.core.model import BackendInfo, CredentialStatus, IterationSummary
from gridgate.core.state import StateStore
from gridgate.core.stores.postgresql import PostgresqlState
from gridgate.core.stores.redis import RedisState
from gridgate.core.testing import Collector, make_config

GROUPS = [f"g{i}" for i in range(8)]


def _doc(groups: list[str], pilots: int = 2, **director: object) -> dict:
    return {
        "director": {
            "cycle_seconds": 60,
            "max_threads": 2,
            "command_timeout": 5,
            "demand_lock": True,
            "lease_seconds": 90,  # renewed at each plan; the timer's real seconds never pass here
            "pilots": {"max_waiting": None},
            **director,
        },
        "state": {"driver": "memory"},  # replaced by the shared Redis below
        "demand": {"static": {BACKEND: [{"group": g, "pilots": pilots} for g in groups]}},
        "selectors": {"random": {"seed": 7}},
    }


def _director(
    url: str, prefix: str, clock: FakeClock, doc: dict
) -> tuple[Director, ScriptedBackend]:
    state = RedisState({"url": url, "prefix": prefix, "socket_timeout": 0.5}, clock=clock)
    return _on(state, clock, doc)


def _on(state: StateStore, clock: FakeClock, doc: dict) -> tuple[Director, ScriptedBackend]:
    backend = ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})
    d = Director(make_config(doc), clock=clock, extra_plugins=[backend, Collector()], state=state)
    return d, backend


@pytest.fixture(params=["redis", "postgresql"])
def shared(request, monkeypatch) -> Callable[[FakeClock], StateStore]:
    """Makes stores of one shared place: a key prefix of a Redis, a schema of a PostgreSQL."""
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        prefix = f"share-{uuid.uuid4().hex[:8]}:"
        return lambda clock: RedisState({"url": server.url, "prefix": prefix}, clock=clock)
    cluster = request.getfixturevalue("postgres_server")
    monkeypatch.setenv("GG_TEST_PG_PW", cluster.password)
    section = {
        "dsn": cluster.dsn,
        "password": {"env": "GG_TEST_PG_PW"},
        "schema": f"share_{uuid.uuid4().hex[:8]}",
    }
    return lambda clock: PostgresqlState(section, clock=clock)


def _filled(summary: IterationSummary) -> Counter[str]:
    filled: Counter[str] = Counter()
    for r in summary.records:
        if r.outcome == "submitted":
            filled[r.group] += r.pilots
    return filled


def test_the_groups_are_split_fairly_and_no_group_is_filled_twice_in_a_round(shared) -> None:
    clock = FakeClock()
    directors = [_on(shared(clock), clock, _doc(GROUPS)) for _ in range(4)]
    try:
        rounds: list[list[IterationSummary]] = []
        for _ in range(4):
            rounds.append([d.run_iteration() for d, _b in directors])
            clock.advance(60)
        fills = [[_filled(s) for s in summaries] for summaries in rounds]
        for each in fills:  # never two directors on one group in a round
            seen = [g for filled in each for g in filled]
            assert len(seen) == len(set(seen)), each
        settled = fills[-1]  # once every director is known: 2 groups each, all 8 filled
        assert sorted(len(f) for f in settled) == [2, 2, 2, 2], settled
        assert sum(sum(f.values()) for f in settled) == 2 * len(GROUPS)
        skipped = {
            (r.outcome, r.failure_kind) for r in rounds[-1][0].records if r.group not in settled[0]
        }
        assert skipped == {("skipped", "claimed_elsewhere")}
    finally:
        for d, _b in directors:
            d.close()


def test_a_dead_directors_groups_are_taken_when_its_leases_lapse_a_clean_stop_at_once(
    shared,
) -> None:
    clock = FakeClock()
    (a, _ba), (b, _bb), (c, _bc) = [_on(shared(clock), clock, _doc(GROUPS)) for _ in range(3)]
    try:
        for _ in range(3):
            for d in (a, b, c):
                d.run_iteration()
            clock.advance(60)
        held_by_a = set(_filled(a.run_iteration()))
        assert held_by_a
        # a dies (never closes, never renews): within its lease (90 s) nobody takes its groups
        clock.advance(60)
        got = set(_filled(b.run_iteration())) | set(_filled(c.run_iteration()))
        assert not got & held_by_a
        clock.advance(31)  # past a's lease and heartbeat: b and c share everything
        first = [_filled(b.run_iteration()), _filled(c.run_iteration())]
        clock.advance(60)
        second = [_filled(b.run_iteration()), _filled(c.run_iteration())]
        taken = set(first[0]) | set(first[1]) | set(second[0]) | set(second[1])
        assert held_by_a <= taken
        assert set(second[0]) | set(second[1]) == set(GROUPS)
        assert not set(second[0]) & set(second[1])
        # c stops cleanly: its leases are handed back, b takes all at its next iteration
        c.close()
        clock.advance(1)
        assert set(_filled(b.run_iteration())) == set(GROUPS)
    finally:
        for d in (a, b, c):
            d.close()


def test_a_lease_taken_over_stops_the_holders_tail(redis_server) -> None:
    """A holder whose lease lapsed (it hung past it) and was taken by another director submits
    nothing more to that group, even in the middle of an iteration."""
    clock = FakeClock()
    prefix = f"share-{uuid.uuid4().hex[:8]}:"
    a, _ba = _director(redis_server.url, prefix, clock, _doc(["g0"]))
    b, _bb = _director(redis_server.url, prefix, clock, _doc(["g0"]))
    try:
        a.run_iteration()
        share: DemandShare = a.runner.share
        assert share.holds((BACKEND, "g0"))
        clock.advance(91)  # a's lease lapsed in the store; b takes the group
        assert sum(_filled(b.run_iteration()).values()) == 2
        share.renew()  # a's timer: the store says the lease is b's now
        assert not share.holds((BACKEND, "g0"))
        assert a.state.get(f"{LEASE}{BACKEND}/g0") == b.runner.share.instance
    finally:
        a.close()
        b.close()


def test_while_redis_is_down_only_the_last_holder_fills_the_group(tmp_path) -> None:
    """Issue 31, item 9: during a store outage each director falls back to its own view, in
    which every lease is free: without care both would fill the group. The holder keeps it,
    the other fills nothing, until the store answers again."""
    import os
    import signal

    clock = FakeClock()
    with RedisServer(tmp_path / "redis") as server:
        prefix = f"lock-{uuid.uuid4().hex[:8]}:"
        (first, first_backend), (second, second_backend) = [
            _director(server.url, prefix, clock, _doc(["g0"], pilots=5)) for _ in range(2)
        ]
        try:
            first.run_iteration(), second.run_iteration()  # the first holds the group
            clock.advance(60)
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                for _ in range(2):
                    a, b = first.run_iteration(), second.run_iteration()
                    assert sum(_filled(a).values()) == 5
                    assert not [r for r in b.records if r.outcome == "submitted"]
                    clock.advance(60)
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert len(second_backend.calls) == 0 and len(first_backend.calls) == 15
        finally:
            first.close()
            second.close()


def test_after_the_store_came_back_empty_no_group_is_filled_twice(redis_server) -> None:
    """Redis restarted without its data: the first director to plan sees only itself and
    takes every group; the others then find their groups held by it. Before, a director whose
    lease was taken so kept it as its own until its timer noticed (its own reckoning said the
    lease had time left) and filled it in the same round as the new holder."""
    clock, prefix = FakeClock(), f"share-{uuid.uuid4().hex[:8]}:"
    a, b = [_director(redis_server.url, prefix, clock, _doc(GROUPS[:4]))[0] for _ in range(2)]
    try:
        for _ in range(3):
            a.run_iteration(), b.run_iteration()
            clock.advance(60)
        redis_server.client().flushall()  # what a restart without persistence leaves
        for _ in range(3):
            first, second = _filled(b.run_iteration()), _filled(a.run_iteration())
            assert not set(first) & set(second), (first, second)
            clock.advance(60)
        assert sorted([len(first), len(second)]) == [2, 2]
    finally:
        a.close()
        b.close()


def test_a_director_whose_store_fails_during_its_plan_takes_no_group(tmp_path) -> None:
    """The store fails between the check at the start of a director's plan and its leases
    (here: Redis out of memory, so its first write fails): the rest of the plan is answered
    from the local view, which knows no other director's lease. Before, a director that held
    nothing (just started) took every group there, while the others still held them, and
    went on filling them all through the outage."""
    clock = FakeClock()
    with RedisServer(tmp_path / "redis") as server:
        prefix = f"lock-{uuid.uuid4().hex[:8]}:"
        a, b, late = [_director(server.url, prefix, clock, _doc(GROUPS[:4]))[0] for _ in range(3)]
        try:
            for _ in range(3):
                a.run_iteration(), b.run_iteration()
                clock.advance(60)
            held = dict(a.state.items(LEASE))
            assert len(held) == 4
            admin = server.client()
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", "1")  # every write refused, reads answered
            try:
                share: DemandShare = late.runner.share
                claimed = share.plan((BACKEND, g) for g in GROUPS[:4])
                assert claimed == set()
                assert not any(share.holds((BACKEND, g)) for g in GROUPS[:4])
                assert not _filled(late.run_iteration())  # the outage: only holders fill
            finally:
                admin.config_set("maxmemory", "0")
            assert dict(a.state.items(LEASE)) == held
        finally:
            for d in (a, b, late):
                d.close()


# --- the assignment ----------------------------------------------------------------------------


def test_assign_gives_each_director_a_fair_share_and_moves_few_groups_when_one_leaves() -> None:
    groups = [f"b/g{i}" for i in range(16)]
    directors = ["h1:1:a", "h2:2:b", "h3:3:c", "h4:4:d"]
    out = assign({g: set(directors) for g in groups})
    assert sorted(Counter(out.values()).values()) == [4, 4, 4, 4]
    assert assign({g: set(reversed(directors)) for g in reversed(groups)}) == out  # any order
    after = assign({g: set(directors[:3]) for g in groups})
    moved = [g for g in groups if out[g] != after[g]]
    assert {g for g in groups if out[g] == directors[3]} <= set(moved) and len(moved) <= 8
    assert sorted(Counter(after.values()).values()) == [5, 5, 6]


def test_assign_only_to_a_groups_candidates() -> None:
    out = assign({"b/g0": {"x"}, "b/g1": {"x", "y"}, "b/g2": {"x", "y"}, "b/g3": {"y"}})
    assert out["b/g0"] == "x" and out["b/g3"] == "y"
    assert Counter(out.values()) == Counter({"x": 2, "y": 2})


@pytest.mark.parametrize("n", [1, 2, 3])
def test_assign_with_fewer_groups_than_directors_gives_each_group_one_director(n: int) -> None:
    out = assign({f"b/g{i}": {"a", "b", "c", "d"} for i in range(n)})
    assert len(out) == n and len(set(out.values())) == n


class _Credential:
    """A credential plugin whose token is usable or not, as the test says."""

    def __init__(self, usable: bool) -> None:
        self.usable = usable

    @hookimpl
    def gridgate_check_credentials(self, iteration, timeout, credentials) -> None:  # noqa: ANN001
        message = "token ok" if self.usable else "token expired at 12:00"
        credentials.add(CredentialStatus("tok", "token", self.usable, "/t", message=message))


class _NeedsToken(ScriptedBackend):
    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        if backend != BACKEND:
            return None
        return BackendInfo(BACKEND, self.endpoints, credentials=("token",))


def test_a_director_that_cannot_use_the_credential_leaves_its_groups_to_another(
    redis_server,
) -> None:
    clock, prefix = FakeClock(), f"share-{uuid.uuid4().hex[:8]}:"
    credentials = [_Credential(True), _Credential(True)]
    directors = []
    for credential in credentials:
        backend = _NeedsToken(2, {"s0": "fake-ok", "s1": "fake-ok"})
        state = RedisState({"url": redis_server.url, "prefix": prefix}, clock=clock)
        directors.append(
            Director(
                make_config(_doc(GROUPS[:4])),
                clock=clock,
                extra_plugins=[backend, credential, Collector()],
                state=state,
            )
        )
    a, b = directors
    try:
        for _ in range(3):
            a.run_iteration(), b.run_iteration()
            clock.advance(60)
        assert len(_filled(a.run_iteration())) == 2 and len(_filled(b.run_iteration())) == 2
        credentials[0].usable = False  # a's token expires: b takes all four groups
        clock.advance(60)
        for _ in range(2):
            paused, serving = a.run_iteration(), b.run_iteration()
            clock.advance(60)
        assert not _filled(paused) and set(_filled(serving)) == set(GROUPS[:4])
        credentials[0].usable = True  # back: the groups are split again
        for _ in range(3):
            last = [_filled(a.run_iteration()), _filled(b.run_iteration())]
            clock.advance(60)
        assert sorted(len(f) for f in last) == [2, 2]
    finally:
        a.close()
        b.close()


def test_with_shared_demand_an_endpoint_is_polled_once_a_round_however_many_directors(
    redis_server,
) -> None:
    """Issue 43: with status_interval unset every director polled every endpoint at every
    iteration (4 directors: 72 polls became 256-288 for the same work). With demand_lock it
    is half a cycle among all of them: one poll per endpoint per round of iterations."""
    clock, prefix = FakeClock(), f"share-{uuid.uuid4().hex[:8]}:"
    backend = TrackingBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})  # one site, seen by all
    directors = []
    for _ in range(3):
        state = RedisState({"url": redis_server.url, "prefix": prefix}, clock=clock)
        directors.append(
            Director(
                make_config(_doc(GROUPS[:3])),
                clock=clock,
                extra_plugins=[backend, Collector()],
                state=state,
            )
        )
    try:
        per_round = []
        for _ in range(4):
            before = len(backend.status_calls)
            for d in directors:
                d.run_iteration()
            per_round.append(Counter(e for e, _ids in backend.status_calls[before:]))
            clock.advance(60)
        assert per_round[-1] == Counter({"s0": 1, "s1": 1}), per_round
        assert all(n == 1 for polls in per_round[1:] for n in polls.values()), per_round
    finally:
        for d in directors:
            d.close()


def test_a_heartbeat_that_lands_after_a_clean_stop_is_taken_back() -> None:
    """stop() waits for the renewal timer a few seconds only: a heartbeat stuck longer in the
    store and written after stop() removed it would show a stopped director as live for a
    lease period (its groups assigned to it, filled by nobody). Before: the key stayed."""
    import threading

    from gridgate.core.engine.sharing import DIRECTORS
    from gridgate.core.stores.memory import MemoryState

    release, stuck = threading.Event(), threading.Event()

    class SlowBeats(MemoryState):
        def set(self, key, value, ttl=None):
            if key.startswith(DIRECTORS) and stuck.is_set():
                release.wait(30)
            super().set(key, value, ttl)

    clock = FakeClock()
    store = SlowBeats(clock=clock)
    director, _backend = _on(store, clock, _doc(GROUPS[:2]))
    try:
        director.run_iteration()
        share = director.runner.share
        assert [k for k, _v in store.items(DIRECTORS)] == [DIRECTORS + share.instance]
        stuck.set()
        late = threading.Thread(target=share.renew)  # the timer's call, hung in the store
        late.start()
        share.stop()  # hands back and removes the heartbeat meanwhile
        assert store.items(DIRECTORS) == [] and store.items(LEASE) == []
        release.set()
        late.join(30)
        assert store.items(DIRECTORS) == []
    finally:
        release.set()
        director.close()
