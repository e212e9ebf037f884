"""Reads a site's YAML, validates it against one schema composed from core and its plugins.

Every problem is reported, each as ``FILE:LINE: json.path: message``. YAML syntax errors are
reported apart from schema errors. Defaults are filled only into a document that is already
valid, so filling them can never make an invalid document valid.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match

from gridgate.core._moved import moved_names
from gridgate.core.credential_names import (
    CREDENTIALS_PROPERTY_NAMES,
    add_credential_keys,
    credential_kind,
    credential_reference_problems,
    kind_schema,
)
from gridgate.core.files import InputFileError, read_regular
from gridgate.core.fitting import ENDPOINT_RESOURCES_SCHEMA
from gridgate.core.plugins import (
    CONFIG_GROUPS,
    SECTIONS_GROUP,
    ConfigPath,
    PluginLoadError,
    load_class,
)
from gridgate.core.secrets import secret_problems
from gridgate.core.settings import fill_defaults
from gridgate.core.state import STATE_GROUP
from gridgate.core.weights import WEIGHTS_SCHEMA

PathT = ConfigPath

__all__ = [
    "Config",
    "ConfigError",
    "ConfigProblem",
    "apply_defaults",
    "load_config",
    "resolve_paths",
]


STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Where caches, history and accounting live.",
    "properties": {"driver": {"type": "string", "default": "sqlite"}},
    "default": {"driver": "sqlite"},
}


def _plugin_group_schema(key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"Plugins of group {CONFIG_GROUPS[key]}, by entry-point name, in order.",
        "properties": {},
        "additionalProperties": False,
        "default": {},
    }


#: Sections every file has, whether it names them or not: their schemas come from the
#: ``gridgate.sections`` entry points of the same names (the director's loop owns ``director``:
#: :mod:`gridgate.core.engine.section`), so that this module knows no engine.
CORE_SECTIONS = ("director",)


def core_schema() -> dict[str, Any]:
    """The schema of what this module itself owns (``state``, the plugin groups), before the
    core sections and the plugins add theirs."""
    props: dict[str, Any] = {"state": STATE_SCHEMA}
    for key in CONFIG_GROUPS:
        props[key] = _plugin_group_schema(key)
    # a credential's key is the name backends and demand groups refer to it by, and the
    # name of its token file (credentials/<name>): no separator, no dot first
    props["credentials"]["propertyNames"] = CREDENTIALS_PROPERTY_NAMES
    props["credentials"]["description"] = (
        "Credentials by name (a `kind:` of group gridgate.credentials); an entry without "
        "`kind:` is named after its kind (`x509_proxy:`, `bearer_token:`)."
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gridgate site configuration",
        "type": "object",
        "properties": props,
        "additionalProperties": False,
    }


# --- defaults -------------------------------------------------------------------------------


def apply_defaults(instance: Any, schema: Mapping[str, Any]) -> None:
    """Fill the defaults of ``schema`` into ``instance`` in place (nested objects too). Call
    only on a valid document: a plugin calls it on its own section (``config``) when it is
    built outside a loaded config, as tests and command-line tools do."""
    fill_defaults(instance, schema)


# --- paths relative to the config file --------------------------------------------------------

#: The schema keyword of a path-valued key. ``true``: a file or folder on this machine;
#: ``"command"``: a program, a path only when it holds a ``/`` (a bare name is looked up on
#: PATH); ``"argv"``: an argv list whose first item is such a program. A relative value in a
#: config file is taken from the file's folder (:func:`resolve_paths`), whatever the working
#: directory of the process that reads it.
PATH_KEYWORD = "x-gridgate-path"


def config_folder(path: str | os.PathLike[str]) -> Path | None:
    """The folder the relative paths of the config file ``path`` are taken from: its folder as
    named (links not followed, so a linked file's neighbours are those its name shows), made
    absolute. None when ``path`` is not a regular file (a config read from stdin or a pipe,
    or text that has no file) or is named by the system (``/dev/stdin``, ``/proc/self/fd/0``
    even when they lead to a file): its relative paths stay relative to the working
    directory."""
    named = os.path.abspath(path)
    if named.startswith(("/dev/", "/proc/")) or not os.path.isfile(named):
        return None
    return Path(os.path.dirname(named))


def resolve_path(value: str, folder: Path, how: Any = True) -> str:
    """``value`` of a key marked ``how`` (:data:`PATH_KEYWORD`), relative to ``folder``.

    ``~`` and ``~user`` are expanded; an absolute value, and ``""`` (which means "the
    default" for the keys that have one), are kept as written; a command without ``/`` is a
    name for PATH and kept too."""
    if not value:
        return value
    expanded = os.path.expanduser(value)
    if how == "command" and "/" not in expanded:
        return value
    if os.path.isabs(expanded):
        return expanded
    return os.path.normpath(os.path.join(folder, expanded))


def resolve_paths(instance: Any, schema: Mapping[str, Any], folder: Path) -> Any:
    """Make the path-valued values of ``instance`` (those whose schema carries
    ``x-gridgate-path``) relative to ``folder``; ``instance`` is changed in place and
    returned. Idempotent, so defaults filled later can be resolved by a second call.

    The config loader does this for every section it knows; a plugin that takes another
    plugin's settings inside its own (``proxyd.bypass.scheduler_options``) calls it with that
    plugin's schema and the config file's folder.

    Call it on a document that validates: of a ``oneOf``/``anyOf`` only the branches the
    value matches are followed.

    :param instance: the settings (a mapping, list or value) as written, defaults filled or not.
    :param schema: their JSON Schema, whose path-valued keys carry ``x-gridgate-path``.
    :param folder: where relative paths are taken from (the config file's folder).
    """
    if not isinstance(schema, Mapping):
        return instance
    how = schema.get(PATH_KEYWORD)
    if how:
        if isinstance(instance, str):
            return resolve_path(instance, folder, how)
        if how == "argv" and isinstance(instance, list) and instance:
            if isinstance(instance[0], str):
                instance[0] = resolve_path(instance[0], folder, "command")
            return instance
    for branch in schema.get("allOf", ()):
        instance = resolve_paths(instance, branch, folder)
    for keyword in ("anyOf", "oneOf"):
        for branch in schema.get(keyword, ()):
            if isinstance(branch, Mapping) and StrictValidator(branch).is_valid(instance):
                instance = resolve_paths(instance, branch, folder)
                break
    if isinstance(instance, dict):
        props = schema.get("properties") or {}
        patterns = schema.get("patternProperties") or {}
        extra = schema.get("additionalProperties")
        for key, value in list(instance.items()):
            sub: Any = props.get(key)
            if sub is None:
                sub = next(
                    (s for p, s in patterns.items() if strict_pattern(p).search(str(key))), None
                )
            if sub is None and isinstance(extra, Mapping):
                sub = extra
            if isinstance(sub, Mapping):
                instance[key] = resolve_paths(value, sub, folder)
    elif isinstance(instance, list):
        prefix = schema.get("prefixItems") or []
        items = schema.get("items")
        for index, value in enumerate(instance):
            sub = prefix[index] if index < len(prefix) else items
            if isinstance(sub, Mapping):
                instance[index] = resolve_paths(value, sub, folder)
    return instance


def _state_dir_follows_state_path(doc: dict[str, Any], schema: Mapping[str, Any]) -> None:
    """``director.state_dir`` not written, a state file written (``state.path`` of sqlite):
    the state folder is that file's folder, so what plugins keep under ``state_dir`` (JDL
    files, outboxes, the pending pilots) lies beside the database, not in a second folder
    under the working directory that an operator never asked for."""
    director, state = doc.get("director"), doc.get("state")
    if isinstance(director, Mapping) and "state_dir" in director:
        return
    if not isinstance(state, Mapping) or not isinstance(state.get("path"), str):
        return
    marked = schema_at(schema, ("state", "path")).get(PATH_KEYWORD)
    if marked is True and state["path"]:
        doc.setdefault("director", {})
        if isinstance(doc["director"], dict):
            doc["director"]["state_dir"] = os.path.dirname(state["path"]) or "."


# --- YAML with line numbers ------------------------------------------------------------------


def _line_map(
    node: yaml.Node | None, path: PathT = (), out: dict[PathT, int] | None = None
) -> dict[PathT, int]:
    out = {} if out is None else out
    if node is None:
        return out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            child = (*path, key)
            out[child] = key_node.start_mark.line + 1
            _line_map(value_node, child, out)
            out[child] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _line_map(item, (*path, index), out)
    return out


def format_path(path: PathT) -> str:
    if not path:
        return "$"
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclass(frozen=True)
class ConfigProblem:
    file: str
    line: int
    path: PathT
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {format_path(self.path)}: {self.message}"


class ConfigError(Exception):
    """A config file could not be used. ``problems`` lists every reason; ``kind`` is ``yaml``
    (syntax), ``schema`` (content) or ``io`` (unreadable)."""

    def __init__(self, problems: list[ConfigProblem], kind: str = "schema") -> None:
        self.problems, self.kind = problems, kind
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class Config(Mapping[str, Any]):
    """A validated config with defaults filled, read as the mapping of its sections (``data``,
    which must not be modified); it remembers its file, its digest and the line of each key."""

    data: Mapping[str, Any]
    path: Path | None = None
    digest: str = ""
    plugin_classes: Mapping[tuple[str, str], type] = field(default_factory=dict)
    #: the line of each path written in the file (what problems found later point at)
    lines: Mapping[PathT, int] = field(default_factory=dict, compare=False)

    def line_of(self, path: PathT) -> int:
        """The line of ``path`` or of its nearest written parent (1 when none is)."""
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                return self.lines[path[:cut]]
        return 1

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def director(self) -> Mapping[str, Any]:
        return self.data["director"]


def _duplicate_keys(node: yaml.Node | None, path: PathT = ()) -> list[tuple[PathT, int]]:
    """PyYAML keeps the last of two equal keys silently; an operator wants to hear of it."""
    found: list[tuple[PathT, int]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                found.append(((*path, key), key_node.start_mark.line + 1))
            seen.add(key)
            found += _duplicate_keys(value_node, (*path, key))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found += _duplicate_keys(item, (*path, index))
    return found


def _parse_yaml(text: str, filename: str) -> tuple[Any, dict[PathT, int]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        message = f"YAML syntax error: {exc.problem or exc}"
        problems = []
        if exc.context and exc.context_mark is not None and exc.context_mark.line + 1 != line:
            # The parser gives up where it noticed (often the end of the file); the construct
            # it was reading (an unclosed '[', a quote) started here, which is what to fix.
            start = exc.context_mark.line + 1
            message += f" ({exc.context} that started at line {start})"
            problems.append(
                ConfigProblem(
                    filename,
                    start,
                    (),
                    f"YAML syntax error: {exc.context} "
                    f"started here and is not closed; the parser gave up "
                    f"at line {line}: {exc.problem or exc}",
                )
            )
        elif exc.context:
            message += f" ({exc.context})"
        problems.append(ConfigProblem(filename, line, (), message))
        raise ConfigError(problems, kind="yaml") from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            [ConfigProblem(filename, 0, (), f"YAML error: {exc}")], kind="yaml"
        ) from None
    duplicates = _duplicate_keys(node)
    if duplicates:
        raise ConfigError(
            [
                ConfigProblem(filename, line, p, "duplicate key (YAML would keep only the last)")
                for p, line in duplicates
            ],
            kind="yaml",
        )
    return data, _line_map(node)


def read_document(path: str | os.PathLike[str]) -> Any:
    """The document a config file holds, as written, not validated (for a tool that needs its
    shape before a load: the schema of the plugins it names).

    :raises ConfigError: the file cannot be read or is not YAML.
    """
    try:
        text = read_config_text(path)
    except (OSError, InputFileError, UnicodeError) as exc:
        raise ConfigError([ConfigProblem(str(path), 0, (), f"cannot read: {exc}")]) from None
    return _parse_yaml(text, str(path))[0]


def compose_schema(
    doc: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[tuple[str, str], type], list[tuple[PathT, str]]]:
    """Core's schema plus the section schema of every plugin ``doc`` names.

    :return: the schema, the plugin classes by (config key, name), and load problems as
        (path, message) for names that are not installed or do not import.
    """
    schema = core_schema()
    classes: dict[tuple[str, str], type] = {}
    problems: list[tuple[PathT, str]] = []
    doc = doc if isinstance(doc, Mapping) else {}

    def load(group: str, name: str, path: PathT) -> type | None:
        try:
            return load_class(group, name)
        except PluginLoadError as exc:
            problems.append((path, str(exc)))
            return None

    for key in CORE_SECTIONS:
        cls = load(SECTIONS_GROUP, key, (key,))
        schema["properties"][key] = _section_schema(cls) if cls else {}
        if cls is not None:
            classes[("sections", key)] = cls

    for key, group in CONFIG_GROUPS.items():
        section = doc.get(key)
        if not isinstance(section, Mapping):
            continue
        for name in section:
            entry = section[name]
            kind = credential_kind(str(name), entry) if key == "credentials" else str(name)
            where: PathT = (key, name, "kind") if kind != name else (key, name)
            cls = load(group, kind, where)
            # a plugin that did not load is reported once, not again as an unknown key
            section_schema = _section_schema(cls) if cls else {}
            if cls is not None and key == "backends":
                _add_weights(section_schema)
                add_credential_keys(section_schema)
            if cls is not None and key == "credentials":
                section_schema.setdefault("properties", {})["kind"] = kind_schema(kind)
            schema["properties"][key]["properties"][name] = section_schema
            if cls is not None:
                classes[(key, str(name))] = cls
    # the file is not validated yet: its state driver, or the schema's default one
    state = doc.get("state")
    driver = STATE_SCHEMA["properties"]["driver"]["default"]
    if isinstance(state, Mapping) and "driver" in state:
        driver = state["driver"]
    if isinstance(driver, str):
        cls = load(STATE_GROUP, driver, ("state", "driver"))
        if cls is not None:
            classes[("state", driver)] = cls
            driver_schema = _section_schema(cls)
            merged = copy.deepcopy(STATE_SCHEMA)
            merged["properties"].update(driver_schema.get("properties", {}))
            merged["additionalProperties"] = False
            schema["properties"]["state"] = merged
    for key in doc:
        if key in schema["properties"] or not isinstance(key, str):
            continue
        cls = load(SECTIONS_GROUP, key, (key,))
        schema["properties"][key] = {}
        if cls is not None:
            classes[("sections", key)] = cls
            schema["properties"][key] = _section_schema(cls)
    return schema, classes, problems


def _add_weights(section: dict[str, Any]) -> None:
    """Every backend's section takes ``weights: {ENDPOINT: N}`` (core's, whatever the backend
    declares: the selectors read it) and ``endpoint_resources: {ENDPOINT: {...}}``
    (:mod:`gridgate.core.fitting`), unless the backend defines the key itself."""
    properties = section.setdefault("properties", {})
    if isinstance(properties, dict) and "weights" not in properties:
        properties["weights"] = copy.deepcopy(WEIGHTS_SCHEMA)
    if isinstance(properties, dict) and "endpoint_resources" not in properties:
        properties["endpoint_resources"] = copy.deepcopy(ENDPOINT_RESOURCES_SCHEMA)


def _section_schema(cls: type) -> dict[str, Any]:
    section = copy.deepcopy(getattr(cls, "config_schema", {"type": "object"}))
    section.setdefault("type", "object")
    return section


@functools.lru_cache(maxsize=512)
def strict_pattern(pattern: str) -> re.Pattern[str]:
    """``pattern`` as JSON Schema means it, for Python's ``re``: each ``$`` (outside a character
    class, not escaped) becomes ``\\Z``. JSON Schema patterns are ECMA-262, where ``$`` is the
    end of the text; Python's ``$`` also matches before a final newline, so ``^[a-z]+$`` took
    ``"evil\\n"`` (a partition, an e-mail address, a JDL attribute name)."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            out.append(char)
            i += 1
            for literal in ("^", "]"):  # "[^]...]" and "[]...]": that "]" is a member
                if pattern[i : i + 1] == literal:
                    out.append(literal)
                    i += 1
            continue
        elif char == "$":
            out.append(r"\Z")
            i += 1
            continue
        out.append(char)
        i += 1
    return re.compile("".join(out))


