"""The text of a shim: one self-contained script per command, written by ``--install-shims``.

A shim runs in front of every gated ``bjobs`` a user types, so what it imports is what each call
costs. ``install_shims`` compiles this file once into the shims' folder (``gate.CODE_PREFIX``)
and writes each shim as its settings as a Python literal (the request line, the category, the
socket(s), the fallbacks, the real command's path, all resolved at install time) and a call of
:func:`main` with them, on the code read from that file. It imports
only modules built into the interpreter (``_socket``, ``posix``, ``time``, ``_signal``, ``sys``)
and, to read the daemon's replies, ``_json`` and, in the token holder, ``select``: no ``os``,
``socket``, ``json`` or ``enum``, and no gridgate module on the path of a granted token.

It speaks docs/protocol.md over the daemon's Unix socket(s) as
:class:`~gridgate.plugins.lsf_proxy.client.gateclient.GateClient` does (a random rotation,
``notoken_ntries`` with jittered back-off, ``when_unavailable``), and hands its token to a
holder process as :mod:`.gating` does. Everything rarer goes to :func:`.gating.shim_main`, the
full gate (which imports gridgate): a config file changed since install, a call inside a gated
command (a ride on its token), a real command gone, daemons over TCP (signed requests); and the
messages of a refusal are worded by :mod:`gridgate.plugins.lsf_proxy.wire`.

No ``from __future__`` here: it is an import, run by every shim.
"""

import _socket
import posix
import sys
import time

TYPE_CHECKING = False  # typing costs more to import than a whole shim
if TYPE_CHECKING:
    import signal as _signal  # the same functions, as the type checker knows them
    from collections.abc import Callable

    Notice = Callable[[int | None], None]
else:
    import _signal  # the signal wrapper imports enum

TOKEN_ENV = b"GRIDGATE_GATE_TOKEN"
EXIT_NO_TOKEN = 75
EXIT_UNAVAILABLE = 69
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
NOTICE_AFTER = 1.0


def say(message: str) -> None:
    sys.stderr.write(f"gridgate gate: {message}\n")
    sys.stderr.flush()


def _env(name: bytes) -> str:
    return posix.environ.get(name, b"").decode("utf-8", "surrogateescape")


def _file_sig(path: str) -> list[int] | None:
    try:
        st = posix.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _absolute(path: str) -> str:
    return path if path.startswith("/") else posix.getcwd() + "/" + path


def _daemons(conf: dict) -> list[tuple[str, str]] | None:
    """(name, socket path) of each daemon to ask, as ``GateClient.from_section`` orders them
    (``--socket``, ``$GRIDGATE_PROXYD_SOCKET``, ``proxyd.hosts``, ``proxyd.socket``, the
    runtime directory); None when a daemon is reached over TCP (the full gate signs)."""
    given = conf["socket"] or _env(b"GRIDGATE_PROXYD_SOCKET")
    hosts = conf["hosts"]
    if given or not hosts:
        path = given or conf["default_socket"]
        if not path:
            runtime = _env(b"XDG_RUNTIME_DIR")
            if posix.geteuid() == 0 or not runtime:
                path = "/run/gridgate/proxyd.sock"
            else:
                path = runtime + "/gridgate/proxyd.sock"
        return [(posix.uname().nodename.split(".")[0], _absolute(path))]
    if any(not address.startswith(("/", ".")) for _, address in hosts):
        return None
    return [(name, address) for name, address in hosts]


def _category(conf: dict, args: list[str]) -> str:
    """``scontrol show ...`` is a query: the first word that is not an option may decide."""
    words = conf["words"]
    if words:
        first = next((a for a in args if not a.startswith("-")), "")
        if first in words:
            return str(words[first])
    return str(conf["category"])


def _start_only(flags: list[str] | None, args: list[str]) -> bool:
    if flags is None:
        return False
    if not flags:
        return True
    for arg in args:
        for flag in flags:
            if (
                arg == flag
                or (flag.startswith("--") and arg.startswith(flag + "="))
                or (len(flag) == 2 and arg.startswith(flag) and arg[2:].isdigit())
            ):
                return True
    return False


