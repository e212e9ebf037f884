"""gridgate's one HTTP client: every exchange under a wall-clock deadline and a size cap.

Everything in gridgate that speaks HTTP (a backend's REST calls, a demand source, a feed, a
notifier's delivery) goes through :class:`HttpClient`, built on urllib3 2.x's connection
classes. What it promises:

- **A wall-clock deadline over the whole exchange**: connection, TLS handshake, sending the
  request, the status line, the headers and the body together must fit in ``timeout`` seconds.
  A per-read timeout alone would let a server that answers ``HTTP/1.1 200 OK`` and then one
  header byte a second hold a caller for ever; here the process's one deadline watcher
  (:func:`gridgate.core.cutoff.cut_after`) shuts the socket down when an exchange's deadline
  passes, and every socket operation may also take only what is left. The caller gets :class:`HttpError` with ``phase`` ``timeout`` (``during`` says where
  it was cut).
- **A size cap**: the body is read up to ``max_bytes``; past it (or when ``Content-Length``
  says more) the exchange fails with ``phase`` ``too_large``, keeping what was read.
- **TLS verified** against a hashed CA folder (``ca_path``, the grid's ``X509_CERT_DIR``) or a
  CA file, and against the server's host name; optionally a **client certificate**
  (``cert_file``: an RFC 3820 proxy, certificate, key and chain in one PEM, which Python's ssl
  takes as it is), read again whenever the file changes (a renewed proxy is used at once).
- **Keep-alive connections per host**, reused while the server keeps them open. A server may
  close an idle one at any time; a request that fails on such a reused connection is sent
  again on a new one **only when that is safe**: its sending failed (the server cannot have
  acted on a request it did not receive whole), or it is idempotent (``GET``, ``PUT``...; or
  ``idempotent=True``). A ``POST`` that may have reached the server is never sent twice in
  silence: the caller gets ``phase`` ``receive`` with ``sent`` True, and decides.
- **One exception type**, :class:`HttpError`, naming the :data:`PHASES` member that failed:
  ``connect`` (refused, reset, unreachable, unresolvable), ``tls``, ``send``, ``receive``,
  ``timeout``, ``too_large``, ``status`` (an HTTP status the caller did not expect).

Redirects are not followed (a 3xx is a status like any other). Thread safe: one client may
serve many threads, each exchange on a connection of its own.

.. code-block:: python

    client = HttpClient(ca_path="/etc/grid-security/certificates", cert_file=proxy)
    try:
        answer = client.request("GET", "https://ce.example.org/arex/rest", timeout=30)
    except HttpError as exc:
        print(exc.phase, exc)   # e.g. "connect", "GET https://...: cannot connect: ..."
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import ssl
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)
from urllib3.exceptions import (
    HTTPError as Urllib3Error,
)
from urllib3.exceptions import SSLError as Urllib3SSLError

from gridgate.core.cutoff import cut_after
from gridgate.core.runner import DEFAULT_MAX_OUTPUT
from gridgate.core.text import parse_json, safe_url

if TYPE_CHECKING:
    from urllib3.response import HTTPResponse

__all__ = [
    "DEFAULT_MAX_BYTES",
    "IDEMPOTENT",
    "PHASES",
    "SUCCESS",
    "HttpClient",
    "HttpError",
    "Response",
]

#: The largest body read by default (bytes): the runner's output cap, so that an answer over
#: HTTP and a command's output are bounded alike.
DEFAULT_MAX_BYTES = DEFAULT_MAX_OUTPUT
#: What :attr:`HttpError.phase` may be, in the order an exchange goes through them.
PHASES: tuple[str, ...] = ("connect", "tls", "send", "receive", "timeout", "too_large", "status")
#: Methods that may be sent again when a reused connection broke before the answer (RFC 9110).
IDEMPOTENT: frozenset[str] = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})
#: The statuses :meth:`HttpClient.request` accepts unless told otherwise: 2xx.
SUCCESS: Collection[int] = range(200, 300)
#: Seconds an idle kept-alive connection is reused at most (servers close idle ones; A-REX
#: after a few minutes): an older one is closed rather than risked.
IDLE_REUSE = 50.0
#: Idle connections kept per host.
IDLE_PER_HOST = 8
READ_SIZE = 64 * 1024
#: A TLS connection the server closed (with or without close_notify): not a TLS failure.
_CLOSED = (ssl.SSLEOFError, ssl.SSLZeroReturnError)


@dataclass(frozen=True)
class Response:
    """A complete answer: its status, its headers (names in lower case) and its whole body.

    ``duration`` is the exchange's wall time in seconds (a retry on a new connection
    included)."""

    method: str
    url: str
    status: int
    reason: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    duration: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "headers", MappingProxyType({k.lower(): v for k, v in self.headers.items()})
        )

    def header(self, name: str, default: str = "") -> str:
        """The value of header ``name`` (any case), ``default`` when absent."""
        return self.headers.get(name.lower(), default)

    def text(self) -> str:
        """The body decoded as UTF-8 (undecodable bytes replaced)."""
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body parsed as JSON.

        :raises ValueError: when it is not JSON (an empty body included), not UTF-8, or
            nested past the recursion limit (:func:`gridgate.core.text.parse_json`)."""
        return parse_json(self.body)


