"""The token daemon: serves a :class:`TokenPolicy` over a Unix socket (and signed TCP) with asyncio.

Identity on the Unix socket comes from the kernel (SO_PEERCRED), so nobody can claim another
user; over TCP every request is signed with the shared key. A token goes back to the pool
when released, when its connection closes, or when its lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import resource
import secrets
import signal
import socket
import stat
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.config import ConfigError, read_secret
from gridgate.core.files import atomic_write
from gridgate.plugins.lsf_proxy.config import (
    CATEGORIES,
    LSF_NAMES,
    category_map,
    category_of,
    daemon_socket,
    host_name,
    parse_address,
    resolve_policies,
    section_defaults,
)
from gridgate.plugins.lsf_proxy.daemon import holding
from gridgate.plugins.lsf_proxy.daemon.diagnose import (
    diagnose_args,
    earliest,
    open_log,
    private_folder,
)
from gridgate.plugins.lsf_proxy.daemon.guard import (
    ORDINARY,
    PRIVILEGED,
    UNAUTH,
    ConnectionGuard,
    Listener,
    PeriodicLog,
    capacity,
    listening_socket,
)
from gridgate.plugins.lsf_proxy.daemon.peers import Heartbeat
from gridgate.plugins.lsf_proxy.daemon.policy import (
    DENIED,
    GRANTED,
    QUEUED,
    Blocklist,
    BlockRule,
    Decision,
    PolicySettings,
    Request,
    TokenPolicy,
)
from gridgate.plugins.lsf_proxy.daemon.ratelimit import (
    RatedSettings,
    RateLimitedPolicy,
    rate_limits_from,
)
from gridgate.plugins.lsf_proxy.daemon.reload_guard import ReloadLog, checked_section
from gridgate.plugins.lsf_proxy.opcodes import opcode_of
from gridgate.plugins.lsf_proxy.protocol import (
    ADMIN_OPS,
    PROTOCOL_VERSION,
    ProtocolError,
    Verifier,
    decode,
    encode,
)

#: A client that does not read its replies is dropped once this much is waiting for it.
MAX_WRITE_BUFFER = 1 << 20
#: Wait-time histogram buckets (seconds): token_wait_time defaults to 15 s.
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300)
#: ``enable``/``disable`` spell categories as badmin does.
CATEGORY_WORDS = {
    "all": "all",
    "query": "query",
    "sub": "submission",
    "submission": "submission",
    "other": "other",
}


class StartupError(Exception):
    """The daemon cannot start (socket in use, name not in hosts, bad key...)."""


def diagnose_line(decision: Decision) -> str:
    """One diagnostic-log line in the seed's format::

    Feb 8 07:57:12 2023 QUERY_REQ,BATCH_JOB_QUERY,user1,host1,184,1,075423,075426
    """
    req = decision.request
    done = time.localtime(decision.decided)
    stamp = f"{time.strftime('%b', done)} {done.tm_mday} {time.strftime('%H:%M:%S %Y', done)}"
    accept = 1 if decision.outcome == GRANTED else 0
    received = time.strftime("%H%M%S", time.localtime(decision.received))
    processed = time.strftime("%H%M%S", done)
    # clients name the command (hold limits are by command): the log has its batch opcode
    opcode = opcode_of(req.opcode, req.category == "query")
    fields = [
        f"{LSF_NAMES[req.category]}_REQ",
        log_field(opcode) or "-",
        log_field(req.user),
        log_field(req.host),
        str(req.size),
        str(accept),
        received,
        processed,
    ]
    return f"{stamp} {','.join(fields)}"


#: What a log field may hold as it is; anything else a client chose becomes ``_``.
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+@:")


def log_field(text: str) -> str:
    """``text`` (a name a client chose) fit for a log line: a comma or newline would break the
    columns, and ``;``, ``$(...)``, quotes or escapes must reach no reader of the log (nor a
    script that pastes it into a shell); at most 128 characters."""
    return "".join(ch if ch in _SAFE else "_" for ch in str(text)[:128])


class DaemonMetrics:
    """Prometheus series of one daemon, on their own registry.

    Decisions and errors are counted as they happen; tokens in use and queue lengths are
    read from the policy at scrape time (the HTTP server runs in its own thread, so it only
    reads plain integers and never calls into the policy, which would roll its periods).
    """

    def __init__(self, policy: TokenPolicy) -> None:
        try:
            import prometheus_client as prom
            from prometheus_client.core import GaugeMetricFamily
        except ImportError:
            raise StartupError(
                "proxyd.metrics_port is set but prometheus_client is not "
                "installed: pip install 'gridgate[metrics]'"
            ) from None
        self._prom = prom
        self.policy = policy
        self.registry = r = prom.CollectorRegistry()
        self.grants = prom.Counter(
            "gridgate_proxyd_grants", "Tokens granted", ["category"], registry=r
        )
        self.rejections = prom.Counter(
            "gridgate_proxyd_rejections",
            "Requests denied for lack of a token (queue full or waited token_wait_time)",
            ["category", "reason"],
            registry=r,
        )
        self.blocked = prom.Counter(
            "gridgate_proxyd_blocked", "Requests denied by the blocklist", ["category"], registry=r
        )
        self.rate_limited = prom.Counter(
            "gridgate_proxyd_rate_limited",
            "Requests denied for being over the user's rate (proxyd.rate_limit)",
            ["category"],
            registry=r,
        )
        self.errors = prom.Counter(
            "gridgate_proxyd_errors",
            "The status table's Error row: bad or cut-off requests "
            "(protocol) and leases taken back (lease_expired)",
            ["kind"],
            registry=r,
        )
        self.wait = prom.Histogram(
            "gridgate_proxyd_wait_seconds",
            "Seconds from request to grant or denial",
            ["category", "outcome"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        for category in CATEGORIES:
            # series exist from the start, so a rate over the first grant is right
            self.grants.labels(category)
            self.blocked.labels(category)
            self.rate_limited.labels(category)
            for reason in ("timeout", "queue_full"):
                self.rejections.labels(category, reason)
        for kind in ("protocol", "lease_expired"):
            self.errors.labels(kind)
        self._gauge = GaugeMetricFamily
        r.register(self)
        self._server: Any = None

    def collect(self) -> list[Any]:
        """The gauges, read now (called by the registry at each scrape)."""
        gauges = {
            "in_use": self._gauge(
                "gridgate_proxyd_tokens_in_use", "Tokens held now", labels=["category"]
            ),
            "privileged": self._gauge(
                "gridgate_proxyd_tokens_in_use_privileged",
                "Tokens held now by root, admins and add-on hosts",
                labels=["category"],
            ),
            "queue": self._gauge(
                "gridgate_proxyd_queue_length", "Requests waiting now", labels=["category"]
            ),
            "limit": self._gauge(
                "gridgate_proxyd_token_limit", "The category's max", labels=["category"]
            ),
        }
        for name, cat in list(self.policy.categories.items()):
            gauges["in_use"].add_metric([name], cat.in_use)
            gauges["privileged"].add_metric([name], cat.in_use_privileged)
            gauges["queue"].add_metric([name], cat.queue.size)
            gauges["limit"].add_metric([name], cat.limits.max)
        return list(gauges.values())

    def decided(self, decision: Decision) -> None:
        """Count one final decision and observe how long its request waited."""
        req = decision.request
        if decision.outcome == GRANTED:
            self.grants.labels(req.category).inc()
        elif decision.outcome == DENIED:
            if decision.reason == "blocked":
                self.blocked.labels(req.category).inc()
            elif decision.reason in ("timeout", "queue_full"):
                self.rejections.labels(req.category, decision.reason).inc()
            elif decision.reason == "rate_limited":
                self.rate_limited.labels(req.category).inc()
        else:
            return
        self.wait.labels(req.category, decision.outcome).observe(max(0.0, decision.waited))

    def serve(self, port: int, address: str) -> int:
        """Start the HTTP exposition; returns the port (useful with port 0)."""
        from gridgate.core.metrics import serve_registry

        try:
            self._server, bound = serve_registry(self.registry, port, address)
        except OSError as exc:
            raise StartupError(f"cannot serve metrics on {address}:{port}: {exc}") from None
        return bound

    def close(self) -> None:
        from gridgate.core.metrics import stop_server

        stop_server(self._server)
        self._server = None


class _Conn:
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


class ProxyDaemon:
    """One lsfproxyd-style daemon. ``section`` is a filled ``proxyd:`` section."""

    def __init__(
        self,
        section: Mapping[str, Any] | None = None,
        *,
        socket_path: str | None = None,
        name: str | None = None,
        config_path: str | os.PathLike[str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.section = dict(section or section_defaults())
        self.config_path = Path(config_path) if config_path else None
        self.clock = clock
        self.name = name or self.section.get("name") or host_name()
        self.socket_path = daemon_socket(socket_path, self.section, self.name)
        self.local_host = host_name()
        self.pid = os.getpid()
        #: The user running the daemon may administer it (it can stop it anyway) but is not
        #: privileged for tokens: a personal daemon must still throttle its owner.
        self.owner = _user_name(os.geteuid())
        self._conns: set[_Conn] = set()
        self._per_user: dict[str, int] = {}
        self._owners: dict[str, _Conn] = {}
        self._waiters: dict[str, _Conn] = {}
        self._ids = 0
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._servers: list[Listener] = []
        self._diag: Any = None
        self._diag_path: Path | None = None
        self._diag_file: Path | None = None  # from `diagnose on -f`
        self._diag_until: float | None = None  # monotonic; from `diagnose on -t`
        #: the other daemons of proxyd.hosts: who is alive decides this daemon's share
        try:
            self.peers = Heartbeat(
                self.name, self.section, clock, self._peers_changed, self.config_path
            )
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        settings = self._settings(self.section)
        self.policy = RateLimitedPolicy(
            settings,
            clock=clock,
            sample_period=float(self.section.get("sample_period", 60)),
            blocklist=self._load_blocklist(),
        )
        self._apply_runtime(self.section)
        #: Prometheus series when ``metrics_port`` is set; the port once serving.
        self.metrics: DaemonMetrics | None = None
        self.metrics_port: int | None = None
        self.reloads = ReloadLog()
        self._challenges: dict[_Conn, str] = {}
        self._shortage, self._refusals, self._failures = PeriodicLog(), PeriodicLog(), PeriodicLog()
        if self.section.get("metrics_port") is not None:
            self.metrics = DaemonMetrics(self.policy)
            self.reloads.attach(self.metrics.registry)
        self.verifier: Verifier | None = None
        #: Called once the sockets listen (the ``serve`` command announces readiness).
        self.on_ready: Any = None

    # -- configuration

    def _settings(self, section: Mapping[str, Any]) -> PolicySettings:
        limits = resolve_policies(section.get("policies"), section.get("max_concurrent_query"))
        hosts = section.get("hosts") or []
        live = 1
        if hosts:
            names = [h["name"] for h in hosts]
            if self.name not in names:
                raise StartupError(
                    f"this daemon's name {self.name!r} is not in proxyd.hosts "
                    f"({', '.join(names)}); give --name or proxyd.name"
                )
            limits = self.peers.view.share(limits, names)
            live = len(self.peers.view.live(names))
        return RatedSettings.extend(
            PolicySettings.from_section(section, limits), rate_limits_from(section, live)
        )

    def _peers_changed(self, service: Mapping[str, bool] | None) -> None:
        """A heartbeat changed who is alive (a new share: held tokens stay, a smaller share
        only stops new grants) or brought a newer service state from a peer."""
        self.policy.reconfigure(self._settings(self.section))
        for category, enabled in (service or {}).items():
            if self.policy.categories[category].enabled != enabled:
                for decision in self.policy.set_enabled(category, enabled):
                    self._deliver(decision)
        self._poke()

    def _apply_runtime(self, section: Mapping[str, Any]) -> None:
        self.categories = category_map(section.get("categories"))
        self.max_line = int(section.get("max_line_bytes", 16384))
        if getattr(self, "guard", None) is None:
            # sized again once serve() has raised RLIMIT_NOFILE: no warning before that
            self.guard = ConnectionGuard(capacity(section, warn=False))
        else:
            self.guard.cap = capacity(section, self.guard.cap.nofile)
        self.line_timeout = float(section.get("line_timeout", 30))
        self.max_user_connections = int(section.get("max_connections_per_user", 1024))
        try:
            self._set_diagnose(bool(section.get("diagnose")))
        except OSError as exc:
            # the service runs on without its diagnostic log rather than not at all
            logger.error("diagnostic log {} not opened: {}", self.diagnose_path, exc)

    def _side_file(self, key: str, default_name: str) -> Path:
        configured = self.section.get(key)
        if configured:
            return Path(configured)
        return Path(self.socket_path).parent / default_name

    @property
    def diagnose_path(self) -> Path:
        # a file named by `diagnose on -f FILE` holds until that diagnosis ends
        return self._diag_file or self._side_file(
            "diagnose_file", f"info.lsfproxydlog.{self.local_host}"
        )

    @property
    def blocklist_path(self) -> Path:
        return self._side_file("blocklist_file", f"blocklist.{self.name}.json")

    def _set_diagnose(self, on: bool) -> None:
        if on and self._diag is not None and self._diag_path != self.diagnose_path:
            self._set_diagnose(False)  # diagnose_file changed on reload: move to the new file
        if on and self._diag is None:
            # no link followed, in a folder only its owner (this user or root) can write
            self._diag = open_log(self.diagnose_path)
            self._diag_path = self.diagnose_path
        elif not on and self._diag is not None:
            self._diag.close()
            self._diag = None

    def _load_blocklist(self) -> Blocklist:
        if not self.section.get("persist_blocklist"):
            return Blocklist()
        path = self.blocklist_path
        try:
            os.close(private_folder(path.parent))
            data = json.loads(path.read_text(encoding="utf-8"))
            return Blocklist(BlockRule.from_json(r) for r in data.get("rules", []))
        except FileNotFoundError:
            return Blocklist()
        except (OSError, ValueError, AttributeError) as exc:
            raise StartupError(f"cannot read the persisted blocklist {path}: {exc}") from None

    def _save_blocklist(self) -> None:
        if not self.section.get("persist_blocklist"):
            return
        rules = [r.to_json() for r in self.policy.blocklist.rules]
        try:
            # the write goes through a predictable temporary name: only in a private folder
            os.close(private_folder(self.blocklist_path.parent))
            atomic_write(self.blocklist_path, json.dumps({"rules": rules}).encode("utf-8"))
        except OSError as exc:
            # the rules hold in memory; what is lost is their surviving a restart
            self._failures("lsfproxyd: blocklist not saved to {}: {}", self.blocklist_path, exc)

    def reload(self) -> dict[str, Any]:
        """Re-read the config file: new limits, lists, diagnose flag; tokens and blocks stay.

        :raises ConfigError, StartupError: the file no longer works (the old config stays).
        """
        if self.config_path is None:
            return {"reloaded": False, "message": "started without -c: nothing to re-read"}
        try:
            section = checked_section(self.config_path, self.section)
            settings = self._settings(section)
        except (ConfigError, StartupError, ValueError) as exc:
            self.reloads.refuse(exc)
            raise
        for key in ("socket", "tcp", "key", "metrics_port", "metrics_address", "heartbeat_via"):
            if section.get(key) != self.section.get(key):
                logger.warning("proxyd.{} changed: takes effect at the next restart", key)
        self.section = section
        self.peers.configure(section)
        self.policy.reconfigure(settings)
        self._apply_runtime(section)
        self._poke()
        self.reloads.ok()
        logger.info("lsfproxyd {} reconfigured from {}", self.name, self.config_path)
        return {"reloaded": True, "message": f"reconfigured from {self.config_path}"}

    # -- serving

    async def serve(self, install_signals: bool = True) -> None:
        """Listen until SIGTERM/SIGINT or :meth:`stop` (signals only from the main thread)."""
        loop = self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        _raise_nofile()
        self.guard.cap = capacity(self.section)  # the limit as raised, from now on
        try:
            await self._listen()
            if self.metrics is not None:
                self.metrics_port = self.metrics.serve(
                    int(self.section["metrics_port"]),
                    str(self.section.get("metrics_address") or "127.0.0.1"),
                )
                logger.info(
                    "lsfproxyd {} metrics on http://{}:{}/metrics",
                    self.name,
                    self.section.get("metrics_address"),
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
        if self.on_ready is not None:
            self.on_ready(self)
        logger.info("lsfproxyd {} listening on {} (pid {})", self.name, self.socket_path, self.pid)
        try:
            await self._stop.wait()
        finally:
            # the ticker is told to stop, not cancelled, so it never stops halfway through
            # handing out the decisions of a tick
            self._stop.set()
            self._poke()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ticker, 5)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(beats, 5)
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
            self._loop.call_soon_threadsafe(self._poke)

    async def _listen(self) -> None:
        path = Path(self.socket_path)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        _check_socket_dir(path.parent)
        if path.exists() or path.is_symlink():
            if _socket_answers(str(path)):
                raise StartupError(f"a daemon already listens on {path}")
            path.unlink()
        server = self._listener(socket.AF_UNIX, str(path), self._on_unix, f"unix {path}")
        os.chmod(path, int(self.section.get("socket_mode", "0666"), 8))
        self._servers.append(server)
        tcp = self.section.get("tcp")
        if tcp:
            key = read_secret(self.section.get("key"))
            if not key:
                raise StartupError("proxyd.tcp needs proxyd.key")
            self.verifier = Verifier(
                key, float(self.section.get("max_clock_skew", 30)), daemon=self.name
            )
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

    def reopen_logs(self) -> None:
        """Close and reopen the diagnostic log, so that after logrotate renamed it the daemon
        writes to a fresh file at the configured path (SIGHUP does this, then reloads)."""
        if self._diag is not None:
            self._set_diagnose(False)
            try:
                self._set_diagnose(True)
            except OSError as exc:
                logger.error("diagnostic log {} not reopened: {}", self.diagnose_path, exc)

    def _sighup(self) -> None:
        self.reopen_logs()
        try:
            self.reload()
        except (ConfigError, StartupError, ValueError):
            pass  # reload() logged and counted it

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for decision in self.policy.shutdown():
            self._deliver(decision)
        for conn in list(self._conns):
            self._close(conn)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self._save_blocklist()
        self._set_diagnose(False)
        if self.metrics is not None:
            self.metrics.close()
        logger.info("lsfproxyd {} stopped", self.name)

    async def _ticker(self) -> None:
        assert self._wake is not None and self._stop is not None and self._loop is not None
        while not self._stop.is_set():
            self._diagnose_expiry()
            result = self.policy.tick()
            if self.metrics is not None and result.expired:
                # the policy counted them in its Error row
                self.metrics.errors.labels("lease_expired").inc(len(result.expired))
            for token in result.expired:
                owner = self._owners.pop(token.id, None)
                logger.warning(
                    "lease of token {} ({} {}) held by {}@{} expired after {:.0f} s "
                    "(its hold limit): taken back",
                    token.id,
                    token.category,
                    token.opcode or "-",
                    token.user,
                    token.host,
                    token.expires_at - token.granted,
                )
                self._diag_write(holding.hold_limit_line(token, self.clock.time()))
                if owner is not None:
                    owner.tokens.discard(token.id)
                    self._send(
                        owner, {"v": PROTOCOL_VERSION, "event": "expired", "token": token.id}
                    )
            for decision in result.decisions:
                self._deliver(decision)
            wake = earliest(self.policy.next_wakeup(), self._diag_until)
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

    def _diagnose_expiry(self) -> None:
        """`diagnose on -t MINUTES` turns itself off when its time is up."""
        if self._diag_until is not None and self.clock.monotonic() >= self._diag_until:
            logger.info("diagnose off: its time is up ({})", self.diagnose_path)
            self._diag_until = None
            self._diag_file = None
            self._set_diagnose(False)

    def _poke(self) -> None:
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
        await self._serve_conn(reader, _Conn(writer, user, self.local_host, False, f"pid {pid}"))

    async def _on_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        await self._serve_conn(reader, _Conn(writer, "", "", True, f"tcp {peer}"))

    # -- capacity and TCP authentication (guard.py)

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

    def _admit(self, conn: _Conn) -> str | None:
        """None when ``conn`` may have a slot in its pool, else why not."""
        if conn.tcp:
            peer = str((conn.writer.get_extra_info("peername") or ("?",))[0])
            victim = self.guard.displaceable(peer)
            if victim is not None:
                # the pool is full: an address holding many makes room for one holding few
                self.guard.refused["displaced"] += 1
                self._error(
                    victim,
                    None,
                    ProtocolError(
                        "busy",
                        "too many unauthenticated TCP connections: the oldest of the "
                        "address holding the most is closed",
                    ),
                )
                self._close(victim)
            why = self.guard.admit(conn, UNAUTH, peer)
            if why is None and self._loop is not None:
                self.guard.watch(
                    conn,
                    self._loop.call_later(
                        self.guard.cap.tcp_auth_timeout, self._auth_expired, conn
                    ),
                )
        else:
            privileged = self.policy.is_root_or_admin(conn.user) or conn.user == self.owner
            why = self.guard.admit(conn, PRIVILEGED if privileged else ORDINARY)
        if why is not None:
            self._refusals("lsfproxyd: connection from {} closed: {}", conn.peer, why)
        return why

    def _auth_expired(self, conn: _Conn) -> None:
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
                None,
                ProtocolError("auth_timeout", f"no validly signed request within {timeout:g} s"),
            )
            self._close(conn)

    def _hello_extra(self, conn: _Conn) -> dict[str, Any]:
        """Over TCP ``hello`` hands out the connection's challenge, which every signature on
        it must cover: a request captured here is good for nothing elsewhere (protocol.md)."""
        if not conn.tcp:
            return {}
        return {"challenge": self._challenges.setdefault(conn, secrets.token_hex(16))}

    def _verify(self, conn: _Conn, message: Mapping[str, Any]) -> tuple[str, str]:
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
        busy = self.guard.authenticated(conn, self.policy.is_root_or_admin(user))
        if busy is not None:
            asyncio.get_running_loop().call_soon(self._close, conn)
            raise ProtocolError("busy", busy)
        return user, host

    async def _serve_conn(self, reader: asyncio.StreamReader, conn: _Conn) -> None:
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
        busy = self._admit(conn)
        if busy is not None:
            self._error(conn, None, ProtocolError("busy", busy))
            conn.writer.close()
            return
        if ordinary:
            self._per_user[conn.user] = self._per_user.get(conn.user, 0) + 1
        conn.counted = ordinary
        self._conns.add(conn)
        buffer = bytearray()
        discarding = False
        try:
            while not conn.closed:
                if buffer and not discarding:
                    # half a line may not sit here for ever: slow senders must not pile up
                    try:
                        chunk = await asyncio.wait_for(reader.read(65536), self.line_timeout)
                    except TimeoutError:
                        self._count_error()
                        self._error(
                            conn,
                            None,
                            ProtocolError(
                                "line_timeout", f"incomplete line for {self.line_timeout:g} s"
                            ),
                        )
                        break
                else:
                    chunk = await reader.read(65536)
                if not chunk:
                    break
                buffer += chunk
                while True:
                    end = buffer.find(b"\n")
                    if end < 0:
                        if len(buffer) > self.max_line:
                            if not discarding:
                                self._too_long(conn)
                            discarding = True
                            buffer.clear()
                        break
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if discarding:
                        discarding = False
                        continue
                    if len(line) > self.max_line:
                        self._too_long(conn)
                        continue
                    if line.strip():
                        self._handle_line(conn, line)
        except (ConnectionError, OSError):
            pass
        finally:
            self._close(conn)

    def _count_error(self) -> None:
        self.policy.count_error()
        if self.metrics is not None:
            self.metrics.errors.labels("protocol").inc()

    def _too_long(self, conn: _Conn) -> None:
        self._count_error()
        self._error(
            conn,
            None,
            ProtocolError("line_too_long", f"lines are limited to {self.max_line} bytes"),
        )

    def _close(self, conn: _Conn) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            if conn.counted:
                left = self._per_user.get(conn.user, 1) - 1
                if left > 0:
                    self._per_user[conn.user] = left
                else:
                    self._per_user.pop(conn.user, None)
        conn.closed = True
        self.guard.release(conn)
        self._challenges.pop(conn, None)
        for request_id in list(conn.waiting):
            self.policy.cancel(request_id)
            self._waiters.pop(request_id, None)
        conn.waiting.clear()
        for token_id in list(conn.tokens):
            if self.policy.release(token_id) is not None:
                logger.info(
                    "token {} of {}@{} returned: connection closed", token_id, conn.user, conn.host
                )
            self._owners.pop(token_id, None)
        conn.tokens.clear()
        with contextlib.suppress(Exception):
            conn.writer.close()
        self._poke()

    def _send(self, conn: _Conn, message: Mapping[str, Any]) -> None:
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

    def _error(self, conn: _Conn, msg_id: Any, exc: ProtocolError) -> None:
        self._send(
            conn,
            {
                "v": PROTOCOL_VERSION,
                "id": msg_id,
                "ok": False,
                "error": {"code": exc.code, "message": str(exc)},
            },
        )

    def _reply(self, conn: _Conn, msg_id: Any, **fields: Any) -> None:
        self._send(conn, {"v": PROTOCOL_VERSION, "id": msg_id, "ok": True, **fields})

    def _handle_line(self, conn: _Conn, line: bytes) -> None:
        msg_id = None
        if conn.tcp:
            self.guard.spoke(conn)
        try:
            message = decode(line)
            msg_id = message.get("id")
            user, host = conn.user, conn.host
            if conn.tcp:
                user, host = self._verify(conn, message)
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
        self, conn: _Conn, message: Mapping[str, Any], msg_id: Any, user: str, host: str
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
                **self._hello_extra(conn),
            )
            return
        if op == "acquire":
            self._acquire(conn, message, msg_id, user, host)
            return
        if op == "check":
            reply = holding.check(self.policy, message, user, host, conn.tcp)
            if "token" in reply:  # a ride (holding.py): this connection holds it, as a grant
                conn.tokens.add(reply["token"])
                self._owners[reply["token"]] = conn
            self._reply(conn, msg_id, **reply)
            return
        if op == "release":
            token_id = message.get("token")
            if not isinstance(token_id, str):
                # a list or object here used to end as an "internal" TypeError (unhashable)
                raise ProtocolError("bad_request", "token must be a string")
            held = token_id in conn.tokens
            if held:
                conn.tokens.discard(token_id)
                self._owners.pop(token_id, None)
                self.policy.release(token_id)
                if self.policy.has_waiters():
                    self._poke()
            self._reply(conn, msg_id, released=held)
            return
        if op not in ADMIN_OPS:
            raise ProtocolError("unknown_op", f"unknown op {op!r}")
        if not may_admin:
            raise ProtocolError(
                "forbidden",
                f"permission denied: {op} is for root and the lsfproxyd admins; {user} is neither",
            )
        self._admin(conn, op, message, msg_id, user, host)

    def _acquire(
        self, conn: _Conn, message: Mapping[str, Any], msg_id: Any, user: str, host: str
    ) -> None:
        opcode = message.get("opcode") or ""
        category = message.get("category") or None
        size = message.get("size") or 0
        if not isinstance(opcode, str) or len(opcode) > 128:
            raise ProtocolError("bad_request", "opcode must be a string of at most 128 characters")
        if category is None:
            category = category_of(opcode, self.categories)
        category = CATEGORY_WORDS.get(category, category) if isinstance(category, str) else category
        if category not in CATEGORIES:
            raise ProtocolError("bad_request", f"category must be one of {', '.join(CATEGORIES)}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProtocolError("bad_request", "size must be a non-negative integer")
        self._ids += 1
        req = Request(f"r{self._ids}", category, opcode, user, host, size)
        conn.waiting[req.id] = msg_id
        self._waiters[req.id] = conn
        decision = self.policy.request(req)
        if decision.outcome == QUEUED:
            # the client may tell its user why it waits, and behind how many
            self._send(
                conn,
                {
                    "v": PROTOCOL_VERSION,
                    "event": "queued",
                    "request": msg_id,
                    "ahead": self.policy.ahead(req.id),
                },
            )
            self._poke()
            return
        self._deliver(decision)

    def _diag_write(self, line: str) -> None:
        if self._diag is not None:
            try:
                self._diag.write(line + "\n")
            except OSError as exc:  # a full disk: once a minute, not once per request
                self._failures("lsfproxyd: diagnostic log {}: {}", self.diagnose_path, exc)

    def _deliver(self, decision: Decision) -> None:
        req = decision.request
        conn = self._waiters.pop(req.id, None)
        if self.metrics is not None:
            self.metrics.decided(decision)
        if decision.outcome in ("granted", "denied"):
            self._diag_write(diagnose_line(decision))
        if conn is None:
            return
        msg_id = conn.waiting.pop(req.id, None)
        if conn.closed:
            if decision.token is not None:
                self.policy.release(decision.token.id)
            return
        fields: dict[str, Any] = {
            "result": decision.outcome,
            "category": req.category,
            "waited": round(decision.waited, 6),
        }
        if decision.token is not None:
            conn.tokens.add(decision.token.id)
            self._owners[decision.token.id] = conn
            fields.update(
                token=decision.token.id,
                lease=self.policy.settings.lease_time,
                privileged=decision.token.privileged,
            )
            nice = self.policy.nice_for(decision.token)
            if nice:
                fields["nice"] = nice
        if decision.reason:
            fields["reason"] = decision.reason
        self._reply(conn, msg_id, **fields)

    # -- admin

    def _admin(
        self, conn: _Conn, op: str, message: Mapping[str, Any], msg_id: Any, user: str, host: str
    ) -> None:
        if op == "status":
            # peers first: a peer that fell silent since the last heartbeat is dropped now,
            # so the shares shown are the ones in force
            peers = self.peers.status() if self.peers.active else None
            status = self.policy.status()
            status.update(
                name=self.name,
                pid=self.pid,
                host=self.local_host,
                diagnose=self._diag is not None,
                diagnose_file=str(self.diagnose_path),
                connections=len(self._conns),
                metrics_port=self.metrics_port,
                longest_held=holding.longest_held(self.policy),
                reloads=self.reloads.as_json(),
                capacity=self.guard.as_json(),
            )
            if peers is not None:
                status["peers"] = peers
            self._reply(conn, msg_id, status=status)
            return
        if op in ("enable", "disable"):
            word = message.get("category", "all")
            category = CATEGORY_WORDS.get(word) if isinstance(word, str) else None
            if category is None:
                raise ProtocolError("bad_request", "category must be all, query, sub or other")
            for decision in self.policy.set_enabled(category, op == "enable"):
                self._deliver(decision)
            self.peers.service_changed(self._service())
            logger.info("{} {} by {}@{}", op, category, user, host)
            self._reply(conn, msg_id, service=self._service())
            return
        if op in ("block", "unblock"):
            rule = _rule_from(message)
            if op == "block":
                added, decisions = self.policy.block(rule)
                for decision in decisions:
                    self._deliver(decision)
                changed = added
            else:
                changed = self.policy.unblock(rule)
            if changed:
                self._save_blocklist()
            logger.info(
                "{} {} by {}@{} ({})",
                op,
                rule.describe(),
                user,
                host,
                "done" if changed else "no change",
            )
            done, kept = rule.partition(changed)
            self._reply(
                conn,
                msg_id,
                rule=rule.to_json(),
                text=rule.describe(),
                changed=bool(changed),
                done=done.describe() if done else "",
                kept=kept.describe() if kept else "",
            )
            return
        if op == "blocklist":
            self._reply(
                conn,
                msg_id,
                blocklist=self.policy.blocklist.summary(),
                rules=[r.to_json() for r in self.policy.blocklist.rules],
            )
            return
        if op == "diagnose":
            on, minutes, path = diagnose_args(
                message,
                self._side_file("diagnose_file", f"info.lsfproxydlog.{self.local_host}").parent,
            )
            previous = self._diag_file
            self._diag_file = path if on else None
            try:
                self._set_diagnose(on)
            except OSError as exc:
                self._diag_file = previous
                raise ProtocolError(
                    "io_error", f"cannot open {path or self.diagnose_path}: {exc}"
                ) from None
            self._diag_until = self.clock.monotonic() + minutes * 60 if minutes else None
            self._poke()
            until = self.clock.time() + minutes * 60 if minutes else None
            logger.info(
                "diagnose {} by {}@{} ({}{})",
                "on" if on else "off",
                user,
                host,
                self.diagnose_path,
                f", for {minutes:g} min" if minutes else "",
            )
            self._reply(conn, msg_id, diagnose=on, file=str(self.diagnose_path), until=until)
            return
        if op == "heartbeat":
            try:
                self._reply(conn, msg_id, **self.peers.answer(message))
            except ValueError as exc:
                raise ProtocolError("bad_request", str(exc)) from None
            return
        if op == "reconfig":
            try:
                result = self.reload()
            except ConfigError as exc:
                raise ProtocolError(
                    "bad_config", f"config refused, the old one stays:\n{exc}"
                ) from None
            except (StartupError, ValueError) as exc:
                raise ProtocolError("bad_config", str(exc)) from None
            self._reply(conn, msg_id, **result)
            return
        raise ProtocolError("unknown_op", f"unknown op {op!r}")  # pragma: no cover

    def _service(self) -> dict[str, bool]:
        return {name: cat.enabled for name, cat in self.policy.categories.items()}


def _rule_from(message: Mapping[str, Any]) -> BlockRule:
    users, hosts = message.get("users") or [], message.get("hosts") or []
    if not (
        isinstance(users, list)
        and all(isinstance(u, str) for u in users)
        and isinstance(hosts, list)
        and all(isinstance(h, str) for h in hosts)
    ):
        raise ProtocolError("bad_request", "users and hosts must be lists of names")
    odd = [n for n in (*users, *hosts) if n and (len(n) > 128 or log_field(n) != n or "@" in n)]
    if odd:
        # they reach the daemon's log, the blocklist file and every admin's terminal
        raise ProtocolError(
            "bad_request",
            f"{len(odd)} name(s) outside letters, digits and "
            "'._-+:' (at most 128): not a user or host name",
        )
    try:
        return BlockRule.make(bool(message.get("all")), users, hosts)
    except ValueError as exc:
        raise ProtocolError("bad_request", str(exc)) from None


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


def _check_socket_dir(folder: Path) -> None:
    """Refuse a socket directory anyone but its owner (us or root) can write: whoever can
    write there can replace the socket and collect every client's requests."""
    euid = os.geteuid()
    link = os.lstat(folder)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, euid):
        raise StartupError(
            f"the socket directory {folder} is a symbolic link owned by uid "
            f"{link.st_uid}: use a directory owned by this user or root"
        )
    info = os.stat(folder)
    if info.st_uid not in (0, euid):
        raise StartupError(
            f"the socket directory {folder} belongs to uid {info.st_uid}, "
            "not to this user or root: another user could replace the socket"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StartupError(
            f"the socket directory {folder} is writable by others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): another user could replace the "
            "socket; use a directory only its owner can write (e.g. 0755)"
        )


def _socket_answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


def _raise_nofile() -> None:
    """10,000 clients need 10,000 descriptors: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard)
            )


def run(section: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
    """Build a daemon and serve until stopped (the ``serve`` command)."""
    daemon = ProxyDaemon(section, **kwargs)
    asyncio.run(daemon.serve())
