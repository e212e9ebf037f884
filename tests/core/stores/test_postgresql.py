"""What the postgresql driver does beyond the shared contract (test_state_contract.py runs that on
it too): processes racing on one key, the errors of a server that refuses or is gone (naming the
server, never the password), its config, and the tables it creates. All against a real
PostgreSQL cluster that the tests start (support.postgres_server)."""

from __future__ import annotations

import multiprocessing
import uuid
from pathlib import Path

import pytest
from support.polling import until
from support.ports import free_port
from support.postgres_server import PostgresServer
from test_driver_errors import drive, seed

from gridgate.core.clock import FakeClock
from gridgate.core.state import Pilot, StateError
from gridgate.core.stores.postgresql import PostgresqlState, server_name


def config(server: PostgresServer, folder: Path, **extra: object) -> dict:
    secret = folder / f"pg-{uuid.uuid4().hex}.pw"
    secret.write_text(server.password + "\n")
    secret.chmod(0o600)
    return {
        "dsn": server.dsn,
        "password": {"file": str(secret)},
        "schema": f"t_{uuid.uuid4().hex}",
        **extra,
    }


def _add_worker(config: dict, keys: list[str], barrier, results) -> None:
    store = PostgresqlState(config, clock=FakeClock())
    try:
        barrier.wait(timeout=60)
        me = str(multiprocessing.current_process().pid)
        results.put((me, [k for k in keys if store.add_if_absent(k, me, ttl=60)]))
    finally:
        store.close()


