"""The ``email`` notifier: error and alarm notifications as e-mail, through a durable outbox."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.config import apply_defaults
from gridgate.core.files import resolve_dir
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
    configured_outbox,
)
from gridgate.core.plugins import ConfigProblems, Plugin, PluginContext
from gridgate.core.settings import settings_from

EMAIL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "E-mail over SMTP, queued in a durable outbox.",
    "properties": {
        **SMTP_SCHEMA_PROPERTIES,
        "from": {**ADDRESS, "description": "Sender address (From and envelope)."},
        "error_address": {
            **ADDRESSES,
            "description": 'Where error notifications go; an address, a list, or "" to disable.',
        },
        "alarm_address": {
            **ADDRESSES,
            "description": 'Where alarm notifications go; an address, a list, or "" to disable.',
        },
        "info_to_error": {
            "type": "boolean",
            "default": False,
            "description": "Also send info notifications to error_address.",
        },
        "subject_prefix": {
            "type": "string",
            "default": "[gridgate] ",
            "description": "Put in front of every subject.",
        },
        "dedup_window": {
            "type": "number",
            "minimum": 0,
            "maximum": 365 * 86400,
            "default": 86400,
            "description": "Seconds during which the same subject and body "
            "are not sent again to the same address (0: off).",
        },
        "outbox": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "",
            "description": 'Outbox folder ("": <director.state_dir>/outbox).',
        },
        **OUTBOX_SCHEMA_PROPERTIES,
    },
    "required": ["from"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class EmailSettings(SmtpSettings, OutboxSettings):
    """The ``email`` notifier's section: its SMTP server (:class:`SmtpSettings`, handed to
    the transport), its outbox (:class:`OutboxSettings`) and who gets which level."""

    section_schema: ClassVar[Mapping[str, Any]] = EMAIL_SCHEMA

    from_: str
    error_address: str | list[str]
    alarm_address: str | list[str]
    info_to_error: bool
    subject_prefix: str
    dedup_window: float
    outbox: str

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        problems = super().cross_rules()
        if self.info_to_error and not addresses(self.error_address):
            problems.append(
                (
                    ("info_to_error",),
                    "info_to_error is set but error_address is empty: info goes nowhere",
                )
            )
        return problems

    def recipients(self, level: str) -> list[str]:
        """Who gets a notification of ``level``."""
        if level == "alarm":
            return addresses(self.alarm_address)
        if level == "error" or (level == "info" and self.info_to_error):
            return addresses(self.error_address)
        return []


class EmailNotifier(Plugin):
    """Sends ``error`` notifications to ``error_address`` and ``alarm`` ones to
    ``alarm_address``; ``info`` ones go to ``error_address`` only with ``info_to_error``."""

    config_schema: ClassVar[dict[str, Any]] = EMAIL_SCHEMA
    settings_class = EmailSettings
    settings: EmailSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        section = copy.deepcopy(dict(config))
        apply_defaults(section, self.config_schema)
        super().__init__(section, context)
        self.clock = context.clock
        self.outbox = self._outbox(self.settings, context.state_dir, context.clock)
        self.records = context.state if context.state is not None else self.outbox.records
        if self.settings.send_thread and self.outbox.pending():
            self.outbox.start()

    @classmethod
    def outbox_path(cls, section: Mapping[str, Any], state_dir: Path) -> Path:
        return cls._outbox_path(_settings(section), state_dir)

    @staticmethod
    def _outbox_path(settings: EmailSettings, state_dir: Path) -> Path:
        return resolve_dir(settings.outbox, state_dir, "outbox")

    @classmethod
    def make_outbox(
        cls,
        section: Mapping[str, Any],
        state_dir: Path,
        clock: Any,
        config: Mapping[str, Any] | None = None,
    ) -> Outbox:
        """The outbox with its SMTP transport, as configured by ``section``."""
        return cls._outbox(_settings(section), state_dir, clock)

    @classmethod
    def _outbox(cls, settings: EmailSettings, state_dir: Path, clock: Any) -> Outbox:
        return configured_outbox(
            cls._outbox_path(settings, state_dir),
            {SMTP_TRANSPORT: SmtpTransport(settings)},
            settings,
            clock,
            name="email outbox",
        )

    @classmethod
    def config_warnings(cls, section: Mapping[str, Any]) -> ConfigProblems:
        # "" disables one level (the seed's way); every level disabled is a notifier that
        # sends nothing at all, which is rarely what was meant
        settings = _settings(section)
        if not addresses(settings.error_address) and not addresses(settings.alarm_address):
            return [
                ((), "error_address and alarm_address are both empty: this notifier sends nothing")
            ]
        return []

    def recipients(self, level: str) -> list[str]:
        return self.settings.recipients(level)

    @staticmethod
    def dedup_key(address: str, notification: Notification) -> str:
        digest = hashlib.sha256(
            "\0".join((address, notification.subject, notification.body)).encode("utf-8", "replace")
        ).hexdigest()
        return f"notify_email:dedup:{digest}"

    def _first_time(self, address: str, notification: Notification) -> bool:
        window = self.settings.dedup_window
        if window <= 0:
            return True
        try:
            return bool(
                self.records.add_if_absent(self.dedup_key(address, notification), "1", window)
            )
        except Exception as exc:  # a state outage must not silence mail: send, maybe twice
            logger.warning("email: de-duplication unavailable ({}); sending anyway", exc)
            return True

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        wanted = self.recipients(notification.level)
        if not wanted:
            return None
        to = [a for a in wanted if self._first_time(a, notification)]
        if not to:
            logger.info(
                "email: {!r} already sent within {} s; not sent again",
                notification.subject,
                self.settings.dedup_window,
            )
            return None
        sender = self.settings.from_
        msg = build_message(
            notification, sender=sender, to=to, subject_prefix=self.settings.subject_prefix
        )
        try:
            self.outbox.enqueue(
                SMTP_TRANSPORT, message_payload(msg, sender, to), summary=str(msg["Subject"])
            )
        except OSError as exc:
            logger.error(
                "email: cannot queue {!r} for {} in {}: {}",
                notification.subject,
                ", ".join(to),
                self.outbox.directory,
                exc,
            )
            # Not queued, so not sent: let a repeat of it through.
            for address in to:
                try:
                    self.records.delete(self.dedup_key(address, notification))
                except Exception:  # noqa: BLE001 - best effort, already reporting an error
                    pass
            return None
        if self.settings.send_thread:
            self.outbox.start()
        return None

    def flush(self, timeout: float = 30.0) -> FlushResult:
        """Deliver what is due now (see :meth:`Outbox.flush`)."""
        return self.outbox.flush(timeout)

    def close(self) -> None:
        self.outbox.close(timeout=self.settings.timeout * 2 + 5)


def _settings(section: Mapping[str, Any]) -> EmailSettings:
    """The settings of a section the config loader validated (``gridgate outbox``, warnings)."""
    return settings_from(EMAIL_SCHEMA, section, EmailSettings, validate=False)
