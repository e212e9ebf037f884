"""Run one external command (an argv list, never a shell) with a hard deadline and capped output.

Every grid and batch command gridgate issues goes through :func:`run`. The child is started in
its own session, so it and everything it forks share one process group; when the deadline
passes, the whole group gets SIGTERM, then SIGKILL after a short grace, and the caller gets back
what was printed up to that moment. Processes the command leaves behind in its group are killed
when it ends, so nothing outlives a call.

Both pipes (and stdin, when input is given) are serviced from the calling thread with
``poll(2)``; no reader threads, so hundreds of concurrent calls cost only file descriptors.
Calls from the main thread fork through one long-lived spawner thread, so a KeyboardInterrupt
can never land between the fork and the moment the child's pid is known.
The main child is not reaped until its group has been killed: the zombie pins the process-group
id, so the final ``killpg`` can never hit an unrelated group that reused the number.

Deadlines are real time: :func:`run` measures a command's deadline on the monotonic wall clock
(``time.monotonic()``), never on the injectable :class:`~gridgate.core.clock.Clock` of
``PluginContext.clock``, and so do :class:`gridgate.core.backend.Deadline` and
``Backend.deadline``. A child process runs in real time whatever a test's clock says: a
``FakeClock`` that never moves must neither hang a call (its deadline would never come) nor
skip one, and one that jumps must not kill a command early. Use the injected clock for what
gridgate decides by time (expiries, throttles, wait limits, job ages), and give a command the
``timeout`` of the hook call, in seconds.

Because each command leads its own session, a caller killed with SIGKILL would leave its
commands running. A long-lived caller (the director) arms :func:`orphan_guard`: a small watchdog
process that learns the group of every command in flight over a pipe and kills those groups
when the pipe reaches EOF, i.e. when the caller dies, however it dies. PR_SET_PDEATHSIG was not
enough: it fires when the forking *thread* ends (run() forks from short-lived threads) and it
reaches only the direct child, not what the command started in its group.
"""

from __future__ import annotations

import errno
import math
import os
import queue
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from loguru import logger

from gridgate.core.model import CommandResult

__all__ = ["run", "argv_chunks", "DEFAULT_MAX_OUTPUT", "ARGV_BYTES"]

DEFAULT_MAX_OUTPUT = 4 * 1024 * 1024
#: Seconds the readers may go on after the main child exited while something else in its
#: group still holds the pipes open (a background job); then the leftovers are killed.
DRAIN_AFTER_EXIT = 0.5

_CHUNK = 64 * 1024
# Without pidfd (non-Linux), exit of the child is noticed by polling at this period.
_EXIT_POLL = 0.05
# A SIGKILLed process is normally gone at once; this only bounds a process stuck in the kernel.
_REAP_TIMEOUT = 5.0
# Enough reads to empty a pipe buffer after the writers are dead, bounded in case a writer
# escaped the group (setsid) and keeps writing.
_FINAL_DRAIN_READS = 64


