"""Renders a notification as a GGUS ticket: the helpdesk's fields, within its length limits."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar
from urllib.parse import urlparse

from gridgate.core.model import Endpoint, Notification, elapsed_text
from gridgate.core.settings import Settings

SUBJECT_MAX = 250
DESCRIPTION_MAX = 4000
PRIORITIES = ("less urgent", "urgent", "very urgent", "top priority")
TICKET_TYPES = ("USER", "TEAM", "ALARM")
DEFAULT_PRIORITIES = {"alarm": "very urgent", "error": "urgent", "info": "less urgent"}
LEVELS = ("info", "error", "alarm")

#: The keys of the ggus section that shape a ticket (read by :class:`TicketSettings`).
TICKET_SCHEMA_PROPERTIES: dict[str, Any] = {
    "vo": {"type": "string", "minLength": 1, "description": "Concerned VO."},
    "sites": {
        "type": "object",
        "additionalProperties": {"type": "string", "minLength": 1},
        "default": {},
        "description": "Endpoint host -> GGUS site name; a key starting with a "
        "dot matches a domain (.cern.ch).",
    },
    "default_site": {
        "type": "string",
        "default": "",
        "description": "Affected Site when no key of sites matches.",
    },
    "notified_site": {
        "type": "string",
        "default": "",
        "description": 'Notified Site ("": the affected site).',
    },
    "priorities": {
        "type": "object",
        "description": "Priority per level.",
        "properties": {
            lvl: {
                "enum": list(PRIORITIES),
                "default": DEFAULT_PRIORITIES[lvl],
                "description": f"Priority of tickets for {lvl} notifications.",
            }
            for lvl in LEVELS
        },
        "additionalProperties": False,
        "default": {},
    },
    "ticket_type": {
        "enum": list(TICKET_TYPES),
        "default": "USER",
        "description": "USER, TEAM or ALARM (TEAM and ALARM need mou_area).",
    },
    "mou_area": {
        "type": "string",
        "default": "",
        "description": "MoU Area, for TEAM and ALARM tickets.",
    },
    "category": {
        "type": "string",
        "minLength": 1,
        "default": "Incident",
        "description": "Ticket category.",
    },
    "issue_type": {
        "type": "string",
        "minLength": 1,
        "default": "Computing Services",
        "description": "Type of issue.",
    },
}


def utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def cut_middle(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: head and tail kept, and a line in the middle
    saying how many characters were cut."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    while True:
        marker = f"\n[... {cut} characters cut ...]\n"
        keep = limit - len(marker)
        if keep < 0:
            return marker.strip()[:limit]
        if len(text) - keep == cut:
            break
        cut = len(text) - keep
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


def cut_end(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 3].rstrip() + "..."


def host_of(endpoint: Endpoint) -> list[str]:
    """Host names an endpoint may be known by: its name, then its URL's host."""
    hosts = [endpoint.name.lower()]
    parsed = urlparse(endpoint.url) if endpoint.url else None
    if parsed and parsed.hostname and parsed.hostname not in hosts:
        hosts.append(parsed.hostname.lower())
    return hosts


def site_for(endpoint: Endpoint | None, sites: Mapping[str, str], default: str = "") -> str:
    """The GGUS site of ``endpoint``: an exact host in ``sites``, else the longest key that
    starts with a dot and ends the host (``.cern.ch``), else ``default``."""
    if endpoint is None:
        return default
    lowered = {k.lower(): v for k, v in sites.items()}
    hosts = host_of(endpoint)
    for host in hosts:
        if host in lowered:
            return lowered[host]
    suffixes = sorted((k for k in lowered if k.startswith(".")), key=len, reverse=True)
    for host in hosts:
        for suffix in suffixes:
            if host.endswith(suffix):
                return lowered[suffix]
    return default


@dataclass(frozen=True)
class TicketSettings(Settings):
    """The ggus section's fields that shape a ticket (:data:`TICKET_SCHEMA_PROPERTIES`;
    defaults from there alone): ``TicketSettings.of({"vo": "lhcb"})``."""

    section_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "properties": TICKET_SCHEMA_PROPERTIES,
        "required": ["vo"],
    }

    vo: str
    sites: Mapping[str, str]
    default_site: str
    notified_site: str
    priorities: Mapping[str, str]
    ticket_type: str
    mou_area: str
    category: str
    issue_type: str

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> TicketSettings:
        """The ticket settings of a ggus section (its other keys are ignored); the API-1.x
        name of :meth:`of`."""
        return TicketSettings.of(
            {k: v for k, v in section.items() if k in TICKET_SCHEMA_PROPERTIES}
        )

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if self.ticket_type in ("TEAM", "ALARM") and not self.mou_area:
            problems.append((("mou_area",), f"{self.ticket_type} tickets need a MoU Area"))
        for level, priority in self.priorities.items():
            if priority == "top priority" and self.ticket_type != "ALARM":
                problems.append((("priorities", level), "'top priority' is for ALARM tickets only"))
        return problems


