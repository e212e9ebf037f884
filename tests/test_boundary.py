"""The boundary rules (DESIGN.md, "The boundary"; STYLE.md 13-14), read from the source:

- a setting is declared once: no ``x.get("<literal>", default)`` in core/ or plugins/ (the
  default would be written again beside the schema's); the stand-in commands under
  ``plugins/*/sim/``, reads of a JSON Schema's own keywords and of HTTP headers are exempt,
  and a line that reads a dict that is not config says so with ``# not config: <why>``;
- every settings class matches its schema: each field a property, each property a field, no
  default in the class (every class that binds ``section_schema``, and every plugin's
  ``settings_class`` against its ``config_schema``);
- outside text is decoded only at the boundary: no ``json.loads``, ``yaml.safe_load``,
  ``msgspec`` decoding or XML parsing outside the boundary modules.

Each rule has a twin test that plants a violation and sees it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gridgate.core.plugins import ALL_GROUPS
from gridgate.core.settings import Settings, SettingsError, check_settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"core": "gridgate.core", "plugins": "gridgate.plugins"}
#: The module that reads sections for everyone, and the receivers whose .get is not config.
SETTINGS_MODULE = ROOT / "core" / "settings.py"
NOT_CONFIG_RECEIVERS = {"environ", "os.environ", "env"}
NOT_CONFIG_MARK = "# not config:"
#: Keys of a JSON Schema itself: code that walks a schema (the docs generator, the default
#: filler) reads the schema, not a section.
SCHEMA_KEYWORDS = {
    "properties",
    "patternProperties",
    "additionalProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "required",
    "description",
    "items",
    "default",
    "type",
}


def sources() -> list[Path]:
    return sorted(
        p for top in PACKAGES for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts
    )


def stand_in(path: Path) -> bool:
    return "sim" in path.relative_to(ROOT).parts[2:-1]


def _source(node: ast.expr) -> str:
    return ast.unparse(node)


def defaulted_reads(path: Path, text: str | None = None) -> list[str]:
    """Every ``x.get("<literal>", default)`` in ``path`` (or in ``text`` standing for it)."""
    text = path.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            continue
        if node.args[0].value in SCHEMA_KEYWORDS:
            continue
        receiver = _source(node.func.value)
        if receiver in NOT_CONFIG_RECEIVERS or receiver.endswith("headers"):
            continue
        end = node.end_lineno or node.lineno
        if any(NOT_CONFIG_MARK in lines[n - 1] for n in range(node.lineno, end + 1)):
            continue
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_setting_is_read_with_a_default_written_again() -> None:
    found = [
        where
        for path in sources()
        if path != SETTINGS_MODULE and not stand_in(path)
        for where in defaulted_reads(path)
    ]
    assert found == [], (
        "read these through a Settings class (gridgate.core.settings): the default belongs "
        "in the schema alone\n" + "\n".join(found)
    )


def test_the_defaulted_read_rule_sees_a_planted_read_and_honours_the_mark() -> None:
    probe = ROOT / "core" / "probe.py"
    planted = "def f(section):\n    return section.get('timeout', 30)\n"
    assert defaulted_reads(probe, planted) == ["core/probe.py:2: section.get('timeout', 30)"]
    marked = "def f(row):\n    return row.get('n', 0)  # not config: a row built here\n"
    assert defaulted_reads(probe, marked) == []
    environ = "import os\ndef f():\n    return os.environ.get('HOME', '/')\n"
    assert defaulted_reads(probe, environ) == []
    schema = "def f(schema):\n    return schema.get('properties', {})\n"
    assert defaulted_reads(probe, schema) == []


# --- settings classes against their schemas -------------------------------------------------------


def module_names() -> Iterator[str]:
    for path in sources():
        top, *rest = path.relative_to(ROOT).with_suffix("").parts
        if rest[-1] == "__init__":
            rest.pop()
        yield ".".join([PACKAGES[top], *rest])


def every_settings_class() -> list[type[Settings]]:
    for name in module_names():
        if not name.endswith("__main__"):
            importlib.import_module(name)
    found: list[type[Settings]] = []
    todo = list(Settings.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_settings_class_that_names_its_schema_matches_it() -> None:
    bad = []
    for cls in every_settings_class():
        if cls.section_schema is None or not cls.__module__.startswith("gridgate."):
            continue
        try:
            check_settings(cls.section_schema, cls)
        except SettingsError as exc:
            bad.append(f"{cls.__module__}.{cls.__qualname__}: {exc}")
    assert bad == [], "\n".join(bad)


def plugin_classes() -> Iterator[tuple[str, type]]:
    for group in ALL_GROUPS:
        for ep in importlib.metadata.entry_points(group=group):
            if ep.value.startswith("gridgate."):
                yield f"{group}:{ep.name}", ep.load()


def test_every_plugins_settings_class_matches_its_config_schema() -> None:
    bad = []
    for name, cls in plugin_classes():
        settings_class = getattr(cls, "settings_class", None)
        if settings_class is None:
            continue
        try:
            check_settings(cls.config_schema, settings_class)
        except SettingsError as exc:
            bad.append(f"{name}: {exc}")
    assert bad == [], "\n".join(bad)


_PROBE_SCHEMA = {"properties": {"host": {"type": "string", "default": "x"}}}


@dataclass(frozen=True)
class _PlantedSettings(Settings):
    section_schema: ClassVar[Any] = _PROBE_SCHEMA
    port: int


def test_the_schema_rule_sees_a_class_that_does_not_match() -> None:
    assert _PlantedSettings in every_settings_class()
    with pytest.raises(SettingsError, match="port have no schema property"):
        check_settings(_PlantedSettings.section_schema, _PlantedSettings)


# --- outside text, decoded at the boundary ----------------------------------------------------------

#: The modules that decode outside text: core's boundary (documents; text, the JSON and YAML
#: parsers it builds on), the config file's own loader, each area's documents module, and the
#: token daemon's wire protocol: its request decoder (protocol.py) and the gate's reader of the
#: replies (gateclient.py), which may import no decoding library on a gated call's path; and
#: the HTTP client's ``Response.json()`` (API 1.x: a plugin decodes typed with documents).
#: The devkit is for authors and tests, never on a run-time path.
BOUNDARY_NAMES = {"documents.py"}
BOUNDARY_FILES = {
    ROOT / "core" / name for name in ("documents.py", "text.py", "config.py", "http.py")
} | {ROOT / "plugins" / "lsf_proxy" / name for name in ("protocol.py", "client/gateclient.py")}
#: calls that turn outside text into values
DECODERS = {
    "json.loads",
    "json.load",
    "parse_json",
    "text.parse_json",
    "yaml.safe_load",
    "parse_yaml",
    "msgspec.json.decode",
    "msgspec.convert",
    "ET.fromstring",
    "ElementTree.fromstring",
    "ET.parse",
}


def decoder_calls(path: Path, text: str | None = None) -> list[str]:
    text = path.read_text(encoding="utf-8") if text is None else text
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and _source(node.func) in DECODERS:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {_source(node.func)}")
    return found


def boundary(path: Path) -> bool:
    devkit = path.is_relative_to(ROOT / "core" / "devkit")
    return path.name in BOUNDARY_NAMES or path in BOUNDARY_FILES or stand_in(path) or devkit


def test_outside_text_is_decoded_only_at_the_boundary() -> None:
    found = [where for path in sources() if not boundary(path) for where in decoder_calls(path)]
    assert found == [], (
        "decode these in the area's documents module (gridgate.core.documents: typed, one "
        "error type)\n" + "\n".join(found)
    )


def test_the_boundary_rule_sees_a_planted_decoder() -> None:
    probe = ROOT / "plugins" / "arc" / "backend.py"
    planted = "import json\ndef f(body):\n    return json.loads(body)['jobs']\n"
    assert decoder_calls(probe, planted) == ["plugins/arc/backend.py:3: json.loads"]
    assert not boundary(probe)
    assert boundary(ROOT / "plugins" / "arc" / "documents.py")
