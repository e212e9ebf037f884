"""The journal of reversible changes (core/journal.py) on the real stores: memory, a sqlite file,
a real redis-server and a real PostgreSQL cluster. The outside state is a folder of files, one per target, so that a
process killed half-way (a real fork that exits in the middle of a step) leaves it as a crash
would."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gridgate.core.clock import FakeClock
from gridgate.core.journal import UNCHANGED, Journal, Restorer, decode_entry
from gridgate.core.state import StateStore
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.postgresql import PostgresqlState
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState

Stores = Callable[[], StateStore]


@pytest.fixture(params=["memory", "sqlite", "redis", "postgresql"])
def stores(request, tmp_path, monkeypatch) -> Iterator[Stores]:
    """Makes stores that all see the same data (memory: the same instance each time)."""
    made: list[StateStore] = []
    clock = FakeClock()
    kind = request.param
    if kind == "memory":
        one = MemoryState({}, clock=clock)

        def make() -> StateStore:
            return one
    elif kind == "sqlite":

        def make() -> StateStore:
            store = SqliteState({"path": str(tmp_path / "state.db")}, clock=clock)
            made.append(store)
            return store
    elif kind == "redis":
        server = request.getfixturevalue("redis_server")
        prefix = f"test-{uuid.uuid4().hex}:"

        def make() -> StateStore:
            store = RedisState({"url": server.url, "prefix": prefix}, clock=clock)
            made.append(store)
            return store
    else:
        cluster = request.getfixturevalue("postgres_server")
        monkeypatch.setenv("GG_TEST_PG_PW", cluster.password)
        section = {
            "dsn": cluster.dsn,
            "password": {"env": "GG_TEST_PG_PW"},
            "schema": f"t_{uuid.uuid4().hex}",
        }

        def make() -> StateStore:
            store = PostgresqlState(section, clock=clock)
            made.append(store)
            return store

    make.kind = kind  # type: ignore[attr-defined]
    yield make
    for store in made:
        store.close()


class Files:
    """Outside state: target -> the JSON in a file of its own; every write is noted."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(exist_ok=True)
        self.writes: list[tuple[str, object]] = []
        self.fail: set[str] = set()

    def read(self, target: str) -> object:
        return json.loads((self.folder / target).read_text())

    def write(self, target: str, value: object) -> None:
        if target in self.fail:
            raise OSError(f"{target} cannot be written")
        (self.folder / target).write_text(json.dumps(value))
        self.writes.append((target, value))

    def restorer(self, **extra) -> Restorer:
        return Restorer(write=self.write, read=self.read, **extra)

    def change(self, journal: Journal, targets: dict[str, object], fail_at: str = "") -> None:
        """One change setting each target, as an owner makes it: each prior read first."""
        change = journal.begin("files", {"why": "test"})
        for target, new in targets.items():

            def apply(target: str = target, new: object = new) -> None:
                if target == fail_at:
                    raise OSError(f"{target}: refused")
                self.write(target, new)

            change.step(target, self.read(target), new, apply=apply)
        change.commit()


def journal(store: StateStore, files: Files, owner: str = "a") -> Journal:
    made = Journal(store, store.clock, prefix="j:", owner=owner)
    made.register("files", files.restorer())
    return made


def test_a_change_made_and_undone_puts_back_each_prior_value_exactly(stores, tmp_path) -> None:
    files = Files(tmp_path / "t")
    files.write("p1", "ALL")
    files.write("p2", ["a", "b"])
    mine = journal(stores(), files)
    change = mine.begin("files", {"user": "alice"})
    change.step("p1", "ALL", "b,c", apply=lambda: files.write("p1", "b,c"))
    change.step("p2", ["a", "b"], ["b"], apply=lambda: files.write("p2", ["b"]))
    made = change.commit(until=mine.clock.time() + 60)
    assert [e.id for e in mine.changes("files")] == [made.id]
    assert mine.pending() == [], "in force until its `until`"
    done = mine.undo(made)
    assert done.ok and done.restored == ("p2", "p1"), done
    assert files.read("p1") == "ALL" and files.read("p2") == ["a", "b"]
    assert mine.changes() == [], "an undone change leaves no record"


