"""A token for the CE, a credential for the payload (``auth: token`` with ``payload:
{credential: NAME}``), against the real private CE, driven by a real director: a pilot gets
the payload proxy delegated under the token (A-REX 6.17 takes a delegation from a
token-authenticated client) and finds it where X509_USER_PROXY says, and a poll renews it;
a payload token is uploaded into the session where BEARER_TOKEN_FILE says; an unusable payload
credential holds the backend's submissions and says why. Each pilot writes what it found into
its stdout, which the test reads from the job's session over the CE's REST interface."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from support.polling import until

from gridgate.core.clock import SYSTEM_CLOCK
from gridgate.core.testing import director_for
from gridgate.plugins.arc.rest.jobs import ce_id
from gridgate.plugins.arc.rest.signing import load_arc_csr, read_proxy, sign_request

pytestmark = pytest.mark.xdist_group("arc")

#: Prints where the payload proxy is, its mode, and its end every second for a while: a
#: renewal of the delegation shows as a later end in the same running pilot.
PROXY_PILOT = """#!/bin/sh
PATH=/usr/bin:/bin
echo "proxy=$X509_USER_PROXY"
ls -l "$X509_USER_PROXY" | cut -d' ' -f1
i=0
while [ $i -lt ROUNDS ]; do
  openssl x509 -noout -enddate -in "$X509_USER_PROXY"
  i=$((i + 1))
  [ $i -lt ROUNDS ] && sleep 1
