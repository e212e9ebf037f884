"""One formatter for config problems: the testing kit's section_for says exactly what
`gridgate config validate` says, and a oneOf/anyOf names the alternative that almost matched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gridgate.core.config import ConfigError, format_path, schema_problems
from gridgate.core.testing import section_for

GRIDGATE = str(Path(sys.executable).with_name("gridgate"))

ENDPOINTS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string"},
            "cluster": {"type": "string"},
            "partition": {"type": "string"},
        },
    },
}
POLICY = {
    "oneOf": [
        {"type": "string", "enum": ["fifo", "fair"]},
        {
            "type": "object",
            "title": "a weighted policy",
            "additionalProperties": False,
            "required": ["weights"],
            "properties": {
                "weights": {"type": "object", "additionalProperties": {"type": "number"}}
            },
        },
    ]
}


class Sectioned:
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"endpoints": ENDPOINTS, "policy": POLICY},
    }


def messages(section: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        section_for(Sectioned, section)
    return [f"{format_path(p.path)}: {p.message}" for p in caught.value.problems]


def test_section_for_names_the_misspelt_key_and_the_allowed_ones() -> None:
    assert messages({"endpoints": [{"name": "a", "partiton": "debug"}]}) == [
        "endpoints[0].partiton: unknown key (allowed: cluster, name, partition)"
    ]


def test_a_oneof_names_the_alternative_that_almost_matched() -> None:
    assert messages({"policy": {"weigths": {"a": 1}}}) == [
        "policy.weigths: unknown key (allowed: weights) (as alternative 2 of 2, a weighted policy)"
    ]
    assert messages({"policy": "lifo"}) == [
        "policy: 'lifo' is not one of ['fifo', 'fair'] (as alternative 1 of 2, a string)"
    ]


def test_the_command_line_says_the_same_for_a_plugin_section(tmp_path: Path) -> None:
    # the rules classifier's schema: an unknown key inside a list item of a plugin section
    path = tmp_path / "site.yaml"
    path.write_text(
        "classifiers:\n  rules:\n    rules:\n      - kind: quota\n        patern: x\n",
        encoding="utf-8",
    )
    shown = subprocess.run(
        [GRIDGATE, "config", "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 2
    from gridgate.core.builtin.classifier import RuleClassifier

    with pytest.raises(ConfigError) as caught:
        section_for(RuleClassifier, {"rules": [{"kind": "quota", "patern": "x"}]})
    [problem] = caught.value.problems
    # the same words, the command line adding the file, line and the section's place
    assert (
        shown.stderr.strip()
        == f"{path}:5: classifiers.rules.{format_path(problem.path)}: {problem.message}"
    )
    assert problem.message.startswith("unknown key (allowed: ")


def test_schema_problems_is_the_validator_in_gridgates_words() -> None:
    assert schema_problems(
        {"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": "x"}
    ) == [(("n",), "'x' is not of type 'integer'")]