# The watchdog reads "+PGID" / "-PGID" lines; at EOF (its parent is gone) it SIGKILLs every
# group still listed. It ignores the signals a terminal or a service manager sends to a whole
# group or cgroup, so it outlives its parent by exactly the time needed to clean up.
_WATCHDOG = r"""
import os, signal
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(sig, signal.SIG_IGN)
groups, pending = set(), b""
while True:
    try:
        data = os.read(0, 65536)
    except InterruptedError:
        continue
    if not data:
        break
    pending += data
    *lines, pending = pending.split(b"\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class _OrphanGuard:
    """The watchdog of this process: started by the first arm, stopped by the last disarm."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.owner = 0

    def arm(self) -> None:
        with self.lock:
            if self.owner != os.getpid():  # a forked copy inherits no watchdog of its own
                self.proc, self.users, self.owner = None, 0, os.getpid()
            self.users += 1
            if self.proc is None:
                import sys

                try:
                    self.proc = subprocess.Popen(
                        [sys.executable, "-I", "-S", "-c", _WATCHDOG],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        close_fds=True,
                        start_new_session=True,
                    )
                except OSError as exc:
                    # A guard that cannot start must not stop the caller from working.
                    logger.warning(
                        "runner: orphan guard not started ({}): commands in flight "
                        "would outlive a killed director",
                        exc,
                    )

    def disarm(self) -> None:
        with self.lock:
            if self.owner != os.getpid() or self.users == 0:
                return
            self.users -= 1
            if self.users == 0 and self.proc is not None:
                proc, self.proc = self.proc, None
                assert proc.stdin is not None
                proc.stdin.close()  # EOF: the watchdog kills what is listed (nothing) and exits
                try:
                    proc.wait(timeout=_REAP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def tell(self, line: str) -> None:
        with self.lock:
            if self.proc is None or self.owner != os.getpid():
                return
            assert self.proc.stdin is not None
            try:
                os.write(self.proc.stdin.fileno(), line.encode() + b"\n")
            except OSError as exc:  # the watchdog was killed: commands are unguarded now
                logger.warning("runner: orphan guard lost ({}); commands may outlive us", exc)
                self.proc = None


_GUARD = _OrphanGuard()


class orphan_guard:  # noqa: N801 - used like a function: ``with orphan_guard(): ...``
    """While armed, commands started by :func:`run` in this process are killed (with their
    whole group) if this process dies without cleaning up, e.g. by SIGKILL.

    Use as a context manager around a long-running loop; arming nests. The guard costs one
    small process and one pipe write per command start and end.
    """

    def __enter__(self) -> orphan_guard:
        _GUARD.arm()
        return self

    def __exit__(self, *exc: object) -> None:
        _GUARD.disarm()


class _Stream:
    """One output pipe: bytes kept up to the cap, the rest read and dropped."""

    def __init__(self, pipe: IO[bytes], cap: int) -> None:
        self.pipe = pipe
        self.fd = pipe.fileno()
        self.cap = cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False
        self.open = True
        os.set_blocking(self.fd, False)

    def read_available(self, max_reads: int | None = None) -> None:
        """Read until the pipe would block, reaches EOF, or ``max_reads`` reads were done."""
        reads = 0
        while self.open and (max_reads is None or reads < max_reads):
            try:
                data = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError as exc:  # EIO and the like: treat the stream as ended
                logger.debug("runner: read error on fd {}: {}", self.fd, exc)
                self.open = False
                return
            reads += 1
            if not data:
                self.open = False
                return
            room = self.cap - self.kept
            if room > 0:
                piece = data[:room]
                self.chunks.append(piece)
                self.kept += len(piece)
            if len(data) > max(room, 0):
                self.truncated = True

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")


def _check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, (str, bytes, bytearray)):
        raise TypeError("run() takes an argv list, not a string: no shell is ever involved")
    items = tuple(os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv)
    if not items:
        raise ValueError("run() needs a non-empty argv")
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"argv items must be str, got {type(item).__name__}: {item!r}")
    return items


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as exc:  # a member changed uid (setuid binary): nothing more we can do
        logger.warning("runner: cannot signal process group {}: {}", pgid, exc)


def kill_process_group(pid: int, grace: float) -> bool:
    """SIGTERM the process group ``pid``, wait up to ``grace`` seconds for it to vanish, then
    SIGKILL what is left. Returns True when SIGKILL was needed.

    Meant for groups whose members are not unreaped children of the caller (a zombie child
    keeps its group alive, so the wait would always last the full grace); :func:`run` handles
    its own children itself.
    """
    _signal_group(pid, signal.SIGTERM)
    end = time.monotonic() + max(0.0, grace)
    while True:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        if time.monotonic() >= end:
            break
        time.sleep(0.02)
    _signal_group(pid, signal.SIGKILL)
    return True


