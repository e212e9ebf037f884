"""The payload credential of ``auth: token`` pilots without a CE: what a job's description
declares for it, and what the backend reads through the named credential's plugin (a token
file, its end; a name of another kind; a missing file), each problem classified as
``credential``, a local fault. The CE's side is tests/plugins/arc/rest/test_rest_payload.py."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

from gridgate.core.config import load_config
from gridgate.core.engine.loader import build_plugin_manager
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.plugins import PluginContext
from gridgate.core.testing import build_plugin
from gridgate.plugins.arc.backend import CE, ArcBackend
from gridgate.plugins.arc.classify import classify_rest
from gridgate.plugins.arc.rest.payload import TOKEN_FILE, PayloadSource

BASE = {"endpoints": ["https://ce.example.org/arex"], "script": "/p.sh"}


def _jwt(exp: float) -> str:
    def part(doc: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part({'sub': 'payload', 'exp': int(exp)})}.sig"


def test_an_uploaded_token_is_an_input_and_named_in_the_environment(tmp_path: Path) -> None:
    backend = build_plugin(ArcBackend, {**BASE, "xrsl": {"environment": ["SITE", "yes"]}})
    ce = CE(Endpoint("arc", "ce.example.org"), "", tmp_path)
    text = backend._descriptions.description(
        ce,
        SubmitRequest("arc"),
        name="gridgate-pilot-1",
        uploads=[TOKEN_FILE],
        environment=[("BEARER_TOKEN_FILE", TOKEN_FILE)],
    )
    assert '(inputfiles=("p.sh" "") ("payload.token" ""))' in text
    # the site's own pair kept, ours after it, in one attribute
    assert '(environment=("SITE" "yes") ("BEARER_TOKEN_FILE" "payload.token"))' in text
    assert text.count("environment") == 1


@pytest.fixture
def site(tmp_path: Path):
    (tmp_path / "site.yaml").write_text(
        "credentials:\n"
        "  ce-token: {kind: bearer_token, path: ce.bt}\n"
        "  tasks-token: {kind: bearer_token, path: tasks.bt}\n"
        "  lhcb-proxy: {kind: x509_proxy, path: lhcb.pem}\n",
        encoding="utf-8",
    )
    config = load_config(tmp_path / "site.yaml")
    context = PluginContext(config=config, config_path=config.path)
    _pm, instances = build_plugin_manager(config, context)
    yield tmp_path, context
    for instance in instances:
        getattr(instance, "close", lambda: None)()


def _never(path: str):
    raise AssertionError(f"no proxy is read here: {path}")


def test_a_token_is_read_through_its_plugin_and_ends(site) -> None:
    folder, context = site
    token = folder / "tasks.bt"
    token.write_text(_jwt(time.time() + 3600) + "\n", encoding="utf-8")
    token.chmod(0o600)
    source = PayloadSource("tasks-token", context, _never)
    payload = source.read()
    assert payload is not None and not payload.problem and payload.kind == "token"
    assert payload.files() == {TOKEN_FILE: token.read_bytes()}
    assert payload.environment() == [("BEARER_TOKEN_FILE", TOKEN_FILE)]
    token.write_text(_jwt(time.time() - 60), encoding="utf-8")
    expired = source.read()
    assert expired is not None and expired.problem.startswith("Payload credential tasks-token:")
    assert "ended at" in expired.problem and expired.files() == {}


def test_a_missing_file_and_an_unknown_name_are_problems_of_the_credential(site) -> None:
    _folder, context = site
    missing = PayloadSource("lhcb-proxy", context, _never).read()
    assert missing is not None and "lhcb.pem" in missing.problem, missing
    unknown = PayloadSource("nobody", context, _never).read()
    assert unknown is not None and "is not a loaded x509_proxy or bearer_token" in unknown.problem
    assert PayloadSource("", context, _never).read() is None
    failure = classify_rest(None, missing.problem)
    assert (failure.kind, failure.local, failure.exclude) == ("credential", True, False)
