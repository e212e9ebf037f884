"""Named credentials in the config: ``credentials: {NAME: {kind: PLUGIN, ...}}`` beside the form
named after the kind, ``credential: NAME`` on a backend, an endpoint and a demand group, and the
nearest of them winning (:class:`gridgate.core.credential_names.CredentialChoice`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gridgate.core.builtin.bearer_token import BearerToken
from gridgate.core.builtin.x509_proxy import X509Proxy
from gridgate.core.config import ConfigError, load_config
from gridgate.core.credential_names import (
    PAYLOAD,
    CredentialChoice,
    credentials_in_force,
    running_with,
)
from gridgate.core.engine.loader import build_plugin_manager
from gridgate.core.engine.runtime import Iteration
from gridgate.core.model import BackendInfo, CredentialStatus, Endpoint, IterationInfo
from gridgate.core.plugins import PluginContext

SITE = """\
credentials:
  atlas-token: {kind: bearer_token, path: atlas.token, min_lifetime: 600}
  lhcb-proxy: {kind: x509_proxy, path: lhcb.pem, min_lifetime: 3600}
  x509_proxy: {path: proxy.pem}
backends:
  wms_glite:
    servers: [wms01.example.org, wms02.example.org]
    credential: lhcb-proxy
    endpoint_credentials: {wms02.example.org: x509_proxy}
demand:
  static:
    wms_glite:
      - {group: atlas, pilots: 2, credential: atlas-token}
      - {group: lhcb, pilots: 2}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_named_credentials_and_the_kind_named_form_build_one_plugin_each(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, SITE))
    pm, instances = build_plugin_manager(
        config, PluginContext(config=config, config_path=config.path)
    )
    try:
        built = {p.name: p for p in instances if isinstance(p, (BearerToken, X509Proxy))}
        assert list(built) == ["atlas-token", "lhcb-proxy", "x509_proxy"]
        assert isinstance(built["atlas-token"], BearerToken)
        assert isinstance(built["lhcb-proxy"], X509Proxy)
        assert built["lhcb-proxy"].path == tmp_path / "lhcb.pem"
        assert built["x509_proxy"].path == tmp_path / "proxy.pem"
        assert pm.get_plugin("credentials:lhcb-proxy") is built["lhcb-proxy"]
    finally:
        for instance in instances:
            getattr(instance, "close", lambda: None)()


def test_a_kind_that_does_not_match_its_plugin_is_refused_at_its_line(tmp_path: Path) -> None:
    text = "credentials:\n  x509_proxy:\n    kind: bearer_token\n    path: t\n"
    # an entry named after a kind may still say another kind: the name is only a name
    config = load_config(_write(tmp_path, text))
    assert config["credentials"]["x509_proxy"]["kind"] == "bearer_token"


@pytest.mark.parametrize(
    ("where", "text", "line"),
    [
        (
            "backends.wms_glite.credential",
            SITE.replace("credential: lhcb-proxy", "credential: cms"),
            8,
        ),
        (
            "demand.static.wms_glite[0].credential",
            SITE.replace("credential: atlas-token}", "credential: atlas}"),
            13,
        ),
        (
            "backends.wms_glite.endpoint_credentials.wms02.example.org",
            SITE.replace("{wms02.example.org: x509_proxy}", "{wms02.example.org: proxy}"),
            9,
        ),
    ],
)
def test_a_name_no_entry_has_is_an_error_at_its_line(
    tmp_path: Path, where: str, text: str, line: int
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (problem,) = info.value.problems
    assert (problem.line, ".".join(map(str, problem.path))) == (line, where.replace("[0]", ".0"))
    assert "no credential is named" in problem.message
    assert "atlas-token, lhcb-proxy, x509_proxy" in problem.message


def test_the_nearest_level_naming_a_credential_of_a_kind_wins(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, SITE))
    choice = CredentialChoice.from_config(
        config, {"atlas-token": "token", "lhcb-proxy": "x509", "x509_proxy": "x509"}
    )
    # the backend's own
    assert choice.names("wms_glite", ["x509"], "wms01.example.org") == {"x509": "lhcb-proxy"}
    # the endpoint's beats the backend's
    assert choice.names("wms_glite", ["x509"], "wms02.example.org") == {"x509": "x509_proxy"}
    # the group's beats both, for its kind; the other kind falls back to the nearer levels
    assert choice.names("wms_glite", ["x509", "token"], "wms02.example.org", "atlas-token") == {
        "x509": "x509_proxy",
        "token": "atlas-token",
    }
    # a backend naming none: the first configured of each kind
    assert choice.names("arc", ["x509", "token"]) == {"x509": "lhcb-proxy", "token": "atlas-token"}
    # a kind nothing is configured for: no credential (the command runs unmanaged)
    assert choice.names("arc", ["ssh"]) == {}


