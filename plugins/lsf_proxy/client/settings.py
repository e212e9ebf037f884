"""What the token client reads of a ``proxyd:`` section, typed: where the daemons are, the
shared key, and how long and how often to ask.

Apart from :mod:`.client` so that importing the client does not import the settings machinery
(jsonschema): programs that only take tokens from a section already read build it once here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gridgate.core.settings import Settings
from gridgate.plugins.lsf_proxy.config import SECTION_SCHEMA

__all__ = ["CLIENT_KEYS", "CLIENT_SCHEMA", "ClientSettings", "HostSettings"]

#: The keys of ``proxyd:`` a client reads.
CLIENT_KEYS = (
    "socket",
    "hosts",
    "key",
    "notoken_ntries",
    "when_unavailable",
    "client_timeout",
    "token_wait_time",
)
#: The part of the section's schema that holds them (its other keys are the daemon's).
CLIENT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {k: SECTION_SCHEMA["properties"][k] for k in CLIENT_KEYS},
}


@dataclass(frozen=True)
class HostSettings(Settings):
    """One daemon of ``hosts``: its name and its address (a socket path or host:port)."""

    name: str
    address: str


@dataclass(frozen=True)
class ClientSettings(Settings):
    """The client's part of a ``proxyd:`` section (defaults: the section's schema)."""

    section_schema: ClassVar[Mapping[str, Any]] = CLIENT_SCHEMA
    socket: str
    hosts: tuple[HostSettings, ...]
    key: Mapping[str, str] | None
    notoken_ntries: int | None
    when_unavailable: str
    client_timeout: float
    token_wait_time: float

    @property
    def reply_timeout(self) -> float:
        """How long a client waits for a reply: the daemon's own wait, and 15 s more."""
        return self.token_wait_time + 15.0
