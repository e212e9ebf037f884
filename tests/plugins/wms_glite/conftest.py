"""Fixtures for the wms_glite tests: the stand-ins on a private PATH, a scenario, a backend."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gridgate.core.clock import FakeClock
from gridgate.core.engine.loader import new_plugin_manager
from gridgate.core.plugins import PluginContext
from gridgate.core.stores.memory import MemoryState
from gridgate.plugins.wms_glite.backend import GliteBackend
from gridgate.plugins.wms_glite.sim import install_commands, write_scenario


@pytest.fixture
def sim_bin(tmp_path: Path) -> Path:
    """The stand-ins, installed in a directory that is not on PATH."""
    return install_commands(tmp_path / "bin")


@pytest.fixture
def calls_log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


@pytest.fixture
def scenario(tmp_path: Path, calls_log: Path) -> Callable[..., Path]:
    """Write a scenario: ``scenario(hosts={...}, default={...})`` -> its path."""

    def write(
        hosts: Mapping[str, Any] | None = None,
        default: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> Path:
        data = {
            "state_dir": str(tmp_path / "simstate"),
            "calls_log": str(calls_log),
            "default": dict(default or {"behaviour": "healthy"}),
            "hosts": dict(hosts or {}),
            **extra,
        }
        return write_scenario(tmp_path / "scenario.json", data)

    return write


@pytest.fixture
def sim_env(sim_bin: Path) -> Callable[[Path], dict[str, str]]:
    """Environment additions that put the stand-ins first on PATH and name the scenario."""

    def env(scenario_path: Path) -> dict[str, str]:
        return {
            "PATH": f"{sim_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "GRIDGATE_SIM_SCENARIO": str(scenario_path),
        }

    return env


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def state(clock: FakeClock) -> MemoryState:
    return MemoryState({}, clock=clock)


@pytest.fixture
def make_backend(
    scenario: Callable[..., Path],
    sim_env: Callable[[Path], dict[str, str]],
    clock: FakeClock,
    state: Any,
    tmp_path: Path,
) -> Iterator[Callable[..., tuple[Any, GliteBackend]]]:
    """Build a configured GliteBackend registered in a pluggy manager.

    ``make_backend(hosts={...}, **config)`` -> (plugin manager, backend). The config gets
    schema defaults applied, like the loader does.
    """
    from gridgate.core.config import apply_defaults

    made: list[GliteBackend] = []

    def make(
        hosts: Mapping[str, Any] | None = None,
        default: Mapping[str, Any] | None = None,
        **config: Any,
    ) -> tuple[Any, GliteBackend]:
        path = scenario(hosts=hosts, default=default)
        section: dict[str, Any] = {
            "servers": list((hosts or {}).keys()) or ["wms01.example.org"],
            "env": sim_env(path),
            "work_dir": str(tmp_path),
            **config,
        }
        problems = GliteBackend.config_errors(section)
        assert problems == []
        apply_defaults(section, GliteBackend.config_schema)
        context = PluginContext(clock=clock, state=state, state_dir=tmp_path / "state")
        backend = GliteBackend(section, context)
        backend.name = "wms_glite"
        pm = new_plugin_manager()
        pm.register(backend, name="backends:wms_glite")
        pm.check_pending()  # every hookimpl matches a documented hookspec
        made.append(backend)
        return pm, backend

    yield make
    for backend in made:
        backend.close()
