"""build_jdl: every value escaped, expressions kept to one expression, parametric bulk JDLs."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gridgate.core.config import apply_defaults
from gridgate.core.model import SubmitRequest
from gridgate.plugins.wms_glite.backend import GliteBackend, build_jdl
from gridgate.plugins.wms_glite.jdl import JdlError, check_expression, quote


def config(**overrides: Any) -> dict[str, Any]:
    section: dict[str, Any] = dict(overrides)
    apply_defaults(section, GliteBackend.config_schema)
    return section


def attributes(jdl: str) -> dict[str, str]:
    """Attribute -> raw value text, read back the way a ClassAd reader splits lines."""
    found = {}
    for line in jdl.splitlines():
        match = re.match(r"^  (\w+) = (.*);$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def unquote(literal: str) -> str:
    """Decode a JDL string literal written by quote()."""
    assert literal.startswith('"') and literal.endswith('"')
    out, body, index = [], literal[1:-1], 0
    escapes = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
    while index < len(body):
        char = body[index]
        if char == "\\":
            out.append(escapes[body[index + 1]])
            index += 2
        else:
            assert char != '"', f"unescaped quote in {literal!r}"
            out.append(char)
            index += 1
    return "".join(out)


def test_defaults_make_a_pilot_jdl() -> None:
    jdl = build_jdl(config(), SubmitRequest("wms_glite"))
    attrs = attributes(jdl)
    assert jdl.startswith("[\n") and jdl.endswith("]\n")
    assert attrs["Executable"] == '"pilot.sh"'
    assert attrs["StdOutput"] == '"std.out"' and attrs["StdError"] == '"std.err"'
    assert attrs["OutputSandbox"] == '{ "std.out", "std.err" }'
    assert attrs["Requirements"] == 'other.GlueCEStateStatus == "Production"'
    assert attrs["Rank"] == "-other.GlueCEStateEstimatedResponseTime"
    assert attrs["RetryCount"] == "0" and attrs["ShallowRetryCount"] == "0"
    assert "JobType" not in attrs and "VirtualOrganisation" not in attrs


def test_quotes_backslashes_and_command_substitution_stay_literal() -> None:
    nasty = 'a "quoted" \\path\\ $(touch /tmp/x) `id`; Requirements = true;'
    jdl = build_jdl(
        config(arguments=nasty, vo='vo"x', input_sandbox=[nasty]), SubmitRequest("wms_glite")
    )
    attrs = attributes(jdl)
    assert unquote(attrs["Arguments"]) == nasty
    assert unquote(attrs["VirtualOrganisation"]) == 'vo"x'
    assert '\\"quoted\\"' in attrs["Arguments"] and "\\\\path\\\\" in attrs["Arguments"]
    assert "$(touch /tmp/x)" in attrs["Arguments"]
    # The injected "Requirements = true;" stayed inside the strings: one Requirements line.
    assert [line for line in jdl.splitlines() if line.startswith("  Requirements")] == [
        '  Requirements = other.GlueCEStateStatus == "Production";'
    ]
    assert attrs["Requirements"] == 'other.GlueCEStateStatus == "Production"'


def test_newlines_are_escaped_not_written() -> None:
    jdl = build_jdl(config(arguments="one\ntwo\tthree"), SubmitRequest("wms_glite"))
    attrs = attributes(jdl)
    assert unquote(attrs["Arguments"]) == "one\ntwo\tthree"
    assert len(jdl.splitlines()) == len(attrs) + 2


def test_other_control_characters_are_refused() -> None:
    with pytest.raises(JdlError, match="arguments: control character U\\+0000"):
        build_jdl(config(arguments="a\x00b"), SubmitRequest("wms_glite"))


@given(st.text())
def test_any_string_round_trips_or_is_refused(text: str) -> None:
    try:
        literal = quote(text, "arguments")
    except JdlError:
        assert any(ord(c) < 0x20 and c not in "\n\r\t" or ord(c) == 0x7F for c in text)
        return
    assert "\n" not in literal
    assert unquote(literal) == text


def test_request_requirements_override_config() -> None:
    jdl = build_jdl(
        config(), SubmitRequest("wms_glite", requirements='other.GlueCEUniqueID == "ce1"')
    )
    assert attributes(jdl)["Requirements"] == 'other.GlueCEUniqueID == "ce1"'


@pytest.mark.parametrize(
    "expression",
    [
        'true; Executable = "evil"',
        'other.X == "a',
        "true\nExecutable = 1",
        "true ] [ Executable = 1",
    ],
)
def test_expressions_that_would_escape_are_refused(expression: str) -> None:
    with pytest.raises(JdlError, match="request.requirements"):
        build_jdl(config(), SubmitRequest("wms_glite", requirements=expression))


def test_semicolon_inside_a_string_literal_is_fine() -> None:
    assert check_expression('other.Name == "a;b\\"c"') == 'other.Name == "a;b\\"c"'


def test_parametric_jdl_for_bulk_requests() -> None:
    attrs = attributes(build_jdl(config(), SubmitRequest("wms_glite", count=5)))
    assert attrs["JobType"] == '"Parametric"'
    assert (attrs["Parameters"], attrs["ParameterStep"], attrs["ParameterStart"]) == ("5", "1", "0")


def test_extra_attributes_and_request_attributes() -> None:
    section = config(
        extra_attributes={
            "MyProxyServer": "myproxy.cern.ch",
            "CPUTime": 3600,
            "PerusalFileEnable": False,
            "DataRequirements": ["a", 1],
        }
    )
    attrs = attributes(build_jdl(section, SubmitRequest("wms_glite", attributes={"CPUTime": 60})))
    assert attrs["MyProxyServer"] == '"myproxy.cern.ch"'
    assert attrs["CPUTime"] == "60"
    assert attrs["PerusalFileEnable"] == "false"
    assert attrs["DataRequirements"] == '{ "a", 1 }'


@pytest.mark.parametrize("name", ["Bad Name", "x;y", "Executable", "requirements"])
def test_bad_or_reserved_attribute_names_are_refused(name: str) -> None:
    with pytest.raises(JdlError, match="extra_attributes"):
        build_jdl(config(), SubmitRequest("wms_glite", attributes={name: "v"}))
