"""Settings declared once and read typed: a config section becomes a frozen dataclass whose
defaults come only from the section's JSON Schema.

A settings class is a frozen dataclass deriving from :class:`Settings`, with one field per
property of its schema and no defaults of its own (the schema's ``default`` is the one place a
default is written: it also validates the file and is the source of docs/configuration.md).
:func:`settings_from` validates a section, fills the schema's defaults and builds the class;
a field that has no schema property, or a property with no field, is a :class:`SettingsError`
the first time the pair is used (a layering test checks every pair at import)::

    SCHEMA = {"type": "object", "properties": {
        "host": {"type": "string", "default": "localhost"},
        "port": {"type": "integer", "default": 25}}}

    @dataclass(frozen=True)
    class SmtpSettings(Settings):
        host: str
        port: int

    settings = settings_from(SCHEMA, {"port": 2525}, SmtpSettings)  # host="localhost"

Field types steer the conversion: a :class:`Settings` subclass is built from the property's
own schema (nested blocks), ``tuple[X, ...]`` from a list (``X`` a settings class: each item
from ``items``), ``Mapping[str, X]`` from an object of named entries (``additionalProperties``
or ``patternProperties``), ``frozenset[str]`` from a list, ``float`` from any number; anything
else is the validated value itself. A key that is not a Python name (``for``, ``max-age``) is
named with :func:`key`; a keyword with a trailing underscore (``for_``) needs nothing.

Cross-key rules live with the settings: :meth:`Settings.cross_rules` returns ``(path, message)``
pairs, and :meth:`Settings.problems` collects them from every nested block with their paths, so
a block whose effect needs another key is a config error naming both (``FILE:LINE``), never a
silent no-op. :class:`gridgate.core.plugins.Plugin` reports them through ``config_errors``.
"""

from __future__ import annotations

import copy
import dataclasses
import keyword
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match

__all__ = [
    "Settings",
    "SettingsError",
    "check_settings",
    "fill_defaults",
    "key",
    "settings_from",
]

S = TypeVar("S", bound="Settings")

#: Where in a section a problem is, and what it is (gridgate.core.plugins.ConfigProblems).
_Problems = list[tuple[tuple[str | int, ...], str]]


class SettingsError(TypeError):
    """A settings class that does not match its schema: a field without a property, a property
    without a field, or a field with a default of its own. A programming error, found at load."""


def key(name: str) -> Any:
    """A field whose config key is ``name`` (a key that is not a Python identifier):
    ``max_age: int = key("max-age")``."""
    return dataclasses.field(metadata={"key": name})


@dataclasses.dataclass(frozen=True)
class Settings:
    """The base of every settings class (a frozen dataclass, one field per schema property).

    ``section_schema`` may name the class's own schema, so that :meth:`of` needs none and the layering
    test can check the pair; a class used with several schemas leaves it unset and is given one
    by :func:`settings_from`.
    """

    section_schema: ClassVar[Mapping[str, Any] | None] = None

    @classmethod
    def of(cls: type[S], section: Mapping[str, Any] | None) -> S:
        """The settings of ``section`` under the class's own :attr:`section_schema`."""
        if cls.section_schema is None:
            raise SettingsError(f"{cls.__qualname__} names no schema: use settings_from")
        return settings_from(cls.section_schema, section, cls)

    def cross_rules(self) -> _Problems:
        """This block's cross-key problems, as (path inside the block, message): a key whose
        effect needs another key that is missing names both. Empty when fine; nested blocks
        answer for themselves (see :meth:`problems`)."""
        return []

    def problems(self) -> _Problems:
        """Every cross-key problem of this block and of the blocks nested in it, each path from
        this block down."""
        found = list(self.cross_rules())
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            name = _key_of(f)
            for where, child in _children(value):
                found.extend(((name, *where, *path), msg) for path, msg in child.problems())
        return found


def _children(value: Any) -> Iterator[tuple[tuple[str | int, ...], Settings]]:
    if isinstance(value, Settings):
        yield (), value
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            if isinstance(item, Settings):
                yield (i,), item
    elif isinstance(value, Mapping):
        for name, item in value.items():
            if isinstance(item, Settings):
                yield (str(name),), item


def _key_of(f: dataclasses.Field[Any]) -> str:
    if "key" in f.metadata:
        return str(f.metadata["key"])
    if f.name.endswith("_") and keyword.iskeyword(f.name[:-1]):
        return f.name[:-1]
    return f.name


# --- defaults ----------------------------------------------------------------------------------


