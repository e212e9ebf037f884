"""The gate's own client of the token daemon: one token, held by one process, standard library only.

``gridgate gate`` and the shims run in front of every gated ``bjobs``; what they import is what
each call costs. :class:`~gridgate.plugins.lsf_proxy.client.client.ProxyClient` is the client for
long-lived programs (thread-safe, pooled connections, loguru); this one speaks the same wire
protocol (docs/protocol.md) for a process that takes one token, keeps it while its command
runs and gives it back. Over the Unix socket it imports only ``os``, ``socket``, ``json``,
``time`` and :mod:`gridgate.plugins.lsf_proxy.wire` (the protocol's version and errors, shared
with the other client); signing for TCP borrows :func:`gridgate.plugins.lsf_proxy.protocol.sign`.
"""

from __future__ import annotations

import os
import time

from gridgate.plugins.lsf_proxy.wire import (
    PROTOCOL_VERSION,
    ConnectionBroken,
    DaemonBusy,
    NoToken,
    ProxyError,
    ProxyUnavailable,
    RequestFailed,
    blocked_message,
    busy_nice,
    connect_failed,
    next_daemon,
    reply_error,
    turned_away,
)

# The C halves of ``socket`` and ``json``: the Python wrappers import enum, selectors and re,
# which cost the gate more than everything else it does (python -X importtime). This client
# needs only what the C modules have; other interpreters fall back to the wrappers.
try:
    import _socket as socket
except ImportError:  # pragma: no cover
    import socket  # type: ignore[no-redef]

TYPE_CHECKING = False  # typing costs more to import than the rest of this module
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any


