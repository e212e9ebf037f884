"""Builds e-mail messages from notifications and delivers queued ones over SMTP (smtplib): the
mail any notifier can send through an outbox (:mod:`gridgate.core.outbox`); the ``email``
notifier and the ``ggus`` notifier's ``mail`` delivery use it.

The transport sorts every answer into sent / retry / dead for the outbox: a permanent refusal
(5xx) of the message is dead, a transient one (4xx), a refused connection or a timeout is
retried. When only some recipients are refused, the message counts as sent to the others
(they are never sent it twice); refused recipients with a 5xx go to dead-letter with the
server's reply, those with a 4xx stay queued for a retry.
"""

from __future__ import annotations

import contextlib
import email.policy
import smtplib
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any, ClassVar

from loguru import logger

from gridgate.core.cutoff import cut_after
from gridgate.core.model import Notification
from gridgate.core.outbox import Delivery, Message
from gridgate.core.plugins import ConfigProblems
from gridgate.core.secrets import SECRET_SCHEMA, SecretError, read_secret
from gridgate.core.settings import Settings

__all__ = [
    "ADDRESS",
    "ADDRESSES",
    "SECURITY",
    "SMTP_SCHEMA_PROPERTIES",
    "SMTP_TRANSPORT",
    "SmtpSettings",
    "SmtpTransport",
    "addresses",
    "build_message",
    "message_payload",
    "one_line",
    "smtp_errors",
]

#: Transport name stored in queued messages.
SMTP_TRANSPORT = "smtp"
#: The values of the ``security`` key.
SECURITY = ("none", "starttls", "ssl")

#: The schema of one e-mail address.
ADDRESS = {"type": "string", "pattern": r"^[^@\s,<>]+@[^@\s,<>]+$"}
#: The schema of a recipients key: one address, a list of them, or "" (nobody).
ADDRESSES = {
    "description": 'One address, a list of addresses, or "" to disable this level.',
    "default": "",
    "anyOf": [
        {"type": "string", "const": ""},
        ADDRESS,
        {"type": "array", "items": ADDRESS},
    ],
}

#: The SMTP server keys of a section (``host``, ``port``, ``security``, ``username``,
#: ``password``, ``timeout``, ``ca_file``, ``verify``), read by :class:`SmtpSettings`.
SMTP_SCHEMA_PROPERTIES: dict[str, Any] = {
    "host": {
        "type": "string",
        "minLength": 1,
        "default": "localhost",
        "description": "SMTP server host.",
    },
    "port": {
        "type": "integer",
        "minimum": 1,
        "maximum": 65535,
        "default": 25,
        "description": "SMTP server port (25, 587 for starttls, 465 for ssl).",
    },
    "security": {
        "enum": list(SECURITY),
        "default": "none",
        "description": "none, starttls (upgrade after connecting) or ssl (TLS from the start).",
    },
    "username": {
        "type": "string",
        "default": "",
        "description": 'Log in as this user (AUTH); "" for no login.',
    },
    "password": {
        **SECRET_SCHEMA,
        "description": "Password for username: {env: NAME} or {file: PATH}, never inline.",
    },
    "timeout": {
        "maximum": 86400,
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 30,
        "description": "Seconds to wait for the server on each step.",
    },
    "ca_file": {
        "type": "string",
        "x-gridgate-path": True,
        "default": "",
        "description": 'PEM file of CAs to trust for starttls/ssl ("": the system\'s).',
    },
    "verify": {
        "type": "boolean",
        "default": True,
        "description": "Check the server's certificate and host name.",
    },
}


def smtp_errors(section: Mapping[str, Any]) -> ConfigProblems:
    """The problems of the SMTP keys of ``section`` that its schema cannot say (a username
    without a password, or the reverse), as ``(path, message)`` for ``config_errors``."""
    return list(SmtpSettings.from_section(section).cross_rules())


def addresses(value: str | list[str]) -> list[str]:
    """The addresses of a recipients key (:data:`ADDRESSES`): ``value`` as a list, "" dropped."""
    if isinstance(value, str):
        return [value] if value else []
    return [a for a in value if a]


