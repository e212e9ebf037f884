"""The testing kit's parts (:mod:`gridgate.core.testing` is their public face): plugin managers
holding just the plugins of a test, validated configs, a director on in-memory state, real
executable stand-ins for the commands a backend runs, and a notifier that keeps what it gets."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import stat
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from gridgate.core import hookimpl
from gridgate.core.clock import Clock, FakeClock
from gridgate.core.config import (
    Config,
    ConfigError,
    ConfigProblem,
    apply_defaults,
    schema_problems,
    validate_document,
)
from gridgate.core.engine.director import Director
from gridgate.core.engine.loader import new_plugin_manager
from gridgate.core.model import Notification
from gridgate.core.plugins import PluginContext

# --- plugin managers and configs -------------------------------------------------------------


@contextlib.contextmanager
def plugin_manager_with(
    *plugins: object, pm: pluggy.PluginManager | None = None
) -> Iterator[pluggy.PluginManager]:
    """A plugin manager with gridgate's hook specs and ``plugins`` registered.

    The plugins are unregistered when the block ends, also when it raises, so a plugin
    registered for one test never answers in the next. ``check_pending()`` runs first: a
    misspelt hook name (``gridgate_submitt``) fails here instead of being silently ignored.

    :param plugins: plugin instances; the last one answers first, as in pluggy.
    :param pm: an existing manager to borrow (default: a fresh one).
    """
    manager = pm if pm is not None else new_plugin_manager()
    names: list[str] = []
    try:
        for plugin in plugins:
            names.append(manager.register(plugin) or "")
        manager.check_pending()
        yield manager
    finally:
        for plugin, name in zip(plugins, names, strict=False):
            if name and manager.is_registered(plugin):
                manager.unregister(plugin)


def make_config(doc: Mapping[str, Any]) -> Config:
    """Validate a config document ``doc`` given as a dict, exactly as a YAML file would be.

    Plugin sections are checked against the installed plugins' schemas and their
    ``config_errors``; defaults are filled.

    :raises ConfigError: with every problem (``str(exc)`` lists them one per line).
    """
    return validate_document(copy.deepcopy(dict(doc)), filename="<test config>")


def section_for(plugin_class: type, section: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate one plugin's own section against its ``config_schema`` and ``config_errors``
    and return it with defaults filled: what the plugin's constructor receives.

    Works for a plugin that is not installed (no entry point needed).

    :param plugin_class: the class whose ``config_schema`` and ``config_errors`` apply.
    :param section: the section as a site would write it (None: empty).
    :raises ConfigError: naming each problem's path inside the section.
    """
    schema = getattr(plugin_class, "config_schema", {"type": "object"})
    doc = copy.deepcopy(dict(section or {}))
    name = getattr(plugin_class, "__name__", "plugin")
    problems = [
        ConfigProblem(f"<{name} section>", 0, path, message)
        for path, message in schema_problems(schema, doc)
    ]
    if not problems:
        filled = copy.deepcopy(doc)
        apply_defaults(filled, schema)
        checker = getattr(plugin_class, "config_errors", None)
        for path, message in checker(filled) if checker else []:
            problems.append(ConfigProblem(f"<{name} section>", 0, tuple(path), message))
        doc = filled
    if problems:
        raise ConfigError(problems)
    return doc


def build_plugin(
    plugin_class: type,
    section: Mapping[str, Any] | None = None,
    *,
    clock: Clock | None = None,
    state: Any = None,
    state_dir: str | os.PathLike[str] | None = None,
    name: str = "",
    config: Mapping[str, Any] | None = None,
) -> Any:
    """Validate ``section`` (:func:`section_for`) and instantiate ``plugin_class`` with it.

    :param plugin_class: your plugin's class.
    :param section: its config section as a site would write it (defaults are filled).
    :param clock: the context's clock (default: a fresh :class:`FakeClock`).
    :param state: a :class:`~gridgate.core.state.StateStore` for plugins that keep state.
    :param state_dir: where the plugin may write files (give your ``tmp_path``).
    :param name: the entry-point name, set on the instance when its class leaves it empty.
    :param config: the whole config the plugin sees as ``context.config`` (for instance
        ``{"director": {"max_output_bytes": 1024}}``).
    """
    context = PluginContext(
        clock=clock or FakeClock(),
        state=state,
        state_dir=Path(state_dir) if state_dir is not None else Path("gridgate-state"),
        config=dict(config or {}),
    )
    plugin = plugin_class(section_for(plugin_class, section), context)
    if name and hasattr(plugin, "name") and not getattr(plugin, "name", ""):
        plugin.name = name
    return plugin


