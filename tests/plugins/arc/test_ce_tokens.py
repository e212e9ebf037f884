"""Bearer tokens on the private ARC CE (A-REX 6.17's REST interface), with http.client and no
client certificate: a token of the CE's own issuer is accepted for the whole life of a job; an
expired token, a token of another issuer and one without ``compute.create`` are refused. Each
test records what A-REX answers (status, reason, body, the CE's log lines): the backend's
failure rules map these to kinds ``credential`` and ``auth`` (docs/arc.md, "Bearer tokens")."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.polling import until

from gridgate.core.builtin.bearer_token import BearerToken
from gridgate.core.clock import SYSTEM_CLOCK
from gridgate.core.runner import run
from gridgate.core.testing import build_plugin
from gridgate.plugins.arc.ce import SYSTEM_CA_DIR
from gridgate.plugins.arc.issuer import COMPUTE_SCOPES

pytestmark = pytest.mark.xdist_group("arc")

REFUSED = "User can't be assigned configuration"
#: What A-REX 6.17 logs (arex-ws.stdout, level INFO) when a request's identity maps to no
#: authgroup: a token that is not valid, or one whose claims match no authtokens rule.
NO_GROUP = [
    "[Arc.ARexGMConfig] [ERROR]",
    "Will not map to 'root' account by default",
    "[Arc.MCC.HTTP] [WARNING]",
    "next element of the chain returned error status",
    f"HTTP Error: 403 {REFUSED}",
]
#: ... and first, for a token it could not validate (expired, bad signature, unknown key).
INVALID = "[Arc.SecHandler] [ERROR]"
INVALID_TEXT = "Failed to create OTokens security attributes"


def jobs(answer) -> list[dict[str, Any]]:
    """The ``job`` entries of an answer (one job is an object, several a list; none, no body)."""
    if not answer.body:
        return []
    found = answer.json()["job"]
    return found if isinstance(found, list) else [found]


def log_after(ce, offset: int, *needles: str, timeout: float = 20.0) -> list[str]:
    """The HTTPS side's log lines after byte ``offset``, once all ``needles`` are in them."""

    def lines() -> list[str]:
        text = ce.log("arex-ws.stdout")[offset:]
        return text.splitlines() if all(n in text for n in needles) else []

    return until(lines, timeout=timeout) or ce.log("arex-ws.stdout")[offset:].splitlines()


def log_size(ce) -> int:
    return len(ce.log("arex-ws.stdout"))


def issuer_requests(ce) -> list[str]:
    return ce.log("issuer.log").splitlines()


def assert_refused(answer) -> None:
    assert (answer.status, answer.reason, answer.body) == (403, REFUSED, b""), answer
    assert answer.headers["content-length"] == "0"


def test_a_token_of_the_ces_issuer_lists_creates_follows_and_cleans_a_job(arc, rest) -> None:
    token = arc.token()  # all compute.* scopes, from the CE's issuer
    asked, offset = len(issuer_requests(arc)), log_size(arc)
    listed = rest(arc, "GET", "/jobs", token)
    assert listed.status == 200 and listed.reason == "OK", listed
    text = "\n".join(log_after(arc, offset, "going for OTokens"))
    assert (
        "[Arc.ARexGMConfig] [ERROR]" in text
        and "TLS provides no identity, going for OTokens" in text
    )
    assert INVALID_TEXT not in text and NO_GROUP[1] not in text, text
    # A-REX fetched the issuer's metadata and keys over https to check the signature
    fetched = issuer_requests(arc)[asked:]
    assert any('/.well-known/openid-configuration HTTP/1.1" 200' in f for f in fetched), fetched
    assert any('/jwks HTTP/1.1" 200' in f for f in fetched), fetched

    created = rest(
        arc, "POST", "/jobs?action=new", token, '&(executable="/bin/true")(jobname="gg-token")'
    )
    assert (created.status, created.reason) == (201, "Created"), created
    (job,) = jobs(created)
    assert (job["status-code"], job["reason"], job["state"]) == ("201", "Created", "ACCEPTING")
    job_id = job["id"]
    assert job_id in [j["id"] for j in jobs(rest(arc, "GET", "/jobs", token))]

    def finished() -> str:
        (entry,) = jobs(rest(arc, "POST", "/jobs?action=status", token, {"job": [{"id": job_id}]}))
        return entry["state"] if entry["state"] in ("FINISHED", "FAILED") else ""

    assert until(finished, timeout=180, pause=2.0) == "FINISHED"
    (info,) = jobs(rest(arc, "POST", "/jobs?action=info", token, {"job": [{"id": job_id}]}))
    activity = info["info_document"]["ComputingActivity"]
    # the job's owner is the token's issuer/subject, mapped like the DN group to nobody
    assert activity["Owner"] == f"{arc.issuer_url}/gridgate-pilot-factory", activity
    assert activity["LocalOwner"] == "nobody"
    (cleaned,) = jobs(rest(arc, "POST", "/jobs?action=clean", token, {"job": [{"id": job_id}]}))
    assert (cleaned["status-code"], cleaned["reason"]) == ("202", "Queued for cleaning"), cleaned

    def gone() -> bool:
        (entry,) = jobs(rest(arc, "POST", "/jobs?action=status", token, {"job": [{"id": job_id}]}))
        return entry["status-code"] == "404"

    assert until(gone, timeout=60, pause=1.0)


