"""A private OpenID token issuer on loopback https, for the private ARC CE (:mod:`.ce`) and
its tests: WLCG-profile access tokens (RS256 JWTs) signed with a key of its own, and, over
https, the two documents a service such as A-REX fetches to verify them:
``/.well-known/openid-configuration`` (``issuer``, ``jwks_uri``, ``token_endpoint``) and the
JWKS it names; and a token endpoint for the OAuth2 client-credentials grant (RFC 6749 4.4) for
registered clients (:meth:`Issuer.add_client`), as a VO's IAM serves a pilot factory.

A-REX 6.17 takes a token's key only from its issuer over https (``OTokensSH.cpp`` accepts an
``ExternalSafeKey`` only), and checks the issuer's certificate against
``/etc/grid-security/certificates``: the issuer's TLS certificate is therefore one for
``localhost`` from the CE's own test CA (made here with ``cryptography``, signed with the CA's
key), and the CE makes A-REX see its CA folder there (docs/arc.md, "Bearer tokens").

Everything of one issuer lives in one folder: ``issuer.json`` (its URL and key id), the
signing key, the TLS certificate and key, the two documents it serves, and ``clients.json``
(its registered clients: the salted hash of each secret, never the secret; read at every
token request, so a client added or revoked counts at once, also for a running server)::

    issuer = Issuer.create(folder, "https://localhost:19443", ca_cert=..., ca_key=...)
    secret = issuer.add_client("factory", scopes="compute.create", audiences=[ce_url])
    with IssuerServer(issuer):              # serves the documents and the token endpoint
        token = issuer.token(scope="compute.create compute.read", lifetime=600)

The token endpoint answers as a real one does: client authentication by HTTP Basic
(``client_secret_basic``) or by the form's ``client_id`` and ``client_secret``
(``client_secret_post``); ``scope`` and ``audience`` (IAM's name; RFC 8707's ``resource`` is
read too) within what the client may ask; refusals as RFC 6749 5.2 JSON (``invalid_client``
401, ``invalid_scope`` 400, ``invalid_target`` 400, ``unsupported_grant_type`` 400,
``invalid_request`` 400).

By hand (the CE runs the first; the second is a renewal command for ``credentials.bearer_token``;
the third registers a client, its secret written to a private file, never printed)::

    python -m gridgate.plugins.arc.issuer serve FOLDER
    python -m gridgate.plugins.arc.issuer token FOLDER --out FILE [--lifetime S] [--scope ...]
    python -m gridgate.plugins.arc.issuer client add FOLDER ID --secret-file F [--scope ...]
    python -m gridgate.plugins.arc.issuer client revoke FOLDER ID
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import socket
import ssl
import sys
import threading
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.documents import DocumentError
from gridgate.core.files import atomic_write
from gridgate.plugins.arc.documents import IssuerClient, issuer_clients, issuer_record

#: The scopes of a pilot factory's token at a CE (WLCG Common JWT Profile, compute.*).
COMPUTE_SCOPES = "compute.create compute.read compute.modify compute.cancel"
#: Seconds a token lives unless asked otherwise (WLCG: access tokens of minutes to hours).
DEFAULT_LIFETIME = 3600
#: The WLCG profile's audience for "any service".
ANY_AUDIENCE = "https://wlcg.cern.ch/jwt/v1/any"
WELL_KNOWN = "/.well-known/openid-configuration"
JWKS_PATH = "/jwks"
TOKEN_PATH = "/token"
#: The registered clients (0600: it holds the secrets' hashes).
CLIENTS = "clients.json"
#: What a client id may be: the characters that need no escaping in a form or a log line.
CLIENT_ID_RE = re.compile(r"^[A-Za-z0-9._~-]{1,128}$")
#: The largest token request read (a form of a few fields).
MAX_FORM_BYTES = 16 * 1024
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
    :param clock: what "now" is for its tokens' ``iat``, ``nbf`` and ``exp`` (a test's
        FakeClock makes the tokens of its token endpoint follow the test's time).
    """

    def __init__(self, folder: str | os.PathLike[str], *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.folder = Path(folder).resolve()
        self.clock = clock
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
        metadata = _metadata(url)
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
        issued = int(self.clock.time() if start is None else start)
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

    # --- registered clients ---------------------------------------------------------------

    def clients(self) -> dict[str, IssuerClient]:
        """The registered clients by client id (none registered: empty).

        :raises IssuerError: ``clients.json`` is not what this issuer writes.
        """
        try:
            data = (self.folder / CLIENTS).read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise IssuerError(f"cannot read {self.folder / CLIENTS}: {exc.strerror}") from None
        try:
            return issuer_clients(data)
        except DocumentError as exc:
            raise IssuerError(f"{self.folder / CLIENTS}: {exc}") from None

    def add_client(
        self,
        client_id: str,
        *,
        scopes: str | Sequence[str] = COMPUTE_SCOPES,
        audiences: Sequence[str] = (ANY_AUDIENCE,),
        secret: str | None = None,
        lifetime: int = DEFAULT_LIFETIME,
    ) -> str:
        """Register a client for the client-credentials grant (or replace the one of that id)
        and return its secret (a fresh random one unless ``secret`` is given). Only the salted
        SHA-256 of the secret is kept.

        :param scopes: the scopes it may ask for, space-separated or a list; a request without
            ``scope`` gets them all.
        :param audiences: the audiences it may ask for; a request without ``audience`` gets
            the first.
        :param lifetime: seconds its tokens live.
        :raises IssuerError: an id, scope, audience, secret or lifetime that is not usable.
        """
        if not CLIENT_ID_RE.match(client_id):
            raise IssuerError(
                f"client id {client_id!r}: 1 to 128 of the characters A-Z a-z 0-9 . _ ~ -"
            )
        wanted = tuple(scopes.split() if isinstance(scopes, str) else scopes)
        if not wanted or any(not s or any(c.isspace() for c in s) for s in wanted):
            raise IssuerError(f"client {client_id}: scopes must be words without spaces")
        if not audiences or any(not a or any(c.isspace() for c in a) for a in audiences):
            raise IssuerError(f"client {client_id}: audiences must be words without spaces")
        if secret is not None and not secret:
            raise IssuerError(f"client {client_id}: the secret is empty")
        if int(lifetime) <= 0:
            raise IssuerError(f"client {client_id}: lifetime must be positive, not {lifetime}")
        secret = secret if secret is not None else secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        record = {
            "salt": salt,
            "secret_sha256": _secret_hash(salt, secret),
            "scopes": list(wanted),
            "audiences": list(audiences),
            "lifetime": int(lifetime),
        }
        self._write_clients({**self._client_records(), client_id: record})
        return secret

    def revoke_client(self, client_id: str) -> bool:
        """Forget a client: its secret is refused from now on. False when it was not there."""
        records = self._client_records()
        if records.pop(client_id, None) is None:
            return False
        self._write_clients(records)
        return True

    def _client_records(self) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "salt": c.salt,
                "secret_sha256": c.secret_sha256,
                "scopes": list(c.scopes),
                "audiences": list(c.audiences),
                "lifetime": c.lifetime,
            }
            for name, c in self.clients().items()
        }

    def _write_clients(self, records: Mapping[str, Any]) -> None:
        text = json.dumps(records, indent=1, sort_keys=True) + "\n"
        atomic_write(self.folder / CLIENTS, text.encode(), mode=0o600, durable=False)

    # --- the token endpoint ------------------------------------------------------------------

    def token_request(self, form: bytes, authorization: str | None) -> TokenAnswer:
        """The token endpoint's answer to one request: the client-credentials grant for a
        registered client, or a refusal as RFC 6749 5.2 words it.

        :param form: the request's ``application/x-www-form-urlencoded`` body.
        :param authorization: its ``Authorization`` header, if any.
        """
        try:
            pairs = urllib.parse.parse_qsl(
                form.decode("ascii"), keep_blank_values=False, strict_parsing=False
            )
        except (UnicodeDecodeError, ValueError):
            return _refusal(400, "invalid_request", "the body is no form")
        fields: dict[str, str] = {}
        for name, value in pairs:
            if name in fields:  # RFC 6749 3.2: no parameter twice
                return _refusal(400, "invalid_request", f"{name} is given twice")
            fields[name] = value
        basic = authorization is not None and authorization[:6].lower() == "basic "
        if basic and "client_secret" in fields:  # RFC 6749 2.3: one method only
            return _refusal(400, "invalid_request", "more than one client authentication")
        if basic:
            assert authorization is not None
            try:
                pair = base64.b64decode(authorization[6:].strip(), validate=True).decode()
                quoted_id, quoted_secret = pair.split(":", 1)
            except (ValueError, UnicodeDecodeError):
                return _refusal(401, "invalid_client", "bad Basic credentials", basic=True)
            client_id = urllib.parse.unquote_plus(quoted_id)
            secret = urllib.parse.unquote_plus(quoted_secret)
        else:
            client_id = fields.get("client_id") or ""
            secret = fields.get("client_secret") or ""
        client = self.clients().get(client_id) if client_id and secret else None
        if client is None or not hmac.compare_digest(
            _secret_hash(client.salt, secret), client.secret_sha256
        ):
            return _refusal(401, "invalid_client", "Bad client credentials", basic=basic)
        grant = fields.get("grant_type")
        if grant is None:
            return _refusal(400, "invalid_request", "grant_type is missing")
        if grant != "client_credentials":
            return _refusal(400, "unsupported_grant_type", f"{grant} is not supported")
        asked = fields["scope"].split() if "scope" in fields else list(client.scopes)
        refused = [s for s in asked if s not in client.scopes]
        if refused:
            return _refusal(400, "invalid_scope", f"scope not allowed: {' '.join(refused)}")
        if "audience" in fields and "resource" in fields:
            return _refusal(400, "invalid_request", "audience and resource both given")
        # blank values were dropped with the form's parsing: absent and empty are one
        audience = fields.get("audience") or fields.get("resource") or client.audiences[0]
        if audience not in client.audiences:
            return _refusal(400, "invalid_target", f"audience not allowed: {audience}")
        scope = " ".join(asked)
        token = self.token(scope=scope, sub=client_id, aud=audience, lifetime=client.lifetime)
        body = {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": client.lifetime,
            "scope": scope,
        }
        return TokenAnswer(200, json.dumps(body).encode())