def test_a_partial_failure_undoes_the_steps_done_last_first(stores, tmp_path) -> None:
    files = Files(tmp_path / "t")
    for name in ("p1", "p2", "p3"):
        files.write(name, "ALL")
    files.writes.clear()
    mine = journal(stores(), files)
    with pytest.raises(OSError, match="p3: refused"):
        files.change(mine, {"p1": "x", "p2": "y", "p3": "z"}, fail_at="p3")
    [entry] = mine.changes()
    assert [s.done for s in entry.steps] == [True, True, False], "p3 recorded before it was set"
    assert entry.steps[0].prior == "ALL"
    done = mine.undo(entry)
    assert done.ok
    assert files.writes == [("p1", "x"), ("p2", "y"), ("p2", "ALL"), ("p1", "ALL")]
    assert done.restored == ("p2", "p1"), "p3 was never set: nothing to put back"
    assert mine.changes() == []


def crash_between_steps(make: Stores, folder: Path) -> None:  # in a forked child
    files = Files(folder)
    mine = journal(make(), files, owner="dead")
    change = mine.begin("files", {"why": "test"})
    change.step("p1", files.read("p1"), "x", apply=lambda: files.write("p1", "x"))
    change.step("p2", files.read("p2"), "y", apply=lambda: os._exit(9))


def test_a_change_its_owner_died_in_is_undone_by_the_next_journal(stores, tmp_path) -> None:
    files = Files(tmp_path / "t")
    files.write("p1", "ALL")
    files.write("p2", "ALL")
    if stores.kind == "memory":  # a store of this process only: the owner is a lost object
        mine = journal(stores(), files, owner="dead")
        change = mine.begin("files", {})
        change.step("p1", "ALL", "x", apply=lambda: files.write("p1", "x"))
        del change, mine
    else:
        child = multiprocessing.get_context("fork").Process(
            target=crash_between_steps, args=(stores, tmp_path / "t")
        )
        child.start()
        child.join(60)
        assert child.exitcode == 9
    assert files.read("p1") == "x"
    after = journal(stores(), files, owner="restarted")
    [entry] = after.changes()
    assert entry.owner == "dead" and entry.state == "making"
    assert after.pending() == [], "within its lease its owner may be between two steps"
    after.clock.advance(entry.lease + 1)  # type: ignore[attr-defined]
    assert [e.id for e in after.pending()] == [entry.id]
    [done] = after.undo_pending()
    assert done.ok and "p1" in done.restored
    assert files.read("p1") == "ALL" and files.read("p2") == "ALL"
    assert after.changes() == []


def test_a_value_someone_changed_since_is_left_or_merged(stores, tmp_path) -> None:
    files = Files(tmp_path / "t")
    files.write("p1", "ALL")
    files.write("p2", "ALL")
    mine = journal(stores(), files)
    files.change(mine, {"p1": "a,b", "p2": "a,b"})
    files.write("p1", "a")  # an operator's own change meanwhile
    [entry] = mine.changes()
    done = mine.undo(entry)
    assert done.ok and done.left == ("p1",) and done.restored == ("p2",)
    assert files.read("p1") == "a", "not ours any more: not restored"
    assert files.read("p2") == "ALL"
    merging = Journal(mine.store, mine.clock, prefix="j:", owner="m")
    merging.register("files", files.restorer(merge=lambda step, now, intent: f"{now},c"))
    files.change(merging, {"p2": "b"})
    files.write("p2", "d")
    done = merging.undo(merging.changes()[0])
    assert done.restored == ("p2",) and files.read("p2") == "d,c"
    leaving = Journal(mine.store, mine.clock, prefix="j:")
    leaving.register("files", files.restorer(merge=lambda step, now, intent: UNCHANGED))
    files.change(leaving, {"p2": "e"})
    files.write("p2", "f")
    assert leaving.undo(leaving.changes()[0]).left == ("p2",)


def test_an_undo_that_fails_keeps_what_is_left_for_later(stores, tmp_path) -> None:
    files = Files(tmp_path / "t")
    files.write("p1", "ALL")
    files.write("p2", "ALL")
    mine = journal(stores(), files)
    files.change(mine, {"p1": "x", "p2": "y"})
    files.fail.add("p1")
    done = mine.undo(mine.changes()[0])
    assert not done.ok and "p1 cannot be written" in done.problem and done.restored == ("p2",)
    [kept] = mine.changes()
    assert kept.state == "failed" and [s.target for s in kept.steps] == ["p1"]
    assert [e.id for e in mine.pending()] == [kept.id], "undone again at the next timer"
    files.fail.clear()
    other = journal(stores(), files, owner="b")  # a restarted or another daemon
    [again] = other.undo_pending()
    assert again.ok and again.restored == ("p1",)
    assert files.read("p1") == "ALL" and files.read("p2") == "ALL"
    assert other.changes() == []