def _live_members(pgid: int) -> bool | None:
    """Whether a non-zombie process is in group ``pgid``; None when /proc cannot tell."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        # comm may hold spaces and parentheses: fields start after the last ')'.
        fields = raw[raw.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _wait_group_gone(pgid: int, bound: float) -> None:
    """Return once no live process is left in ``pgid`` (SIGKILL was sent), or after ``bound``.

    SIGKILL is asynchronous: a killed grandchild may still be running its exit for a moment
    after ``killpg`` returns. Waiting here lets run() promise that nothing of the command is
    alive when it returns. Killed members become zombies of init, which some containers never
    reap, hence /proc is read for live members rather than probing the group with signal 0.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return  # the usual case: the group died with the child
    except PermissionError:
        pass
    end = time.monotonic() + bound
    pause = 0.001
    while True:
        live = _live_members(pgid)
        if live is False:
            return
        if live is None:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                pass
        if time.monotonic() >= end:
            logger.warning("runner: process group {} still has members after SIGKILL", pgid)
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class _Exit:
    """Notices the main child's exit without reaping it (the zombie pins the group id)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exited = False
        self.pidfd: int | None = None
        if hasattr(os, "pidfd_open"):
            try:
                self.pidfd = os.pidfd_open(pid)
            except OSError:
                self.pidfd = None

    def check(self) -> bool:
        if not self.exited:
            try:
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                self.exited = info is not None
            except ChildProcessError:
                # Reaped by someone else (a global os.wait elsewhere): it has exited.
                self.exited = True
        return self.exited

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


#: Bytes of argv (plus separators) one bulk command may carry. Linux allows far more
#: (``ARG_MAX`` is 2 MiB, a single word 128 KiB), but the environment shares that space and
#: the commands themselves (gLite's Python client, LSF) have choked on very long lines.
ARGV_BYTES = 100_000


def argv_chunks(
    prefix: Sequence[str],
    items: Sequence[str],
    *,
    limit: int = ARGV_BYTES,
    joiner: str | None = None,
) -> list[list[str]]:
    """Split one bulk command into as few argvs as fit ``limit`` bytes each.

    ``prefix`` is the command and its options; ``items`` are the job ids. Each id becomes its
    own argv word, or, with ``joiner`` (``","`` for ``squeue --jobs=1,2,3``), the ids are
    joined into the last word of the prefix (``prefix[-1] + "1,2,3"``). Every argv carries
    at least one id, so an id longer than ``limit`` still gets a command of its own.
    An empty ``items`` gives no command at all.
    """

    def size(words: Sequence[str]) -> int:
        return sum(len(w.encode()) + 1 for w in words)

    base = size(prefix)
    chunks: list[list[str]] = []
    current: list[str] = []
    used = base
    for item in items:
        cost = len(item.encode()) + 1
        if current and used + cost > limit:
            chunks.append(current)
            current, used = [], base
        current.append(item)
        used += cost
    if current:
        chunks.append(current)
    if joiner is None:
        return [[*prefix, *chunk] for chunk in chunks]
    return [[*prefix[:-1], prefix[-1] + joiner.join(chunk)] for chunk in chunks]


def run(
    argv: Sequence[str],
    timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: bytes | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
    kill_grace: float = 2.0,
) -> CommandResult:
    """Run ``argv`` with a hard deadline of ``timeout`` seconds and return what happened.

    Never raises for the command's own failures: a program that is missing or cannot be
    executed gives a result with ``launch_error``; a deadline that passes gives
    ``timed_out=True`` and ``returncode=None`` with the output printed so far. Each of stdout
    and stderr keeps at most ``max_output`` bytes (the rest is read and dropped, and
    ``*_truncated`` is set). At the deadline the child's process group gets SIGTERM, then
    SIGKILL ``kill_grace`` seconds later. When the child exits while something it started
    still holds the pipes, reading goes on for :data:`DRAIN_AFTER_EXIT` seconds at most, then
    the group's leftovers are killed.

    :param argv: the program and its arguments, each one list item; no shell is involved, so
        a value with spaces or quotes stays one argument.
    :param timeout: the hard deadline in seconds of real time, on the monotonic clock (pass
        the hook's ``timeout``; never a time read from ``context.clock``, which a test fakes).
    :param env: the whole environment of the command (default: the director's own); to add
        variables, pass ``{**os.environ, "NAME": "value"}``.
    :param cwd: the working folder of the command (default: the director's).
    :param input: bytes written to the command's stdin, which is then closed (default: stdin
        is ``/dev/null``).
    :param max_output: bytes kept per stream. The site's ``director.max_output_bytes`` is not
        applied for you: pass ``max_output=context.max_output_bytes``.
    :param kill_grace: seconds between SIGTERM and SIGKILL at the deadline.
    :return: a :class:`CommandResult` in every case (``.ok`` is exit code 0, not killed,
        started).
    :raises TypeError: (or ``ValueError``) only for a malformed call: an empty argv, a
        non-string item, a timeout that is not a positive number.
    """
    args = _check_argv(argv)
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if kill_grace < 0 or max_output < 0:
        raise ValueError("kill_grace and max_output must not be negative")
    if input is not None and not isinstance(input, (bytes, bytearray, memoryview)):
        raise TypeError("input must be bytes")

    start = time.monotonic()
    started: list[subprocess.Popen[bytes]] = []
    try:
        try:
            proc = _spawn(
                started,
                args,
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                close_fds=True,
                start_new_session=True,
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.filename is not None:
                reason = f"{reason}: {exc.filename}"
            logger.debug("runner: could not start {}: {}", args[0], reason)
            return CommandResult(
                argv=args,
                returncode=None,
                launch_error=reason,
                duration=time.monotonic() - start,
            )
        # From here until its group is gone, the watchdog (if armed) knows this group.
        _GUARD.tell(f"+{proc.pid}")
        try:
            return _supervise(proc, args, start, timeout, input, max_output, kill_grace)
        finally:
            _GUARD.tell(f"-{proc.pid}")
    except BaseException:
        # An interrupt can land inside Popen after the fork, or before _supervise's own
        # cleanup is armed: the child must not outlive the call either way.
        for child in started:
            if child.pid is not None and child.returncode is None:
                _signal_group(child.pid, signal.SIGKILL)
                try:
                    child.wait(timeout=_REAP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    pass
                _wait_group_gone(child.pid, _REAP_TIMEOUT)
                for pipe in (child.stdin, child.stdout, child.stderr):
                    if pipe is not None:
                        try:
                            pipe.close()
                        except OSError:
                            pass
        raise


class _SpawnRequest:
    """One fork asked of the spawner thread by the main thread."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args = args
        self.kwargs = kwargs
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.taken = False
        self.cancelled = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.error: BaseException | None = None


class _Spawner:
    """A long-lived daemon thread that forks children on behalf of the main thread.

    Python runs signal handlers, and so raises KeyboardInterrupt, only in the main thread,
    at any bytecode: one landing inside Popen just after the fork loses the child's pid, and
    one landing inside ``Thread.start`` leaves it unknown whether a helper runs. A thread that
    already exists and only ever forks has neither problem; the main thread hands it a request
    and, when interrupted, either cancels the request or waits for its outcome.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.requests: queue.SimpleQueue[_SpawnRequest] = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=self._serve, name="gridgate-runner-spawner", daemon=True
        )
        self.thread.start()

    def _serve(self) -> None:
        while True:
            req = self.requests.get()
            with req.lock:
                if req.cancelled:
                    continue
                req.taken = True
            try:
                req.proc = subprocess.Popen(*req.args, **req.kwargs)
            except BaseException as exc:  # handed to the requesting thread
                req.error = exc
            finally:
                req.done.set()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _get_spawner() -> _Spawner:
    global _spawner
    with _spawner_lock:
        # After a fork the child has no spawner thread: make a new one.
        if _spawner is None or _spawner.pid != os.getpid() or not _spawner.thread.is_alive():
            _spawner = _Spawner()
        return _spawner


def _spawn(
    started: list[subprocess.Popen[bytes]], *args: Any, **kwargs: Any
) -> subprocess.Popen[bytes]:
    """Start the child and record it in ``started`` (so an interrupt can still kill it)."""
    if threading.current_thread() is not threading.main_thread():
        # No signal handler ever runs here, so nothing can interrupt Popen halfway.
        proc = subprocess.Popen(*args, **kwargs)
        started.append(proc)
        return proc
    req = _SpawnRequest(args, kwargs)
    try:
        _get_spawner().requests.put(req)
        req.done.wait()
        if req.error is not None:
            raise req.error
        assert req.proc is not None
        started.append(req.proc)
        return req.proc
    except BaseException:
        with req.lock:
            req.cancelled = True
            taken = req.taken
        if taken:
            req.done.wait()  # the fork is under way: wait for it so the child can be killed
            if req.proc is not None and req.proc not in started:
                started.append(req.proc)
        raise


def _supervise(
    proc: subprocess.Popen[bytes],
    args: tuple[str, ...],
    start: float,
    timeout: float,
    input: bytes | None,
    max_output: int,
    kill_grace: float,
) -> CommandResult:
    """Watch ``proc`` (the leader of its own group) to its end: its pipes read and its input
    written until it exits (or until the deadline, then SIGTERM and ``kill_grace``), then the
    group killed and reaped (:class:`_Supervision`'s phases)."""
    watch = _Supervision(proc, args, start, timeout, kill_grace)
    # Everything after Popen sits inside the try, so an interrupt at any point kills the group.
    try:
        watch.open(input, max_output)
        watch.run()
        return watch.result()
    finally:
        watch.close()


class _Supervision:
    """One child watched by :func:`_supervise`. Its phases: running until ``deadline``;
    terminating (SIGTERM sent at the deadline) until ``term_until``; draining (the child
    exited, its group may still hold the pipes) until ``drain_until``. Then the group dies."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        args: tuple[str, ...],
        start: float,
        timeout: float,
        kill_grace: float,
    ) -> None:
        self.proc, self.args, self.start = proc, args, start
        self.timeout, self.kill_grace = timeout, kill_grace
        self.pgid = proc.pid  # start_new_session: the child leads its own group
        self.exit_watch: _Exit | None = None
        self.sel: selectors.BaseSelector | None = None
        self.group_killed = False
        self.finished = False
        self.timed_out = False
        self.stdin_fd: int | None = None
        self.pending_input: memoryview | None = None
        self.deadline = start + timeout
        self.drain_until: float | None = None
        self.term_until: float | None = None

    def open(self, input: bytes | None, max_output: int) -> None:
        """Watch the pipes, the child's exit and (with ``input``) its stdin."""
        proc = self.proc
        assert proc.stdout is not None and proc.stderr is not None
        self.out = _Stream(proc.stdout, max_output)
        self.err = _Stream(proc.stderr, max_output)
        self.exit_watch = exit_watch = _Exit(proc.pid)
        self.sel = sel = selectors.PollSelector()
        self.pending_input = memoryview(bytes(input)) if input is not None else None
        sel.register(self.out.fd, selectors.EVENT_READ, self.out)
        sel.register(self.err.fd, selectors.EVENT_READ, self.err)
        if exit_watch.pidfd is not None:
            sel.register(exit_watch.pidfd, selectors.EVENT_READ, exit_watch)
        if proc.stdin is not None:
            self.stdin_fd = proc.stdin.fileno()
            os.set_blocking(self.stdin_fd, False)
            sel.register(self.stdin_fd, selectors.EVENT_WRITE, "stdin")

    def run(self) -> None:
        """Serve the child's pipes until its phase says to stop watching."""
        while True:
            now = time.monotonic()
            limit = self._limit(now)
            if limit is None:
                return
            self._serve(limit - now)

    def _limit(self, now: float) -> float | None:
        """When the current phase ends (None: stop watching now); at the deadline the
        child is terminated and the terminating phase begins."""
        exit_watch = self.exit_watch
        assert exit_watch is not None
        if exit_watch.exited and not self.out.open and not self.err.open:
            return None
        if self.term_until is not None:
            # Terminating: wait for the child and the pipes, but not past the grace.
            return None if now >= self.term_until else self.term_until
        if exit_watch.exited:
            if self.drain_until is None:
                self.drain_until = min(now + DRAIN_AFTER_EXIT, max(self.deadline, now))
            if now >= self.drain_until:
                logger.debug(
                    "runner: {} exited but its group still holds the pipes; killing it",
                    self.args[0],
                )
                return None
            return self.drain_until
        if now < self.deadline:
            return self.deadline
        self.timed_out = True
        logger.debug("runner: {} timed out after {:.1f} s", self.args[0], self.timeout)
        _signal_group(self.pgid, signal.SIGTERM)
        self.term_until = now + self.kill_grace
        if self.stdin_fd is not None:
            self._close_stdin()
        return self._limit(time.monotonic())

    def _serve(self, wait: float) -> None:
        """Handle what the pipes and the exit watch have, waiting at most ``wait`` seconds."""
        exit_watch, sel = self.exit_watch, self.sel
        assert exit_watch is not None and sel is not None
        if exit_watch.pidfd is None and not exit_watch.exited:
            wait = min(wait, _EXIT_POLL)
        for key, _mask in sel.select(wait):
            what = key.data
            if isinstance(what, _Stream):
                what.read_available(max_reads=1)
                if not what.open:
                    sel.unregister(what.fd)
            elif what is exit_watch:
                sel.unregister(exit_watch.pidfd)
                exit_watch.exited = True
            elif what == "stdin":
                self._write_stdin()
        if exit_watch.pidfd is None:
            exit_watch.check()

    def _write_stdin(self) -> None:
        pending = self.pending_input
        assert pending is not None and self.stdin_fd is not None
        try:
            written = os.write(self.stdin_fd, pending[:_CHUNK])
        except BlockingIOError:
            written = 0
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.EINVAL):
                logger.debug("runner: stdin write failed: {}", exc)
            pending = pending[len(pending) :]
            written = 0
        self.pending_input = pending = pending[written:]
        if not pending:
            self._close_stdin()

    def _close_stdin(self) -> None:
        assert self.sel is not None and self.stdin_fd is not None and self.proc.stdin is not None
        self.sel.unregister(self.stdin_fd)
        self.proc.stdin.close()
        self.stdin_fd = None

    def result(self) -> CommandResult:
        """Kill whatever is left of the group (the unreaped main child pins its id), read the
        pipes' last bytes, reap, and say what the command did."""
        proc = self.proc
        _signal_group(self.pgid, signal.SIGKILL)
        self.group_killed = True
        self.out.read_available(max_reads=_FINAL_DRAIN_READS)
        self.err.read_available(max_reads=_FINAL_DRAIN_READS)
        try:
            returncode: int | None = proc.wait(timeout=_REAP_TIMEOUT)
        except subprocess.TimeoutExpired:
            logger.warning("runner: {} (pid {}) did not die after SIGKILL", self.args[0], proc.pid)
            returncode = None
        _wait_group_gone(self.pgid, _REAP_TIMEOUT)
        self.finished = True
        return CommandResult(
            argv=self.args,
            returncode=None if self.timed_out else returncode,
            stdout=self.out.text(),
            stderr=self.err.text(),
            timed_out=self.timed_out,
            duration=time.monotonic() - self.start,
            stdout_truncated=self.out.truncated,
            stderr_truncated=self.err.truncated,
        )

    def close(self) -> None:
        """Never leave the command running (an interrupt or a bug before :meth:`result`
        ended), and release the selector, the exit watch and the pipes."""
        proc = self.proc
        if not self.finished:
            if not self.group_killed:
                _signal_group(self.pgid, signal.SIGKILL)
            try:
                proc.wait(timeout=_REAP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
            _wait_group_gone(self.pgid, _REAP_TIMEOUT)
        if self.sel is not None:
            self.sel.close()
        if self.exit_watch is not None:
            self.exit_watch.close()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
