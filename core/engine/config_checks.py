"""Checks of a config across its sections, beyond what one schema fragment can say.

- **References** (errors, in every load): a static demand or a queue demand group naming a
  backend that is not configured, a queue demand with pilot tracking off (it subtracts the
  pilots already waiting, which only the registry knows), and a configured backend with no
  servers (a backend class names the key that lists its endpoints in ``endpoints_key``).
- **Resources** (errors, in every load): a demand group whose ``resources`` ask a value or a
  tag its backend does not map (the backend class's ``expresses``, ``expresses_tags``).
- **Something to submit** (errors for a director): a director config whose demand, backends
  and servers leave nothing to submit is refused unless ``director.paused`` says so on purpose.
  ``gridgate config validate`` applies it to files with a ``director``, ``backends`` or
  ``demand`` section (a token daemon's file has none of them); a running director applies it
  to every reload, counting the backends that answer for themselves too.
- **Warnings**: what is legal but probably not meant (a plugin class's ``config_warnings``).
- **What changed** between two configs, in one line, and which of the changes need a restart.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from loguru import logger

from gridgate.core.config import (
    Config,
    ConfigError,
    ConfigProblem,
    PathT,
    format_path,
    load_config,
    read_config_text,
)
from gridgate.core.engine.reload import cut_problem
from gridgate.core.fitting import capacity_errors
from gridgate.core.model import Endpoint, Notification
from gridgate.core.plugins import CONFIG_GROUPS, listed_endpoints
from gridgate.core.weights import weight_errors

#: Settings read once, when the director starts: a reload that changes them says so.
RESTART_ONLY: tuple[PathT, ...] = (
    ("state",),
    ("director", "metrics_port"),
    ("director", "state_retry_seconds"),
)
DIRECTOR_SECTIONS = ("director", "backends", "demand")


def _pilots(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, list):
        return sum(int(g.get("pilots") or 0) for g in value if isinstance(g, Mapping))
    return 0


def reference_problems(
    doc: Mapping[str, Any], classes: Mapping[tuple[str, str], type]
) -> list[tuple[PathT, str]]:
    """Cross-section errors of a schema-valid document (before defaults), as (path, message)."""
    problems: list[tuple[PathT, str]] = []
    backends = doc.get("backends")
    configured = set(backends) if isinstance(backends, Mapping) else set()
    static = (doc.get("demand") or {}).get("static")
    if isinstance(static, Mapping) and backends is not None:
        for name in static:
            # Without a backends section the names are left to the running director (a
            # backend may be registered in-process, as tests and embedding programs do).
            if name not in configured:
                known = ", ".join(sorted(configured)) or "none"
                problems.append(
                    (
                        ("demand", "static", name),
                        f"names backend {name!r}, which is not configured under backends "
                        f"(configured: {known})",
                    )
                )
    for (key, name), cls in classes.items():
        endpoints_key = getattr(cls, "endpoints_key", None)
        if key != "backends" or not endpoints_key:
            continue
        section = backends.get(name) if isinstance(backends, Mapping) else None
        if not (section or {}).get(endpoints_key):
            problems.append(
                (
                    ("backends", name, endpoints_key),
                    f"backend {name!r} has no {endpoints_key}: it could submit nowhere",
                )
            )
    queue = (doc.get("demand") or {}).get("queue")
    if isinstance(queue, Mapping):
        problems += _queue_problems(doc, queue, configured if backends is not None else None)
    return problems + resource_problems(doc, classes)


def _queue_problems(
    doc: Mapping[str, Any], queue: Mapping[str, Any], configured: set[str] | None
) -> list[tuple[PathT, str]]:
    """The queue demand needs pilot tracking, and its groups configured backends."""
    problems: list[tuple[PathT, str]] = []
    director = doc.get("director") or {}
    pilots = director.get("pilots") if isinstance(director, Mapping) else None
    if isinstance(pilots, Mapping) and pilots.get("track") is False:
        problems.append(
            (
                ("demand", "queue"),
                "the queue demand needs pilot tracking: it subtracts each group's pilots "
                "already waiting, which only the pilot registry knows; set "
                "director.pilots.track: true (or use the static or file demand)",
            )
        )
    groups = queue.get("groups")
    if configured is not None and isinstance(groups, Mapping):
        # without a backends section the names are left to the running director, as static's
        for group, spec in groups.items():
            backend = spec.get("backend") if isinstance(spec, Mapping) else None
            if isinstance(backend, str) and backend not in configured:
                known = ", ".join(sorted(configured)) or "none"
                problems.append(
                    (
                        ("demand", "queue", "groups", group, "backend"),
                        f"names backend {backend!r}, which is not configured under backends "
                        f"(configured: {known})",
                    )
                )
    return problems


def availability_problems(
    doc: Mapping[str, Any], classes: Mapping[tuple[str, str], type]
) -> list[tuple[PathT, str]]:
    """A backend's ``weights`` naming an endpoint it does not have (or one twice, by name and
    by key, with two weights). (Pilot efficiency checks its thresholds against the director's
    itself: ``EfficiencySource.document_errors``.)"""
    problems: list[tuple[PathT, str]] = []
    backends = doc.get("backends")
    for (key, name), cls in classes.items():
        endpoints_key = getattr(cls, "endpoints_key", None)
        section = backends.get(name) if isinstance(backends, Mapping) else None
        if key != "backends" or not endpoints_key or not isinstance(section, Mapping):
            continue
        weights = section.get("weights")
        chosen = section.get("endpoint_credentials")
        declared = section.get("endpoint_resources")
        names = section.get(endpoints_key)
        if not (weights or chosen or declared) or not isinstance(names, list):
            continue
        names_of = getattr(cls, "endpoint_names", None)  # a class that is no Plugin: the list
        listed = names_of(section) if callable(names_of) else listed_endpoints(cls, section)
        endpoints = [Endpoint(str(name), e) for e in listed]
        if isinstance(weights, Mapping):
            for message in weight_errors(weights, endpoints):
                problems.append((("backends", name, "weights"), f"backend {name!r}: {message}"))
        if isinstance(declared, Mapping):
            for endpoint, message in capacity_errors(section, endpoints):
                problems.append(
                    (
                        ("backends", name, "endpoint_resources", endpoint),
                        f"backend {name!r}: {message}",
                    )
                )
        if isinstance(chosen, Mapping):
            known = [e.name for e in endpoints]
            for endpoint in chosen:
                if endpoint not in known:
                    problems.append(
                        (
                            ("backends", name, "endpoint_credentials", endpoint),
                            f"backend {name!r}: no endpoint is named {endpoint!r} "
                            f"(it has {', '.join(known) or 'none'})",
                        )
                    )
    return problems


def _resource_groups(demand: Any) -> Iterator[tuple[PathT, str, str, Mapping[str, Any]]]:
    """(path of ``resources``, group, backend, resources) of every demand group asking some:
    ``queue``'s ``groups: {name: {backend, resources}}`` and the ``static`` list form."""
    if not isinstance(demand, Mapping):
        return
    queue = demand.get("queue")
    groups = queue.get("groups") if isinstance(queue, Mapping) else None
    for name, group in (groups or {}).items() if isinstance(groups, Mapping) else ():
        if isinstance(group, Mapping) and isinstance(group.get("resources"), Mapping):
            path = ("demand", "queue", "groups", name, "resources")
            yield path, str(name), str(group.get("backend") or ""), group["resources"]
    static = demand.get("static")
    for backend, value in static.items() if isinstance(static, Mapping) else ():
        for index, group in enumerate(value if isinstance(value, list) else []):
            if isinstance(group, Mapping) and isinstance(group.get("resources"), Mapping):
                path = ("demand", "static", backend, index, "resources")
                yield path, str(group.get("group") or ""), str(backend), group["resources"]


