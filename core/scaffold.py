"""``gridgate plugin new``: writes a plugin package that installs with ``pip install -e`` and
whose own tests pass at once, for a backend, a notifier or a classifier.

The package has a ``pyproject.toml`` with the entry point, a ``src/`` layout, a plugin class
with a schema'd config section, tests written with :mod:`gridgate.core.testing` (a backend's
inherit the backend contract), and for a backend a stand-in of its commands and a
``site.yaml`` that drives it with ``gridgate run``. A backend has one of two shapes: one
submit command (``command``, the default), or submit, status and cancel commands with a
stand-in batch system whose jobs go from waiting to running to done or failed (``batch``).

Its README and the command line's next steps install it into a virtual environment of its
own, with gridgate from the checkout it runs from: never into the environment gridgate runs
in, which may be gridgate's development one.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from string import Template

from gridgate.core import API_VERSION, __version__

KINDS = ("backend", "notifier", "classifier")
#: The shapes of a backend: one submit command, or submit, status and cancel commands.
SHAPES = ("command", "batch")
GROUPS = {
    "backend": "gridgate.backends",
    "notifier": "gridgate.notifiers",
    "classifier": "gridgate.classifiers",
}
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")  # fullmatch: "$" would take "evil\n"


class ScaffoldError(Exception):
    """The package cannot be written (bad name, folder not empty)."""


_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "A gridgate $kind plugin: $name"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["gridgate>=$gridgate_version"]

[project.optional-dependencies]
test = ["pytest>=8"]

# The entry-point name is the key a site writes under `$section:` in its YAML.
[project.entry-points."$group"]
$name = "$package.$module:$cls"

[tool.setuptools]
package-dir = { "" = "src" }
packages = ["$package"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

_README = """\
# $dist

A gridgate $kind plugin, entry point `$name` in `$group` (plugin API $api_version).$shape_text

Work on it in a virtual environment of its own, never in gridgate's development one (the
plugin's editable install and its test dependencies would land among gridgate's):

```sh
python3 -m venv .venv                        # this plugin's own environment
.venv/bin/pip install -e $gridgate_source    # gridgate ($gridgate_where)
.venv/bin/pip install -e ".[test]"           # this plugin, and pytest
.venv/bin/pytest                             # its own tests, with gridgate's testing kit
.venv/bin/gridgate plugins                   # lists $name
$run_line
```

Where to go from here: docs/plugins.md (how to write a $kind), docs/hooks.md (every hook),
docs/api.md (what you may import), docs/kinds.md (failure kinds) in gridgate's sources.
"""

_GITIGNORE = """\
.venv/
*.egg-info/
__pycache__/
gridgate-state/
stand-in/spool/
"""

_INIT = '''\
"""$dist: a gridgate $kind plugin."""

from $package.$module import $cls

__all__ = ["$cls"]
'''

_CONFTEST = '''\
"""gridgate's fixtures: gridgate_clock, gridgate_stand_in, gridgate_pm, gridgate_collector."""

pytest_plugins = ["gridgate.core.testing"]
'''

# --- backend -----------------------------------------------------------------------------------

_BACKEND = '''\
"""The `$name` backend: submits pilots by running a command, one per submission.

Replace the command with your batch system's submit tool (`sbatch`, `qsub`, `condor_submit`)
in the config, and `job_id_pattern` with what it prints; classify its own error messages in
`classify_failure` with catalogued kinds (`gridgate plugins --kinds`). The base class
`gridgate.core.backend.Backend` answers the director's hooks for this backend's own endpoints
only and calls these methods; it builds `gridgate_backend_info` from the section. To let the
director track and cancel your pilots, write `job_status` and `cancel` (docs/plugins.md);
the contract tests check that nothing answers for other backends' endpoints.
`gridgate plugin new --kind backend NAME --shape batch` writes a backend that does (submit,
status and cancel commands, with a stand-in batch system whose jobs have lifecycles).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from gridgate.core.backend import Backend, command_timeout_schema, env_schema
from gridgate.core.kinds import failure
from gridgate.core.model import Endpoint, Failure, SubmitRequest, SubmitResult
from gridgate.core.plugins import PluginContext

OPERATION = "Job Submit"
PLACEHOLDERS = ("endpoint", "group", "count")


class $cls(Backend):
    """Runs `command` (with {endpoint}, {group} and {count} filled in) to submit pilots."""

    name = "$name"  # the entry-point name: the key of this backend's section
    endpoints_key = "endpoints"  # one endpoint per name in this list

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            # x-gridgate-path "argv": a program given with a "/" is taken from the config
            # file's folder (a bare name is looked up on PATH)
            "command": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                        "x-gridgate-path": "argv",
                        "description": "The submit command as a list: program, then arguments; "
                                       "{endpoint}, {group} and {count} are filled in."},
            "endpoints": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$$"},
                          "minItems": 1, "default": ["default"],
                          "description": "The servers (queues, partitions, clusters) to submit to."},
            "job_id_pattern": {"type": "string", "default": "Submitted job (\\\\S+)",
                               "description": "Regular expression with one group: the job id."},
            "pilots_per_submission": {"type": "integer", "minimum": 1, "default": 1,
                                      "description": "Pilots one command submits."},
            "busy_patterns": {"type": "array", "items": {"type": "string"}, "default": [],
                              "description": "Output that means the server is busy: take it out "
                                             "of rotation quietly and try another."},
            "command_timeout": command_timeout_schema(),  # read by the base class's deadline()
            "env": env_schema(),  # added to the command's environment by the base class
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for key in ("job_id_pattern",):
            try:
                if re.compile(section[key]).groups != 1:
                    problems.append(((key,), "needs exactly one group (...) around the job id"))
            except re.error as exc:
                problems.append(((key,), f"invalid regular expression: {exc}"))
        for index, pattern in enumerate(section.get("busy_patterns", [])):
            try:
                re.compile(pattern)
            except re.error as exc:
                problems.append((("busy_patterns", index), f"invalid regular expression: {exc}"))
        for index, item in enumerate(section["command"]):
            for placeholder in re.findall(r"\\{(\\w+)\\}", item):
                if placeholder not in PLACEHOLDERS:
                    problems.append((("command", index), f"unknown placeholder {{{placeholder}}}"))
        return problems

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._job_id = re.compile(config["job_id_pattern"])
        self._busy = [re.compile(p) for p in config["busy_patterns"]]

    def argv(self, endpoint: Endpoint, request: SubmitRequest) -> list[str]:
        """The command, each config value one argv item (no shell is ever involved)."""
        values = {"endpoint": endpoint.name, "group": request.group, "count": str(request.count)}
        return [re.sub(r"\\{(\\w+)\\}", lambda m: values.get(m.group(1), m.group(0)), item)
                for item in self.config["command"]]

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        # killed at the deadline, output capped at the site's director.max_output_bytes
        result = self.run(self.argv(endpoint, request), self.deadline(timeout))
        if not result.ok:  # failures are results: classifiers read the evidence in `command`
            return SubmitResult(endpoint, ok=False, command=result, operation=OPERATION)
        ids = tuple(self._job_id.findall(result.stdout))
        if not ids:
            return SubmitResult(endpoint, ok=False, command=result, operation=OPERATION,
                                message="exit code 0 but no job id in the output")
        return SubmitResult(endpoint, ok=True, job_ids=ids, command=result, operation=OPERATION)

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        if result.command is None:
            return None
        text = result.command.stdout + result.command.stderr
        for pattern in self._busy:
            found = pattern.search(text)
            if found:
                return failure("busy", f"{endpoint.name} is busy: {found.group(0)!r}")
        return None  # the site's rules and gridgate's generic kinds decide the rest
'''

_STAND_IN = '''\
#!/usr/bin/env python3
"""A stand-in for your batch system's submit command, to try the backend end to end
(`gridgate run --once -c site.yaml`). Prints one job id line per pilot."""

import sys
import uuid

count = int(sys.argv[-1]) if len(sys.argv) > 1 and sys.argv[-1].isdigit() else 1
for _ in range(count):
    print(f"Submitted job {uuid.uuid4().hex[:12]}")
'''

_SITE = """\
# Try the backend end to end: gridgate run --once --json -c site.yaml
# Relative paths (the state folder, the stand-in command) are taken from this file's folder.
director:
  state_dir: ./gridgate-state
