"""Config: composition, line-numbered errors, defaults, reloads and secrets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gridgate.core.commands.app import cli
from gridgate.core.config import (
    ConfigError,
    compose_schema,
    load_config,
    validate_document,
)
from gridgate.core.engine.reload import ConfigSource
from gridgate.core.secrets import SecretError, read_secret

HERE = Path(__file__).parent
BAD = sorted((HERE / "bad_configs").glob("*.yaml"))
BROKEN_DIST = HERE / "fixtures" / "broken_dist"


@pytest.fixture
def broken_plugin_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Puts a distribution on sys.path whose notifier entry point fails to import."""
    monkeypatch.syspath_prepend(str(BROKEN_DIST))


def test_corpus_is_large_enough() -> None:
    assert len(BAD) >= 20


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_config_names_file_line_and_key(path: Path, broken_plugin_installed: None) -> None:
    expect = re.match(r"# expect: (\d+) (\S+)", path.read_text(encoding="utf-8"))
    assert expect, f"{path.name} lacks its '# expect: LINE PATH' header"
    line, key = expect.group(1), expect.group(2)
    result = CliRunner().invoke(cli, ["config", "validate", str(path)])
    assert result.exit_code == 2, result.output
    wanted = f"{path}:{line}: "
    lines = [ln for ln in result.output.splitlines() if ln.startswith(wanted)]
    assert lines, f"no problem reported at {wanted}; got:\n{result.output}"
    if key != "YAML":
        assert any(f": {key}: " in ln for ln in lines), result.output
    else:
        assert any("YAML syntax error" in ln for ln in lines), result.output


def test_every_problem_is_reported_not_just_the_first(write) -> None:
    path = write("two.yaml", "director:\n  max_threads: x\n  cycle_seconds: -1\n  bogus: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    paths = {".".join(map(str, p.path)) for p in info.value.problems}
    assert paths == {"director.max_threads", "director.cycle_seconds", "director.bogus"}
    assert [p.line for p in info.value.problems] == [2, 3, 4]


def test_broken_plugin_message_names_group_name_and_cause(
    write, broken_plugin_installed: None
) -> None:
    path = write("b.yaml", "notifiers:\n  broken_notifier: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert "gridgate.notifiers" in text and "broken_notifier" in text and "libfoo" in text


def test_unknown_plugin_lists_what_is_installed(write) -> None:
    path = write("u.yaml", "notifiers:\n  smoke_signal: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "not installed" in str(info.value) and "log" in str(info.value)


def test_yaml_errors_are_reported_apart_from_schema_errors(write) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write("y.yaml", "director: [\n"))
    assert info.value.kind == "yaml"
    with pytest.raises(ConfigError) as info:
        load_config(write("s.yaml", "director: {max_threads: x}\n"))
    assert info.value.kind == "schema"


def test_defaults_are_filled_and_plugin_sections_may_be_empty(write) -> None:
    config = load_config(write("ok.yaml", "notifiers:\n  log:\nstate:\n  driver: memory\n"))
    assert config.director["cycle_seconds"] == 60
    assert config.director["max_threads"] == 8
    assert config.director["command_timeout"] == 120
    assert config["notifiers"]["log"] == {"body": False}


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_an_empty_file_is_refused_not_a_config_of_defaults(write, text: str) -> None:
    path = write("empty.yaml", text)
    with pytest.raises(ConfigError, match="empty config"):
        load_config(path)
    result = CliRunner().invoke(cli, ["config", "validate", str(path)])
    assert result.exit_code == 2 and f"{path}:1: $: empty config" in result.output


def test_an_emptied_file_is_refused_on_reload_and_the_last_good_config_stays(write) -> None:
    path = write("site.yaml", "director: {cycle_seconds: 5}\n")
    source = ConfigSource(path)
    path.write_text("", encoding="utf-8")
    outcome = source.reload()
    assert not outcome.changed and "empty config" in str(outcome.error)
    assert source.current.director["cycle_seconds"] == 5


def test_example_config_validates() -> None:
    result = CliRunner().invoke(cli, ["config", "example"])
    assert result.exit_code == 0
    doc = result.output
    assert "director:" in doc
    import yaml

    validate_document(yaml.safe_load(doc))


@pytest.mark.parametrize("backend", ["arc", "lsf", "sge", "slurm", "wms_glite"])
def test_each_backends_example_site_validates_and_uses_that_backend(backend, tmp_path) -> None:
    """Issue 42: `config example` was gLite only; an ARC + token + queue site had to be put
    together from three pages. Each backend ships a whole site of its own that validates."""
    import yaml

    from gridgate.core.plugins import CONFIG_GROUPS, entry_point_names

    assert backend in entry_point_names(CONFIG_GROUPS["backends"])
    result = CliRunner().invoke(cli, ["config", "example", "--backend", backend])
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.output)
    assert list(doc["backends"]) == [backend]
    assert {"director", "state", "demand", "notifiers"} <= set(doc)
    path = tmp_path / "site.yaml"
    path.write_text(result.output, encoding="utf-8")
    checked = CliRunner().invoke(cli, ["config", "validate", str(path)])
    assert checked.exit_code == 0, checked.output


def test_an_example_of_a_backend_not_installed_names_those_that_are() -> None:
    result = CliRunner().invoke(cli, ["config", "example", "--backend", "pbs"])
    assert result.exit_code == 2
    assert "not installed" in result.output and "slurm" in result.output


def test_example_config_commented_sections_validate_when_uncommented() -> None:
    import yaml

    text = CliRunner().invoke(cli, ["config", "example"]).output
    lines = []
    for line in text.splitlines():
        # "  # email:" -> "  email:", "# admission:" -> "admission:"; prose comments stay
        # (entry-point names may hold digits: x509_proxy)
        match = re.match(r"^(\s*)# (\s*[a-z_][a-z0-9_]*:.*)$", line)
        lines.append(match.group(1) + match.group(2) if match else line)
    doc = yaml.safe_load("\n".join(lines))
    assert {"email", "ggus"} <= set(doc["notifiers"]) and "lsf_proxy" in doc["admission"]
    assert "x509_proxy" in doc["credentials"]
    validate_document(doc)


def test_examples_folder_validates() -> None:
    paths = sorted((HERE.parent.parent / "examples").glob("*.yaml"))
    assert paths, "examples/ must hold at least one site config"
    for path in paths:
        config = load_config(path)
        assert config["backends"], f"{path.name} configures no backend"


def test_schema_command_prints_composed_schema() -> None:
    result = CliRunner().invoke(cli, ["config", "schema"])
    assert result.exit_code == 0
    assert '"director"' in result.output and "2020-12" in result.output


# --- defaults never make an invalid document valid ---------------------------------------

director_values = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.floats(allow_nan=False, allow_infinity=False, width=16),
    st.text(max_size=3),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)