class HttpError(Exception):
    """An HTTP exchange that failed, and in which :data:`PHASES` member.

    ``phase``: ``connect`` (refused, reset, no route, unresolvable), ``tls`` (the handshake,
    the server's certificate or name, our client certificate), ``send``, ``receive`` (the
    connection broke before the answer was complete), ``timeout`` (the deadline passed;
    ``during`` says in which part: ``connect``, ``TLS handshake``, ``send``, ``status line and
    headers``, ``body``), ``too_large`` (the body passed the cap; ``body`` holds what was
    kept), ``status`` (an unexpected HTTP status: ``status``, ``reason``, ``headers`` and the
    ``body`` are the server's).

    ``sent`` says whether the request may have reached the server whole (a failed ``POST``
    with ``sent`` True may have been acted on: do not repeat it blindly). ``local`` says that
    nothing left this machine because of something here (a client certificate that cannot be
    read). ``detail`` is the failure in a few words, without the method and URL that
    ``str(error)`` starts with.
    """

    def __init__(
        self,
        phase: str,
        method: str,
        url: str,
        detail: str,
        *,
        status: int | None = None,
        reason: str = "",
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        sent: bool = False,
        during: str = "",
        duration: float = 0.0,
        local: bool = False,
    ) -> None:
        if phase not in PHASES:
            raise ValueError(f"HttpError phase {phase!r} is not one of {PHASES}")
        self.phase = phase
        self.method = method
        self.url = url
        self.detail = detail
        self.status = status
        self.reason = reason
        self.headers: Mapping[str, str] = MappingProxyType(
            {k.lower(): v for k, v in (headers or {}).items()}
        )
        self.body = body
        self.sent = sent
        self.during = during
        self.duration = duration
        self.local = local
        super().__init__(f"{method} {safe_url(url)}: {detail}")


# --- the deadline -----------------------------------------------------------------------------


