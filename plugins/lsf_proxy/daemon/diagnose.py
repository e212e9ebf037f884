"""Arguments of the ``diagnose`` admin command, as ``badmin diagnose`` takes them: on or off, a
duration after which diagnosis turns itself off, and the log file's name."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from gridgate.plugins.lsf_proxy.protocol import ProtocolError

_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")


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
