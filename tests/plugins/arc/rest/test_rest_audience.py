"""Audience per CE (issue 44), against real private CEs that check it (``ArcCE(audience=True)``:
the authgroup's ``authtokens`` rule names the CE's URL as audience) and their real issuers,
driven by a real director whose tokens are fetched with client credentials (``issuer:``):

- two CEs, one credential each (``endpoint_credentials``), each credential asking its issuer
  for a token of its own CE's audience: each CE creates its pilot, under its own client;
- a token of another audience (another URL, or the CE's URL with a trailing slash) is refused
  by the CE, A-REX 6.17's ``403 User can't be assigned configuration``, and the failure is
  ``auth``: the endpoint is excluded, the credential is not blamed (its issuer gave a token).
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gridgate.core.config import load_config
from gridgate.core.engine.director import Director, summary_json
from gridgate.plugins.arc.rest.jobs import ce_id

pytestmark = pytest.mark.xdist_group("arc")

SCOPE = "compute.create compute.read compute.modify compute.cancel"


def _claims(token: str) -> dict[str, Any]:
    part = token.strip().split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def _joint_cas(folder: Path, ces: Any) -> Path:
    """One CA folder trusting every CE's test CA (each CE makes its own, of one name: the
    certificates go in as HASH.0, HASH.1...), for the director's TLS to both CEs."""
    folder.mkdir()
    for n, ce in enumerate(ces):
        found = subprocess.run(
            ["openssl", "x509", "-hash", "-noout", "-in", str(ce.ca_cert)],
            capture_output=True,
            text=True,
            check=True,
        )
        (folder / f"{found.stdout.strip()}.{n}").write_bytes(ce.ca_cert.read_bytes())
    return folder


def _credential(ce: Any, folder: Path, client: str, audience: str) -> dict[str, Any]:
    """A ``bearer_token`` entry fetching tokens of ``audience`` from ``ce``'s issuer as
    ``client`` (registered there, allowed that audience)."""
    secret = ce.issuer.add_client(client, scopes=SCOPE, audiences=[audience], lifetime=1200)
    secret_file = folder / f"{client}.secret"
    secret_file.write_text(secret + "\n")
    secret_file.chmod(0o600)
    return {
        "kind": "bearer_token",
        "issuer": {
            "url": ce.issuer_url,
            "client_id": client,
            "client_secret": {"file": str(secret_file)},
            "scope": SCOPE,
            "audience": audience,
            "ca_path": str(ce.certificates),
        },
    }


def _director(folder: Path, ces: Any, credentials: dict[str, Any], **arc: Any) -> Director:
    script = folder / "pilot.sh"
    script.write_text("#!/bin/sh\necho pilot\n", encoding="utf-8")
    script.chmod(0o755)
    doc = {
        "director": {
            "state_dir": str(folder / "state"),
            "command_timeout": 60,
            "max_threads": 2,
            "pilots": {"max_waiting": 1},  # one pilot per CE
        },
        "state": {"driver": "sqlite", "path": str(folder / "state" / "state.db")},
        "credentials": credentials,
        "backends": {
            "arc": {
                "interface": "rest",
                "auth": "token",
                "endpoints": [{"url": ce.url, "name": f"ce{n}"} for n, ce in enumerate(ces, 1)],
                "script": str(script),
                "env": {"X509_CERT_DIR": str(_joint_cas(folder / "cas", ces))},
                **arc,
            }
        },
        "demand": {"static": {"arc": len(ces)}},
    }
    site = folder / "site.yaml"
    site.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return Director(load_config(site))


def _owner(ce: Any, job: str) -> str:
    local = Path(ce.folder, "control", f"job.{ce_id(job)}.local").read_text(errors="replace")
    return next(ln.partition("=")[2] for ln in local.splitlines() if ln.startswith("subject="))