class _Context:
    """What ``_json.make_scanner`` reads of a decoder: the defaults of ``json.loads``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # NaN, Infinity


_scan: Any
_quote: Any
try:
    import _json

    _scan = _json.make_scanner(_Context)  # type: ignore[arg-type]  # a decoder's attributes
    _quote = _json.encode_basestring_ascii
except (ImportError, AttributeError):  # pragma: no cover
    _scan = _quote = None


def dumps(message: Mapping[str, Any]) -> bytes:
    """``message`` as one compact JSON line (what ``json.dumps`` gives, separators "," ":")."""
    if _quote is None or not all(
        v is None or isinstance(v, str | int | float) for v in message.values()
    ):
        import json

        return json.dumps(message, separators=(",", ":")).encode() + b"\n"
    parts = []
    for key, value in message.items():
        if isinstance(value, str):
            text = _quote(value)
        elif value is None or isinstance(value, bool):
            text = {None: "null", True: "true", False: "false"}[value]
        else:
            text = repr(value)
        parts.append(f"{_quote(key)}:{text}")
    return ("{" + ",".join(parts) + "}\n").encode()


def loads(line: bytes) -> Any:
    """One JSON line (as ``json.loads``).

    :raises ValueError: not a single JSON value, not UTF-8, or nested past the recursion
        limit (as :func:`gridgate.core.text.parse_json`, without its imports).
    """
    if _scan is None:  # pragma: no cover
        import json

        return json.loads(line)
    try:
        text = line.decode("utf-8").strip()
        value, end = _scan(text, 0)
    except StopIteration:
        raise ValueError(f"not JSON: {text[:60]!r}") from None
    except RecursionError:
        raise ValueError("not JSON: nested deeper than the recursion limit") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None
    if end != len(text):
        raise ValueError(f"extra data after the JSON value: {text[end : end + 60]!r}")
    return value


def _rand() -> float:
    """A number in [0, 1) from the kernel (the ``random`` module costs more to import)."""
    return int.from_bytes(os.urandom(4), "big") / 2**32


class Link:
    """One blocking connection to one daemon."""

    def __init__(
        self, name: str, address: str, timeout: float, signer: Callable[..., None] | None
    ) -> None:
        self.name, self.address = name, address
        self._signer = signer
        self._ids = 0
        self._buffer = b""
        #: called once when this connection is closed (the gate's early token holder)
        self.on_close: Callable[[], None] | None = None
        tcp = not address.startswith(("/", "."))
        target: Any  # a socket path, or what getaddrinfo answers
        if tcp:
            if signer is None:
                raise ProxyError(f"{name}: TCP needs the shared key (proxyd.key)")
            host, _, port = address.rpartition(":")
            try:
                infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
            except (OSError, ValueError) as exc:
                raise ConnectionBroken(f"{name}: cannot resolve {address}: {exc}") from None
            family, target = infos[0][0], infos[0][4]
        else:
            self._signer = None
            family, target = socket.AF_UNIX, address
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(target)
        except OSError as exc:
            self.sock.close()
            raise connect_failed(name, address, exc) from None
        self._bound: dict[str, Any] = {}
        if self._signer is not None:
            self._handshake(timeout)

    def _handshake(self, timeout: float) -> None:
        """Over TCP, the challenge of this connection's ``hello``, which every signature on it
        covers with the daemon's name (protocol.md): a captured request is good nowhere else."""
        signer, self._signer = self._signer, None  # hello goes unsigned
        try:
            reply = self.call("hello", timeout)
        except BaseException:
            self.close()
            raise
        finally:
            self._signer = signer
        if reply.get("challenge"):
            self._bound = {"challenge": reply["challenge"], "daemon": reply.get("name")}

    def send(self, op: str, **fields: Any) -> int:
        self._ids += 1
        message: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": self._ids, "op": op, **fields}
        if self._signer is not None:
            self._signer(message, **self._bound)
        try:
            self.sock.sendall(dumps(message))
        except OSError as exc:
            self.close()
            raise ConnectionBroken(f"{self.name}: {exc}") from None
        return self._ids

    def wait(
        self,
        msg_id: int,
        timeout: float,
        notice: float | None = None,
        on_notice: Callable[[int | None], None] | None = None,
    ) -> dict[str, Any]:
        """The reply to ``msg_id``; ``on_notice(ahead)`` once if it takes ``notice`` seconds
        (``ahead``: the requests queued before ours, from the daemon's ``queued`` event)."""
        deadline = time.monotonic() + timeout
        notice_at = None if notice is None else time.monotonic() + notice
        ahead: int | None = None
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                now = time.monotonic()
                if now >= deadline:
                    self.close()
                    raise DaemonBusy(f"{self.name}: no reply within {timeout:.0f} s")
                limit = deadline - now
                if notice_at is not None:
                    if now >= notice_at:
                        notice_at = None
                        if on_notice is not None:
                            on_notice(ahead)
                        continue
                    limit = min(limit, notice_at - now)
                self.sock.settimeout(max(limit, 0.001))
                try:
                    chunk = self.sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError as exc:
                    self.close()
                    raise ConnectionBroken(f"{self.name}: {exc}") from None
                if not chunk:
                    self.close()
                    raise ConnectionBroken(f"{self.name}: the daemon closed the connection")
                self._buffer += chunk
                continue
            line, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
            try:
                reply = loads(line)
            except ValueError as exc:
                self.close()
                raise ConnectionBroken(f"{self.name}: not a JSON line: {exc}") from None
            if reply.get("id") == msg_id:
                return reply
            if reply.get("event") == "queued" and reply.get("request") == msg_id:
                ahead = reply.get("ahead") if isinstance(reply.get("ahead"), int) else None
            elif reply.get("id") is None and reply.get("ok") is False:
                busy = turned_away(self.name, reply)
                if busy is not None:
                    # there, but no room for this connection: try the next, then again
                    self.close()
                    raise busy
                code, message = reply_error(reply)
                raise RequestFailed(code, f"{self.name}: {message}")

    def call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        return self.wait(self.send(op, **fields), timeout)

    def close(self) -> None:
        hook, self.on_close = self.on_close, None
        if hook is not None:
            hook()
        try:
            self.sock.close()
        except OSError:
            pass  # the descriptor is gone either way; there is nothing left to release


class Grant:
    """A granted token (``token``), or leave to run without one (``token`` empty)."""

    def __init__(
        self,
        token: str = "",
        link: Link | None = None,
        reason: str = "",
        timeout: float = 5.0,
        nice: int = 0,
    ) -> None:
        self.token, self.link, self.reason, self._timeout = token, link, reason, timeout
        #: the niceness the daemon asks the command to run at (a busy user's), 0: as it is
        self.nice = nice

    def release(self) -> None:
        """Give the token back (closing the connection would too; this says so at once)."""
        link, self.link = self.link, None
        if link is None:
            return
        try:
            link.call("release", self._timeout, token=self.token)
        except (ConnectionBroken, ProxyError):
            pass  # unanswered: the daemon takes the token back when the connection closes
        link.close()


