"""Private ARC CEs for the ARC tests (gridgate.plugins.arc.ce), and a small ARC client.

``arc_ce`` (fork LRMS, with its own token issuer: bearer tokens accepted) and ``arc_ce_slurm``
(over the suite's ``slurm_cluster``, X.509 only) are started on first use, one of each per test
process (xdist worker), and stopped at the end of the session. A CE that cannot start fails the
tests that need it, never skips them. Tests that stop the fork CE (``stop_service``) ask for
``arc``, which starts it again first. ``other_issuer`` is a second token issuer (another key,
another URL, a certificate from the same test CA) whose tokens the CE must refuse.
``token_issuer`` is a token issuer with a CA of its own and no CE at all, served from this
process, for the tests of its token endpoint and of the clients that use it.
``audience_ces`` are two more fork CEs (a module's), each with its own issuer, that admit only
the tokens whose audience is their own URL.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.notifiers import logs  # noqa: F401 - a fixture: every line logged
from support.polling import until
from support.ports import free_port

from gridgate.core.model import CommandResult
from gridgate.core.runner import run

#: The PATH of every client call the tests make: never the machine's own.
CLIENT_PATH = "/usr/bin:/bin"
FINAL_STATES = frozenset({"Finished", "Failed", "Killed", "Deleted"})
REST = "/arex/rest/1.0"
_SUBMITTED = re.compile(r"Job submitted with jobid: (\S+)")


def _start(ce):
    from gridgate.plugins.arc.ce import CEError

    try:
        ce.start()
    except CEError as exc:
        ce.stop()
        pytest.fail(str(exc), pytrace=False)
    return ce


@pytest.fixture(scope="session")
def arc_ce():
    """One fork-LRMS ARC CE per test process, started on first use."""
    from gridgate.plugins.arc.ce import ArcCE

    ce = _start(ArcCE())
    try:
        yield ce
    finally:
        ce.stop()


@pytest.fixture(scope="session")
def arc_ce_slurm(slurm_cluster):
    """One ARC CE per test process whose LRMS is the session's private Slurm cluster."""
    from gridgate.plugins.arc.ce import ArcCE

    # no token issuer: this CE is the one that shows a CE without bearer tokens
    ce = _start(ArcCE(lrms="slurm", slurm_conf=slurm_cluster.conf, tokens=False))
    try:
        yield ce
    finally:
        ce.stop()


@pytest.fixture
def arc(arc_ce):
    """The session's fork CE, running (started again if a test stopped it)."""
    return _start(arc_ce)


@pytest.fixture(scope="module")
def audience_ces():
    """Two fork CEs that check the audience (``ArcCE(audience=True)``: a token's ``aud`` must
    be the CE's ``own_audience``, ``https://localhost:PORT``), started for the module."""
    from gridgate.plugins.arc.ce import ArcCE

    started = []
    try:
        for _ in range(2):
            started.append(_start(ArcCE(audience=True)))
        yield tuple(started)
    finally:
        for ce in started:
            ce.stop()


@pytest.fixture(scope="session")
def other_issuer(arc_ce, tmp_path_factory):
    """A second token issuer, served over https on loopback from this process: its own key and
    URL, its TLS certificate from the CE's test CA (so A-REX can fetch its keys and check its
    tokens' signatures). The CE's authgroup names only the CE's own issuer."""
    from gridgate.plugins.arc.issuer import Issuer, IssuerServer

    _start(arc_ce)  # the test CA exists
    folder = tmp_path_factory.mktemp("other-issuer")
    issuer = Issuer.create(
        folder, f"https://localhost:{free_port()}", ca_cert=arc_ce.ca_cert, ca_key=arc_ce.ca_key
    )
    server = IssuerServer(issuer, log=folder / "requests.log").start()
    try:
        yield server
    finally:
        server.stop()


