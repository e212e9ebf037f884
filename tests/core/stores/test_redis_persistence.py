"""Issue 41: a Redis that keeps nothing (no AOF, no RDB) is said at the director's start, naming
both settings; one that keeps its data, or cannot be asked, says nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from support.director import TrackingBackend, config
from support.redis_server import RedisServer

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.stores.redis import RedisState


def store_on(server: RedisServer, url: str | None = None) -> RedisState:
    return RedisState(
        {"url": url or server.url, "prefix": f"t-{uuid.uuid4().hex[:8]}:"}, clock=FakeClock()
    )


def test_a_redis_without_aof_or_rdb_is_a_problem_naming_both(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:  # started with --save "" --appendonly no
        store = store_on(server)
        try:
            problem = store.persistence_problem()
            assert problem is not None
            assert "appendonly" in problem and 'save is ""' in problem
        finally:
            store.close()


@pytest.mark.parametrize("setting", [("appendonly", "yes"), ("save", "900 1")], ids=["aof", "rdb"])
def test_a_redis_that_keeps_its_data_is_no_problem(tmp_path: Path, setting) -> None:
    with RedisServer(tmp_path) as server:
        server.client().config_set(*setting)
        store = store_on(server)
        try:
            assert store.persistence_problem() is None
        finally:
            store.close()


def test_config_refused_or_server_down_says_nothing(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        server.client().execute_command(
            "ACL", "SETUSER", "limited", "on", ">secret", "~*", "+@all", "-config"
        )
        host = server.url.removeprefix("redis://")
        store = store_on(server, url=f"redis://limited:secret@{host}")
        try:
            assert store.persistence_problem() is None  # NOPERM
        finally:
            store.close()
        down = store_on(server)
    try:
        assert down.persistence_problem() is None  # stopped: nothing to ask
    finally:
        down.close()


def warnings_at_start(server: RedisServer, tmp_path: Path, logs) -> list[str]:
    cfg = config(servers=1, pilots=1)
    cfg.data["state"] = {"driver": "redis", "url": server.url, "prefix": "p:"}
    cfg.data["director"]["state_dir"] = str(tmp_path / "dir")
    director = Director(cfg, clock=FakeClock(), extra_plugins=[TrackingBackend(servers=1)])
    director.close()
    return [m for level, m in logs if level == "WARNING" and "keeps nothing" in m]


def test_the_director_warns_once_at_start_of_a_redis_that_keeps_nothing(tmp_path, logs) -> None:
    with RedisServer(tmp_path) as server:
        found = warnings_at_start(server, tmp_path, logs)
        assert len(found) == 1 and "appendonly" in found[0] and "save" in found[0]
        logs.clear()
        server.client().config_set("appendonly", "yes")
        assert warnings_at_start(server, tmp_path, logs) == []
