"""What a daemon checks before it serves, and the error it stops with when it cannot start: a
socket directory others could write, a daemon already on the socket, too few descriptors."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import stat
from pathlib import Path


class StartupError(Exception):
    """The daemon cannot start (socket in use, name not in hosts, bad key...)."""


def check_socket_dir(folder: Path) -> None:
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


def socket_answers(path: str) -> bool:
    """Whether a daemon listens on the Unix socket ``path`` now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


def raise_nofile() -> None:
    """10,000 clients need 10,000 descriptors: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard)
            )
