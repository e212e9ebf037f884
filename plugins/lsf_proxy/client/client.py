"""Synchronous, thread-safe client of the token daemon: acquire/release, retries, fail-over.

A token lives as long as the connection that acquired it, so each granted token keeps its
connection until it is released; idle connections are pooled for the next request.
"""

from __future__ import annotations

import itertools
import os
import pwd
import random
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.documents import DocumentError
from gridgate.core.secrets import read_secret
from gridgate.plugins.lsf_proxy.config import host_name, parse_address, resolve_socket
from gridgate.plugins.lsf_proxy.documents import (
    ReplyError,
    envelope,
    hello_reply,
    reply_line,
    token_reply,
)
from gridgate.plugins.lsf_proxy.protocol import encode, sign
from gridgate.plugins.lsf_proxy.wire import (
    PROTOCOL_VERSION,
    ConnectionBroken,
    DaemonBusy,
    NoToken,
    ProxyError,
    ProxyUnavailable,
    RequestFailed,
    blocked_message,
    busy_error,
    connect_failed,
    next_daemon,
)

if TYPE_CHECKING:
    from gridgate.plugins.lsf_proxy.client.settings import ClientSettings


@dataclass(frozen=True)
class Daemon:
    """One daemon a client may talk to: a display name and an address."""

    name: str
    address: str


def _local_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


