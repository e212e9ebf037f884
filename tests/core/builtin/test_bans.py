"""Operator bans and drains (gridgate.core.builtin.bans) against the memory, sqlite and a real Redis
store: durations, checked texts, expiry at ``until`` on the injected clock, unban, the list,
two directors sharing one store, concurrent bans leaving one whole entry, and the source that
keeps its last read while the store is down."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gridgate.core.builtin.bans import (
    MAX_DURATION,
    MAX_REASON,
    PREFIX,
    BanError,
    OperatorAvailability,
    OperatorBans,
    OperatorEntry,
    check_text,
    parse_duration,
    resolve_endpoint,
)
from gridgate.core.clock import FakeClock
from gridgate.core.model import AVAILABLE, Availability, Endpoint
from gridgate.core.state import StateError, StateStore
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState

DRIVERS = ["memory", "sqlite", "redis"]
SHARED = ["sqlite", "redis"]
Factory = Callable[[FakeClock], StateStore]
EP = "wms_glite/wms01.example.org"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Stores of the driver under test that all see the same data (memory: one shared
    instance, since every memory store is separate)."""
    kind = request.param
    made: list[StateStore] = []
    memory: list[StateStore] = []
    prefix = f"bans-{uuid.uuid4().hex}:"

    def make(clock: FakeClock) -> StateStore:
        if kind == "memory":
            if not memory:
                memory.append(MemoryState({}, clock=clock))
            return memory[0]
        if kind == "sqlite":
            store: StateStore = SqliteState({"path": str(tmp_path / "s" / "state.db")}, clock=clock)
        else:
            server = request.getfixturevalue("redis_server")
            store = RedisState({"url": server.url, "prefix": prefix}, clock=clock)
        made.append(store)
        return store

    yield make
    for store in made + memory:
        store.close()


def drivers(names: list[str]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("factory", names, indirect=True)


# --- durations and texts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [("2h", 7200), ("90m", 5400), ("30s", 30), ("1d", 86400), ("1d12h", 129600), ("1.5h", 5400)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_parse_duration_takes_a_year_and_no_more() -> None:
    assert parse_duration("365d") == MAX_DURATION
    with pytest.raises(BanError, match=r"'366d'.*longer than a year"):
        parse_duration("366d")


@pytest.mark.parametrize("text", ["", "2", "2x", "h", "2 h", "-2h", "2h-", "0h", "0s0m", "1e3s"])
def test_parse_duration_refuses_naming_the_text(text: str) -> None:
    with pytest.raises(BanError) as err:
        parse_duration(text)
    assert repr(text) in str(err.value)


@given(st.integers(min_value=1, max_value=365 * 24), st.sampled_from(["h", "m", "s"]))
def test_parse_duration_is_the_number_times_the_unit(n: int, unit: str) -> None:
    assert parse_duration(f"{n}{unit}") == n * {"h": 3600, "m": 60, "s": 1}[unit]


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "required"),
        ("   ", "required"),
        ("line\nbreak", "U\\+000A at position 5"),
        ("tab\there", "U\\+0009"),
        ("esc\x1b[31m", "U\\+001B"),
        ("rtl \u202eevil", "U\\+202E"),
        ("x" * (MAX_REASON + 1), "more than the 500"),
    ],
)
def test_reason_is_checked(text: str, why: str) -> None:
    with pytest.raises(BanError, match=f"reason: .*{why}"):
        check_text("reason", text, MAX_REASON)


def test_reason_keeps_plain_unicode_and_strips_blanks() -> None:
    assert check_text("reason", "  CE en maintenance — ticket #123 ", MAX_REASON) == (
        "CE en maintenance — ticket #123"
    )


def test_resolve_endpoint_by_key_or_unique_name() -> None:
    a = Endpoint("slurm", "ce01")
    b = Endpoint("arc", "ce01")
    c = Endpoint("arc", "ce02")
    assert resolve_endpoint("arc/ce01", [a, b, c]) == b
    assert resolve_endpoint("ce02", [a, b, c]) == c
    with pytest.raises(BanError, match="several backends have it .*arc/ce01, slurm/ce01"):
        resolve_endpoint("ce01", [a, b, c])
    with pytest.raises(BanError, match="'ce09': no configured backend"):
        resolve_endpoint("ce09", [a, b, c])


# --- in the store ----------------------------------------------------------------------------


@drivers(DRIVERS)
def test_ban_is_seen_and_expires_by_itself(factory: Factory, clock: FakeClock) -> None:
    bans = OperatorBans(factory(clock))
    entry = bans.ban(EP, who="alice", why="CE upgrade", duration=parse_duration("2h"))
    assert entry == OperatorEntry(
        EP, "banned", "alice", "CE upgrade", clock.time(), clock.time() + 7200
    )
    assert bans.availability([EP, "wms_glite/other"]) == {
        EP: Availability("banned", "banned by alice: CE upgrade", entry.until, "operator:alice"),
        "wms_glite/other": AVAILABLE,
    }
    clock.advance(7199)
    assert bans.get(EP) == entry
    clock.advance(1)
    assert bans.get(EP) is None
    assert bans.entries() == []
    assert bans.availability([EP]) == {EP: AVAILABLE}


@drivers(DRIVERS)
def test_drain_unban_and_list(factory: Factory, clock: FakeClock) -> None:
    bans = OperatorBans(factory(clock))
    drained = bans.drain("arc/ce02", who="bob", why="draining for a reinstall", duration=3600)
    banned = bans.ban(EP, who="alice", why="broken", duration=60)
    assert bans.entries() == [drained, banned]  # by endpoint key
    assert bans.availability(["arc/ce02"])["arc/ce02"].state == "drained"
    assert bans.unban(EP) == banned
    assert bans.unban(EP) is None
    assert bans.entries() == [drained]


