"""`gridgate pilots list|summary|cancel`: the registry read from another process (sqlite and
Redis), and cancelling through the backends."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from support.director import BACKEND, TrackingBackend

from gridgate.core.commands.pilots import cancel
from gridgate.core.commands.report import render_states
from gridgate.core.config import load_config
from gridgate.core.engine.director import Director
from gridgate.core.testing import Collector


def site(tmp_path: Path, state: dict) -> Path:
    doc = {
        "director": {
            "cycle_seconds": 0.01,
            "max_threads": 2,
            "command_timeout": 5,
            "state_dir": str(tmp_path / "state"),
            "pilots": {"max_waiting": 3},
        },
        "state": state,
        "demand": {"static": {BACKEND: 9}},
        "selectors": {"round_robin": {}},
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def gridgate(exe: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(params=["sqlite", "redis"])
def config(request, tmp_path) -> Path:
    if request.param == "sqlite":
        return site(tmp_path, {"driver": "sqlite", "path": str(tmp_path / "state" / "state.db")})
    server = request.getfixturevalue("redis_server")
    return site(
        tmp_path, {"driver": "redis", "url": server.url, "prefix": f"t-{uuid.uuid4().hex}:"}
    )


def test_list_and_summary_from_another_process(config, gridgate_exe) -> None:
    backend = TrackingBackend(3)
    director = Director(load_config(config), extra_plugins=[backend, Collector()])
    try:
        director.run_iteration()
        backend.move("s1", "running", 2)
        backend.move("s2", "failed", 1, reason="Cannot plan: BrokerHelper: no compatible resources")
        director.run_iteration()
        summary = gridgate(gridgate_exe, "pilots", "summary", "-c", str(config), "--json")
        assert summary.returncode == 0, summary.stderr
        table = json.loads(summary.stdout)["endpoints"]
        assert table[f"{BACKEND}/s0"]["waiting"] == 3
        assert (table[f"{BACKEND}/s1"]["running"], table[f"{BACKEND}/s1"]["waiting"]) == (2, 3)
        assert (table[f"{BACKEND}/s2"]["failed"], table[f"{BACKEND}/s2"]["waiting"]) == (1, 3)
        text = gridgate(gridgate_exe, "pilots", "summary", "-c", str(config)).stdout
        assert text.splitlines()[-1].split() == ["total", "9", "2", "0", "1", "0", "0", "0"]

        failed = gridgate(
            gridgate_exe, "pilots", "list", "-c", str(config), "--state", "failed", "--json"
        )
        (row,) = json.loads(failed.stdout)["pilots"]
        assert row["endpoint"] == "s2" and row["native"] == "FAILED"
        assert row["reason"] == "Cannot plan: BrokerHelper: no compatible resources"
        listed = gridgate(gridgate_exe, "pilots", "list", "-c", str(config), "--endpoint", "s1")
        assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 1 + 5
        assert "BrokerHelper" not in listed.stdout
    finally:
        director.close()


def test_cancel_one_call_per_endpoint_and_recorded(tmp_path) -> None:
    config = site(tmp_path, {"driver": "sqlite", "path": str(tmp_path / "state.db")})
    backend = TrackingBackend(2)
    director = Director(load_config(config), extra_plugins=[backend, Collector()])
    try:
        director.run_iteration()
        registry = director.state.pilot_registry()
        live = registry.query(states=["waiting"])
        outcome = cancel(director.runtime, registry, live)
        assert sorted(outcome["cancelled"]) == [f"{BACKEND}/s0", f"{BACKEND}/s1"]
        assert outcome["failed"] == {}
        assert sorted(e for e, _ids in backend.cancel_calls) == ["s0", "s1"]
        assert {p.state for p in registry.query()} == {"cancelled"}
        assert all(p.reason == "cancelled with gridgate pilots cancel" for p in registry.query())
    finally:
        director.close()


def test_cancel_command_needs_ids_or_all_and_names_what_it_does_not_track(
    tmp_path, gridgate_exe
) -> None:
    config = site(tmp_path, {"driver": "sqlite", "path": str(tmp_path / "state.db")})
    usage = gridgate(gridgate_exe, "pilots", "cancel", "-c", str(config))
    assert usage.returncode == 2 and "--all" in usage.stderr
    unknown = gridgate(gridgate_exe, "pilots", "cancel", "-c", str(config), "no-such-job", "--json")
    assert unknown.returncode == 0, unknown.stderr
    assert json.loads(unknown.stdout) == {
        "cancelled": {},
        "failed": {},
        "not_found": ["no-such-job"],
    }


def test_memory_state_is_refused_with_a_reason(tmp_path, gridgate_exe) -> None:
    config = site(tmp_path, {"driver": "memory"})
    result = gridgate(gridgate_exe, "pilots", "summary", "-c", str(config))
    assert result.returncode == 1 and "memory" in result.stderr


def test_render_summary_has_a_column_per_state() -> None:
    assert render_states({}) == "no pilots tracked\n"
    text = render_states({"b/e": {"waiting": 2, "done": 1}})
    assert text.splitlines()[0].split() == [
        "ENDPOINT",
        "waiting",
        "running",
        "done",
        "failed",
        "cancelled",
        "unknown",
        "lost",
    ]
    assert text.splitlines()[1].split() == ["b/e", "2", "0", "1", "0", "0", "0", "0"]