state:
  driver: memory
backends:
  $name:
    command: [./stand-in/$name-submit, "{endpoint}", "{count}"]
    endpoints: [queue1, queue2]
demand:
  static:
    $name: 3
"""

_BACKEND_TESTS = '''\
"""Tests of the `$name` backend with gridgate's testing kit: real stand-in commands, no mocks."""

from __future__ import annotations

import contextlib

import pytest

from gridgate.core.config import ConfigError
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.testing import (
    BackendContract,
    Collector,
    build_plugin,
    director_for,
    plugin_manager_with,
    section_for,
)
from $package import $cls


class Test${cls}Contract(BackendContract):
    """The contract every gridgate backend keeps, inherited."""

    backend_class = $cls
    name = "$name"
    submitted_output = "Submitted job $name-{call}\\n"
    bad_sections = (({"command": ["submit", "{queue}"]}, ("command", 1)),)

    def section(self, program, tmp_path):
        return {"command": [program, "{endpoint}"]}


def test_section_defaults_and_errors() -> None:
    assert section_for($cls, {"command": ["submit"]})["endpoints"] == ["default"]
    with pytest.raises(ConfigError) as caught:
        section_for($cls, {"command": ["submit"], "job_id_pattern": "no group"})
    assert [p.path for p in caught.value.problems] == [("job_id_pattern",)]


def test_gridgate_submit_fills_the_placeholders_and_reads_the_ids(gridgate_stand_in) -> None:
    submit = gridgate_stand_in("submit", stdout="Submitted job a{call}\\nSubmitted job b{call}\\n")
    backend = build_plugin($cls, {"command": [str(submit), "--queue={endpoint}", "{count}"]}, name="$name")
    with plugin_manager_with(backend) as pm:
        result = pm.hook.gridgate_submit(endpoint=Endpoint("$name", "q1"),
                                         request=SubmitRequest("$name", count=2), timeout=30)
    assert result.ok and result.job_ids == ("a1", "b1")
    assert submit.calls()[0]["argv"] == ["--queue=q1", "2"]


def test_gridgate_classify_failure_busy_output_is_a_quiet_exclusion(gridgate_stand_in) -> None:
    submit = gridgate_stand_in("submit", stderr="queue full, try later\\n", exit_code=1)
    backend = build_plugin($cls, {"command": [str(submit)], "busy_patterns": ["queue full"]}, name="$name")
    endpoint = Endpoint("$name", "default")
    with plugin_manager_with(backend) as pm:
        result = pm.hook.gridgate_submit(endpoint=endpoint, request=SubmitRequest("$name"), timeout=30)
        found = pm.hook.gridgate_classify_failure(endpoint=endpoint, result=result)
    assert (found.kind, found.exclude, found.notify) == ("busy", True, False)


def test_gridgate_backend_info_a_whole_iteration(gridgate_stand_in, tmp_path) -> None:
    submit = gridgate_stand_in("submit", stdout="Submitted job j{call}\\n")
    backend = build_plugin($cls, {"command": [str(submit)], "endpoints": ["q1", "q2"]}, name="$name")
    collector = Collector()
    doc = {"director": {"state_dir": str(tmp_path / "state")}, "demand": {"static": {"$name": 4}}}
    with contextlib.closing(director_for(doc, backend, collector)) as director:
        summary = director.run_iteration()
    assert [r.outcome for r in summary.records] == ["submitted"] * 4
    assert collector.notes == []