done
exit 0
"""
#: Prints where the payload token is, its mode and its SHA-256 (never the token itself), and
#: whether the proxy file A-REX names is there.
TOKEN_PILOT = """#!/bin/sh
PATH=/usr/bin:/bin
echo "token=$BEARER_TOKEN_FILE"
ls -l "$BEARER_TOKEN_FILE" | cut -d' ' -f1
echo "sha256=$(sha256sum < "$BEARER_TOKEN_FILE" | cut -d' ' -f1)"
if [ -e "$X509_USER_PROXY" ]; then echo proxy=present; else echo proxy=absent; fi
exit 0
"""


def _private(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    path.chmod(0o600)
    return path


class PayloadSite:
    """A director's files: the CE's token, the payload credentials, the pilot script."""

    def __init__(self, ce: Any, folder: Path, pilot: str, rounds: int = 1) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.ce, self.folder = ce, folder
        self.token = _private(folder / "ce.bt", ce.token())
        self.script = folder / "pilot.sh"
        self.script.write_text(pilot.replace("ROUNDS", str(rounds)), encoding="utf-8")
        self.script.chmod(0o755)

    def doc(self, payload: dict[str, Any], *, paused: bool = False) -> dict[str, Any]:
        return {
            "director": {
                "state_dir": str(self.folder / "state"),
                "command_timeout": 60,
                "max_threads": 2,
                "paused": paused,
            },
            # kept across the runs: the second finds the pilot and the delegation's record
            "state": {"driver": "sqlite", "path": str(self.folder / "state.db")},
            "credentials": {
                "ce-token": {"kind": "bearer_token", "path": str(self.token)},
                **payload,
            },
            "backends": {
                "arc": {
                    "interface": "rest",
                    "auth": "token",
                    "credential": "ce-token",
                    "payload": {"credential": next(iter(payload))},
                    "endpoints": [self.ce.url],
                    "script": str(self.script),
                    "keep_on_ce": True,
                    "env": {
                        "X509_CERT_DIR": str(self.ce.certificates),
                        # no proxy for the CE: the token alone reaches it
                        "X509_USER_PROXY": str(self.folder / "none"),
                    },
                    "command_timeout": 60,
                }
            },
            "demand": {"static": {"arc": 1}},
        }

    def run(self, doc: dict[str, Any]) -> Any:
        made = director_for(doc, clock=SYSTEM_CLOCK)
        try:
            return made.run_iteration()
        finally:
            made.close()

    def rest(self, rest: Any, method: str, path: str, body: Any = None) -> Any:
        return rest(self.ce, method, path, self.ce.token(), body)

    def state(self, rest: Any, job: str) -> str:
        answer = self.rest(rest, "POST", "/jobs?action=status", {"job": [{"id": ce_id(job)}]})
        return str(answer.json()["job"]["state"])

    def output(self, rest: Any, job: str) -> str:
        answer = self.rest(rest, "GET", f"/jobs/{ce_id(job)}/session/pilot.out")
        assert answer.status == 200, answer
        return answer.body.decode()

    def clean(self, rest: Any, job: str) -> None:
        self.rest(rest, "POST", "/jobs?action=clean", {"job": [{"id": ce_id(job)}]})


def _submitted(summary: Any) -> list[str]:
    return [j for r in summary.records if r.outcome == "submitted" for j in r.job_ids]


def _ends(out: str) -> list[datetime]:
    return [
        datetime.strptime(line.split("=", 1)[1], "%b %d %H:%M:%S %Y GMT").replace(tzinfo=UTC)
        for line in out.splitlines()
        if line.startswith("notAfter=")
    ]


def test_a_delegation_made_under_a_token_is_taken_and_reaches_the_job(arc, rest) -> None:
    """What A-REX 6.17 does, asked directly: ``POST delegations?action=new`` with only a
    bearer token answers 201 and a certificate request, the PUT of the signed proxy 200, and
    a job created with the token and naming the delegation finds the proxy as
    X509_USER_PROXY (mode 0600, the job's local user)."""
    token = arc.token()
    made = rest(arc, "POST", "/delegations?action=new", token)
    assert (made.status, made.reason) == (201, "Created"), made
    assert made.body.startswith(b"-----BEGIN CERTIFICATE REQUEST-----")
    identifier = made.headers["location"].rsplit("/", 1)[-1]
    pem = sign_request(load_arc_csr(made.body), read_proxy(arc.proxy.read_bytes()))
    context = ssl.create_default_context(capath=str(arc.certificates))
    connection = http.client.HTTPSConnection("localhost", arc.port, context=context, timeout=60)
    try:
        connection.request(
            "PUT",
            f"/arex/rest/1.0/delegations/{identifier}",
            body=pem,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-pem-file"},
        )
        put = connection.getresponse()
        assert (put.status, put.reason, put.read()) == (200, "OK", b"")
    finally:
        connection.close()
    assert rest(arc, "POST", f"/delegations/{identifier}?action=get", token).status == 200
    description = (
        '&(executable="/bin/sh")(arguments="-c" "ls -l $X509_USER_PROXY | cut -d\' \' -f1,3")'
        '(stdout="out")(outputfiles=("out" ""))(jobname="gg-token-delegation")'
        f'(delegationid="{identifier}")'
    )
    created = rest(arc, "POST", "/jobs?action=new", token, description)
    assert created.status == 201, created
    job = created.json()["job"]["id"]

    def final() -> str:
        answer = rest(arc, "POST", "/jobs?action=status", token, {"job": [{"id": job}]})
        state = answer.json()["job"]["state"]
        return state if state in ("FINISHED", "FAILED") else ""

    assert until(final, timeout=180, pause=2) == "FINISHED"
    out = rest(arc, "GET", f"/jobs/{job}/session/out", token).body.decode()
    assert out.strip() == "-rw------- nobody", out
    rest(arc, "POST", "/jobs?action=clean", token, {"job": [{"id": job}]})


def test_a_pilot_gets_the_payload_proxy_delegated_and_a_poll_renews_it(
    arc, rest, tmp_path: Path
) -> None:
    site = PayloadSite(arc, tmp_path / "site", PROXY_PILOT, rounds=30)
    now = datetime.now(UTC)
    proxy = site.folder / "payload.pem"
    arc.make_proxy(proxy, start=now - timedelta(minutes=5), end=now + timedelta(hours=2))
    first_end = read_proxy(proxy.read_bytes()).not_after
    payload = {"payload-proxy": {"kind": "x509_proxy", "path": str(proxy)}}
    summary = site.run(site.doc(payload))
    (job,) = _submitted(summary)
    description = (arc.folder / "control" / f"job.{ce_id(job)}.description").read_text()
    assert "delegationid" in description and "payload.token" not in description
    (identifier,) = re.findall(r'delegationid\s*=\s*"([^"]+)"', description)
    assert until(lambda: site.state(rest, job) == "RUNNING", timeout=120, pause=1)
    # the payload proxy renewed (what its renew command does): a later end; a poll of the
    # paused director renews the delegation on the CE under the token
    arc.make_proxy(proxy, start=now - timedelta(minutes=5), end=now + timedelta(hours=20))
    site.run(site.doc(payload, paused=True))
    held = site.rest(rest, "POST", f"/delegations/{identifier}?action=get")
    assert held.status == 200, held
    renewed = x509.load_pem_x509_certificate(held.body).not_valid_after_utc
    assert renewed > now + timedelta(hours=19), "the CE's delegation holds the renewed proxy"
    assert until(lambda: site.state(rest, job) == "FINISHED", timeout=180, pause=2)
    out = site.output(rest, job)
    lines = out.splitlines()
    assert lines[0].startswith("proxy=/") and lines[0].endswith(".proxy"), out
    assert lines[1] == "-rw-------", out
    ends = _ends(out)
    assert ends and ends[0].timestamp() == pytest.approx(first_end, abs=1), out
    # a renewal reaches no job A-REX has accepted already (the same under auth: x509:
    # test_a_renewal_reaches_no_job_already_accepted); docs/arc.md says so
    assert ends[-1] == ends[0], out
    site.clean(rest, job)


def test_a_pilot_gets_the_payload_token_in_its_session(arc, rest, tmp_path: Path) -> None:
    site = PayloadSite(arc, tmp_path / "site", TOKEN_PILOT)
    # a token of its own for the payload: another subject, another audience and scope
    text = arc.issuer.token(sub="payload", aud="https://tasks.example.org", scope="tasks.read")
    token = _private(site.folder / "payload.bt", text)
    payload = {"payload-token": {"kind": "bearer_token", "path": str(token)}}
    (job,) = _submitted(site.run(site.doc(payload)))
    description = (arc.folder / "control" / f"job.{ce_id(job)}.description").read_text()
    assert "delegationid" not in description, "no proxy, no delegation"
    assert until(lambda: site.state(rest, job) == "FINISHED", timeout=180, pause=2)
    out = site.output(rest, job).splitlines()
    assert out[0] == "token=payload.token", out  # relative to the session, the job's folder
    assert out[1] == "-rw-------", out
    assert out[2] == "sha256=" + hashlib.sha256(text.encode() + b"\n").hexdigest(), out
    # A-REX names a proxy file in every job's X509_USER_PROXY; without a delegation, none is
    assert out[3] == "proxy=absent", out
    site.clean(rest, job)


def test_an_unusable_payload_credential_holds_the_submissions_and_says_why(
    arc, rest, tmp_path: Path
) -> None:
    site = PayloadSite(arc, tmp_path / "site", PROXY_PILOT)
    now = datetime.now(UTC)
    proxy = site.folder / "payload.pem"
    arc.make_proxy(proxy, start=now - timedelta(hours=3), end=now - timedelta(hours=1))
    payload = {"payload-proxy": {"kind": "x509_proxy", "path": str(proxy)}}
    before = rest(arc, "GET", "/jobs", arc.token()).body
    summary = site.run(site.doc(payload))
    assert _submitted(summary) == []
    assert {r.outcome for r in summary.records} == {"skipped"}, summary.records
    assert {r.failure_kind for r in summary.records} == {"credential"}, summary.records
    assert dict(summary.credential_users) == {"payload-proxy": ("arc",)}
    assert rest(arc, "GET", "/jobs", arc.token()).body == before, "nothing was created"
    assert x509.load_pem_x509_certificate(proxy.read_bytes()).not_valid_after_utc < now


class Asker:
    """Calls to the CE's REST interface with a bearer token (``auth: token``) or with the
    pilot's proxy as client certificate (``auth: x509``)."""

    def __init__(self, ce: Any, auth: str) -> None:
        self.ce, self.auth = ce, auth
        self.context = ssl.create_default_context(capath=str(ce.certificates))
        if auth == "x509":
            self.context.load_cert_chain(str(ce.proxy))
        self.token = ce.token() if auth == "token" else ""

    def call(
        self, method: str, path: str, body: bytes | None = None, kind: str = "application/json"
    ) -> tuple[int, bytes, dict[str, str]]:
        headers = {"Accept": "application/json", "Content-Type": kind}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        connection = http.client.HTTPSConnection(
            "localhost", self.ce.port, context=self.context, timeout=60
        )
        try:
            connection.request(method, f"/arex/rest/1.0{path}", body=body, headers=headers)
            answer = connection.getresponse()
            return answer.status, answer.read(), {k.lower(): v for k, v in answer.getheaders()}
        finally:
            connection.close()

    def sign(self, request: bytes, proxy: Path) -> bytes:
        return sign_request(load_arc_csr(request), read_proxy(proxy.read_bytes()))

    def state(self, job: str) -> str:
        body = json.dumps({"job": [{"id": job}]}).encode()
        return str(json.loads(self.call("POST", "/jobs?action=status", body)[1])["job"]["state"])


@pytest.mark.parametrize("auth", ["token", "x509"])
def test_a_renewal_reaches_no_job_already_accepted(arc, auth: str, tmp_path: Path) -> None:
    """What reaches the jobs when a delegation is renewed (POST action=renew + PUT), the same
    under either authentication: the CE's delegation holds the new proxy, and A-REX 6.17
    leaves ``control/job.ID.proxy`` as it was for a job past its acceptance, waiting for its
    input (``PREPARING``) or ``RUNNING``: a job takes the delegation's proxy when it is
    accepted, not later (watched for 15 s after the PUT)."""
    ce = Asker(arc, auth)
    now = datetime.now(UTC)
    proxy = tmp_path / "payload.pem"
    arc.make_proxy(proxy, start=now - timedelta(minutes=5), end=now + timedelta(hours=2))
    status, request, headers = ce.call("POST", "/delegations?action=new")
    assert status == 201, (status, request)
    identifier = headers["location"].rsplit("/", 1)[-1]
    assert ce.call("PUT", f"/delegations/{identifier}", ce.sign(request, proxy))[0] == 200
    jobs = {}
    for which, inputs in (("running", ""), ("waiting", '(inputfiles=("go" ""))')):
        description = (
            f'&(executable="/bin/sh")(arguments="-c" "sleep 60")(jobname="gg-renew-{which}")'
            f'(delegationid="{identifier}"){inputs}'
        )
        status, body, _ = ce.call(
            "POST", "/jobs?action=new", description.encode(), "application/rsl"
        )
        assert status == 201, body
        jobs[which] = json.loads(body)["job"]["id"]
    assert until(lambda: ce.state(jobs["running"]) == "RUNNING", timeout=120, pause=1)
    assert ce.state(jobs["waiting"]) in ("ACCEPTED", "PREPARING")  # its input not given

    def end(job: str) -> datetime:
        data = (arc.folder / "control" / f"job.{job}.proxy").read_bytes()
        return x509.load_pem_x509_certificate(data).not_valid_after_utc

    before = {which: end(job) for which, job in jobs.items()}
    arc.make_proxy(proxy, start=now - timedelta(minutes=5), end=now + timedelta(hours=20))
    status, request, _ = ce.call("POST", f"/delegations/{identifier}?action=renew")
    assert status == 201, (status, request)
    assert ce.call("PUT", f"/delegations/{identifier}", ce.sign(request, proxy))[0] == 200
    held = ce.call("POST", f"/delegations/{identifier}?action=get")[1]
    assert x509.load_pem_x509_certificate(held).not_valid_after_utc > now + timedelta(hours=19)
    changed = until(
        lambda: any(end(job) != before[which] for which, job in jobs.items()), timeout=15, pause=1
    )
    assert not changed, {which: end(job) for which, job in jobs.items()}
    assert ce.state(jobs["running"]) == "RUNNING"
    listed = json.dumps({"job": [{"id": j} for j in jobs.values()]}).encode()
    ce.call("POST", "/jobs?action=kill", listed)
    # A-REX takes the clean of a job being killed, and deletes it once it is
    ce.call("POST", "/jobs?action=clean", listed)