def test_two_journals_racing_to_undo_one_change_undo_it_once(stores, tmp_path) -> None:
    files = Files(tmp_path / "t")
    files.write("p1", "ALL")
    first = journal(stores(), files, owner="a")
    files.change(first, {"p1": "x"})
    [entry] = first.changes()
    inside, release = threading.Event(), threading.Event()
    reads: list[str] = []

    def slow_read(target: str) -> object:  # the first undo holds its claim here
        reads.append(target)
        inside.set()
        assert release.wait(30)
        return files.read(target)

    first.register("files", Restorer(write=files.write, read=slow_read))
    second = journal(stores(), files, owner="b")
    results = {}
    worker = threading.Thread(target=lambda: results.update(a=first.undo(entry)))
    worker.start()
    try:
        assert inside.wait(30)
        racing = second.undo(second.changes()[0])
        assert racing.elsewhere and not racing.ok, "claimed by the first: nothing done"
    finally:
        release.set()
        worker.join(30)
    assert results["a"].ok and results["a"].restored == ("p1",)
    assert reads == ["p1"] and files.writes.count(("p1", "ALL")) == 2  # the setup's and one undo
    late = second.undo(entry)  # after the first finished: gone, nothing to do
    assert late.ok and late.restored == () and files.writes.count(("p1", "ALL")) == 2


def test_a_bad_record_is_reported_once_and_kept(stores, tmp_path, logs) -> None:
    files = Files(tmp_path / "t")
    files.write("p1", "ALL")
    mine = journal(stores(), files)
    mine.store.set("j:change:broken", "{not json")
    mine.store.set("j:change:shape", json.dumps({"v": 1, "kind": "files", "steps": "x"}))
    files.change(mine, {"p1": "x"})
    assert [e.kind for e in mine.changes()] == ["files"]
    assert mine.changes() and mine.undo_pending() == []
    told = [m for level, m in logs if level == "ERROR" and "not a change record" in m]
    assert len(told) == 2 and any("j:change:broken" in m for m in told), told
    assert mine.store.get("j:change:broken") == "{not json", "kept for a person to look at"


def test_a_made_change_is_due_at_its_until_and_other_kinds_are_left_alone(stores, tmp_path) -> None:
    files = Files(tmp_path / "t")
    files.write("p1", "ALL")
    mine = journal(stores(), files)
    change = mine.begin("files", {})
    change.step("p1", "ALL", "x", apply=lambda: files.write("p1", "x"))
    change.commit(until=mine.clock.time() + 30)
    stranger = Journal(mine.store, mine.clock, prefix="j:", owner="s")  # knows no "files"
    mine.clock.advance(31)  # type: ignore[attr-defined]
    assert stranger.pending() == [] and stranger.undo_pending() == []
    [done] = mine.undo_pending()
    assert done.ok and files.read("p1") == "ALL"


def test_the_decoder_refuses_what_is_not_a_record() -> None:
    good = {
        "v": 1,
        "kind": "k",
        "owner": "o",
        "intent": {},
        "opened": 1.0,
        "touched": 1.0,
        "lease": 5,
        "state": "made",
        "until": None,
        "steps": [{"target": "t", "prior": "ALL", "new": None, "done": True}],
        "problem": "",
    }
    entry = decode_entry("id", json.dumps(good))
    assert entry.steps[0].prior == "ALL" and entry.steps[0].new is None
    for bad in (
        {"lease": 0},
        {"lease": True},
        {"state": "gone"},
        {"opened": "1"},
        {"until": float("nan")},
        {"steps": [{"target": "", "prior": 1, "new": 2, "done": True}]},
        {"steps": [{"target": "t", "new": 2, "done": True}]},
        {"intent": []},
        {"v": 2},
    ):
        with pytest.raises(ValueError):
            decode_entry("id", json.dumps({**good, **bad}, allow_nan=True))
    with pytest.raises(ValueError):
        decode_entry("id", "[")