class _Exchange:
    """One exchange's deadline and the socket to shut down when it passes (:meth:`expire`, run
    by :func:`~gridgate.core.cutoff.cut_after`'s watcher)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self._lock = threading.Lock()
        self._conn: HTTPConnection | None = None
        self._socks: list[socket.socket] = []
        self.expired = False
        self.finished = False

    def attach(self, conn: HTTPConnection) -> None:
        with self._lock:
            self._conn = conn
        if self.expired:
            self.expire()

    def hold(self, sock: socket.socket | None) -> None:
        """Keep a reference to the connected socket: http.client drops its own when an answer
        ends the connection, and the body must still be cut at the deadline."""
        if sock is None:
            return
        with self._lock:
            self._socks.append(sock)
        if self.expired:
            self.expire()

    def expire(self) -> None:
        with self._lock:
            if self.finished:
                return
            self.expired = True
            socks = list(self._socks)
            if self._conn is not None and self._conn.sock is not None:
                socks.append(self._conn.sock)
            for sock in socks:
                try:
                    # the plain socket's shutdown, never SSLSocket's: that one also tears
                    # down the TLS state under the reading thread; this only makes its recv
                    # return at once (under the lock: never a socket handed back to the pool)
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass

    def release(self) -> bool:
        """End the watch; True when the deadline had not passed (the connection is whole)."""
        with self._lock:
            self.finished = True
            self._conn = None
            self._socks = []
            return not self.expired

    def finish(self) -> None:
        self.release()

    def sockets(self) -> list[socket.socket]:
        with self._lock:
            return list(self._socks)

    def left(self) -> float:
        """Seconds left; raises :class:`_Expired` when none are."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0 or self.expired:
            raise _Expired
        return remaining


class _Expired(Exception):
    """The exchange's deadline passed."""


# --- the client ----------------------------------------------------------------------------


class _Retry(Exception):
    """A reused connection broke where sending the request again is safe."""


def _reason(exc: BaseException) -> str:
    """A failure in a few words: the OS's text for an OSError, else the exception's."""
    cause = exc.__cause__ if isinstance(exc, NewConnectionError) else exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {cause.verify_message}"
    if isinstance(cause, OSError) and not isinstance(cause, ssl.SSLError) and cause.strerror:
        return cause.strerror
    text = str(cause) or type(cause).__name__
    return text.removeprefix("Failed to establish a new connection: ")


# --- one exchange, phase by phase --------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """One request as :meth:`HttpClient.request` was asked it: the same in both attempts."""

    method: str
    url: str
    target: str  # the path and query sent
    body: bytes | None
    headers: Mapping[str, str]
    cap: int
    expect: Collection[int] | None
    safe: bool  # may be sent again when a reused connection broke before the answer
    key: tuple[str, str, int]
    started: float
    timeout: float


@dataclass(frozen=True)
class _Head:
    """The status line and headers of an answer (header names in lower case)."""

    status: int
    reason: str
    headers: dict[str, str]


