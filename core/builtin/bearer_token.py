"""The built-in ``bearer_token`` credential: a WLCG bearer token (a JWT) in a private file,
found where ``path`` says or by WLCG Bearer Token Discovery, or fetched by the director itself
from an OAuth2 issuer (``issuer:``, the client-credentials grant: :mod:`.token_issuer`); its end
read from the ``exp`` claim, renewed by a command such as ``htgettoken`` or ``oidc-token`` or by
a new request to the issuer, handed to the backends that need kind ``token`` as
``BEARER_TOKEN_FILE``."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from gridgate.core.builtin.documents import JwtTimes, jwt_times
from gridgate.core.builtin.token_issuer import (
    ISSUER_SCHEMA,
    IssuerSettings,
    TokenIssuer,
    TokenRequestError,
)
from gridgate.core.builtin.token_share import TokenShare, share_key
from gridgate.core.credentials import (
    CredentialError,
    CredentialPlugin,
    CredentialSettings,
    Renewal,
    Validity,
    credential_schema,
)
from gridgate.core.documents import DocumentError
from gridgate.core.files import atomic_write, ensure_private_dir, file_problem
from gridgate.core.plugins import PluginContext
from gridgate.core.secrets import SecretError, read_secret

#: Where a token given in the BEARER_TOKEN variable, or fetched from the ``issuer``, is written
#: for the backends' commands, under the state folder (a command is handed a file, never the
#: token on its command line); a named credential's is ``credentials/<name>`` beside it.
COPY_NAME = Path("credentials", "bearer_token")


def _schema() -> dict[str, Any]:
    schema = credential_schema(
        "A WLCG bearer token (a JWT) the director checks before each iteration (its end read "
        "from the token's exp claim, the signature left to the services), renews with renew "
        "or fetches a new one from issuer when it runs short, and hands to the backends that "
        "need kind token as BEARER_TOKEN_FILE. While it is missing, expired or not private those backends submit "
        "nothing.",
        min_lifetime=600,
    )
    del schema["required"]
    schema["properties"]["path"]["description"] = (
        "The token file. A relative path is relative to the config file's folder; backends are "
        "given it absolute. Not given: WLCG Bearer Token Discovery, in the director's "
        "environment when the section is loaded: the token in BEARER_TOKEN (copied to a private "
        "file under the state folder, and never renewed: no command can change the variable), "
        "else the first that exists of $BEARER_TOKEN_FILE, $XDG_RUNTIME_DIR/bt_u$UID and "
        "/tmp/bt_u$UID (UID the effective uid), else the first of them (where renew should "
        "write). Not with issuer (the fetched token is kept under the state folder)."
    )
    schema["properties"]["timeout"]["description"] = (
        "Hard limit in seconds for the renewal command, or for the requests to issuer "
        "(default: director.command_timeout); a command is killed past it, output kept."
    )
    schema["properties"]["issuer"] = ISSUER_SCHEMA
    return schema


@dataclass(frozen=True)
class BearerTokenSettings(CredentialSettings):
    """The ``credentials.bearer_token`` section: a credential's keys and ``issuer``."""

    issuer: IssuerSettings | None

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        """``issuer`` beside ``renew`` or ``path``: two sources of one token."""
        if self.issuer is None:
            return super().cross_rules()
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if self.renew:
            problems.append(
                (
                    ("renew",),
                    "renew and issuer both renew the token: with issuer the director fetches "
                    "it itself; give renew (htgettoken, oidc-token...) or issuer, not both",
                )
            )
        if self.path:
            problems.append(
                (
                    ("path",),
                    "path and issuer: the token fetched from the issuer is kept in the state "
                    "folder (credentials/<name>); leave path out",
                )
            )
        return problems


