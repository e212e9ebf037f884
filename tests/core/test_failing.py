"""core/failing.py: the failing cache and the failure episodes, on a real store and a fake clock."""

from __future__ import annotations

import threading

from gridgate.core.clock import FakeClock
from gridgate.core.failing import FailingCache
from gridgate.core.model import Endpoint, Episode
from gridgate.core.plugins import PluginContext
from gridgate.core.stores.memory import MemoryState

S0, S1 = Endpoint("lsf", "s0"), Endpoint("lsf", "s1")


def cache(failing: float = 100, tickets: float = 50) -> tuple[FailingCache, FakeClock]:
    clock = FakeClock()
    return FailingCache(MemoryState(clock=clock), clock, failing, tickets), clock


def test_enter_puts_a_server_out_of_rotation_and_counts_its_episode() -> None:
    failing, clock = cache()
    start = clock.time()
    assert failing.episode(S0) is None and not failing.contains(S0)
    assert failing.enter(S0, "timeout") == Episode(start=start, failures=1, entered=True)
    assert failing.contains(S0) and not failing.contains(S1)
    assert failing.excluded() == {"lsf/s0"}
    clock.advance(10)
    # already in the failing cache: counted in the same episode, not entered again
    assert failing.enter(S0, "timeout") == Episode(start=start, failures=2, entered=False)
    assert failing.episode(S0) == Episode(start=start, failures=2)
    clock.advance(91)  # the failing entry expired (100 s after the first): back in rotation
    assert failing.excluded() == set()
    assert failing.enter(S0, "error") == Episode(start=start, failures=3, entered=True)
    clock.advance(151)  # failing_expiry + ticket_expiry after the last failure: the episode ends
    assert failing.episode(S0) is None
    assert failing.enter(S0, "error") == Episode(start=clock.time(), failures=1, entered=True)


def test_of_many_threads_failing_on_one_server_exactly_one_enters() -> None:
    failing, _ = cache()
    barrier = threading.Barrier(8)
    episodes: list[Episode] = []
    lock = threading.Lock()

    def fail() -> None:
        barrier.wait()
        episode = failing.enter(S0, "error")
        with lock:
            episodes.append(episode)

    threads = [threading.Thread(target=fail) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(e.entered for e in episodes) == 1
    assert failing.episode(S0) == Episode(start=episodes[0].start, failures=8)


def test_watch_local_fault_and_counts() -> None:
    failing, clock = cache()
    assert not failing.watched(S0)
    failing.watch(S0, "timeout")
    assert failing.watched(S0)
    clock.advance(149)
    assert failing.watched(S0)
    clock.advance(2)  # failing_expiry + ticket_expiry after the watch
    assert not failing.watched(S0)
    assert failing.local_fault("lsf", "launch") is True
    assert failing.local_fault("lsf", "launch") is False  # once per failing_expiry
    assert failing.local_fault("lsf", "local_io") is True  # another kind is another note
    clock.advance(101)
    assert failing.local_fault("lsf", "launch") is True
    failing.enter(S1, "error")
    failing.watch(S1, "error")
    assert failing.counts() == {"failing": 1, "tickets": 1, "episodes": 1}
    assert failing.clear(["s1"]) == ["lsf/s1"]  # a bare host name matches any backend
    assert failing.counts() == {"failing": 0, "tickets": 0, "episodes": 0}
    # local_io expired with the launch note it was taken beside; launch was noted again
    assert [(r["server"], r["status"], r["kind"]) for r in failing.view()] == [
        ("lsf (this machine)", "local_fault", "launch")
    ]


def test_a_plugin_context_with_a_state_store_has_the_failing_cache_of_its_config() -> None:
    clock = FakeClock()
    state = MemoryState(clock=clock)
    context = PluginContext(
        clock=clock,
        state=state,
        config={"director": {"failing_expiry": 30, "ticket_expiry": 20}},
    )
    assert context.failing is not None
    assert (context.failing.failing_expiry, context.failing.window) == (30.0, 50.0)
    assert context.failing.state is state and context.failing.clock is clock
    assert PluginContext().failing is None  # no store, nothing to remember failures in


def test_a_record_that_is_none_of_the_caches_is_read_as_absent_not_a_crash() -> None:
    failing, clock = cache()
    state = failing.state
    state.set("episode/lsf/s0", '{"start": "soon", "failures": 2}', ttl=100)
    state.set("failing/lsf/s0", '{"since": 1, "kind": 7}', ttl=100)
    assert failing.episode(S0) is None
    row = failing.view()[0]
    assert (row["server"], row["status"], row["kind"], row["failures"]) == (
        "lsf/s0",
        "failing",
        "",
        0,
    )
    # the bad episode starts again with this failure
    assert failing.enter(S0, "timeout") == Episode(start=clock.time(), failures=1, entered=False)
    assert failing.episode(S0) == Episode(start=clock.time(), failures=1)
