"""The daemon's diagnostic log: its lines, the file it goes to (opened as a root daemon may), and
the ``diagnose`` admin command's arguments, as ``badmin diagnose`` takes them: on or off, a
duration after which diagnosis turns itself off, and the log file's name."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from loguru import logger

from gridgate.plugins.lsf_proxy.commands import opcode_of
from gridgate.plugins.lsf_proxy.config import LSF_NAMES
from gridgate.plugins.lsf_proxy.daemon.policy import GRANTED, Decision
from gridgate.plugins.lsf_proxy.wire import ProtocolError

_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
#: What a log field may hold as it is; anything else a client chose becomes ``_``.
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+@:")


def diagnose_line(decision: Decision) -> str:
    """One diagnostic-log line in the seed's format::

    Feb 8 07:57:12 2023 QUERY_REQ,BATCH_JOB_QUERY,user1,host1,184,1,075423,075426
    """
    req = decision.request
    done = time.localtime(decision.decided)
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
    return f"{stamp(decision.decided)} {','.join(fields)}"


def stamp(at: float) -> str:
    """The diagnostic log's time stamp of epoch time ``at``: ``Feb 8 07:57:12 2023``."""
    local = time.localtime(at)
    return f"{time.strftime('%b', local)} {local.tm_mday} {time.strftime('%H:%M:%S %Y', local)}"


def log_field(text: str) -> str:
    """``text`` (a name a client chose) fit for a log line: a comma or newline would break the
    columns, and ``;``, ``$(...)``, quotes or escapes must reach no reader of the log (nor a
    script that pastes it into a shell); at most 128 characters."""
    return "".join(ch if ch in _SAFE else "_" for ch in str(text)[:128])


class DiagnosticLog:
    """The log while diagnosis is on: at the configured path, or at the one ``diagnose on -f
    FILE`` named until that diagnosis ends (with ``-t MINUTES``, by itself).

    :param configured: the configured path, asked at each use (a reload may change it).
    :param complain: logs a failed write (a full disk), at most once a minute.
    """

    def __init__(self, configured: Callable[[], Path], complain: Callable[..., None]) -> None:
        self._configured = configured
        self._complain = complain
        self._log: TextIO | None = None
        self._open_at: Path | None = None
        #: the file named by ``diagnose on -f``, and when (monotonic) ``-t`` ends it
        self.named: Path | None = None
        self.until: float | None = None

    @property
    def path(self) -> Path:
        return self.named or self._configured()

    @property
    def folder(self) -> Path:
        """Where a file named by ``diagnose on -f`` goes: beside the configured log."""
        return self._configured().parent

    @property
    def on(self) -> bool:
        return self._log is not None

    def switch(self, on: bool) -> None:
        """Open or close the log (at :attr:`path`; an open log elsewhere moves there).

        :raises OSError: it cannot be opened (:func:`open_log` says why).
        """
        if on and self._log is not None and self._open_at != self.path:
            self.switch(False)  # diagnose_file changed on reload: move to the new file
        if on and self._log is None:
            # no link followed, in a folder only its owner (this user or root) can write
            self._log = open_log(self.path)
            self._open_at = self.path
        elif not on and self._log is not None:
            self._log.close()
            self._log = None

    def diagnose(self, on: bool, minutes: float | None, named: Path | None, now: float) -> None:
        """What the ``diagnose`` command asks (:func:`diagnose_args`); ``now`` is monotonic.

        :raises OSError: the log cannot be opened; the file named before stays named.
        """
        previous = self.named
        self.named = named if on else None
        try:
            self.switch(on)
        except OSError:
            self.named = previous
            raise
        self.until = now + minutes * 60 if minutes else None

    def expire(self, now: float) -> None:
        """``diagnose on -t MINUTES`` turns itself off when its time is up (``now``: monotonic)."""
        if self.until is not None and now >= self.until:
            logger.info("diagnose off: its time is up ({})", self.path)
            self.until = None
            self.named = None
            self.switch(False)

    def reopen(self) -> None:
        """Close and reopen an open log, so that after logrotate renamed it the daemon writes
        to a fresh file at the same path (SIGHUP does this, then reloads)."""
        if self._log is not None:
            self.switch(False)
            try:
                self.switch(True)
            except OSError as exc:
                logger.error("diagnostic log {} not reopened: {}", self.path, exc)

    def write(self, line: str) -> None:
        if self._log is not None:
            try:
                self._log.write(line + "\n")
            except OSError as exc:  # a full disk: once a minute, not once per request
                self._complain("lsfproxyd: diagnostic log {}: {}", self.path, exc)