def _rand() -> float:
    return int.from_bytes(posix.urandom(4), "big") / 2**32


class Busy(Exception):
    """The daemon is there but full, or slow to answer: try the next, never run untokened."""


class Down(Exception):
    """The daemon did not answer: try the next one."""


class Refused(Exception):
    """Daemon ``name`` answered with an error: not run."""

    def __init__(self, name: str, reply: dict) -> None:
        self.name, self.reply = name, reply
        super().__init__(name)


def _value(text: str, i: int) -> tuple[object, int]:
    """The JSON value at ``text[i]`` and where it ends: a small reader for the daemon's compact
    lines, whose strings have no escape (:func:`loads` leaves any other line to ``_json``).

    :raises ValueError, IndexError: not such a value.
    """
    c = text[i]
    if c == '"':
        end = text.index('"', i + 1)
        return text[i + 1 : end], end + 1
    if c == "{" or c == "[":
        close = "}" if c == "{" else "]"
        items: list[object] = []
        i += 1
        if text[i] == close:
            return ({} if c == "{" else []), i + 1
        while True:
            if c == "{":
                key, i = _value(text, i)
                if not isinstance(key, str) or text[i] != ":":
                    raise ValueError(text[i : i + 20])
                i += 1
                items.append(key)
            value, i = _value(text, i)
            items.append(value)
            if text[i] == close:
                break
            if text[i] != ",":
                raise ValueError(text[i : i + 20])
            i += 1
        if c == "[":
            return items, i + 1
        return dict(zip(items[::2], items[1::2], strict=True)), i + 1
    for word, value in (("true", True), ("false", False), ("null", None)):
        if text.startswith(word, i):
            return value, i + len(word)
    end = i
    while end < len(text) and text[end] in "+-0123456789.eE":
        end += 1
    number = text[i:end]
    if "." in number or "e" in number or "E" in number:
        return float(number), end
    return int(number), end


def loads(line: bytes) -> dict:
    """One reply line as a JSON object: :func:`_value`, else ``_json`` (escapes, spaces, or
    anything the small reader does not take), which has the last word.

    :raises ValueError: not one JSON object.
    """
    text = line.decode("utf-8").strip()
    if "\\" not in text:
        try:
            value, end = _value(text, 0)
            if end == len(text) and isinstance(value, dict):
                return value
        except (ValueError, IndexError):
            pass  # _json says what is wrong
    try:
        value, end = _scanner()(text, 0)
    except (StopIteration, RecursionError, SystemError):
        # SystemError: _json's scanner alone, on some errors (a trailing comma), fails to
        # raise the error json.decoder would give
        raise ValueError(f"not JSON: {text[:60]!r}") from None
    if end != len(text) or not isinstance(value, dict):
        raise ValueError(f"not one JSON object: {text[:60]!r}")
    return value


def _scanner() -> "Callable[[str, int], tuple[object, int]]":
    import _json

    class Context:  # what _json.make_scanner reads of a decoder: json.loads' defaults
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = float

    return _json.make_scanner(Context)  # type: ignore[arg-type]  # a decoder's attributes


