"""Serving a Prometheus registry over HTTP from one thread, inside a fixed descriptor budget: the
director's metrics (``director.metrics_port``, :mod:`gridgate.core.engine.metrics`) and a
plugin's own (the token daemon's) are served this way."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from typing import Any, cast

from loguru import logger
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
)

from gridgate.core._moved import moved_names

__all__ = ["serve_registry", "stop_server"]

#: Connections a metrics port holds at once (each is a descriptor of the process it serves);
#: a new one beyond this closes the oldest that has not yet sent its request.
MAX_CONNECTIONS = 4
#: Seconds a connection may take to send its request and read the reply.
SCRAPE_TIMEOUT = 5.0
#: Connections accepted per second at most: a client that reconnects as fast as it is closed
#: costs the process this many accepts a second, not a core.
ACCEPT_RATE = 200.0
#: Seconds a connection is kept before a newer one may evict it for sending nothing: a scraper
#: that is slow to send its request after connecting (a loaded machine) is not taken for idle.
#: At MAX_CONNECTIONS per this time an idle flood is cleared as fast as ACCEPT_RATE allows.
EVICT_AFTER = 0.02
#: A request (line and headers) longer than this is refused.
MAX_REQUEST = 8192


class _Scrape:
    __slots__ = ("sock", "deadline", "inbuf", "outbuf", "replying")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.inbuf, self.outbuf = bytearray(), b""
        self.replying = False


class MetricsServer:
    """``/metrics`` over HTTP from one thread, inside a fixed descriptor budget.

    prometheus_client's own server gave each connection a thread and a descriptor with no
    timeout, so idle connections (every local user can reach 127.0.0.1) took the descriptors
    and the threads of the process whose metrics it served: the token daemon stopped answering
    root and the gates, the director its own commands. Here at most ``max_connections`` are
    open; a new one closes the oldest that has not sent its request (a scraper sends it at
    once, an idle flood never does), each must finish within ``timeout`` seconds, accepts are
    limited to :data:`ACCEPT_RATE` a second, and the rest wait in the kernel's backlog.
    Has the parts of ``http.server`` that :func:`stop_server` uses.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        port: int,
        address: str = "127.0.0.1",
        max_connections: int = MAX_CONNECTIONS,
        timeout: float = SCRAPE_TIMEOUT,
        accept_rate: float = ACCEPT_RATE,
    ) -> None:
        self.registry = registry
        self.max_connections, self.timeout, self.accept_rate = max_connections, timeout, accept_rate
        family, _, _, _, sockaddr = socket.getaddrinfo(
            address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self._listen = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listen.bind(sockaddr)
            self._listen.listen(64)
            self._listen.setblocking(False)
            self._wake_r, self._wake_w = socket.socketpair()
        except BaseException:
            self._listen.close()
            raise
        self.server_address = self._listen.getsockname()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._scrapes: dict[socket.socket, _Scrape] = {}  # in accept order
        self._listening = False
        #: no accept before this instant: every open connection is too young to evict
        self._held_until = 0.0
        self._tokens = accept_rate
        self._refilled = time.monotonic()
        self._stopped = threading.Event()
        #: counts since start, for tests and status: accepted, served, evicted, timed_out
        self.counts = {"accepted": 0, "served": 0, "evicted": 0, "timed_out": 0}
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)
        self._thread.start()

    # -- the loop (one thread)

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                now = time.monotonic()
                self._refill(now)
                self._set_listening(self._tokens >= 1 and now >= self._held_until)
                waits = [s.deadline - now for s in self._scrapes.values()]
                if not self._listening:
                    waits.append(max(1.0 / self.accept_rate, self._held_until - now))
                timeout = max(0.0, min(waits)) if waits else None
                for key, mask in self._sel.select(timeout):
                    if key.fileobj is self._listen:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        return
                    else:
                        # every other registered file is a scrape's socket
                        self._serve(self._scrapes.get(cast(socket.socket, key.fileobj)), mask)
                now = time.monotonic()
                for scrape in [s for s in self._scrapes.values() if s.deadline <= now]:
                    self.counts["timed_out"] += 1
                    self._drop(scrape)
        except Exception:  # noqa: BLE001 -- the metrics must never take their process down
            logger.opt(exception=True).error("metrics server stopped")
        finally:
            for scrape in list(self._scrapes.values()):
                self._drop(scrape)

    def _refill(self, now: float) -> None:
        self._tokens = min(
            self.accept_rate, self._tokens + (now - self._refilled) * self.accept_rate
        )
        self._refilled = now

    def _set_listening(self, on: bool) -> None:
        if on != self._listening:
            if on:
                self._sel.register(self._listen, selectors.EVENT_READ)
            else:
                self._sel.unregister(self._listen)
            self._listening = on

    def _accept(self) -> None:
        # One connection per turn of the loop: the sockets accepted before it are read in
        # between, so a scraper whose request arrives a moment after its accept is seen
        # sending before a burst from the backlog could evict it as idle.
        if self._tokens >= 1:
            if len(self._scrapes) >= self.max_connections:
                # a request that came in since the last turn makes its scrape no eviction
                # candidate: read what the waiting ones have sent first
                for scrape in [s for s in self._scrapes.values() if not s.replying]:
                    self._serve(scrape, selectors.EVENT_READ)
                waiting = [s for s in self._scrapes.values() if not s.replying]
                if waiting:
                    evictable = waiting[0].deadline - self.timeout + EVICT_AFTER
                    if time.monotonic() < evictable:
                        self._held_until = evictable  # the newcomer waits in the backlog
                        return
            try:
                conn, _ = self._listen.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError:
                # out of descriptors: leave the clients in the backlog, try after a pause
                self._tokens = 0
                return
            self._tokens -= 1
            self.counts["accepted"] += 1
            if len(self._scrapes) >= self.max_connections:
                waiting = [s for s in self._scrapes.values() if not s.replying]
                if not waiting:
                    conn.close()
                    return
                self.counts["evicted"] += 1
                self._drop(waiting[0])
            conn.setblocking(False)
            scrape = _Scrape(conn, time.monotonic() + self.timeout)
            self._scrapes[conn] = scrape
            self._sel.register(conn, selectors.EVENT_READ)
            self._serve(scrape, selectors.EVENT_READ)  # a scraper's request is there already

    def _serve(self, scrape: _Scrape | None, mask: int) -> None:
        if scrape is None:
            return
        try:
            if not scrape.replying and mask & selectors.EVENT_READ:
                data = scrape.sock.recv(4096)
                if not data:
                    self._drop(scrape)
                    return
                scrape.inbuf += data
                head = bytes(scrape.inbuf)
                if b"\r\n\r\n" not in head and b"\n\n" not in head:
                    if len(head) > MAX_REQUEST:
                        self._reply(scrape, 431, b"request too long\n")
                    return
                self._answer(scrape, head)
            if scrape.replying:
                sent = scrape.sock.send(scrape.outbuf)
                scrape.outbuf = scrape.outbuf[sent:]
                if not scrape.outbuf:
                    self.counts["served"] += 1
                    self._drop(scrape)
        except BlockingIOError:
            return
        except OSError:
            self._drop(scrape)

    def _answer(self, scrape: _Scrape, head: bytes) -> None:
        parts = head.split(b"\n", 1)[0].split()
        method = parts[0] if parts else b""
        path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
        if method not in (b"GET", b"HEAD"):
            self._reply(scrape, 405, b"only GET\n")
        elif path not in (b"/metrics", b"/"):
            self._reply(scrape, 404, b"not found: /metrics\n")
        else:
            body = generate_latest(self.registry)
            self._reply(
                scrape,
                200,
                body if method == b"GET" else b"",
                CONTENT_TYPE_LATEST,
                length=len(body),
            )

    def _reply(
        self,
        scrape: _Scrape,
        code: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        length: int | None = None,
    ) -> None:
        reason = {
            200: "OK",
            404: "Not Found",
            405: "Method Not Allowed",
            431: "Request Header Fields Too Large",
        }[code]
        head = (
            f"HTTP/1.0 {code} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n"
            "Connection: close\r\n\r\n"
        ).encode("ascii")
        scrape.outbuf, scrape.replying = head + body, True
        self._sel.modify(scrape.sock, selectors.EVENT_WRITE)

    def _drop(self, scrape: _Scrape) -> None:
        if self._scrapes.pop(scrape.sock, None) is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(scrape.sock)
        scrape.sock.close()

    # -- what stop_server calls

    def shutdown(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(10)

    def server_close(self) -> None:
        for sock in (self._listen, self._wake_r, self._wake_w):
            sock.close()
        self._sel.close()

    @property
    def open_connections(self) -> int:
        return len(self._scrapes)


def serve_registry(
    registry: CollectorRegistry, port: int, address: str = "127.0.0.1"
) -> tuple[Any, int]:
    """Expose ``registry`` over HTTP on ``address:port``, from a thread of its own (a token
    daemon serves its own metrics this way, as the director does).

    :param registry: the prometheus_client registry to expose.
    :param port: the TCP port (0: any free one).
    :param address: the address to bind.
    :returns: the server (for :func:`stop_server`) and the port it bound (useful with port 0).
    :raises OSError: when the address cannot be bound.
    """
    server = MetricsServer(registry, port, address)
    return server, int(server.server_address[1])


def stop_server(server: Any) -> None:
    """Stop ``server`` (made by :func:`serve_registry`) and close its socket.

    :param server: what :func:`serve_registry` returned first; None is a no-op.
    """
    if server is not None:
        server.shutdown()
        server.server_close()


#: DirectorMetrics (API 1.4 internal) is the engine's, gridgate.core.engine.metrics
__getattr__ = moved_names(__name__)