def resource_problems(
    doc: Mapping[str, Any], classes: Mapping[tuple[str, str], type]
) -> list[tuple[PathT, str]]:
    """One error per demand group whose ``resources`` ask what its backend cannot express.

    A backend class declares what it maps in ``expresses`` (of ``cores``, ``memory_mb``,
    ``walltime``) and ``expresses_tags`` (tag names); a class without them maps nothing but
    the defaults. The error names the group, the values and the backend, at the values' line.
    A backend not built from the config (registered in-process) is not checked here: its
    :class:`~gridgate.core.backend.Backend` base class refuses such a request at submission.
    """
    from gridgate.core.backend import resource_gaps
    from gridgate.core.model import Resources

    problems: list[tuple[PathT, str]] = []
    for path, group, backend, asked in _resource_groups(doc.get("demand")):
        cls = classes.get(("backends", backend))
        if cls is None:
            continue
        try:
            resources = Resources(
                cores=int(asked.get("cores") or 1),
                memory_mb=asked.get("memory_mb"),
                walltime=asked.get("walltime"),
                tags={str(k): str(v) for k, v in (asked.get("tags") or {}).items()},
            )
        except (TypeError, ValueError, AttributeError):
            continue  # the demand plugin's schema names a malformed value
        expresses = tuple(getattr(cls, "expresses", ()))
        gaps = resource_gaps(resources, expresses, tuple(getattr(cls, "expresses_tags", ())))
        if gaps:
            first = gaps[0].split("=", 1)[0].split(".")
            tags = tuple(getattr(cls, "expresses_tags", ()))
            maps = ", ".join(expresses) or "nothing but one core"
            maps += f"; tags {', '.join(tags)}" if tags else "; no tag"
            problems.append(
                (
                    (*path, *first),
                    f"group {group!r} asks {', '.join(gaps)}, which backend {backend!r} "
                    f"cannot express (it maps {maps})",
                )
            )
    return problems


