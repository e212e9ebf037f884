"""The private token issuer's token endpoint (plugins/arc/issuer.py) over real https: the OAuth2
client-credentials grant (RFC 6749 4.4) for registered clients, both ways of authenticating a
client, and every refusal as RFC 6749 5.2 words it; clients added and revoked from Python and
from its command line, their secrets never printed nor kept."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import stat
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from gridgate.core.runner import run
from gridgate.plugins.arc.issuer import ANY_AUDIENCE, IssuerError

CE = "https://ce1.example.org"


def post(served, form: dict[str, str], *, basic: tuple[str, str] | None = None, path="/token"):
    """(status, headers, JSON body) of a POST of ``form`` to the issuer over verified https."""
    context = ssl.create_default_context(capath=str(served.ca_path))
    connection = http.client.HTTPSConnection("localhost", served.issuer.port, context=context)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if basic is not None:
        pair = ":".join(urllib.parse.quote_plus(p) for p in basic)
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    try:
        connection.request("POST", path, body=urllib.parse.urlencode(form), headers=headers)
        answer = connection.getresponse()
        return (
            answer.status,
            {k.lower(): v for k, v in answer.getheaders()},
            json.loads(answer.read()),
        )
    finally:
        connection.close()


def get(served, path: str) -> Any:
    context = ssl.create_default_context(capath=str(served.ca_path))
    connection = http.client.HTTPSConnection("localhost", served.issuer.port, context=context)
    try:
        connection.request("GET", path)
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def payload(token: str) -> dict[str, Any]:
    part = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def verify(served, token: str) -> None:
    """The token's RS256 signature checks out with the key of the issuer's JWKS."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    def number(text: str) -> int:
        return int.from_bytes(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)), "big")

    (key,) = get(served, "/jwks")["keys"]
    public = rsa.RSAPublicNumbers(number(key["e"]), number(key["n"])).public_key()
    signed, _, signature = token.rpartition(".")
    public.verify(
        base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)),
        signed.encode(),
        padding.PKCS1v15(),
        hashes.SHA256(),
    )


def test_the_openid_configuration_names_the_token_endpoint_and_what_it_takes(token_issuer):
    metadata = get(token_issuer, "/.well-known/openid-configuration")
    assert metadata["issuer"] == token_issuer.url
    assert metadata["token_endpoint"] == token_issuer.url + "/token"
    assert metadata["grant_types_supported"] == ["client_credentials"]
    assert set(metadata["token_endpoint_auth_methods_supported"]) == {
        "client_secret_basic",
        "client_secret_post",
    }


def test_client_secret_basic_gets_a_signed_wlcg_token_of_the_scope_and_audience_asked(
    token_issuer,
):
    issuer = token_issuer.issuer
    secret = issuer.add_client(
        "factory", scopes="compute.create compute.read", audiences=[CE, ANY_AUDIENCE], lifetime=900
    )
    form = {"grant_type": "client_credentials", "scope": "compute.create", "audience": CE}
    status, headers, body = post(token_issuer, form, basic=("factory", secret))
    assert status == 200, body
    assert headers["cache-control"] == "no-store" and headers["pragma"] == "no-cache"
    assert body["token_type"] == "Bearer" and body["expires_in"] == 900
    assert body["scope"] == "compute.create"
    claims = payload(body["access_token"])
    assert claims["iss"] == token_issuer.url and claims["sub"] == "factory"
    assert claims["aud"] == CE and claims["scope"] == "compute.create"
    assert claims["wlcg.ver"] == "1.0" and claims["exp"] - claims["iat"] == 900
    verify(token_issuer, body["access_token"])


def test_client_secret_post_gets_every_allowed_scope_and_the_first_audience_by_default(
    token_issuer,
):
    secret = token_issuer.issuer.add_client("poster", scopes=["compute.create"], audiences=[CE])
    form = {"grant_type": "client_credentials", "client_id": "poster", "client_secret": secret}
    status, _, body = post(token_issuer, form)
    assert status == 200, body
    claims = payload(body["access_token"])
    assert (claims["scope"], claims["aud"], claims["sub"]) == ("compute.create", CE, "poster")