def discover(environ: Mapping[str, str], euid: int) -> tuple[Path | None, str]:
    """WLCG Bearer Token Discovery: (the token file, where it was found); the file is None when
    the token is the value of BEARER_TOKEN itself.

    :param environ: the environment to read (the director's).
    :param euid: the effective uid, the ``$UID`` of ``bt_u$UID``.
    """
    if environ.get("BEARER_TOKEN", "").strip():
        return None, "BEARER_TOKEN"
    candidates: list[tuple[Path, str]] = []
    if environ.get("BEARER_TOKEN_FILE", "").strip():
        candidates.append((Path(environ["BEARER_TOKEN_FILE"].strip()), "BEARER_TOKEN_FILE"))
    if environ.get("XDG_RUNTIME_DIR", "").strip():
        xdg = Path(environ["XDG_RUNTIME_DIR"].strip(), f"bt_u{euid}")
        candidates.append((xdg, f"$XDG_RUNTIME_DIR/bt_u{euid}"))
    candidates.append((Path(f"/tmp/bt_u{euid}"), f"/tmp/bt_u{euid}"))
    # a token tool writes the first of these that applies; a leftover further down the list is
    # only taken while that one does not exist
    for path, where in candidates:
        if path.exists():
            return path, where
    return candidates[0]


def claims(token: bytes) -> JwtTimes:
    """The validity claims of a JWT in compact form (:func:`jwt_times`), unverified.

    :raises CredentialError: the bytes are not a JWT with usable dates.
    """
    try:
        return jwt_times(token)
    except DocumentError as exc:
        raise CredentialError(exc.problem) from None


