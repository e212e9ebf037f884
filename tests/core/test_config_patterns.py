"""A schema ``pattern`` anchored with ``$`` means the end of the text, as JSON Schema (ECMA-262)
says, not "before a final newline" as Python's ``re`` reads it: ``"evil\\n"`` is refused
wherever a pattern checks a name (issue 21, item 16)."""

from __future__ import annotations

import pytest

from gridgate.core.config import ConfigError, schema_problems, strict_pattern, validate_document
from gridgate.core.testing import section_for
from gridgate.plugins.notify_email.notifier import EmailNotifier
from gridgate.plugins.wms_glite.backend import GliteBackend


@pytest.mark.parametrize(
    ("pattern", "text", "ok"),
    [
        ("^[a-z]+$", "abc", True),
        ("^[a-z]+$", "abc\n", False),
        ("^a$|^b$", "b\n", False),
        ("^[$]x$", "$x", True),
        (r"^a\$$", "a$", True),
        ("^https?://", "https://x\n", True),
    ],
)
def test_strict_pattern_anchors_dollar_at_the_very_end(pattern, text, ok) -> None:
    assert bool(strict_pattern(pattern).search(text)) is ok


def test_a_schema_pattern_refuses_a_trailing_newline() -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}},
        "propertyNames": {"pattern": "^[a-z]+$"},
    }
    assert schema_problems(schema, {"name": "ok"}) == []
    assert schema_problems(schema, {"name": "evil\n"})
    assert schema_problems(schema, {"evil\n": "ok"})


def test_an_email_address_with_a_trailing_newline_is_refused() -> None:
    good = {"host": "localhost", "from": "g@example.org", "error_address": "ops@example.org"}
    section_for(EmailNotifier, good)
    with pytest.raises(ConfigError):
        section_for(EmailNotifier, {**good, "error_address": "ops@example.org\n"})


def test_a_jdl_attribute_name_with_a_trailing_newline_cannot_replace_executable() -> None:
    # "Executable\n" is not Executable to the reserved-name check, yet the JDL parser reads it
    # as Executable: the pilot would be replaced
    with pytest.raises(ConfigError):
        section_for(
            GliteBackend,
            {"servers": ["wms01.example.org"], "extra_attributes": {"Executable\n": "/bin/evil"}},
        )


def test_the_director_kind_pattern_refuses_a_trailing_newline() -> None:
    doc = {
        "state": {"driver": "memory"},
        "demand": {"static": {"x": 1}},
        "classifiers": {"rules": {"rules": [{"pattern": "x", "kind": "oops"}]}},
    }
    validate_document(doc)
    doc["classifiers"]["rules"]["rules"][0]["kind"] = "oops\n"
    with pytest.raises(ConfigError):
        validate_document(doc)
