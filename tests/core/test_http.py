"""gridgate.core.http against real loopback servers started here, plain and TLS, with
certificates made here: the whole-exchange deadline at every phase, the size cap, keep-alive
and a server closing an idle connection, TLS failures, the client certificate."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.ports import free_port
from support.tcp import silent, trickle_after

from gridgate.core.http import PHASES, HttpClient, HttpError, Response
from gridgate.core.runner import run

#: What a deadline may overshoot by on a loaded 2-core machine (the watcher's wake-up, the
#: thread switch): the tests check that an exchange is cut, not how precisely.
GRACE = 2.0
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


# --- certificates ----------------------------------------------------------------------------


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject, key, issuer, issuer_key, *, ca=False, san=None, client=False):
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in san]), critical=False
        )
    if client:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(*items) -> bytes:
    out = b""
    for item in items:
        if isinstance(item, x509.Certificate):
            out += item.public_bytes(serialization.Encoding.PEM)
        else:
            out += item.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
    return out


class Pki:
    """A CA with its hashed folder, a server certificate for ``localhost`` only, a client
    certificate; and a second CA nobody trusts."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.ca_key = _key()
        self.ca = _cert(_name("test CA"), self.ca_key, _name("test CA"), self.ca_key, ca=True)
        self.capath = folder / "certificates"
        self.capath.mkdir()
        (self.capath / "ca.pem").write_bytes(_pem(self.ca))
        rehash = run(["openssl", "rehash", str(self.capath)], 60)
        assert rehash.ok, rehash.stderr
        key = _key()
        cert = _cert(_name("localhost"), key, self.ca.subject, self.ca_key, san=["localhost"])
        self.server_pem = folder / "server.pem"
        self.server_pem.write_bytes(_pem(cert, key))
        other_key = _key()
        other = _cert(_name("other CA"), other_key, _name("other CA"), other_key, ca=True)
        self.other_capath = folder / "other"
        self.other_capath.mkdir()
        (self.other_capath / "ca.pem").write_bytes(_pem(other))
        assert run(["openssl", "rehash", str(self.other_capath)], 60).ok

    def client_cert(self, path: Path, cn: str) -> Path:
        """A client certificate, its key and the CA in one PEM (as a proxy file is)."""
        key = _key()
        cert = _cert(_name(cn), key, self.ca.subject, self.ca_key, client=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(_pem(cert, key, self.ca))
        tmp.replace(path)
        return path

    def server_context(self, require_client: bool = False) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_pem)
        if require_client:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(capath=str(self.capath))
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


# --- a loopback server (support.tcp) and HTTP handlers ---------------------------------------


