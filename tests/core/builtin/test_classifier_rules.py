"""The ``rules`` classifier's section: its rules typed, and the rule keys that need another."""

from __future__ import annotations

import pytest

from gridgate.core.builtin.classifier import RuleSettings, compile_rules, match_rules
from gridgate.core.config import ConfigError
from gridgate.core.model import CommandResult, Endpoint, SubmitResult
from gridgate.core.testing import make_config

EP = Endpoint("slurm", "batch")


def _rules(*rules: dict[str, object]) -> dict[str, object]:
    return {"state": {"driver": "memory"}, "classifiers": {"rules": {"rules": list(rules)}}}


def test_a_stream_without_a_pattern_is_a_config_error_naming_both_keys() -> None:
    # stream says where the pattern is searched: without a pattern it validated and did nothing
    with pytest.raises(ConfigError) as caught:
        make_config(_rules({"kind": "quota", "returncode": 3, "stream": "stderr"}))
    assert "classifiers.rules.rules[0].stream: stream is set but pattern is not" in str(
        caught.value
    )


def test_a_bad_pattern_is_named_with_its_rule() -> None:
    with pytest.raises(ConfigError, match=r"rules\[1\]\.pattern: invalid regular expression"):
        make_config(_rules({"kind": "a", "pattern": "x"}, {"kind": "b", "pattern": "("}))


def test_rules_as_written_and_typed_match_alike() -> None:
    written = {"kind": "quota", "pattern": "over quota", "stream": "stderr", "notify": False}
    result = SubmitResult(EP, ok=False, command=CommandResult(("sbatch",), 1, "", "over quota"))
    for rules in ([written], [RuleSettings.of(written)]):
        failure = match_rules(compile_rules(rules), result)
        assert failure is not None and failure.kind == "quota" and not failure.notify
        assert failure.exclude and failure.reason == "over quota"
