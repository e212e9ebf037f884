"""A private OpenID token issuer on loopback https, for the private ARC CE (:mod:`.ce`) and
its tests: WLCG-profile access tokens (RS256 JWTs) signed with a key of its own, and, over
https, the two documents a service such as A-REX fetches to verify them:
``/.well-known/openid-configuration`` (``issuer``, ``jwks_uri``) and the JWKS it names.

A-REX 6.17 takes a token's key only from its issuer over https (``OTokensSH.cpp`` accepts an
``ExternalSafeKey`` only), and checks the issuer's certificate against
``/etc/grid-security/certificates``: the issuer's TLS certificate is therefore one for
``localhost`` from the CE's own test CA (made here with ``cryptography``, signed with the CA's
key), and the CE makes A-REX see its CA folder there (docs/arc.md, "Bearer tokens").

Everything of one issuer lives in one folder: ``issuer.json`` (its URL and key id), the
signing key, the TLS certificate and key, and the two documents it serves::

    issuer = Issuer.create(folder, "https://localhost:19443", ca_cert=..., ca_key=...)
    with IssuerServer(issuer):              # serves both documents until stopped
        token = issuer.token(scope="compute.create compute.read", lifetime=600)

By hand (the CE runs the first; the second is a renewal command for ``credentials.bearer_token``)::

    python -m gridgate.plugins.arc.issuer serve FOLDER
    python -m gridgate.plugins.arc.issuer token FOLDER --out FILE [--lifetime S] [--scope ...]
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gridgate.core.documents import DocumentError
from gridgate.core.files import atomic_write
from gridgate.plugins.arc.documents import issuer_record

#: The scopes of a pilot factory's token at a CE (WLCG Common JWT Profile, compute.*).
COMPUTE_SCOPES = "compute.create compute.read compute.modify compute.cancel"
#: Seconds a token lives unless asked otherwise (WLCG: access tokens of minutes to hours).
DEFAULT_LIFETIME = 3600
WELL_KNOWN = "/.well-known/openid-configuration"
JWKS_PATH = "/jwks"
#: The files of an issuer's folder.
SETTINGS, SIGNING_KEY, TLS_CERT, TLS_KEY = (
    "issuer.json",
    "signing-key.pem",
    "tls-cert.pem",
    "tls-key.pem",
)
METADATA, JWKS = "openid-configuration.json", "jwks.json"


class IssuerError(RuntimeError):
    """The issuer could not be set up or started (the message says why)."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _uint(value: int) -> str:
    return _b64url(value.to_bytes((value.bit_length() + 7) // 8, "big"))


class Issuer:
    """One issuer's keys and tokens (no network: :class:`IssuerServer` serves it).

    :param folder: a folder made by :meth:`create`.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder).resolve()
        try:
            record = issuer_record((self.folder / SETTINGS).read_bytes())
        except (OSError, DocumentError) as exc:
            raise IssuerError(f"{self.folder} holds no issuer ({SETTINGS}: {exc})") from None
        #: the ``iss`` of its tokens, ``https://localhost:PORT``
        self.url: str = record.url
        #: the ``kid`` of its tokens' header and of its one key in the JWKS
        self.kid: str = record.kid
        self._key: Any = None

    @classmethod
    def create(
        cls,
        folder: str | os.PathLike[str],
        url: str,
        *,
        ca_cert: str | os.PathLike[str],
        ca_key: str | os.PathLike[str],
        host: str = "localhost",
    ) -> Issuer:
        """Make an issuer in ``folder`` (once: an issuer already there with this ``url`` is
        kept, keys and all): an RSA signing key, a TLS certificate for ``host`` signed by the CA
        (``ca_cert``, ``ca_key``: PEM files), and the documents it serves.

        :param url: its ``iss``, ``https://HOST:PORT`` (the port it will be served on).
        """
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        root = Path(folder).resolve()
        if not url.startswith("https://"):
            raise IssuerError(f"issuer URL {url!r}: A-REX takes keys from https issuers only")
        with contextlib.suppress(IssuerError):
            existing = cls(root)
            if existing.url == url and (root / TLS_CERT).exists():
                return existing
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)  # the documents are public; the keys are 0600 below
        pem = serialization.PrivateFormat.PKCS8
        signing = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        atomic_write(
            root / SIGNING_KEY,
            signing.private_bytes(serialization.Encoding.PEM, pem, serialization.NoEncryption()),
            durable=False,
        )
        try:
            authority = x509.load_pem_x509_certificate(Path(ca_cert).read_bytes())
            authority_key = serialization.load_pem_private_key(
                Path(ca_key).read_bytes(), password=None
            )
        except (OSError, ValueError, TypeError) as exc:
            raise IssuerError(f"cannot read the CA {ca_cert} / {ca_key}: {exc}") from None
        tls_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        now = dt.datetime.now(dt.UTC)
        # under the test CA's namespace (its signing_policy: /DC=org/DC=nordugrid/DC=ARC/O=TestCA/*)
        subject = x509.Name(
            [
                *list(authority.subject)[:-1],
                x509.NameAttribute(NameOID.COMMON_NAME, f"issuer/{host}"),
            ]
        )
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(authority.subject)
            .public_key(tls_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(min(now + dt.timedelta(days=365), authority.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(authority_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        atomic_write(
            root / TLS_KEY,
            tls_key.private_bytes(serialization.Encoding.PEM, pem, serialization.NoEncryption()),
            durable=False,
        )
        (root / TLS_CERT).write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        kid = uuid.uuid4().hex[:16]
        numbers = signing.public_key().public_numbers()
        jwks = {
            "keys": [
                {
                    "kty": "RSA",
                    "use": "sig",
                    "alg": "RS256",
                    "kid": kid,
                    "n": _uint(numbers.n),
                    "e": _uint(numbers.e),
                }
            ]
        }
        metadata = {
            "issuer": url,
            "jwks_uri": url + JWKS_PATH,
            "scopes_supported": ["openid", "wlcg", *COMPUTE_SCOPES.split()],
            "response_types_supported": ["token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "claims_supported": ["iss", "sub", "aud", "exp", "iat", "nbf", "jti", "scope"],
        }
        (root / JWKS).write_text(json.dumps(jwks), encoding="utf-8")
        (root / METADATA).write_text(json.dumps(metadata), encoding="utf-8")
        (root / SETTINGS).write_text(json.dumps({"url": url, "kid": kid}) + "\n", encoding="utf-8")
        return cls(root)

    @property
    def port(self) -> int:
        """The port of its URL, which it is served on."""
        tail = self.url.split("://", 1)[1].split("/", 1)[0]
        return int(tail.rsplit(":", 1)[1]) if ":" in tail else 443

    @property
    def tls_cert(self) -> Path:
        return self.folder / TLS_CERT

    @property
    def tls_key(self) -> Path:
        return self.folder / TLS_KEY

    def token(
        self,
        *,
        scope: str = COMPUTE_SCOPES,
        sub: str = "gridgate-pilot-factory",
        aud: str | Sequence[str] = "https://wlcg.cern.ch/jwt/v1/any",
        lifetime: float = DEFAULT_LIFETIME,
        start: float | None = None,
        claims: Mapping[str, Any] | None = None,
    ) -> str:
        """A WLCG-profile access token in compact JWS form, RS256-signed with this issuer's key.

        :param scope: space-separated scopes (``compute.create compute.read ...``).
        :param sub: the subject.
        :param aud: the audience (the CE's URL, or WLCG's "any" audience).
        :param lifetime: seconds from ``start`` to ``exp``.
        :param start: ``iat`` and ``nbf`` in epoch seconds (default: now); an expired token is
            ``start=time.time() - 7200, lifetime=3600``.
        :param claims: more claims, or other values for these; a value None drops the claim.
        """
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import padding

        if self._key is None:
            self._key = serialization.load_pem_private_key(
                (self.folder / SIGNING_KEY).read_bytes(), password=None
            )
        issued = int(time.time() if start is None else start)
        payload: dict[str, Any] = {
            "wlcg.ver": "1.0",
            "iss": self.url,
            "sub": sub,
            "aud": aud if isinstance(aud, str) else list(aud),
            "scope": scope,
            "iat": issued,
            "nbf": issued,
            "exp": int(issued + lifetime),
            "jti": str(uuid.uuid4()),
        }
        for name, value in (claims or {}).items():
            if value is None:
                payload.pop(name, None)
            else:
                payload[name] = value
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        signed = ".".join(
            _b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, payload)
        )
        signature = self._key.sign(signed.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
        return f"{signed}.{_b64url(signature)}"

    def write_token(self, path: str | os.PathLike[str], **options: Any) -> Path:
        """:meth:`token` written to ``path`` (whole, mode 0600, a newline after it), as a token
        tool writes a ``BEARER_TOKEN_FILE``; returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, (self.token(**options) + "\n").encode("ascii"), durable=False)
        return target


class _Handler(BaseHTTPRequestHandler):
    server_version = "gridgate-issuer"
    protocol_version = "HTTP/1.1"
    documents: Mapping[str, bytes] = {}
    served: list[str] = []
    log_file: Path | None = None

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        # A-REX asks with the absolute form (GET https://localhost:PORT/.well-known/...)
        path = urllib.parse.urlsplit(self.path).path or "/"
        body = self.documents.get(path)
        self.served.append(path)
        if body is None:
            body, status = b'{"error":"not found"}', 404
        else:
            status = 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        if self.log_file is not None:
            with contextlib.suppress(OSError), open(self.log_file, "a", encoding="utf-8") as log:
                stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                log.write(f"{stamp} {self.address_string()} {format % args}\n")


class IssuerServer:
    """Serves an :class:`Issuer`'s two documents over https on every loopback address of
    ``localhost``, from threads of this process, until :meth:`stop`.

    :param issuer: the issuer; it listens on its URL's port.
    :param log: a file that gets one line per request (default: none).
    """

    def __init__(self, issuer: Issuer, *, log: str | os.PathLike[str] | None = None) -> None:
        self.issuer = issuer
        #: the paths asked so far, in order (A-REX asks both documents for every token)
        self.served: list[str] = []
        self._log = Path(log) if log is not None else None
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> IssuerServer:
        folder = self.issuer.folder
        documents = {
            WELL_KNOWN: (folder / METADATA).read_bytes(),
            JWKS_PATH: (folder / JWKS).read_bytes(),
        }
        handler = type(
            "IssuerHandler",
            (_Handler,),
            {"documents": documents, "served": self.served, "log_file": self._log},
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.issuer.tls_cert), str(self.issuer.tls_key))
        port = self.issuer.port
        addresses = {
            (family, str(info[0]))
            for family, _, _, _, info in socket.getaddrinfo(
                "localhost", port, type=socket.SOCK_STREAM
            )
            if family in (socket.AF_INET, socket.AF_INET6)
        }
        try:
            for family, address in sorted(addresses):
                self._servers.append(
                    _TLSServer((address, port), handler, family=family, context=context)
                )
        except OSError as exc:
            self.stop()
            raise IssuerError(
                f"the token issuer cannot listen on localhost:{port}: {exc}"
            ) from None
        for listening in self._servers:
            thread = threading.Thread(
                target=listening.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers, self._threads = [], []

    def __enter__(self) -> IssuerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], handler: type, *, family: int, context: ssl.SSLContext
    ) -> None:
        self.address_family = socket.AddressFamily(family)
        self.context = context
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        super().server_bind()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        sock.settimeout(10)  # a client that connects and says nothing holds one thread, briefly
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            with self.context.wrap_socket(request, server_side=True) as tls:
                super().finish_request(tls, client_address)
        except (OSError, ssl.SSLError):
            pass  # a client that gave up the handshake (a port probe)