@dataclass(frozen=True)
class GgusTicket:
    """One ticket, ready to paste (:meth:`as_text`) or to POST (:meth:`as_json`)."""

    ticket_id: str
    subject: str
    description: str
    vo: str
    affected_site: str
    notified_site: str
    category: str
    issue_type: str
    priority: str
    ticket_type: str
    mou_area: str
    created: float
    endpoint: str
    episode_start: float | None
    failures: int

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def as_text(self) -> str:
        lines = [
            f"Subject: {self.subject}",
            f"Ticket type: {self.ticket_type}",
            f"Concerned VO: {self.vo}",
            f"Affected Site: {self.affected_site}",
            f"Notified Site: {self.notified_site}",
        ]
        if self.mou_area:
            lines.append(f"MoU Area: {self.mou_area}")
        lines += [
            f"Ticket category: {self.category}",
            f"Type of issue: {self.issue_type}",
            f"Priority: {self.priority}",
            "",
            "Description:",
            self.description,
        ]
        return "\n".join(lines).rstrip("\n") + "\n"


def _ticket_id(notification: Notification) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(notification.created))
    name = notification.endpoint.name if notification.endpoint else "gridgate"
    safe = re.sub(r"[^A-Za-z0-9.-]+", "_", name)[:60]
    digest = hashlib.sha256(
        "\0".join(
            (notification.key, notification.subject, notification.body, repr(notification.created))
        ).encode("utf-8", "replace")
    )
    return f"{stamp}-{safe}-{digest.hexdigest()[:8]}"


def _header(notification: Notification) -> str:
    n = notification
    where = f"{n.endpoint.name} ({n.endpoint.backend})" if n.endpoint else "gridgate"
    lines = []
    start = n.episode_start if n.episode_start is not None else n.created
    since = f"{where} has been failing since {utc(start)}"
    if n.created > start:
        since += f" (at least {elapsed_text(n.created - start)})"
    failures = max(1, n.failures_in_episode)
    lines.append(f"{since}; {failures} failure{'s' if failures != 1 else ''} since then.")
    if n.endpoint is not None and n.endpoint.url:
        lines.append(f"Endpoint: {n.endpoint.url}")
    if n.failure is not None:
        reason = f": {n.failure.reason}" if n.failure.reason else ""
        lines.append(f"Failure: {n.failure.kind}{reason}")
    if n.command is not None:
        lines.append(f"Command: {n.command.command_line}")
        lines.append(f"Outcome: {n.command.describe()}")
    lines.append(f"Reported by gridgate at {utc(n.created)}.")
    return "\n".join(lines)


def build_description(notification: Notification, limit: int = DESCRIPTION_MAX) -> str:
    """The ticket's Description: what happened, then stdout and stderr (or the notification's
    body when there is no command), long parts cut in the middle to stay within ``limit``."""
    head = _header(notification) + "\n"
    cmd = notification.command
    if cmd is not None:
        parts = [("stdout", cmd.stdout or "(empty)\n"), ("stderr", cmd.stderr or "(empty)\n")]
    else:
        parts = [("details", notification.body)]
    labels = [f"\n--- {name} ---\n" for name, _ in parts]
    budget = limit - len(head) - sum(len(label) for label in labels)
    if budget < 0:
        return cut_middle(
            head + "".join(label + text for label, (_n, text) in zip(labels, parts, strict=True)),
            limit,
        )
    # Share the room fairly: a short part keeps all of it, the rest goes to the long ones.
    lengths = [len(text) for _name, text in parts]
    shares = [0] * len(parts)
    remaining, open_parts = budget, sorted(range(len(parts)), key=lambda i: lengths[i])
    while open_parts:
        fair = remaining // len(open_parts)
        i = open_parts.pop(0)
        shares[i] = min(lengths[i], fair)
        remaining -= shares[i]
    body = "".join(
        label + cut_middle(text, share)
        for label, (_n, text), share in zip(labels, parts, shares, strict=True)
    )
    return (head + body)[:limit]


def render_ticket(notification: Notification, settings: TicketSettings) -> GgusTicket:
    """The GGUS ticket for ``notification`` under ``settings``."""
    host = host_of(notification.endpoint)[0] if notification.endpoint else ""
    site = site_for(notification.endpoint, settings.sites, settings.default_site)
    if not site:
        site = f"UNKNOWN (no site configured for {host or 'this notification'})"
    priorities = settings.priorities or DEFAULT_PRIORITIES
    subject = " ".join(notification.subject.split()) or "gridgate notification"
    return GgusTicket(
        ticket_id=_ticket_id(notification),
        subject=cut_end(subject, SUBJECT_MAX),
        description=build_description(notification),
        vo=settings.vo,
        affected_site=site,
        notified_site=settings.notified_site or site,
        category=settings.category,
        issue_type=settings.issue_type,
        priority=priorities.get(notification.level, "less urgent"),
        ticket_type=settings.ticket_type,
        mou_area=settings.mou_area,
        created=notification.created,
        endpoint=notification.endpoint.key if notification.endpoint else "",
        episode_start=notification.episode_start,
        failures=notification.failures_in_episode,
    )
