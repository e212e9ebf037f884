"""A site that replaces the default escalation plugin keeps exclusion: the director, not the
``caches`` plugin, puts a failing server in the failing cache, so the server stays out of the
next iteration and ``gridgate servers list`` shows it whatever the plugin decides."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from support.director import BACKEND, ScriptedBackend

from gridgate.core import hookimpl
from gridgate.core.config import load_config
from gridgate.core.engine.director import Director
from gridgate.core.model import Endpoint, Episode, Escalation, Failure, SubmitResult
from gridgate.core.testing import Collector


class AlarmOnEntry:
    """A third-party escalation plugin with its own rule: an alarm each time a server enters
    the failing cache, nothing else; it keeps no memory of its own."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool, int]] = []

    @hookimpl
    def gridgate_escalate(
        self, endpoint: Endpoint, failure: Failure, result: SubmitResult, episode: Episode
    ) -> Escalation:
        self.seen.append((endpoint.name, episode.entered, episode.failures))
        return Escalation(
            level="alarm" if episode.entered else None,
            episode_start=episode.start,
            failures=episode.failures,
            reason="the site's rule",
        )


class Silent:
    """One that tells nobody anything (returns None: no plugin decides)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool, int]] = []

    @hookimpl
    def gridgate_escalate(
        self, endpoint: Endpoint, failure: Failure, result: SubmitResult, episode: Episode
    ) -> Escalation | None:
        self.seen.append((endpoint.name, episode.entered, episode.failures))
        return None


def site(tmp_path: Path) -> Path:
    doc = {
        "director": {
            "cycle_seconds": 0.01,
            "max_threads": 1,
            "command_timeout": 5,
            "failing_expiry": 600,
            "ticket_expiry": 600,
            "state_dir": str(tmp_path / "state"),
        },
        "state": {"driver": "sqlite", "path": str(tmp_path / "state" / "state.db")},
        "demand": {"static": {BACKEND: 3}},
        "selectors": {"round_robin": {}},  # every server is tried each iteration
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize("plugin_class", [AlarmOnEntry, Silent])
def test_a_swapped_escalation_plugin_keeps_exclusion(
    tmp_path: Path, gridgate_exe: str, plugin_class: type[AlarmOnEntry] | type[Silent]
) -> None:
    config = site(tmp_path)
    backend, notes, escalation = (
        ScriptedBackend(3, {"s1": "fake-fail"}),
        Collector(),
        plugin_class(),
    )
    director = Director(load_config(config), extra_plugins=[backend, notes, escalation])
    try:
        director.pm.unregister(name="escalation:caches")  # the default is gone, not outvoted
        assert director.pm.get_plugin("escalation:caches") is None
        first = director.run_iteration()
        assert first.excluded == (f"{BACKEND}/s1",)
        assert escalation.seen == [("s1", True, 1)]
        assert notes.levels() == (["alarm"] if plugin_class is AlarmOnEntry else [])

        backend.calls.clear()
        second = director.run_iteration()
        assert set(backend.calls) == {"s0", "s2"}  # s1 was not tried
        assert all(r.endpoint != "s1" for r in second.records)  # out of rotation between them
        assert escalation.seen == [("s1", True, 1)]  # not asked again: it did not fail again

        listed = subprocess.run(
            [gridgate_exe, "servers", "list", "-c", str(config), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)["servers"]
        # no "watched" window: that is the caches plugin's, and it was not asked
        assert [(r["server"], r["status"], r["kind"], r["failures"]) for r in rows] == [
            (f"{BACKEND}/s1", "failing", "error", 1)
        ]
        assert rows[0]["tickets_until"] is None
    finally:
        director.close()