'''

# --- backend, batch shape: submit, status (and history), cancel ------------------------------

_BATCH_BACKEND = r'''"""The `$name` backend: submits pilots to a batch system and tracks and cancels them, with
three commands from the config: submit (`qsub`, `sbatch`, `bsub`), status (`qstat`,
`squeue`, `bjobs`) and cancel (`qdel`, `scancel`, `bkill`), plus an optional history
command (`qacct -j`, `sacct`) for finished jobs, which vanish from the live listing.

To adapt it: put your batch system's commands in the config (`site.yaml`) and change the
parsers below (`JOB_ID`, `STATUS_LINE`, `NATIVE_STATES`, `CANCELLED`, `FINISHED`) to what
they print. Classify your tool's own error messages in `classify_failure` with catalogued
kinds (`gridgate plugins --kinds`). Every command runs through the base class's `run` with
`deadline`: killed at the hook call's deadline (your `command_timeout` when set), output
capped at the site's `director.max_output_bytes`; the contract tests check both, for submit,
status and cancel. Paths in the section (the script, input files, a command's program given
with a `/`) are taken from the config file's folder when relative (core resolves the keys
marked `x-gridgate-path`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from gridgate.core.backend import Backend, command_timeout_schema, env_schema
from gridgate.core.kinds import failure, missing_input
from gridgate.core.model import (
    CancelResult,
    CommandResult,
    Endpoint,
    Failure,
    JobStatus,
    PilotState,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import PluginContext
from gridgate.core.runner import argv_chunks

#: What the submit command prints for each job: the id is the group.
JOB_ID = re.compile(r"^Submitted job (\S+)$$", re.MULTILINE)
#: One job of the status listing or of the history: id, native state, the rest of the line.
STATUS_LINE = re.compile(r"^(?P<id>\S+)\s+(?P<state>[A-Z]+)(?:[ \t]+(?P<rest>.*))?$$", re.MULTILINE)
#: The batch system's own states -> gridgate's (docs/pilots.md: waiting, running, done,
#: failed, cancelled; an id the listing does not name is left out: core makes it unknown,
#: then lost after pilots.lost_after).
NATIVE_STATES: dict[str, PilotState] = {
    "PENDING": "waiting",
    "RUNNING": "running",
    "DONE": "done",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
}
#: What the cancel command prints for a job it cancelled, and for one that had finished.
CANCELLED = re.compile(r"^(\S+) cancelled$$", re.MULTILINE)
FINISHED = re.compile(r"^(\S+) already finished", re.MULTILINE)

SUBMIT_PLACEHOLDERS = ("endpoint", "group", "count", "script")
PLACEHOLDERS = ("endpoint",)  # of status, history and cancel, which get the ids appended


def _argv_schema(description: str, nullable: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": ["array", "null"] if nullable else "array",
        "items": {"type": "string"},
        "minItems": 1,
        # its program, when given with a "/", is taken from the config file's folder
        "x-gridgate-path": "argv",
        "description": description,
    }
    if nullable:
        schema["default"] = None
    return schema


class $cls(Backend):
    """Submits with `submit_command`, tracks with `status_command` (and `history_command`
    for jobs no longer live), cancels with `cancel_command`."""

    name = "$name"  # the entry-point name: the key of this backend's section
    endpoints_key = "queues"  # one endpoint per queue
    pilots_key = "pilots_per_submission"

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "queues": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$$"},
                "minItems": 1,
                "default": ["default"],
                "description": "The queues to submit to; each is an endpoint.",
            },
            "script": {
                "type": "string",
                "minLength": 1,
                "x-gridgate-path": True,
                "description": "The pilot script each job runs (relative: to the config "
                "file's folder); checked readable before each submission.",
            },
            "input_files": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "x-gridgate-path": True},
                "default": [],
                "description": "More files each pilot needs (an input sandbox), checked like "
                "the script; `{input_files}` as a whole argv item of the submit command "
                "becomes them.",
            },
            "submit_command": _argv_schema(
                "The submit command: program, then arguments; {endpoint}, {group}, {count} "
                "and {script} are filled in."
            ),
            "status_command": _argv_schema(
                "The command listing live jobs; the job ids are appended ({endpoint} filled in)."
            ),
            "history_command": _argv_schema(
                "The accounting command for jobs that left the live listing; the ids are "
                "appended. null: such jobs are unknown, then lost after pilots.lost_after.",
                nullable=True,
            ),
            "cancel_command": _argv_schema(
                "The cancel command; the job ids are appended ({endpoint} filled in)."
            ),
            "pilots_per_submission": {
                "type": "integer",
                "minimum": 1,
                "default": 1,
                "description": "Pilots one submit command submits ({count}).",
            },
            "busy_patterns": {
                "type": "array",
                "items": {"type": "string"},
                "default": [],
                "description": "Output that means the queue is busy: take it out of rotation "
                "quietly and try another.",
            },
            "command_timeout": command_timeout_schema(),
            "env": env_schema(),
        },
        "required": ["script", "submit_command", "status_command", "cancel_command"],
        "additionalProperties": False,
    }

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for index, pattern in enumerate(section.get("busy_patterns", [])):
            try:
                re.compile(pattern)
            except re.error as exc:
                problems.append((("busy_patterns", index), f"invalid regular expression: {exc}"))
        for key in ("submit_command", "status_command", "history_command", "cancel_command"):
            allowed = SUBMIT_PLACEHOLDERS if key == "submit_command" else PLACEHOLDERS
            for index, item in enumerate(section.get(key) or ()):
                if key == "submit_command" and item == "{input_files}":
                    continue
                for placeholder in re.findall(r"\{(\w+)\}", item):
                    if placeholder not in allowed:
                        problems.append(((key, index), f"unknown placeholder {{{placeholder}}}"))
        return problems

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._busy = [re.compile(p) for p in config["busy_patterns"]]

    # --- submit ---------------------------------------------------------------------------

    def submit_argv(self, endpoint: Endpoint, request: SubmitRequest) -> list[str]:
        """The submit command, each config value one argv item (no shell is ever involved)."""
        values = {
            "endpoint": endpoint.name,
            "group": request.group,
            "count": str(request.count),
            "script": self.config["script"],
        }
        argv: list[str] = []
        for item in self.config["submit_command"]:
            if item == "{input_files}":
                argv += self.config["input_files"]
            else:
                argv.append(_fill(item, values))
        return argv

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        # a missing script is this machine's fault: nothing is sent, no queue is blamed
        files = {f"the pilot script (backends.{self.name}.script)": self.config["script"]}
        for index, path in enumerate(self.config["input_files"]):
            files[f"the input file backends.{self.name}.input_files[{index}]"] = path
        missing = missing_input(files)
        if missing:
            return SubmitResult(endpoint, ok=False, local_fault=missing, message=missing)
        # killed at the deadline, output capped at the site's director.max_output_bytes
        result = self.run(self.submit_argv(endpoint, request), self.deadline(timeout))
        if not result.ok:  # failures are results: classifiers read the evidence in `command`
            return SubmitResult(endpoint, ok=False, command=result)
        ids = tuple(JOB_ID.findall(result.stdout))
        if not ids:
            message = "exit code 0 but no job id in the output"
            return SubmitResult(endpoint, ok=False, command=result, message=message)
        return SubmitResult(endpoint, ok=True, job_ids=ids, command=result)

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        if result.local_fault:  # the one local fault submit gives: an input file it lacks
            return failure("missing_input", result.local_fault)
        if result.command is None:
            return None
        text = result.command.stdout + result.command.stderr
        for pattern in self._busy:
            found = pattern.search(text)
            if found:
                return failure("busy", f"{endpoint.name} is busy: {found.group(0)!r}")
        return None  # the site's rules and gridgate's generic kinds decide the rest

    # --- status -----------------------------------------------------------------------------

    def job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult:
        """One status listing (chunked when the ids are many), then the history for the ids
        it did not name; an id neither names is left out (core: unknown, then lost)."""
        if not job_ids:
            return StatusResult(endpoint, ok=True, commands=0)  # nothing to ask: no command
        deadline = self.deadline(timeout)  # shared by every command of this call
        statuses: dict[str, JobStatus] = {}
        commands = 0
        keys = ["status_command", "history_command"]
        for key in keys if self.config.get("history_command") else keys[:1]:
            asked = [i for i in job_ids if i not in statuses]
            if not asked:
                break
            prefix = [_fill(item, {"endpoint": endpoint.name}) for item in self.config[key]]
            for argv in argv_chunks(prefix, asked):
                result = self.run(argv, deadline)
                commands += 1
                if not result.ok or result.stdout_truncated:  # a cut listing would lose jobs
                    return StatusResult(endpoint, ok=False, command=result, commands=commands)
                statuses.update(parse_statuses(result.stdout, asked))
        return StatusResult(endpoint, ok=True, statuses=statuses, commands=commands)

    # --- cancel -----------------------------------------------------------------------------

    def cancel(self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float) -> CancelResult:
        """Cancel the jobs; only those the command says it cancelled are `cancelled`: a job
        that had already finished is not (it is tracked to its end state), nor one unknown."""
        if not job_ids:
            return CancelResult(endpoint, ok=True)  # nothing to cancel: no command
        deadline = self.deadline(timeout)
        prefix = [_fill(i, {"endpoint": endpoint.name}) for i in self.config["cancel_command"]]
        cancelled: list[str] = []
        finished: list[str] = []
        last: CommandResult | None = None
        for argv in argv_chunks(prefix, job_ids):
            last = self.run(argv, deadline)
            if last.timed_out or last.launch_error is not None or last.stdout_truncated:
                return CancelResult(endpoint, ok=False, cancelled=tuple(cancelled), command=last)
            asked = set(argv[len(prefix) :])
            cancelled += [i for i in CANCELLED.findall(last.stdout) if i in asked]
            finished += [i for i in FINISHED.findall(last.stdout) if i in asked]
            if not last.ok and not (cancelled or finished):  # refused as a whole
                return CancelResult(endpoint, ok=False, command=last)
        unknown = [i for i in job_ids if i not in cancelled and i not in finished]
        said = []  # a finished job is tracked to its end state, not reported cancelled
        if finished:
            said.append(f"already finished: {' '.join(finished)}")
        if unknown:
            said.append(f"not known: {' '.join(unknown)}")
        return CancelResult(
            endpoint, ok=True, cancelled=tuple(cancelled), command=last, message="; ".join(said)
        )


def parse_statuses(text: str, asked: Sequence[str]) -> dict[str, JobStatus]:
    """The jobs of ``asked`` that a status or history listing names, by id."""
    wanted = set(asked)
    found: dict[str, JobStatus] = {}
    for line in STATUS_LINE.finditer(text):
        job_id, native, rest = line.group("id"), line.group("state"), line.group("rest") or ""
        state = NATIVE_STATES.get(native)
        if job_id in wanted and state is not None:
            code = rest.split()[0] if rest.split() else ""
            found[job_id] = JobStatus(
                job_id,
                state,
                native=native,
                reason=rest,
                exit_code=int(code) if code.lstrip("-").isdigit() else None,
            )
    return found


def _fill(item: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), item)
'''

_BATCH_STAND_IN = r'''#!/usr/bin/env python3
"""A stand-in for a batch system, to try the `$name` backend end to end and to test it: one
program plays the submit, status, history and cancel commands, keeping its jobs in a spool
folder ($$GRIDGATE_STAND_IN_SPOOL, default ./spool beside this file).

  $name-batch submit --queue=Q [--count=N] [--fail-every=K] [--polls=P] SCRIPT [FILE...]
  $name-batch status [ID...]    live jobs:      "ID PENDING Q" / "ID RUNNING Q"
  $name-batch history [ID...]   finished ones:  "ID DONE 0" / "ID FAILED 1" / "ID CANCELLED -"
  $name-batch cancel ID...      "ID cancelled" / "ID already finished (DONE)" / "ID: no such job"

