"""The catalogue of failure kinds: its flags are what built-in classifiers answer, the command
line shows it, a kind a plugin invents still works, and notifications name the kind."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support.director import ScriptedBackend, config

from gridgate.core import hookimpl
from gridgate.core.backend import Backend
from gridgate.core.builtin.classifier import generic_failure
from gridgate.core.clock import FakeClock
from gridgate.core.defaults import local_io_failure
from gridgate.core.engine.compose import compose_failure, compose_local_fault
from gridgate.core.engine.director import Director
from gridgate.core.kinds import KINDS, failure, kind_table, missing_input
from gridgate.core.model import (
    CommandResult,
    Endpoint,
    Escalation,
    Failure,
    Notification,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.runner import run
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector, StandIn, build_plugin, director_for, stand_in_command

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


# --- faults of this machine: local_io, missing_input; subjects that say what bodies say --------


def test_local_io_and_missing_input_are_catalogued_local_kinds_and_listed() -> None:
    for name in ("local_io", "missing_input"):
        kind = KINDS[name]
        assert (kind.local, kind.exclude, kind.notify, kind.transient) == (True, False, True, False)
        assert not kind.escalated and not kind.counts_toward_alarms
    assert local_io_failure("disk full") == KINDS["local_io"].failure("disk full")
    shown = subprocess.run(
        [GRIDGATE, "plugins", "--kinds"], capture_output=True, text=True, timeout=60, check=True
    )
    rows = {line.split()[0]: line.split()[1:6] for line in shown.stdout.splitlines() if line}
    # excluded, notified, alarms, retried, local
    assert rows["local_io"] == rows["missing_input"] == ["no", "yes", "no", "no", "yes"]


def test_missing_input_names_the_first_file_that_cannot_be_used(tmp_path: Path) -> None:
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\n", encoding="utf-8")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opened without blocking: no writer must not hang a submission
    assert missing_input({"the script": script, "unset": None, "empty": "", "a fifo": fifo}) == ""
    gone = tmp_path / "gone.sh"
    assert missing_input({"the script": script, "the sandbox file x": gone}) == (
        f"the sandbox file x {gone} does not exist"
    )
    assert (
        missing_input({"the script": tmp_path}) == f"the script {tmp_path} is a folder, not a file"
    )
    relative = missing_input({"the script": "no-such-dir/pilot.sh"})
    assert relative == f"the script {Path.cwd() / 'no-such-dir/pilot.sh'} does not exist"


def test_missing_input_says_a_file_is_unreadable_for_the_user_that_runs_it() -> None:
    import tempfile

    from support.uids import AS_NOBODY  # a real ordinary uid: root reads every file

    with tempfile.TemporaryDirectory(dir="/tmp") as folder:  # pytest's tmp_path is root's only
        os.chmod(folder, 0o755)
        secret = Path(folder, "pilot.sh")
        secret.write_text("#!/bin/sh\n", encoding="utf-8")
        secret.chmod(0o600)
        code = (
            "from gridgate.core.kinds import missing_input; "
            f"print(missing_input({{'the script': {str(secret)!r}}}))"
        )
        said = subprocess.run(
            [*AS_NOBODY, sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )
    assert said.returncode == 0, said.stderr[-2000:]
    assert said.stdout.strip() == (
        f"the script {secret} cannot be read by this user (permission denied)"
    )


def _ran(program: StandIn, *argv: str) -> SubmitResult:
    return SubmitResult(EP, ok=False, command=run([str(program), *argv], 30))


def test_the_generic_classifier_calls_a_missing_file_the_command_names_missing_input(
    tmp_path: Path,
) -> None:
    """Whatever batch system printed it: an absolute path of its argv that its output names
    and that this machine cannot read is the pilot's missing input, not a failing server."""
    gone = tmp_path / "pilot.sh"
    said = (
        f"qsub: Unable to read script file because of error: error opening {gone}: No such file\n"
    )
    qsub = stand_in_command(tmp_path / "bin", "qsub", stderr=said, exit_code=1)
    found = generic_failure(_ran(qsub, "-q", "all.q", str(gone)))
    assert (found.kind, found.local, found.exclude) == ("missing_input", True, False)
    assert (
        found.reason.startswith(f"the input file {gone} does not exist; ")
        and "qsub" in found.reason
    )
    assert generic_failure(_ran(qsub, f"--script={gone}")).kind == "missing_input"
    gone.write_text("#!/bin/sh\n", encoding="utf-8")  # it is there: the server said no
    assert generic_failure(_ran(qsub, str(gone))).kind == "error"
    quiet = stand_in_command(tmp_path / "bin", "other", stderr="refused\n", exit_code=1)
    # a path only in the argv (an output file yet to be written) is no evidence
    assert generic_failure(_ran(quiet, str(tmp_path / "out.log"))).kind == "error"


