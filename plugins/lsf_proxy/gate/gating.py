"""What a gated command runs: take a token, run the command, give the token back.

The run-time half of ``gridgate gate`` (:mod:`gridgate.plugins.lsf_proxy.gate.gate` holds the
click command and ``--install-shims``). It runs in front of every gated ``bjobs`` a user
types, so start-up time is the gate's cost: this module and :mod:`..client.gateclient` import only
the standard library (and the plugin's two light modules: the table of commands and the wire
vocabulary). A shim (:mod:`.shim`) runs it, under ``python -I -S`` with the package located
by the shim itself, only for what the shim's own lean path leaves to it (a ride, a changed
config, daemons over TCP, a real command gone); ``gridgate gate -- CMD`` reaches it through :func:`console_main` (the ``gridgate``
launcher's fast path) without click, loguru or plugin loading. The config file is still
honoured: the resolved ``proxyd:`` settings are kept (in the shim, or in a per-user cache)
together with the file's identity, and read again with the full config loader whenever the
file changed.

The gate becomes its command (``execve``, never through a shell): same pid, stdin, stdout and
stderr, so the exit status and every signal sent to the gate are the command's own, and a gate
killed even with SIGKILL is a command killed. The token's connection is left to a small holder
process that gives the token back when the command ends (the daemon also takes it back if the
holder dies). A command run through the gate gets ``GRIDGATE_GATE_TOKEN``; a gate started
inside it shows that token to the daemon, which says whether it is live and this user's, and
runs at once only if so. Submission commands never get the token: they would export it into
the jobs they create.
"""

from __future__ import annotations

import os
import sys

# the one table of batch commands (categories, the submission commands): it imports only os
from gridgate.plugins.lsf_proxy.commands import (
    CATEGORIES,
    SUBMITTING,
    by_first_word,
    category_map,
    request_size,
)

TYPE_CHECKING = False  # typing costs more to import than this whole module
if TYPE_CHECKING:  # the same functions, as the type checker knows them
    import signal
else:
    try:  # the C module: the signal wrapper imports enum, which costs more than this module
        import _signal as signal
    except ImportError:  # pragma: no cover
        import signal
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

#: Exit codes of the gate itself (the command's own code is passed through otherwise).
EXIT_NO_TOKEN = 75  # EX_TEMPFAIL: refused a token; the command did not run
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: no daemon answered and when_unavailable is fail
EXIT_CONFIG = 2  # as gridgate.core.cli.EXIT_CONFIG: the config (or a secret it names) is unusable
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
TOKEN_ENV = "GRIDGATE_GATE_TOKEN"
#: Set (non-empty) to silence the "waiting for a token" line, as ``gridgate gate -q`` does.
QUIET_ENV = "GRIDGATE_GATE_QUIET"
#: Seconds a waiting call stays silent before saying what it waits for.
NOTICE_AFTER = 1.0

#: Commands never held whole: they take a token to start, not to run (interactive sessions,
#: commands that repeat or follow by themselves). Name -> the arguments that make it so
#: (empty: always). ``proxyd.start_only`` adds to or replaces entries.
START_ONLY: dict[str, tuple[str, ...]] = {
    "srun": (),
    "salloc": (),
    "sattach": (),
    "squeue": ("-i", "--iterate"),
    "sinfo": ("-i", "--iterate"),
    "sprio": ("-i",),
    "bsub": ("-I", "-Ip", "-Is", "-IS", "-ISp", "-ISs", "-IX", "-K"),
    "bpeek": ("-f",),
}
#: What the run-time path reads of a ``proxyd:`` section, with the schema's defaults (a test
#: pins them to config.SECTION_SCHEMA). Written out here rather than read from the schema
#: through gridgate.core.settings: that imports jsonschema, which would cost every gated call
#: more than the gate itself. :func:`client_section` is the one reader: it resolves every key,
#: and the run-time path reads the resolved section (``section["key"]``), never a default.
CLIENT_DEFAULTS: dict[str, Any] = {
    "socket": "",
    "hosts": [],
    "key": None,
    "notoken_ntries": None,
    "when_unavailable": "proceed",
    "client_timeout": 5,
    "token_wait_time": 15,
    "categories": {},
    "start_hold": 2,
    "start_only": {},
    "nice_caller": False,
}