def is_director_config(config: Config) -> bool:
    """Whether the file itself has a director, backends or demand section."""
    return any((name,) in config.lines for name in DIRECTOR_SECTIONS)


def submission_problems(
    config: Config, answers: Callable[[str], bool] = lambda name: False
) -> list[ConfigProblem]:
    """Why ``config`` would submit nothing (empty when it would, or when it is paused).

    ``answers(name)`` says whether a backend of that name exists outside the config's
    ``backends`` section (registered in-process).
    """
    if config.director.get("paused"):
        return []
    filename = str(config.path or "<config>")
    hint = "; set director.paused: true to run without submitting on purpose"

    def problem(path: PathT, message: str) -> list[ConfigProblem]:
        return [ConfigProblem(filename, config.line_of(path), path, message + hint)]

    demand = config.get("demand") or {}
    if not demand:
        return problem(("demand",), "no demand plugin is configured: nothing would be submitted")
    if set(demand) != {"static"}:
        return []  # a demand file or another plugin decides at every iteration
    static = demand["static"] or {}
    wanted = [name for name, value in static.items() if _pilots(value) > 0]
    if not wanted:
        return problem(("demand", "static"), "the static demand asks for no pilot")
    backends = config.get("backends") or {}
    if not any(name in backends or answers(name) for name in wanted):
        return problem(
            ("demand", "static", wanted[0]),
            f"no backend the demand names ({', '.join(wanted)}) is configured",
        )
    return []


def checked_config(path: str | os.PathLike[str], text: str | None = None) -> Config:
    """What ``gridgate config validate`` and the start of ``gridgate run`` check:
    :func:`load_config`, that the file ends with its final newline (a file cut short, or still
    being written, can stop inside a value and still validate: ``max_waiting: 100`` cut to
    ``1``; a running director refuses it on reload, so it is refused at the start too), and for
    a director config, that it leaves something to submit.

    :raises ConfigError: every problem, with file and line.
    """
    if text is None:
        text = read_config_text(path, streams=True)  # -c <(...) at the start: the operator's
    cut = cut_problem(text, os.fspath(path))
    if cut is not None:
        raise ConfigError([cut])
    config = load_config(path, text=text)
    if is_director_config(config):
        problems = submission_problems(config)
        if problems:
            raise ConfigError(problems)
    return config


def config_warnings(config: Config) -> list[ConfigProblem]:
    """Legal but probably unintended settings, from each plugin class's ``config_warnings``."""
    warnings: list[ConfigProblem] = []
    filename = str(config.path or "<config>")
    for (key, name), cls in config.plugin_classes.items():
        checker = getattr(cls, "config_warnings", None)
        if checker is None or key not in CONFIG_GROUPS:
            continue
        for sub, message in checker((config.get(key) or {}).get(name) or {}):
            path = (key, name, *sub)
            warnings.append(
                ConfigProblem(filename, config.line_of(path), path, f"warning: {message}")
            )
    return warnings