# --- by hand: ``python -m gridgate.plugins.arc.issuer serve|token`` ------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gridgate.plugins.arc.issuer",
        description="Serve a private token issuer made by the private ARC CE, or write a "
        "fresh token of it to a file (a renewal command for credentials.bearer_token).",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    serve = sub.add_parser("serve", help="serve the issuer's documents until SIGTERM")
    serve.add_argument("folder")
    serve.add_argument("--log", help="a file that gets one line per request")
    token = sub.add_parser("token", help="write a fresh token to --out (mode 0600)")
    token.add_argument("folder")
    token.add_argument("--out", required=True)
    token.add_argument("--lifetime", type=float, default=DEFAULT_LIFETIME, help="seconds")
    token.add_argument("--scope", default=COMPUTE_SCOPES)
    token.add_argument("--sub", default="gridgate-pilot-factory")
    token.add_argument("--aud", default="https://wlcg.cern.ch/jwt/v1/any")
    args = parser.parse_args(argv)
    try:
        issuer = Issuer(args.folder)
        if args.action == "token":
            path = issuer.write_token(
                args.out, lifetime=args.lifetime, scope=args.scope, sub=args.sub, aud=args.aud
            )
            print(f"token of {issuer.url} written to {path}", file=sys.stderr)
            return 0
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        signal.signal(signal.SIGINT, lambda *_: stopping.set())
        with IssuerServer(issuer, log=args.log):
            print(f"issuer {issuer.url} serving {args.folder}", flush=True)
            while not stopping.wait(1.0):
                pass
    except (IssuerError, OSError) as exc:
        print(f"issuer: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