def _clean(ce: Any, rest: Any, token: str, job: str) -> None:
    rest(ce, "POST", "/jobs?action=kill", token, {"job": [{"id": ce_id(job)}]})
    rest(ce, "POST", "/jobs?action=clean", token, {"job": [{"id": ce_id(job)}]})


def test_two_ces_each_get_a_token_of_their_own_audience_and_create_the_pilot(
    audience_ces, rest, tmp_path
) -> None:
    ce1, ce2 = audience_ces
    for ce in audience_ces:  # the rule that makes A-REX check it
        rule = f"authtokens = * {ce.issuer_url} {ce.own_audience} compute.create *"
        assert rule in ce.arc_conf.read_text().splitlines()
    credentials = {
        "ce1-token": _credential(ce1, tmp_path, "factory-ce1", ce1.own_audience),
        "ce2-token": _credential(ce2, tmp_path, "factory-ce2", ce2.own_audience),
    }
    director = _director(
        tmp_path,
        audience_ces,
        credentials,
        credential="ce1-token",
        endpoint_credentials={"ce2": "ce2-token"},
    )
    try:
        summary = director.run_iteration()
        sent = {r.endpoint: r.job_ids for r in summary.records if r.outcome == "submitted"}
        assert sorted(sent) == ["ce1", "ce2"], summary_json(summary)
        jobs = {"ce1": sent["ce1"][0], "ce2": sent["ce2"][0]}
        # each CE's job is its own client's: each endpoint was reached with its own token
        assert _owner(ce1, jobs["ce1"]) == f"{ce1.issuer_url}/factory-ce1"
        assert _owner(ce2, jobs["ce2"]) == f"{ce2.issuer_url}/factory-ce2"
        # with a token of its own CE's audience, fetched from that CE's issuer
        for n, ce in ((1, ce1), (2, ce2)):
            kept = director.context.credential_env("token", f"ce{n}-token")["BEARER_TOKEN_FILE"]
            token = Path(kept).read_text().strip()
            claims = _claims(token)
            assert (claims["aud"], claims["iss"]) == (ce.own_audience, ce.issuer_url), claims
            _clean(ce, rest, token, jobs[f"ce{n}"])
    finally:
        director.close()
        for n, ce in ((1, ce1), (2, ce2)):
            ce.issuer.revoke_client(f"factory-ce{n}")


@pytest.mark.parametrize(
    "wrong",
    ["https://ce2.example.org", "{own}/", "{own}/arex"],
    ids=["other-url", "trailing-slash", "endpoint-url"],
)
def test_a_token_of_another_audience_is_refused_by_the_ce_and_is_auth(
    audience_ces, tmp_path, wrong: str
) -> None:
    ce1, _ce2 = audience_ces
    audience = wrong.format(own=ce1.own_audience)
    credentials = {"ce1-token": _credential(ce1, tmp_path, "factory-wrong", audience)}
    director = _director(tmp_path, (ce1,), credentials, credential="ce1-token")
    try:
        before = set(ce1.folder.joinpath("control").glob("job.*.local"))
        summary = director.run_iteration()
        text = summary_json(summary)
        assert [r.outcome for r in summary.records] == ["failed"], text
        assert [r.failure_kind for r in summary.records] == ["auth"], text
        (failure,) = summary.failures
        assert (failure.endpoint, failure.kind) == ("ce1", "auth"), text
        assert summary.excluded == ("arc/ce1",), text  # the CE refused: it is blamed, told once
        (told,) = summary.notifications
        assert (told.level, told.failure.kind if told.failure else "") == ("error", "auth")
        assert "HTTP 403 User can't be assigned configuration" in told.body, told.body
        (status,) = summary.credentials  # the credential is not: its issuer gave a token
        assert status.usable and status.name == "ce1-token", text
        assert set(ce1.folder.joinpath("control").glob("job.*.local")) <= before, "no job"
    finally:
        director.close()
        ce1.issuer.revoke_client("factory-wrong")