def _shown(name: Any) -> str:
    text = name if isinstance(name, str) else repr(name)
    return repr("".join(ch if ch.isprintable() else "?" for ch in text[:80]))


def diagnose_args(
    message: Mapping[str, Any], folder: Path
) -> tuple[bool, float | None, Path | None]:
    """``(on, minutes, file)`` of a ``diagnose`` request.

    ``minutes`` (> 0) ends the diagnosis by itself; ``file`` is a bare name, put in ``folder``
    (where the default log lives); a path is refused.

    :raises ProtocolError: ``bad_request`` naming the field.
    """
    on = message.get("on")
    if not isinstance(on, bool):
        raise ProtocolError("bad_request", 'diagnose needs "on": true or false')
    minutes = message.get("minutes")
    if minutes is not None and (
        isinstance(minutes, bool)
        or not isinstance(minutes, int | float)
        or not 0 < minutes <= 525600
    ):
        raise ProtocolError(
            "bad_request", "minutes must be a number of minutes above 0 (at most a year)"
        )
    name = message.get("file")
    path = None
    if name is not None:
        # a bare name in the log folder, never a path: a root daemon must not open, append to
        # or create whatever file an admin (or a key holder over TCP) names
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ProtocolError(
                "bad_request",
                f"file {_shown(name)}: give a bare name of "
                "letters, digits, '.', '_' and '-' (not "
                "starting with '.'), written next to the "
                f"default log, in {folder}",
            )
        path = folder / name
    if not on and (minutes is not None or path is not None):
        raise ProtocolError("bad_request", "minutes and file go with diagnose on")
    return on, (float(minutes) if minutes is not None else None), path


def earliest(*times: float | None) -> float | None:
    """The earliest of the given monotonic times (None: none)."""
    given = [t for t in times if t is not None]
    return min(given) if given else None


def private_folder(folder: Path) -> int:
    """An open descriptor (``O_DIRECTORY``, not following a link) of ``folder``, a folder
    owned by this user or root that nobody else can write: whoever could write there could put
    a link (or the next name a writer will create) and have a root daemon write through it.

    :raises OSError: saying which check failed.
    """
    euid = os.geteuid()
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(f"its folder {folder} is a symbolic link or not a folder") from None
        raise
    try:
        info = os.fstat(dir_fd)
        if info.st_uid not in (0, euid):
            raise OSError(
                f"its folder {folder} belongs to uid {info.st_uid}, not to this user or root"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise OSError(
                f"its folder {folder} is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
            )
    except BaseException:
        os.close(dir_fd)
        raise
    return dir_fd


def open_log(path: Path) -> TextIO:
    """Open the diagnostic log ``path`` for appending, as a root daemon may.

    Its folder must be a real directory (not a link) owned by this user or root that nobody
    else can write, so nobody else can put a link or another file there; the file itself is
    opened without following a link (``O_NOFOLLOW``) and must be a regular file with one
    name, not readable or writable by others. A new file is created 0600 (it names every user
    and host that asked); an existing one keeps the mode its owner gave it (group-readable, as
    logrotate's ``create 0640``, is fine).

    :raises OSError: with a message that says which of these failed.
    """
    euid = os.geteuid()
    folder = path.parent
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    dir_fd = private_folder(folder)
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
        try:
            fd = os.open(path.name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            try:
                fd = os.open(path.name, flags, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # the name is a symbolic link
                    raise OSError(f"{path} is a symbolic link: not followed") from None
                raise
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid not in (0, euid):
            raise OSError(f"{path} is not a regular file of this user or root with one name")
        if info.st_mode & (stat.S_IROTH | stat.S_IWOTH):
            # it would name every user and host that asks to anyone; its mode is its owner's
            # to change (it is never chmodded here), so it is not used
            raise OSError(
                f"{path} is readable or writable by others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}): chmod o-rw it, or remove it"
            )
        return os.fdopen(fd, "a", encoding="utf-8", buffering=1)
    except BaseException:
        os.close(fd)
        raise