Job lifecycles move over polls, as a real batch system's move over time: a job is PENDING for
P status listings that name it, then RUNNING for P, then it has finished: it vanishes from the
live listing (as in Grid Engine, LSF and Slurm) and only the history knows it, DONE, or FAILED
for every K-th job. Only the standard library; no shell.
"""

import fcntl
import json
import os
import sys
from pathlib import Path

SPOOL = Path(os.environ.get("GRIDGATE_STAND_IN_SPOOL") or Path(__file__).resolve().parent / "spool")
LIVE = ("PENDING", "RUNNING")


def options(args):
    named = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
    return named, [a for a in args if not a.startswith("--")]


def submit(jobs, args):
    named, files = options(args)
    if "queue" not in named or not files:
        return usage("submit needs --queue=Q and a script")
    for path in files:
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            print(f"submit: error: cannot read {path}: {exc.strerror}", file=sys.stderr)
            return 1
    for _ in range(int(named.get("count", "1"))):
        number = len(jobs) + 101
        every = int(named.get("fail-every", "0"))
        jobs[str(number)] = {
            "queue": named["queue"],
            "state": "PENDING",
            "polls": 0,
            "per_state": int(named.get("polls", "1")),
            "fails": bool(every) and number % every == 0,
        }
        print(f"Submitted job {number}")
    return 0


def status(jobs, ids):
    for job_id in ids or list(jobs):
        job = jobs.get(job_id)
        if job is None or job["state"] not in LIVE:
            continue  # finished or never known: not in the live listing
        job["polls"] += 1
        step = (job["polls"] - 1) // job["per_state"]  # 0 pending, 1 running, 2 finished
        if step >= 2:
            job["state"], job["exit"] = ("FAILED", 1) if job["fails"] else ("DONE", 0)
            continue  # it has just finished: gone from the listing
        job["state"] = LIVE[step]
        print(f"{job_id} {job['state']} {job['queue']}")
    return 0


def history(jobs, ids):
    for job_id in ids or list(jobs):
        job = jobs.get(job_id)
        if job is not None and job["state"] not in LIVE:
            print(f"{job_id} {job['state']} {job.get('exit', '-')}")
    return 0


def cancel(jobs, ids):
    if not ids:
        return usage("cancel needs job ids")
    unknown = 0
    for job_id in ids:
        job = jobs.get(job_id)
        if job is None:
            print(f"{job_id}: no such job", file=sys.stderr)
            unknown += 1
        elif job["state"] in LIVE:
            job["state"] = "CANCELLED"
            print(f"{job_id} cancelled")
        else:
            print(f"{job_id} already finished ({job['state']})")
    return 1 if unknown else 0


def usage(message):
    print(f"{Path(sys.argv[0]).name}: {message}", file=sys.stderr)
    return 2


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        return usage(f"the first word is one of {', '.join(COMMANDS)}")
    SPOOL.mkdir(parents=True, exist_ok=True)
    with open(SPOOL / "jobs.json", "a+", encoding="utf-8") as spool:
        fcntl.flock(spool, fcntl.LOCK_EX)  # one command at a time, like a batch server
        spool.seek(0)
        jobs = json.loads(spool.read() or "{}")
        code = COMMANDS[sys.argv[1]](jobs, sys.argv[2:])
        spool.seek(0)
        spool.truncate()
        spool.write(json.dumps(jobs, indent=1))
    return code


COMMANDS = {"submit": submit, "status": status, "history": history, "cancel": cancel}

if __name__ == "__main__":
    sys.exit(main())
'''

_BATCH_TESTS = r'''"""Tests of the `$name` backend with gridgate's testing kit and the generated stand-in batch
system (stand-in/$name-batch): real commands, no mocks."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest

from gridgate.core.config import ConfigError, load_config
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.testing import (
    Answer,
    BackendContract,
    Collector,
    FakeClock,
    build_plugin,
    director_for,
    plugin_manager_with,
    section_for,
)
from $package import $cls

PACKAGE = Path(__file__).resolve().parents[1]
STAND_IN = PACKAGE / "stand-in" / "$name-batch"
ENDPOINT = Endpoint("$name", "q1")


def _section(tmp_path: Path, *submit_options: str, history: bool = True) -> dict:
    """The backend's section driving the stand-in, its spool in ``tmp_path``."""
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\necho pilot\n", encoding="utf-8")
    batch = [sys.executable, str(STAND_IN)]  # this interpreter: the test's PATH is not asked
    return {
        "queues": ["q1", "q2"],
        "script": str(script),
        "submit_command": [*batch, "submit", "--queue={endpoint}", "--count={count}",
                           *submit_options, "{script}", "{input_files}"],
        "status_command": [*batch, "status"],
        "history_command": [*batch, "history"] if history else None,
        "cancel_command": [*batch, "cancel"],
        "env": {"GRIDGATE_STAND_IN_SPOOL": str(tmp_path / "spool")},
    }


class Test${cls}Contract(BackendContract):
    """The contract every gridgate backend keeps, inherited: submit, status and cancel are
    each killed at their deadline, capped at the site's output limit, and so on."""

    backend_class = $cls
    name = "$name"
    submitted_output = "Submitted job {call}\n"
    bad_sections = (({"submit_command": ["submit", "{queue}"]}, ("submit_command", 1)),)

    def section(self, program, tmp_path):
        # one program plays every command, as the contract's stand-in does
        section = _section(tmp_path)
        section.update(
            submit_command=[program, "submit", "--queue={endpoint}", "{script}"],
            status_command=[program, "status"],
            history_command=[program, "history"],
            cancel_command=[program, "cancel"],
        )
        return section

    def status_answer(self, known, unknown):
        """What the stand-in prints when it knows exactly the jobs in ``known`` live: the
        status listing names them, the history none (no job has finished); of the jobs in
        ``unknown`` neither says a word."""
        native = {"waiting": "PENDING", "running": "RUNNING"}
        listing = "".join(f"{job} {native[state]} q1\n" for job, state in known.items())
        return (Answer(stdout=listing, when=("status",)), Answer(when=("history",)))

    def cancel_answer(self, cancelled, finished, unknown):
        """What the stand-in's cancel prints (and exits with) for these jobs."""
        return Answer(
            stdout="".join(f"{job} cancelled\n" for job in cancelled)
            + "".join(f"{job} already finished (DONE)\n" for job in finished),
            stderr="".join(f"{job}: no such job\n" for job in unknown),
            exit_code=1 if unknown else 0,
        )


def test_section_needs_the_three_commands_and_a_script(tmp_path) -> None:
    section = section_for($cls, _section(tmp_path))
    assert section["pilots_per_submission"] == 1 and section["command_timeout"] is None
    with pytest.raises(ConfigError) as caught:
        section_for($cls, {"queues": ["q1"]})
    assert "script" in str(caught.value) and "status_command" in str(caught.value)


def test_gridgate_job_status_follows_the_jobs_from_waiting_to_done_or_failed(tmp_path) -> None:
    backend = build_plugin($cls, _section(tmp_path, "--fail-every=2"), name="$name")
    with plugin_manager_with(backend) as pm:
        submitted = pm.hook.gridgate_submit(
            endpoint=ENDPOINT, request=SubmitRequest("$name", count=2), timeout=30)
        assert submitted.ok and submitted.job_ids == ("101", "102")
        polls = []
        for _ in range(4):
            result = pm.hook.gridgate_job_status(
                endpoint=ENDPOINT, job_ids=submitted.job_ids, timeout=30)
            assert result.ok
            polls.append({job: s.state for job, s in result.statuses.items()})
    assert polls[:2] == [{"101": "waiting", "102": "waiting"}, {"101": "running", "102": "running"}]
    # finished: gone from the live listing, told by the history (the 2nd job fails)
    assert polls[2] == polls[3] == {"101": "done", "102": "failed"}


def test_without_a_history_finished_jobs_are_left_out_for_core_to_call_unknown(tmp_path) -> None:
    backend = build_plugin($cls, _section(tmp_path, history=False), name="$name")
    with plugin_manager_with(backend) as pm:
        [job] = pm.hook.gridgate_submit(
            endpoint=ENDPOINT, request=SubmitRequest("$name"), timeout=30).job_ids
        states = [pm.hook.gridgate_job_status(endpoint=ENDPOINT, job_ids=[job], timeout=30)
                  .statuses.get(job) for _ in range(3)]
    assert [s.state if s else None for s in states] == ["waiting", "running", None]


def test_gridgate_cancel_says_which_jobs_it_cancelled_and_which_had_finished(tmp_path) -> None:
    backend = build_plugin($cls, _section(tmp_path), name="$name")
    with plugin_manager_with(backend) as pm:
        live, ended = pm.hook.gridgate_submit(
            endpoint=ENDPOINT, request=SubmitRequest("$name", count=2), timeout=30).job_ids
        for _ in range(3):  # both finish
            pm.hook.gridgate_job_status(endpoint=ENDPOINT, job_ids=[ended], timeout=30)
        result = pm.hook.gridgate_cancel(
            endpoint=ENDPOINT, job_ids=[live, ended, "999"], timeout=30)
        after = pm.hook.gridgate_job_status(endpoint=ENDPOINT, job_ids=[live, ended], timeout=30)
    assert result.ok and result.cancelled == (live,)  # a finished job is not "cancelled"
    assert f"already finished: {ended}" in result.message and "not known: 999" in result.message
    assert {job: s.state for job, s in after.statuses.items()} == {live: "cancelled", ended: "done"}