def test_a_wrong_secret_an_unknown_and_a_revoked_client_are_invalid_client_401(token_issuer):
    issuer = token_issuer.issuer
    secret = issuer.add_client("factory")
    grant = {"grant_type": "client_credentials"}
    status, headers, body = post(token_issuer, grant, basic=("factory", secret + "x"))
    assert (status, body["error"]) == (401, "invalid_client"), body
    assert headers["www-authenticate"].startswith("Basic ")  # RFC 6749 5.2, after Basic
    assert post(token_issuer, grant, basic=("nobody", secret))[2]["error"] == "invalid_client"
    posted = {**grant, "client_id": "factory", "client_secret": "nope"}
    status, headers, body = post(token_issuer, posted)
    assert (status, body["error"]) == (401, "invalid_client") and "www-authenticate" not in headers
    assert post(token_issuer, grant, basic=("factory", secret))[0] == 200
    assert issuer.revoke_client("factory") and not issuer.revoke_client("factory")
    status, _, body = post(token_issuer, grant, basic=("factory", secret))
    assert (status, body["error"]) == (401, "invalid_client")  # the running server knows at once
    assert post(token_issuer, grant)[2]["error"] == "invalid_client"  # no authentication at all


def test_a_scope_or_an_audience_not_allowed_is_refused_and_names_what(token_issuer):
    secret = token_issuer.issuer.add_client("factory", scopes="compute.read", audiences=[CE])
    auth = ("factory", secret)
    form = {"grant_type": "client_credentials", "scope": "compute.read compute.create"}
    status, _, body = post(token_issuer, form, basic=auth)
    assert (status, body["error"]) == (400, "invalid_scope")
    assert body["error_description"] == "scope not allowed: compute.create"
    for name in ("audience", "resource"):  # IAM's name and RFC 8707's
        form = {"grant_type": "client_credentials", name: "https://other.example.org"}
        status, _, body = post(token_issuer, form, basic=auth)
        assert (status, body["error"]) == (400, "invalid_target"), body
        assert "https://other.example.org" in body["error_description"]


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({"grant_type": "password"}, "unsupported_grant_type"),
        ({}, "invalid_request"),
        ({"grant_type": "client_credentials", "client_secret": "s"}, "invalid_request"),
        ({"grant_type": "client_credentials", "audience": CE, "resource": CE}, "invalid_request"),
    ],
    ids=["password-grant", "no-grant-type", "two-authentications", "audience-and-resource"],
)
def test_a_malformed_request_is_refused_with_400_and_rfc_6749_error(token_issuer, form, error):
    secret = token_issuer.issuer.add_client("factory", audiences=[CE])
    status, _, body = post(token_issuer, form, basic=("factory", secret))
    assert (status, body["error"]) == (400, error), body


def test_bad_registrations_are_refused_with_a_clear_error(token_issuer):
    issuer = token_issuer.issuer
    with pytest.raises(IssuerError, match="client id 'a b'"):
        issuer.add_client("a b")
    with pytest.raises(IssuerError, match="scopes"):
        issuer.add_client("ok", scopes=[])
    with pytest.raises(IssuerError, match="audiences"):
        issuer.add_client("ok", audiences=[""])
    with pytest.raises(IssuerError, match="lifetime"):
        issuer.add_client("ok", lifetime=0)
    assert issuer.clients() == {}


def test_the_command_line_adds_and_revokes_a_client_and_never_prints_its_secret(
    token_issuer, tmp_path: Path
):
    folder = str(token_issuer.issuer.folder)
    secret_file = tmp_path / "secrets" / "factory.secret"
    cli = [sys.executable, "-m", "gridgate.plugins.arc.issuer", "client"]
    added = run(
        [*cli, "add", folder, "factory", "--secret-file", str(secret_file)]
        + ["--scope", "compute.create", "--audience", CE, "--lifetime", "600"],
        60,
    )
    assert added.ok, added.stderr
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = secret_file.read_text().strip()
    assert len(secret) >= 32 and secret not in added.stdout + added.stderr
    assert "factory" in added.stderr and str(secret_file) in added.stderr
    status, _, body = post(
        token_issuer, {"grant_type": "client_credentials"}, basic=("factory", secret)
    )
    assert status == 200 and body["expires_in"] == 600
    # what the issuer keeps and logs holds no secret
    kept = Path(folder, "clients.json")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and secret not in kept.read_text()
    assert secret not in token_issuer.log.read_text()
    revoked = run([*cli, "revoke", folder, "factory"], 60)
    assert revoked.ok and "revoked" in revoked.stderr
    assert (
        post(token_issuer, {"grant_type": "client_credentials"}, basic=("factory", secret))[0]
        == 401
    )
    again = run([*cli, "revoke", folder, "factory"], 60)
    assert again.returncode == 1 and "no client factory" in again.stderr
