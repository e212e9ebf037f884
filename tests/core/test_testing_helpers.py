"""The helpers plugin authors import from gridgate.core.testing behave as documented."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.config import ConfigError
from gridgate.core.model import BackendInfo, Endpoint, SubmitRequest, SubmitResult
from gridgate.core.plugins import Plugin
from gridgate.core.runner import run
from gridgate.core.testing import (
    Collector,
    build_plugin,
    director_for,
    make_config,
    plugin_manager_with,
    section_for,
    stand_in_command,
)

pytest_plugins = ["pytester"]


class Echo(Plugin):
    """A tiny backend over a command, enough to exercise the helpers end to end."""

    name = "echo"
    config_schema = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1},
            "slots": {"type": "array", "items": {"type": "string"}, "default": ["a", "b"]},
            "low": {"type": "integer", "default": 1},
            "high": {"type": "integer", "default": 5},
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    @classmethod
    def config_errors(cls, section):
        return [(("low",), "low must not exceed high")] if section["low"] > section["high"] else []

    @hookimpl
    def gridgate_backend_info(self, backend):
        if backend != self.name:
            return None
        return BackendInfo(self.name, tuple(Endpoint(self.name, s) for s in self.config["slots"]))

    @hookimpl
    def gridgate_submit(self, endpoint, request, timeout):
        if endpoint.backend != self.name:
            return None
        result = run([self.config["command"], endpoint.name], timeout=timeout, kill_grace=0.2)
        ids = tuple(
            line.split()[1] for line in result.stdout.splitlines() if line.startswith("JOBID ")
        )
        return SubmitResult(endpoint, ok=result.ok and bool(ids), job_ids=ids, command=result)


# --- plugin_manager_with ------------------------------------------------------------------------


def test_plugin_manager_with_registers_then_unregisters_even_on_error() -> None:
    plugin = Echo({"command": "x", "slots": ["s"]}, None)  # type: ignore[arg-type]
    with plugin_manager_with(plugin) as pm:
        info = pm.hook.gridgate_backend_info(backend="echo")
        assert info.endpoints == (Endpoint("echo", "s"),)
        assert pm.hook.gridgate_backend_info(backend="other") is None
    assert not pm.is_registered(plugin)
    with pytest.raises(RuntimeError), plugin_manager_with(plugin) as pm2:
        assert pm2.is_registered(plugin)
        raise RuntimeError("test body failed")
    assert not pm2.is_registered(plugin)


def test_plugin_manager_with_rejects_a_misspelt_hook() -> None:
    class Typo:
        @hookimpl
        def gridgate_submitt(self, endpoint, request, timeout):
            return None

    from pluggy import PluginValidationError

    with pytest.raises(PluginValidationError), plugin_manager_with(Typo()):
        pass


def test_plugin_manager_with_lends_an_existing_manager_back_clean() -> None:
    from gridgate.core.engine.loader import new_plugin_manager

    pm = new_plugin_manager()
    first, second = Collector(), Collector()
    pm.register(first)
    with plugin_manager_with(second, pm=pm):
        assert pm.is_registered(first) and pm.is_registered(second)
    assert pm.is_registered(first) and not pm.is_registered(second)


# --- configs --------------------------------------------------------------------------------------


def test_make_config_fills_defaults_and_reports_every_problem() -> None:
    config = make_config(
        {"director": {}, "state": {"driver": "memory"}, "demand": {"static": {"echo": 2}}}
    )
    assert config.director["command_timeout"] == 120
    with pytest.raises(ConfigError) as caught:
        make_config({"director": {"cycle_seconds": -1, "bogus": 1}})
    text = str(caught.value)
    assert "director.cycle_seconds" in text and "director.bogus: unknown key" in text


def test_section_for_validates_schema_defaults_and_cross_field_checks() -> None:
    assert section_for(Echo, {"command": "c"}) == {
        "command": "c",
        "slots": ["a", "b"],
        "low": 1,
        "high": 5,
    }
    with pytest.raises(ConfigError) as caught:
        section_for(Echo, {"slots": "a"})
    paths = [p.path for p in caught.value.problems]
    assert ("slots",) in paths and () in paths  # wrong type, and command is required
    with pytest.raises(ConfigError) as crossed:
        section_for(Echo, {"command": "c", "low": 9})
    assert [(p.path, p.message) for p in crossed.value.problems] == [
        (("low",), "low must not exceed high")
    ]


def test_build_plugin_hands_a_validated_section_and_context(tmp_path: Path) -> None:
    clock = FakeClock(start=100.0)
    plugin = build_plugin(Echo, {"command": "c"}, clock=clock, state_dir=tmp_path)
    assert plugin.config["slots"] == ["a", "b"]
    assert plugin.context.clock is clock and plugin.context.state_dir == tmp_path


# --- stand-in commands ------------------------------------------------------------------------------


def test_stand_in_command_prints_exits_and_records_calls(tmp_path: Path) -> None:
    cmd = stand_in_command(
        tmp_path / "bin",
        "fake-submit",
        stdout="JOBID j-{call}\n",
        stderr="warn {call}\n",
        exit_code=3,
    )
    assert os.access(cmd.path, os.X_OK)
    assert cmd.path.read_text().startswith(f"#!{sys.executable}\n")
    first = run([str(cmd), "--queue", "q 1"], timeout=30)
    second = run([cmd, "x"], timeout=30)
    assert (first.returncode, first.stdout, first.stderr) == (3, "JOBID j-1\n", "warn 1\n")
    assert second.stdout == "JOBID j-2\n"
    assert [c["argv"] for c in cmd.calls()] == [["--queue", "q 1"], ["x"]]


def test_stand_in_command_that_hangs_is_killed_with_its_output_kept(tmp_path: Path) -> None:
    cmd = stand_in_command(tmp_path, "hangs", stdout="started\n", stderr="never\n", sleep=600)
    result = run([str(cmd)], timeout=3, kill_grace=0.2)  # time to start and print, under load
    assert result.timed_out and result.returncode is None
    assert result.stdout == "started\n" and result.stderr == ""


def test_stand_in_command_rejects_paths_as_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        stand_in_command(tmp_path, "../evil")
    with pytest.raises(ValueError):
        stand_in_command(tmp_path, "ok", exit_code=300)


# --- director_for and Collector --------------------------------------------------------------------


def test_director_for_drives_an_uninstalled_backend_through_a_real_command(tmp_path: Path) -> None:
    good = stand_in_command(tmp_path, "good", stdout="JOBID local-{call}\n")
    backend = build_plugin(Echo, {"command": str(good), "slots": ["only"]})
    collector = Collector()
    doc = {"director": {"state_dir": str(tmp_path / "state")}, "demand": {"static": {"echo": 3}}}
    with contextlib.closing(director_for(doc, backend, collector)) as director:
        assert isinstance(director.clock, FakeClock)
        summary = director.run_iteration()
    ids = sorted(i for r in summary.records for i in r.job_ids)
    assert ids == ["local-1", "local-2", "local-3"]
    assert collector.notes == [] and len(good.calls()) == 3


def test_collector_receives_the_failure_notification(tmp_path: Path) -> None:
    bad = stand_in_command(tmp_path, "bad", stderr="connection refused\n", exit_code=1)
    backend = build_plugin(Echo, {"command": str(bad), "slots": ["s1"]})
    collector = Collector()
    clock = FakeClock()
    with contextlib.closing(
        director_for({"demand": {"static": {"echo": 1}}}, backend, collector, clock=clock)
    ) as director:
        assert director.clock is clock
        summary = director.run_iteration()
    assert [r.outcome for r in summary.records] == ["failed"]
    assert collector.levels() == ["error"]
    assert collector.subjects() == ["s1: error executing Job Submit [error]"]
    collector.clear()
    assert collector.notes == []


def test_director_for_reports_a_bad_document() -> None:
    with pytest.raises(ConfigError):
        director_for({"demand": {"static": {"echo": -1}}})


# --- the optional pytest fixtures -------------------------------------------------------------------


def test_fixtures_load_with_pytest_plugins_and_work(pytester: pytest.Pytester) -> None:
    # what docs/plugins.md tells authors to write, run as their own pytest would run it
    pytester.makeconftest('pytest_plugins = ["gridgate.core.testing"]\n')
    pytester.makepyfile(
        test_author="""
        from gridgate.core.model import Notification
        from gridgate.core.runner import run

        def test_all(gridgate_clock, gridgate_stand_in, gridgate_pm, gridgate_collector, tmp_path):
            start = gridgate_clock.time()
            gridgate_clock.advance(60)
            assert gridgate_clock.time() == start + 60
            cmd = gridgate_stand_in("tool", stdout="hi\\n")
            assert cmd.path.parent == tmp_path / "bin"
            assert run([str(cmd)], timeout=30).stdout == "hi\\n"
            pm = gridgate_pm(gridgate_collector)
            pm.hook.gridgate_notify(notification=Notification(
                level="info", subject="s", body="", created=0.0))
            assert gridgate_collector.levels() == ["info"]

        def test_pm_was_emptied(gridgate_pm, gridgate_collector):
            pm = gridgate_pm()
            assert not pm.is_registered(gridgate_collector)
    """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)


def test_request_values_are_frozen() -> None:
    # plugin authors lean on this: a hook cannot change what the next plugin sees
    request = SubmitRequest(backend="echo", attributes={"a": 1})
    with pytest.raises(TypeError):
        request.attributes["a"] = 2  # type: ignore[index]
