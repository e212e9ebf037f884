"""A TLS-terminating HTTP relay on its own loopback port, in front of a real HTTPS server (the
private ARC CE): it forwards every request and can lose the answers to chosen requests or close
connections as soon as they are idle, so a test gets a server whose answer never arrives, or
which closes a kept-alive connection, on demand, without a stand-in for the server itself."""

from __future__ import annotations

import contextlib
import http.client
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Relay:
    """A relay in front of the HTTPS server at ``host:upstream_port`` (reached with the client
    context ``upstream``), presenting ``cert``/``key`` itself. ``lose(method, path)`` says
    whether the answer to a request is lost (the request reaches the server, its answer does
    not come back: the connection is closed); ``idle_close`` closes a client connection idle
    that many seconds. ``requests`` lists (method, path) of every request, ``lost`` those
    whose answer was lost; ``url`` is the relay's own ``https://host:port``."""

    def __init__(
        self,
        upstream_port: int,
        upstream: ssl.SSLContext,
        cert: str | Path,
        key: str | Path,
        lose: Callable[[str, str], bool] = lambda method, path: False,
        idle_close: float | None = None,
        host: str = "localhost",
    ) -> None:
        self.lose = lose
        self.requests: list[tuple[str, str]] = []
        self.lost: list[tuple[str, str]] = []
        self.connections = 0
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = idle_close

            def setup(self) -> None:
                super().setup()
                relay.connections += 1

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                relay.requests.append((self.command, self.path))
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("content-type", "accept", "range", "authorization")
                }
                conn = http.client.HTTPSConnection(
                    host, upstream_port, context=upstream, timeout=60
                )
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                finally:
                    conn.close()
                if relay.lose(self.command, self.path):
                    relay.lost.append((self.command, self.path))
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(2)
                    return
                self.send_response(answer.status, answer.reason)
                for name in ("Content-Type", "Location", "Content-Range"):
                    if answer.getheader(name):
                        self.send_header(name, answer.getheader(name))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _forward

        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(str(cert), str(key))

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self):  # the handshake in the handler's thread, not the loop's
                sock, address = self.socket.accept()
                return server_context.wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                ), address

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"https://{host}:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)
