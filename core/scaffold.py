"""``gridgate plugin new``: writes a plugin package that installs with ``pip install -e`` and
whose own tests pass at once, for a backend, a notifier or a classifier.

The package has a ``pyproject.toml`` with the entry point, a ``src/`` layout, a plugin class
with a schema'd config section, tests written with :mod:`gridgate.core.testing` (a backend's
inherit the backend contract), and for a backend a stand-in of its submit command and a
``site.yaml`` that drives it with ``gridgate run --once``.
"""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path
from string import Template

from gridgate.core import API_VERSION, __version__

KINDS = ("backend", "notifier", "classifier")
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

A gridgate $kind plugin, entry point `$name` in `$group` (plugin API $api_version).

```sh
pip install -e ".[test]"     # into the environment that has gridgate
pytest                       # its own tests, with gridgate's testing kit
gridgate plugins             # lists $name
$run_line
```

Where to go from here: docs/plugins.md (how to write a $kind), docs/hooks.md (every hook),
docs/api.md (what you may import), docs/kinds.md (failure kinds) in gridgate's sources.
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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from gridgate.core.backend import Backend
from gridgate.core.kinds import failure
from gridgate.core.model import Endpoint, Failure, SubmitRequest, SubmitResult
from gridgate.core.plugins import PluginContext

OPERATION = "Job Submit"
PLACEHOLDERS = ("endpoint", "group", "count")


class $cls(Backend):
    """Runs `command` (with {endpoint}, {group} and {count} filled in) to submit pilots."""

    endpoints_key = "endpoints"  # one endpoint per name in this list

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}, "minItems": 1,
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


def new_plugin(kind: str, name: str, folder: Path | None = None) -> list[Path]:
    """Write the package of a ``kind`` plugin called ``name`` into ``folder`` (default
    ``./gridgate-NAME``, with ``-`` for ``_``); return the files written.

    :raises ScaffoldError: for a name that is not a lower-case identifier, an unknown kind,
        or a folder that exists and is not empty.
    """
    if kind not in _TEMPLATES:
        raise ScaffoldError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
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
        "run_line": (
            "gridgate run --once --json -c site.yaml   # drives the stand-in command"
            if kind == "backend"
            else "gridgate config validate site.yaml    # once a site names it"
        ),
    }
    package = Path("src") / values["package"]
    files: dict[Path, str] = {
        Path("pyproject.toml"): _PYPROJECT,
        Path("README.md"): _README,
        package / "__init__.py": _INIT,
        package / f"{module}.py": source,
        package / "py.typed": "",
        Path("tests") / "conftest.py": _CONFTEST,
        Path("tests") / f"test_{module}.py": tests,
    }
    if kind == "backend":
        files[Path("stand-in") / f"{name}-submit"] = _STAND_IN
        files[Path("site.yaml")] = _SITE
    written = []
    for relative, template in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template).substitute(values), encoding="utf-8")
        written.append(path)
    stand_in = folder / "stand-in" / f"{name}-submit"
    if stand_in.exists():
        stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return written


def next_steps(kind: str, folder: Path) -> str:
    """What to type next, for the command line."""
    python = Path(sys.executable)
    return f"cd {folder}\n{python} -m pip install -e '.[test]'\n{python} -m pytest\n" + (
        "gridgate run --once --json -c site.yaml\n" if kind == "backend" else ""
    )
