"""Writes the configuration reference (docs/configuration.md) from the composed schema, so the
documentation of every key is the schema that validates it.

``gridgate docs`` writes it (:mod:`.docs`); ``gridgate config docs [--all]`` prints it for what
is installed here.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gridgate.core.config import PATH_KEYWORD, STATE_SCHEMA, compose_schema, format_path
from gridgate.core.engine.loader import InstalledPlugin, installed_plugins
from gridgate.core.plugins import CONFIG_GROUPS, SCHEDULERS_GROUP, SECTIONS_GROUP
from gridgate.core.state import STATE_GROUP

#: The distribution whose plugins the committed reference documents.
OWN_DISTRIBUTION = "gridgate"
REGENERATE = "gridgate docs"


@dataclass(frozen=True)
class Row:
    """One documented key."""

    key: str
    type: str
    default: str
    allowed: str
    description: str


# --- reading a schema -----------------------------------------------------------------------


def _type_of(node: Mapping[str, Any]) -> str:
    return " \\| ".join(_types(node))


def _types(node: Mapping[str, Any]) -> list[str]:
    """The alternatives a value may take, without repeats, in schema order."""
    if "const" in node:
        return [_json_type(node["const"])]
    if "enum" in node:
        return list(dict.fromkeys(_json_type(v) for v in node["enum"]))
    branches = node.get("oneOf") or node.get("anyOf")
    if branches and "type" not in node:
        return list(dict.fromkeys(t for b in branches for t in _types(b)))
    kinds = node.get("type")
    if kinds is None:
        return ["any"]
    out: list[str] = []
    for kind in [kinds] if isinstance(kinds, str) else list(kinds):
        items = node.get("items")
        extra = node.get("additionalProperties")
        if kind == "array":
            out.append(f"list of {_inner(items)}" if isinstance(items, Mapping) else "list")
        elif kind == "object" and not node.get("properties") and isinstance(extra, Mapping):
            out.append(f"mapping of {_inner(extra)}")
        elif kind == "object":
            out.append("mapping")
        else:
            out.append(kind)
    return list(dict.fromkeys(out))


def _inner(node: Mapping[str, Any]) -> str:
    kinds = _types(node)
    return kinds[0] if len(kinds) == 1 else "(" + " \\| ".join(kinds) + ")"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "list" if isinstance(value, list) else "mapping"


def _code(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return "`" + text.replace("|", "\\|") + "`"


def _raw(text: str) -> str:
    """A regular expression as written in the YAML, in a code span safe for a table."""
    return "`" + text.replace("|", "\\|") + "`"


#: What the Allowed column says of a key marked :data:`~gridgate.core.config.PATH_KEYWORD`.
PATH_NOTES = {
    True: "path, from the config file's folder",
    "command": "a name on PATH, or a path from the config file's folder",
    "argv": "a program path (with `/`) from the config file's folder",
}


def _path_note(node: Mapping[str, Any]) -> str:
    how = node.get(PATH_KEYWORD)
    items = node.get("items")
    if not how and isinstance(items, Mapping) and items.get(PATH_KEYWORD) is True:
        return "each a path, from the config file's folder"
    return PATH_NOTES.get(how, "") if how else ""


def _allowed(node: Mapping[str, Any]) -> str:
    parts: list[str] = []
    note = _path_note(node)
    if note:
        parts.append(note)
    if "const" in node:
        parts.append(_code(node["const"]))
    if "enum" in node:
        parts.append(", ".join(_code(v) for v in node["enum"]))
    items = node.get("items")
    if isinstance(items, Mapping) and "enum" in items:
        parts.append("each of " + ", ".join(_code(v) for v in items["enum"]))
    bounds = (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
    )
    for key, sign in bounds:
        if key in node and not isinstance(node[key], bool):
            parts.append(f"{sign} {node[key]}")
    if node.get("minLength") == 1:
        parts.append("non-empty")
    elif "minLength" in node:
        parts.append(f"at least {node['minLength']} characters")
    if "maxLength" in node:
        parts.append(f"at most {node['maxLength']} characters")
    if node.get("minItems") == 1:
        parts.append("at least one item")
    elif "minItems" in node:
        parts.append(f"at least {node['minItems']} items")
    if "maxItems" in node:
        parts.append(f"at most {node['maxItems']} items")
    if node.get("uniqueItems"):
        parts.append("no duplicates")
    if "minProperties" in node and node.get("maxProperties") == node["minProperties"] == 1:
        parts.append("exactly one key")
    if "pattern" in node:
        parts.append(f"matches {_raw(node['pattern'])}")
    if isinstance(items, Mapping) and "pattern" in items:
        parts.append(f"items match {_raw(items['pattern'])}")
    names = node.get("propertyNames")
    if isinstance(names, Mapping) and "pattern" in names:
        parts.append(f"keys match {_raw(names['pattern'])}")
    return "; ".join(parts)


def _text(value: str) -> str:
    """One table-safe line: no newlines, pipes escaped, angle brackets not taken for HTML."""
    text = " ".join(value.split()).replace("|", "\\|")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _structured(node: Mapping[str, Any]) -> bool:
    """Whether a node has keys of its own worth a row each."""
    if node.get("properties"):
        return True
    items = node.get("items")
    if isinstance(items, Mapping) and _structured(items):
        return True
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping) and _structured(extra):
        return True
    return any(_structured(b) for b in node.get("oneOf", node.get("anyOf", [])))


def _row(key: str, node: Mapping[str, Any], required: bool) -> Row:
    if required:
        default = "*required*"
    elif "default" in node:
        default = _code(node["default"])
    else:
        default = ""
    return Row(
        key=key,
        type=_type_of(node),
        default=default,
        allowed=_allowed(node),
        description=_text(str(node.get("description", ""))),
    )


def rows(node: Mapping[str, Any], prefix: str = "") -> Iterator[Row]:
    """Every key under ``node``, depth first in schema order: ``a``, ``a.b``, ``a[].c``."""
    required = set(node.get("required", ()))
    for name, sub in (node.get("properties") or {}).items():
        if not isinstance(sub, Mapping):
            continue
        key = f"{prefix}{name}"
        yield _row(key, sub, name in required)
        yield from _children(sub, key)
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping) and not node.get("properties"):
        key = f"{prefix}<name>"
        yield _row(key, extra, False)
        yield from _children(extra, key)


def _children(node: Mapping[str, Any], key: str) -> Iterator[Row]:
    if node.get("properties"):
        yield from rows(node, key + ".")
    elif isinstance(node.get("additionalProperties"), Mapping) and _structured(
        node["additionalProperties"]
    ):
        yield from rows(node, key + ".")
    items = node.get("items")
    if isinstance(items, Mapping) and _structured(items):
        yield from rows(items, key + "[].")
        for branch in items.get("oneOf", items.get("anyOf", [])):
            yield from rows(branch, key + "[].")
    for branch in node.get("oneOf", node.get("anyOf", [])):
        if isinstance(branch, Mapping):
            yield from _children(branch, key)


def table(
    node: Mapping[str, Any], empty: str = "No keys: write `{}` (or nothing after the name)."
) -> list[str]:
    """A Markdown table of every key under ``node`` (``empty`` when it has none)."""
    found = list(rows(node))
    if not found:
        return [empty]
    lines = ["| Key | Type | Default | Allowed | Description |", "|---|---|---|---|---|"]
    for row in found:
        lines.append(
            f"| `{row.key}` | {row.type} | {row.default} | {row.allowed} | {row.description} |"
        )
    return lines


# --- the document -----------------------------------------------------------------------------


def _chosen(all_distributions: bool) -> list[InstalledPlugin]:
    return [
        p for p in installed_plugins() if all_distributions or p.distribution == OWN_DISTRIBUTION
    ]


def render(all_distributions: bool = False) -> str:
    """The Markdown reference of every config key of every installed plugin.

    :param all_distributions: also document plugins of other installed distributions (a site
        generating the reference of its own installation); the committed file documents
        gridgate's own plugins only, so it does not depend on what else is installed.
    """
    plugins = _chosen(all_distributions)
    by_group: dict[str, list[InstalledPlugin]] = {}
    for plugin in plugins:
        by_group.setdefault(plugin.group, []).append(plugin)
    doc: dict[str, Any] = {
        key: {p.name: {} for p in by_group.get(group, [])} for key, group in CONFIG_GROUPS.items()
    }
    sections = [p for p in by_group.get(SECTIONS_GROUP, []) if p.name not in doc]
    for section in sections:
        doc[section.name] = {}
    schema, _classes, problems = compose_schema(doc)
    props = schema["properties"]
    drivers = by_group.get(STATE_GROUP, [])
    state_schemas: dict[str, Mapping[str, Any]] = {}
    for driver in drivers:
        driver_schema, _, driver_problems = compose_schema({"state": {"driver": driver.name}})
        problems += driver_problems
        if not driver_problems:
            state_schemas[driver.name] = driver_schema["properties"]["state"]

    out: list[str] = [
        "# Configuration reference",
        "",
        f"<!-- Generated from the composed schema by `{REGENERATE}`. Do not edit by hand:",
        "     tests/core/devkit/test_docs_config.py fails when this file is stale. -->",
        "",
        "A gridgate site config is one YAML file. Core owns `director` and `state`; every",
        "other top-level key is a plugin group whose keys are entry-point names (the plugin",
        "is loaded only when its name appears), or a top-level section contributed by a plugin.",
        "A plugin named with nothing after it (`log:`) gets all its defaults. Unknown keys are",
        "errors. `gridgate config validate FILE` checks a file; `gridgate config schema -c FILE`",
        "prints the JSON Schema this page is generated from.",
        "",
        "Columns: *Type* (`list of X`, `mapping of X`: a mapping whose keys you choose),",
        "*Default* (filled in when the key is absent; *required* keys have none), *Allowed*",
        "(constraints beyond the type). `a.b` is key `b` inside mapping `a`; `a[].b` is key `b`",
        "of each item of list `a`; `<name>` is a key you choose.",
        "",
        'Paths: a key whose *Allowed* says "path, from the config file\'s folder" takes a',
        "relative value from the folder of the config file, not from the working directory",
        "(`script: pilot.sh` in `/etc/gridgate/site.yaml` is `/etc/gridgate/pilot.sh`, whoever",
        "starts the director from wherever); absolute values and `~/...` are kept, and its",
        "default is taken from there too. `director.state_dir`, when not written, is the folder",
        "of `state.path` when that is written. A command (`commands.*`) is a path only when it",
        "holds a `/`; a bare name is looked up on PATH. A config that is not a file (read from",
        "a pipe) keeps relative paths relative to the working directory. Every path-valued key",
        "says so in *Allowed*; the values of an `env` mapping are not paths to gridgate (a value",
        "need not be one) and are passed to the commands as written.",
        "",
        "## Contents",
        "",
        "- [`director`](#director)",
        "- [`state`](#state): " + ", ".join(f"`{d.name}`" for d in drivers),
    ]
    for key in CONFIG_GROUPS:
        names = ", ".join(f"`{p.name}`" for p in by_group.get(CONFIG_GROUPS[key], []))
        out.append(f"- [`{key}`](#{key}): {names or 'none installed'}")
    for section in sections:
        out.append(f"- [`{section.name}`](#{section.name})")
    out += ["", "## director", "", _text(props["director"].get("description", "")), ""]
    out += table(props["director"])
    out += [
        "",
        "## state",
        "",
        _text(props["state"].get("description", "")),
        "",
        "| Key | Type | Default | Allowed | Description |",
        "|---|---|---|---|---|",
        "| `driver` | string | "
        + _code(STATE_SCHEMA["properties"]["driver"]["default"])
        + " | "
        + ", ".join(_code(d.name) for d in drivers)
        + " | The state driver; the other keys of this section are the driver's own. |",
    ]
    for driver in drivers:
        out += ["", f"### state driver `{driver.name}`", "", f"`{driver.target}`", ""]
        if driver.name in state_schemas:
            own = dict(state_schemas[driver.name])
            own["properties"] = {
                k: v for k, v in own.get("properties", {}).items() if k != "driver"
            }
            out += table(own, empty="No keys besides `driver`.")
        else:
            out.append("Could not be loaded when this page was generated (see the end).")
    for key, group in CONFIG_GROUPS.items():
        out += [
            "",
            f"## {key}",
            "",
            f"Entry-point group `{group}`: each key is a plugin's "
            "entry-point name; for decisions, the plugin listed first answers first.",
            "",
        ]
        for plugin in by_group.get(group, []):
            out += _plugin_section(
                f"{key}.{plugin.name}", plugin, props[key]["properties"].get(plugin.name) or {}
            )
    for section in sections:
        out += [
            "",
            f"## {section.name}",
            "",
            f"Top-level section from entry-point group `{SECTIONS_GROUP}`: `{section.target}`.",
            "",
        ]
        node = props.get(section.name) or {}
        if node.get("description"):
            out += [_text(node["description"]), ""]
        out += table(node) if node else ["Could not be loaded when this page was generated."]
    schedulers = by_group.get(SCHEDULERS_GROUP, [])
    if schedulers:
        out += [
            "",
            "## Scheduler plugins (`proxyd.bypass.scheduler`)",
            "",
            f"Entry-point group `{SCHEDULERS_GROUP}`: the scheduler controller the token "
            "daemon audits, named by `proxyd.bypass.scheduler`; its keys go in "
            "`proxyd.bypass.scheduler_options`.",
        ]
        for plugin in schedulers:
            try:
                schema_of: Mapping[str, Any] = _load(plugin.target).config_schema
            except Exception as exc:  # documented as not loaded, as the other plugins are
                problems.append((("proxyd", "bypass", "scheduler", plugin.name), repr(exc)))
                schema_of = {}
            out += _plugin_section(f"scheduler `{plugin.name}`", plugin, schema_of)
    if problems:
        out += [
            "",
            "## Not documented",
            "",
            "These plugins are installed but could not be loaded when this page was generated:",
            "",
        ]
        for path, message in sorted(problems, key=lambda p: format_path(p[0])):
            out.append(f"- `{format_path(path)}`: {_text(message)}")
    text = "\n".join(out)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip() + "\n"


def _load(target: str) -> Any:
    """The object an entry point's ``module:attribute`` target names."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _plugin_section(title: str, plugin: InstalledPlugin, node: Mapping[str, Any]) -> list[str]:
    out = ["", f"### {title}", ""]
    marks = [f"`{plugin.target}`"]
    if plugin.default:
        marks.append("built-in default: always active, answers last")
    if plugin.distribution != OWN_DISTRIBUTION:
        marks.append(f"from {plugin.distribution}")
    out += [" — ".join(marks), ""]
    if not node:
        return out + ["Could not be loaded when this page was generated (see the end)."]
    if node.get("description"):
        out += [_text(node["description"]), ""]
    return out + table(node)
