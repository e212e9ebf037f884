"""Real servers for the notifier tests: aiosmtpd on loopback and a stdlib HTTP server."""

from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from support.ports import free_port

__all__ = ["Authenticator", "HttpServer", "SmtpServer", "free_port", "make_cert"]


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 / localhost, made with the openssl CLI."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@dataclass
class Received:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes
    authenticated: bool = False
    tls: bool = False

    @property
    def message(self) -> EmailMessage:
        return message_from_bytes(self.data, policy=policy.default)  # type: ignore[return-value]


@dataclass
class RecordingHandler:
    """Stores what it accepts; refuses recipients or DATA on demand."""

    messages: list[Received] = field(default_factory=list)
    refuse_rcpt: dict[str, str] = field(default_factory=dict)
    refuse_data: str | None = None
    rcpt_attempts: dict[str, int] = field(default_factory=dict)

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]
    ) -> str:
        self.rcpt_attempts[address] = self.rcpt_attempts.get(address, 0) + 1
        if address in self.refuse_rcpt:
            return self.refuse_rcpt[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.refuse_data:
            return self.refuse_data
        self.messages.append(
            Received(
                envelope.mail_from,
                tuple(envelope.rcpt_tos),
                envelope.original_content,
                authenticated=bool(session.authenticated),
                tls=server.transport.get_extra_info("ssl_object") is not None,
            )
        )
        return "250 Message accepted for delivery"

    def subjects(self) -> list[str]:
        return [r.message["Subject"] for r in self.messages]


class Authenticator:
    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user.encode(), password.encode()
        self.attempts = 0

    def __call__(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        self.attempts += 1
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == self.user
            and auth_data.password == self.password
        )
        return AuthResult(success=ok, handled=False)


class SmtpServer:
    """aiosmtpd in its own thread on a loopback port (``port`` may be fixed in advance)."""

    def __init__(self, port: int | None = None, **kwargs: Any) -> None:
        self.handler = RecordingHandler()
        self.port = port or free_port()
        self.kwargs = kwargs
        self.controller: Controller | None = None

    def start(self) -> SmtpServer:
        self.controller = Controller(
            self.handler, hostname="127.0.0.1", port=self.port, **self.kwargs
        )
        self.controller.start()
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None


@dataclass
class HttpRecord:
    path: str
    headers: dict[str, str]
    body: Any


class HttpServer:
    """A loopback helpdesk: answers each POST with ``status`` or, in ``hang`` mode, holds the
    request without answering until the test ends."""

    def __init__(self) -> None:
        self.requests: list[HttpRecord] = []
        self.status = 201
        self.hang = False
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - stdlib naming
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                if outer.hang:
                    outer.release.wait(30)
                    return
                outer.requests.append(
                    HttpRecord(self.path, dict(self.headers.items()), json.loads(raw or b"null"))
                )
                body = json.dumps(
                    {"id": 100000 + len(outer.requests)}
                    if outer.status < 300
                    else {"error": "internal trouble"}
                ).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/tickets"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> HttpServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
