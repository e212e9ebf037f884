"""docs/configuration.md is the composed schema rendered: it fails here when it is stale, and
the renderer shows every key with its type, default, constraints and description."""

from __future__ import annotations

from pathlib import Path

from gridgate.core.devkit import docgen
from gridgate.core.engine.section import DIRECTOR_SCHEMA

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "configuration.md"


def test_configuration_md_is_up_to_date() -> None:
    expected = docgen.render()
    current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert current == expected, (
        f"{DOC.relative_to(ROOT)} is stale (a config schema changed or a plugin was added); "
        f"regenerate it with: {docgen.REGENERATE}"
    )


def test_render_documents_every_director_key_and_every_own_plugin() -> None:
    text = docgen.render()
    for key, node in DIRECTOR_SCHEMA["properties"].items():
        line = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
        assert node["description"] in line
    for plugin in docgen._chosen(False):
        if plugin.group.endswith(".cli"):
            continue  # command providers have no config
        assert f"`{plugin.target}`" in text, plugin


def test_rows_flatten_nested_mappings_lists_and_alternatives() -> None:
    schema = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "Who | what."},
            "mode": {"enum": ["a", "b"], "default": "a"},
            "limits": {
                "type": "object",
                "default": {},
                "properties": {"max": {"type": "integer", "minimum": 1, "maximum": 9}},
            },
            "rules": {
                "type": "array",
                "default": [],
                "items": {
                    "type": "object",
                    "required": ["kind"],
                    "properties": {"kind": {"type": "string", "pattern": "^[a-z]+$"}},
                },
            },
            "policy": {
                "oneOf": [
                    {"type": "string"},
                    {
                        "type": "object",
                        "properties": {"query": {"type": "integer", "exclusiveMinimum": 0}},
                    },
                ]
            },
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "levels": {"type": "array", "items": {"enum": ["error", "alarm"]}, "uniqueItems": True},
            "port": {"type": ["integer", "null"], "default": None},
        },
    }
    rows = {row.key: row for row in docgen.rows(schema)}
    assert list(rows) == [
        "name",
        "mode",
        "limits",
        "limits.max",
        "rules",
        "rules[].kind",
        "policy",
        "policy.query",
        "env",
        "levels",
        "port",
    ]
    assert (rows["name"].default, rows["name"].allowed) == ("*required*", "non-empty")
    assert rows["name"].description == "Who \\| what."
    assert (rows["mode"].type, rows["mode"].allowed, rows["mode"].default) == (
        "string",
        '`"a"`, `"b"`',
        '`"a"`',
    )
    assert rows["limits.max"].allowed == "≥ 1; ≤ 9"
    assert rows["rules"].type == "list of mapping" and rows["rules[].kind"].default == "*required*"
    assert rows["rules[].kind"].allowed == "matches `^[a-z]+$`"
    assert rows["policy"].type == "string \\| mapping" and rows["policy.query"].allowed == "> 0"
    assert rows["env"].type == "mapping of string"
    assert rows["levels"].allowed == 'each of `"error"`, `"alarm"`; no duplicates'
    assert (rows["port"].type, rows["port"].default) == ("integer \\| null", "`null`")
