"""Settings declared once and read typed (gridgate.core.settings): defaults only from the
schema, the class and its schema checked against each other, nested blocks, cross-key rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.settings import (
    Settings,
    SettingsError,
    check_settings,
    fill_defaults,
    key,
    settings_from,
)

ACTION = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "kind": {"type": "string", "enum": ["report", "block"], "default": "report"},
        "for": {"type": "number", "default": 600},
    },
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "host": {"type": "string", "default": "localhost"},
        "timeout": {"type": "number", "default": 30},
        "scheduler": {"type": ["string", "null"], "default": None},
        "users": {"type": "array", "items": {"type": "string"}, "default": []},
        "action": {**ACTION, "default": {}},
        "rules": {"type": "array", "items": ACTION, "default": []},
        "peers": {
            "type": "object",
            "additionalProperties": {**ACTION},
            "default": {},
        },
        "max-age": {"type": "integer", "default": 5},
    },
}


@dataclass(frozen=True)
class ActionSettings(Settings):
    kind: str
    for_: float


@dataclass(frozen=True)
class AuditSettings(Settings):
    section_schema: ClassVar[Mapping[str, Any]] = SCHEMA

    host: str
    timeout: float
    scheduler: str | None
    users: frozenset[str]
    action: ActionSettings
    rules: tuple[ActionSettings, ...]
    peers: Mapping[str, ActionSettings]
    max_age: int = key("max-age")

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        if self.action.kind == "block" and self.scheduler is None:
            return [(("action", "kind"), "block needs scheduler, which is not set")]
        return []


def test_defaults_come_from_the_schema_alone_nested_blocks_included() -> None:
    s = AuditSettings.of({"users": ["alice", "bob"], "rules": [{"kind": "block"}]})
    assert s.host == "localhost"
    assert s.timeout == 30.0 and isinstance(s.timeout, float)
    assert s.scheduler is None
    assert s.users == frozenset({"alice", "bob"})
    assert s.action == ActionSettings(kind="report", for_=600.0)
    assert s.rules == (ActionSettings(kind="block", for_=600.0),)
    assert s.max_age == 5


def test_named_entries_and_keys_that_are_not_python_names() -> None:
    s = settings_from(SCHEMA, {"peers": {"pa": {"for": 5}}, "max-age": 9}, AuditSettings)
    assert s.peers == {"pa": ActionSettings(kind="report", for_=5.0)}
    assert s.max_age == 9


def test_the_settings_are_frozen() -> None:
    s = AuditSettings.of({})
    with pytest.raises(AttributeError):
        s.host = "other"  # type: ignore[misc]


def test_a_bad_section_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"action\.for: 'soon' is not of type 'number'"):
        AuditSettings.of({"action": {"for": "soon"}})


def test_filling_defaults_never_changes_the_section_given() -> None:
    section = {"action": {"kind": "block"}}
    AuditSettings.of(section)
    assert section == {"action": {"kind": "block"}}


def test_a_cross_key_rule_is_a_problem_with_its_path_from_the_top() -> None:
    @dataclass(frozen=True)
    class Outer(Settings):
        inner: AuditSettings

    outer_schema = {"type": "object", "properties": {"inner": {**SCHEMA, "default": {}}}}
    outer = settings_from(outer_schema, {"inner": {"action": {"kind": "block"}}}, Outer)
    assert outer.problems() == [
        (("inner", "action", "kind"), "block needs scheduler, which is not set")
    ]
    fine = settings_from(outer_schema, {"inner": {"scheduler": "slurm"}}, Outer)
    assert fine.problems() == []


def test_a_field_without_a_property_is_an_error() -> None:
    @dataclass(frozen=True)
    class Extra(Settings):
        kind: str
        for_: float
        colour: str

    with pytest.raises(SettingsError, match="colour have no schema property"):
        check_settings(ACTION, Extra)


def test_a_property_without_a_field_is_an_error() -> None:
    @dataclass(frozen=True)
    class Short(Settings):
        kind: str

    with pytest.raises(SettingsError, match="for have no field"):
        settings_from(ACTION, {}, Short)


def test_a_default_written_in_the_class_is_an_error() -> None:
    @dataclass(frozen=True)
    class Twice(Settings):
        kind: str
        for_: float = 600.0

    with pytest.raises(SettingsError, match="a default belongs in the schema"):
        check_settings(ACTION, Twice)


@dataclass(frozen=True)
class Wrong(Settings):
    kind: str


@dataclass(frozen=True)
class HoldsWrong(Settings):
    action: Wrong


def test_a_nested_class_is_checked_against_its_property() -> None:
    with pytest.raises(SettingsError, match="Wrong: schema propert"):
        check_settings({"properties": {"action": ACTION}}, HoldsWrong)


def test_fill_defaults_fills_nested_objects() -> None:
    doc: dict[str, Any] = {"action": {}}
    fill_defaults(doc, SCHEMA)
    assert doc["action"] == {"kind": "report", "for": 600}
    assert doc["host"] == "localhost"


class _Audit(Plugin):
    config_schema: ClassVar[dict[str, Any]] = SCHEMA
    settings_class = AuditSettings
    settings: AuditSettings


def test_a_plugin_gets_its_settings_once_and_reports_their_rules() -> None:
    plugin = _Audit({"host": "ce1", "scheduler": "slurm"}, PluginContext())
    assert plugin.settings.host == "ce1"
    assert plugin.config == {"host": "ce1", "scheduler": "slurm"}
    assert _Audit.config_errors({"action": {"kind": "block"}}) == [
        (("action", "kind"), "block needs scheduler, which is not set")
    ]
    assert _Audit.config_errors({"action": {"kind": "block"}, "scheduler": "slurm"}) == []


def test_a_plugin_without_settings_class_keeps_the_api_1_behaviour() -> None:
    class Old(Plugin):
        pass

    plugin = Old({"x": 1}, PluginContext())
    assert plugin.settings is None and plugin.config == {"x": 1}
    assert Old.config_errors({"x": 1}) == []


def test_an_unused_helper_field_is_not_needed() -> None:
    # the dataclass machinery's own field() is not a default when it only carries metadata
    @dataclass(frozen=True)
    class Keyed(Settings):
        kind: str
        for_: float = field(metadata={"key": "for"})

    assert settings_from(ACTION, {"for": 1}, Keyed).for_ == 1.0