class Link:
    """One connection to one daemon, as ``gateclient.Link`` over a Unix socket."""

    def __init__(self, name: str, address: str, timeout: float) -> None:
        self.name, self.address = name, address
        self.buffer = b""
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(address)
        except OSError as exc:
            self.sock.close()
            text = f"{name}: cannot connect to {address}: {exc}"
            busy = isinstance(exc, TimeoutError) or exc.errno == 11  # EAGAIN: backlog full
            raise (Busy if busy else Down)(text) from None

    def send(self, line: bytes) -> None:
        try:
            self.sock.sendall(line)
        except OSError as exc:
            self.close()
            raise Down(f"{self.name}: {exc}") from None

    def wait(
        self, msg_id: int, timeout: float, notice: float | None, on_notice: "Notice | None" = None
    ) -> dict:
        """The reply to ``msg_id``; ``on_notice(ahead)`` once after ``notice`` seconds."""
        deadline = time.monotonic() + timeout
        notice_at = None if notice is None else time.monotonic() + notice
        ahead = None
        while True:
            end = self.buffer.find(b"\n")
            if end < 0:
                now = time.monotonic()
                if now >= deadline:
                    self.close()
                    raise Busy(f"{self.name}: no reply within {timeout:.0f} s")
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
                    raise Down(f"{self.name}: {exc}") from None
                if not chunk:
                    self.close()
                    raise Down(f"{self.name}: the daemon closed the connection")
                self.buffer += chunk
                continue
            line, self.buffer = self.buffer[:end], self.buffer[end + 1 :]
            try:
                reply = loads(line)
            except ValueError as exc:
                self.close()
                raise Down(f"{self.name}: not a JSON line: {exc}") from None
            if reply.get("id") == msg_id:
                return reply
            if reply.get("event") == "queued" and reply.get("request") == msg_id:
                ahead = reply.get("ahead") if isinstance(reply.get("ahead"), int) else None
            elif reply.get("id") is None and reply.get("ok") is False:
                error = reply.get("error")
                if isinstance(error, dict) and error.get("code") in ("busy", "auth_timeout"):
                    self.close()
                    raise Busy(f"{self.name}: busy: {error.get('message') or ''}")
                raise Refused(self.name, reply)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass  # the descriptor is gone either way


class Holder:
    """``gating._Holder``: the token's connection goes to a holder process, forked while the
    daemon decides, that gives the token back when this process (about to become the command)
    ends, or after ``hold`` seconds. A grandchild in a session of its own, stdio on /dev/null;
    it waits on a pidfd of the gate, opened before the fork. The pipe closed empty (refused,
    another daemon tried, the gate exited) tells it to go."""

    def __init__(self, hold: float | None, timeout: float) -> None:
        self.hold, self.timeout = hold, timeout
        self.link: Link | None = None
        self.pipe = -1

    def start(self, link: Link) -> None:
        if self.link is not None:
            self.abandon()
        self.link = link
        read_end, self.pipe = posix.pipe()
        self._fork(link, read_end)
        posix.close(read_end)

    def abandon(self) -> None:
        if self.pipe >= 0:
            posix.close(self.pipe)
            self.pipe = -1
        self.link = None

    def take(self, link: Link, token: str) -> None:
        if link is not self.link:
            self.start(link)
        posix.write(self.pipe, token.encode())
        link.close()  # the holder's copy keeps the connection, and the token, alive
        # the pipe closes at exec: the holder reads the token, then end of file

    def _fork(self, link: Link, read_end: int) -> None:
        try:
            watch = posix.pidfd_open(posix.getpid())
        except (AttributeError, OSError):  # Linux before 5.3: poll the pid instead
            watch = -1
        me = posix.getpid()
        pid = posix.fork()
        if pid == 0:  # pragma: no cover - runs in the holder, which only exits
            try:
                posix.setsid()
                if posix.fork() == 0:
                    posix.close(self.pipe)  # else the pipe would never end
                    null = posix.open("/dev/null", posix.O_RDWR)
                    for fd in (0, 1, 2):
                        posix.dup2(null, fd)
                    word = b""
                    while chunk := posix.read(read_end, 4096):
                        word += chunk
                    if word:
                        self._hold(link, word.decode(), watch, me)
            finally:
                posix._exit(0)
        FORKED.append(pid)  # reaped before exec, by when it is long done: not waited for here
        if watch >= 0:
            posix.close(watch)

    def _hold(self, link: Link, token: str, watch: int, pid: int) -> None:
        import select

        deadline = None if self.hold is None else time.monotonic() + self.hold
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if watch >= 0:
                poller = select.poll()
                poller.register(watch, select.POLLIN)
                if poller.poll(None if left is None else int(left * 1000) + 1):
                    break  # the command ended
            else:
                try:
                    posix.kill(pid, 0)
                except ProcessLookupError:
                    break
                select.select([], [], [], 0.2 if left is None else min(0.2, left))
            if deadline is not None and time.monotonic() >= deadline:
                break  # a start-only command: its start is over
        import _json

        quoted = _json.encode_basestring_ascii(token)
        try:
            link.send(f'{{"v":1,"id":2,"op":"release","token":{quoted}}}\n'.encode())
            link.wait(2, self.timeout, None)
        except (Busy, Down, Refused):
            pass  # unanswered: the daemon takes the token back when the connection closes
        link.close()


