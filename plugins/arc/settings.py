"""The `arc` backend's section: its JSON Schema (the one place a default is written), the typed
:class:`ArcSettings` built from it once, the endpoints resolved from it, and the rules across
its keys (a URL that is no CE's, ``auth: token`` with ``interface: cli``...)."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from gridgate.core.backend import (
    Deadline,
    command_timeout_schema,
    commands_schema,
    env_schema,
)
from gridgate.core.credential_names import credential_reference_schema
from gridgate.core.settings import Settings

__all__ = [
    "ARC_SCHEMA",
    "COMMANDS",
    "OWNED_ATTRIBUTES",
    "ArcSettings",
    "EndpointEntry",
    "endpoint_entry",
    "owned_attribute",
]

URL_RE = re.compile(r"https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%/-]*)?")
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
QUEUE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: An xRSL attribute name (xRSL names are case-insensitive).
ATTRIBUTE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
#: xRSL attributes the backend writes itself (xRSL names are case-insensitive).
OWNED_ATTRIBUTES: dict[str, str] = {
    "executable": "the pilot is the script key",
    "inputfiles": "the backend uploads the pilot script",
    "jobname": "job_name names the job",
    "stdout": "the backend names the pilot's output files",
    "stderr": "the backend names the pilot's output files",
    "gmlog": "the backend names the pilot's output files",
    "queue": "the queue comes from the endpoint's queue",
    "join": "the backend names the pilot's output files (join would fold stderr into stdout)",
    "count": "resources.cores is written as count",
    "countpernode": "resources.cores is written as count and countpernode (one node)",
    "memory": "resources.memory_mb is written as memory (per core)",
    "walltime": "resources.walltime is written as walltime",
}
COMMANDS = (
    ("arcsub", "submit"),
    ("arcstat", "status"),
    ("arckill", "cancel"),
    ("arcclean", "clean"),
    ("arcget", "output retrieval"),
    ("arcinfo", "queue state"),
    ("arccat", "pilot output"),
)

ARC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "ARC CE backend: CEs (one endpoint each, optionally a queue), the pilot "
    "script, extra xRSL; over A-REX's REST interface or the ARC client.",
    "properties": {
        "interface": {
            "enum": ["rest", "cli"],
            "default": "rest",
            "description": "How the CEs are reached: `rest`, A-REX's REST interface "
            "directly (one delegation per CE, bulk calls; docs/arc.md), or `cli`, the ARC "
            "client (arcsub, arcstat, arckill, arcclean, arcget, arcinfo, arccat: `commands`) for a CE "
            "without REST.",
        },
        "auth": {
            "enum": ["x509", "token"],
            "default": "x509",
            "description": "What the REST calls authenticate with: `x509`, the proxy "
            "(credentials.x509_proxy, else X509_USER_PROXY) as client certificate, and "
            "one delegation of it per CE for the pilots; `token`, a WLCG bearer token "
            "(credentials.bearer_token, else the WLCG discovery order) as "
            "`Authorization: Bearer`, no client certificate, no delegation but the "
            "payload's (`payload`). "
            "`token` needs `interface: rest`.",
        },
        "payload": {
            "type": "object",
            "default": {},
            "additionalProperties": False,
            "properties": {
                "credential": credential_reference_schema(
                    "The credential the pilots get for their payload (a key of "
                    "`credentials`): an x509_proxy is delegated to the CE and named by each "
                    "job (X509_USER_PROXY); a bearer_token is uploaded into each job's session "
                    "(BEARER_TOKEN_FILE). Needs `auth: token`."
                ),
            },
            "description": "What the pilots get besides the CE's credential, with `auth: "
            'token` (docs/arc.md, "A token for the CE, a credential for the payload").',
        },
        "endpoints": {
            "type": "array",
            "default": [],
            "description": "CEs to submit to; each is an endpoint. A URL "
            "(`https://ce.example.org:443/arex`), or {url, queue, name}: "
            "`queue` submits to that queue (xRSL `queue`), `name` is how "
            "gridgate shows it (default: the host, `:port` when not 443, "
            "`-queue`).",
            "items": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {
                        "type": "object",
                        "required": ["url"],
                        "additionalProperties": False,
                        "properties": {
                            "url": {"type": "string", "minLength": 1},
                            "queue": {"type": "string", "minLength": 1},
                            "name": {"type": "string", "minLength": 1},
                        },
                    },
                ]
            },
        },
        "script": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "",
            "description": "The pilot, sent as the job's executable (uploaded "
            "with it; a path on this machine, relative to the "
            "config file's folder).",
        },
        "job_name": {
            "type": "string",
            "minLength": 1,
            "default": "gridgate-pilot",
            "description": "xRSL jobname.",
        },
        "xrsl": {
            "type": "object",
            "default": {},
            "additionalProperties": {
                "oneOf": [
                    {"type": ["string", "number"]},
                    {"type": "array", "items": {"type": ["string", "number"]}, "minItems": 1},
                ]
            },
            "description": "More xRSL attributes, name: value (a list for multi-valued "
            'ones), e.g. {cputime: "2 hours", runtimeenvironment: '
            "[ENV/PROXY]}. Attributes the backend writes itself "
            "(executable, inputfiles, jobname, stdout, stderr, gmlog, "
            "queue; count, countpernode, memory and walltime from a demand "
            "group's resources) are refused.",
        },
        "pilots_per_submission": {
            "type": "integer",
            "minimum": 1,
            "maximum": 100,
            "default": 1,
            "description": "Pilots per submission: > 1 sends that many job "
            "descriptions in one REST POST (one delegation for all), or in one arcsub "
            "call with `interface: cli` (which still delegates once per job: it saves "
            "only process starts).",
        },
        "queue_state_interval": {
            "type": ["number", "null"],
            "minimum": 0,
            "maximum": 3600,
            "default": 30,
            "description": "Seconds one GET info of a CE (its GLUE2 document, interface: rest) "
            "or one arcinfo -l (interface: cli) answers for all its queues: what each share says "
            "of itself (waiting and running jobs, free slots, serving state, limits; arcinfo "
            "gives no job counts; docs/arc.md). null: the CEs say nothing of their queues.",
        },
        "keep_on_ce": {
            "type": "boolean",
            "default": False,
            "description": "Leave finished pilots on the CE. By default a pilot "
            "recorded done, failed or cancelled is removed with "
            "arcclean at the end of the iteration (CEs' session "
            "folders fill up with jobs nobody cleans).",
        },
        "stderr_samples": {
            "type": "integer",
            "minimum": 0,
            "maximum": 50,
            "default": 3,
            "description": "Failed pilots per poll whose stderr is fetched "
            "(from the job's session over REST, with arcget -k over the client; it feeds "
            "the reasons the `aborted` notification quotes); 0 fetches none.",
        },
        "stderr_bytes": {
            "type": "integer",
            "minimum": 0,
            "maximum": 65536,
            "default": 1000,
            "description": "Bytes of a failed pilot's stderr kept (its end).",
        },
        "commands": commands_schema(
            "Names (looked up on PATH) or paths of the ARC client commands (`interface: cli`).",
            COMMANDS,
        ),
        "command_timeout": command_timeout_schema(
            "Seconds; replaces the director's limit for "
            "these commands (or for each hook call's REST calls together) when set "
            "(one arcsub takes 0.5-5 s on a healthy CE, a REST submission of 10 "
            "pilots well under 1 s)."
        ),
        "env": env_schema(
            "Extra environment variables for the commands and the REST calls (e.g. "
            "X509_CERT_DIR, the CA folder both verify the CE against). X509_USER_PROXY "
            "comes from credentials.x509_proxy when that is configured."
        ),
    },
    "additionalProperties": False,
}


#: One item of ``endpoints`` as written: a URL, or ``{url, queue, name}``.
EndpointItem = str | Mapping[str, str]


@dataclass(frozen=True)
class EndpointEntry:
    """One ``endpoints`` item resolved: the CE's URL, its queue ("" for the CE's default) and
    the endpoint's name."""

    url: str
    queue: str
    name: str


