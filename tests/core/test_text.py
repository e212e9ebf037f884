"""gridgate.core.text: outside text parsed so that every bad document is a ValueError of its
source (issue 31, item 3), and escaped before people read it (issue 31, item 6); and the
members of each class that parse or show outside text."""

from __future__ import annotations

import base64
import json

import pytest

from gridgate.core.text import parse_json, parse_yaml, printable

DEPTH = 200_000
DEEP = "[" * DEPTH + "]" * DEPTH


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def test_json_nested_past_the_recursion_limit_is_a_value_error() -> None:
    with pytest.raises(RecursionError):
        json.loads(DEEP)  # what every parser of outside JSON met
    with pytest.raises(ValueError, match="nested deeper than"):
        parse_json(DEEP)
    with pytest.raises(ValueError, match="nested deeper than"):
        parse_json(DEEP.encode())
    with pytest.raises(ValueError, match="not UTF-8"):
        parse_json(b'{"a": "\xff"}')
    assert parse_json(b'{"a": [1, 2]}') == {"a": [1, 2]}


def test_yaml_nested_past_the_recursion_limit_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nested deeper than"):
        parse_yaml(DEEP)
    assert parse_yaml("a: [1, 2]\n") == {"a": [1, 2]}


def test_the_members_of_the_class_answer_a_deep_document_as_a_bad_answer() -> None:
    from gridgate.core.builtin.bearer_token import claims
    from gridgate.core.credentials import CredentialError
    from gridgate.core.documents import DocumentError
    from gridgate.core.http import Response
    from gridgate.plugins.arc.documents import job_answer
    from gridgate.plugins.arc.rest.interface import token_expired
    from gridgate.plugins.lsf_proxy.client.gateclient import loads
    from gridgate.plugins.lsf_proxy.protocol import decode
    from gridgate.plugins.lsf_proxy.wire import ProtocolError
    from gridgate.plugins.wms_glite.parse import parse_job_ids

    deep = DEEP.encode()
    with pytest.raises(CredentialError, match="not base64url-encoded JSON"):
        claims(_b64(b'{"alg":"none"}') + b"." + _b64(deep) + b".sig")
    assert token_expired(f"e30.{_b64(deep).decode()}.c2ln", now=0.0) is None
    with pytest.raises(DocumentError, match="A-REX job answer"):
        job_answer(deep)
    with pytest.raises(ValueError, match="nested deeper than"):
        Response("GET", "http://ce/rest", 200, "OK", {}, deep).json()
    with pytest.raises(ValueError, match="nested deeper"):
        loads(deep)
    with pytest.raises(ProtocolError, match="nested deeper than"):
        decode(deep)
    # a WMS answer that opens as JSON but nests too deep is read as no JSON (then as text)
    assert parse_job_ids('{"result": "success", "jobs": ' + DEEP + "}") == ()


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J\x1b[Hall good", "\\x1b[2J\\x1b[Hall good"),
        ("bell\x07 back\x08 cr\r del\x7f c1\x9b", "bell\\x07 back\\x08 cr\\x0d del\\x7f c1\\x9b"),
        ("abc\u202edcba", "abc\\u202edcba"),  # RIGHT-TO-LEFT OVERRIDE
        ("x\u2066y\u2069 z\u200bw\ufeff", "x\\u2066y\\u2069 z\\u200bw\\ufeff"),
        ("line\u2028sep", "line\\u2028sep"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("lone \udcff", "lone \\udcff"),
        ("two\nlines\tand a tab, é ü 日本", "two\nlines\tand a tab, é ü 日本"),
    ],
)
def test_printable_escapes_control_format_and_bidi_characters(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_printable_in_one_line_escapes_newlines_too() -> None:
    assert printable("a\nb\tc", newlines=False) == "a\\nb\\tc"
    text = "plain text"
    assert printable(text) is text