def _set_defaults(
    validator: Any, properties: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if isinstance(instance, dict):
        for name, sub in properties.items():
            if isinstance(sub, dict) and "default" in sub and name not in instance:
                instance[name] = copy.deepcopy(sub["default"])
    yield from Draft202012Validator.VALIDATORS["properties"](
        validator, properties, instance, schema
    )


_DefaultFiller = validators.extend(Draft202012Validator, {"properties": _set_defaults})


def fill_defaults(instance: Any, schema: Mapping[str, Any]) -> None:
    """Fill the defaults of ``schema`` into ``instance`` (a section as written) in place (nested objects too). Call
    only on a valid document: filling never makes an invalid one valid, it only adds keys."""
    for _ in _DefaultFiller(schema).iter_errors(instance):
        pass  # validity is the plain validator's to report; this pass only fills


# --- the class against its schema ---------------------------------------------------------------


def _properties(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The properties a section may have: its own, and those of its ``allOf``/``anyOf``/
    ``oneOf`` branches (a section whose forms differ by a key)."""
    found: dict[str, Any] = {}
    for branch_key in ("allOf", "anyOf", "oneOf"):
        for branch in schema.get(branch_key, ()):
            if isinstance(branch, Mapping):
                found.update(_properties(branch))
    found.update(schema.get("properties", {}))
    return found


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


#: (class, its schema's property names) pairs already checked: the check is a pure function of
#: the two, and a section's settings are built at every load.
_CHECKED: set[tuple[type, frozenset[str]]] = set()


def check_settings(schema: Mapping[str, Any], cls: type[Settings]) -> None:
    """Raise :class:`SettingsError` unless ``cls`` (a settings class) has exactly one field per
    property of ``schema``, none with a default of its own, and each nested settings field matches its
    property's schema in turn."""
    if not (isinstance(cls, type) and issubclass(cls, Settings) and dataclasses.is_dataclass(cls)):
        raise SettingsError(f"{cls!r} is not a Settings dataclass")
    properties = _properties(schema)
    marker = (cls, frozenset(properties))
    if marker in _CHECKED:
        return
    fields = {_key_of(f): f for f in dataclasses.fields(cls)}
    name = cls.__qualname__
    extra = sorted(set(fields) - set(properties))
    missing = sorted(set(properties) - set(fields))
    if extra:
        raise SettingsError(f"{name}: field(s) {', '.join(extra)} have no schema property")
    if missing:
        raise SettingsError(f"{name}: schema propert(ies) {', '.join(missing)} have no field")
    hints = _hints(cls)
    for k, f in fields.items():
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            raise SettingsError(
                f"{name}.{f.name}: a default belongs in the schema, not in the class"
            )
        for sub_cls, sub_schema in _nested(hints[f.name], properties[k]):
            check_settings(sub_schema, sub_cls)
    _CHECKED.add(marker)


def _nested(hint: Any, schema: Mapping[str, Any]) -> Iterator[tuple[type[Settings], Any]]:
    """The settings classes a field's type holds, each with the schema it is built from."""
    hint = _unoptional(hint)
    if _is_settings(hint):
        yield hint, _object_branch(schema)
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and args and _is_settings(_unoptional(args[0])):
        yield _unoptional(args[0]), _object_branch(schema.get("items", {}))
    elif origin in (Mapping, dict, typing.Mapping) and len(args) == 2:
        item = _unoptional(args[1])
        if _is_settings(item):
            yield item, _object_branch(_entry_schema(schema))


def _is_settings(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Settings)


def _unoptional(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _object_branch(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object form of a property that may also be written otherwise (``null``, a shorthand
    string): the branch of its ``anyOf``/``oneOf`` that has properties, or itself."""
    if "properties" in schema:
        return schema
    for branch_key in ("anyOf", "oneOf"):
        for branch in schema.get(branch_key, ()):
            if isinstance(branch, Mapping) and "properties" in branch:
                return branch
    return schema


def _entry_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    entry = schema.get("additionalProperties")
    if isinstance(entry, Mapping):
        return entry
    for sub in schema.get("patternProperties", {}).values():
        if isinstance(sub, Mapping):
            return sub
    return {}


# --- building ----------------------------------------------------------------------------------


def settings_from(
    schema: Mapping[str, Any],
    section: Mapping[str, Any] | None,
    cls: type[S],
    *,
    validate: bool = True,
) -> S:
    """The typed settings of ``section`` (``None``: an empty one) under ``schema``, as an
    instance of ``cls`` (a :class:`Settings` dataclass with one field per property).

    :param validate: check ``section`` against ``schema`` first (a :class:`ValueError` naming
        the key path and what is wrong); a section that the config loader already validated
        may pass ``False``.
    :raises SettingsError: ``cls`` does not match ``schema`` (a programming error).
    """
    check_settings(schema, cls)
    data: Any = copy.deepcopy(dict(section or {}))
    if validate:
        error = best_match(Draft202012Validator(schema).iter_errors(data))
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "(section)"
            raise ValueError(f"{where}: {error.message}")
    fill_defaults(data, schema)
    return _build(cls, data, schema)


def _build(cls: type[S], data: Mapping[str, Any], schema: Mapping[str, Any]) -> S:
    properties = _properties(schema)
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        k = _key_of(f)
        values[f.name] = _convert(hints[f.name], data.get(k), properties.get(k, {}))
    return cls(**values)


def _convert(hint: Any, value: Any, schema: Mapping[str, Any]) -> Any:
    if value is None:
        return None
    hint = _unoptional(hint)
    if _is_settings(hint):
        if isinstance(value, Mapping):
            sub = _object_branch(schema)
            filled = copy.deepcopy(dict(value))
            fill_defaults(filled, sub)
            return _build(hint, filled, sub)
        return value  # a shorthand form the field's type also admits
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and isinstance(value, Sequence) and not isinstance(value, str):
        item_hint = args[0] if args else Any
        items = schema.get("items", {})
        return tuple(_convert(item_hint, v, items) for v in value)
    if origin is frozenset and isinstance(value, Sequence) and not isinstance(value, str):
        return frozenset(value)
    if origin in (Mapping, dict, typing.Mapping) and isinstance(value, Mapping) and args:
        entry = _entry_schema(schema)
        return {
            str(k): _convert(args[1], v, _match(schema, str(k), entry)) for k, v in value.items()
        }
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _match(schema: Mapping[str, Any], name: str, fallback: Mapping[str, Any]) -> Mapping[str, Any]:
    """The schema of entry ``name`` of an object of named entries."""
    if name in schema.get("properties", {}):
        return schema["properties"][name]
    for pattern, sub in schema.get("patternProperties", {}).items():
        if re.search(pattern, name):
            return sub
    return fallback