@dataclass(frozen=True)
class SmtpSettings(Settings):
    """How to reach the mail server (the keys of :data:`SMTP_SCHEMA_PROPERTIES`; defaults from
    there alone). ``password`` is the secret's spec, never its value. A notifier whose section
    has these keys derives its own settings class from this one; ``SmtpSettings.of(section)``
    reads them from any section."""

    section_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "properties": SMTP_SCHEMA_PROPERTIES,
    }

    host: str
    port: int
    security: str
    username: str
    password: Mapping[str, str] | None
    timeout: float
    ca_file: str
    verify: bool

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> SmtpSettings:
        """The SMTP settings of a section with :data:`SMTP_SCHEMA_PROPERTIES`' keys (its other
        keys are ignored); the API-1.x name of :meth:`of`."""
        return SmtpSettings.of({k: v for k, v in section.items() if k in SMTP_SCHEMA_PROPERTIES})

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        """A username without a password, or the reverse (:func:`smtp_errors`)."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if self.username and not self.password:
            problems.append((("password",), "username is set but password is not"))
        if self.password and not self.username:
            problems.append((("username",), "password is set but username is not"))
        return problems

    def __repr__(self) -> str:  # the spec is harmless, but keep reprs short and obvious
        return (
            f"SmtpSettings(host={self.host!r}, port={self.port}, "
            f"security={self.security!r}, username={self.username!r})"
        )


def one_line(text: str) -> str:
    """Header-safe ``text``: any run of whitespace (newlines included) becomes one space."""
    return " ".join(text.split())


def build_message(
    notification: Notification,
    *,
    sender: str,
    to: Sequence[str],
    subject_prefix: str = "",
    extra_headers: Mapping[str, str] | None = None,
) -> EmailMessage:
    """A proper UTF-8 e-mail for ``notification``: Date is when the event was created.

    :param sender: the From address.
    :param to: the recipients (the To header).
    :param subject_prefix: put in front of the notification's subject.
    :param extra_headers: more headers, each value made one line.
    """
    body = notification.body.encode("utf-8", "replace").decode("utf-8")
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg["Subject"] = one_line(f"{subject_prefix}{notification.subject}")
    msg["Date"] = formatdate(notification.created, usegmt=True)
    domain = sender.rpartition("@")[2] or "localhost"
    msg["Message-ID"] = make_msgid("gridgate", domain=domain)
    msg["X-Gridgate-Level"] = notification.level
    if notification.endpoint is not None:
        msg["X-Gridgate-Endpoint"] = one_line(notification.endpoint.key)
    for name, value in (extra_headers or {}).items():
        msg[name] = one_line(value)
    text = body if body.endswith("\n") else body + "\n"
    # Not every relay announces 8BITMIME: non-ASCII text travels as quoted-printable.
    msg.set_content(text, charset="utf-8", cte=None if text.isascii() else "quoted-printable")
    return msg


def message_payload(msg: EmailMessage, sender: str, to: Sequence[str]) -> dict[str, Any]:
    """What the outbox stores for an SMTP message ``msg`` (made by :func:`build_message`): the
    envelope (``sender``, the recipients ``to``) and the exact bytes to send."""
    raw = msg.as_bytes(policy=email.policy.SMTP)
    return {"from": sender, "to": list(to), "raw": raw.decode("utf-8", "surrogateescape")}


def _reply(code: int, text: bytes | str) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return f"{code} {one_line(text)}"


class _Overran(Exception):
    """An SMTP exchange cut at its deadline (:func:`gridgate.core.cutoff.cut_after`)."""

    def __init__(self, seconds: float, doing: str) -> None:
        super().__init__(f"no complete answer within {seconds:g} s while {doing}: cut")


def _shut(conn: smtplib.SMTP) -> None:
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class SmtpTransport:
    """Delivers ``smtp`` outbox messages; keeps one connection open for a delivery pass."""

    def __init__(self, settings: SmtpSettings) -> None:
        self.settings = settings
        self._conn: smtplib.SMTP | None = None

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.settings.ca_file or None)
        if not self.settings.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _connect(self) -> smtplib.SMTP:
        if self._conn is not None:
            return self._conn
        s = self.settings
        password = read_secret(s.password) if s.username else None
        conn: smtplib.SMTP
        if s.security == "ssl":
            conn = smtplib.SMTP_SSL(timeout=s.timeout, context=self._context())
        else:
            conn = smtplib.SMTP(timeout=s.timeout)
        # ``timeout`` bounds each read: a server that sends its greeting a byte a second
        # would hold the outbox for ever. The whole of connect, greeting, EHLO, STARTTLS and
        # login gets ``timeout`` seconds, then the socket is shut.
        try:
            with cut_after(s.timeout, lambda: _shut(conn)) as cut:
                try:
                    conn._host = s.host  # type: ignore[attr-defined]  # as SMTP(host) sets it: STARTTLS and SSL check this name
                    conn.connect(s.host, s.port)
                    conn.ehlo_or_helo_if_needed()
                    if s.security == "starttls":
                        conn.starttls(context=self._context())
                        conn.ehlo()
                    if s.username:
                        conn.login(s.username, password or "")
                except (OSError, smtplib.SMTPException) as exc:
                    if cut.fired:
                        raise _Overran(s.timeout, "connecting and greeting") from exc
                    raise
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.quit()
            except (OSError, smtplib.SMTPException):
                conn.close()

    def finish(self) -> None:
        """End of a delivery pass: close the connection."""
        self._drop()

    def deliver(self, message: Message) -> Delivery:
        """Send one queued message; sent, retry or dead as the module docstring says."""
        payload = message.payload
        sender, rcpts = payload["from"], list(payload["to"])
        raw = payload["raw"].encode("utf-8", "surrogateescape")
        where = f"{self.settings.host}:{self.settings.port}"
        try:
            conn = self._connect()
        except SecretError as exc:
            return Delivery("retry", f"SMTP password unavailable: {exc}")
        except smtplib.SMTPAuthenticationError as exc:
            # A login refusal is a config problem, not the message's: keep it queued.
            return Delivery(
                "retry", f"{where}: login refused: {_reply(exc.smtp_code, exc.smtp_error)}"
            )
        except _Overran as exc:
            return Delivery("retry", f"{where}: {exc}")
        except smtplib.SMTPResponseException as exc:
            return Delivery("retry", f"{where}: {_reply(exc.smtp_code, exc.smtp_error)}")
        except (OSError, smtplib.SMTPException) as exc:
            return Delivery("retry", f"{where}: cannot connect: {type(exc).__name__}: {exc}")
        try:
            with cut_after(self.settings.timeout, lambda: _shut(conn)) as cut:
                try:
                    refused = conn.sendmail(sender, rcpts, raw)
                except (OSError, smtplib.SMTPServerDisconnected) as exc:
                    if cut.fired:
                        raise _Overran(self.settings.timeout, "sending the message") from exc
                    raise
        except _Overran as exc:
            self._drop()
            return Delivery("retry", f"{where}: {exc}")
        except smtplib.SMTPRecipientsRefused as exc:
            return self._split(payload, dict(exc.recipients), accepted=False)
        except (smtplib.SMTPSenderRefused, smtplib.SMTPDataError) as exc:
            reply = _reply(exc.smtp_code, exc.smtp_error)
            if 500 <= exc.smtp_code < 600:
                return Delivery("dead", reply)
            return Delivery("retry", reply, blocking=False)
        except smtplib.SMTPResponseException as exc:
            self._drop()
            reply = _reply(exc.smtp_code, exc.smtp_error)
            return Delivery("dead" if 500 <= exc.smtp_code < 600 else "retry", reply)
        except (OSError, smtplib.SMTPException) as exc:
            self._drop()
            return Delivery("retry", f"{where}: {type(exc).__name__}: {exc}")
        if refused:
            return self._split(payload, dict(refused), accepted=True)
        return Delivery("sent", "250 accepted")

    @staticmethod
    def _split(
        payload: Mapping[str, Any], refused: Mapping[str, tuple[int, bytes]], accepted: bool
    ) -> Delivery:
        dead = [r for r, (code, _t) in refused.items() if 500 <= code < 600]
        again = [r for r in refused if r not in dead]
        reply = "; ".join(f"{r}: {_reply(code, text)}" for r, (code, text) in refused.items())
        dead_payload = {**payload, "to": dead} if dead else None
        retry_payload = {**payload, "to": again} if again else None
        if accepted:
            logger.warning("SMTP: some recipients refused: {}", reply)
            return Delivery(
                "sent",
                reply,
                blocking=False,
                retry_payload=retry_payload,
                dead_payload=dead_payload,
            )
        if not again:
            return Delivery("dead", reply)
        if not dead:
            return Delivery("retry", reply, blocking=False)
        return Delivery(
            "retry", reply, blocking=False, retry_payload=retry_payload, dead_payload=dead_payload
        )
