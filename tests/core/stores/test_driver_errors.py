"""Issue 41: every error of a state driver is a StateError. A director that met a raw driver
exception crashed (``SqliteState.delete`` read ``DELETE ... RETURNING`` outside the conversion:
``sqlite3.OperationalError`` on a full disk, exit 1, the pilots it held in memory lost). Here
every method of the store and of its pilot registry is driven against a real sqlite file on a
full tmpfs and a real redis-server that refuses writes (maxmemory 1, noeviction), is stopped,
or answers with bytes that are not UTF-8: each answers or raises StateError, nothing else."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.redis_server import RedisServer

from gridgate.core.clock import FakeClock
from gridgate.core.state import Pilot, StateError, StateStore
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState


def calls(store: StateStore) -> list[tuple[str, Callable[[], Any]]]:
    """Every method of the StateStore and PilotRegistry contracts, each with arguments that
    write (or read) something new."""
    n = uuid.uuid4().hex[:6]
    pilots = [
        Pilot(job_id=f"{n}-{i}", backend="b", endpoint="e", submitted=1.0, native="x" * 200)
        for i in range(50)
    ]

    def registry() -> Any:
        return store.pilot_registry()

    return [
        ("add_if_absent", lambda: store.add_if_absent(f"add/{n}", "v" * 500, ttl=60)),
        ("set", lambda: store.set(f"set/{n}", "v" * 500)),
        ("get", lambda: store.get("old/key")),
        ("delete", lambda: store.delete("old/key")),
        ("items", lambda: store.items("old/")),
        ("ttl", lambda: store.ttl("old/key")),
        ("increment", lambda: store.increment(f"count/{n}")),
        ("append_record", lambda: store.append_record("s", {"time": 2.0, "n": n * 100})),
        ("records", lambda: store.records("s")),
        ("prune_records", lambda: store.prune_records("s", before=1.5)),
        ("put", lambda: registry().put(pilots)),
        ("active", lambda: registry().active("b", "e")),
        ("counts", lambda: registry().counts()),
        ("waiting", lambda: registry().waiting()),
        ("last_finished", lambda: registry().last_finished("b", "e", 5)),
        ("query", lambda: registry().query()),
        ("get pilot", lambda: registry().get("b", "e", "old-0")),
        ("prune pilots", lambda: registry().prune(before=10.0)),
    ]


def seed(store: StateStore) -> None:
    store.set("old/key", "x")
    store.append_record("s", {"time": 1.0, "n": "old"})
    store.pilot_registry().put(
        [Pilot(job_id="old-0", backend="b", endpoint="e", state="done", changed=1.0)]
    )


def drive(store: StateStore) -> dict[str, str]:
    """Each call's outcome: "ok" or the StateError's text; anything else fails the test."""
    out: dict[str, str] = {}
    for name, call in calls(store):
        try:
            call()
        except StateError as exc:
            out[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - what this test is looking for
            pytest.fail(f"{name} raised {type(exc).__name__}, not StateError: {exc}")
        else:
            out[name] = "ok"
    return out


# --------------------------------------------------------------------------------- sqlite


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "disk"
    folder.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(folder)], check=True
    )
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:  # nothing left to flush at close
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass  # ENOSPC: full, as wanted
    return filler


def test_sqlite_on_a_full_disk_raises_only_state_errors(small_disk: Path) -> None:
    store = SqliteState({"path": str(small_disk / "state.db")}, clock=FakeClock())
    try:
        seed(store)
        filler = fill(small_disk)
        outcomes = drive(store)
        # the writes met the full disk (the delete among them, which once escaped raw)
        for name in ("set", "delete", "append_record", "put"):
            assert "disk is full" in outcomes[name] or "could not be written" in outcomes[name]
        # and the store works again once there is room
        filler.unlink()
        assert set(drive(store).values()) == {"ok"}
        assert store.get("old/key") is None  # the second round's delete went through
    finally:
        store.close()


def test_sqlite_opened_on_a_full_disk_raises_a_state_error(small_disk: Path) -> None:
    fill(small_disk)
    with pytest.raises(StateError):
        store = SqliteState({"path": str(small_disk / "state.db")}, clock=FakeClock())
        try:
            drive(store)
        finally:
            store.close()


# ---------------------------------------------------------------------------------- redis


def redis_store(server: RedisServer, **extra: Any) -> RedisState:
    config = {"url": server.url, "prefix": f"t-{uuid.uuid4().hex[:8]}:", **extra}
    return RedisState(config, clock=FakeClock())


def test_redis_out_of_memory_raises_only_state_errors(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        store = redis_store(server)
        try:
            seed(store)
            admin = server.client()
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", "1")
            outcomes = drive(store)
            for name in ("add_if_absent", "set", "append_record", "put", "increment"):
                assert "maxmemory" in outcomes[name], outcomes[name]
            admin.config_set("maxmemory", "0")
            assert set(drive(store).values()) == {"ok"}
        finally:
            store.close()


def test_redis_refusing_writes_raises_only_state_errors(tmp_path: Path) -> None:
    """A Redis that refuses writes with an error reply (NOREPLICAS here; MISCONF, a failed
    RDB save, is the same ResponseError)."""
    with RedisServer(tmp_path) as server:
        store = redis_store(server)
        try:
            seed(store)
            admin = server.client()
            admin.config_set("min-replicas-to-write", "1")  # NOREPLICAS, a write refused alike
            outcomes = drive(store)
            assert "NOREPLICAS" in outcomes["set"], outcomes["set"]
        finally:
            store.close()


def test_redis_stopped_raises_only_state_errors(tmp_path: Path) -> None:
    server = RedisServer(tmp_path).start()
    store = redis_store(server, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        seed(store)
        server.stop()
        outcomes = drive(store)
        assert all(text != "ok" for text in outcomes.values()), outcomes
    finally:
        store.close()
        server.stop()


def test_redis_answer_that_is_not_utf8_is_a_state_error(tmp_path: Path) -> None:
    """An answer that does not decode (a value written by another program) raised
    UnicodeDecodeError through the driver."""
    with RedisServer(tmp_path) as server:
        store = redis_store(server)
        try:
            server.client().set(f"{store.prefix}kv:bad", b"- \xff\xfe")
            with pytest.raises(StateError, match="UnicodeDecodeError"):
                store.get("bad")
        finally:
            store.close()