def _strict_pattern_keyword(
    validator: Any, pattern: str, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not strict_pattern(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


#: The validator of every config document: Draft 2020-12 with ``pattern`` read as ECMA-262 does.
StrictValidator = validators.extend(Draft202012Validator, {"pattern": _strict_pattern_keyword})


def schema_problems(schema: Mapping[str, Any], instance: Any) -> list[tuple[PathT, str]]:
    """Every way ``instance`` breaks ``schema``, as (path, message) pairs in gridgate's words:
    the one formatter behind ``gridgate config validate`` and ``testing.section_for``."""
    return [
        found
        for error in StrictValidator(schema).iter_errors(instance)
        for found in _describe(error)
    ]


def _branch(error: ValidationError, chosen: ValidationError) -> str:
    """Which alternative of a oneOf/anyOf ``chosen`` came from, for people."""
    branches = (
        error.schema.get(str(error.validator), []) if isinstance(error.schema, Mapping) else []
    )
    index = chosen.relative_schema_path[0] if chosen.relative_schema_path else None
    if not isinstance(index, int) or index >= len(branches):
        return ""
    branch = branches[index]
    label = branch.get("title") or branch.get("description") or ""
    if not label:
        kinds = branch.get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        names = {
            "object": "a mapping",
            "array": "a list",
            "string": "a string",
            "integer": "an integer",
            "number": "a number",
            "boolean": "true or false",
            "null": "null",
        }
        label = " or ".join(names.get(k, k) for k in kinds)
    return f"alternative {index + 1} of {len(branches)}" + (f", {label}" if label else "")


def _describe(error: ValidationError) -> list[tuple[PathT, str]]:
    """Turn one jsonschema error into (path, message) pairs that point at the culprit."""
    path: PathT = tuple(error.absolute_path)
    if isinstance(error.schema, Mapping) and error.schema.get("x-gridgate-secret"):
        # never echo what was written where a secret belongs: it may be the secret itself
        return [(path, "a secret is given as {env: VARIABLE} or {file: PATH}, never inline")]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        allowed = set(schema.get("properties", {}))
        patterns = schema.get("patternProperties", {})
        import re

        extras = [
            k
            for k in error.instance
            if k not in allowed and not any(re.search(p, str(k)) for p in patterns)
        ]
        hint = f" (allowed: {', '.join(sorted(allowed))})" if allowed else ""
        return [((*path, k), f"unknown key{hint}") for k in extras] or [(path, error.message)]
    if "propertyNames" in error.schema_path and isinstance(error.instance, str):
        # the key that is wrong, not the mapping that holds it (jsonschema gives the key as
        # the instance and the mapping's path): its line is the key's
        return [((*path, error.instance), f"a key that is not a name: {error.message}")]
    if error.validator in ("anyOf", "oneOf") and error.context:
        # A branch rejected for its very type says little: the branch whose type fits the
        # value ("a list of groups, but one lacks pilots") is the one the author meant.
        unfit = {
            e.relative_schema_path[0]
            for e in error.context
            if e.validator == "type" and not e.relative_path and e.relative_schema_path
        }
        fitting = [
            e
            for e in error.context
            if not e.relative_schema_path or e.relative_schema_path[0] not in unfit
        ]
        best = best_match(fitting or error.context)
        which = _branch(error, best)
        # described like any error (an unknown key names the allowed ones), then the branch
        return [(p, f"{m} (as {which})" if which else m) for p, m in _describe(best)]
    if error.validator == "required":
        return [(path, error.message)]
    return [(path, error.message)]


def _normalise_sections(doc: dict[str, Any]) -> None:
    """``log:`` with nothing after it means an empty section, not null."""
    for key in CONFIG_GROUPS:
        section = doc.get(key)
        if isinstance(section, dict):
            for name, value in list(section.items()):
                if value is None:
                    section[name] = {}
    for key in ("director", "state"):
        if key in doc and doc[key] is None:
            doc[key] = {}


def validate_document(
    doc: Any,
    filename: str = "<config>",
    lines: Mapping[PathT, int] | None = None,
    folder: Path | None = None,
) -> Config:
    """Validate an already parsed document; return it with defaults filled.

    :param folder: where its relative paths are taken from (:func:`resolve_paths`; the config
        file's folder); None leaves them as written, relative to the working directory.
    :raises ConfigError: with every problem found.
    """
    lines = lines or {}
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(
            [
                ConfigProblem(
                    filename, lines.get((), 1), (), "the config must be a mapping of sections"
                )
            ]
        )
    doc = copy.deepcopy(doc)
    _normalise_sections(doc)
    schema, classes, load_problems = compose_schema(doc)

    def line_of(path: PathT) -> int:
        for cut in range(len(path), -1, -1):
            if path[:cut] in lines:
                return lines[path[:cut]]
        return 1

    found: list[tuple[PathT, str]] = list(load_problems) + schema_problems(schema, doc)
    if not found:
        # before the checks below, so that they look at the files the config means
        if folder is not None:
            resolve_paths(doc, schema, folder)
        _state_dir_follows_state_path(doc, schema)
        found.extend(secret_problems(doc, schema))
        for (key, name), cls in classes.items():
            checker = getattr(cls, "config_errors", None)
            if checker is None:
                continue
            base: PathT = (key, name) if key in CONFIG_GROUPS else (key,)
            if key == "state":
                base = ("state",)
            elif key == "sections":
                base = (name,)  # a top-level section: its key is the entry-point name
            section = _get(doc, base) or {}
            filled = copy.deepcopy(section)
            apply_defaults(filled, schema_at(schema, base))
            for sub, message in checker(filled):
                found.append(((*base, *sub), message))
    if not found:
        found.extend(credential_reference_problems(doc, schema))
    if not found:
        # checks across sections, once each section is right on its own (the director's
        # section checks that the demand names configured backends, and so on)
        for cls in classes.values():
            across = getattr(cls, "document_errors", None)
            if across is not None:
                found.extend(across(doc, classes))
    if found:
        problems = sorted(
            {ConfigProblem(filename, line_of(p), p, m) for p, m in found},
            key=lambda p: (p.line, format_path(p.path), p.message),
        )
        raise ConfigError(problems)
    apply_defaults(doc, schema)
    if folder is not None:
        resolve_paths(doc, schema, folder)  # the defaults just filled in (./gridgate-state)
    return Config(data=doc, plugin_classes=classes, lines=dict(lines))


def _get(doc: Mapping[str, Any], path: PathT) -> Any:
    node: Any = doc
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def schema_at(schema: Mapping[str, Any], path: PathT) -> Mapping[str, Any]:
    node: Any = schema
    for part in path:
        node = node.get("properties", {}).get(part, {})
    return node


#: A config file larger than this is refused (a site's is a few KiB).
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def _is_stream(path: str | os.PathLike[str]) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def read_config_text(path: str | os.PathLike[str], *, streams: bool = False) -> str:
    """The text of a config file: a regular file (a FIFO put in its place cannot hang the
    reader), at most :data:`MAX_CONFIG_BYTES`, UTF-8.

    :param streams: also read a FIFO or a terminal (``-c <(...)``, ``-c /dev/stdin``), as the
        operator asks on the command line at the start; blocking until it is written. A
        re-read of a running director's config never does (engine/reload.py).
    :raises ConfigError: (kind ``io``) when it cannot be read or is refused.
    """
    try:
        if streams and _is_stream(path):
            with open(path, "rb") as handle:
                data = handle.read(MAX_CONFIG_BYTES + 1)
            if len(data) > MAX_CONFIG_BYTES:
                raise InputFileError(f"{os.fspath(path)} is longer than {MAX_CONFIG_BYTES} bytes")
            return data.decode("utf-8")
        return read_regular(path, max_bytes=MAX_CONFIG_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            [ConfigProblem(os.fspath(path), 0, (), f"cannot read: {exc}")], kind="io"
        ) from None


def load_config(path: str | os.PathLike[str], text: str | None = None) -> Config:
    """Read, parse and validate a config file.

    Relative paths in it (keys marked :data:`PATH_KEYWORD`) are made absolute from the file's
    folder, so the director finds the same files from any working directory.

    :param path: the YAML file (named in every problem).
    :param text: its text when already read (None: read ``path``).
    :raises ConfigError: unreadable file, YAML syntax error, or schema problems; every
        problem names the file and line.
    """
    path = Path(path)
    filename = str(path)
    if text is None:
        text = read_config_text(path, streams=True)
    data, lines = _parse_yaml(text, filename)
    if data is None:
        # An empty file is far more often a truncated or half-written one than a wish for
        # every default (no backend, no demand, no mail): it is refused, never applied.
        raise ConfigError(
            [
                ConfigProblem(
                    filename,
                    1,
                    (),
                    "empty config: the file holds no YAML document (only blanks or comments)",
                )
            ]
        )
    config = validate_document(data, filename, lines, folder=config_folder(path))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Config(
        data=config.data,
        path=path,
        digest=digest,
        plugin_classes=config.plugin_classes,
        lines=config.lines,
    )


#: names of API 1.4 that moved into the sub-packages (a DeprecationWarning says where)
__getattr__ = moved_names(__name__)
