"""Test helpers for plugin authors: a fake clock, a plugin
manager holding just your plugins, validated configs, a director on in-memory state, real
executable stand-ins for the commands a backend runs, and a notifier that keeps what it gets.

Import what you need (``from gridgate.core.testing import director_for, stand_in_command``).
The pytest fixtures at the bottom are loaded only when a test suite asks for them with
``pytest_plugins = ["gridgate.core.testing"]`` in its ``conftest.py``; nothing here is
registered as a pytest plugin for every project that merely installs gridgate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gridgate.core._moved import moved_names
from gridgate.core.devkit.services import (
    ancestors,
    exited,
    free_port,
    not_traversable,
    signal_group,
    sweep_processes,
)
from gridgate.core.devkit.testkit import (
    Collector,
    StandIn,
    build_plugin,
    director_for,
    make_config,
    plugin_manager_with,
    section_for,
    stand_in_command,
)

if TYPE_CHECKING:
    from gridgate.core.clock import FakeClock

__all__ = [
    "Answer",  # noqa: F822 - loaded on first use (module __getattr__)
    "BackendContract",  # noqa: F822 - loaded on first use (module __getattr__)
    "Collector",
    "StandIn",
    "ancestors",
    "build_plugin",
    "director_for",
    "exited",
    "free_port",
    "not_traversable",
    "signal_group",
    "sweep_processes",
    "make_config",
    "plugin_manager_with",
    "section_for",
    "stand_in_command",
]


_forward = moved_names(__name__)  # FakeClock, until 2.0: it lives in gridgate.core.clock


def __getattr__(name: str) -> Any:
    # the backend contract suite needs pytest: loaded on first use
    if name in ("Answer", "BackendContract"):
        from gridgate.core.devkit import backend_contract

        return getattr(backend_contract, name)
    return _forward(name, frames=1)


# --- pytest fixtures (only with pytest_plugins = ["gridgate.core.testing"]) --------------------

try:
    import pytest
except ImportError:  # pragma: no cover - pytest is a test-time dependency only
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def gridgate_clock() -> FakeClock:
        """A :class:`~gridgate.core.clock.FakeClock`: ``gridgate_clock.advance(3600)`` instead
        of sleeping."""
        from gridgate.core.clock import FakeClock

        return FakeClock()

    @pytest.fixture
    def gridgate_stand_in(tmp_path: Path) -> Any:
        """``gridgate_stand_in(name, stdout=..., exit_code=..., sleep=...)`` in ``tmp_path/bin``."""

        def factory(name: str, **behaviour: Any) -> StandIn:
            return stand_in_command(tmp_path / "bin", name, **behaviour)

        return factory

    @pytest.fixture
    def gridgate_pm() -> Iterator[Any]:
        """``pm = gridgate_pm(plugin, ...)``: a manager with just these plugins, unregistered
        when the test ends."""
        with contextlib.ExitStack() as stack:
            yield lambda *plugins: stack.enter_context(plugin_manager_with(*plugins))

    @pytest.fixture
    def gridgate_collector() -> Collector:
        """A fresh :class:`Collector` notifier."""
        return Collector()
