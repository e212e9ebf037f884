"""A client's connection to the daemon, up to the requests it carries: its record, the lines
read off it (of bounded length, a started one finished in bounded time), and who it is let in
as (the connection pools of guard.py, and over TCP the challenge and signatures that say who
it is). What the requests ask is the daemon's business (daemon.py, admin.py)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from gridgate.plugins.lsf_proxy.daemon.diagnose import log_field
from gridgate.plugins.lsf_proxy.daemon.guard import (
    ORDINARY,
    PRIVILEGED,
    UNAUTH,
    ConnectionGuard,
)
from gridgate.plugins.lsf_proxy.protocol import Verifier
from gridgate.plugins.lsf_proxy.wire import ProtocolError


class Conn:
    """One client connection: who it is (from the kernel, or once a TCP request is signed),
    the tokens it holds and the requests it waits for."""

    __slots__ = ("writer", "user", "host", "tcp", "tokens", "waiting", "peer", "closed", "counted")

    def __init__(
        self, writer: asyncio.StreamWriter, user: str, host: str, tcp: bool, peer: str
    ) -> None:
        self.writer = writer
        self.user = user
        self.host = host
        self.tcp = tcp
        self.peer = peer
        self.tokens: set[str] = set()
        self.waiting: dict[str, Any] = {}  # policy request id -> the client's message id
        self.closed = False
        self.counted = False


class LineLimits(Protocol):
    """How long a line may be, and how long a started one may take (the daemon's settings,
    read at each use: a reload changes them for open connections too)."""

    max_line: int
    line_timeout: float


async def read_lines(
    reader: asyncio.StreamReader, conn: Conn, limits: LineLimits
) -> AsyncIterator[bytes | ProtocolError]:
    """The lines ``conn`` sends, without their newline, blank ones left out; in place of a line
    over ``max_line`` a ``line_too_long`` error (the rest, up to its newline, is dropped).
    Ends at end of file, when ``conn`` is closed, or after a ``line_timeout`` error: half a
    line may not sit here for ever, or slow senders pile up. Idle connections (nothing
    half-sent) may stay: they may hold tokens.
    """
    buffer = bytearray()
    discarding = False
    while not conn.closed:
        if buffer and not discarding:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), limits.line_timeout)
            except TimeoutError:
                yield ProtocolError(
                    "line_timeout", f"incomplete line for {limits.line_timeout:g} s"
                )
                return
        else:
            chunk = await reader.read(65536)
        if not chunk:
            return
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > limits.max_line:
                    if not discarding:
                        yield _too_long(limits)
                    discarding = True
                    buffer.clear()
                break
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if discarding:
                discarding = False
                continue
            if len(line) > limits.max_line:
                yield _too_long(limits)
                continue
            if line.strip():
                yield line


def _too_long(limits: LineLimits) -> ProtocolError:
    return ProtocolError("line_too_long", f"lines are limited to {limits.max_line} bytes")


class Doorman:
    """Who is let in, and as whom: the pool a connection takes (root, the admins and the
    daemon's owner may use the admin reserve; TCP waits unauthenticated until a validly
    signed request), and the TCP challenge every signature on a connection must cover.

    :param is_admin: whether a user is root or an admin (the policy's own list).
    :param refusals: logs a refused connection, at most once a minute.
    :param error: sends a connection an error with no request ``id``.
    :param close: closes a connection (its tokens go back).
    """

    def __init__(
        self,
        guard: ConnectionGuard,
        owner: str,
        *,
        is_admin: Callable[[str], bool],
        refusals: Callable[..., None],
        error: Callable[[Conn, ProtocolError], None],
        close: Callable[[Conn], None],
    ) -> None:
        self.guard = guard
        self.owner = owner
        self._is_admin = is_admin
        self._refusals = refusals
        self._error = error
        self._close = close
        #: checks the signed TCP requests (set once the daemon listens on TCP)
        self.verifier: Verifier | None = None
        self._challenges: dict[Conn, str] = {}

    def admit(self, conn: Conn) -> str | None:
        """None when ``conn`` may have a slot in its pool, else why not."""
        if conn.tcp:
            peer = str((conn.writer.get_extra_info("peername") or ("?",))[0])
            victim = self.guard.displaceable(peer)
            if victim is not None:
                # the pool is full: an address holding many makes room for one holding few
                self.guard.refused["displaced"] += 1
                self._error(
                    victim,
                    ProtocolError(
                        "busy",
                        "too many unauthenticated TCP connections: the oldest of the "
                        "address holding the most is closed",
                    ),
                )
                self._close(victim)
            why = self.guard.admit(conn, UNAUTH, peer)
            if why is None:
                self.guard.watch(
                    conn,
                    asyncio.get_running_loop().call_later(
                        self.guard.cap.tcp_auth_timeout, self._auth_expired, conn
                    ),
                )
        else:
            privileged = self._is_admin(conn.user) or conn.user == self.owner
            why = self.guard.admit(conn, PRIVILEGED if privileged else ORDINARY)
        if why is not None:
            self._refusals("lsfproxyd: connection from {} closed: {}", conn.peer, why)
        return why

    def _auth_expired(self, conn: Conn) -> None:
        if self.guard.pool_of(conn) == UNAUTH and not conn.closed:
            self.guard.refused["auth_timeout"] += 1
            timeout = self.guard.cap.tcp_auth_timeout
            self._refusals(
                "lsfproxyd: TCP connection {} closed: no signed request within {:g} s",
                conn.peer,
                timeout,
            )
            self._error(
                conn,
                ProtocolError("auth_timeout", f"no validly signed request within {timeout:g} s"),
            )
            self._close(conn)

    def hello(self, conn: Conn) -> dict[str, Any]:
        """Over TCP ``hello`` hands out the connection's challenge, which every signature on
        it must cover: a request captured here is good for nothing elsewhere (protocol.md)."""
        if not conn.tcp:
            return {}
        return {"challenge": self._challenges.setdefault(conn, secrets.token_hex(16))}

    def verify(self, conn: Conn, message: Mapping[str, Any]) -> tuple[str, str]:
        """(user, host) of a signed TCP request; the first one authenticates the connection."""
        assert self.verifier is not None
        if message.get("op") == "hello" and "auth" not in message:
            return "", ""  # how a TCP client learns its challenge
        user, host = self.verifier.verify(message, challenge=self._challenges.get(conn))
        if log_field(user) != user or log_field(host) != host:
            # a key holder's names reach every log line of its requests: names only
            raise ProtocolError(
                "bad_request",
                "auth.user and auth.host must be names of "
                "letters, digits and '._-+@:' (at most 128)",
            )
        busy = self.guard.authenticated(conn, self._is_admin(user))
        if busy is not None:
            asyncio.get_running_loop().call_soon(self._close, conn)
            raise ProtocolError("busy", busy)
        return user, host

    def left(self, conn: Conn) -> None:
        """``conn`` is closed: its slot and its challenge go."""
        self.guard.release(conn)
        self._challenges.pop(conn, None)