def _lower(pid: int, nice: int) -> None:
    """``pid`` (0: this process) at niceness ``nice``, never raised (``gating._lower_priority``)."""
    try:
        if posix.getpriority(posix.PRIO_PROCESS, pid) < nice:
            posix.setpriority(posix.PRIO_PROCESS, pid, nice)
    except OSError:
        pass  # a command that cannot be niced still runs


def _full(conf: dict) -> int:
    """The full gate (imports gridgate), for everything the lean path leaves to it."""
    gridgate = sys.modules["gridgate"] = type(sys)("gridgate")
    gridgate.__path__ = conf["roots"]
    from gridgate.plugins.lsf_proxy.gate.gating import shim_main

    return shim_main(
        conf["name"],
        conf["real"],
        conf["shim_dir"],
        config=conf["config"],
        socket=conf["socket"] or None,
        snap=conf["snap"],
    )


def _wire(roots: list[str]):  # noqa: ANN202  # the module, typed where it lives
    """gridgate's wording of a refusal (a refused call is not the one to make cheap)."""
    if "gridgate" not in sys.modules:
        gridgate = sys.modules["gridgate"] = type(sys)("gridgate")
        gridgate.__path__ = roots
    from gridgate.plugins.lsf_proxy import wire

    return wire


#: The holders' first forks (each exits at once, leaving its child in a session of its own).
FORKED: list[int] = []


