"""Delivers queued GGUS tickets to a helpdesk REST API (POST JSON, ``Authorization: Token``).

2xx is sent; 5xx, 408, 429, a refused connection or a timeout is retried with backoff; any
other 4xx is the helpdesk refusing this ticket, which goes to dead-letter with its reply.
The token is read from its env/file spec at each delivery and never stored or logged.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping

from gridgate.core.config import SecretError, read_secret
from gridgate.core.outbox import Delivery, Message

REST_TRANSPORT = "rest"
RETRYABLE = {408, 425, 429}


def _text(raw: bytes) -> str:
    return " ".join(raw.decode("utf-8", "replace").split())[:500]


class RestTransport:
    """POSTs ``message.payload["ticket"]`` as JSON to ``url``."""

    def __init__(
        self,
        url: str,
        token: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        ca_file: str = "",
        verify: bool = True,
    ) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        self.ca_file = ca_file
        self.verify = verify

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file or None)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def deliver(self, message: Message) -> Delivery:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "gridgate",
        }
        try:
            token = read_secret(self.token)
        except SecretError as exc:
            return Delivery("retry", f"helpdesk token unavailable: {exc}")
        if token:
            headers["Authorization"] = f"Token {token}"
        data = json.dumps(message.payload["ticket"], ensure_ascii=False).encode("utf-8")
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout, context=self._context()
            ) as response:
                return Delivery("sent", f"{response.status} {_text(response.read(4096))}")
        except urllib.error.HTTPError as exc:
            reply = f"{exc.code} {_text(exc.read(4096) if exc.fp else b'')}"
            if exc.code >= 500 or exc.code in RETRYABLE:
                return Delivery("retry", reply)
            return Delivery("dead", reply)
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return Delivery("retry", f"{self.url}: {type(exc).__name__}: {reason}")

    def finish(self) -> None:
        """Nothing kept open between messages."""
