"""Issue 24: iterations are numbered in the state store, so separate ``gridgate run --once``
processes count on (1, then 2) instead of each reporting ``"iteration": 1``, directors sharing
a Redis store or a PostgreSQL schema get distinct numbers, and a fresh store starts at 1. Real
``gridgate`` processes on a real SQLite file, a real redis-server and a real PostgreSQL
cluster; the accounting rows carry the same numbers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from support.postgres_server import PostgresServer
from support.redis_server import RedisServer
from support.wms_site import director_section, healthy_wms

from gridgate.core.engine.director import ITERATIONS
from gridgate.core.engine.resilient import ResilientState
from gridgate.core.engine.runtime import ACCOUNTING
from gridgate.core.stores.postgresql import PostgresqlState
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState


def site(folder: Path, state: dict[str, Any], **director: Any) -> Path:
    """A director config on a stand-in WMS submit command that always accepts."""
    doc = {
        "director": director_section(folder, 0.1, **director),
        "state": state,
        "backends": {"wms_glite": healthy_wms(folder)},
        "demand": {"static": {"wms_glite": 1}},
    }
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def run(gridgate_exe: str, config: Path, *more: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [gridgate_exe, "run", "--json", "-c", str(config), *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )


def numbers(proc: subprocess.Popen[str]) -> list[int]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return [json.loads(line)["iteration"] for line in out.splitlines() if line.strip()]


def test_separate_once_runs_on_one_sqlite_file_count_on(gridgate_exe: str, tmp_path: Path) -> None:
    db = tmp_path / "state" / "state.db"
    config = site(tmp_path, {"driver": "sqlite", "path": str(db)})
    assert numbers(run(gridgate_exe, config, "--once")) == [1]
    assert numbers(run(gridgate_exe, config, "--once")) == [2]
    assert numbers(run(gridgate_exe, config, "--iterations", "2")) == [3, 4]
    store = SqliteState({"path": str(db)})
    try:
        # what `gridgate report` reads carries the same numbers
        assert [r["iteration"] for r in store.records(ACCOUNTING)] == [1, 2, 3, 4]
        assert store.get(ITERATIONS) == "4"
    finally:
        store.close()
    # a fresh store starts at 1
    fresh = site(tmp_path / "other", {"driver": "sqlite", "path": str(tmp_path / "new.db")})
    assert numbers(run(gridgate_exe, fresh, "--once")) == [1]


def test_directors_sharing_a_redis_store_get_distinct_numbers(
    gridgate_exe: str, tmp_path: Path, redis_server: RedisServer
) -> None:
    state = {"driver": "redis", "url": redis_server.url, "prefix": "numbering-test:"}
    configs = [site(tmp_path / name, state) for name in ("a", "b")]
    procs = [run(gridgate_exe, config, "--iterations", "5") for config in configs]
    got = [numbers(proc) for proc in procs]
    for each in got:
        assert each == sorted(each) and len(each) == 5  # each director's numbers rise
    assert sorted(got[0] + got[1]) == list(range(1, 11))  # and no number is used twice
    assert numbers(run(gridgate_exe, configs[0], "--once")) == [11]


def test_directors_sharing_a_postgresql_schema_get_distinct_numbers(
    gridgate_exe: str, tmp_path: Path, postgres_server: PostgresServer
) -> None:
    secret = tmp_path / "pg.pw"
    secret.write_text(postgres_server.password + "\n")
    secret.chmod(0o600)
    state = {
        "driver": "postgresql",
        "dsn": postgres_server.dsn,
        "password": {"file": str(secret)},
        "schema": "numbering_test",
    }
    configs = [site(tmp_path / name, state) for name in ("a", "b")]
    procs = [run(gridgate_exe, config, "--iterations", "5") for config in configs]
    got = [numbers(proc) for proc in procs]
    for each in got:
        assert each == sorted(each) and len(each) == 5  # each director's numbers rise
    assert sorted(got[0] + got[1]) == list(range(1, 11))  # and no number is used twice
    assert numbers(run(gridgate_exe, configs[0], "--once")) == [11]
    store = PostgresqlState({k: v for k, v in state.items() if k != "driver"})
    try:
        # what `gridgate report` reads carries the same numbers
        rows = sorted(r["iteration"] for r in store.records(ACCOUNTING))
        assert rows == list(range(1, 12))
    finally:
        store.close()


def test_a_store_that_fails_leaves_the_numbers_rising(tmp_path: Path) -> None:
    """While the store is down the director numbers on from the last number it saw (its
    local view mirrors the count), instead of starting again at 1."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        primary = RedisState({"url": server.url, "socket_timeout": 2})
        store = ResilientState(primary, retry_every=0.0)
        assert [store.increment(ITERATIONS) for _ in range(2)] == [1, 2]
        server.stop()
        assert [store.increment(ITERATIONS) for _ in range(2)] == [3, 4]
        assert store.degraded
    finally:
        server.stop()
