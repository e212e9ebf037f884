"""The ``ggus`` notifier: one GGUS ticket per endpoint per failure episode, spooled, POSTed
to the helpdesk, and/or mailed, through the same durable outbox as e-mail."""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.config import apply_defaults
from gridgate.core.files import atomic_write, ensure_private_dir, resolve_dir
from gridgate.core.mail import (
    ADDRESS,
    ADDRESSES,
    SMTP_SCHEMA_PROPERTIES,
    SMTP_TRANSPORT,
    SmtpSettings,
    SmtpTransport,
    addresses,
    build_message,
    message_payload,
)
from gridgate.core.model import Notification
from gridgate.core.outbox import (
    OUTBOX_SCHEMA_PROPERTIES,
    FlushResult,
    Outbox,
    Transport,
    configured_outbox,
)
from gridgate.core.plugins import ConfigProblems, Plugin, PluginContext
from gridgate.core.secrets import SECRET_SCHEMA
from gridgate.plugins.notify_ggus.rest import REST_TRANSPORT, RestTransport
from gridgate.plugins.notify_ggus.ticket import (
    DEFAULT_PRIORITIES,
    PRIORITIES,
    TICKET_TYPES,
    GgusTicket,
    TicketSettings,
    render_ticket,
    utc,
)

LEVELS = ("info", "error", "alarm")

#: What this notifier reads of ``notifiers.email`` (deliver: mail): its SMTP server and sender.
EMAIL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {**SMTP_SCHEMA_PROPERTIES, "from": ADDRESS},
}


class GgusConfigError(ValueError):
    """The ggus section asks for something the rest of the config does not provide."""