def test_a_missing_script_is_a_local_fault_naming_it_and_nothing_is_run(tmp_path) -> None:
    section = _section(tmp_path)
    section["script"] = str(tmp_path / "no-such-pilot.sh")
    backend = build_plugin($cls, section, name="$name")
    with plugin_manager_with(backend) as pm:
        result = pm.hook.gridgate_submit(
            endpoint=ENDPOINT, request=SubmitRequest("$name"), timeout=30)
        found = pm.hook.gridgate_classify_failure(endpoint=ENDPOINT, result=result)
    assert not result.ok and result.command is None  # nothing was sent
    assert (found.kind, found.local, found.exclude) == ("missing_input", True, False)
    assert str(tmp_path / "no-such-pilot.sh") in found.reason
    assert not (tmp_path / "spool").exists()


def test_a_whole_iteration_submits_then_tracks_the_pilots(tmp_path) -> None:
    backend = build_plugin($cls, _section(tmp_path), name="$name")
    collector = Collector()
    clock = FakeClock()
    doc = {"director": {"state_dir": str(tmp_path / "state")}, "demand": {"static": {"$name": 2}}}
    with contextlib.closing(director_for(doc, backend, collector, clock=clock)) as director:
        first = director.run_iteration()
        clock.advance(600)
        second = director.run_iteration()  # polls the pilots the first submitted
    assert [r.outcome for r in first.records] == ["submitted"] * 2
    polls = second.pilots.polls  # one per queue the selector chose
    assert {p.outcome for p in polls} == {"ok"} and sum(p.pilots for p in polls) == 2
    spool = json.loads((tmp_path / "spool" / "jobs.json").read_text(encoding="utf-8"))
    polled = [spool[job]["polls"] for record in first.records for job in record.job_ids]
    assert polled == [1, 1], "one status command asked the batch system of each pilot"
    assert collector.notes == []


def test_a_missing_script_is_told_once_naming_the_file_and_blames_no_queue(tmp_path) -> None:
    section = _section(tmp_path)
    section["script"] = str(tmp_path / "gone.sh")
    backend = build_plugin($cls, section, name="$name")
    collector = Collector()
    doc = {"director": {"state_dir": str(tmp_path / "state")}, "demand": {"static": {"$name": 2}}}
    with contextlib.closing(director_for(doc, backend, collector)) as director:
        summaries = [director.run_iteration() for _ in range(2)]
    assert all(s.excluded == () for s in summaries)
    [note] = collector.notes
    assert note.subject.endswith("[missing_input]") and str(tmp_path / "gone.sh") in note.subject
    assert "not of any server" in note.body


def test_relative_paths_in_a_config_file_are_taken_from_its_folder(tmp_path) -> None:
    site = tmp_path / "etc" / "site.yaml"
    site.parent.mkdir()
    site.write_text(
        "backends:\n  $name:\n    queues: [q1]\n    script: pilot.sh\n"
        "    submit_command: [./bin/submit, '{script}']\n"
        "    status_command: [status]\n    cancel_command: [./bin/cancel]\n"
        "demand:\n  static:\n    $name: 1\n", encoding="utf-8")
    section = load_config(site)["backends"]["$name"]
    assert section["script"] == str(site.parent / "pilot.sh")
    assert section["submit_command"] == [str(site.parent / "bin" / "submit"), "{script}"]
    assert section["status_command"] == ["status"]  # a bare name is looked up on PATH
    assert section["cancel_command"] == [str(site.parent / "bin" / "cancel")]
