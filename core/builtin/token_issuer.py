"""An OAuth2 issuer the director asks for its own bearer tokens: the client-credentials grant
(RFC 6749 4.4) at the token endpoint named in the issuer's ``/.well-known/openid-configuration``,
the client authenticated by HTTP Basic (``client_secret_basic``), as a VO's IAM serves a pilot
factory. The ``bearer_token`` credential's ``issuer:`` block (:mod:`.bearer_token`)."""

from __future__ import annotations

import base64
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gridgate.core.builtin.documents import oauth_error, openid_configuration, token_answer
from gridgate.core.documents import DocumentError
from gridgate.core.http import HttpClient, HttpError
from gridgate.core.secrets import SECRET_SCHEMA, SecretError, read_secret
from gridgate.core.settings import Settings

__all__ = ["ISSUER_SCHEMA", "IssuerSettings", "TokenIssuer", "TokenRequestError"]

WELL_KNOWN = "/.well-known/openid-configuration"
#: The largest metadata document or token answer read (a JWT is a few KiB).
MAX_ANSWER_BYTES = 256 * 1024
#: How much of an issuer's error_description a message quotes.
DESCRIPTION_CHARS = 200

ISSUER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Fetch the token from this OAuth2 issuer with the client-credentials grant "
    "(the token endpoint named in its /.well-known/openid-configuration), as a VO's IAM "
    "serves a pilot factory: a new one whenever less than min_lifetime is left, kept in a "
    "private file under the state folder (credentials/). Not with path or renew.",
    "properties": {
        "url": {
            "type": "string",
            "pattern": "^https://[^/\\s]+\\S*$",
            "description": "The issuer, https://HOST[:PORT][/PATH]: its "
            "/.well-known/openid-configuration names the token endpoint.",
        },
        "client_id": {
            "type": "string",
            "minLength": 1,
            "description": "The client registered with the issuer (the pilot factory's).",
        },
        "client_secret": {
            **SECRET_SCHEMA,
            "description": "The client's secret, from {file: PATH} (a private file) or {env: "
            "VAR}, read at every request; never inline, never printed.",
        },
        "scope": {
            "type": ["string", "null"],
            "minLength": 1,
            "default": None,
            "description": 'The scopes asked, space-separated (e.g. "compute.create '
            'compute.read compute.modify compute.cancel"); default: what the issuer grants '
            "the client.",
        },
        "audience": {
            "type": ["string", "null"],
            "minLength": 1,
            "default": None,
            "description": "The audience asked (the token's aud, e.g. the CE's URL, the WLCG "
            "profile's advice); default: what the issuer gives the client.",
        },
        "share": {
            "type": "boolean",
            "default": True,
            "description": "Share the fetched token through the state store with every "
            "director, and every credential, that asks this issuer for the same client, scope "
            "and audience: one token request per renewal, not one per director. The store "
            "holds it sealed (AES-GCM) under a key derived from the client secret, so a reader "
            "of the store without the secret cannot use it; it expires with the token. false: "
            "each director fetches and keeps its own.",
        },
        "ca_path": {
            "type": ["string", "null"],
            "x-gridgate-path": True,
            "minLength": 1,
            "default": None,
            "description": "Folder of CA certificates (hashed) the issuer's certificate is "
            "checked against, e.g. /etc/grid-security/certificates; default: the system's.",
        },
    },
    "required": ["url", "client_id", "client_secret"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class IssuerSettings(Settings):
    """The ``issuer:`` block of a ``bearer_token`` credential (:data:`ISSUER_SCHEMA`)."""

    section_schema: ClassVar[Mapping[str, Any]] = ISSUER_SCHEMA

    url: str
    client_id: str
    client_secret: Mapping[str, str]
    scope: str | None
    audience: str | None
    share: bool
    ca_path: str | None


class TokenRequestError(Exception):
    """The issuer gave no token: the message says why in a few words (an OAuth2 error code
    and its description, an HTTP status, a timeout, a TLS failure), never the secret."""


@dataclass(frozen=True)
class Granted:
    """A token the issuer gave: the token itself and the seconds it lives, as the issuer said
    (None: it did not)."""

    token: str
    expires_in: int | None


class TokenIssuer:
    """One OAuth2 issuer and one client of it: :meth:`fetch` asks for a token.

    The token endpoint found through the issuer's metadata is remembered until a request to it
    fails (then the metadata is read again: an issuer may move its endpoint).

    :param settings: the ``issuer:`` block.
    :param client: the HTTP client to use (default: one of its own, with ``ca_path``).
    """

    def __init__(self, settings: IssuerSettings, client: HttpClient | None = None) -> None:
        self.settings = settings
        self.url = settings.url.rstrip("/")
        self.http = client or HttpClient(ca_path=settings.ca_path, max_bytes=MAX_ANSWER_BYTES)
        self._endpoint: str | None = None

    def close(self) -> None:
        self.http.close()

    def fetch(self, timeout: float) -> Granted:
        """A new token from the issuer, the metadata read first when needed; ``timeout`` seconds
        for both exchanges together.

        :raises TokenRequestError: the secret cannot be read, the issuer cannot be reached in
            time, or refuses (``invalid_client``, ``invalid_scope``...), or answers no token.
        """
        deadline = time.monotonic() + timeout
        try:
            secret = read_secret(self.settings.client_secret) or ""
        except SecretError as exc:
            raise TokenRequestError(f"the client secret: {exc}") from None
        if not secret:
            raise TokenRequestError("the client secret is empty")
        try:
            endpoint = self._endpoint or self._discover(deadline, timeout)
            granted = self._request(endpoint, secret, deadline, timeout)
        except TokenRequestError as exc:
            self._endpoint = None
            raise TokenRequestError(str(exc).replace(secret, "***")) from None
        self._endpoint = endpoint
        return granted

    def _discover(self, deadline: float, timeout: float) -> str:
        url = self.url + WELL_KNOWN
        try:
            answer = self.http.request(
                "GET", url, timeout=_left(deadline), headers={"Accept": "application/json"}
            )
        except HttpError as exc:
            raise TokenRequestError(f"its metadata {url}: {_http_problem(exc, timeout)}") from None
        try:
            metadata = openid_configuration(answer.body)
        except DocumentError as exc:
            raise TokenRequestError(f"its metadata {url}: {exc.problem}") from None
        if metadata.issuer.rstrip("/") != self.url:
            raise TokenRequestError(
                f"its metadata {url} names another issuer: {metadata.issuer:.200}"
            )
        return metadata.token_endpoint

    def _request(self, endpoint: str, secret: str, deadline: float, timeout: float) -> Granted:
        form = {"grant_type": "client_credentials"}
        if self.settings.scope:
            form["scope"] = self.settings.scope
        if self.settings.audience:
            form["audience"] = self.settings.audience
        # RFC 6749 2.3.1: id and secret form-encoded, then joined for HTTP Basic
        pair = ":".join(urllib.parse.quote_plus(p) for p in (self.settings.client_id, secret))
        headers = {
            "Authorization": "Basic " + base64.b64encode(pair.encode()).decode("ascii"),
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        }
        try:
            answer = self.http.request(
                "POST",
                endpoint,
                timeout=_left(deadline),
                body=urllib.parse.urlencode(form),
                headers=headers,
                expect=(200,),
            )
        except HttpError as exc:
            raise TokenRequestError(
                f"its token endpoint {endpoint}: {_http_problem(exc, timeout)}"
            ) from None
        try:
            granted = token_answer(answer.body)
        except DocumentError as exc:
            raise TokenRequestError(f"its token endpoint {endpoint}: {exc.problem}") from None
        if granted.token_type.lower() != "bearer":
            raise TokenRequestError(
                f"its token endpoint {endpoint} gave a token of type {granted.token_type:.40}, "
                "not Bearer"
            )
        return Granted(granted.access_token, granted.expires_in)


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)


def _http_problem(exc: HttpError, timeout: float) -> str:
    """What a failed exchange with the issuer tells people: an OAuth2 refusal by its code and
    description, another status by its number, else the failed phase's words."""
    if exc.phase == "status":
        refusal = oauth_error(exc.body)
        if refusal is not None:
            said = _printable(refusal.error_description or "")
            return f"{refusal.error} (HTTP {exc.status})" + (f": {said}" if said else "")
        return f"HTTP {exc.status} {_printable(exc.reason)}".rstrip()
    if exc.phase == "timeout":
        during = f" (cut during {exc.during})" if exc.during else ""
        return f"no complete answer within the deadline of {timeout:g} s{during}"
    return exc.detail


def _printable(text: str) -> str:
    """An issuer's words, quoted in one line of a message: printable, cut short."""
    return "".join(c if c.isprintable() else " " for c in text)[:DESCRIPTION_CHARS].strip()
