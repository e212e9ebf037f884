"""Credentials the director checks, renews and hands to backends: the base of a credential plugin
(a file with a lifetime, renewed by a command).

Before each iteration every credential plugin reads its file's lifetime itself, runs its
``renew`` command (an argv, under a deadline) when less than ``min_lifetime`` is left, and
reports a :class:`~gridgate.core.model.CredentialStatus`; the director pauses the backends
that need an unusable credential (a local fault of kind ``credential``) and tells people once
per episode. Backends get the credential's environment from ``context.credential_env(kind)``,
which is answered from the configured section, so it works where no check ran.

A credential of another kind (a WLCG bearer token in a file that a command refreshes) is a
subclass that names its ``kind`` and environment variable and reads its file's validity
(:meth:`CredentialPlugin.validity`). The built-in ``x509_proxy`` and ``bearer_token``
(:mod:`gridgate.core.builtin`) are two such subclasses.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core._moved import moved_names
from gridgate.core.files import InputFileError, read_credential
from gridgate.core.model import (
    CommandResult,
    CredentialRegistry,
    CredentialStatus,
    IterationInfo,
    elapsed_text,
)
from gridgate.core.plugins import ConfigProblems, Plugin, PluginContext, section_settings
from gridgate.core.runner import run
from gridgate.core.settings import Settings

__all__ = [
    "CredentialError",
    "CredentialPlugin",
    "CredentialSettings",
    "Renewal",
    "Validity",
    "X509Proxy",  # noqa: F822 - deprecated: moved to gridgate.core.builtin (module __getattr__)
    "credential_schema",
]

#: Seconds a credential may begin after this machine's clock says now and still be used: the
#: issuer's clock (a token issuer, a VOMS server) may run a little ahead of ours, and a token
#: fetched a moment ago must not be "not valid before" for an iteration. JWT libraries allow the
#: same (RFC 7519 4.1.5: "a small leeway, usually no more than a few minutes").
CLOCK_SKEW = 60.0

#: A credential file larger than this is not read (a proxy or a token is a few KiB).
MAX_FILE_BYTES = 1024 * 1024


class CredentialError(Exception):
    """The file is not a usable credential; the text says why in a few words
    (``holds no PEM certificate``), to follow the file's name."""


@dataclass(frozen=True)
class Validity:
    """When a credential is valid: ``not_before`` and ``not_after`` in epoch seconds;
    ``detail`` a few words for people when the end is not the obvious one (an issuer that
    ends before the proxy)."""

    not_before: float
    not_after: float
    detail: str = ""


@dataclass(frozen=True)
class Renewal:
    """What one renewal did (:meth:`CredentialPlugin.refresh`): ``ok`` when it says it wrote a
    new credential; ``failure`` a few words when not (``the renewal failed (exit code 1)``);
    ``short`` the words for a renewal that worked but left a credential still short of
    ``min_lifetime``; ``command`` the renewal command's result, when one ran."""

    ok: bool
    failure: str = ""
    short: str = ""
    command: CommandResult | None = None


def credential_schema(description: str, *, min_lifetime: float = 3600) -> dict[str, Any]:
    """The config schema of a credential plugin's section: ``path``, ``min_lifetime``,
    ``renew`` and ``timeout``. A subclass may add keys to ``properties``.

    :param description: what the credential is, for the configuration reference.
    :param min_lifetime: the default of ``min_lifetime`` in seconds.
    """
    return {
        "type": "object",
        "description": description,
        "required": ["path"],
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "x-gridgate-path": True,
                "description": "The credential file. A relative path is relative to the "
                "config file's folder; backends are given it absolute.",
            },
            "min_lifetime": {
                "maximum": 365 * 86400,
                "type": "number",
                "minimum": 0,
                "default": min_lifetime,
                "description": "Renew when less than this many seconds of validity are left.",
            },
            "renew": {
                "type": "array",
                "x-gridgate-path": "argv",
                "items": {"type": "string"},
                "default": [],
                "description": "The command that renews the credential, one argv item each "
                "(never a shell line), run in the config file's folder; it must write the new "
                "credential to path. Empty: only check (something else renews it).",
            },
            "timeout": {
                "maximum": 86400,
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "default": None,
                "description": "Hard limit in seconds for the renewal command (default: "
                "director.command_timeout); killed past it, output kept.",
            },
        },
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class CredentialSettings(Settings):
    """A credential plugin's section (:func:`credential_schema`'s keys; defaults from there):
    a subclass whose schema adds keys derives its own class from this one. ``path`` is None
    only where the schema lets it be left out (a token found by discovery)."""

    path: str | None
    min_lifetime: float
    renew: tuple[str, ...]
    timeout: float | None

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        """An empty renewal program; a renewal ``timeout`` with no ``renew`` to limit."""
        if self.renew and not self.renew[0].strip():
            return [(("renew", 0), "the renewal program is empty")]
        if self.timeout is not None and not self.renew:
            return [(("timeout",), "timeout limits the renew command, but renew is empty")]
        return []


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _left(seconds: float) -> str:
    return elapsed_text(seconds) if seconds >= 0 else f"{elapsed_text(-seconds)} ago"