def make_test_ca(folder: Path) -> tuple[Path, Path]:
    """A self-signed CA (certificate and key, PEM files in ``folder``) for a token issuer's
    TLS certificate, and a hashed CA folder (``folder/certificates``) that trusts it."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gridgate-test"),
            x509.NameAttribute(NameOID.COMMON_NAME, "issuer test CA"),
        ]
    )
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    ca_cert, ca_key = folder / "ca-cert.pem", folder / "ca-key.pem"
    ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    hashed = folder / "certificates"
    hashed.mkdir()
    found = run(["openssl", "x509", "-hash", "-noout", "-in", str(ca_cert)], 30)
    assert found.ok, found.stderr
    (hashed / f"{found.stdout.strip()}.0").write_bytes(ca_cert.read_bytes())
    return ca_cert, hashed


@dataclass
class ServedIssuer:
    """A token issuer being served: ``server.token_fault`` makes its token endpoint misbehave;
    ``ca_path`` trusts its certificate; ``log`` gets a line per request."""

    issuer: Any
    server: Any
    ca_path: Path
    log: Path

    @property
    def url(self) -> str:
        return str(self.issuer.url)


@pytest.fixture
def token_issuer(tmp_path_factory):
    """A token issuer served over https on ``localhost`` from this process (its documents and
    its token endpoint), its TLS certificate from a CA of its own; ``.ca_path`` is a hashed CA
    folder that trusts it. No client is registered."""
    from gridgate.plugins.arc.issuer import Issuer, IssuerServer

    folder = tmp_path_factory.mktemp("token-issuer")
    ca_cert, hashed = make_test_ca(folder)
    issuer = Issuer.create(
        folder / "issuer",
        f"https://localhost:{free_port()}",
        ca_cert=ca_cert,
        ca_key=folder / "ca-key.pem",
    )
    server = IssuerServer(issuer, log=folder / "requests.log").start()
    try:
        yield ServedIssuer(issuer, server, hashed, folder / "requests.log")
    finally:
        server.stop()


class ArcClient:
    """One ARC client identity against one CE: its own job list and client.conf (``-z``),
    an environment the test builds (PATH, HOME and the credentials' X509_* only), and
    optionally another unix user (``as_user``: a setpriv prefix)."""

    def __init__(
        self, ce, home: Path, *, creds: Mapping[str, str] | None = None, as_user: Sequence[str] = ()
    ) -> None:
        self.ce = ce
        self.vars = dict(creds if creds is not None else ce.env)
        self.home = home
        self.as_user = list(as_user)
        self.joblist = self.vars["ARC_CE_JOBLIST"]
        self.client_conf = self.vars["ARC_CE_CLIENT_CONF"]

    @property
    def env(self) -> dict[str, str]:
        keep = ("X509_USER_PROXY", "X509_USER_CERT", "X509_USER_KEY", "X509_CERT_DIR")
        return {
            "PATH": CLIENT_PATH,
            "HOME": str(self.home),
            "LC_ALL": "C",
            **{k: self.vars[k] for k in keep},
        }

    def run(self, command: str, *args: str, timeout: float = 90.0) -> CommandResult:
        """``command -z CLIENT_CONF [-j JOBLIST] ARGS...`` (arcinfo and arcproxy take no -j)."""
        argv = [command, "-z", self.client_conf]
        if command not in ("arcinfo", "arcproxy"):
            argv += ["-j", self.joblist]
        return run([*self.as_user, *argv, *args], timeout, env=self.env, cwd="/")

    def submit(self, *descriptions: str, options: Sequence[str] = ()) -> list[str]:
        """Submit each xRSL string over REST (one arcsub each); return the job ids.
        ``options`` go to arcsub (``-Q NONE``: no info query, no brokering)."""
        ids = []
        for text in descriptions:
            result = self.run("arcsub", "-C", self.ce.url, "-T", "arcrest", *options, "-e", text)
            found = _SUBMITTED.findall(result.stdout)
            assert result.ok and len(found) == 1, (result.describe(), result.stdout, result.stderr)
            ids += found
        return ids

    def status(self, ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """arcstat of ``ids``: id -> {"State": ..., "Exit Code": ..., ...} (jobs it reported)."""
        result = self.run("arcstat", *ids)
        jobs: dict[str, dict[str, str]] = {}
        current: dict[str, str] | None = None
        for line in result.stdout.splitlines():
            if line.startswith("Job: "):
                current = jobs.setdefault(line[5:].strip(), {})
            elif current is not None and line.startswith(" ") and ":" in line:
                key, value = line.strip().split(":", 1)
                current[key.strip()] = value.strip()
        return jobs

    def wait_final(self, ids: Sequence[str], timeout: float = 180.0) -> dict[str, dict[str, str]]:
        """Poll arcstat (every 2 s) until every job is in a final state, or ``timeout``."""
        last: dict[str, dict[str, str]] = {}

        def final() -> bool:
            last.update(self.status(ids))
            return all(last.get(i, {}).get("State") in FINAL_STATES for i in ids)

        until(final, timeout=timeout, pause=2.0)
        return last

    def wait_state(
        self, ids: Sequence[str], state: str, timeout: float = 120.0
    ) -> dict[str, dict[str, str]]:
        last: dict[str, dict[str, str]] = {}

        def reached() -> bool:
            last.update(self.status(ids))
            return all(last.get(i, {}).get("State") == state for i in ids)

        until(reached, timeout=timeout, pause=1.0)
        return last


@dataclass(frozen=True)
class RestAnswer:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def rest_call(ce, method: str, path: str, token: str | None, body: Any = None) -> RestAnswer:
    """One request to the CE's REST interface (``path`` after /arex/rest/1.0) with
    ``Authorization: Bearer TOKEN`` (none when None), TLS verified against the CE's CA folder,
    no client certificate. ``body``: an xRSL string, or JSON for the management calls."""
    context = ssl.create_default_context(capath=str(ce.certificates))
    connection = http.client.HTTPSConnection("localhost", ce.port, context=context, timeout=60)
    headers = {"Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if isinstance(body, str):
        data, headers["Content-Type"] = body.encode(), "application/rsl"
    elif body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    try:
        connection.request(method, REST + path, body=data, headers=headers)
        response = connection.getresponse()
        return RestAnswer(
            response.status,
            response.reason,
            {k.lower(): v for k, v in response.getheaders()},
            response.read(),
        )
    finally:
        connection.close()


@pytest.fixture
def rest():
    """``rest(ce, method, path, token, body=None)``: :func:`rest_call`, a :class:`RestAnswer`."""
    return rest_call


def job_processes(folder: Path) -> list[str]:
    """Live processes of the CE in ``folder``: cwd inside it (payloads, helpers), or a command
    line naming something in it (arched, its scripts), as "pid cmdline" lines."""
    found = []
    mark = str(folder)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = str(Path(f"/proc/{entry.name}/cwd").readlink())
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (cwd == mark or cwd.startswith(mark + "/") or mark + "/" in cmdline):
            found.append(f"{entry.name} {cmdline}")
    return found


@pytest.fixture
def arc_client(tmp_path):
    """``arc_client(ce, creds=None, as_user=())``: an :class:`ArcClient` of ``ce`` whose HOME
    is the test's own (an empty folder that no ARC call may write to)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)

    def make(
        ce,
        *,
        creds: Mapping[str, str] | None = None,
        as_user: Sequence[str] = (),
        home: Path = home,
    ) -> ArcClient:
        return ArcClient(ce, home, creds=creds, as_user=as_user)

    return make


@pytest.fixture
def ce_processes():
    """``ce_processes(folder)``: the live processes of the CE in ``folder``."""
    return job_processes