def _exec(conf: dict, argv: list[str], token: str, category: str) -> int:
    """Become the command (same pid: its exit status and signals are its own)."""
    while FORKED:  # the command must not inherit a child of ours
        posix.waitpid(FORKED.pop(), 0)
    env = dict(posix.environ)
    env.pop(TOKEN_ENV, None)
    if token and category != "submission" and not conf["submits"]:
        env[TOKEN_ENV] = token.encode()
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):  # Python ignores them; commands must not
        _signal.signal(sig, _signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        posix.execve(argv[0], argv, env)
    except FileNotFoundError:
        say(f"{conf['name']}: command not found")
        return EXIT_NOT_FOUND
    except OSError as exc:
        say(f"{conf['name']}: cannot execute: {exc.strerror or exc}")
        return EXIT_CANNOT_EXECUTE
    return EXIT_CANNOT_EXECUTE  # pragma: no cover - execve returns only by raising


def _ask(
    conf: dict,
    order: list[tuple[str, str]],
    request: bytes,
    holder: Holder,
    notice: float | None,
    on_notice: "Notice",
    down: set[str],
) -> tuple[dict | None, Link | None, str]:
    """One attempt, as ``GateClient._acquire_once``: the reply, its link, the daemon's name."""
    busy = ""
    for i, (name, address) in enumerate(order):
        after = "; trying the next" if i + 1 < len(order) else ""
        link = None
        try:
            link = Link(name, address, conf["connect_timeout"])
            link.send(request)
            if holder.link is None:
                holder.start(link)  # forked while the daemon decides
            try:
                reply = link.wait(1, conf["reply_timeout"], notice, on_notice)
            except Refused:
                link.close()
                raise
        except (Busy, Down) as exc:
            if link is not None and holder.link is link:
                holder.abandon()
            if isinstance(exc, Down):
                say(f"warning: lsfproxyd {name} did not answer: {exc}{after}")
                down.add(address)
                continue
            say(f"warning: lsfproxyd {name} is overloaded: {exc}{after}")
            busy = busy or name
            continue
        down.discard(address)
        if not reply.get("ok"):
            link.close()
            raise Refused(name, reply)
        return reply, link, name
    if busy:
        return {"ok": True, "result": "denied", "reason": "busy"}, None, busy
    return None, None, ""


def main(conf: dict) -> int:
    """What a shim runs: the real command through the gate, argv from ``sys.argv``."""
    name, real = conf["name"], conf["real"]
    args = sys.argv[1:]
    daemons = _daemons(conf)
    if (
        daemons is None
        or not real
        or not posix.access(real, posix.X_OK)
        or (conf["config"] and _file_sig(conf["config"]) != conf["snap"]["sig"])
        or (posix.environ.get(TOKEN_ENV) and not conf["submits"])
    ):
        return _full(conf)
    category = _category(conf, args)
    argv = [real, *args]
    size = sum(len(a.encode("utf-8", "surrogateescape")) + 1 for a in argv)
    request = conf["request"][category].encode() + str(size).encode() + b"}\n"
    quiet = bool(_env(b"GRIDGATE_GATE_QUIET"))
    holder = Holder(
        conf["start_hold"] if _start_only(conf["start_only"], args) else None,
        conf["connect_timeout"],
    )

    def waiting(ahead: int | None) -> None:
        say(
            f"{name}: waiting for a {category} token"
            + (f", {ahead} ahead" if ahead is not None else "")
        )

    notice = None if quiet else NOTICE_AFTER
    down: set[str] = set()
    tries = 0
    try:
        while True:
            start = int(_rand() * len(daemons))
            order = sorted(daemons[start:] + daemons[:start], key=lambda d: d[1] in down)
            reply, link, by = _ask(conf, order, request, holder, notice, waiting, down)
            if reply is None:
                holder.abandon()
                message = f"no lsfproxyd answered ({', '.join(n for n, _ in daemons)})"
                if conf["when_unavailable"] == "fail":
                    say(f"{name}: not run: {message} (when_unavailable: fail)")
                    return EXIT_UNAVAILABLE
                say(f"warning: {message}: proceeding without a token")
                return _exec(conf, argv, "", category)
            result, said = reply.get("result"), reply.get("reason")
            if result == "granted" and link is not None:
                holder.take(link, str(reply.get("token") or ""))
                nice = reply.get("nice")
                if isinstance(nice, int) and 0 < nice < 20:
                    _lower(0, nice)
                    if conf["nice_caller"] and posix.geteuid() != 0 and posix.getppid() > 1:
                        _lower(posix.getppid(), nice)  # gating.lower_caller: next calls niced
                return _exec(conf, argv, str(reply.get("token") or ""), category)
            if link is not None:
                link.close()
            holder.abandon()
            if result == "proceed":
                return _exec(conf, argv, "", category)
            reason = "denied" if said is None else str(said)
            tries += 1
            if reason == "blocked":
                why = _wire(conf["roots"]).blocked_message(by, reply)
                say(f"{name}: no {category} token, not run: {why}")
                return EXIT_NO_TOKEN
            if conf["notoken_ntries"] is not None and tries >= conf["notoken_ntries"]:
                why = f"no token after {tries} attempt(s), last: {reason} from {by}"
                say(f"{name}: no {category} token, not run: {why}")
                return EXIT_NO_TOKEN
            delay = min(5.0, 0.1 * 2 ** min(tries - 1, 16))
            time.sleep(delay * (0.5 + _rand() / 2))
            notice = None  # said once is enough
    except KeyboardInterrupt:
        say(f"{name}: interrupted while waiting for a {category} token")
        return 128 + _signal.SIGINT
    except Refused as exc:
        _code, message = _wire(conf["roots"]).reply_error(exc.reply)
        say(f"{name}: not run: {exc.name}: {message}")
        return EXIT_NO_TOKEN
