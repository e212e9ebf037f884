"""Issue 41: accounting rows held by ResilientState while the store fails are written exactly
once. An append that timed out on a stopped Redis may still land when the server resumes; it
is kept and written back at recovery (appends are idempotent: no second row); a write-back cut
half way and tried again writes no row twice; rows still held at the stop are tried once more
and, when the store still fails, kept in a local file that the next start replays. Keys under
``store/`` (the store's epoch) are never written back from the local view."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import uuid
from pathlib import Path

from support.director import TrackingBackend, config
from support.redis_server import RedisServer

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import PENDING_RECORDS, Director
from gridgate.core.engine.resilient import ResilientState
from gridgate.core.engine.runtime import ACCOUNTING
from gridgate.core.state import StateError
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.redis import RedisState
from gridgate.core.testing import Collector

BACK = "gridgate: state store available again"


class Failing(MemoryState):
    """A memory store whose appends fail after ``appends_left`` more (then every call), the
    way a store dies half way through a write-back."""

    appends_left: int | None = None

    def _check(self) -> None:
        if self.appends_left is not None and self.appends_left <= 0:
            raise StateError("store unreachable (cut by the test)")

    def add_if_absent(self, key, value, ttl=None):
        self._check()
        return super().add_if_absent(key, value, ttl)

    def get(self, key):
        self._check()
        return super().get(key)

    def append_record(self, stream, record):
        self._check()
        if self.appends_left is not None:
            self.appends_left -= 1
        super().append_record(stream, record)

    def records(self, stream, since=0.0):
        self._check()
        return super().records(stream, since)


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"time": 100.0 + i, "n": i} for i in range(start, start + n)]


def test_appends_that_timed_out_on_a_stopped_redis_are_written_once(tmp_path: Path) -> None:
    clock = FakeClock()
    with RedisServer(tmp_path) as server:
        primary = RedisState(
            {"url": server.url, "prefix": f"t-{uuid.uuid4().hex[:8]}:", "socket_timeout": 0.3},
            clock=clock,
        )
        state = ResilientState(primary, clock=clock, retry_every=30)
        try:
            for row in rows(3):
                state.append_record(ACCOUNTING, row)
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                for row in rows(4, start=3):  # the first times out (and lands later)
                    state.append_record(ACCOUNTING, row)
                assert state.degraded
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            clock.advance(31)
            state.get("anything")  # time to retry: the kept rows are written back
            assert not state.degraded
            assert [r["n"] for r in primary.records(ACCOUNTING)] == list(range(7))
        finally:
            state.close()


def test_a_write_back_cut_half_way_and_retried_writes_no_row_twice() -> None:
    clock = FakeClock()
    primary = Failing(clock=clock)
    state = ResilientState(primary, clock=clock, retry_every=30)
    primary.appends_left = 0
    for row in rows(6):
        state.append_record(ACCOUNTING, row)
    assert state.degraded
    primary.appends_left = 3  # the write-back stops after 3 rows
    clock.advance(31)
    state.get("x")
    assert state.degraded
    primary.appends_left = None
    clock.advance(31)
    state.get("x")
    assert not state.degraded
    assert [r["n"] for r in primary.records(ACCOUNTING)] == list(range(6))


def test_close_tries_the_store_once_more_and_says_it_is_back(tmp_path: Path) -> None:
    clock = FakeClock()
    primary = Failing(clock=clock)
    changes: list[bool] = []
    path = tmp_path / PENDING_RECORDS
    state = ResilientState(
        primary,
        clock=clock,
        retry_every=30,
        on_change=lambda d, _r: changes.append(d),
        pending_path=path,
    )
    primary.appends_left = 0
    for row in rows(2):
        state.append_record(ACCOUNTING, row)
    primary.appends_left = None
    clock.advance(1)  # long before retry_every
    state.close()
    assert changes == [True, False]
    assert [r["n"] for r in primary.records(ACCOUNTING)] == [0, 1]
    assert not path.exists()


def test_rows_the_store_does_not_take_at_close_are_kept_and_replayed(tmp_path: Path) -> None:
    clock = FakeClock()
    primary = Failing(clock=clock)
    path = tmp_path / "state" / PENDING_RECORDS
    state = ResilientState(primary, clock=clock, pending_path=path)
    primary.appends_left = 0
    for row in rows(3):
        state.append_record(ACCOUNTING, row)
    state.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert primary._records == {}  # nothing reached the store

    # the next start, on a store that answers
    primary.appends_left = None
    again = ResilientState(primary, clock=clock, pending_path=path)
    again.append_record(ACCOUNTING, {"time": 200.0, "n": 99})
    assert [r["n"] for r in primary.records(ACCOUNTING)] == [0, 1, 2, 99]
    assert not path.exists()
    again.close()
    assert [r["n"] for r in primary.records(ACCOUNTING)] == [0, 1, 2, 99]


def test_rows_replayed_at_a_start_on_a_failing_store_wait_for_its_recovery(tmp_path) -> None:
    clock = FakeClock()
    primary = Failing(clock=clock)
    path = tmp_path / PENDING_RECORDS
    first = ResilientState(primary, clock=clock, pending_path=path)
    primary.appends_left = 0
    first.append_record(ACCOUNTING, rows(1)[0])
    first.close()
    second = ResilientState(primary, clock=clock, retry_every=30, pending_path=path)
    second.get("x")  # the replay fails: degraded, the row still held
    assert second.degraded and path.exists()
    primary.appends_left = None
    clock.advance(31)
    second.get("x")
    assert [r["n"] for r in primary.records(ACCOUNTING)] == [0]
    assert not path.exists()


def test_write_back_local_leaves_the_store_epoch_alone() -> None:
    clock = FakeClock()
    primary = MemoryState(clock=clock)
    state = ResilientState(primary, clock=clock)
    state.set("store/epoch", "old")
    state.set("failing/a", "1", ttl=100)
    state.set("kept/b", "mine")
    primary._data.clear()  # the store came back empty
    primary.set("kept/b", "theirs")
    state.write_back_local()
    assert primary.get("store/epoch") is None
    assert primary.get("failing/a") == "1"
    assert 99 < (primary.ttl("failing/a") or 0) <= 100
    assert primary.get("kept/b") == "theirs"  # add-if-absent: the store's own value wins


def test_recovery_does_not_write_the_store_epoch_back() -> None:
    clock = FakeClock()
    primary = Failing(clock=clock)
    state = ResilientState(primary, clock=clock, retry_every=30)
    state.set("store/epoch", "old")
    state.set("failing/a", "1")
    primary.appends_left = 0
    state.append_record(ACCOUNTING, rows(1)[0])
    primary._data.clear()  # it comes back empty
    primary.appends_left = None
    clock.advance(31)
    state.get("x")
    assert not state.degraded
    assert primary.get("failing/a") == "1"
    assert primary.get("store/epoch") is None


def test_director_close_sends_the_back_notice_before_the_notifiers_close(tmp_path) -> None:
    """The director's store on a full tmpfs; room comes back just before the stop, before
    state_retry_seconds: the close-time try finds the store, the rows are written and the
    notifiers (still open) say it answers again."""
    folder = tmp_path / "state"
    folder.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(folder)], check=True
    )
    clock = FakeClock()
    collector = Collector()
    cfg = config(servers=1, pilots=2, state_retry_seconds=600)
    cfg.data["state"] = {"driver": "sqlite", "path": str(folder / "state.db")}
    cfg.data["director"]["state_dir"] = str(tmp_path / "dir")
    director = Director(cfg, clock=clock, extra_plugins=[TrackingBackend(servers=1), collector])
    try:
        director.run_iteration()
        filler = folder / "filler"
        with open(filler, "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\0" * 4096)
            except OSError:
                pass
        clock.advance(10)
        director.run_iteration()
        assert director.state.degraded
        filler.unlink()
    finally:
        director.close()
        subprocess.run(["umount", str(folder)], check=True)
    assert [n.subject for n in collector.notes].count(BACK) == 1
    assert not (tmp_path / "dir" / PENDING_RECORDS).exists()