def client_section(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the gate reads of ``given`` (a ``proxyd:`` section, or the settings already
    resolved), every key of :data:`CLIENT_DEFAULTS` there: the gate's one settings reader."""
    given = given or {}
    return {key: given.get(key, default) for key, default in CLIENT_DEFAULTS.items()}


def say(message: str) -> None:
    sys.stderr.write(f"gridgate gate: {message}\n")
    sys.stderr.flush()


# --- commands and categories -----------------------------------------------------------------


def which(name: str, path: str | None = None) -> str | None:
    """``name`` on ``path`` (default $PATH): an executable file, as ``shutil.which`` finds it."""
    search = os.environ.get("PATH", os.defpath) if path is None else path
    for folder in search.split(os.pathsep):
        if not folder:
            continue
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def find_real(
    name: str, exclude: str | os.PathLike[str] | None = None, path: str | None = None
) -> str | None:
    """``name`` on PATH, skipping the directory ``exclude`` (the shims' own)."""
    search = os.environ.get("PATH", os.defpath) if path is None else path
    dirs = [d for d in search.split(os.pathsep) if d]
    if exclude is not None:
        dirs = [d for d in dirs if not _same_dir(d, str(exclude))]
    return which(name, os.pathsep.join(dirs)) if dirs else None


def gate_category_map(section: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Command -> category: the table of batch commands, then the config's own."""
    return category_map((section or {}).get("categories"))


def infer_category(
    command: str, section: Mapping[str, Any] | None = None, args: Sequence[str] = ()
) -> str:
    """The category of ``command`` (a name or a path) run with ``args``: submission, query or
    other. The config's ``categories`` win over everything, the arguments over the name."""
    return category_of(os.path.basename(command), args, gate_category_map(section), section)


def category_of(
    name: str,
    args: Sequence[str],
    mapping: Mapping[str, str],
    section: Mapping[str, Any] | None = None,
) -> str:
    """:func:`infer_category` with the map already made (``mapping``)."""
    own = {n for names in ((section or {}).get("categories") or {}).values() for n in names}
    row = by_first_word(name, args) if name not in own else None
    if row is not None:
        return row.category
    return mapping.get(name, "other")


def submits(name: str) -> bool:
    """Whether ``name`` (a name or a path) is a built-in submission command: one that copies
    the environment into the jobs it creates. Decided by the command, never by a category
    chosen (``--category``, ``proxyd.categories``)."""
    return os.path.basename(name) in SUBMITTING


def carries_token(command: str, category: str) -> bool:
    """Whether ``command`` may be given ``GRIDGATE_GATE_TOKEN``: never a submission command
    (by its name, whatever category it was gated in) nor anything gated as one. Its jobs
    would inherit the token, and their gated calls must take tokens of their own."""
    return category != "submission" and not submits(command)


def _flag_given(args: Sequence[str], flags: Sequence[str]) -> bool:
    for arg in args:
        for flag in flags:
            if (
                arg == flag
                or (flag.startswith("--") and arg.startswith(flag + "="))
                or (len(flag) == 2 and arg.startswith(flag) and arg[2:].isdigit())
            ):
                return True
    return False


def start_only(name: str, args: Sequence[str], section: Mapping[str, Any] | None = None) -> bool:
    """Whether ``name args`` takes a token only to start (:data:`START_ONLY`)."""
    table = {
        **START_ONLY,
        **{k: tuple(v) for k, v in ((section or {}).get("start_only") or {}).items()},
    }
    flags = table.get(name)
    if flags is None:
        return False
    return not flags or _flag_given(args, flags)


# --- the resolved settings: snapshot, per-user cache, or the full config loader --------------


def _file_sig(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _code_sig() -> list[Any]:
    """The files a cached entry comes from: this one, the table of commands (the map) and the
    section's schema (its defaults and rules)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        _file_sig(os.path.join(here, f))
        for f in ("gating.py", os.path.join("..", "commands.py"), os.path.join("..", "config.py"))
    ]


def _cache_path() -> str | None:
    """``$XDG_CACHE_HOME/gridgate/gate.json`` (or ``~/.cache/...``); None for root when that
    is outside root's own home: root's gate run with another user's ``HOME`` (``sudo``
    without ``-H``) would otherwise write where that user points it."""
    base = os.environ.get("XDG_CACHE_HOME") or (
        os.path.join(os.environ["HOME"], ".cache") if os.environ.get("HOME") else ""
    )
    if not base.startswith("/"):
        return None
    if os.geteuid() == 0:
        import pwd

        try:
            home = os.path.normpath(pwd.getpwuid(0).pw_dir)
        except KeyError:
            return None
        norm = os.path.normpath(base)
        if home == "/" or not (norm == home or norm.startswith(home + "/")):
            return None
    return os.path.join(base, "gridgate", "gate.json")


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _open_folder(folder: str, create: bool) -> int:
    """A descriptor of ``folder``, reached from ``/`` one name at a time without following
    a link: every folder on the way belongs to root or to this user and only its owner may
    write it (or it is sticky, as /tmp), and ``folder`` itself is this user's alone. Missing
    ones are made 0700 when ``create``. Raises OSError otherwise: a link anywhere on the way,
    or a folder another user may change, would let that user choose where the cache goes."""
    names = [n for n in os.path.normpath(folder).split("/") if n]
    me = os.geteuid()
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open("/", flags)
    try:
        for name in names:
            st = os.fstat(fd)
            if st.st_uid not in (0, me) or (st.st_mode & 0o022 and not st.st_mode & 0o1000):
                raise PermissionError(f"{folder}: a folder on the way is not safe")
            try:
                nxt = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o700, dir_fd=fd)
                nxt = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
        if not _trusted(os.fstat(fd)):
            raise PermissionError(f"{folder}: not this user's alone")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _cache_read(path: str) -> dict[str, Any]:
    try:
        folder = _open_folder(os.path.dirname(path), create=False)
    except OSError:
        return {}
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
    except OSError:
        return {}
    finally:
        os.close(folder)
    try:
        if not _trusted(os.fstat(fd)):
            return {}
        from gridgate.plugins.lsf_proxy.client.gateclient import loads

        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        data = loads(b"".join(chunks))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)


def _cache_write(path: str, data: dict[str, Any]) -> None:
    """Best effort: a user without a writable home simply reads the config every time."""
    import json

    name = os.path.basename(path)
    temp = f"{name}.{os.getpid()}"
    try:
        folder = _open_folder(os.path.dirname(path), create=True)
    except OSError:
        return
    try:
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder
        )
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError:
        try:
            os.unlink(temp, dir_fd=folder)
        except OSError:
            pass  # not created, or not ours to remove: the cache is best effort
    finally:
        os.close(folder)


def _full_loader() -> Any:
    """The config loader (pyyaml, jsonschema...): site-packages first when started with -S."""
    if sys.flags.no_site:
        import site

        site.main()
    from gridgate.core.cli import load_config_or_exit

    return load_config_or_exit


def _load(config_path: str | None) -> dict[str, Any]:
    """Settings and category map read the slow way; exits 2 on a bad config."""
    if config_path:
        config = _full_loader()(config_path)
        section = dict(config.get("proxyd") or {})
    else:
        section = {}
    return {"section": client_section(section), "map": gate_category_map(section)}


def resolve(config_path: str | None) -> dict[str, Any]:
    """``{"section": ..., "map": ...}`` for ``config_path`` (None: the defaults), from the
    per-user cache when the file and this code are unchanged, else loaded and cached."""
    path = os.path.abspath(config_path) if config_path else ""
    sig = _file_sig(path) if path else None
    cache = _cache_path()
    data = _cache_read(cache) if cache else {}
    code = _code_sig()
    entries = data.get("entries") if data.get("code") == code else None
    entry = (entries or {}).get(path)
    if isinstance(entry, dict) and (sig is not None or not path) and entry.get("sig") == sig:
        return entry
    loaded = _load(config_path)
    if cache:
        kept = {k: v for k, v in (entries or {}).items() if k != path}
        kept = dict(list(kept.items())[-7:])
        kept[path] = {"sig": sig, **loaded}
        _cache_write(cache, {"code": code, "entries": kept})
    return loaded


def snapshot(name: str, config_path: str | None) -> dict[str, Any]:
    """What a shim for ``name`` keeps of its config: the settings, its category, the file's
    identity (a changed file is read again at run time)."""
    path = os.path.abspath(config_path) if config_path else ""
    loaded = _load(path or None)
    return {
        "sig": _file_sig(path) if path else None,
        "section": loaded["section"],
        "category": loaded["map"].get(name, "other"),
    }


# --- running the command ---------------------------------------------------------------------


def run_gated(
    argv: Sequence[str],
    category: str,
    opcode: str,
    section: Mapping[str, Any],
    socket_path: str | None = None,
    quiet: bool = False,
) -> int:
    """Take a token, run ``argv``, give the token back; return the exit status to use.

    A command killed by a signal makes this return ``-signal`` (the caller re-raises it).
    """
    from gridgate.plugins.lsf_proxy.client.gateclient import GateClient
    from gridgate.plugins.lsf_proxy.wire import NoToken, ProxyUnavailable, RequestFailed

    program = argv[0]
    if os.sep not in program:
        found = which(program)
        if found is None:
            say(f"{program}: command not found")
            return EXIT_NOT_FOUND
        program = found
    if not os.path.exists(program):
        say(f"{argv[0]}: command not found")
        return EXIT_NOT_FOUND
    if os.path.isdir(program):
        say(f"{argv[0]}: is a directory")
        return EXIT_CANNOT_EXECUTE
    name = os.path.basename(argv[0])
    section = client_section(section)  # a caller's own section may leave keys out
    quiet = quiet or bool(os.environ.get(QUIET_ENV))
    command = [program, *argv[1:]]
    try:
        client = GateClient.from_section(section, socket_path, warn=lambda m: say(f"warning: {m}"))
    except Exception as exc:  # SecretError: the key named in the config cannot be read
        say(str(exc))
        return EXIT_CONFIG

    def waiting(ahead: int | None) -> None:
        say(
            f"{name}: waiting for a {category} token"
            + (f", {ahead} ahead" if ahead is not None else "")
        )

    hold = None
    if start_only(name, argv[1:], section):
        hold = float(section["start_hold"])
    holder = _Holder(hold)
    held = os.environ.get(TOKEN_ENV)
    try:
        if held and not submits(program):
            # inside a gated command: ride on its token (same category, one nested call at
            # a time; a blocked user is told NoToken), else take one of our own; a
            # submission command never rides, whatever category it was given
            ride, _why = client.ride(
                held, category, opcode or name, float(section["token_wait_time"])
            )
            if ride is not None:
                holder.take(ride)
                return _exec(command, None, name, category)
        grant = client.acquire(
            category,
            opcode or name,
            None if quiet else NOTICE_AFTER,
            waiting,
            holder.start,
            size=request_size(argv),
        )
    except KeyboardInterrupt:
        say(f"{name}: interrupted while waiting for a {category} token")
        return 128 + signal.SIGINT
    except NoToken as exc:
        say(f"{name}: no {category} token, not run: {exc}")
        return EXIT_NO_TOKEN
    except ProxyUnavailable as exc:
        say(f"{name}: not run: {exc} (when_unavailable: fail)")
        return EXIT_UNAVAILABLE
    except RequestFailed as exc:
        say(f"{name}: not run: {exc}")
        return EXIT_NO_TOKEN
    if grant.link is not None:
        holder.take(grant)  # forked before the grant: the holder keeps its priority
    if grant.nice:
        _lower_priority(grant.nice)
        if section["nice_caller"]:
            lower_caller(grant.nice)
    return _exec(command, grant.token or None, name, category)


def _lower_priority(nice: int, pid: int = 0) -> None:
    """Run ``pid`` (0: this process) at niceness ``nice`` or lower priority: a busy user's
    command (the daemon said so) yields the CPU of this host to others' but still takes what
    is idle. Never raises it."""
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) < nice:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        pass  # a command that cannot be niced still runs: the token is what bounds it


def lower_caller(nice: int) -> None:
    """``nice_caller``: the process that ran this gated command (a busy user's loop) at
    ``nice`` too, so that its next calls start niced, the shim's interpreter included. Not as
    root (whose parent may be anyone's), not init; the kernel lets a user lower only the
    priority of their own processes, so another user's parent (sudo, a setuid launcher)
    keeps its own."""
    parent = os.getppid()
    if os.geteuid() != 0 and parent > 1:
        _lower_priority(nice, parent)


class _Holder:
    """Leaves the token (its connection) to a holder process that gives it back when this
    process (about to become the command) ends, or after ``hold`` seconds.

    The holder is forked while the daemon decides (:meth:`start`, right after the request is
    sent), so that a granted token is not kept waiting for process creation: on a grant the
    gate writes the token id into a pipe and execs. It is a grandchild in a session of its
    own: never the command's child (no stray SIGCHLD, no zombie), out of reach of the
    terminal's ^C and hang-up. It waits on a pidfd of the gate's process, opened before the
    fork, so a recycled pid cannot fool it. The pipe closed empty (refused, retried on another
    connection, the gate exited) tells it to close its copy of the connection and exit.
    """

    def __init__(self, hold: float | None) -> None:
        self.hold = hold
        self.link: Any = None
        self._pipe = -1

    def start(self, link: Any) -> None:
        if self.link is not None:
            return  # one per gate: a later attempt's grant is handed over by take()
        read_end, self._pipe = os.pipe()
        self.link = link
        link.on_close = self.abandon
        _fork_holder(link, read_end, self._pipe, self.hold)
        os.close(read_end)

    def abandon(self) -> None:
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1

    def take(self, grant: Any) -> None:
        """The token is granted: hand it to the holder (forked now if its link is another)."""
        if grant.link is not self.link:
            self.abandon()
            self.link = None
            read_end, self._pipe = os.pipe()
            _fork_holder(grant.link, read_end, self._pipe, self.hold)
            os.close(read_end)
        os.write(self._pipe, grant.token.encode())
        grant.link.on_close = None
        grant.link.close()  # the holder's copy keeps the connection, and the token, alive
        # the pipe closes at exec: the holder reads the token, then end of file


def _fork_holder(link: Any, read_end: int, write_end: int, hold: float | None) -> None:
    try:
        watch = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):  # Linux before 5.3: poll the pid instead
        watch = -1
    me = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the holder, which only exits
        try:
            os.setsid()
            if os.fork() == 0:
                os.close(write_end)  # else the pipe would never end
                link.on_close = None  # the gate's hook, not the holder's
                # the command's stdout may be a pipe someone reads to its end
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                word = b""
                while chunk := os.read(read_end, 4096):
                    word += chunk
                if word:
                    from gridgate.plugins.lsf_proxy.client.gateclient import Grant

                    _hold(Grant(word.decode(), link), watch, me, hold)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    if watch >= 0:
        os.close(watch)


def _hold(grant: Any, watch: int, pid: int, hold: float | None) -> None:
    import select

    deadline = None if hold is None else _monotonic() + hold
    while True:
        left = None if deadline is None else max(0.0, deadline - _monotonic())
        if watch >= 0:
            poller = select.poll()
            poller.register(watch, select.POLLIN)
            if poller.poll(None if left is None else int(left * 1000) + 1):
                break  # the command ended
        else:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            select.select([], [], [], 0.2 if left is None else min(0.2, left))
        if deadline is not None and _monotonic() >= deadline:
            break  # a start-only command: its start is over
    grant.release()


def _monotonic() -> float:
    import time

    return time.monotonic()


def _exec(argv: list[str], token: str | None, name: str, category: str) -> int:
    """Become the command: same pid, so its exit status and the signals sent to the gate are
    its own, and killing the gate (even with SIGKILL) kills the command. Returns only when
    the command cannot be executed."""
    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    if token and carries_token(argv[0], category):
        env[TOKEN_ENV] = token
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; commands must not
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(argv[0], argv, env)
    except FileNotFoundError:
        say(f"{name}: command not found")
        return EXIT_NOT_FOUND
    except OSError as exc:
        say(f"{name}: cannot execute: {exc.strerror or exc}")
        return EXIT_CANNOT_EXECUTE
    finally:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_IGN)
    return EXIT_CANNOT_EXECUTE  # pragma: no cover - execve returns only by raising


def exit_like(status: int) -> int:
    """Exit the way the command did: re-raise its signal on ourselves, else return its code."""
    if status >= 0:
        return status
    signum = -status
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    except (OSError, ValueError):
        pass  # a signal that cannot be re-raised: exit as a shell would
    return 128 + signum


# --- entry points ----------------------------------------------------------------------------


def shim_main(
    name: str,
    real: str | None,
    shim_dir: str,
    config: str | None = None,
    socket: str | None = None,
    snap: Mapping[str, Any] | None = None,
) -> int:
    """What a shim runs: the real ``name`` (never a shim) through the gate, argv from sys.argv.

    ``snap`` is what :func:`snapshot` gave at install time; without one (or when the config
    file changed since) the settings are resolved as ``gridgate gate -c`` resolves them.
    """
    if not real or not os.access(real, os.X_OK) or _same_dir(os.path.dirname(real), shim_dir):
        real = find_real(name, shim_dir)
    if real is None:
        say(f"{name}: command not found (outside {shim_dir})")
        return EXIT_NOT_FOUND
    if snap is not None and snap.get("sig") == (_file_sig(config) if config else None):
        section, mapping = snap["section"], {name: snap["category"]}
    else:
        resolved = resolve(config)
        section, mapping = resolved["section"], resolved["map"]
    args = sys.argv[1:]
    status = run_gated(
        [real, *args], category_of(name, args, mapping, section), name, section, socket
    )
    return exit_like(status)


def gate_call(
    command: Sequence[str],
    category: str | None = None,
    opcode: str | None = None,
    socket_path: str | None = None,
    config_path: str | None = None,
    quiet: bool = False,
) -> int:
    """``gridgate gate [options] -- COMMAND...``: the exit status to leave with."""
    resolved = resolve(config_path)
    chosen = category or category_of(
        os.path.basename(command[0]), command[1:], resolved["map"], resolved["section"]
    )
    return exit_like(
        run_gated(list(command), chosen, opcode or "", resolved["section"], socket_path, quiet)
    )


_VALUED = {
    "--category": "category",
    "--opcode": "opcode",
    "--socket": "socket_path",
    "-c": "config_path",
    "--config": "config_path",
}


def console_main(args: Sequence[str]) -> int | None:
    """The ``gridgate`` launcher's fast path for ``gridgate gate ...`` (``args`` after
    ``gate``); None when the call is not a plain gated command (``--install-shims``,
    ``--help``, a usage error...): the full command line then handles it."""
    options: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        key, eq, value = arg.partition("=")
        if key in _VALUED and (eq or i + 1 < len(args)):
            if not eq:
                i += 1
                value = args[i]
            if not value:
                return None
            options[_VALUED[key]] = value
        elif arg in ("-q", "--quiet"):
            options["quiet"] = True
        else:
            return None
        i += 1
    command = list(args[i:])
    chosen = options.get("category")
    if not command or (chosen is not None and chosen not in CATEGORIES):
        return None
    return gate_call(command, **options)
