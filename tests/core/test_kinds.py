"""The catalogue of failure kinds: its flags are what built-in classifiers answer, the command
line shows it, a kind a plugin invents still works, and notifications name the kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.director import ScriptedBackend, config

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.defaults import generic_failure
from gridgate.core.director import Director
from gridgate.core.kinds import KINDS, failure, kind_table
from gridgate.core.model import CommandResult, Endpoint, Failure, SubmitResult
from gridgate.core.state import MemoryState

GRIDGATE = str(Path(sys.executable).with_name("gridgate"))
EP = Endpoint("testbed", "s0")


def test_a_catalogued_failure_carries_the_catalogues_flags_and_overrides() -> None:
    assert failure("timeout", "slow") == Failure(
        "timeout", exclude=True, notify=True, transient=True, reason="slow"
    )
    assert failure("config", "no such queue") == Failure(
        "config", exclude=True, notify=True, transient=False, reason="no such queue"
    )
    assert failure("unreachable", notify=False).notify is False
    with pytest.raises(KeyError):
        failure("no_such_kind")


def test_the_generic_classifier_answers_only_catalogued_kinds_with_their_flags() -> None:
    results = [
        SubmitResult(EP, ok=False, message="m"),
        SubmitResult(EP, ok=False, command=CommandResult(("x",), None, launch_error="gone")),
        SubmitResult(EP, ok=False, command=CommandResult(("x",), None, timed_out=True)),
        SubmitResult(EP, ok=False, command=CommandResult(("x",), 0, stdout="?")),
        SubmitResult(EP, ok=False, command=CommandResult(("x",), 3, stderr="no\n")),
    ]
    for result in results:
        answer = generic_failure(result)
        entry = KINDS[answer.kind]
        assert (answer.exclude, answer.notify, answer.transient, answer.local) == (
            entry.exclude,
            entry.notify,
            entry.transient,
            entry.local,
        )


def test_plugins_kinds_lists_the_catalogue() -> None:
    shown = subprocess.run(
        [GRIDGATE, "plugins", "--kinds"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:2] == ["kind", "excluded"]
    config_line = next(line for line in lines if line.startswith("config "))
    assert config_line.split()[1:6] == ["yes", "yes", "no", "no", "no"]  # never an alarm
    doc = json.loads(
        subprocess.run(
            [GRIDGATE, "plugins", "--kinds", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    assert [row["kind"] for row in doc["kinds"]] == list(KINDS)
    assert doc["kinds"] == kind_table() and "no_endpoint" in doc["accounting_only"]


class Quota:
    """A classifier with a kind of its own."""

    @hookimpl
    def gridgate_classify_failure(self, endpoint, result):
        return Failure("quota", exclude=True, notify=True, transient=False, reason="disk quota")


class Collect:
    def __init__(self) -> None:
        self.notes = []

    @hookimpl
    def gridgate_notify(self, notification):
        self.notes.append(notification)


def test_an_unknown_kind_from_a_plugin_works_with_its_own_flags_and_names_the_subject() -> None:
    clock = FakeClock()
    notes = Collect()
    backend = ScriptedBackend(2, {"s0": "fake-fail", "s1": "fake-fail"})
    director = Director(
        config(servers=2, pilots=1, max_threads=1),
        clock=clock,
        state=MemoryState(clock=clock),
        extra_plugins=[backend, Quota(), notes],
    )
    summary = director.run_iteration()
    assert [f.kind for f in summary.failures] == ["quota"]  # not transient: not retried
    assert len(summary.excluded) == 1 and summary.retries == ()
    assert [n.subject.endswith("executing Job Submit [quota]") for n in notes.notes] == [True]
    director.close()


class Misconfigured:
    @hookimpl
    def gridgate_classify_failure(self, endpoint, result):
        return failure("config", "sbatch: error: invalid partition specified: debgu")


def test_the_sites_config_is_told_as_errors_and_never_becomes_an_alarm() -> None:
    clock = FakeClock()
    notes = Collect()
    backend = ScriptedBackend(2, {"s0": "fake-fail", "s1": "fake-ok"})
    director = Director(
        config(servers=2, pilots=3, max_threads=1, failing_expiry=60, ticket_expiry=3600),
        clock=clock,
        state=MemoryState(clock=clock),
        extra_plugins=[backend, Misconfigured(), notes],
    )
    first = director.run_iteration()
    # the misconfigured partition is set aside (not retried: the same config goes everywhere
    # it is wrong), the others get the pilots
    assert first.excluded == ("testbed/s0",) and first.retries == ()
    assert sum(r.pilots for r in first.records if r.outcome == "submitted") == 2
    for _ in range(3):  # it keeps failing after each failing-cache period
        clock.advance(61)
        director.run_iteration()
    assert [n.level for n in notes.notes] == ["error"] * 4  # the caches would page an alarm here
    assert all(n.subject == "s0: error executing Job Submit [config]" for n in notes.notes)
    assert "invalid partition" in notes.notes[0].body
    director.close()


def test_a_kind_of_ones_own_may_become_an_alarm() -> None:
    clock = FakeClock()
    notes = Collect()
    backend = ScriptedBackend(1, {"s0": "fake-fail"})
    director = Director(
        config(servers=1, pilots=1, failing_expiry=60, ticket_expiry=3600),
        clock=clock,
        state=MemoryState(clock=clock),
        extra_plugins=[backend, Quota(), notes],
    )
    director.run_iteration()
    clock.advance(61)
    director.run_iteration()
    assert [n.level for n in notes.notes] == ["error", "alarm"]
    director.close()
