"""The scheduler plugins the token daemon reads (``gridgate.schedulers`` entry points, the
``gridgate_scheduler_rpcs`` and ``gridgate_scheduler_deny`` hooks): finding one by name, checking
``proxyd.bypass.scheduler_options`` against its schema, and a plugin manager holding it.

At the plugin's top level, beside config.py, so that the ``proxyd:`` section's checks
(section.py) can name a wrong scheduler or option with its line, without the daemon."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import jsonschema
import pluggy

from gridgate.core import hookspecs
from gridgate.core.config import apply_defaults, resolve_paths
from gridgate.core.plugins import SCHEDULERS_GROUP, PluginContext, PluginLoadError, load_class
from gridgate.core.state import StateStore

__all__ = ["ask", "config_problems", "load_scheduler", "option_problems", "scheduler_class"]

#: The hooks' project name (gridgate's own hookspecs and ``@hookimpl``).
PROJECT = "gridgate"

T = TypeVar("T")


def load_scheduler(
    name: str,
    options: Mapping[str, Any],
    state_dir: Path,
    config_folder: Path | None = None,
    state: StateStore | None = None,
) -> pluggy.PluginManager:
    """A plugin manager holding the ``gridgate.schedulers`` plugin ``name``, built with its
    filled options, their paths taken from ``config_folder`` (the config file's folder; the
    working directory when None) as the loader does for every section.

    ``state`` is the store the daemons of a service share (``heartbeat_via: state``): the
    plugin keeps its journal there, so that every daemon sees (and undoes) what another
    changed; None: the plugin keeps its own in ``state_dir``.

    :raises ValueError: no such plugin, or its options are wrong (the message says which).
    """
    cls = scheduler_class(name)
    problems = option_problems(cls, options)
    if problems:
        where, message = problems[0]
        path = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in where)
        raise ValueError(f"proxyd.bypass.scheduler_options{path}: {message}")
    filled = _plain(options)
    apply_defaults(filled, cls.config_schema)
    resolve_paths(filled, cls.config_schema, config_folder or Path.cwd())
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(hookspecs)
    manager.register(
        cls(filled, PluginContext(state=state, state_dir=state_dir)), name=f"scheduler.{name}"
    )
    return manager


def _plain(value: Any) -> Any:
    """A copy of ``value`` (the options, read-only mappings inside) that the defaults and
    paths may be filled into: dicts and lists all the way down."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def scheduler_class(name: str) -> Any:
    """The class of the ``gridgate.schedulers`` plugin ``name``.

    :raises ValueError: none is installed under that name, or its import failed (the message
        lists those that are installed).
    """
    try:
        return load_class(SCHEDULERS_GROUP, name)
    except PluginLoadError as exc:
        raise ValueError(str(exc)) from None


def config_problems(bypass: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """The ``proxyd.bypass`` section's problems beyond its schema: the scheduler plugin named
    exists and its ``scheduler_options`` fit that plugin's schema (paths from the section)."""
    name = bypass.get("scheduler")
    if not name:
        return []
    try:
        cls = scheduler_class(str(name))
    except ValueError as exc:
        return [(("bypass", "scheduler"), str(exc))]
    return [
        (("bypass", "scheduler_options", *where), message)
        for where, message in option_problems(cls, bypass.get("scheduler_options") or {})
    ]


def option_problems(
    cls: Any, options: Mapping[str, Any]
) -> list[tuple[tuple[str | int, ...], str]]:
    """What is wrong with ``options`` for scheduler plugin ``cls``: (key path, message)."""
    validator = jsonschema.Draft202012Validator(cls.config_schema)
    errors = sorted(validator.iter_errors(dict(options)), key=lambda e: list(e.path))
    return [(tuple(error.path), error.message) for error in errors]


def ask(manager: pluggy.PluginManager, hook: str, failed: Callable[[str], T], **kwargs: Any) -> T:
    """The answer of scheduler hook ``hook`` (blocking: call it in a thread), or ``failed(why)``
    when no plugin answered or one raised: a plugin's bug must not end the daemon's loops."""
    try:
        answer = getattr(manager.hook, hook)(**kwargs)
    except Exception as exc:
        return failed(repr(exc))
    return failed("no plugin answered for it") if answer is None else cast(T, answer)