def director_for(
    config_doc: Mapping[str, Any], *plugins: object, clock: Clock | None = None
) -> Director:
    """A :class:`~gridgate.core.engine.director.Director` for ``config_doc`` on in-memory state.

    ``plugins`` are registered after the configured ones, so they answer first: pass your
    backend instance here and name only its demand in the config, and the director drives it
    without an entry point. ``state.driver`` defaults to ``memory``; the clock defaults to a
    fresh :class:`FakeClock` (reachable as ``director.clock``). Call ``director.close()``
    when done (or use ``contextlib.closing``).

    :param config_doc: the config as a dict, as the YAML would be.
    :param plugins: plugin instances registered to answer first.
    :param clock: the director's clock.
    """
    doc = copy.deepcopy(dict(config_doc))
    doc.setdefault("state", {"driver": "memory"})
    # the director opens (and so closes) the state store the config names, on this clock
    return Director(make_config(doc), clock=clock or FakeClock(), extra_plugins=list(plugins))


# --- stand-in commands -----------------------------------------------------------------------

_STAND_IN = """#!{python}
# gridgate stand-in {name!r}: written by gridgate.core.testing.stand_in_command
import fcntl, json, os, sys, time

SPEC = json.loads({spec!r})
with open(SPEC["calls"], "a+", encoding="utf-8") as log:
    fcntl.flock(log, fcntl.LOCK_EX)
    log.seek(0)
    call = sum(1 for _ in log) + 1
    log.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid()}}) + "\\n")
def fill(text):
    return text.replace("{{call}}", str(call))
sys.stdout.write(fill(SPEC["stdout"]))
sys.stdout.flush()
if SPEC["sleep"] > 0:
    time.sleep(SPEC["sleep"])  # the stand-in of a command that hangs: it is killed, not waited for
sys.stderr.write(fill(SPEC["stderr"]))
sys.stderr.flush()
sys.exit(SPEC["exit_code"])
"""


@dataclass(frozen=True)
class StandIn:
    """An executable stand-in written by :func:`stand_in_command`.

    It is path-like: put ``str(stand_in)`` (or ``stand_in.path``) in an argv or a config.
    :meth:`calls` returns what it was run with, one entry per invocation, oldest first.
    """

    path: Path
    calls_file: Path

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def calls(self) -> list[dict[str, Any]]:
        """Each invocation's ``argv`` (without the program), ``cwd`` and ``pid``."""
        try:
            text = self.calls_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def stand_in_command(
    tmp_dir: str | os.PathLike[str],
    name: str,
    *,
    stdout: str = "",
    stderr: str = "",
    exit_code: int = 0,
    sleep: float = 0.0,
) -> StandIn:
    """Write a real executable program ``name`` (a plain file name) in the folder
    ``tmp_dir`` (created if needed) that behaves as told.

    It prints ``stdout`` (flushed), then sleeps ``sleep`` seconds (a hanging command, for
    deadline tests: the runner kills it), then prints ``stderr`` and exits with
    ``exit_code``. ``{call}`` in either text becomes the invocation number (1, 2, ...), so
    job ids differ between calls. Every invocation is recorded (see :meth:`StandIn.calls`).
    The script runs with this interpreter (``sys.executable``); no shell is involved.
    """
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"stand-in name must be a plain file name, got {name!r}")
    if not 0 <= exit_code <= 255:
        raise ValueError(f"exit_code must be 0..255, got {exit_code}")
    folder = Path(tmp_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    calls = folder / f".{name}.calls"
    spec = json.dumps(
        {
            "stdout": stdout,
            "stderr": stderr,
            "exit_code": exit_code,
            "sleep": float(sleep),
            "calls": str(calls.resolve()),
        }
    )
    path.write_text(_STAND_IN.format(python=sys.executable, name=name, spec=spec), encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return StandIn(path=path, calls_file=calls)


# --- a notifier that keeps what it is given ----------------------------------------------------


class Collector:
    """A notifier plugin that keeps every notification, for asserting on what people would
    have been told. Register it like any plugin (``director_for(doc, backend, collector)``)."""

    def __init__(self) -> None:
        self.notes: list[Notification] = []
        self._lock = threading.Lock()

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        with self._lock:
            self.notes.append(notification)

    def levels(self) -> list[str]:
        """The levels received, in order (``["error", "alarm"]``)."""
        with self._lock:
            return [n.level for n in self.notes]

    def subjects(self) -> list[str]:
        with self._lock:
            return [n.subject for n in self.notes]

    def clear(self) -> None:
        with self._lock:
            self.notes.clear()