def endpoint_entry(entry: EndpointItem) -> EndpointEntry:
    """One ``endpoints`` item resolved. The default name is the CE's host, with its port when
    that is not 443, and ``-queue``."""
    if isinstance(entry, str):
        url, queue, name = entry, "", ""
    else:
        url, queue, name = str(entry["url"]), entry.get("queue") or "", entry.get("name") or ""
    if not name:
        parts = urlsplit(url)
        host = parts.hostname or url
        try:
            port = parts.port
        except ValueError:
            port = None
        name = host if port in (None, 443) else f"{host}:{port}"
        if queue:
            name = f"{name}-{queue}"
    return EndpointEntry(url, queue, name)


def owned_attribute(name: str) -> str | None:
    """The owned attribute ``name`` is a spelling of, if any: xRSL names are compared without
    case, and RSL parsers drop underscores from them (``job_name`` is ``jobname``); refusing
    such a spelling costs nothing where a parser keeps it, as it is then no attribute at all."""
    lowered = name.lower().replace("_", "")
    return lowered if lowered in OWNED_ATTRIBUTES else None


@dataclass(frozen=True)
class ArcSettings(Settings):
    """The `arc` section, typed (one field per property of :data:`ARC_SCHEMA`)."""

    section_schema: ClassVar[Mapping[str, Any]] = ARC_SCHEMA

    interface: str
    auth: str
    payload: Mapping[str, str]
    endpoints: tuple[EndpointItem, ...]
    script: str
    job_name: str
    xrsl: Mapping[str, Any]
    pilots_per_submission: int
    keep_on_ce: bool
    queue_state_interval: float | None
    stderr_samples: int
    stderr_bytes: int
    commands: Mapping[str, str]
    command_timeout: float | None
    env: Mapping[str, str]

    @functools.cached_property
    def entries(self) -> tuple[EndpointEntry, ...]:
        """The endpoints, resolved once."""
        return tuple(endpoint_entry(e) for e in self.endpoints)

    def deadline(self, timeout: float) -> Deadline:
        """The deadline of one hook call: ``command_timeout`` when set, else ``timeout`` (the
        director's limit the hook was called with)."""
        return Deadline.after(float(self.command_timeout or timeout))

    @property
    def payload_credential(self) -> str:
        """The ``credentials:`` name the pilots get for their payload ('' for none)."""
        return str(self.payload.get("credential") or "")

    def program(self, which: str) -> str:
        """The name or path of ARC client command ``which``."""
        return self.commands.get(which) or which

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        return [*self._endpoint_rules(), *self._other_rules()]

    def _endpoint_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        names: set[str] = set()
        lists: set[tuple[str, str]] = set()
        for index, (item, entry) in enumerate(zip(self.endpoints, self.entries, strict=True)):
            url, queue, name = entry.url, entry.queue, entry.name
            where: tuple[str | int, ...] = (
                ("endpoints", index) if isinstance(item, str) else ("endpoints", index, "url")
            )
            if not URL_RE.fullmatch(url):
                problems.append((where, f"{url!r} is not an ARC CE URL (https://host[:port]/path)"))
                continue
            if queue and not QUEUE_RE.fullmatch(queue):
                problems.append((("endpoints", index, "queue"), f"{queue!r} is not a queue name"))
            if not NAME_RE.fullmatch(name):
                problems.append((("endpoints", index, "name"), f"{name!r} is not an endpoint name"))
            elif name in names:
                problems.append(
                    (
                        ("endpoints", index),
                        f"endpoint name {name!r} is used twice (give one of them a name)",
                    )
                )
            elif (url, queue) in lists:
                problems.append(
                    (("endpoints", index), f"{url} {queue or '(default queue)'} is listed twice")
                )
            names.add(name)
            lists.add((url, queue))
        return problems

    def _other_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if self.auth == "token" and self.interface == "cli":
            problems.append(
                (
                    ("auth",),
                    "auth: token needs interface: rest (the ARC client of this backend "
                    "authenticates with the proxy only)",
                )
            )
        if self.payload_credential and self.auth != "token":
            problems.append(
                (
                    ("payload", "credential"),
                    "payload.credential needs auth: token (with auth: x509 the pilots get "
                    "the delegation of the proxy the CE is reached with)",
                )
            )
        if self.interface == "rest":
            # the client's commands run with interface: cli only: a path given here with the
            # REST interface would be accepted and never run
            for which, program in sorted(self.commands.items()):
                if program != which:
                    problems.append(
                        (
                            ("commands", which),
                            f"commands.{which} is used with interface: cli only "
                            "(this section has interface: rest)",
                        )
                    )
        if self.endpoints and not self.script:
            problems.append((("script",), "a pilot script is needed to submit to the CEs"))
        for name in self.xrsl:
            if not ATTRIBUTE_RE.fullmatch(name):
                problems.append((("xrsl", name), f"{name!r} is not an xRSL attribute name"))
            elif owned_attribute(name):
                why = OWNED_ATTRIBUTES[owned_attribute(name) or ""]
                problems.append((("xrsl", name), f"{name} is written by the backend ({why})"))
        return problems
