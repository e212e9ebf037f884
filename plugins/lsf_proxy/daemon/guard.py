"""Connection capacity of the token daemon: who may hold a socket, and accepting without
falling over when file descriptors run out.

The daemon's descriptors (``RLIMIT_NOFILE``) are split in three pools so that nobody who can
merely reach the TCP port can lock out the users of the Unix socket or the administrators:

- *unauthenticated TCP*: connections that have not yet sent a validly signed request; at most
  ``tcp_max_unauthenticated`` of them, ``tcp_max_per_peer`` from one address, each closed
  after ``tcp_auth_timeout`` seconds unless it authenticates;
- *ordinary*: Unix-socket users and authenticated TCP peers, ``max_connections`` in all;
- *admin reserve*: root, the admins and the daemon's owner may go ``admin_reserve`` beyond
  ``max_connections``.

With ``max_connections`` left unset it is what the descriptor limit leaves after the daemon's
own files and the other two pools, so the pools together never exceed the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.plugins.lsf_proxy.settings import ProxydSettings

#: Descriptors kept for the daemon itself: listening sockets, epoll, logs, the metrics server,
#: the config and passwd files it reads.
OWN_FDS = 32
#: A connection that cannot be accepted for lack of descriptors waits this long in the
#: kernel's backlog before the next try.
ACCEPT_PAUSE = 0.25
#: TCP sockets accepted beyond the unauthenticated pool at once: those about to be told
#: "busy" and closed; kept small so that a flood of them never uses the admin reserve.
TCP_BURST = 16
#: Running out of descriptors is logged at most once per this many seconds.
LOG_PERIOD = 60.0

UNAUTH, ORDINARY, PRIVILEGED = "unauthenticated", "ordinary", "privileged"


@dataclass(frozen=True)
class Capacity:
    """The pools, in connections."""

    nofile: int
    max_connections: int
    admin_reserve: int
    tcp_max_unauthenticated: int
    tcp_max_per_peer: int
    tcp_auth_timeout: float

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def nofile_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` in force (the daemon lifts it to the hard limit at start)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def capacity(settings: ProxydSettings, nofile: int | None = None, warn: bool = True) -> Capacity:
    """The pools for the ``proxyd:`` settings under a descriptor limit (default: the real one);
    ``warn``: say when a configured ``max_connections`` is more than the limit allows."""
    nofile = nofile_limit() if nofile is None else nofile
    budget = max(8, nofile - OWN_FDS)
    unauth = settings.tcp_max_unauthenticated
    if unauth is None:
        unauth = max(2, min(256, budget // 8))
    reserve = settings.admin_reserve
    if reserve is None:
        reserve = max(2, min(64, budget // 16))
    derived = max(1, budget - unauth - TCP_BURST - reserve)
    configured = settings.max_connections
    if configured is None:
        max_conns = derived
    else:
        max_conns = configured
        if max_conns > derived and warn:
            logger.warning(
                "proxyd.max_connections {} is more than RLIMIT_NOFILE {} allows "
                "after the daemon's own files and the TCP and admin pools; {} "
                "used",
                max_conns,
                nofile,
                derived,
            )
        max_conns = min(max_conns, derived)
    return Capacity(
        nofile=nofile,
        max_connections=max_conns,
        admin_reserve=reserve,
        tcp_max_unauthenticated=unauth,
        tcp_max_per_peer=settings.tcp_max_per_peer,
        tcp_auth_timeout=settings.tcp_auth_timeout,
    )


class ConnectionGuard:
    """Counts connections per pool and says who may have one more.

    Connections are any hashable objects (the daemon's own); ``admit`` and ``authenticated``
    return None when the connection may stay, else the reason to close it.
    """

    def __init__(self, cap: Capacity) -> None:
        self.cap = cap
        self._pool: dict[Any, str] = {}
        self._peer: dict[Any, str] = {}
        self._per_peer: dict[str, int] = {}
        #: unauthenticated connections per address, oldest first
        self._by_peer: dict[str, dict[Any, None]] = {}
        #: unauthenticated connections that have not sent a line yet, oldest first
        self._silent: dict[Any, None] = {}
        self._timers: dict[Any, asyncio.TimerHandle] = {}
        self._from_tcp: set[Any] = set()
        #: TCP connections that authenticated (ordinary or privileged pool)
        self.tcp_authenticated = 0
        self.counts = {UNAUTH: 0, ORDINARY: 0, PRIVILEGED: 0}
        #: ``displaced``: unauthenticated connections closed to make room (:meth:`displaceable`)
        self.refused = {UNAUTH: 0, ORDINARY: 0, PRIVILEGED: 0, "auth_timeout": 0, "displaced": 0}

    def _fits(self, pool: str, peer: str | None) -> str | None:
        cap, n = self.cap, self.counts
        if pool == UNAUTH:
            if n[UNAUTH] >= cap.tcp_max_unauthenticated:
                return f"too many unauthenticated TCP connections ({cap.tcp_max_unauthenticated})"
            if peer is not None and self._per_peer.get(peer, 0) >= cap.tcp_max_per_peer:
                return f"too many unauthenticated TCP connections from {peer}"
            return None
        limit = cap.max_connections + (cap.admin_reserve if pool == PRIVILEGED else 0)
        if n[ORDINARY] + n[PRIVILEGED] >= limit:
            return f"too many connections ({limit})"
        return None

    def admit(self, conn: Any, pool: str, peer: str | None = None) -> str | None:
        why = self._fits(pool, peer)
        if why is not None:
            self.refused[pool] += 1
            return why
        self._pool[conn] = pool
        self.counts[pool] += 1
        if pool == UNAUTH and peer is not None:
            self._peer[conn] = peer
            self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
            self._by_peer.setdefault(peer, {})[conn] = None
            self._silent[conn] = None
        return None

    def spoke(self, conn: Any) -> None:
        """``conn`` sent a line (a client's ``hello`` comes at once; an idle flood never)."""
        self._silent.pop(conn, None)

    def displaceable(self, peer: str) -> Any | None:
        """With the unauthenticated pool full: the connection that should make room for a new
        one from ``peer``: the oldest that has said nothing yet, else the oldest of the address
        holding the most; None when ``peer`` holds its ``tcp_max_per_peer`` or as many as any
        (it is refused, as before).

        A client that connects to authenticate (a director, a gate, another daemon's
        heartbeat) sends its ``hello`` at once, an idle flood never: so the flood only ever
        pushes out itself, and a flood that talks is held per address."""
        if self.counts[UNAUTH] < self.cap.tcp_max_unauthenticated or not self._by_peer:
            return None
        if self._per_peer.get(peer, 0) >= self.cap.tcp_max_per_peer:
            return None
        if self._silent:
            return next(iter(self._silent))
        most = max(self._by_peer, key=lambda p: self._per_peer[p])
        if self._per_peer[most] <= self._per_peer.get(peer, 0) + 1:
            return None
        return next(iter(self._by_peer[most]))

    def watch(self, conn: Any, timer: asyncio.TimerHandle) -> None:
        """``timer`` (the authentication deadline) is cancelled when ``conn`` authenticates or
        goes."""
        self._timers[conn] = timer

    def pool_of(self, conn: Any) -> str | None:
        return self._pool.get(conn)

    def authenticated(self, conn: Any, privileged: bool) -> str | None:
        """Move an unauthenticated TCP connection to its pool; None when it may stay."""
        if self._pool.get(conn) != UNAUTH:
            return None
        self.release(conn)
        why = self.admit(conn, PRIVILEGED if privileged else ORDINARY)
        if why is None:
            self._from_tcp.add(conn)
            self.tcp_authenticated += 1
        return why

    def release(self, conn: Any) -> None:
        timer = self._timers.pop(conn, None)
        if timer is not None:
            timer.cancel()
        self._silent.pop(conn, None)
        pool = self._pool.pop(conn, None)
        if pool is None:
            return
        if conn in self._from_tcp:
            self._from_tcp.discard(conn)
            self.tcp_authenticated -= 1
        self.counts[pool] -= 1
        peer = self._peer.pop(conn, None)
        if peer is not None:
            left = self._per_peer[peer] - 1
            held = self._by_peer.get(peer, {})
            held.pop(conn, None)
            if left:
                self._per_peer[peer] = left
            else:
                del self._per_peer[peer]
                self._by_peer.pop(peer, None)

    def room(self, listener: Listener, live: int) -> int:
        """How many more sockets ``listener`` may accept now, while ``live`` accepted sockets
        are open in all: the TCP listener keeps out of the admin reserve and holds at most
        the unauthenticated pool plus :data:`TCP_BURST` sockets not yet authenticated."""
        room = self.cap.nofile - OWN_FDS - live
        if listener.tcp:
            unauthenticated = listener.live - self.tcp_authenticated
            room = min(
                room - self.cap.admin_reserve,
                self.cap.tcp_max_unauthenticated + TCP_BURST - unauthenticated,
            )
        return room

    def as_json(self) -> dict[str, Any]:
        return {
            "capacity": self.cap.as_json(),
            "open": dict(self.counts),
            "refused": dict(self.refused),
        }


class PeriodicLog:
    """Logs one warning per period for each kind of thing that keeps happening (the kind is
    the message template), with the count since its last line: never a line, let alone a
    traceback, per occurrence."""

    def __init__(self, period: float = LOG_PERIOD, clock: Clock = SYSTEM_CLOCK) -> None:
        self.period, self.clock = period, clock
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}
        self.total = 0

    def __call__(self, text: str, *args: Any, exception: BaseException | None = None) -> None:
        """``exception``: its traceback goes with the line that is written, none with the
        occurrences that are only counted."""
        self.total += 1
        since = self._since[text] = self._since.get(text, 0) + 1
        now = self.clock.monotonic()
        if now - self._last.get(text, float("-inf")) >= self.period:
            logger.opt(exception=exception).warning(
                text + " ({} time(s) since the last such line; next one in {:g} s at the earliest)",
                *args,
                since,
                self.period,
            )
            self._last[text], self._since[text] = now, 0


class Listener:
    """Accepts on a listening socket and serves each connection with ``handler(reader, writer)``.

    It stands in for asyncio's own accept loop, which on ``EMFILE`` logs a traceback for each
    of up to ``backlog`` attempts per wake-up and schedules as many retries: here accepting
    pauses for :data:`ACCEPT_PAUSE` (the clients wait in the kernel's backlog) and the
    shortage is logged once per period. Has the parts of :class:`asyncio.Server` the daemon
    uses (``sockets``, ``close``, ``wait_closed``).
    """

    RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        what: str,
        shortage: PeriodicLog,
        limit: int,
        room: Callable[[Listener], int],
    ) -> None:
        self.loop, self.sock, self.handler, self.what = loop, sock, handler, what
        self.shortage, self.limit, self.room = shortage, limit, room
        self.tcp = sock.family != socket.AF_UNIX
        self.sockets = [sock]
        #: accepted sockets not yet closed, admitted or not: what this listener holds in
        #: descriptors (a refused one holds its descriptor until its refusal is written)
        self.live = 0
        self.paused = 0
        self._closed = False
        self._resume: asyncio.TimerHandle | None = None
        self._full = False
        self._tasks: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._ready)

    def on_accept(self, conn: socket.socket) -> None:
        self.live += 1
        task = self.loop.create_task(self._serve(conn))
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            try:
                if conn.family == socket.AF_UNIX:
                    reader, writer = await asyncio.open_unix_connection(sock=conn, limit=self.limit)
                else:
                    reader, writer = await asyncio.open_connection(sock=conn, limit=self.limit)
            except OSError:
                conn.close()
                return
            try:
                await self.handler(reader, writer)
            except Exception as exc:  # noqa: BLE001
                # a bug any client may repeat: not an unretrieved task's traceback each time
                self.shortage(
                    "lsfproxyd: a connection on {} ended in {}: {}",
                    self.what,
                    type(exc).__name__,
                    exc,
                    exception=exc,
                )
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        finally:
            self.live -= 1
            if self._resume is not None and self._full:
                # room again: the next waiting client need not wait for the timer
                self._resume.cancel()
                self._start()

    def _ready(self) -> None:
        for _ in range(256):  # then let the loop serve the connections it has
            if self.room(self) <= 0:
                # every descriptor this listener may use is held: the clients wait in the
                # backlog rather than the daemon running out (and refusing root)
                self._pause(full=True)
                if not self.tcp:
                    self.shortage(
                        "lsfproxyd: not accepting on {} for now: every connection "
                        "the descriptor limit allows is open (RLIMIT_NOFILE {})",
                        self.what,
                        nofile_limit(),
                    )
                return
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in self.RESOURCE_ERRORS:
                    logger.error("accept on {}: {}", self.what, exc)
                    return
                self.paused += 1
                self.shortage(
                    "lsfproxyd: cannot accept on {}: {} (open connections are "
                    "served; new ones wait and are accepted when descriptors free "
                    "up; RLIMIT_NOFILE {})",
                    self.what,
                    exc.strerror,
                    nofile_limit(),
                )
                self._pause(full=False)
                return
            conn.setblocking(False)
            self.on_accept(conn)

    def _pause(self, full: bool) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self._full = full
        self._resume = self.loop.call_later(ACCEPT_PAUSE, self._start)

    def _start(self) -> None:
        self._resume = None
        self._full = False
        if not self._closed:
            self.loop.add_reader(self.sock.fileno(), self._ready)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._resume is not None:
            self._resume.cancel()
        else:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()

    async def wait_closed(self) -> None:
        return None


def listening_socket(family: int, address: Any, backlog: int = 1024) -> socket.socket:
    """A bound, listening stream socket (SO_REUSEADDR for TCP, as asyncio's servers set).

    A TCP socket says IPPROTO_TCP, as getaddrinfo's would: accepted sockets inherit it, and
    asyncio sets TCP_NODELAY only on sockets that say TCP. Left at 0, a grant following its
    "queued" event waited for the client's delayed ACK, 40 ms per queued request."""
    proto = 0 if family == socket.AF_UNIX else socket.IPPROTO_TCP
    sock = socket.socket(family, socket.SOCK_STREAM, proto)
    try:
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