def _composed(kind: str, command: CommandResult | None) -> Notification:
    """The notification the director sends for a failure of ``kind`` (as FailurePath does)."""
    reason = (
        "the pilot script (backends.testbed.script) /srv/pilot.sh does not exist"
        if kind == "missing_input"
        else f"what the {kind} failure was"
    )
    found = KINDS[kind].failure(reason)
    result = SubmitResult(EP, ok=False, command=command)
    if found.local:
        return compose_local_fault(EP, found, result, 1_700_000_000.0, 600, host="h1")
    return compose_failure(EP, found, Escalation("error", 1_700_000_000.0, 1), result, 1.7e9)


EVIDENCE: dict[str, CommandResult | None] = {
    "nothing run": None,
    "could not start": CommandResult(("qsub", "/srv/pilot.sh"), None, launch_error="no qsub"),
    "ran and failed": CommandResult(("qsub", "/srv/pilot.sh"), 1, stderr="qsub: error\n"),
    "killed at its deadline": CommandResult(("qsub", "/srv/pilot.sh"), None, timed_out=True),
}


@pytest.mark.parametrize("evidence", list(EVIDENCE))
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_subject_of_every_kinds_notification_says_what_its_body_says(
    kind: str, evidence: str
) -> None:
    """Before: a local fault of a command that ran (Slurm's unreadable script, kind config,
    local) was "cannot run sbatch" over a body saying it could not start, though it had run;
    a missing script the submit command reported was "s0: error executing Job Submit
    [error]", a failing server, excluded and on the way to a ticket."""
    note = _composed(kind, EVIDENCE[evidence])
    subject, body = note.subject, note.body
    assert subject.endswith(f"[{kind}]") and f"\nFailure: {kind} - {note.failure.reason}\n" in (
        "\n" + body
    )
    if KINDS[kind].local:  # a fault of this machine: no server named, the backend is
        assert not subject.startswith(f"{EP.name}:") and "backend testbed" in subject
        assert "not of any server" in body and "Server:" not in body
        forms = {
            "cannot run qsub on h1": "gridgate could not start qsub on h1",
            "/srv/pilot.sh does not exist": "lacks an input file",
            "cannot write its files": "could not prepare",
            "qsub failed on h1 for a fault of this machine": "qsub ran on h1",
        }
        [said] = [form for form in forms if form in subject]  # exactly one story
        assert forms[said] in body
        started = EVIDENCE[evidence] is not None and EVIDENCE[evidence].launch_error is None
        assert ("returns: could not start" in body) == (evidence == "could not start")
        assert ("\nstderr:\n" in body) == started  # the output of what ran is shown
    else:  # a server's failure: it is named, and a timeout is called one in both
        assert (
            subject.startswith(f"{EP.name}: ") and f"\nServer: {EP.name} (testbed)" in "\n" + body
        )
        timed_out = "returns: timeout" in body
        assert ("timeout executing" in subject) == (timed_out or kind == "timeout")


class _MissingScriptBackend(Backend):
    """A submit command that cannot read the script it is given (a real program)."""

    name = "testbed"
    endpoints_key = "servers"
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "servers": {"type": "array", "items": {"type": "string"}},
            "program": {"type": "string"},
            "script": {"type": "string"},
        },
        "additionalProperties": False,
    }

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        argv = [self.config["program"], "-q", endpoint.name, self.config["script"]]
        return SubmitResult(endpoint, ok=False, command=self.run(argv, self.deadline(timeout)))


def test_a_missing_script_is_one_local_error_naming_it_and_no_server_is_excluded(
    tmp_path: Path,
) -> None:
    gone = tmp_path / "pilot.sh"
    qsub = stand_in_command(
        tmp_path / "bin",
        "qsub",
        stderr=f"error opening {gone}: No such file or directory\n",
        exit_code=1,
    )
    backend = build_plugin(
        _MissingScriptBackend,
        {"servers": ["s0", "s1"], "program": str(qsub), "script": str(gone)},
        name="testbed",
    )
    notes = Collector()
    doc = {"director": {"state_dir": str(tmp_path / "state")}, "demand": {"static": {"testbed": 2}}}
    with contextlib.closing(director_for(doc, backend, notes)) as director:
        summaries = [director.run_iteration() for _ in range(2)]
    assert {f.kind for s in summaries for f in s.failures} == {"missing_input"}
    assert all(s.excluded == () for s in summaries)  # no server blamed
    [note] = notes.notes  # told once per failing_expiry, not per iteration
    assert str(gone) in note.subject and note.subject.endswith("[missing_input]")
    assert f"error opening {gone}" in note.body and "not of any server" in note.body