director_docs = st.dictionaries(
    st.sampled_from(
        [
            "cycle_seconds",
            "max_threads",
            "command_timeout",
            "failing_expiry",
            "ticket_expiry",
            "notify_kinds",
            "metrics_port",
            "state_dir",
            "bogus",
        ]
    ),
    director_values,
    max_size=4,
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "director": director_docs,
        "state": st.fixed_dictionaries({"driver": st.sampled_from(["memory", "sqlite"])}),
        "notifiers": st.just({"log": {"body": True}}),
    },
)


@settings(max_examples=300, deadline=None)
@given(documents)
def test_filling_defaults_never_makes_an_invalid_document_valid(doc: dict) -> None:
    schema, _classes, problems = compose_schema(doc)
    invalid_before = bool(problems) or any(
        True for _ in Draft202012Validator(schema).iter_errors(doc)
    )
    try:
        validate_document(doc)
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted == (not invalid_before)


# --- reloads ---------------------------------------------------------------------------------


def test_config_source_keeps_last_good_config(write) -> None:
    path = write("site.yaml", "director: {max_threads: 4}\n")
    source = ConfigSource(path)
    assert source.reload().changed is False
    path.write_text("director: {max_threads: 6}\n", encoding="utf-8")
    assert source.reload().changed is True
    assert source.current.director["max_threads"] == 6
    path.write_text("director: {max_threads: many}\n", encoding="utf-8")
    outcome = source.reload()
    assert not outcome.changed and outcome.error is not None
    assert "director.max_threads" in str(outcome.error)
    assert source.current.director["max_threads"] == 6
    # the same bad content is reported once, not at every iteration
    assert source.reload().error is None
    path.write_text("director: {max_threads: 2}\n", encoding="utf-8")
    assert source.reload().changed is True
    assert source.current.director["max_threads"] == 2


def test_config_source_survives_a_deleted_file(write) -> None:
    path = write("site.yaml", "director: {max_threads: 4}\n")
    source = ConfigSource(path)
    path.unlink()
    outcome = source.reload()
    assert outcome.error is not None and outcome.error.kind == "io"
    assert source.current.director["max_threads"] == 4


# --- secrets ---------------------------------------------------------------------------------


def test_secret_from_env_and_file(write, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GG_TEST_SECRET", "s3cret")
    assert read_secret({"env": "GG_TEST_SECRET"}) == "s3cret"
    secret = write("pw", "hunter2\n")
    secret.chmod(0o600)
    assert read_secret({"file": str(secret)}) == "hunter2"
    assert read_secret(None) is None


def test_missing_secret_error_never_contains_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GG_ABSENT", raising=False)
    with pytest.raises(SecretError, match="GG_ABSENT is not set"):
        read_secret({"env": "GG_ABSENT"})
    with pytest.raises(SecretError, match="cannot read secret file"):
        read_secret({"file": "/nonexistent/secret"})


def test_inline_secret_is_refused_without_echoing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from gridgate.core.config import validate_document
    from gridgate.core.secrets import SECRET_SCHEMA

    class WithSecret:
        config_schema = {
            "type": "object",
            "properties": {"password": SECRET_SCHEMA},
            "additionalProperties": False,
        }

    import gridgate.core.config as config_module

    original = config_module.load_class
    monkeypatch.setattr(
        config_module,
        "load_class",
        lambda group, name: WithSecret if name == "secretive" else original(group, name),
    )
    with pytest.raises(ConfigError) as info:
        validate_document({"notifiers": {"secretive": {"password": "hunter2-inline"}}})
    assert "hunter2-inline" not in str(info.value)
    assert "notifiers.secretive.password" in str(info.value) and "never inline" in str(info.value)