class Connection:
    """One blocking connection speaking the line protocol; not shared between threads."""

    def __init__(
        self,
        daemon: Daemon,
        timeout: float,
        key: str | None,
        user: str,
        host: str,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.daemon = daemon
        self._key, self._user, self._host, self._clock = key, user, host, clock
        kind, target = parse_address(daemon.address)
        where: Any = target  # a path, (host, port), then what getaddrinfo answers
        self.tcp = kind == "tcp"
        if self.tcp and not key:
            raise ProxyError(f"{daemon.name}: TCP needs the shared key (proxyd.key)")
        family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
        if self.tcp:
            try:
                infos = socket.getaddrinfo(target[0], target[1], type=socket.SOCK_STREAM)
            except OSError as exc:
                raise ConnectionBroken(
                    f"{daemon.name}: cannot resolve {daemon.address}: {exc}"
                ) from None
            family, where = infos[0][0], infos[0][4]
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(where)
        except OSError as exc:
            self._sock.close()
            raise connect_failed(daemon.name, daemon.address, exc) from None
        self._buffer = bytearray()
        self._ids = itertools.count(1)
        self._challenge: str | None = None
        self._daemon_name: str | None = None
        if self.tcp:
            self._handshake(timeout)

    def _handshake(self, timeout: float) -> None:
        """Over TCP, learn the connection's challenge (and the daemon's name), which every
        signature then covers so that it is good on this connection only (protocol.md)."""
        try:
            reply = self.call("hello", timeout)
        except RequestFailed as exc:
            self.close()
            raise ConnectionBroken(f"{self.daemon.name}: hello refused: {exc}") from None
        try:
            head, hello = envelope(reply), hello_reply(reply)
        except DocumentError as exc:
            self.close()
            raise ConnectionBroken(f"{self.daemon.name}: {exc}") from None
        if not head.ok:
            self.close()
            raise ConnectionBroken(f"{self.daemon.name}: hello refused: {reply.get('error')}")
        self._challenge = hello.challenge
        self._daemon_name = hello.name if self._challenge is not None else None

    def call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its reply (events in between are skipped)."""
        msg_id = next(self._ids)
        message: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": msg_id, "op": op, **fields}
        if self.tcp and (self._challenge is not None or op != "hello"):
            assert self._key is not None
            sign(
                message,
                self._key,
                self._user,
                self._host,
                self._clock,
                challenge=self._challenge,
                daemon=self._daemon_name,
            )
        # ``timeout`` is the whole call's: a daemon that sends its reply a byte at a time, or
        # events without end before it, is cut when it has run out (each recv gets what is left)
        deadline = time.monotonic() + timeout
        try:
            self._sock.settimeout(timeout)
            try:
                self._sock.sendall(encode(message))
            except OSError:
                self._turned_away()
                raise
            while True:
                reply = self._read_line(deadline)
                head = envelope(reply)
                if head.id == msg_id:
                    return reply
                if head.id is None and head.ok is False:
                    error = head.error or ReplyError()
                    busy = busy_error(self.daemon.name, error.code, error.message)
                    if busy is not None:
                        # the daemon is there and closes this connection for lack of room
                        self.close()
                        raise busy
                    raise RequestFailed(error.code, error.message)
        except TimeoutError as exc:
            self.close()
            raise DaemonBusy(
                f"{self.daemon.name}: no reply within {timeout:.0f} s: {exc}"
            ) from None
        except (OSError, ValueError) as exc:
            self.close()
            raise ConnectionBroken(f"{self.daemon.name}: {type(exc).__name__}: {exc}") from None

    def _turned_away(self) -> None:
        """After a failed send: a daemon that turned this connection away at once wrote why
        before closing it; raise that as busy rather than as a broken connection."""
        try:
            self._sock.settimeout(0.5)
            head = envelope(self._read_line())
        except (OSError, ValueError):
            return
        error = head.error or ReplyError()
        busy = busy_error(self.daemon.name, error.code, error.message) if head.id is None else None
        if busy is not None:
            self.close()
            raise busy

    def _read_line(self, deadline: float | None = None) -> dict[str, Any]:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                return reply_line(line)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the whole reply did not come in time")
                self._sock.settimeout(left)
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self._buffer += chunk

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


@dataclass
class Token:
    """A granted token (or permission to proceed without one: ``proceed`` is True).

    Use it as a context manager to release it on exit.
    """

    id: str
    category: str
    daemon: str = ""
    proceed: bool = False
    reason: str = ""
    waited: float = 0.0
    privileged: bool = False
    #: the niceness the daemon asks the token's command to run at (its user is busy:
    #: ``busy_after``); 0: as it is. A caller that runs a command under the token honours it
    #: as the gate does (``nice -n``), one that runs none has nothing to lower.
    nice: int = 0
    _client: ProxyClient | None = field(default=None, repr=False)
    _conn: Connection | None = field(default=None, repr=False)
    released: bool = False

    def release(self) -> None:
        if self._client is not None:
            self._client.release(self)

    def __enter__(self) -> Token:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class HostReply:
    """One daemon's answer to an admin command: ``reply`` or ``error`` (unreachable;
    ``busy``: it is there but did not serve the command in time or at all, rather than
    refusing the connection)."""

    daemon: Daemon
    reply: Mapping[str, Any] | None = None
    error: str = ""
    busy: bool = False


class ProxyClient:
    """Takes tokens from one or several daemons.

    :param daemons: the daemons sharing the limits (a host is picked at random, the next one
        tried when it does not answer); default: the local socket.
    :param notoken_ntries: attempts when denied before giving up; None retries forever.
    :param when_unavailable: ``proceed`` (a warning, a token-less pass) or ``fail``.
    """

    def __init__(
        self,
        daemons: Sequence[Daemon] | None = None,
        *,
        key: str | None = None,
        user: str | None = None,
        host: str | None = None,
        notoken_ntries: int | None = None,
        when_unavailable: str = "proceed",
        connect_timeout: float = 5.0,
        reply_timeout: float = 60.0,
        backoff: tuple[float, float] = (0.1, 5.0),
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        if when_unavailable not in ("proceed", "fail"):
            raise ValueError("when_unavailable must be proceed or fail")
        if notoken_ntries is not None and notoken_ntries < 1:
            raise ValueError("notoken_ntries must be positive (None: unlimited)")
        self.daemons = list(daemons or [Daemon(host_name(), resolve_socket(None))])
        self.key = key
        self.user = user or _local_user()
        self.host = host or host_name()
        self.notoken_ntries = notoken_ntries
        self.when_unavailable = when_unavailable
        self.connect_timeout = connect_timeout
        self.reply_timeout = reply_timeout
        self.backoff = backoff
        self.clock = clock
        self.rng = rng or random.Random()
        self._lock = threading.Lock()
        self._idle: dict[str, list[Connection]] = {}
        #: address -> monotonic time until which a daemon that did not answer is tried last,
        #: so that a dead host (over TCP each try may cost connect_timeout) is not tried first
        #: by every other request
        self._down: dict[str, float] = {}
        self.down_for = 30.0

    @classmethod
    def from_section(
        cls, section: Mapping[str, Any], socket_path: str | None = None, **overrides: Any
    ) -> ProxyClient:
        """A client configured by a ``proxyd:`` section (``--socket`` wins over its hosts)."""
        # here, not at the top: importing the client must not import the settings machinery
        from gridgate.plugins.lsf_proxy.client.settings import ClientSettings

        return cls.from_settings(ClientSettings.of(section), socket_path, **overrides)

    @classmethod
    def from_settings(
        cls, settings: ClientSettings, socket_path: str | None = None, **overrides: Any
    ) -> ProxyClient:
        """A client configured by the client's part of a ``proxyd:`` section, already read."""
        if socket_path or os.environ.get("GRIDGATE_PROXYD_SOCKET") or not settings.hosts:
            daemons = [
                Daemon(host_name(), resolve_socket(socket_path, {"socket": settings.socket}))
            ]
        else:
            daemons = [Daemon(h.name, h.address) for h in settings.hosts]
        needs_key = any(not d.address.startswith("/") for d in daemons)
        options: dict[str, Any] = {
            "key": read_secret(settings.key) if needs_key else None,
            "notoken_ntries": settings.notoken_ntries,
            "when_unavailable": settings.when_unavailable,
            "connect_timeout": settings.client_timeout,
            "reply_timeout": settings.reply_timeout,
        }
        options.update(overrides)
        return cls(daemons, **options)

    # -- connections

    def _connect(self, daemon: Daemon) -> tuple[Connection, bool]:
        with self._lock:
            pool = self._idle.get(daemon.address)
            if pool:
                return pool.pop(), True
        return Connection(
            daemon, self.connect_timeout, self.key, self.user, self.host, self.clock
        ), False

    def _park(self, conn: Connection) -> None:
        with self._lock:
            self._idle.setdefault(conn.daemon.address, []).append(conn)

    def _call(
        self, daemon: Daemon, op: str, timeout: float, **fields: Any
    ) -> tuple[Connection, dict[str, Any]]:
        """One request to ``daemon``; a pooled connection that went stale is replaced once."""
        conn, pooled = self._connect(daemon)
        try:
            return conn, conn.call(op, timeout, **fields)
        except ConnectionBroken:
            if not pooled:
                raise
        conn = Connection(daemon, self.connect_timeout, self.key, self.user, self.host, self.clock)
        return conn, conn.call(op, timeout, **fields)

    def _order(self) -> list[Daemon]:
        """A random rotation (spreads load), daemons that recently did not answer last."""
        start = self.rng.randrange(len(self.daemons))
        order = self.daemons[start:] + self.daemons[:start]
        now = self.clock.monotonic()
        with self._lock:
            down = {a for a, until in self._down.items() if until > now}
        return sorted(order, key=lambda d: d.address in down)  # stable: rotation kept

    def _mark(self, daemon: Daemon, answered: bool) -> None:
        with self._lock:
            if answered:
                self._down.pop(daemon.address, None)
            else:
                self._down[daemon.address] = self.clock.monotonic() + self.down_for

    # -- tokens

    def acquire(self, category: str | None = None, opcode: str = "", size: int = 0) -> Token:
        """Wait for a token of ``category`` (None: the daemon maps ``opcode`` to one).

        :raises NoToken: blocked, or denied ``notoken_ntries`` times.
        :raises ProxyUnavailable: no daemon answered and ``when_unavailable`` is ``fail``.
        :raises RequestFailed: the daemon refused the request as malformed.
        """
        fields = {"category": category, "opcode": opcode, "size": size}
        tries = 0
        while True:
            reply, conn, daemon = self._acquire_once(fields)
            if reply is None:
                message = f"no lsfproxyd answered ({', '.join(d.name for d in self.daemons)})"
                if self.when_unavailable == "fail":
                    raise ProxyUnavailable(message)
                logger.warning("{}: proceeding without a token", message)
                return Token("", category or "", proceed=True, reason="unavailable")
            assert daemon is not None
            try:
                answer = token_reply(reply)
            except DocumentError as exc:
                if conn is not None:
                    conn.close()
                raise RequestFailed("bad_reply", f"{daemon.name}: {exc}") from None
            if answer.result == "granted":
                return Token(
                    answer.token,
                    answer.category,
                    daemon.name,
                    waited=answer.waited,
                    privileged=answer.privileged,
                    nice=answer.niceness,
                    _client=self,
                    _conn=conn,
                )
            if conn is not None:
                self._park(conn)
            if answer.result == "proceed":
                return Token(
                    "", answer.category, daemon.name, proceed=True, reason=answer.reason or ""
                )
            reason = "denied" if answer.reason is None else answer.reason
            tries += 1
            if reason == "blocked":
                raise NoToken(blocked_message(daemon.name, reply), reason)
            if self.notoken_ntries is not None and tries >= self.notoken_ntries:
                raise NoToken(
                    f"no token after {tries} attempt(s), last: {reason} from {daemon.name}", reason
                )
            delay = min(self.backoff[1], self.backoff[0] * 2 ** min(tries - 1, 16))
            delay *= 0.5 + self.rng.random() / 2
            logger.info(
                "no token from {} ({}), attempt {}{}: retrying in {:.2f} s",
                daemon.name,
                reason,
                tries,
                f"/{self.notoken_ntries}" if self.notoken_ntries else "",
                delay,
            )
            self.clock.sleep(delay)

    def _acquire_once(
        self, fields: Mapping[str, Any]
    ) -> tuple[dict[str, Any] | None, Connection | None, Daemon | None]:
        busy: Daemon | None = None
        order = self._order()
        for i, daemon in enumerate(order):
            then = next_daemon(i, order)
            try:
                conn, reply = self._call(daemon, "acquire", self.reply_timeout, **fields)
            except DaemonBusy as exc:
                logger.warning("lsfproxyd {} is overloaded: {}{}", daemon.name, exc, then)
                busy = busy or daemon
                continue
            except ConnectionBroken as exc:
                logger.warning("lsfproxyd {} did not answer: {}{}", daemon.name, exc, then)
                self._mark(daemon, answered=False)
                continue
            self._mark(daemon, answered=True)
            head = envelope(reply)  # read by Connection.call already: it cannot fail here
            if not head.ok:
                self._park(conn)
                error = head.error or ReplyError()
                raise RequestFailed(error.code, f"{daemon.name}: {error.message}")
            return reply, conn, daemon
        if busy is not None:
            # alive but swamped: a refusal to retry, never a licence to run without a token
            return {"ok": True, "result": "denied", "reason": "busy"}, None, busy
        return None, None, None

    def release(self, token: Token) -> None:
        """Give a token back; a token-less pass or a second release does nothing."""
        if token.released or token.proceed or token._conn is None:
            token.released = True
            return
        token.released = True
        conn, token._conn = token._conn, None
        try:
            conn.call("release", self.reply_timeout, token=token.id)
        except (ConnectionBroken, RequestFailed) as exc:
            # the daemon takes the token back when the connection closes anyway
            logger.debug("release of {} on {}: {}", token.id, token.daemon, exc)
            conn.close()
            return
        self._park(conn)

    # -- admin

    def admin(self, op: str, **fields: Any) -> list[HostReply]:
        """Send an admin command to every daemon, in configured order."""
        out = []
        for daemon in self.daemons:
            try:
                conn = Connection(
                    daemon, self.connect_timeout, self.key, self.user, self.host, self.clock
                )
            except ConnectionBroken as exc:
                out.append(HostReply(daemon, error=str(exc), busy=isinstance(exc, DaemonBusy)))
                continue
            try:
                out.append(HostReply(daemon, reply=conn.call(op, self.reply_timeout, **fields)))
            except (ConnectionBroken, RequestFailed) as exc:
                out.append(
                    HostReply(
                        daemon, error=str(exc), busy=isinstance(exc, DaemonBusy | RequestFailed)
                    )
                )
            finally:
                conn.close()
        return out

    def close(self) -> None:
        with self._lock:
            pools, self._idle = self._idle, {}
        for pool in pools.values():
            for conn in pool:
                conn.close()

    def __enter__(self) -> ProxyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
