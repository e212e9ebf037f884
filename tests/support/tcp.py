"""A loopback TCP server running a handler per connection, and handlers that misbehave:
for the tests of every client that must hold a deadline over a whole exchange (HTTP, SMTP,
Redis...). ``serve`` is the fixture (``from support.tcp import serve``)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest


class Server:
    """A TCP server on 127.0.0.1 that runs ``handler(connection)`` for each connection (TLS
    when given a context: the handshake happens in the handler's thread, so a silent server is
    silent in the handshake too). ``connections`` counts them."""

    def __init__(
        self,
        handler: Callable[[socket.socket], None],
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.handler = handler
        self.context = context
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def url(self, path: str = "/", host: str = "localhost") -> str:
        scheme = "https" if self.context else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.context is not None:
                conn.settimeout(10)
                conn = self.context.wrap_socket(conn, server_side=True)
                self._open.append(conn)
            self.handler(conn)
        except (OSError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def stop(self) -> None:
        self._stop.set()
        self.listener.close()
        for conn in self._open:
            with contextlib.suppress(OSError):
                conn.close()
        self._thread.join(5)


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(handler, context=None) -> Server:
        server = Server(handler, context)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def trickle_after(
    prefix: bytes,
    drip: bytes,
    pause: float = 0.2,
    *,
    first: Callable[[socket.socket], bytes] | None = None,
):
    """A handler that waits for ``first(conn)`` (when given: read a request), sends ``prefix``
    at once, then ``drip`` a byte every ``pause`` seconds (a byte a second scaled down: a
    per-read timeout never fires)."""

    def handler(conn: socket.socket) -> None:
        if first is not None and not first(conn):
            return
        conn.sendall(prefix)
        for byte in drip:
            time.sleep(pause)
            conn.sendall(bytes([byte]))
        time.sleep(30)

    return handler


def silent(conn: socket.socket) -> None:
    """Accepts, then says nothing (not even the TLS handshake)."""
    time.sleep(30)
