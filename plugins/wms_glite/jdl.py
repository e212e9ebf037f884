"""Builds the pilot JDL from the backend's config and a request, escaping every value.

The JDL is ClassAd text read by the WMS, not by a shell; the danger is a config or demand
string that closes its quotes and adds attributes of its own. Strings are therefore always
written quoted with ``\\`` and ``"`` escaped, expressions (Requirements, Rank) are checked
to be a single expression, and attribute names are checked against a strict pattern.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gridgate.core.model import SubmitRequest
from gridgate.plugins.wms_glite.settings import ATTRIBUTE_NAME_RE, GliteSettings, glite_settings

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Attributes the builder writes itself; extra_attributes may not silently replace them.
RESERVED = frozenset(
    name.lower()
    for name in (
        "Type",
        "JobType",
        "Executable",
        "Arguments",
        "StdOutput",
        "StdError",
        "InputSandbox",
        "OutputSandbox",
        "Requirements",
        "Rank",
        "VirtualOrganisation",
        "RetryCount",
        "ShallowRetryCount",
        "Parameters",
        "ParameterStep",
        "ParameterStart",
        # a demand group's resources (resource_jdl)
        "CpuNumber",
        "SMPGranularity",
        "HostNumber",
        "WholeNodes",
    )
)


class JdlError(ValueError):
    """A value cannot be written into a JDL safely; the message names the attribute."""


def quote(value: str, attribute: str = "value") -> str:
    """``value`` as a JDL string literal: quotes and backslashes escaped, newlines and tabs
    written as escapes; other control characters are refused."""
    if not isinstance(value, str):
        raise JdlError(f"{attribute}: expected a string, got {type(value).__name__}")
    out = []
    for char in value:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            raise JdlError(f"{attribute}: control character U+{ord(char):04X} is not allowed")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def check_expression(expression: str, attribute: str = "expression") -> str:
    """Accept a ClassAd expression only if it is one expression: balanced string literals,
    no ``;`` or brackets outside them (they would end the attribute and start another),
    no line breaks or control characters. Returns the expression stripped."""
    if not isinstance(expression, str):
        raise JdlError(f"{attribute}: expected a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise JdlError(f"{attribute}: empty expression")
    in_string = escaped = False
    depth = 0
    for char in text:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            raise JdlError(f"{attribute}: control character U+{ord(char):04X} is not allowed")
        if not in_string and char in "()":
            # Unbalanced, the WMS refuses every submission with a JDL parse error.
            depth += 1 if char == "(" else -1
            if depth < 0:
                raise JdlError(f"{attribute}: ')' without a matching '('")
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in ";[]":
            raise JdlError(f"{attribute}: {char!r} outside a string would end the expression")
    if in_string:
        raise JdlError(f"{attribute}: unterminated string literal")
    if depth:
        raise JdlError(f"{attribute}: {depth} unclosed '('")
    return text


def literal(value: Any, attribute: str = "value") -> str:
    """A config value (string, number, bool, or a list of those) as a JDL literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise JdlError(f"{attribute}: {value} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        return quote(value, attribute)
    if isinstance(value, Sequence):
        items = []
        for index, item in enumerate(value):
            if isinstance(item, (list, tuple, dict)):
                raise JdlError(f"{attribute}[{index}]: nested lists are not supported")
            items.append(literal(item, f"{attribute}[{index}]"))
        return "{ " + ", ".join(items) + " }" if items else "{}"
    raise JdlError(f"{attribute}: unsupported value of type {type(value).__name__}")


def _string_list(values: Any, attribute: str) -> str:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise JdlError(f"{attribute}: expected a list of strings")
    return literal(list(values), attribute)


def resource_jdl(request: SubmitRequest) -> tuple[list[tuple[str, str]], list[str]]:
    """The JDL of ``request.resources``, as gLite's JDL guide writes them: the attributes
    ``CpuNumber`` and ``SMPGranularity`` (all the cores on one node) for more than one core,
    and the Requirements terms ``other.GlueHostMainMemoryRAMSize >= MB`` (the node's memory,
    for the whole pilot) and ``other.GlueCEPolicyMaxWallClockTime >= MINUTES`` (the walltime in
    minutes, rounded up). Empty lists when nothing is asked."""
    resources = request.resources
    if resources is None:
        return [], []
    attributes: list[tuple[str, str]] = []
    terms: list[str] = []
    if resources.cores != 1:
        attributes += [
            ("CpuNumber", str(resources.cores)),
            ("SMPGranularity", str(resources.cores)),
        ]
    if resources.memory_mb is not None:
        terms.append(f"other.GlueHostMainMemoryRAMSize >= {int(resources.memory_mb)}")
    if resources.walltime is not None:
        minutes = math.ceil(resources.walltime / 60)
        terms.append(f"other.GlueCEPolicyMaxWallClockTime >= {minutes}")
    return attributes, terms


def build_jdl(config: GliteSettings | Mapping[str, Any], request: SubmitRequest) -> str:
    """The JDL text for ``request`` under the backend section ``config``.

    ``request.requirements``, when non-empty, replaces the configured Requirements;
    ``request.attributes`` add to and override ``extra_attributes``; ``request.count`` > 1
    makes a parametric JDL of that many pilots; ``request.resources`` add the attributes and
    Requirements terms of :func:`resource_jdl` (the terms joined to the Requirements by ``&&``).

    :raises JdlError: a value that cannot be written safely (names the attribute).
    """
    settings = glite_settings(config)
    lines: list[tuple[str, str]] = []
    executable = settings.executable
    if not executable:
        raise JdlError("executable: must not be empty")
    lines.append(("Executable", quote(executable, "executable")))
    if settings.arguments:
        lines.append(("Arguments", quote(settings.arguments, "arguments")))
    if settings.std_output:
        lines.append(("StdOutput", quote(settings.std_output, "std_output")))
    if settings.std_error:
        lines.append(("StdError", quote(settings.std_error, "std_error")))
    if settings.input_sandbox:
        lines.append(("InputSandbox", _string_list(settings.input_sandbox, "input_sandbox")))
    if settings.output_sandbox:
        lines.append(("OutputSandbox", _string_list(settings.output_sandbox, "output_sandbox")))
    requirements = request.requirements or settings.requirements or ""
    attributes, terms = resource_jdl(request)
    if requirements.strip():
        source = "request.requirements" if request.requirements else "requirements"
        requirements = check_expression(requirements, source)
        terms = [f"({requirements})", *terms] if terms else [requirements]
    if terms:
        lines.append(("Requirements", " && ".join(terms)))
    lines += attributes
    if settings.rank:
        lines.append(("Rank", check_expression(settings.rank, "rank")))
    if settings.vo:
        lines.append(("VirtualOrganisation", quote(settings.vo, "vo")))
    lines.append(("RetryCount", literal(int(settings.retry_count), "retry_count")))
    lines.append(
        (
            "ShallowRetryCount",
            literal(int(settings.shallow_retry_count), "shallow_retry_count"),
        )
    )
    if request.count > 1:
        lines += [
            ("JobType", quote("Parametric")),
            ("Parameters", str(int(request.count))),
            ("ParameterStep", "1"),
            ("ParameterStart", "0"),
        ]
    extras = {**dict(settings.extra_attributes or {}), **dict(request.attributes)}
    for name, value in extras.items():
        if not isinstance(name, str) or not ATTRIBUTE_NAME_RE.fullmatch(name):
            raise JdlError(f"extra_attributes: {name!r} is not a valid attribute name")
        if name.lower() in RESERVED:
            raise JdlError(f"extra_attributes: {name} is set by gridgate itself")
        lines.append((name, literal(value, f"extra_attributes.{name}")))
    body = "".join(f"  {name} = {value};\n" for name, value in lines)
    return "[\n" + body + "]\n"