def read_request(conn: socket.socket) -> bytes:
    """One request's head and body (by Content-Length), or b"" when the client closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def answering(*answers: bytes, then_close: bool = False, record: list[bytes] | None = None):
    """A handler that answers each request on the connection with the next of ``answers``
    (the last one again when they run out), for as long as the client sends."""

    def handler(conn: socket.socket) -> None:
        count = 0
        while True:
            request = read_request(conn)
            if not request:
                return
            if record is not None:
                record.append(request)
            conn.sendall(answers[min(count, len(answers) - 1)])
            count += 1
            if then_close:
                return

    return handler


def trickle(prefix: bytes, drip: bytes, pause: float = 0.2):
    """A handler that reads the request, sends ``prefix`` at once, then ``drip`` a byte every
    ``pause`` seconds."""
    return trickle_after(prefix, drip, pause, first=read_request)


# --- tests -----------------------------------------------------------------------------------


def test_an_answer_and_its_connection_kept_alive(serve) -> None:
    requests: list[bytes] = []
    server = serve(answering(OK, record=requests))
    with HttpClient() as client:
        answers = [client.request("GET", server.url("/a?b=c"), timeout=10) for _ in range(3)]
    assert [(a.status, a.body, a.header("content-type")) for a in answers] == [
        (200, b"ok", "text/plain")
    ] * 3
    assert isinstance(answers[0], Response) and answers[0].text() == "ok"
    assert server.connections == 1, "one keep-alive connection for the three requests"
    assert requests[0].startswith(b"GET /a?b=c HTTP/1.1\r\n")


def test_a_post_body_and_its_headers_are_sent(serve) -> None:
    requests: list[bytes] = []
    server = serve(
        answering(b'HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\n{"a"', record=requests)
    )
    with HttpClient() as client:
        answer = client.request(
            "post",
            server.url("/jobs?action=new"),
            timeout=10,
            body="&(executable=x)",
            headers={"Content-Type": "application/rsl"},
            expect=(201,),
        )
    assert answer.status == 201 and answer.reason == "Created"
    head, _, body = requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /jobs?action=new HTTP/1.1") and body == b"&(executable=x)"
    assert b"Content-Type: application/rsl" in head and b"Content-Length: 15" in head


@pytest.mark.parametrize(
    ("during", "handler"),
    [
        ("status line and headers", silent),  # accepted, then not a byte
        ("status line and headers", trickle(b"", b"HTTP/1.1 200 OK\r\n" * 4)),
        ("status line and headers", trickle(b"HTTP/1.1 200 OK\r\n", b"X-Slow: " + b"a" * 40)),
        ("body", trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"b" * 100)),
    ],
    ids=["silent", "status-line", "headers", "body"],
)
def test_a_trickling_server_is_cut_at_the_deadline(serve, during, handler) -> None:
    server = serve(handler)
    with HttpClient() as client:
        started = time.monotonic()
        with pytest.raises(HttpError) as caught:
            client.request("GET", server.url(), timeout=1.0)
        elapsed = time.monotonic() - started
    assert caught.value.phase == "timeout" and caught.value.during == during, caught.value
    assert caught.value.sent, "the request had reached the server"
    assert elapsed < 1.0 + GRACE, f"cut after {elapsed:.2f} s, not at the 1 s deadline"
    assert "within 1 s" in str(caught.value)


@pytest.mark.parametrize(
    ("during", "handler"),
    [
        ("status line and headers", silent),  # the handshake done, then not a byte
        ("status line and headers", trickle(b"HTTP/1.1 200 OK\r\n", b"X-Slow: " + b"a" * 40)),
        ("body", trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"b" * 100)),
    ],
    ids=["silent", "headers", "body"],
)
def test_a_trickling_tls_server_is_cut_at_the_deadline(serve, pki, during, handler) -> None:
    server = serve(handler, pki.server_context())
    with HttpClient(ca_path=pki.capath) as client:
        started = time.monotonic()
        with pytest.raises(HttpError) as caught:
            client.request("GET", server.url(), timeout=1.0)
        elapsed = time.monotonic() - started
    assert caught.value.phase == "timeout" and caught.value.during == during, caught.value
    assert elapsed < 1.0 + GRACE, f"cut after {elapsed:.2f} s"


def test_a_tls_handshake_that_never_comes_is_cut_at_the_deadline(serve, pki) -> None:
    server = serve(silent)  # accepts the connection, never answers the ClientHello
    with HttpClient(ca_path=pki.capath) as client:
        started = time.monotonic()
        with pytest.raises(HttpError) as caught:
            client.request("GET", f"https://localhost:{server.port}/", timeout=1.0)
        elapsed = time.monotonic() - started
    assert caught.value.phase == "timeout" and caught.value.during == "TLS handshake"
    assert not caught.value.sent and elapsed < 1.0 + GRACE


def test_the_deadline_is_kept_by_the_processes_one_watcher() -> None:
    """The cut comes from gridgate.core.cutoff's watcher, the one that also guards SMTP and
    Redis: a fresh interpreter whose only exchange was cut runs that thread and no other."""
    code = (
        "import socket, threading\n"
        "from gridgate.core.http import HttpClient, HttpError\n"
        "server = socket.create_server(('127.0.0.1', 0))  # listens, never answers\n"
        "url = f'http://127.0.0.1:{server.getsockname()[1]}/'\n"
        "try:\n"
        "    HttpClient().request('GET', url, timeout=0.5)\n"
        "except HttpError as exc:\n"
        "    print(exc.phase, exc.during)\n"
        "print(sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["timeout status line and headers", "['gridgate-cutoff']"]


def test_connecting_to_nothing_is_a_connect_error(serve) -> None:
    with HttpClient() as client, pytest.raises(HttpError) as caught:
        client.request("GET", f"http://127.0.0.1:{free_port()}/", timeout=5)
    assert caught.value.phase == "connect" and not caught.value.sent
    assert "refused" in caught.value.detail.lower()


def test_a_body_past_the_cap_fails_and_keeps_what_was_read(serve) -> None:
    declared = serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000))
    endless = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"400\r\n"
        + b"y" * 1024
        + b"\r\n"
    )
    chunked = serve(
        answering(endless * 1 + (b"400\r\n" + b"y" * 1024 + b"\r\n") * 8 + b"0\r\n\r\n")
    )
    with HttpClient(max_bytes=1000) as client:
        with pytest.raises(HttpError) as by_length:
            client.request("GET", declared.url(), timeout=10)
        with pytest.raises(HttpError) as by_reading:
            client.request("GET", chunked.url(), timeout=10)
        small = client.request("GET", declared.url(), timeout=10, max_bytes=6000)
    assert by_length.value.phase == "too_large" and "5000 bytes" in by_length.value.detail
    assert by_reading.value.phase == "too_large" and by_reading.value.body == b"y" * 1000
    assert small.body == b"x" * 5000


def test_an_unexpected_status_is_a_status_error_with_the_servers_words(serve) -> None:
    server = serve(
        answering(b"HTTP/1.1 404 Version Not Supported\r\nContent-Length: 4\r\n\r\nnope")
    )
    with HttpClient() as client:
        with pytest.raises(HttpError) as caught:
            client.request("GET", server.url(), timeout=5)
        answer = client.request("GET", server.url(), timeout=5, expect=None)
    error = caught.value
    assert (error.phase, error.status, error.reason, error.body) == (
        "status",
        404,
        "Version Not Supported",
        b"nope",
    )
    assert str(error).endswith("HTTP 404 Version Not Supported")
    assert answer.status == 404 and server.connections == 1, "an error answer keeps the connection"


def test_an_idle_connection_the_server_closed_is_replaced_without_error(serve) -> None:
    def close_when_idle(conn: socket.socket) -> None:
        conn.settimeout(0.3)
        while True:
            try:
                request = read_request(conn)
            except TimeoutError:
                return  # idle: the server closes it, as A-REX does
            if not request:
                return
            conn.sendall(OK)

    server = serve(close_when_idle)
    with HttpClient() as client:
        first = client.request("POST", server.url(), timeout=5, body=b"1")
        time.sleep(0.8)
        second = client.request("POST", server.url(), timeout=5, body=b"2")
    assert first.body == second.body == b"ok"
    assert server.connections == 2


def _answer_once_then_drop(record: list[bytes]):
    """Answers the first request; reads the next one on the same connection and closes
    without a word (the server closed an idle connection as the request arrived)."""

    def handler(conn: socket.socket) -> None:
        request = read_request(conn)
        if not request:
            return
        record.append(request)
        conn.sendall(OK)
        request = read_request(conn)
        if request:
            record.append(request)

    return handler


def test_a_get_is_sent_again_when_a_reused_connection_breaks(serve) -> None:
    record: list[bytes] = []
    server = serve(_answer_once_then_drop(record))
    with HttpClient() as client:
        client.request("GET", server.url("/1"), timeout=5)
        answer = client.request("GET", server.url("/2"), timeout=5)
    assert answer.body == b"ok" and server.connections == 2
    assert [r.split(b" ")[1] for r in record] == [b"/1", b"/2", b"/2"]


def test_a_post_that_may_have_reached_the_server_is_never_sent_twice(serve) -> None:
    record: list[bytes] = []
    server = serve(_answer_once_then_drop(record))
    with HttpClient() as client:
        client.request("POST", server.url("/1"), timeout=5, body=b"a")
        with pytest.raises(HttpError) as caught:
            client.request("POST", server.url("/new"), timeout=5, body=b"b")
        again = client.request("POST", server.url("/status"), timeout=5, idempotent=True)
    assert caught.value.phase == "receive" and caught.value.sent
    assert [r.split(b" ")[1] for r in record].count(b"/new") == 1, "created once, never twice"
    assert again.body == b"ok", "an idempotent POST is sent again on a new connection"


def test_a_tls_server_named_otherwise_is_a_tls_error(serve, pki) -> None:
    server = serve(answering(OK), pki.server_context())
    with HttpClient(ca_path=pki.capath) as client:
        assert client.request("GET", server.url(), timeout=5).body == b"ok"
        with pytest.raises(HttpError) as caught:
            client.request("GET", server.url(host="127.0.0.1"), timeout=5)
    assert caught.value.phase == "tls" and "mismatch" in caught.value.detail, caught.value
    assert not caught.value.sent


def test_a_server_of_an_unknown_ca_is_a_tls_error(serve, pki) -> None:
    server = serve(answering(OK), pki.server_context())
    with HttpClient(ca_path=pki.other_capath) as client, pytest.raises(HttpError) as caught:
        client.request("GET", server.url(), timeout=5)
    assert caught.value.phase == "tls" and "certificate verify failed" in caught.value.detail


def test_the_client_certificate_is_sent_and_read_again_when_its_file_changes(
    serve, pki, tmp_path
) -> None:
    def who(conn: ssl.SSLSocket) -> None:
        while read_request(conn):
            peer = conn.getpeercert() or {}
            cn = dict(x[0] for x in peer.get("subject", ()))["commonName"].encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(cn), cn))

    server = serve(who, pki.server_context(require_client=True))
    cert = pki.client_cert(tmp_path / "proxy.pem", "first")
    with HttpClient(ca_path=pki.capath, cert_file=cert) as client:
        assert client.request("GET", server.url(), timeout=5).body == b"first"
        assert client.request("GET", server.url(), timeout=5).body == b"first"
        pki.client_cert(cert, "renewed")
        assert client.request("GET", server.url(), timeout=5).body == b"renewed"
        cert.unlink()
        with pytest.raises(HttpError) as caught:
            client.request("GET", server.url(), timeout=5)
    assert server.connections == 2, "the renewed certificate needs a new connection"
    assert caught.value.phase == "tls" and caught.value.local
    assert "cannot read the client certificate" in caught.value.detail


def test_what_is_not_an_http_url_is_refused_before_anything_is_sent() -> None:
    with HttpClient() as client:
        for url in ("ftp://x/", "https:///path", "http://host:99999/"):
            with pytest.raises(ValueError):
                client.request("GET", url, timeout=1)
    with pytest.raises(ValueError):
        HttpError("nonsense", "GET", "http://x/", "")
    assert PHASES[0] == "connect"