@pytest.mark.timeout(240)
def test_two_processes_race_add_if_absent_and_exactly_one_wins(postgres_server, tmp_path):
    """Two processes, each with its own store (connections), race on the same keys: each key
    has one winner, and what is stored is what its winner was told. The first key is raced
    as the store's tables are being created by both at once."""
    section = config(postgres_server, tmp_path)
    keys = ["the-key", *(f"k{i}" for i in range(200))]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_add_worker, args=(section, keys, barrier, results)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    try:
        wins = [results.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    assert all(p.exitcode == 0 for p in procs)
    flat = [k for _pid, won in wins for k in won]
    assert sorted(flat) == sorted(keys)  # every key won exactly once across the two
    store = PostgresqlState(section, clock=FakeClock())
    try:
        assert dict(store.items()) == {k: pid for pid, won in wins for k in won}
    finally:
        store.close()


def test_a_wrong_password_names_the_server_and_not_the_password(postgres_server, tmp_path):
    secret = tmp_path / "wrong.pw"
    secret.write_text("not-the-Pa55word\n")
    secret.chmod(0o600)
    section = {"dsn": postgres_server.dsn, "password": {"file": str(secret)}}
    with pytest.raises(StateError) as info:
        PostgresqlState(section, clock=FakeClock())
    text = str(info.value)
    assert f"127.0.0.1:{postgres_server.port}/postgres" in text
    assert "password authentication failed" in text
    assert "not-the-Pa55word" not in text
    assert postgres_server.password not in text


def test_an_unreachable_server_names_it_and_not_the_password(tmp_path, monkeypatch):
    monkeypatch.setenv("GG_PG_PW", "s3cret-Pw-77")
    port = free_port()  # a port nobody listens on
    section = {
        "dsn": f"host=127.0.0.1 port={port} dbname=gridgate user=director",
        "password": {"env": "GG_PG_PW"},
        "timeout": 2,
    }
    with pytest.raises(StateError) as info:
        PostgresqlState(section, clock=FakeClock())
    text = str(info.value)
    assert f"postgresql state at 127.0.0.1:{port}/gridgate: cannot connect" in text
    assert "s3cret-Pw-77" not in text


def test_a_password_that_cannot_be_read_is_a_state_error(tmp_path):
    with pytest.raises(StateError, match="GG_PG_UNSET"):
        PostgresqlState({"dsn": "postgresql://u@db.example/gg", "password": {"env": "GG_PG_UNSET"}})


def test_a_stopped_server_gives_only_state_errors_naming_it(tmp_path):
    server = PostgresServer().start()
    store = PostgresqlState(config(server, tmp_path, timeout=2), clock=FakeClock())
    try:
        seed(store)
        server.stop()
        outcomes = drive(store)
        assert all(text != "ok" for text in outcomes.values()), outcomes
        assert all(f"127.0.0.1:{server.port}/postgres" in text for text in outcomes.values())
    finally:
        store.close()
        server.stop()


def test_a_restarted_server_costs_at_most_one_error_per_connection(tmp_path):
    """After a restart every kept connection is dead: each call that meets one is a StateError
    and drops it; the next calls connect anew, and nothing stored is lost."""
    with PostgresServer() as server:
        store = PostgresqlState(config(server, tmp_path, max_connections=2), clock=FakeClock())
        try:
            store.set("k", "v")
            server.restart()
            outcomes = []
            for _ in range(4):
                try:
                    outcomes.append(store.get("k"))
                except StateError as exc:
                    assert f"127.0.0.1:{server.port}/postgres: cannot read" in str(exc)
                    outcomes.append("error")
            assert outcomes[-2:] == ["v", "v"], outcomes
            assert outcomes.count("error") <= 2, outcomes
        finally:
            store.close()


def test_a_server_refusing_writes_gives_state_errors_and_loses_nothing(tmp_path):
    """A database put read-only (as a standby is): every write is a StateError naming the
    server, reads go on, and a bulk write of pilots is all or nothing."""
    with PostgresServer() as server:
        section = config(server, tmp_path)
        store = PostgresqlState(section, clock=FakeClock())
        seed(store)
        store.close()
        with server.connect() as admin:
            admin.execute("ALTER DATABASE postgres SET default_transaction_read_only = on")
        # a schema not made yet cannot be made: a StateError, and no session left open
        with pytest.raises(StateError, match="cannot create its tables: .*read-only"):
            PostgresqlState(config(server, tmp_path), clock=FakeClock())
        with server.connect() as admin:
            query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'gridgate'"
            assert until(lambda: admin.execute(query).fetchone() == (0,), timeout=10)
        store = PostgresqlState(section, clock=FakeClock())  # opens with the tables there
        try:
            outcomes = drive(store)
            for name in ("add_if_absent", "set", "delete", "append_record", "put", "increment"):
                assert "read-only transaction" in outcomes[name], outcomes[name]
            for name in ("get", "items", "records", "active", "counts", "query"):
                assert outcomes[name] == "ok", outcomes[name]
            assert store.get("old/key") == "x"
            assert [p.job_id for p in store.pilot_registry().query()] == ["old-0"]
        finally:
            store.close()


def test_a_dsn_holding_a_password_is_a_config_error(tmp_path):
    from gridgate.core.config import ConfigError, load_config

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "state:\n  driver: postgresql\n  dsn: postgresql://gg:hunter2@db.example/gridgate\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    text = str(info.value)
    assert "state.dsn" in text and "password" in text and f"{bad}:3" in text
    assert PostgresqlState.config_errors({"dsn": "host=db user=gg password=x"})
    good = tmp_path / "good.yaml"
    good.write_text(
        "state:\n  driver: postgresql\n  dsn: postgresql://gg@db.example/gridgate\n"
        "  password: {file: /etc/gridgate/pg.pw}\n"
    )
    assert load_config(good).data["state"]["schema"] == "gridgate"


def test_server_name_never_shows_a_password():
    assert server_name("postgresql://gg:pw@db.example:5433/grid") == "db.example:5433/grid"
    assert server_name("host=db dbname=grid password=pw") == "db/grid"
    assert server_name("dbname=grid") == "local socket/grid"


def test_tables_are_made_once_in_their_schema_and_counts_need_no_scan(postgres_server, tmp_path):
    section = config(postgres_server, tmp_path)
    first = PostgresqlState(section, clock=FakeClock())
    second = PostgresqlState(section, clock=FakeClock())  # the DDL again: nothing changes
    try:
        first.pilot_registry().put(
            [Pilot("j1", "b", "e"), Pilot("j2", "b", "e", state="done", changed=5.0)]
        )
        with postgres_server.connect() as admin:
            tables = admin.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "ORDER BY 1",
                (section["schema"],),
            ).fetchall()
            counted = admin.execute(
                f'SELECT backend, endpoint, state, n FROM "{section["schema"]}".pilot_counts '
                "ORDER BY state"
            ).fetchall()
        assert [t for (t,) in tables] == [
            "kv",
            "pilot_counts",
            "pilot_reservations",
            "pilots",
            "records",
        ]
        assert counted == [("b", "e", "done", 1), ("b", "e", "waiting", 1)]
        assert second.pilot_registry().prune(before=10.0) == 1
        assert first.pilot_registry().counts() == {("b", "e", "waiting"): 1}
    finally:
        first.close()
        second.close()


def test_closed_store_refuses_calls(postgres_server, tmp_path):
    store = PostgresqlState(config(postgres_server, tmp_path), clock=FakeClock())
    store.set("k", "v")
    store.close()
    with pytest.raises(StateError, match="closed"):
        store.get("k")