class BearerToken(CredentialPlugin):
    """A WLCG bearer token in a private file: its end read from the JWT's ``exp`` claim (the
    signature is the services' to verify), renewed by a command such as ``htgettoken`` or
    ``oidc-token``, handed out as ``BEARER_TOKEN_FILE``. Without ``path`` the token is found
    by WLCG Bearer Token Discovery (:func:`discover`)."""

    name = "bearer_token"
    kind = "token"
    env_var = "BEARER_TOKEN_FILE"
    what = "bearer token"
    config_schema: ClassVar[dict[str, Any]] = _schema()
    settings_class: ClassVar[type[BearerTokenSettings]] = BearerTokenSettings
    settings: BearerTokenSettings

    def __init__(
        self, config: Mapping[str, Any], context: PluginContext, *, name: str = ""
    ) -> None:
        #: the token itself when it came from the BEARER_TOKEN variable (copied to a file)
        self.token_copy: bytes | None = None
        #: where the file was found: "" when the section names it, else the discovery step
        self.found_by = ""
        #: the issuer the token is fetched from (``issuer:``), else None
        self.issuer: TokenIssuer | None = None
        section = dict(config)
        # a named token's own file (credentials/atlas-token): two tokens never share one
        copy_name = COPY_NAME.parent / (name or self.name)
        if section.get("issuer"):
            section["path"] = str(Path(context.state_dir) / copy_name)
        elif not section.get("path"):
            found, self.found_by = discover(os.environ, os.geteuid())
            if found is None:
                self.token_copy = os.environ["BEARER_TOKEN"].strip().encode() + b"\n"
                found = Path(context.state_dir) / copy_name
                if section.get("renew"):
                    logger.warning(
                        "credentials.bearer_token: renew is not run: the token comes from the "
                        "BEARER_TOKEN variable, which no command can change; give path (or "
                        "set BEARER_TOKEN_FILE) for a token that renew refreshes"
                    )
                    section["renew"] = []
            section["path"] = str(found)
        super().__init__(section, context, name=name)
        if self.settings.issuer is not None:
            self.issuer = TokenIssuer(self.settings.issuer)

    def close(self) -> None:
        """The issuer's kept-alive connections are closed."""
        if self.issuer is not None:
            self.issuer.close()

    def refresh(self, deadline: float) -> Renewal | None:
        """With ``issuer``: a token another director shared through the state store
        (``issuer.share``), else a new one from the issuer, written to the private file (and
        shared); else the ``renew`` command."""
        if self.issuer is None:
            return super().refresh(deadline)
        where = f"the token request to {self.issuer.url} (client {self.issuer.settings.client_id})"
        start = time.monotonic()
        share = self._share()
        min_lifetime = self.settings.min_lifetime
        claimed = False
        budget = deadline
        if share is not None:
            found = share.find(min_lifetime)
            if found is None:
                claimed = share.claim(deadline)
                if not claimed:
                    # another director fetches now: its token, or our own after half the time
                    found = share.wait(min_lifetime, start + deadline / 2)
                    budget = max(deadline - (time.monotonic() - start), 0.001)
            if found is not None:
                return self._keep(
                    found.token,
                    f"the token {found.fetched_by} fetched from {self.issuer.url} and shared",
                )
        try:
            try:
                granted = self.issuer.fetch(budget)
            except TokenRequestError as exc:
                return Renewal(ok=False, failure=f"{where} failed: {exc}")
            kept = self._keep(granted.token, where)
            if kept.ok and share is not None:
                expires = self._expires(granted.token, granted.expires_in)
                if expires is not None:
                    share.publish(granted.token, expires)
        finally:
            if claimed and share is not None:
                share.release()
        if not kept.ok:
            return kept
        lives = "" if granted.expires_in is None else f" ({granted.expires_in} s)"
        return Renewal(
            ok=True, short=f"{where} gave a token{lives} that lives less than min_lifetime"
        )

    def _keep(self, token: str, source: str) -> Renewal:
        """Write ``token`` to the private file."""
        try:
            ensure_private_dir(self.path.parent)
            atomic_write(self.path, token.encode() + b"\n", mode=0o600, durable=False)
        except OSError as exc:
            return Renewal(ok=False, failure=f"cannot write the fetched token: {exc.strerror}")
        return Renewal(ok=True, short=f"{source}: it lives less than min_lifetime")

    def _expires(self, token: str, expires_in: int | None) -> float | None:
        """When a fetched token ends: its ``exp`` claim, else what the issuer said."""
        try:
            exp = claims(token.encode()).exp
        except CredentialError:
            exp = None
        if exp is None and expires_in is not None:
            exp = self.context.clock.time() + expires_in
        return exp

    def _share(self) -> TokenShare | None:
        """The issuer's token in the state store, when ``issuer.share`` and there is a store
        (and the secret can be read: the fetch then says why not)."""
        issuer = self.settings.issuer
        if issuer is None or not issuer.share or self.context.state is None:
            return None
        try:
            secret = read_secret(issuer.client_secret) or ""
        except SecretError:
            return None
        if not secret:
            return None
        key = share_key(issuer.url, issuer.client_id, issuer.scope, issuer.audience)
        return TokenShare(self.context.state, key, secret, self.context.clock.time)

    def _write_copy(self) -> None:
        """Write the BEARER_TOKEN variable's token to its private file, when it differs."""
        if self.token_copy is None:
            return
        try:
            same = self.path.read_bytes() == self.token_copy
            if same and not file_problem(self.path.stat(), owners={os.geteuid()}, private=True):
                return
        except OSError:
            pass
        try:
            ensure_private_dir(self.path.parent)
            atomic_write(self.path, self.token_copy, mode=0o600, durable=False)
        except OSError as exc:
            # reported by the check that follows: the file is then missing or stale
            logger.error("cannot write the BEARER_TOKEN copy {}: {}", self.path, exc)

    def env(self) -> dict[str, str]:
        """``{"BEARER_TOKEN_FILE": path}``; the BEARER_TOKEN copy is written first."""
        self._write_copy()
        return super().env()

    def read(self) -> Validity:
        """The token's validity; a file that is not private is refused before it is read.

        :raises CredentialError: missing, not private, unreadable, or not a JWT with ``exp``.
        """
        self._write_copy()
        try:
            return super().read()
        except CredentialError as exc:
            raise CredentialError(str(exc) + self._found()) from None

    def _found(self) -> str:
        return f" (found by WLCG token discovery: {self.found_by})" if self.found_by else ""

    def validity(self, data: bytes) -> Validity:
        times = claims(data)
        not_after = times.exp
        if not_after is None:
            raise CredentialError("holds a JWT without an exp claim: its end is unknown")
        not_before = times.nbf or 0.0
        detail = ""
        if self.token_copy is not None:
            detail = "the token of the BEARER_TOKEN variable, which no command can renew"
        return Validity(not_before=not_before, not_after=not_after, detail=detail)