@dataclass(frozen=True)
class TokenAnswer:
    """What the token endpoint sends: a status and a JSON body (and, for a refused Basic
    authentication, the ``WWW-Authenticate`` challenge RFC 6749 5.2 asks for)."""

    status: int
    body: bytes
    challenge: bool = False


def _refusal(status: int, error: str, description: str, *, basic: bool = False) -> TokenAnswer:
    body = {"error": error, "error_description": description}
    return TokenAnswer(status, json.dumps(body).encode(), challenge=basic and status == 401)


def _secret_hash(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


def _metadata(url: str) -> dict[str, Any]:
    """The issuer's ``/.well-known/openid-configuration`` (OpenID Discovery, RFC 8414)."""
    return {
        "issuer": url,
        "jwks_uri": url + JWKS_PATH,
        "token_endpoint": url + TOKEN_PATH,
        "grant_types_supported": ["client_credentials"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        "scopes_supported": ["openid", "wlcg", *COMPUTE_SCOPES.split()],
        "response_types_supported": ["token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
        "claims_supported": ["iss", "sub", "aud", "exp", "iat", "nbf", "jti", "scope"],
    }


class _Handler(BaseHTTPRequestHandler):
    server_version = "gridgate-issuer"
    protocol_version = "HTTP/1.1"
    documents: Mapping[str, bytes] = {}
    served: list[str] = []
    log_file: Path | None = None
    issuer: Issuer
    control: IssuerServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        # A-REX asks with the absolute form (GET https://localhost:PORT/.well-known/...)
        path = urllib.parse.urlsplit(self.path).path or "/"
        body = self.documents.get(path)
        self.served.append(path)
        if body is None:
            self._send(404, b'{"error":"not found"}')
        else:
            self._send(200, body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        path = urllib.parse.urlsplit(self.path).path or "/"
        self.served.append(path)
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if path != TOKEN_PATH:
            self._send(404, b'{"error":"not found"}')
            return
        if not 0 <= length <= MAX_FORM_BYTES:
            self._send(400, _refusal(400, "invalid_request", "bad Content-Length").body)
            return
        form = self.rfile.read(length)
        fault = self.control.token_fault
        if fault == "hang":  # a token endpoint that takes the request and never answers
            self.control.released.wait()
            return
        if fault == "500":  # as a proxy in front of a broken issuer answers
            self._send(500, b"<html><body>Internal Server Error</body></html>", "text/html")
            return
        kind = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            answer = _refusal(400, "invalid_request", "the body must be a form")
        else:
            try:
                answer = self.issuer.token_request(form, self.headers.get("Authorization"))
            except IssuerError:
                answer = _refusal(500, "server_error", "the client registry is unreadable")
        extra = {"Cache-Control": "no-store", "Pragma": "no-cache"}
        if answer.challenge:
            extra["WWW-Authenticate"] = 'Basic realm="gridgate-issuer"'
        self._send(answer.status, answer.body, headers=extra)

    def _send(
        self,
        status: int,
        body: bytes,
        kind: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
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
    """Serves an :class:`Issuer`'s two documents and its token endpoint over https on every
    loopback address of ``localhost``, from threads of this process, until :meth:`stop`.

    :param issuer: the issuer; it listens on its URL's port.
    :param log: a file that gets one line per request (default: none; never a request's body
        or headers, so never a client's secret).
    """

    def __init__(self, issuer: Issuer, *, log: str | os.PathLike[str] | None = None) -> None:
        self.issuer = issuer
        #: the paths asked so far, in order (A-REX asks both documents for every token)
        self.served: list[str] = []
        #: what the token endpoint does instead of answering, for tests of a broken issuer:
        #: "hang" (reads the request, never answers until :meth:`stop`), "500" (an HTML 500)
        self.token_fault: str | None = None
        #: set by :meth:`stop`: a hung token request ends
        self.released = threading.Event()
        self._log = Path(log) if log is not None else None
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> IssuerServer:
        folder = self.issuer.folder
        # made from its URL, not read from the folder: an issuer made before it had a token
        # endpoint serves what one made now does
        documents = {
            WELL_KNOWN: json.dumps(_metadata(self.issuer.url)).encode(),
            JWKS_PATH: (folder / JWKS).read_bytes(),
        }
        self.released.clear()
        handler = type(
            "IssuerHandler",
            (_Handler,),
            {
                "documents": documents,
                "served": self.served,
                "log_file": self._log,
                "issuer": self.issuer,
                "control": self,
            },
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
        self.released.set()
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
    token.add_argument("--aud", default=ANY_AUDIENCE)
    client = sub.add_parser("client", help="register or revoke a client of the token endpoint")
    client_sub = client.add_subparsers(dest="client_action", required=True)
    add = client_sub.add_parser("add", help="register a client (again: a new secret)")
    add.add_argument("folder")
    add.add_argument("client_id")
    add.add_argument(
        "--secret-file",
        required=True,
        help="where its secret is written (mode 0600, never printed)",
    )
    add.add_argument("--scope", default=COMPUTE_SCOPES, help="the scopes it may ask for")
    add.add_argument(
        "--audience", action="append", help="an audience it may ask for (repeat; default: any)"
    )
    add.add_argument("--lifetime", type=int, default=DEFAULT_LIFETIME, help="of its tokens, s")
    revoke = client_sub.add_parser("revoke", help="forget a client: its secret is refused")
    revoke.add_argument("folder")
    revoke.add_argument("client_id")
    args = parser.parse_args(argv)
    try:
        issuer = Issuer(args.folder)
        if args.action == "client":
            return _client_command(issuer, args)
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


def _client_command(issuer: Issuer, args: Any) -> int:
    """``client add`` / ``client revoke``: one line on stderr says what was done."""
    if args.client_action == "revoke":
        if not issuer.revoke_client(args.client_id):
            print(f"issuer: no client {args.client_id} is registered", file=sys.stderr)
            return 1
        print(f"client {args.client_id} of {issuer.url} revoked", file=sys.stderr)
        return 0
    secret = issuer.add_client(
        args.client_id,
        scopes=args.scope,
        audiences=args.audience or [ANY_AUDIENCE],
        lifetime=args.lifetime,
    )
    target = Path(args.secret_file)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, (secret + "\n").encode(), mode=0o600, durable=False)
    print(
        f"client {args.client_id} of {issuer.url} registered; its secret is in {target}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