def test_an_unusable_credential_pauses_exactly_the_endpoints_and_groups_that_use_it() -> None:
    ce1, ce2 = Endpoint("arc", "ce1"), Endpoint("arc", "ce2")
    info = BackendInfo("arc", (ce1, ce2), credentials=("token",))
    it = Iteration(info=IterationInfo(1, 0.0), failing=set())
    it.choice = CredentialChoice(
        kinds={"atlas-token": "token", "lhcb-token": "token"},
        backends={"arc": "atlas-token"},
        endpoints={("arc", "ce2"): "lhcb-token"},
    )
    it.unusable = {"lhcb-token": CredentialStatus("lhcb-token", "token", usable=False)}
    # ce2 uses lhcb's token: not polled, no pilot of a group without its own credential there
    assert it.pollable(info) == [ce1] and not it.paused(info)
    assert it.credential_block(info, ce2) == "credential" and it.credential_block(info, ce1) == ""
    assert it.waits_for(info, ce2) == ["lhcb-token"]
    assert it.blocked_everywhere(info) == ""
    # a group naming lhcb's token has no endpoint left; one naming atlas's goes on at both
    assert it.blocked_everywhere(info, "lhcb-token") == "credential"
    assert it.credential_block(info, ce2, "atlas-token") == ""
    # atlas's token unusable too: the backend is paused, polls and all
    it.unusable["atlas-token"] = CredentialStatus("atlas-token", "token", usable=False)
    assert it.paused(info) and it.pollable(info) == []
    # a backend that needs no credential never waits for one
    assert not it.paused(BackendInfo("slurm", (Endpoint("slurm", "p"),)))


def test_a_backends_payload_credential_is_waited_for_as_its_own_is() -> None:
    ce1 = Endpoint("arc", "ce1")
    info = BackendInfo("arc", (ce1,), credentials=("token",))
    config = {
        "backends": {"arc": {"credential": "atlas-token", "payload": {"credential": "lhcb-proxy"}}}
    }
    choice = CredentialChoice.from_config(config, {"atlas-token": "token", "lhcb-proxy": "x509"})
    assert choice.names("arc", ["token"], "ce1") == {"token": "atlas-token", PAYLOAD: "lhcb-proxy"}
    assert choice.names("arc", []) == {}, "a backend needing no credential waits for none"
    it = Iteration(info=IterationInfo(1, 0.0), failing=set())
    it.choice = choice
    it.unusable = {"lhcb-proxy": CredentialStatus("lhcb-proxy", "x509", usable=False)}
    # the pilots' payload proxy unusable: no pilot goes without it, and it is named as why
    assert it.waits_for(info, ce1) == ["lhcb-proxy"]
    assert it.blocked_everywhere(info, "atlas-token") == "credential"
    # a command's credential of a kind is never the payload's: it has no kind's key
    assert "x509" not in choice.names("arc", ["token"], "ce1")


def test_credential_env_answers_with_the_credential_in_force_in_this_call(tmp_path: Path) -> None:
    """What a backend's command gets: the first of the kind outside a director's call, the
    named one inside it, in the thread the call was handed to as well."""
    config = load_config(_write(tmp_path, SITE))
    context = PluginContext(config=config, config_path=config.path)
    pm, instances = build_plugin_manager(config, context)
    try:
        proxy = {"X509_USER_PROXY": str(tmp_path / "lhcb.pem")}  # lhcb-proxy: first of x509
        assert context.credential_env("x509") == proxy
        other = {"X509_USER_PROXY": str(tmp_path / "proxy.pem")}
        with credentials_in_force({"x509": "x509_proxy"}):
            assert context.credential_env("x509") == other
            assert context.credential_env("token") == {
                "BEARER_TOKEN_FILE": str(tmp_path / "atlas.token")
            }
        assert context.credential_env("x509", name="x509_proxy") == other
        with ThreadPoolExecutor(1) as pool:
            handed = running_with({"x509": "x509_proxy"}, context.credential_env)
            assert pool.submit(handed, "x509").result() == other
            assert pool.submit(context.credential_env, "x509").result() == proxy
    finally:
        for instance in instances:
            getattr(instance, "close", lambda: None)()


def test_polls_and_cancels_use_the_endpoints_own_credential() -> None:
    ce1, ce2 = Endpoint("arc", "ce1"), Endpoint("arc", "ce2")
    it = Iteration(info=IterationInfo(1, 0.0), failing=set())
    it.infos["arc"] = BackendInfo("arc", (ce1, ce2), credentials=("token",))
    it.choice = CredentialChoice(
        kinds={"atlas-token": "token", "lhcb-token": "token"},
        endpoints={("arc", "ce2"): "lhcb-token"},
    )
    assert it.credentials_of(ce1) == {"token": "atlas-token"}
    assert it.credentials_of(ce2) == {"token": "lhcb-token"}
    assert it.credentials_of(Endpoint("gone", "x")) == {}  # a backend no longer known