class _Attempt:
    """One try of a call on one connection, in its phases (connect, send, read the head, read
    the body, judge the status). Each phase names itself in ``during`` (where a cut deadline
    is said to have struck) and turns what fails into :class:`HttpError`, or into
    :class:`_Retry` where sending again on a new connection is safe. A phase may also raise
    :class:`_Expired` (no time left), which :meth:`HttpClient._exchange` reports."""

    def __init__(
        self, call: _Call, conn: HTTPConnection, reused: bool, exchange: _Exchange
    ) -> None:
        self.call = call
        self.conn = conn
        self.reused = reused
        self.exchange = exchange
        self.during = "connect"
        self.sent = False

    def fail(self, phase: str, detail: str, **extra: Any) -> HttpError:
        return HttpError(
            phase,
            self.call.method,
            self.call.url,
            detail,
            sent=self.sent,
            during=self.during,
            duration=time.monotonic() - self.call.started,
            **extra,
        )

    def expired(self) -> HttpError:
        return self.fail(
            "timeout",
            f"no complete answer within {self.call.timeout:g} s (cut during {self.during})",
        )

    def connect(self) -> None:
        """Connect and shake hands, unless the connection is a kept-alive one."""
        conn, exchange = self.conn, self.exchange
        if conn.sock is None:
            conn.timeout = exchange.left()
            try:
                conn.connect()
            except NameResolutionError as exc:
                host = self.call.key[1]
                raise self.fail("connect", f"cannot resolve {host}: {_reason(exc)}") from None
            except NewConnectionError as exc:  # before its base, ConnectTimeoutError
                raise self.fail("connect", _reason(exc)) from None
            except ConnectTimeoutError:
                raise self.expired() from None
            except (OSError, Urllib3Error, ValueError) as exc:
                # the TCP connection is made: what fails now is the handshake
                self.during = "TLS handshake"
                if exchange.expired or isinstance(exc, TimeoutError):
                    raise self.expired() from None
                raise self.fail("tls", _reason(exc)) from None
        exchange.hold(conn.sock)

    def send(self) -> None:
        """Send the request line, the headers and the body."""
        self.during = "send"
        call = self.call
        self.conn.timeout = self.exchange.left()
        try:
            self.conn.request(
                call.method,
                call.target,
                body=call.body,
                headers=call.headers,
                preload_content=False,
                decode_content=True,
            )
        except (OSError, http.client.HTTPException) as exc:
            if self.exchange.expired or isinstance(exc, TimeoutError):
                raise self.expired() from None
            if self.reused:
                raise _Retry from None  # not received whole: cannot have been acted on
            if isinstance(exc, ssl.SSLError) and not isinstance(exc, _CLOSED):
                raise self.fail("tls", _reason(exc)) from None
            raise self.fail("send", _reason(exc)) from None
        self.sent = True

    def read_head(self) -> tuple[HTTPResponse, _Head]:
        """Read the status line and the headers."""
        self.during = "status line and headers"
        self.conn.timeout = self.exchange.left()
        try:
            response = self.conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            if self.exchange.expired or isinstance(exc, TimeoutError):
                raise self.expired() from None
            nothing = isinstance(exc, http.client.RemoteDisconnected | ConnectionError)
            if self.reused and self.call.safe and (nothing or isinstance(exc, _CLOSED)):
                raise _Retry from None
            if isinstance(exc, ssl.SSLError) and not isinstance(exc, _CLOSED):
                raise self.fail("tls", _reason(exc)) from None
            if isinstance(exc, http.client.RemoteDisconnected):
                raise self.fail(
                    "receive", "the server closed the connection without an answer"
                ) from None
            raise self.fail("receive", _reason(exc)) from None
        if self.exchange.expired:  # cut in the headers: http.client took EOF for their end
            raise self.expired()
        head = _Head(
            int(response.status),
            str(response.reason or ""),
            {k.lower(): v for k, v in response.headers.items()},
        )
        return response, head

    def read_body(self, response: HTTPResponse, head: _Head) -> bytes:
        """Read the whole body, up to the cap."""
        self.during = "body"
        cap = self.call.cap
        length = head.headers.get("content-length", "")
        if length.isdigit() and int(length) > cap:
            raise self.too_large(
                head, f"the answer is {length} bytes, more than the cap of {cap} bytes"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = self._read_chunk(response, min(READ_SIZE, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                raise self.too_large(
                    head,
                    f"the answer is longer than the cap of {cap} bytes",
                    body=b"".join(chunks)[:cap],
                )
        if self.exchange.expired:
            raise self.expired()
        return b"".join(chunks)

    def _read_chunk(self, response: HTTPResponse, most: int) -> bytes:
        left = self.exchange.left()
        for sock in self.exchange.sockets():
            # closed once the body's end was read (an HTTP/1.0 answer, or
            # Connection: close): the next read then says so
            with contextlib.suppress(OSError):
                sock.settimeout(left)
        try:
            return response.read(most)
        except (OSError, Urllib3Error, http.client.HTTPException) as exc:
            if self.exchange.expired or isinstance(exc, TimeoutError | ReadTimeoutError):
                raise self.expired() from None
            if isinstance(exc, Urllib3SSLError):
                raise self.fail("tls", _reason(exc)) from None
            if isinstance(exc, ProtocolError):
                raise self.fail("receive", f"the answer broke off: {exc}") from None
            raise self.fail("receive", _reason(exc)) from None

    def too_large(self, head: _Head, detail: str, body: bytes = b"") -> HttpError:
        return self.fail(
            "too_large",
            detail,
            status=head.status,
            reason=head.reason,
            headers=head.headers,
            body=body,
        )

    def answer(self, head: _Head, payload: bytes) -> Response:
        """The :class:`Response`, or ``status`` when the call does not expect its status."""
        expect = self.call.expect
        if expect is not None and head.status not in expect:
            where = head.headers.get("location")
            raise self.fail(
                "status",
                f"HTTP {head.status} {head.reason}".rstrip() + (f" (to {where})" if where else ""),
                status=head.status,
                reason=head.reason,
                headers=head.headers,
                body=payload,
            )
        return Response(
            self.call.method,
            self.call.url,
            head.status,
            head.reason,
            head.headers,
            payload,
            time.monotonic() - self.call.started,
        )


class HttpClient:
    """An HTTP(S) client with keep-alive connections per host; see the module's docstring.

    :param ca_path: a hashed CA folder (``X509_CERT_DIR``) to verify servers against.
    :param ca_file: a PEM file of CA certificates, instead of or besides ``ca_path``; with
        neither, the system's trusted CAs.
    :param cert_file: a PEM file with the client certificate, its key and chain (an RFC 3820
        proxy), sent to https servers; read again when the file changes.
    :param max_bytes: the default cap on a body (bytes).
    :param user_agent: the ``User-Agent`` sent.
    :param verify: False skips the check of the server's certificate and name (only for a
        site that asked for it in its config, as the GGUS notifier's ``verify: false``).
    """

    def __init__(
        self,
        *,
        ca_path: str | os.PathLike[str] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        user_agent: str = "gridgate",
        verify: bool = True,
    ) -> None:
        self.ca_path = os.fspath(ca_path) if ca_path else None
        self.ca_file = os.fspath(ca_file) if ca_file else None
        self.cert_file = os.fspath(cert_file) if cert_file else None
        self.max_bytes = int(max_bytes)
        self.user_agent = user_agent
        self.verify = verify
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, str, int], list[tuple[HTTPConnection, float, int]]] = {}
        self._context: ssl.SSLContext | None = None
        self._context_key: tuple[int, int, int] | None = None
        self._generation = 0

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every idle connection (the client stays usable: new ones are made)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn, _since, _gen in conns:
                conn.close()

    # --- one request ---------------------------------------------------------------------

    def request(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        body: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        max_bytes: int | None = None,
        expect: Collection[int] | None = SUCCESS,
        idempotent: bool | None = None,
    ) -> Response:
        """Send one request and read its whole answer, within ``timeout`` seconds in all.

        :param method: ``GET``, ``POST``, ``PUT``...
        :param url: an ``http://`` or ``https://`` URL; its path and query are sent as given.
        :param timeout: the wall-clock deadline of the whole exchange, in seconds (a retry on
            a new connection included).
        :param body: what to send (``str`` is sent as UTF-8); ``Content-Length`` is set.
        :param headers: extra request headers.
        :param max_bytes: the cap on the body for this request (default: the client's).
        :param expect: the statuses that are an answer; any other raises :class:`HttpError`
            with ``phase`` ``status`` (after its body was read). None accepts every status.
        :param idempotent: whether sending the request twice does no harm (default: by
            method, :data:`IDEMPOTENT`); decides whether it is sent again when a reused
            connection broke before any answer.
        :raises HttpError: see the module's docstring for each phase.
        :raises ValueError: for a URL that is not http(s) with a host.
        """
        method = method.upper()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {safe_url(url)!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ValueError(f"{safe_url(url)!r}: {exc}") from None
        started = time.monotonic()
        deadline = started + max(float(timeout), 0.001)
        call = _Call(
            method=method,
            url=url,
            target=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            body=body.encode() if isinstance(body, str) else body,
            headers={"User-Agent": self.user_agent, **dict(headers or {})},
            cap=self.max_bytes if max_bytes is None else int(max_bytes),
            expect=expect,
            safe=(method in IDEMPOTENT) if idempotent is None else bool(idempotent),
            key=(parts.scheme, parts.hostname, port),
            started=started,
            timeout=timeout,
        )
        for attempt in (0, 1):
            conn, reused = self._checkout(call.key, method, url, started, fresh=attempt > 0)
            exchange = _Exchange(deadline)
            exchange.attach(conn)
            with cut_after(deadline - time.monotonic(), exchange.expire):
                try:
                    return self._exchange(_Attempt(call, conn, reused, exchange))
                except _Retry:
                    continue
                finally:
                    exchange.finish()
        raise AssertionError("unreachable: the second attempt is on a new connection")

    def _exchange(self, attempt: _Attempt) -> Response:
        """One attempt's phases; its connection goes back to the idle ones only when the whole
        answer was read in time and the server keeps the connection open."""
        keep = False
        try:
            try:
                attempt.connect()
                attempt.send()
                response, head = attempt.read_head()
                payload = attempt.read_body(response, head)
                keep = attempt.conn.sock is not None
            except _Expired:
                raise attempt.expired() from None
        finally:
            if keep and attempt.exchange.release():
                self._checkin(attempt.call.key, attempt.conn)
            else:
                attempt.conn.close()
        return attempt.answer(head, payload)

    # --- connections ----------------------------------------------------------------------

    def _checkout(
        self, key: tuple[str, str, int], method: str, url: str, started: float, fresh: bool
    ) -> tuple[HTTPConnection, bool]:
        """An idle connection to ``key`` that the server has not closed (unless ``fresh``), or
        a new one; and whether it was reused."""
        scheme, host, port = key
        context = self._ssl_context(method, url, started) if scheme == "https" else None
        now = time.monotonic()
        stale: list[HTTPConnection] = []
        found: HTTPConnection | None = None
        with self._lock:
            idle = [] if fresh else self._idle.get(key, [])
            while idle:
                conn, since, generation = idle.pop()
                if generation == self._generation and now - since < IDLE_REUSE:
                    found = conn
                    break
                stale.append(conn)
        for conn in stale:
            conn.close()
        if found is not None:
            if found.is_connected:  # the server has not closed it (no EOF waiting)
                return found, True
            found.close()
        if scheme == "https":
            return (
                HTTPSConnection(host, port, ssl_context=context, server_hostname=host),
                False,
            )
        return HTTPConnection(host, port), False

    def _checkin(self, key: tuple[str, str, int], conn: HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < IDLE_PER_HOST:
                idle.append((conn, time.monotonic(), self._generation))
                return
        conn.close()

    def _ssl_context(self, method: str, url: str, started: float) -> ssl.SSLContext:
        """The TLS context, made again when the client certificate's file changed (its idle
        connections, made with the old one, are then dropped)."""

        def local(detail: str) -> HttpError:
            return HttpError(
                "tls", method, url, detail, duration=time.monotonic() - started, local=True
            )

        stamp: tuple[int, int, int] | None = None
        if self.cert_file:
            try:
                info = os.stat(self.cert_file)
            except OSError as exc:
                raise local(
                    f"cannot read the client certificate {self.cert_file}: {exc.strerror}"
                ) from None
            stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            if self._context is not None and stamp == self._context_key:
                return self._context
            try:
                context = ssl.create_default_context(cafile=self.ca_file, capath=self.ca_path)
                if not self.verify:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                if self.cert_file:
                    context.load_cert_chain(self.cert_file)
            except (OSError, ssl.SSLError, ValueError) as exc:
                what = self.cert_file or self.ca_file or self.ca_path
                raise local(f"cannot load the TLS credentials ({what}): {_reason(exc)}") from None
            if self._context is not None:
                self._generation += 1  # connections made with the old certificate go
            self._context, self._context_key = context, stamp
            return context