class GateClient:
    """Takes a token from one of ``daemons`` (name, address) as ``ProxyClient.acquire`` does:
    a random rotation, daemons that did not answer tried last, ``notoken_ntries`` attempts
    with jittered exponential back-off, ``when_unavailable`` when nobody answers."""

    def __init__(
        self,
        daemons: Sequence[tuple[str, str]],
        *,
        key: str | None = None,
        notoken_ntries: int | None = None,
        when_unavailable: str = "proceed",
        connect_timeout: float = 5.0,
        reply_timeout: float = 30.0,
        backoff: tuple[float, float] = (0.1, 5.0),
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.daemons = list(daemons)
        self.key = key
        self.notoken_ntries = notoken_ntries
        self.when_unavailable = when_unavailable
        self.connect_timeout = connect_timeout
        self.reply_timeout = reply_timeout
        self.backoff = backoff
        self.warn = warn or (lambda _message: None)
        self._down: set[str] = set()
        self._signer: Callable[..., None] | None = None

    @classmethod
    def from_section(
        cls, section: Mapping[str, Any], socket_path: str | None = None, **overrides: Any
    ) -> GateClient:
        """Configured like ``ProxyClient.from_section`` (``--socket`` wins over the hosts).

        :param section: the gate's resolved settings (``gating.resolve``: every key of
            ``gating.CLIENT_DEFAULTS`` there, defaults filled), not a section as written.
        """
        env = os.environ.get("GRIDGATE_PROXYD_SOCKET")
        if socket_path or env or not section["hosts"]:
            daemons = [
                (
                    socket.gethostname().split(".")[0],
                    absolute_socket(
                        socket_path or env or section["socket"] or default_socket_path()
                    ),
                )
            ]
        else:
            daemons = [(h["name"], h["address"]) for h in section["hosts"]]
        key = None
        if any(not a.startswith(("/", ".")) for _, a in daemons):
            from gridgate.core.secrets import read_secret

            key = read_secret(section["key"])
        options: dict[str, Any] = {
            "key": key,
            "notoken_ntries": section["notoken_ntries"],
            "when_unavailable": section["when_unavailable"],
            "connect_timeout": float(section["client_timeout"]),
            "reply_timeout": float(section["token_wait_time"]) + 15.0,
        }
        options.update(overrides)
        return cls(daemons, **options)

    def _link(self, daemon: tuple[str, str]) -> Link:
        if self.key and self._signer is None and not daemon[1].startswith(("/", ".")):
            import pwd

            from gridgate.plugins.lsf_proxy.protocol import sign

            try:
                user = pwd.getpwuid(os.geteuid()).pw_name
            except KeyError:
                user = str(os.geteuid())
            host, key = socket.gethostname().split(".")[0], self.key

            def signer(message: dict[str, Any], **bound: Any) -> None:
                sign(message, key, user, host, **bound)

            self._signer = signer
        return Link(daemon[0], daemon[1], self.connect_timeout, self._signer)

    def _order(self) -> list[tuple[str, str]]:
        start = int(_rand() * len(self.daemons))
        order = self.daemons[start:] + self.daemons[:start]
        return sorted(order, key=lambda d: d[1] in self._down)

    def acquire(
        self,
        category: str,
        opcode: str,
        notice: float | None = None,
        on_notice: Callable[[int | None], None] | None = None,
        on_sent: Callable[[Link], None] | None = None,
        size: int = 0,
    ) -> Grant:
        """Wait for a token of ``category``; ``on_sent(link)`` after each request is sent
        (work to overlap with the daemon's answer); ``size`` is the request's size in bytes
        for the diagnostic log.

        :raises NoToken: blocked, or denied ``notoken_ntries`` times.
        :raises ProxyUnavailable: no daemon answered and ``when_unavailable`` is ``fail``.
        :raises RequestFailed: the daemon refused the request as malformed.
        """
        tries = 0
        while True:
            reply, link, name = self._acquire_once(
                category, opcode, notice, on_notice, on_sent, size
            )
            if reply is None:
                message = f"no lsfproxyd answered ({', '.join(n for n, _ in self.daemons)})"
                if self.when_unavailable == "fail":
                    raise ProxyUnavailable(message)
                self.warn(f"{message}: proceeding without a token")
                return Grant(reason="unavailable")
            result, said = reply.get("result"), reply.get("reason")
            if result == "granted" and link is not None:
                return Grant(
                    str(reply.get("token") or ""),
                    link,
                    timeout=self.connect_timeout,
                    nice=busy_nice(reply),
                )
            if link is not None:
                link.close()
            if result == "proceed":
                return Grant(reason="" if said is None else str(said))
            reason = "denied" if said is None else str(said)
            tries += 1
            if reason == "blocked":
                raise NoToken(blocked_message(name, reply), reason)
            if self.notoken_ntries is not None and tries >= self.notoken_ntries:
                raise NoToken(
                    f"no token after {tries} attempt(s), last: {reason} from {name}", reason
                )
            delay = min(self.backoff[1], self.backoff[0] * 2 ** min(tries - 1, 16))
            time.sleep(delay * (0.5 + _rand() / 2))
            notice = None  # said once is enough

    def _acquire_once(
        self,
        category: str,
        opcode: str,
        notice: float | None,
        on_notice: Callable[[int | None], None] | None,
        on_sent: Callable[[Link], None] | None = None,
        size: int = 0,
    ) -> tuple[dict[str, Any] | None, Link | None, str]:
        busy = ""
        order = self._order()
        for i, daemon in enumerate(order):
            try:
                link = self._link(daemon)
                try:
                    msg_id = link.send("acquire", category=category, opcode=opcode, size=size)
                    if on_sent is not None:
                        on_sent(link)
                    reply = link.wait(msg_id, self.reply_timeout, notice, on_notice)
                except RequestFailed:
                    link.close()
                    raise
            except DaemonBusy as exc:
                self.warn(f"lsfproxyd {daemon[0]} is overloaded: {exc}{next_daemon(i, order)}")
                busy = busy or daemon[0]
                continue
            except ConnectionBroken as exc:
                self.warn(f"lsfproxyd {daemon[0]} did not answer: {exc}{next_daemon(i, order)}")
                self._down.add(daemon[1])
                continue
            self._down.discard(daemon[1])
            if not reply.get("ok"):
                link.close()
                code, message = reply_error(reply)
                raise RequestFailed(code, f"{daemon[0]}: {message}")
            return reply, link, daemon[0]
        if busy:
            # alive but swamped: a refusal to retry, never a licence to run without a token
            return {"ok": True, "result": "denied", "reason": "busy"}, None, busy
        return None, None, ""

    def ride(
        self, token: str, category: str, opcode: str, wait: float = 15.0
    ) -> tuple[Grant | None, str]:
        """Ride on ``token`` (the gated script's, from ``GRIDGATE_GATE_TOKEN``): a token of
        this call's own on the parent's slot, held on its own connection (hand it to a
        holder, as a grant). While another nested call rides on it, wait for that one to end,
        up to ``wait`` seconds. Returns the grant, or None and why not (``not_live``,
        ``category``, ``disabled``, ``busy`` after ``wait``, ``unanswered``): the caller then
        asks for a token of its own, as any call does.

        :raises NoToken: the user is blocked (the message says by whom, until when).
        """
        import time

        deadline = time.monotonic() + wait
        pause = 0.02
        while True:
            reason = "unanswered"
            for daemon in self._order():
                try:
                    link = self._link(daemon)
                except ConnectionBroken:
                    continue
                try:
                    reply = link.call(
                        "check", self.connect_timeout, token=token, category=category, opcode=opcode
                    )
                except (ConnectionBroken, RequestFailed):
                    link.close()
                    continue
                if reply.get("ok") and reply.get("live") is True and reply.get("token"):
                    return Grant(str(reply["token"]), link, timeout=self.connect_timeout), ""
                link.close()
                reason = str(reply.get("reason") or "not_live")
                if reason == "blocked":
                    raise NoToken(blocked_message(daemon[0], reply), reason)
                if reason != "not_live":
                    break  # the daemon that holds the parent token said no
            if reason != "busy" or time.monotonic() + pause > deadline:
                return None, reason
            time.sleep(pause)  # the other nested call runs: one at a time on one token
            pause = min(pause * 2, 0.5)

    def check(self, token: str) -> bool | None:
        """Whether ``token`` is live and held by this user, as some daemon says (``check``);
        None when no daemon answered."""
        answered = False
        for daemon in self._order():
            try:
                link = self._link(daemon)
                try:
                    reply = link.call("check", self.connect_timeout, token=token)
                finally:
                    link.close()
            except (ConnectionBroken, RequestFailed):
                continue
            answered = True
            if reply.get("ok") and reply.get("live") is True:
                return True
        return False if answered else None


def default_socket_path() -> str:
    """As :func:`gridgate.plugins.lsf_proxy.config.default_socket_path` (a test pins both)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if os.geteuid() == 0 or not runtime:
        return "/run/gridgate/proxyd.sock"
    return os.path.join(runtime, "gridgate", "proxyd.sock")


def absolute_socket(path: str) -> str:
    """A socket path as an absolute one: ``--socket proxyd.sock`` means the one in the
    current directory (an address must start with ``/`` to be told from ``host:port``)."""
    return path if path.startswith("/") else os.path.abspath(path)
