"""The ``ggus`` notifier: one GGUS ticket per endpoint per failure episode, spooled, POSTed
to the helpdesk, and/or mailed, through the same durable outbox as e-mail."""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
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
    OutboxSettings,
    Transport,
    configured_outbox,
)
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.secrets import SECRET_SCHEMA
from gridgate.core.settings import Settings, settings_from
from gridgate.plugins.notify_ggus.rest import REST_TRANSPORT, RestTransport
from gridgate.plugins.notify_ggus.ticket import (
    LEVELS,
    TICKET_SCHEMA_PROPERTIES,
    GgusTicket,
    TicketSettings,
    render_ticket,
    utc,
)

#: What this notifier reads of ``notifiers.email`` (deliver: mail): its SMTP server and sender.
EMAIL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {**SMTP_SCHEMA_PROPERTIES, "from": ADDRESS},
    "required": ["from"],
}


@dataclass(frozen=True)
class SenderSettings(SmtpSettings):
    """``notifiers.email``'s SMTP server and sender, as the ``mail`` delivery uses them."""

    section_schema: ClassVar[Mapping[str, Any]] = EMAIL_SCHEMA

    from_: str


def _email_of(config: Mapping[str, Any]) -> SenderSettings | None:
    """The settings of the file's ``notifiers.email`` (None when it has none)."""
    email = (config.get("notifiers") or {}).get("email")
    if not email:
        return None
    return SenderSettings.of({k: v for k, v in email.items() if k in EMAIL_SCHEMA["properties"]})


class GgusConfigError(ValueError):
    """The ggus section asks for something the rest of the config does not provide."""


GGUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "GGUS ticket text, spooled, POSTed to the helpdesk and/or mailed.",
    "properties": {
        **{
            k: TICKET_SCHEMA_PROPERTIES[k] for k in ("vo", "sites", "default_site", "notified_site")
        },
        "levels": {
            "type": "array",
            "items": {"enum": list(LEVELS)},
            "uniqueItems": True,
            "default": ["alarm"],
            "description": "Notification levels that open a ticket.",
        },
        **{
            k: TICKET_SCHEMA_PROPERTIES[k]
            for k in ("priorities", "ticket_type", "mou_area", "category", "issue_type")
        },
        "episode_ttl": {
            "maximum": 365 * 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 604800,
            "description": "Seconds the one-ticket-per-episode record is kept (default 7 days).",
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
            "description": 'Folder for <id>.txt and <id>.json ("": <director.state_dir>/tickets).',
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


@dataclass(frozen=True)
class RestSettings(Settings):
    """``rest``: the helpdesk API."""

    url: str | None
    token: Mapping[str, str] | None
    timeout: float
    ca_file: str
    verify: bool


@dataclass(frozen=True)
class MailSettings(Settings):
    """``mail``: who is mailed the ticket text."""

    to: str | list[str]
    subject_prefix: str


@dataclass(frozen=True)
class GgusSettings(TicketSettings, OutboxSettings):
    """The ggus section: how a ticket looks (:class:`TicketSettings`, handed to
    :func:`render_ticket`), its outbox (:class:`OutboxSettings`) and where tickets go."""

    section_schema: ClassVar[Mapping[str, Any]] = GGUS_SCHEMA

    levels: tuple[str, ...]
    episode_ttl: float
    deliver: tuple[str, ...]
    spool: str
    rest: RestSettings
    mail: MailSettings
    outbox: str

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if "rest" in self.deliver and not self.rest.url:
            problems.append((("rest", "url"), "deliver includes rest but rest.url is not set"))
        recipients = addresses(self.mail.to)
        if "mail" in self.deliver and not recipients:
            problems.append((("mail", "to"), "deliver includes mail but mail.to is empty"))
        if recipients and "mail" not in self.deliver:
            problems.append(
                (
                    ("mail", "to"),
                    "mail.to is set but deliver does not include mail: it mails nobody",
                )
            )
        return problems + super().cross_rules()


class GgusNotifier(Plugin):
    """Opens (renders and delivers) a GGUS ticket for the levels in ``levels``."""

    config_schema: ClassVar[dict[str, Any]] = GGUS_SCHEMA
    settings_class = GgusSettings
    settings: GgusSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        section = copy.deepcopy(dict(config))
        apply_defaults(section, self.config_schema)
        problems = self.config_errors(section)
        if problems:
            raise GgusConfigError("; ".join(f"{'.'.join(map(str, p))}: {m}" for p, m in problems))
        super().__init__(section, context)
        self.deliveries = self.settings.deliver
        self.spool_dir = resolve_dir(self.settings.spool, context.state_dir, "tickets")
        #: the last ticket texts spooled (``gridgate notify test`` names them)
        self.written: deque[Path] = deque(maxlen=16)
        self.email = _email_of(context.config)
        if "mail" in self.deliveries and self.email is None:
            raise GgusConfigError(
                "ggus: deliver includes mail, which uses the SMTP server of "
                "notifiers.email, but notifiers.email is not configured"
            )
        self.outbox = self._outbox(self.settings, context.state_dir, context.clock, self.email)
        self.records = context.state if context.state is not None else self.outbox.records
        if self.settings.send_thread and self.outbox.pending():
            self.outbox.start()

    @classmethod
    def outbox_path(cls, section: Mapping[str, Any], state_dir: Path) -> Path:
        return cls._outbox_path(_settings(section), state_dir)

    @staticmethod
    def _outbox_path(settings: GgusSettings, state_dir: Path) -> Path:
        return resolve_dir(settings.outbox, state_dir, "ggus-outbox")

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
        return cls._outbox(_settings(section), state_dir, clock, _email_of(config or {}))

    @classmethod
    def _outbox(
        cls,
        settings: GgusSettings,
        state_dir: Path,
        clock: Any,
        email: SenderSettings | None,
    ) -> Outbox:
        transports: dict[str, Transport] = {}
        rest = settings.rest
        if rest.url:
            transports[REST_TRANSPORT] = RestTransport(
                rest.url, rest.token, rest.timeout, rest.ca_file, rest.verify
            )
        if email is not None:
            transports[SMTP_TRANSPORT] = SmtpTransport(email)
        return configured_outbox(
            cls._outbox_path(settings, state_dir), transports, settings, clock, name="ggus outbox"
        )

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
        if notification.level not in self.settings.levels:
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
                key, ticket.ticket_id, self.settings.episode_ttl
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
                        {"ticket": ticket.as_json(), "url": self.settings.rest.url},
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
        if ("rest" in done or "mail" in done) and self.settings.send_thread:
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
        assert self.email is not None
        to = addresses(self.settings.mail.to)
        sender = self.email.from_
        note = Notification(
            "alarm",
            f"{self.settings.mail.subject_prefix}{ticket.subject}",
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


def _settings(section: Mapping[str, Any]) -> GgusSettings:
    """The settings of a section the config loader validated (``gridgate outbox``, warnings)."""
    return settings_from(GGUS_SCHEMA, section, GgusSettings, validate=False)