class GgusNotifier(Plugin):
    """Opens (renders and delivers) a GGUS ticket for the levels in ``levels``."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "description": "GGUS ticket text, spooled, POSTed to the helpdesk and/or mailed.",
        "properties": {
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
            "levels": {
                "type": "array",
                "items": {"enum": list(LEVELS)},
                "uniqueItems": True,
                "default": ["alarm"],
                "description": "Notification levels that open a ticket.",
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
            "episode_ttl": {
                "maximum": 365 * 86400,
                "type": "number",
                "exclusiveMinimum": 0,
                "default": 604800,
                "description": "Seconds the one-ticket-per-episode record is kept "
                "(default 7 days).",
            },
            "deliver": {
                "type": "array",
                "items": {"enum": ["spool", "rest", "mail"]},
                "uniqueItems": True,
                "default": ["spool"],
                "description": "Where tickets go: any of spool, rest, mail.",
            },
            "spool": {
                "type": "string",
                "x-gridgate-path": True,
                "default": "",
                "description": 'Folder for <id>.txt and <id>.json ("": '
                "<director.state_dir>/tickets).",
            },
            "rest": {
                "type": "object",
                "description": "The helpdesk API (deliver: rest).",
                "properties": {
                    "url": {
                        "type": "string",
                        "pattern": "^https?://",
                        "description": "POST tickets here, e.g. https://helpdesk.example/api/v1/tickets.",
                    },
                    "token": {
                        **SECRET_SCHEMA,
                        "description": "Sent as 'Authorization: Token ...': {env: NAME} or {file: PATH}.",
                    },
                    "timeout": {
                        "maximum": 86400,
                        "type": "number",
                        "exclusiveMinimum": 0,
                        "default": 30,
                        "description": "Seconds to wait for the helpdesk.",
                    },
                    "ca_file": {
                        "type": "string",
                        "x-gridgate-path": True,
                        "default": "",
                        "description": 'PEM file of CAs to trust ("": the system\'s).',
                    },
                    "verify": {
                        "type": "boolean",
                        "default": True,
                        "description": "Check the helpdesk's certificate.",
                    },
                },
                "additionalProperties": False,
                "default": {},
            },
            "mail": {
                "type": "object",
                "description": "Mail the ticket text (deliver: mail) through notifiers.email's server.",
                "properties": {
                    "to": {**ADDRESSES, "description": "Address(es) the ticket text is sent to."},
                    "subject_prefix": {
                        "type": "string",
                        "default": "[GGUS ticket] ",
                        "description": "Put in front of the ticket's subject.",
                    },
                },
                "additionalProperties": False,
                "default": {},
            },
            "outbox": {
                "type": "string",
                "x-gridgate-path": True,
                "default": "",
                "description": 'Outbox folder for rest and mail deliveries ("": '
                "<director.state_dir>/ggus-outbox).",
            },
            **OUTBOX_SCHEMA_PROPERTIES,
        },
        "required": ["vo"],
        "additionalProperties": False,
    }

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        section = copy.deepcopy(dict(config))
        apply_defaults(section, self.config_schema)
        problems = self.config_errors(section)
        if problems:
            raise GgusConfigError("; ".join(f"{'.'.join(map(str, p))}: {m}" for p, m in problems))
        super().__init__(section, context)
        self.settings = TicketSettings.from_section(section)
        self.deliveries = tuple(section["deliver"])
        self.spool_dir = resolve_dir(section["spool"], context.state_dir, "tickets")
        #: the last ticket texts spooled (``gridgate notify test`` names them)
        self.written: deque[Path] = deque(maxlen=16)
        self.email_section = self._email_section(context) if "mail" in self.deliveries else None
        self.outbox = self.make_outbox(section, context.state_dir, context.clock, context.config)
        self.records = context.state if context.state is not None else self.outbox.records
        if section["send_thread"] and self.outbox.pending():
            self.outbox.start()

    @staticmethod
    def _email_section(context: PluginContext) -> dict[str, Any]:
        email = (context.config.get("notifiers") or {}).get("email")
        if not email:
            raise GgusConfigError(
                "ggus: deliver includes mail, which uses the SMTP server of "
                "notifiers.email, but notifiers.email is not configured"
            )
        section = copy.deepcopy(dict(email))
        apply_defaults(section, EMAIL_SCHEMA)
        return section

    @classmethod
    def outbox_path(cls, section: Mapping[str, Any], state_dir: Path) -> Path:
        return resolve_dir(section.get("outbox", ""), state_dir, "ggus-outbox")

    @classmethod
    def make_outbox(
        cls,
        section: Mapping[str, Any],
        state_dir: Path,
        clock: Any,
        config: Mapping[str, Any] | None = None,
    ) -> Outbox:
        """The ggus outbox with the transports its section configures: ``rest`` when a URL is
        set, ``smtp`` when notifiers.email exists (for ``mail``)."""
        transports: dict[str, Transport] = {}
        rest = section.get("rest") or {}
        if rest.get("url"):
            transports[REST_TRANSPORT] = RestTransport(
                rest["url"],
                rest.get("token"),
                rest.get("timeout", 30),
                rest.get("ca_file", ""),
                rest.get("verify", True),
            )
        email = ((config or {}).get("notifiers") or {}).get("email")
        if email:
            transports[SMTP_TRANSPORT] = SmtpTransport(SmtpSettings.from_section(email))
        return configured_outbox(
            cls.outbox_path(section, state_dir), transports, section, clock, name="ggus outbox"
        )

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> ConfigProblems:
        problems: ConfigProblems = []
        deliver = section.get("deliver", ["spool"])
        if "rest" in deliver and not (section.get("rest") or {}).get("url"):
            problems.append((("rest", "url"), "deliver includes rest but rest.url is not set"))
        if "mail" in deliver and not addresses((section.get("mail") or {}).get("to", "")):
            problems.append((("mail", "to"), "deliver includes mail but mail.to is empty"))
        ticket_type = section.get("ticket_type", "USER")
        if ticket_type in ("TEAM", "ALARM") and not section.get("mou_area"):
            problems.append((("mou_area",), f"{ticket_type} tickets need a MoU Area"))
        for level, priority in (section.get("priorities") or {}).items():
            if priority == "top priority" and ticket_type != "ALARM":
                problems.append((("priorities", level), "'top priority' is for ALARM tickets only"))
        return problems

    # --- the hook --------------------------------------------------------------------------

    def episode_key(self, notification: Notification) -> str | None:
        """The record that makes a ticket once per endpoint per episode; None when the
        notification belongs to no endpoint and no episode (a test, a one-off event)."""
        if notification.endpoint is None and notification.episode_start is None:
            return None
        who = (
            notification.endpoint.key
            if notification.endpoint
            else (notification.key or notification.subject)
        )
        start = (
            "open" if notification.episode_start is None else f"{notification.episode_start:.0f}"
        )
        return f"notify_ggus:ticket:{who}:{start}"

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        if notification.level not in self.config["levels"]:
            return None
        if notification.failure is not None and notification.failure.local:
            # a command that cannot start on the director's own machine: nothing a grid site
            # can fix, so no ticket (the error still reaches the other notifiers)
            logger.info("ggus: no ticket for a fault of this machine: {}", notification.subject)
            return None
        ticket = render_ticket(notification, self.settings)
        key = self.episode_key(notification)
        try:
            first = key is None or self.records.add_if_absent(
                key, ticket.ticket_id, self.config["episode_ttl"]
            )
        except Exception as exc:  # better a second ticket than none
            logger.warning("ggus: episode record unavailable ({}); opening a ticket", exc)
            first = True
        if not first and key is not None:
            opened = self._existing(key)
            logger.info(
                "ggus: ticket {} already opened for {} in this episode (since {}, {} "
                "failures); no new ticket",
                opened,
                ticket.endpoint or ticket.subject,
                utc(notification.episode_start or notification.created),
                notification.failures_in_episode,
            )
            return None
        done = self.deliver(ticket)
        if not done and key is not None:
            # Nothing recorded anywhere: let the next alarm of this episode try again.
            try:
                self.records.delete(key)
            except Exception:  # noqa: BLE001 - best effort, the failure is already logged
                pass
        return None

    def _existing(self, key: str) -> str:
        try:
            return str(self.records.get(key) or "?")
        except Exception:  # noqa: BLE001 - only for a log line
            return "?"

    def deliver(self, ticket: GgusTicket) -> list[str]:
        """Hand ``ticket`` to every configured delivery; returns those that took it."""
        done: list[str] = []
        for how in self.deliveries:
            try:
                if how == "spool":
                    self.spool(ticket)
                elif how == "rest":
                    self.outbox.enqueue(
                        REST_TRANSPORT,
                        {"ticket": ticket.as_json(), "url": self.config["rest"]["url"]},
                        summary=f"GGUS {ticket.ticket_id}: {ticket.subject}",
                    )
                elif how == "mail":
                    self._mail(ticket)
            except OSError as exc:
                logger.error(
                    "ggus: {} delivery of ticket {} ({}) failed: {}",
                    how,
                    ticket.ticket_id,
                    ticket.subject,
                    exc,
                )
                continue
            done.append(how)
        if done:
            logger.info(
                "ggus: ticket {} for {} handed to {}",
                ticket.ticket_id,
                ticket.endpoint or "gridgate",
                ", ".join(done),
            )
        if ("rest" in done or "mail" in done) and self.config["send_thread"]:
            self.outbox.start()
        return done

    def spool(self, ticket: GgusTicket) -> tuple[Path, Path]:
        """Write ``<id>.txt`` (ready to paste) and ``<id>.json`` into the spool folder."""
        ensure_private_dir(self.spool_dir)
        txt = self.spool_dir / f"{ticket.ticket_id}.txt"
        js = self.spool_dir / f"{ticket.ticket_id}.json"
        atomic_write(js, json.dumps(ticket.as_json(), ensure_ascii=False, indent=2).encode("utf-8"))
        atomic_write(txt, ticket.as_text().encode("utf-8"))
        self.written.append(txt)
        return txt, js

    def _mail(self, ticket: GgusTicket) -> None:
        assert self.email_section is not None
        to = addresses(self.config["mail"]["to"])
        sender = self.email_section["from"]
        note = Notification(
            "alarm",
            f"{self.config['mail']['subject_prefix']}{ticket.subject}",
            ticket.as_text(),
            ticket.created,
        )
        msg = build_message(
            note, sender=sender, to=to, extra_headers={"X-Gridgate-Ticket": ticket.ticket_id}
        )
        self.outbox.enqueue(
            SMTP_TRANSPORT, message_payload(msg, sender, to), summary=str(msg["Subject"])
        )

    def flush(self, timeout: float = 30.0) -> FlushResult:
        """Deliver what is due now (see :meth:`Outbox.flush`)."""
        return self.outbox.flush(timeout)

    def close(self) -> None:
        self.outbox.close()