# --- what changed -----------------------------------------------------------------------------


def _leaves(node: Any, path: PathT = ()) -> Iterator[tuple[PathT, Any]]:
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    else:
        yield path, node


def _shown(value: Any) -> str:
    # numbers, booleans and null are shown; text and lists may be long or private: not shown
    if value is None or isinstance(value, (bool, int, float)):
        return (
            "null"
            if value is None
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
    return ""


def changes(old: Config, new: Config) -> list[tuple[PathT, str]]:
    """Every leaf setting that differs, as (path, ``a -> b`` / ``added`` / ``removed`` / ``changed``)."""
    before, after = dict(_leaves(old.data)), dict(_leaves(new.data))
    found: list[tuple[PathT, str]] = []
    for path in sorted(set(before) | set(after), key=format_path):
        if path not in before:
            found.append((path, "added"))
        elif path not in after:
            found.append((path, "removed"))
        elif before[path] != after[path]:
            a, b = _shown(before[path]), _shown(after[path])
            found.append((path, f"{a} -> {b}" if a and b else "changed"))
    return found


def needs_restart(found: list[tuple[PathT, str]]) -> list[str]:
    """The changed settings that take effect only when the director starts again."""
    return sorted(
        {format_path(path) for path, _ in found if any(path[: len(p)] == p for p in RESTART_ONLY)}
    )


def change_summary(found: list[tuple[PathT, str]], limit: int = 6) -> str:
    """One line: ``director.cycle_seconds 60 -> 30, backends.wms_glite.servers changed``."""
    parts = [f"{format_path(path)} {what}" for path, what in found[:limit]]
    if len(found) > limit:
        parts.append(f"and {len(found) - limit} more")
    return ", ".join(parts) or "no setting changed (comments or layout only)"


def _is_limit(path: PathT) -> bool:
    # the settings that cap what is submitted or held: a cut or mistyped one starves a site
    key = str(path[-1]) if path else ""
    return key.startswith("max") or "limit" in key or "keep" in key


def lowered_limits(old: Config, new: Config) -> list[tuple[PathT, str]]:
    """The limits (``max*``, ``*limit*``, ``keep*``) whose number went down."""
    before, after = dict(_leaves(old.data)), dict(_leaves(new.data))
    found: list[tuple[PathT, str]] = []
    for path in sorted(set(before) & set(after), key=format_path):
        a, b = before[path], after[path]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        if numbers and _is_limit(path) and b < a:
            found.append((path, f"{_shown(a)} -> {_shown(b)}"))
    return found


def change_notification(old: Config, new: Config, now: float) -> Notification:
    """The notice of an accepted config change (also logged), so that an edit nobody expected
    is seen; it names the settings that need a restart to take effect. It is ``info``, or an
    ``error`` naming them when a limit went down: a file cut inside a value (``max: 100`` read
    as ``max: 1``) or a slip of the keyboard must reach a person, not only the log."""
    found = changes(old, new)
    summary = change_summary(found)
    restart = needs_restart(found)
    lowered = lowered_limits(old, new)
    where = new.path or "<config>"
    if restart:
        effect = (
            f"new settings take effect now, except {', '.join(restart)}, read only at start: "
            "restart the director for them"
        )
    else:
        effect = "new settings take effect now"
    logger.info("config {} changed: {}; {}", where, summary, effect)
    lines = [f"The config file {where} changed and was accepted; {effect}.", "", "Changed:"]
    shrunk = {path for path, _ in lowered}
    lines += [
        f"- {format_path(path)}: {what}{' (lowered)' if path in shrunk else ''}"
        for path, what in found
    ] or ["- (comments or layout only)"]
    subject = f"gridgate: config changed: {summary}"
    if lowered:
        named = change_summary(lowered)
        logger.warning("config {}: limits lowered: {}", where, named)
        subject = f"gridgate: config changed, limits lowered: {named}"
        lines += [
            "",
            "Limits were lowered. If nobody meant to, check that the file is whole and "
            "as intended: a value cut short still reads as a number.",
        ]
    return Notification(
        level="error" if lowered else "info",
        subject=subject,
        body="\n".join(lines) + "\n",
        created=now,
        key=f"config-change/{new.digest[:16]}/{now:.0f}",
    )
