"""Delivers queued GGUS tickets to a helpdesk REST API (POST JSON, ``Authorization: Token``).

2xx is sent; 5xx, 408, 429, a refused connection or a timeout is retried with backoff; any
other 4xx is the helpdesk refusing this ticket, which goes to dead-letter with its reply. The
POST goes through gridgate's one HTTP client (:mod:`gridgate.core.http`): its timeout is a
deadline over the whole exchange, a reply is read up to :data:`REPLY_BYTES`.
The token is read from its env/file spec at each delivery and never stored or logged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gridgate.core.http import HttpClient, HttpError
from gridgate.core.outbox import Delivery, Message
from gridgate.core.secrets import SecretError, read_secret
from gridgate.core.text import safe_url

REST_TRANSPORT = "rest"
RETRYABLE = {408, 425, 429}
#: The most of a helpdesk's reply that is read (it is quoted in the outbox, a few lines).
REPLY_BYTES = 64 * 1024


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
        # gridgate's one HTTP client: the timeout is a deadline over the whole exchange
        self.client = HttpClient(ca_file=ca_file or None, verify=verify, max_bytes=REPLY_BYTES)

    def deliver(self, message: Message) -> Delivery:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        try:
            token = read_secret(self.token)
        except SecretError as exc:
            return Delivery("retry", f"helpdesk token unavailable: {exc}")
        if token:
            headers["Authorization"] = f"Token {token}"
        data = json.dumps(message.payload["ticket"], ensure_ascii=False).encode("utf-8")
        try:
            answer = self.client.request(
                "POST",
                self.url,
                body=data,
                headers=headers,
                timeout=self.timeout,
                max_bytes=REPLY_BYTES,
                expect=None,
                idempotent=False,
            )
        except HttpError as exc:
            # a ticket whose answer was lost after it was sent may exist at the helpdesk; the
            # outbox retries it (the helpdesk's own duplicate check decides), saying so
            maybe = " (it may have been created: the request was sent)" if exc.sent else ""
            return Delivery("retry", f"{safe_url(self.url)}: {exc.phase}: {exc.detail}{maybe}")
        reply = f"{answer.status} {_text(answer.body)}"
        if 200 <= answer.status < 300:
            return Delivery("sent", reply)
        if answer.status >= 500 or answer.status in RETRYABLE:
            return Delivery("retry", reply)
        return Delivery("dead", reply)

    def finish(self) -> None:
        """Close the connections kept alive between messages."""
        self.client.close()