'''

_PILOT = """\
#!/bin/sh
# The pilot script the batch shape's site.yaml submits (the stand-in only checks it is readable).
echo "a pilot would start here"
"""

_BATCH_SITE = """\
# Try the backend end to end: gridgate run --iterations 4 --json -c site.yaml, then
# gridgate pilots list -c site.yaml. Relative paths (the state, the script, the stand-in's
# commands) are taken from this file's folder, from whatever folder you run gridgate in.
director:
  state_dir: ./gridgate-state
  cycle_seconds: 2        # a short pause between iterations, to watch the jobs move
state:
  driver: sqlite
  path: ./gridgate-state/state.db
backends:
  $name:
    queues: [queue1, queue2]
    script: pilot.sh
    # every third job fails; each job is PENDING for one status poll, RUNNING for one, then done
    submit_command: [./stand-in/$name-batch, submit, "--queue={endpoint}", "--count={count}",
                     "--fail-every=3", "{script}"]
    status_command: [./stand-in/$name-batch, status]
    history_command: [./stand-in/$name-batch, history]
    cancel_command: [./stand-in/$name-batch, cancel]
    command_timeout: 30
demand:
  static:
    $name: 3
"""

# --- notifier -----------------------------------------------------------------------------------

_NOTIFIER = '''\
"""The `$name` notifier: writes each notification of the chosen levels as a file in a folder.

Replace `deliver` with your service (chat, pager, ticket system). Keep `gridgate_notify`
quick: it is called from submission threads, so queue the message and return.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from gridgate.core import hookimpl
from gridgate.core.files import atomic_write
from gridgate.core.model import Notification
from gridgate.core.plugins import Plugin, PluginContext


class $cls(Plugin):
    """Delivers notifications of `levels` on its own thread."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "folder": {"type": "string", "minLength": 1,
                       "description": "Where the messages are written."},
            "levels": {"type": "array", "items": {"enum": ["info", "error", "alarm"]},
                       "uniqueItems": True, "default": ["error", "alarm"],
                       "description": "Levels delivered."},
        },
        "required": ["folder"],
        "additionalProperties": False,
    }

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._queue: queue.Queue[Notification | None] = queue.Queue()
        self._sent = 0
        self._thread = threading.Thread(target=self._work, name="$name-notifier", daemon=True)
        self._thread.start()

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        if notification.level in self.config["levels"]:
            self._queue.put(notification)  # never block a submission thread

    def _work(self) -> None:
        while (note := self._queue.get()) is not None:
            try:
                self.deliver(note)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def deliver(self, note: Notification) -> None:
        """Send one message: here a file, written whole or not at all."""
        self._sent += 1
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", note.key or note.subject)[:80]
        path = Path(self.config["folder"]) / f"{self._sent:05d}-{note.level}-{safe}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, f"Subject: {note.subject}\\n\\n{note.body}".encode(), durable=False)

    def flush(self, timeout: float) -> bool:
        """Wait until the queued messages are delivered (`gridgate notify test` calls it)."""
        done = threading.Event()
        threading.Thread(target=lambda: (self._queue.join(), done.set()), daemon=True).start()
        return done.wait(timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
'''

_NOTIFIER_TESTS = '''\
"""Tests of the `$name` notifier with gridgate's testing kit."""

from __future__ import annotations

import contextlib

import pytest

from gridgate.core.config import ConfigError
from gridgate.core.model import Notification
from gridgate.core.testing import build_plugin, director_for, section_for
from $package import $cls


def test_section_needs_a_folder_and_defaults_the_levels(tmp_path) -> None:
    assert section_for($cls, {"folder": str(tmp_path)})["levels"] == ["error", "alarm"]
    with pytest.raises(ConfigError) as caught:
        section_for($cls, {"folder": str(tmp_path), "levels": ["loud"]})
    assert [p.path for p in caught.value.problems] == [("levels", 0)]


def test_gridgate_notify_delivers_the_chosen_levels(gridgate_clock, tmp_path) -> None:
    notifier = build_plugin($cls, {"folder": str(tmp_path / "out")}, name="$name")
    try:
        for level in ("info", "error", "alarm"):
            notifier.gridgate_notify(notification=Notification(
                level, f"s1: {level}", "body\\n", gridgate_clock.time(), key=f"k-{level}"))
        assert notifier.flush(10)
    finally:
        notifier.close()
    texts = [p.read_text() for p in sorted((tmp_path / "out").iterdir())]  # in sending order
    assert [t.splitlines()[0] for t in texts] == ["Subject: s1: error", "Subject: s1: alarm"]


def test_a_failing_server_reaches_it_through_a_whole_iteration(gridgate_stand_in, tmp_path) -> None:
    from gridgate.core import hookimpl
    from gridgate.core.model import BackendInfo, Endpoint, SubmitResult
    from gridgate.core.runner import run

    failing = gridgate_stand_in("submit", stderr="refused\\n", exit_code=1)

    class Backend:  # a backend whose one server always fails
        @hookimpl
        def gridgate_backend_info(self, backend):
            return BackendInfo("test", (Endpoint("test", "s1"),)) if backend == "test" else None

        @hookimpl
        def gridgate_submit(self, endpoint, request, timeout):
            return SubmitResult(endpoint, ok=False, command=run([str(failing)], timeout))

    notifier = build_plugin($cls, {"folder": str(tmp_path / "out")}, name="$name")
    doc = {"director": {"state_dir": str(tmp_path / "state")}, "demand": {"static": {"test": 1}}}
    with contextlib.closing(director_for(doc, Backend(), notifier)) as director:
        director.run_iteration()
        assert notifier.flush(10)
    [text] = [p.read_text() for p in (tmp_path / "out").iterdir()]
    assert text.startswith("Subject: s1: error executing Job Submit [error]")
'''

# --- classifier ---------------------------------------------------------------------------------

_CLASSIFIER = '''\
"""The `$name` classifier: names failures from your tool's messages.

Each rule maps a regular expression in the command's output to a catalogued kind (see
`gridgate plugins --kinds`); the kind's flags say whether the server is excluded, people
told, the submission retried elsewhere. Return None for what you do not recognise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from gridgate.core import hookimpl
from gridgate.core.kinds import KINDS, failure
from gridgate.core.model import Endpoint, Failure, SubmitResult
from gridgate.core.plugins import Plugin, PluginContext


class $cls(Plugin):
    """Regex rules from config, first match wins."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "rules": {
                "type": "array", "default": [],
                "description": "Checked in order; the first whose pattern is found decides.",
                "items": {"type": "object", "required": ["pattern", "kind"], "additionalProperties": False,
                          "properties": {"pattern": {"type": "string", "description": "Regular expression."},
                                         "kind": {"enum": sorted(KINDS), "description": "A catalogued kind."}}},
            },
            "backend": {"type": ["string", "null"], "default": None,
                        "description": "Only failures of this backend (null: every backend)."},
        },
        "additionalProperties": False,
    }

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for index, rule in enumerate(section.get("rules", [])):
            try:
                re.compile(rule["pattern"])
            except re.error as exc:
                problems.append((("rules", index, "pattern"), f"invalid regular expression: {exc}"))
        return problems

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._rules = [(re.compile(r["pattern"], re.MULTILINE), r["kind"]) for r in config["rules"]]

    @hookimpl
    def gridgate_classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        if self.config["backend"] not in (None, endpoint.backend) or result.command is None:
            return None
        text = result.command.stdout + "\\n" + result.command.stderr
        for pattern, kind in self._rules:
            found = pattern.search(text)
            if found:
                return failure(kind, f"{result.operation}: {found.group(0).strip()[:200]!r}")
        return None  # not ours: the next classifier decides
'''

_CLASSIFIER_TESTS = '''\
"""Tests of the `$name` classifier with gridgate's testing kit."""

from __future__ import annotations

import pytest

from gridgate.core.config import ConfigError
from gridgate.core.model import CommandResult, Endpoint, SubmitResult
from gridgate.core.runner import run
from gridgate.core.testing import build_plugin, plugin_manager_with, section_for
from $package import $cls

RULES = [{"pattern": "Disk quota exceeded", "kind": "config"}, {"pattern": "try later", "kind": "busy"}]


def test_section_refuses_unknown_kinds_and_bad_patterns() -> None:
    with pytest.raises(ConfigError) as caught:
        section_for($cls, {"rules": [{"pattern": "(", "kind": "busy"}, {"pattern": "x", "kind": "oops"}]})
    assert sorted(p.path for p in caught.value.problems) == [("rules", 1, "kind")]
    with pytest.raises(ConfigError) as caught:
        section_for($cls, {"rules": [{"pattern": "(", "kind": "busy"}]})
    assert [p.path for p in caught.value.problems] == [("rules", 0, "pattern")]


def test_gridgate_classify_failure_names_what_it_knows_and_passes_on_the_rest(gridgate_stand_in) -> None:
    classifier = build_plugin($cls, {"rules": RULES}, name="$name")
    endpoint = Endpoint("any", "s1")
    quota = gridgate_stand_in("submit", stderr="write: Disk quota exceeded\\n", exit_code=1)
    other = gridgate_stand_in("other", stderr="segfault\\n", exit_code=139)
    with plugin_manager_with(classifier) as pm:
        found = pm.hook.gridgate_classify_failure(
            endpoint=endpoint, result=SubmitResult(endpoint, ok=False, command=run([str(quota)], 30)))
        unknown = pm.hook.gridgate_classify_failure(
            endpoint=endpoint, result=SubmitResult(endpoint, ok=False, command=run([str(other)], 30)))
    assert (found.kind, found.transient) == ("config", False) and "Disk quota" in found.reason
    assert unknown is None