class CredentialPlugin(Plugin):
    """A credential kept in a file: checked before each iteration, renewed by ``renew`` when
    less than ``min_lifetime`` is left, handed to backends as ``{env_var: path}``.

    A subclass sets ``kind`` (what backends list in ``BackendInfo.credentials``), ``env_var``,
    ``what`` (how messages name it) and ``config_schema``, and implements :meth:`validity`.
    ``name`` is the credential's key in ``credentials:`` (the loader passes it: ``lhcb-proxy``),
    the entry-point name when the entry is named after its kind.
    """

    kind: ClassVar[str] = ""
    env_var: ClassVar[str] = ""
    what: ClassVar[str] = "credential"
    config_schema: ClassVar[dict[str, Any]] = credential_schema("A credential in a file.")
    settings_class: ClassVar[type[Settings] | None] = CredentialSettings
    settings: CredentialSettings

    def __init__(
        self, config: Mapping[str, Any], context: PluginContext, *, name: str = ""
    ) -> None:
        super().__init__(config, context)
        if name:  # the ``credentials:`` key (``atlas-token``); else the class's, its kind
            self.name = name
        #: where relative paths of the section are taken from: the config file's folder
        self.folder = Path(context.config_path).parent if context.config_path else Path()
        # absolute: a backend's command may run in another folder than the director
        self.path = Path(os.path.abspath(self.folder / str(self.settings.path)))

    @classmethod
    def config_warnings(cls, section: Mapping[str, Any]) -> ConfigProblems:
        """A renewal written as one shell line in a single argv item."""
        renew = section.get("renew") or []
        if len(renew) == 1 and len(str(renew[0]).split()) > 1:
            return [
                (
                    ("renew", 0),
                    "one argv item with spaces: no shell splits it, so the whole "
                    "text is taken as the program's name; write one item per word",
                )
            ]
        return []

    # --- what a subclass provides -----------------------------------------------------------

    def validity(self, data: bytes) -> Validity:
        """When the credential held in ``data`` (the file's bytes) is valid.

        :param data: the whole file, at most ``MAX_FILE_BYTES``.
        :raises CredentialError: the bytes are not a credential of this kind.
        """
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """The variables that hand the credential to a command: ``{env_var: path}``."""
        return {self.env_var: str(self.path)}

    def refresh(self, deadline: float) -> Renewal | None:
        """Renew the credential now; None when nothing is configured to renew it.

        The base runs ``renew`` (an argv, in the config file's folder, under ``deadline``
        seconds). A subclass that gets its credential another way (from a token issuer)
        returns its own :class:`Renewal`.

        :param deadline: seconds the renewal may take.
        """
        renew = list(self.settings.renew)
        if not renew:
            return None
        # in the config's folder: `-C usercert.pem` means the file beside the config
        command = run(renew, deadline, cwd=self.folder, max_output=self.context.max_output_bytes)
        return Renewal(
            ok=command.ok,
            failure=f"the renewal failed ({command.describe()})",
            short="the renewal exited 0 but left no longer-lived file",
            command=command,
        )

    # --- the hooks ------------------------------------------------------------------------------

    @hookimpl
    def gridgate_check_credentials(
        self, iteration: IterationInfo, timeout: float, credentials: CredentialRegistry
    ) -> None:
        """Report :meth:`check`'s status; a crash is reported as an unusable credential."""
        try:
            status = self.check(timeout)
        except Exception as exc:  # a bug here must not let anything be submitted unchecked
            logger.opt(exception=exc).error("checking {} {} crashed", self.what, self.path)
            status = CredentialStatus(
                name=self.name,
                kind=self.kind,
                usable=False,
                path=str(self.path),
                message=f"the check of {self.what} {self.path} crashed: "
                f"{type(exc).__name__}: {exc}",
            )
        credentials.add(status)

    @hookimpl
    def gridgate_credential_env(self, kind: str) -> dict[str, str] | None:
        """:meth:`env` for this plugin's ``kind``, from the config (no check needed)."""
        return self.env() if kind == self.kind else None

    # --- checking and renewing ----------------------------------------------------------------

    def read(self) -> Validity:
        """The validity of the file as it is now.

        A credential file is read only when it is a regular file (a FIFO put in its place would
        hang the director), owned by the user the director runs as, that nobody else may read
        or write (as ssh, GSI and arcproxy demand of theirs), and, in a folder others may write
        (``/tmp/bt_u<uid>``, ``/tmp/x509up_u<uid>``), only when it is no link
        (:func:`gridgate.core.files.read_credential`).

        :raises CredentialError: missing, not a regular file, of another owner, readable or
            writable by others, too large, empty or not a credential.
        """
        try:
            data = read_credential(self.path, max_bytes=MAX_FILE_BYTES)
        except InputFileError as exc:
            if exc.errno == errno.ENOENT:
                raise CredentialError("does not exist") from None
            if exc.errno is not None:
                raise CredentialError(f"cannot be read: {os.strerror(exc.errno)}") from None
            # the message names the file: the credential's own words follow its path
            raise CredentialError(str(exc).removeprefix(str(self.path)).strip()) from None
        if not data.strip():
            raise CredentialError("is empty")
        return self.validity(data)

    def _inspect(self, now: float) -> tuple[Validity | None, str]:
        """(validity, problem): problem is '' when the credential is valid at ``now``."""
        try:
            valid = self.read()
        except CredentialError as exc:
            return None, str(exc)
        if now >= valid.not_after:
            detail = f"; {valid.detail}" if valid.detail else ""
            return (
                valid,
                f"expired at {_iso(valid.not_after)} ({_left(valid.not_after - now)}){detail}",
            )
        if now + CLOCK_SKEW < valid.not_before:
            return (
                valid,
                f"is not valid before {_iso(valid.not_before)} (is this machine's clock right?)",
            )
        return valid, ""

    def check(self, timeout: float) -> CredentialStatus:
        """Read the credential; renew it when it is short, missing or unusable; say how it is.

        :param timeout: the renewal's deadline when the section sets no ``timeout``.
        """
        clock = self.context.clock
        deadline = self.settings.timeout or timeout
        min_lifetime = self.settings.min_lifetime
        now = clock.time()
        valid, problem = self._inspect(now)
        needed = bool(problem) or valid is None or valid.not_after - now < min_lifetime
        done = self.refresh(deadline) if needed else None
        if done is not None:
            now = clock.time()
            valid, problem = self._inspect(now)
        renewed = (
            done is not None
            and done.ok
            and not problem
            and valid is not None
            and valid.not_after - now >= min_lifetime
        )
        expires = valid.not_after if valid is not None else None
        where = f"{self.what} {self.path}"
        if done is not None and not done.ok:
            renewal = done.failure
        elif done is not None and not renewed:
            renewal = done.short
        else:
            renewal = "no renew command is configured" if needed and done is None else ""
        at_risk = False
        if problem:
            message = f"{where} {problem}" + (f"; {renewal}" if renewal else "")
        elif renewed:
            assert expires is not None
            message = f"{where} renewed: valid until {_iso(expires)} ({_left(expires - now)} left)"
        else:
            assert expires is not None
            left = expires - now
            message = f"{where} valid until {_iso(expires)} ({_left(left)} left)"
            if valid is not None and valid.detail:
                message += f"; {valid.detail}"
            if needed:
                cycle = section_settings(self.context.config, "director").cycle_seconds
                at_risk = left < cycle + deadline
                message += f", less than min_lifetime {min_lifetime:.0f} s; {renewal}" + (
                    "; it will expire before the next iteration's renewal could finish"
                    if at_risk
                    else "; tried again at the next iteration"
                )
        return CredentialStatus(
            name=self.name,
            kind=self.kind,
            usable=not problem,
            path=str(self.path),
            expires=expires,
            message=message,
            command=done.command if done is not None else None,
            renewed=renewed,
            at_risk=at_risk,
            renewal_due=needed and not renewed and not problem,
        )


#: X509Proxy (API 1.4) is the built-in x509_proxy plugin, gridgate.core.builtin.x509_proxy
__getattr__ = moved_names(__name__)
