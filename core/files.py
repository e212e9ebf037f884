"""Files that readers may see at any moment: written whole or not at all, private by default.

Notes, outbox messages, tickets, the persisted blocklist and the gate's shims are all picked
up by someone else (a person, a mail relay, the next start) while gridgate may be writing or
crashing. Every such write goes through :func:`atomic_write`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path

__all__ = ["atomic_write", "ensure_private_dir", "resolve_dir"]


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(
    path: Path, data: bytes, *, tmp_dir: Path | None = None, mode: int = 0o600, durable: bool = True
) -> None:
    """Write ``data`` to ``path`` so that a reader or a crash sees the old file or the whole new one.

    The bytes go to a hidden file (in ``tmp_dir``, default ``path``'s folder, which must be on
    the same file system), created with ``mode``, then renamed over ``path``. A write the disk
    refuses part-way (full, over a file-size limit) raises ``OSError`` and leaves nothing
    behind. ``durable`` fsyncs the data and the folder, for files that must survive a power cut.
    """
    folder = tmp_dir or path.parent
    tmp = folder / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    # The name is predictable, so it is created, never opened: a link or file planted under it
    # (in a folder others can write) is not followed, written or chmodded, only removed (unlink
    # removes the link itself) once, as a dead process's leftover would be.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        fd = os.open(tmp, flags, mode)
    except FileExistsError:
        tmp.unlink()
        fd = os.open(tmp, flags, mode)
    try:
        try:
            view = memoryview(data)
            while view:  # os.write may write less than asked (e.g. at a file-size limit)
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(errno.ENOSPC, f"no byte could be written to {tmp}")
                view = view[written:]
            if durable:
                os.fsync(fd)
            os.fchmod(fd, mode)  # the umask may have taken bits that ``mode`` asks for
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(path.parent)


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) if needed and make it owner-only (0700) when it is ours
    (a folder of someone else's is left as it is)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(PermissionError):
        os.chmod(path, 0o700)


def resolve_dir(value: str, state_dir: Path, default: str) -> Path:
    """A folder a plugin's section configures: ``value``, or ``state_dir/default`` when
    ``value`` is "". Mark the key ``"x-gridgate-path": True`` in the schema: a relative
    ``value`` in a config file is then made absolute from the file's folder before the plugin
    sees it (a ``value`` from elsewhere is taken as it is, from the working directory).

    :param value: the section's key (for instance ``outbox``).
    :param state_dir: ``context.state_dir``.
    :param default: the folder's name under ``state_dir``.
    """
    return Path(value) if value else Path(state_dir) / default
