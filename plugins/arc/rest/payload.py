"""The credential an ``auth: token`` backend's pilots get for their payload (``payload:
{credential: NAME}``), read once per hook call: a proxy, delegated to the CE and named by each
job, or a bearer token, uploaded into each job's session beside the pilot script."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gridgate.core.documents import DocumentError
from gridgate.core.files import InputFileError
from gridgate.core.plugins import PluginContext
from gridgate.plugins.arc.classify import read_credential
from gridgate.plugins.arc.documents import token_end
from gridgate.plugins.arc.rest.signing import Proxy, ProxyError

__all__ = ["PAYLOAD_WHAT", "TOKEN_FILE", "VARIABLES", "Payload", "PayloadSource"]

#: The session file a payload token is uploaded as; the job's BEARER_TOKEN_FILE names it,
#: relative to the session folder (the job's working folder: A-REX expands no variable in a
#: description's ``environment``, so the folder's path cannot be written there).
TOKEN_FILE = "payload.token"
#: The variable that names the payload credential in the job's environment, by kind.
VARIABLES = {"x509": "X509_USER_PROXY", "token": "BEARER_TOKEN_FILE"}
#: How a payload credential's problem starts (the classifier reads it as ``credential``).
PAYLOAD_WHAT = "Payload credential"


@dataclass(frozen=True)
class Payload:
    """The payload credential of one hook call: ``proxy`` (kind ``x509``) or ``token`` (kind
    ``token``, the file's bytes), or the ``problem`` that stops the submission."""

    name: str
    kind: str
    proxy: Proxy | None = None
    token: bytes = b""
    problem: str = ""

    def files(self) -> dict[str, bytes]:
        """What each job's session gets besides the pilot script, by file name."""
        return {TOKEN_FILE: self.token} if self.token else {}

    def environment(self) -> list[tuple[str, str]]:
        """The job's ``environment`` pairs for the uploaded credential (a delegated proxy
        needs none: A-REX sets X509_USER_PROXY to its own copy)."""
        return [(VARIABLES["token"], TOKEN_FILE)] if self.token else []


class PayloadSource:
    """Reads the named payload credential through its credential plugin.

    :param name: the ``credentials:`` name ('' : the pilots get none).
    :param context: the backend's context (the credential plugins, the clock).
    :param read_proxy: reads and parses a proxy file (the REST interface's cached reader).
    """

    def __init__(
        self, name: str, context: PluginContext, read_proxy: Callable[[str], Proxy]
    ) -> None:
        self.name = name
        self.context = context
        self.read_proxy = read_proxy

    def kind(self) -> str:
        """The credential's kind (``x509``, ``token``) as its plugin says; '' when no plugin of
        that name is loaded."""
        manager = self.context.plugin_manager
        plugin = manager.get_plugin(f"credentials:{self.name}") if manager is not None else None
        return str(getattr(plugin, "kind", "") or "")

    def read(self) -> Payload | None:
        """The payload credential now; None when the section names none."""
        if not self.name:
            return None
        kind = self.kind()
        if kind not in VARIABLES:
            return self._problem(
                kind or "none", f"is not a loaded x509_proxy or bearer_token (kind {kind or '?'})"
            )
        path = self.context.credential_env(kind, self.name).get(VARIABLES[kind], "")
        if not path:
            return self._problem(kind, "its plugin names no file")
        try:
            data = read_credential(path)
        except InputFileError as exc:
            return self._problem(kind, str(exc))
        now = self.context.clock.time()
        if kind == "x509":
            try:
                proxy = self.read_proxy(path)
            except (OSError, ProxyError) as exc:
                return self._problem(kind, f"{path}: {exc}")
            if proxy.not_after <= now:
                return self._problem(kind, f"proxy {path} ended at {_utc(proxy.not_after)}")
            return Payload(self.name, kind, proxy=proxy)
        token = data.strip()
        try:
            ends = token_end(token.decode("utf-8", "replace"))
        except DocumentError:
            ends = None  # not a JWT this machine reads: the payload's service judges it
        if ends is not None and ends <= now:
            return self._problem(kind, f"token {path} ended at {_utc(ends)}")
        if not token:
            return self._problem(kind, f"token {path} is empty")
        return Payload(self.name, kind, token=token + b"\n")

    def _problem(self, kind: str, why: str) -> Payload:
        line = f"{PAYLOAD_WHAT} {self.name}: {why}; no pilot is sent without it"
        return Payload(self.name, kind, problem=line)


def _utc(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
