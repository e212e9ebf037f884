"""The token daemon: serves a :class:`TokenPolicy` over a Unix socket (and signed TCP) with asyncio.

Identity on the Unix socket comes from the kernel (SO_PEERCRED), so nobody can claim another
user; over TCP every request is signed with the shared key. A token goes back to the pool
when released, when its connection closes, or when its lease expires.

:class:`ProxyDaemon` holds the serving loop (listeners, connections, the ticker, reloads) and
hands the rest to the modules beside it: who comes in as whom (connections.py), tokens by
connection (tokens.py), the admin commands (admin.py), the persisted blocklist
(blockfile.py), the diagnostic log (diagnose.py) and the Prometheus series (metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import socket
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.config import ConfigError, load_config
from gridgate.core.secrets import read_secret
from gridgate.plugins.lsf_proxy.commands import category_map
from gridgate.plugins.lsf_proxy.config import host_name, parse_address, section_defaults
from gridgate.plugins.lsf_proxy.daemon.adaptive import AdaptiveLimits
from gridgate.plugins.lsf_proxy.daemon.admin import AdminVerbs
from gridgate.plugins.lsf_proxy.daemon.blockfile import BlocklistFile
from gridgate.plugins.lsf_proxy.daemon.bypass import BypassWatch
from gridgate.plugins.lsf_proxy.daemon.connections import Conn, Doorman, read_lines
from gridgate.plugins.lsf_proxy.daemon.diagnose import DiagnosticLog, earliest, log_field
from gridgate.plugins.lsf_proxy.daemon.guard import (
    ConnectionGuard,
    Listener,
    PeriodicLog,
    capacity,
    listening_socket,
)
from gridgate.plugins.lsf_proxy.daemon.metrics import DaemonMetrics
from gridgate.plugins.lsf_proxy.daemon.notify import DaemonNotifiers
from gridgate.plugins.lsf_proxy.daemon.peers import Heartbeat
from gridgate.plugins.lsf_proxy.daemon.policy import PolicySettings
from gridgate.plugins.lsf_proxy.daemon.ratelimit import (
    RatedSettings,
    RateLimitedPolicy,
    rate_limits_from,
)
from gridgate.plugins.lsf_proxy.daemon.reload_guard import ReloadLog, checked_section
from gridgate.plugins.lsf_proxy.daemon.startup import (
    StartupError,
    check_socket_dir,
    raise_nofile,
    socket_answers,
)
from gridgate.plugins.lsf_proxy.daemon.tokens import TokenDesk
from gridgate.plugins.lsf_proxy.protocol import ADMIN_OPS, Verifier, decode, encode
from gridgate.plugins.lsf_proxy.settings import ProxydSettings
from gridgate.plugins.lsf_proxy.wire import PROTOCOL_VERSION, ProtocolError

#: A client that does not read its replies is dropped once this much is waiting for it.
MAX_WRITE_BUFFER = 1 << 20
#: Keys a reload does not apply: they take effect at the next start.
RESTART_KEYS = ("socket", "tcp", "key", "metrics_port", "metrics_address", "heartbeat_via")


class ProxyDaemon:
    """One lsfproxyd-style daemon. ``section`` is a ``proxyd:`` section (filled or not): it is
    parsed once into :attr:`settings`, and each collaborator takes its typed part."""

    def __init__(
        self,
        section: Mapping[str, Any] | None = None,
        *,
        socket_path: str | None = None,
        name: str | None = None,
        config_path: str | os.PathLike[str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        #: the section as given (a reload compares the new file with it) and typed
        self.section = dict(section or section_defaults())
        self.settings = ProxydSettings.of(self.section)
        self.config_path = Path(config_path) if config_path else None
        self.clock = clock
        self._identify(socket_path, name)
        self._init_connections()
        #: the other daemons of proxyd.hosts: who is alive decides this daemon's share
        self.peers = self._heartbeat()
        #: limits that follow the scheduler (``proxyd.adaptive``), applied by _policy_settings
        self.adaptive = self._adaptive_limits()
        self.policy = RateLimitedPolicy(
            self._policy_settings(self.settings),
            clock=clock,
            sample_period=self.settings.sample_period,
            blocklist=self.blocklist_file.load(),
        )
        self.tokens = TokenDesk(
            self.policy, self.diagnostics, send=self._send, reply=self._reply, poke=self.poke
        )
        self._apply_runtime(self.settings)
        #: the bypass audit (``proxyd.bypass.scheduler`` set), run beside the ticker
        self.bypass = self._bypass_watch()
        self._init_admin()
        #: Called once the sockets listen (the ``serve`` command announces readiness).
        self.on_ready: Any = None

    # -- the steps of __init__

    def _identify(self, socket_path: str | None, name: str | None) -> None:
        """Who this daemon is: its name, socket, host, process and owner."""
        self.name = name or self.settings.name or host_name()
        self.socket_path = self.settings.daemon_socket(socket_path, self.name)
        self.local_host = host_name()
        self.pid = os.getpid()
        #: The user running the daemon may administer it (it can stop it anyway) but is not
        #: privileged for tokens: a personal daemon must still throttle its owner.
        self.owner = _user_name(os.geteuid())

    def _init_connections(self) -> None:
        """The bookkeeping of connections, listeners and the periodic logs."""
        self._conns: set[Conn] = set()
        self._per_user: dict[str, int] = {}
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._servers: list[Listener] = []
        self._shortage, self._refusals, self._failures = PeriodicLog(), PeriodicLog(), PeriodicLog()
        self.diagnostics = DiagnosticLog(
            lambda: self._side_file(
                self.settings.diagnose_file, f"info.lsfproxydlog.{self.local_host}"
            ),
            self._failures,
        )

    def _heartbeat(self) -> Heartbeat:
        try:
            return Heartbeat(
                self.name, self.settings, self.clock, self._peers_changed, self.config_path
            )
        except ValueError as exc:
            raise StartupError(str(exc)) from None

    def _adaptive_limits(self) -> AdaptiveLimits | None:
        if not self.settings.adaptive.entries():
            return None
        try:
            return AdaptiveLimits(
                self.settings,
                Path(self.socket_path).parent,
                self._adaptive_changed,
                config_folder=self.config_path.parent if self.config_path else None,
                holds=lambda category: self.policy.take_holds(category),
                state=self.peers.store,
                light=lambda category, window: self.policy.light_holds(category, window),
            )
        except ValueError as exc:
            raise StartupError(str(exc)) from None

    def _bypass_watch(self) -> BypassWatch | None:
        bypass = self.settings.bypass_audit
        if bypass is None:
            return None
        folder = Path(self.socket_path).parent
        try:
            notifiers = (
                DaemonNotifiers(load_config(self.config_path), folder) if self.config_path else None
            )
            shared = self.adaptive is not None and self.adaptive.scheduler == bypass.scheduler
            return BypassWatch(
                self,
                bypass,
                folder,
                notifiers,
                manager=self.adaptive.manager if shared and self.adaptive else None,
            )
        except (ValueError, ConfigError) as exc:
            raise StartupError(str(exc)) from None

    def _init_admin(self) -> None:
        """The admin verbs, the doorman, the reload log and (``metrics_port``) the metrics."""
        #: Prometheus series when ``metrics_port`` is set; the port once serving.
        self.metrics: DaemonMetrics | None = None
        self.metrics_port: int | None = None
        self.reloads = ReloadLog()
        self.admin = AdminVerbs(self)
        self.doorman = Doorman(
            self.guard,
            self.owner,
            is_admin=self.policy.is_root_or_admin,
            refusals=self._refusals,
            error=lambda conn, exc: self._error(conn, None, exc),
            close=self._close,
        )
        if self.settings.metrics_port is not None:
            self.metrics = self.tokens.metrics = DaemonMetrics(self.policy)
            if self.bypass is not None:
                audit = self.bypass.audit
                self.metrics.bypassing = lambda: audit.last
            if self.adaptive is not None:
                adaptive = self.adaptive
                self.metrics.adaptive = lambda: {
                    c: (lim.limit, lim.settings.low) for c, lim in adaptive.limits.items()
                }
            self.reloads.attach(self.metrics.registry)

    # -- configuration

    def _policy_settings(self, settings: ProxydSettings) -> PolicySettings:
        """The policy's settings: the limits of ``settings`` capped by the adaptive maxima,
        this daemon's share of them, and the rate limits split over the live daemons."""
        limits = settings.limits
        adaptive = getattr(self, "adaptive", None)  # None while __init__ builds it
        if adaptive is not None:
            limits = adaptive.cap(limits)
        names = settings.host_names
        live = 1
        if names:
            if self.name not in names:
                raise StartupError(
                    f"this daemon's name {self.name!r} is not in proxyd.hosts "
                    f"({', '.join(names)}); give --name or proxyd.name"
                )
            limits = self.peers.view.share(limits, names)
            live = len(self.peers.view.live(names))
        return RatedSettings.extend(
            PolicySettings.of(settings, limits), rate_limits_from(settings.rate_limit, live)
        )

    def _adaptive_changed(self) -> None:
        """proxyd.adaptive moved a category's max: the policy takes it (held tokens stay)."""
        self.policy.reconfigure(self._policy_settings(self.settings))
        self.poke()

    def _peers_changed(self, service: Mapping[str, bool] | None) -> None:
        """A heartbeat changed who is alive (a new share: held tokens stay, a smaller share
        only stops new grants) or brought a newer service state from a peer."""
        self.policy.reconfigure(self._policy_settings(self.settings))
        for category, enabled in (service or {}).items():
            if self.policy.categories[category].enabled != enabled:
                for decision in self.policy.set_enabled(category, enabled):
                    self.tokens.deliver(decision)
                if self.bypass is not None:
                    self.bypass.audit.disturb()
        self.poke()

    def _apply_runtime(self, settings: ProxydSettings) -> None:
        self.tokens.categories = category_map(settings.categories.extra())
        self.max_line = settings.max_line_bytes
        if getattr(self, "guard", None) is None:
            # sized again once serve() has raised RLIMIT_NOFILE: no warning before that
            self.guard = ConnectionGuard(capacity(settings, warn=False))
        else:
            self.guard.cap = capacity(settings, self.guard.cap.nofile)
        self.line_timeout = settings.line_timeout
        self.max_user_connections = settings.max_connections_per_user
        try:
            self.diagnostics.switch(settings.diagnose)
        except OSError as exc:
            # the service runs on without its diagnostic log rather than not at all
            logger.error("diagnostic log {} not opened: {}", self.diagnostics.path, exc)

    def _side_file(self, configured: str, default_name: str) -> Path:
        """``configured`` (a file key's value), or ``default_name`` next to the socket."""
        if configured:
            return Path(configured)
        return Path(self.socket_path).parent / default_name

    @property
    def blocklist_file(self) -> BlocklistFile:
        """Where the blocklist is kept (``persist_blocklist``), as the config now says."""
        return BlocklistFile(
            self._side_file(self.settings.blocklist_file, f"blocklist.{self.name}.json"),
            self.settings.persist_blocklist,
            self._failures,
        )

    def save_blocklist(self) -> None:
        self.blocklist_file.save(self.policy.blocklist)

    def reload(self) -> dict[str, Any]:
        """Re-read the config file: new limits, lists, diagnose flag; tokens and blocks stay.

        :raises ConfigError, StartupError: the file no longer works (the old config stays).
        """
        if self.config_path is None:
            return {"reloaded": False, "message": "started without -c: nothing to re-read"}
        try:
            section = checked_section(self.config_path, self.section)
            settings = ProxydSettings.of(section)
            policy = self._policy_settings(settings)
        except (ConfigError, StartupError, ValueError) as exc:
            self.reloads.refuse(exc)
            raise
        for key in RESTART_KEYS:
            if getattr(settings, key) != getattr(self.settings, key):
                logger.warning("proxyd.{} changed: takes effect at the next restart", key)
        for line in lowered_limits(self.policy, policy):
            logger.warning("proxyd reload: {}", line)
        self._reload_bypass(settings)
        if settings.adaptive != self.settings.adaptive:
            logger.warning("proxyd.adaptive changed: takes effect at the next restart")
        self.section, self.settings = section, settings
        self.peers.configure(settings)
        self.policy.reconfigure(policy)
        self._apply_runtime(settings)
        self.poke()
        self.reloads.ok()
        logger.info("lsfproxyd {} reconfigured from {}", self.name, self.config_path)
        return {"reloaded": True, "message": f"reconfigured from {self.config_path}"}

    def _reload_bypass(self, settings: ProxydSettings) -> None:
        new = settings.bypass_audit
        running = self.bypass.settings if self.bypass is not None else None
        if new is not None and running is not None and new.scheduler == running.scheduler:
            if new.options != running.options:
                logger.warning("proxyd.bypass.scheduler_options changed: takes effect at restart")
            self.bypass.reconfigure(new)  # type: ignore[union-attr]
        elif (new is None) != (running is None) or new != running:
            logger.warning("proxyd.bypass.scheduler changed: takes effect at the next restart")

    # -- serving

    async def serve(self, install_signals: bool = True) -> None:
        """Listen until SIGTERM/SIGINT or :meth:`stop` (signals only from the main thread)."""
        loop = self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        raise_nofile()
        self.guard.cap = capacity(self.settings)  # the limit as raised, from now on
        try:
            await self._listen()
            if self.metrics is not None:
                assert self.settings.metrics_port is not None  # metrics: a port is set
                self.metrics_port = self.metrics.serve(
                    self.settings.metrics_port, self.settings.metrics_address
                )
                logger.info(
                    "lsfproxyd {} metrics on http://{}:{}/metrics",
                    self.name,
                    self.settings.metrics_address,
                    self.metrics_port,
                )
        except BaseException:
            for server in self._servers:
                server.close()
            if self._servers:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.socket_path)
            raise
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
            loop.add_signal_handler(signal.SIGHUP, self._sighup)
        ticker = asyncio.create_task(self._ticker())
        beats = asyncio.create_task(self.peers.run(self._stop))
        audit = asyncio.create_task(self.bypass.run(self._stop)) if self.bypass else None
        follow = asyncio.create_task(self.adaptive.run(self._stop)) if self.adaptive else None
        if self.on_ready is not None:
            self.on_ready(self)
        logger.info("lsfproxyd {} listening on {} (pid {})", self.name, self.socket_path, self.pid)
        try:
            await self._stop.wait()
        finally:
            # the ticker is told to stop, not cancelled, so it never stops halfway through
            # handing out the decisions of a tick
            self._stop.set()
            self.poke()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ticker, 5)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(beats, 5)
            for task in (audit, follow):
                if task is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(task, 5)
            if self.bypass is not None and self.bypass.notifiers is not None:
                self.bypass.notifiers.close()
            await self._shutdown()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)

    def stop(self) -> None:
        """Stop serving; callable from any thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def wake(self) -> None:
        """Make the daemon look at its clock now; callable from any thread (a test that
        moved a FakeClock, an embedding program)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.poke)

    async def _listen(self) -> None:
        path = Path(self.socket_path)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        check_socket_dir(path.parent)
        if path.exists() or path.is_symlink():
            if socket_answers(str(path)):
                raise StartupError(f"a daemon already listens on {path}")
            path.unlink()
        server = self._listener(socket.AF_UNIX, str(path), self._on_unix, f"unix {path}")
        os.chmod(path, int(self.settings.socket_mode, 8))
        self._servers.append(server)
        tcp = self.settings.tcp
        if tcp:
            key = read_secret(self.settings.key)
            if not key:
                raise StartupError("proxyd.tcp needs proxyd.key")
            self.doorman.verifier = Verifier(key, self.settings.max_clock_skew, daemon=self.name)
            host, port = cast(tuple[str, int], parse_address(tcp)[1])  # host:port, so tcp
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            server = self._listener(info[0][0], info[0][4], self._on_tcp, f"tcp {tcp}")
            self._servers.append(server)
            logger.info("lsfproxyd {} also on tcp {}", self.name, tcp)

    @property
    def tcp_port(self) -> int | None:
        for server in self._servers[1:]:
            for sock in server.sockets:
                return sock.getsockname()[1]
        return None

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._conns)

    def _sighup(self) -> None:
        # logrotate renamed the log, then sent SIGHUP: write to a fresh file, then reload
        self.diagnostics.reopen()
        try:
            self.reload()
        except (ConfigError, StartupError, ValueError):
            pass  # reload() logged and counted it

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for decision in self.policy.shutdown():
            self.tokens.deliver(decision)
        for conn in list(self._conns):
            self._close(conn)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.save_blocklist()
        self.diagnostics.switch(False)
        if self.metrics is not None:
            self.metrics.close()
        logger.info("lsfproxyd {} stopped", self.name)

    async def _ticker(self) -> None:
        assert self._wake is not None and self._stop is not None and self._loop is not None
        while not self._stop.is_set():
            self.diagnostics.expire(self.clock.monotonic())
            result = self.policy.tick()
            self.tokens.taken_back(result.expired, self.clock.time())
            for decision in result.decisions:
                self.tokens.deliver(decision)
            wake = earliest(self.policy.next_wakeup(), self.diagnostics.until)
            timeout = None if wake is None else max(0.0, wake - self.clock.monotonic())
            self._wake.clear()
            if timeout == 0.0:
                await asyncio.sleep(0)
                continue
            # a timer that sets the event is cheaper than wait_for (no task per wait)
            timer = None if timeout is None else self._loop.call_later(timeout, self._wake.set)
            await self._wake.wait()
            if timer is not None:
                timer.cancel()
        logger.debug("ticker stopped")

    def poke(self) -> None:
        """Make the ticker look at the policy now (from the daemon's own thread)."""
        if self._wake is not None:
            self._wake.set()

    # -- connections

    async def _on_unix(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _gid = struct.unpack("3i", creds)
        except OSError:
            writer.close()
            return
        user = _user_name(uid)
        await self._serve_conn(reader, Conn(writer, user, self.local_host, False, f"pid {pid}"))

    async def _on_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        await self._serve_conn(reader, Conn(writer, "", "", True, f"tcp {peer}"))

    # -- capacity (guard.py; who comes in: connections.py)

    def _listener(self, family: int, address: Any, handler: Any, what: str) -> Listener:
        assert self._loop is not None
        return Listener(
            self._loop,
            listening_socket(family, address),
            handler,
            what,
            self._shortage,
            self.max_line + 1,
            lambda listener: self.guard.room(
                listener, sum(server.live for server in self._servers)
            ),
        )

    async def _serve_conn(self, reader: asyncio.StreamReader, conn: Conn) -> None:
        ordinary = not conn.tcp and not self.policy.is_root_or_admin(conn.user)
        if ordinary and self._per_user.get(conn.user, 0) >= self.max_user_connections:
            # one user's thousands of idle sockets must not lock everybody else out
            self._error(
                conn,
                None,
                ProtocolError(
                    "busy", f"{conn.user} already has {self.max_user_connections} connections"
                ),
            )
            conn.writer.close()
            return
        busy = self.doorman.admit(conn)
        if busy is not None:
            self._error(conn, None, ProtocolError("busy", busy))
            conn.writer.close()
            return
        if ordinary:
            self._per_user[conn.user] = self._per_user.get(conn.user, 0) + 1
        conn.counted = ordinary
        self._conns.add(conn)
        try:
            async for line in read_lines(reader, conn, self):
                if isinstance(line, ProtocolError):  # cut off or too long
                    self._count_error()
                    self._error(conn, None, line)
                else:
                    self._handle_line(conn, line)
        except (ConnectionError, OSError):
            pass
        finally:
            self._close(conn)

    def _count_error(self) -> None:
        self.policy.count_error()
        if self.metrics is not None:
            self.metrics.errors.labels("protocol").inc()

    def _close(self, conn: Conn) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            if conn.counted:
                left = self._per_user.get(conn.user, 1) - 1
                if left > 0:
                    self._per_user[conn.user] = left
                else:
                    self._per_user.pop(conn.user, None)
        conn.closed = True
        self.doorman.left(conn)
        self.tokens.closed(conn)
        with contextlib.suppress(Exception):
            conn.writer.close()
        self.poke()

    def _send(self, conn: Conn, message: Mapping[str, Any]) -> None:
        if conn.closed:
            return
        transport = conn.writer.transport
        if transport.is_closing():
            return
        conn.writer.write(encode(message))
        if transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self._refusals(
                "lsfproxyd: dropping {} ({}): it does not read its replies",
                log_field(conn.user),
                conn.peer,
            )
            self._close(conn)

    def _error(self, conn: Conn, msg_id: Any, exc: ProtocolError) -> None:
        self._send(
            conn,
            {
                "v": PROTOCOL_VERSION,
                "id": msg_id,
                "ok": False,
                "error": {"code": exc.code, "message": str(exc)},
            },
        )

    def _reply(self, conn: Conn, msg_id: Any, **fields: Any) -> None:
        self._send(conn, {"v": PROTOCOL_VERSION, "id": msg_id, "ok": True, **fields})

    def _handle_line(self, conn: Conn, line: bytes) -> None:
        msg_id = None
        if conn.tcp:
            self.guard.spoke(conn)  # an idle flood never does (guard.displaceable)
        try:
            message = decode(line)
            msg_id = message.get("id")
            user, host = conn.user, conn.host
            if conn.tcp:
                user, host = self.doorman.verify(conn, message)
            self._dispatch(conn, message, msg_id, user, host)
        except ProtocolError as exc:
            if exc.code not in ("forbidden",):
                self._count_error()
            self._error(conn, msg_id, exc)
        except Exception as exc:  # one bad request must not take the connection down
            # a bug, but one any client can repeat: a line per minute, not a traceback each
            self._failures(
                "lsfproxyd: a request from {}@{} ({}) failed: {}: {}",
                log_field(conn.user),
                log_field(conn.host),
                conn.peer,
                type(exc).__name__,
                log_field(str(exc)),
                exception=exc,
            )
            self._count_error()
            self._error(conn, msg_id, ProtocolError("internal", f"{type(exc).__name__}: {exc}"))

    def _dispatch(
        self, conn: Conn, message: Mapping[str, Any], msg_id: Any, user: str, host: str
    ) -> None:
        op = message["op"]
        may_admin = self.policy.is_root_or_admin(user) or (user == self.owner and not conn.tcp)
        if op == "hello":
            self._reply(
                conn,
                msg_id,
                server="gridgate-lsfproxyd",
                name=self.name,
                pid=self.pid,
                protocol=PROTOCOL_VERSION,
                user=user,
                host=host,
                admin=may_admin,
                **self.doorman.hello(conn),
            )
            return
        if op == "acquire":
            self.tokens.acquire(conn, message, msg_id, user, host)  # answered when decided
            return
        if op == "check":
            self._reply(conn, msg_id, **self.tokens.check(conn, message, user, host))
            return
        if op == "release":
            self._reply(conn, msg_id, **self.tokens.release(conn, message))
            return
        if op not in ADMIN_OPS:
            raise ProtocolError("unknown_op", f"unknown op {op!r}")
        if not may_admin:
            raise ProtocolError(
                "forbidden",
                f"permission denied: {op} is for root and the lsfproxyd admins; {user} is neither",
            )
        self._reply(conn, msg_id, **self.admin.serve(op, message, user, host))


_NAMES: dict[int, str] = {0: "root"}


def _user_name(uid: int) -> str:
    """Names found are kept: looking one up opens /etc/passwd, which fails when descriptors
    run out, and a user (root above all) must not turn into a number then."""
    name = _NAMES.get(uid)
    if name is None:
        try:
            name = _NAMES[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            return str(uid)
    return name


def run(section: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
    """Build a daemon and serve until stopped (the ``serve`` command)."""
    daemon = ProxyDaemon(section, **kwargs)
    asyncio.run(daemon.serve())


def lowered_limits(policy: Any, settings: PolicySettings) -> list[str]:
    """What a reload to ``settings`` lowers, one line per category and limit, with what it
    means for the tokens held now (they stay: only new grants wait for the lower limit)."""
    lines = []
    for category, new in settings.limits.items():
        state = policy.categories.get(category)
        if state is None:
            continue
        old = state.limits
        for limit in ("max", "nominal", "throttle", "user_max"):
            before, after = getattr(old, limit), getattr(new, limit)
            if before is None or after is None:
                if after is not None and before is None:
                    lines.append(f"{category} {limit} lowered from no limit to {after}")
                continue
            lower = after < before if limit != "throttle" else after > before
            if not lower:
                continue
            held = ""
            if limit == "max" and state.in_use > after:
                held = (
                    f"; {state.in_use} token(s) are held now: they stay, and new grants wait "
                    f"until fewer than {after} are"
                )
            shown = (lambda v: f"{v * 1000:g} ms") if limit == "throttle" else str
            change = "raised" if limit == "throttle" else "lowered"
            lines.append(
                f"{category} {limit} {change} from {shown(before)} to {shown(after)}"
                + (" (slower grants)" if limit == "throttle" else "")
                + held
            )
    return lines