@drivers(DRIVERS)
def test_a_later_command_replaces_the_entry(factory: Factory, clock: FakeClock) -> None:
    bans = OperatorBans(factory(clock))
    bans.ban(EP, who="alice", why="first", duration=86400)
    clock.advance(10)
    later = bans.drain(EP, who="bob", why="second", duration=60)
    assert bans.entries() == [later]
    clock.advance(61)  # the drain's shorter end stands: the ban is gone with it
    assert bans.entries() == []


@drivers(SHARED)
def test_every_director_on_the_store_sees_it(factory: Factory, clock: FakeClock) -> None:
    operator = OperatorBans(factory(clock))
    director = OperatorAvailability(factory(clock))
    states, changes = director.evaluate([EP])
    assert states == {EP: AVAILABLE} and changes == []
    operator.ban(EP, who="alice", why="CE upgrade", duration=600)
    states, changes = director.evaluate([EP])
    assert states[EP].state == "banned"
    assert [c.kind for c in changes] == ["started"]
    assert director.evaluate([EP])[1] == []  # one notice per start, not one per iteration
    operator.unban(EP)
    states, changes = director.evaluate([EP])
    assert states == {EP: AVAILABLE} and [c.kind for c in changes] == ["ended"]


@drivers(DRIVERS)
def test_two_operators_at_once_leave_one_whole_entry(factory: Factory, clock: FakeClock) -> None:
    stores = [factory(clock) for _ in range(16)]
    barrier = threading.Barrier(16)

    def ban(i: int) -> OperatorEntry:
        barrier.wait()
        return OperatorBans(stores[i]).put(
            EP,
            "banned" if i % 2 else "drained",
            who=f"op{i}",
            why=f"reason of op{i}",
            duration=600 + i,
        )

    with ThreadPoolExecutor(max_workers=16) as pool:
        written = list(pool.map(ban, range(16)))
    [left] = OperatorBans(stores[0]).entries()
    assert left in written  # last writer wins, whole: never op3's reason with op5's name


@drivers(DRIVERS)
def test_bad_input_is_refused_before_anything_is_written(
    factory: Factory, clock: FakeClock
) -> None:
    store = factory(clock)
    bans = OperatorBans(store)
    for kwargs, match in [
        ({"who": "alice", "why": "", "duration": 60}, "reason: required"),
        ({"who": "", "why": "x", "duration": 60}, "who: required"),
        ({"who": "a\x07", "why": "x", "duration": 60}, "who: control"),
        ({"who": "alice", "why": "x", "duration": 0}, "more than 0"),
        ({"who": "alice", "why": "x", "duration": float("inf")}, "at most a year"),
        ({"who": "alice", "why": "x", "duration": MAX_DURATION + 1}, "at most a year"),
    ]:
        with pytest.raises(BanError, match=match):
            bans.ban(EP, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(BanError, match="not backend/name"):
        bans.ban("wms01", who="alice", why="x", duration=60)
    assert store.items(PREFIX) == []


@drivers(DRIVERS)
def test_a_value_that_is_not_an_entry_is_left_out(factory: Factory, clock: FakeClock) -> None:
    store = factory(clock)
    bans = OperatorBans(store)
    good = bans.ban(EP, who="alice", why="ok", duration=60)
    store.set(PREFIX + "arc/ce01", "not json", ttl=60)
    store.set(PREFIX + "arc/ce02", json.dumps({**good.as_dict(), "state": "weird"}), ttl=60)
    store.set(PREFIX + "arc/ce03", good.encode(), ttl=60)  # another endpoint's entry
    assert bans.entries() == [good]


class _Flaky(MemoryState):
    """A real memory store whose reads fail while ``down`` is set (a Redis that went away)."""

    down = False

    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        if self.down:
            raise StateError("redis://127.0.0.1:1/0: connection refused")
        return super().items(prefix)


def test_store_down_keeps_the_last_entries_until_their_end(clock: FakeClock) -> None:
    store = _Flaky({}, clock=clock)
    source = OperatorAvailability(store)
    OperatorBans(store).ban(EP, who="alice", why="upgrade", duration=300)
    assert source.evaluate([EP])[0][EP].state == "banned"
    store.down = True
    assert source.evaluate([EP])[0][EP].state == "banned"
    clock.advance(300)
    states, changes = source.evaluate([EP])  # the operator said 300 s: it ends, store or not
    assert states[EP] == AVAILABLE and [c.kind for c in changes] == ["ended"]
    store.down = False
    assert source.evaluate([EP])[0][EP] == AVAILABLE


printable = st.text(
    st.characters(blacklist_categories=("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")),
    min_size=1,
    max_size=MAX_REASON,
).filter(lambda t: t.strip() == t and t != "")


@given(
    printable,
    st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=32),
    st.floats(1, MAX_DURATION),
    st.sampled_from(["banned", "drained"]),
)
def test_any_accepted_text_comes_back_as_written(
    why: str, who: str, duration: float, state: str
) -> None:
    clock = FakeClock()
    bans = OperatorBans(MemoryState({}, clock=clock))
    entry = bans.put(EP, state, who=who, why=why, duration=duration)
    assert entry.why == why
    assert OperatorEntry.decode(PREFIX + EP, entry.encode()) == entry
    assert bans.entries() == [entry]
