"""A real HTTP server on 127.0.0.1 (port 0) for the tests of what core fetches over HTTP.

One server for every reader of a URL (the waiting and queue demand sources, the GOCDB feed,
the availability step): it answers each GET with what its :class:`Answers` say at that moment,
so a test changes the answers between two reads. ``mode`` makes it misbehave: ``hang`` holds
the request without a byte, ``trickle`` sends a byte every 50 ms of a body announced as 1 MB
(each read is quick, only a whole-request deadline ends it). ``stuck`` counts the handlers
inside a hang or trickle right now: proof that the client gave up before the server did.
"""

from __future__ import annotations

import http.server
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answers:
    """What the server answers next; ``mode`` is ok, hang or trickle."""

    status: int = 200
    body: bytes = b"{}"
    mode: str = "ok"
    headers: dict[str, str] = field(default_factory=dict)
    #: False: no Content-Length (HTTP/1.0, the body ends with the connection)
    length: bool = True
    release: threading.Event = field(default_factory=threading.Event)
    stuck: int = 0
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        answers = self.server.answers
        with answers.lock:
            answers.requests += 1
        if answers.mode == "hang":
            with answers.lock:
                answers.stuck += 1
            answers.release.wait(60)
            with answers.lock:
                answers.stuck -= 1
            return
        self.send_response(answers.status)
        for name, value in answers.headers.items():
            self.send_header(name, value)
        if answers.mode == "trickle":
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            with answers.lock:
                answers.stuck += 1
            try:
                while not answers.release.wait(0.05):
                    self.wfile.write(b" ")
                    self.wfile.flush()
            except OSError:
                pass  # the client gave up mid-trickle (its deadline): what the test wants
            finally:
                with answers.lock:
                    answers.stuck -= 1
            return
        if answers.length:
            self.send_header("Content-Length", str(len(answers.body)))
        self.end_headers()
        self.wfile.write(answers.body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    answers: Answers


class WebServer:
    """Serves ``answers`` from start() to stop() (or as a context manager); ``tls`` wraps the
    socket in that server-side context, for https:// URLs."""

    def __init__(self, answers: Answers | None = None, tls: ssl.SSLContext | None = None):
        self.answers = answers or Answers()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.answers = self.answers
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    def url(self, path: str = "/") -> str:
        """This server's URL for ``path`` (which starts with '/')."""
        return f"{self._scheme}://127.0.0.1:{self._server.server_address[1]}{path}"

    def start(self) -> WebServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Releases any hanging or trickling handler, then stops serving and closes the port."""
        self.answers.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> WebServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