def test_an_expired_token_is_refused_with_403_before_its_issuer_is_asked(arc, rest) -> None:
    now = time.time()
    expired = arc.token(start=now - 2 * 3600, lifetime=3600)
    offset, asked = log_size(arc), len(issuer_requests(arc))
    listed = rest(arc, "GET", "/jobs", expired)
    assert_refused(listed)
    created = rest(arc, "POST", "/jobs?action=new", expired, '&(executable="/bin/true")')
    assert_refused(created)
    lines = log_after(arc, offset, NO_GROUP[-1])
    text = "\n".join(lines)
    assert INVALID_TEXT in text and "Connection from 127.0.0.1: (empty)" in text, text
    for needle in NO_GROUP:
        assert needle in text, text
    # exp is checked before the key is fetched: the issuer was not asked
    assert issuer_requests(arc)[asked:] == []


def test_a_token_of_another_issuer_is_refused_though_its_signature_checks_out(
    arc, rest, other_issuer
) -> None:
    token = other_issuer.issuer.token(scope=COMPUTE_SCOPES)
    offset, before = log_size(arc), len(other_issuer.served)
    assert_refused(rest(arc, "GET", "/jobs", token))
    assert_refused(rest(arc, "POST", "/jobs?action=new", token, '&(executable="/bin/true")'))
    # A-REX 6.17 fetches the keys of any https issuer (no list of trusted issuers) and
    # validates the token; only the authgroup, naming the CE's issuer, refuses it
    assert other_issuer.served[before:] == ["/.well-known/openid-configuration", "/jwks"] * 2
    text = "\n".join(log_after(arc, offset, NO_GROUP[-1]))
    assert INVALID_TEXT not in text, text
    for needle in NO_GROUP:
        assert needle in text, text


def test_a_token_without_compute_create_is_refused_even_to_read(arc, rest) -> None:
    token = arc.token(scope="compute.read compute.modify compute.cancel")
    offset = log_size(arc)
    assert_refused(rest(arc, "POST", "/jobs?action=new", token, '&(executable="/bin/true")'))
    # 6.17 has no per-operation scopes: the authgroup admits compute.create tokens only
    assert_refused(rest(arc, "GET", "/jobs", token))
    text = "\n".join(log_after(arc, offset, NO_GROUP[-1]))
    assert INVALID_TEXT not in text and NO_GROUP[1] in text, text


def test_a_request_with_no_credential_at_all_is_refused_the_same_way(arc, rest) -> None:
    offset = log_size(arc)
    assert_refused(rest(arc, "GET", "/jobs", None))
    text = "\n".join(log_after(arc, offset, NO_GROUP[-1]))
    assert INVALID_TEXT in text and NO_GROUP[1] in text, text


def test_only_the_https_arched_sees_the_ces_ca_over_the_system_folder(arc) -> None:
    pid = arc.pids()["arex-ws"]
    ca_hashes = sorted(p.name for p in arc.certificates.glob("*.0"))
    inside = sorted(os.listdir(f"/proc/{pid}/root{SYSTEM_CA_DIR}"))
    assert set(ca_hashes) <= set(inside), inside
    outside = set(os.listdir(SYSTEM_CA_DIR))
    assert not set(ca_hashes) & outside, outside  # the machine's folder is not touched
    grid_manager = arc.pids()["arex"]
    assert not set(ca_hashes) & set(os.listdir(f"/proc/{grid_manager}/root{SYSTEM_CA_DIR}"))
    # the issuer itself: https on loopback, its certificate from the CE's test CA
    context = ssl.create_default_context(capath=str(arc.certificates))
    connection = http.client.HTTPSConnection("localhost", arc.issuer.port, context=context)
    connection.request("GET", "/.well-known/openid-configuration")
    metadata = json.loads(connection.getresponse().read())
    connection.close()
    assert metadata["issuer"] == arc.issuer_url == arc.env["ARC_CE_ISSUER"]
    assert metadata["jwks_uri"] == arc.issuer_url + "/jwks"


def test_the_pilots_token_and_the_issuers_renewal_command_feed_the_bearer_token_plugin(
    arc, rest, tmp_path: Path
) -> None:
    token_file = Path(arc.env["ARC_CE_TOKEN"])
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert arc.token_seconds_left() > 2 * 3600
    # credentials.bearer_token with the issuer's own command as renew: a real renewal
    path = tmp_path / "bt"
    renew = [sys.executable, "-m", "gridgate.plugins.arc.issuer", "token"]
    renew += [arc.env["ARC_CE_ISSUER_DIR"], "--out", str(path), "--lifetime", "1800"]
    plugin = build_plugin(
        BearerToken, {"path": str(path), "renew": renew}, state_dir=tmp_path, clock=SYSTEM_CLOCK
    )
    status = plugin.check(60)
    assert status.usable and status.renewed, status.message
    assert status.expires is not None and 1700 < status.expires - time.time() <= 1800
    # what the backend reads: context.credential_env("token")["BEARER_TOKEN_FILE"]
    handed = Path(plugin.gridgate_credential_env(kind="token")["BEARER_TOKEN_FILE"])
    for file in (handed, token_file):
        assert rest(arc, "GET", "/jobs", file.read_text().strip()).status == 200
    # the CE's env never names BEARER_TOKEN_FILE: ARC 6.17's own client would take it
    assert "BEARER_TOKEN_FILE" not in arc.env and "BEARER_TOKEN" not in arc.env
    hand = run(
        [sys.executable, "-m", "gridgate.plugins.arc.ce", "env", str(arc.folder)],
        60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert hand.ok and f"export ARC_CE_TOKEN={token_file}\n" in hand.stdout, hand.stderr