def test_only_its_backend_when_told(gridgate_clock) -> None:
    classifier = build_plugin($cls, {"rules": RULES, "backend": "slurm"}, name="$name")
    command = CommandResult(("submit",), 1, stderr="try later\\n")
    assert classifier.gridgate_classify_failure(
        endpoint=Endpoint("lsf", "q"), result=SubmitResult(Endpoint("lsf", "q"), ok=False, command=command)) is None
    assert classifier.gridgate_classify_failure(
        endpoint=Endpoint("slurm", "p"), result=SubmitResult(Endpoint("slurm", "p"), ok=False,
                                                             command=command)).kind == "busy"
'''

_TEMPLATES = {
    "backend": ("backend", _BACKEND, _BACKEND_TESTS, "Backend"),
    "notifier": ("notifier", _NOTIFIER, _NOTIFIER_TESTS, "Notifier"),
    "classifier": ("classifier", _CLASSIFIER, _CLASSIFIER_TESTS, "Classifier"),
}
_SECTIONS = {"backend": "backends", "notifier": "notifiers", "classifier": "classifiers"}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def gridgate_source() -> tuple[str, str]:
    """What ``pip install -e`` takes to install this gridgate into a plugin's own venv, and
    where that is: the checkout this gridgate runs from, when it runs from one (an editable
    install of the sources), else the released package."""
    checkout = Path(__file__).resolve().parents[1]  # core/ is gridgate.core in a checkout
    pyproject = checkout / "pyproject.toml"
    if pyproject.is_file() and 'name = "gridgate"' in pyproject.read_text(encoding="utf-8"):
        return str(checkout), "from the checkout it runs from"
    return "gridgate", "from PyPI"


def new_plugin(
    kind: str, name: str, folder: Path | None = None, shape: str = "command"
) -> list[Path]:
    """Write the package of a ``kind`` plugin called ``name`` into ``folder`` (default
    ``./gridgate-NAME``, with ``-`` for ``_``); return the files written.

    A backend comes in one of :data:`SHAPES`: ``command`` (one submit command, no tracking)
    or ``batch`` (submit, status and cancel commands, and a history command for finished
    jobs, with a stand-in batch system whose jobs have lifecycles, for its tests and its
    ``site.yaml``).

    :raises ScaffoldError: for a name that is not a lower-case identifier, an unknown kind or
        shape (or a shape other than ``command`` for a kind that is not a backend), or a
        folder that exists and is not empty.
    """
    if kind not in _TEMPLATES:
        raise ScaffoldError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    if shape not in SHAPES:
        raise ScaffoldError(f"unknown shape {shape!r} (one of {', '.join(SHAPES)})")
    if shape != "command" and kind != "backend":
        raise ScaffoldError(f"--shape {shape} is a shape of a backend, not of a {kind}")
    if not NAME_RE.fullmatch(name):
        raise ScaffoldError(
            f"plugin name {name!r}: use lower-case letters, digits and _ "
            "(it is the key a site writes in its YAML)"
        )
    dist = "gridgate-" + name.replace("_", "-")
    folder = Path(folder) if folder is not None else Path(dist)
    if folder.exists() and any(folder.iterdir()):
        raise ScaffoldError(f"{folder} exists and is not empty: nothing was written")
    module, source, tests, suffix = _TEMPLATES[kind]
    batch = shape == "batch"
    if batch:
        source, tests = _BATCH_BACKEND, _BATCH_TESTS
    source_path, source_where = gridgate_source()
    values = {
        "name": name,
        "kind": kind,
        "dist": dist,
        "package": f"gridgate_{name}",
        "module": module,
        "cls": _camel(name) + suffix,
        "group": GROUPS[kind],
        "section": _SECTIONS[kind],
        "gridgate_version": ".".join(__version__.split(".")[:2]),
        "api_version": API_VERSION,
        "gridgate_source": source_path,
        "gridgate_where": source_where,
        "shape_text": (
            "\nIt submits, tracks and cancels with three commands (and a history command for "
            "finished jobs),\nand `stand-in/" + name + "-batch` plays a batch system for its "
            "tests and `site.yaml`."
            if batch
            else ""
        ),
        "run_line": _RUN_LINES[shape if kind == "backend" else "other"],
    }
    package = Path("src") / values["package"]
    files: dict[Path, str] = {
        Path("pyproject.toml"): _PYPROJECT,
        Path("README.md"): _README,
        Path(".gitignore"): _GITIGNORE,
        package / "__init__.py": _INIT,
        package / f"{module}.py": source,
        package / "py.typed": "",
        Path("tests") / "conftest.py": _CONFTEST,
        Path("tests") / f"test_{module}.py": tests,
    }
    programs: list[Path] = []
    if batch:
        programs.append(Path("stand-in") / f"{name}-batch")
        files[programs[-1]] = _BATCH_STAND_IN
        files[Path("pilot.sh")] = _PILOT
        files[Path("site.yaml")] = _BATCH_SITE
    elif kind == "backend":
        programs.append(Path("stand-in") / f"{name}-submit")
        files[programs[-1]] = _STAND_IN
        files[Path("site.yaml")] = _SITE
    written = []
    for relative, template in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template).substitute(values), encoding="utf-8")
        written.append(path)
    for relative in [*programs, Path("pilot.sh")]:
        program = folder / relative
        if program.exists():
            program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return written


_RUN_LINES = {
    "command": ".venv/bin/gridgate run --once --json -c site.yaml   # drives the stand-in command",
    "batch": ".venv/bin/gridgate run --iterations 4 --json -c site.yaml   # submits, then tracks\n"
    ".venv/bin/gridgate pilots list -c site.yaml                 # their states",
    "other": ".venv/bin/gridgate config validate site.yaml   # once a site names it",
}


def next_steps(kind: str, folder: Path, shape: str = "command") -> str:
    """What to type next, for the command line: a venv of the plugin's own (never the one
    gridgate runs in, which may be its development one), gridgate and the plugin installed
    there, its tests."""
    source, _where = gridgate_source()
    lines = [
        f"cd {folder}",
        "python3 -m venv .venv",
        f".venv/bin/pip install -e {source}",
        ".venv/bin/pip install -e '.[test]'",
        ".venv/bin/pytest",
    ]
    if kind == "backend":
        lines += _RUN_LINES[shape].split("\n")
    return "\n".join(lines) + "\n"
