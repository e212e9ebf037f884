"""Files others see and files others can put in place: written whole or not at all, private by
default; read only when they are what they claim to be.

Notes, outbox messages, tickets, the persisted blocklist and the gate's shims are all picked
up by someone else (a person, a mail relay, the next start) while gridgate may be writing or
crashing. Every such write goes through :func:`atomic_write`.

A credential, a demand file, a feed, a config file or a state file may be put in place by
another user or a broken tool: a FIFO there would hang ``open()`` for ever, a device or a huge
file would be read without end, a loose proxy would be handed to a grid client. Every such read
goes through :func:`read_regular`: opened without blocking (and without following a link where
asked), checked on the open descriptor (a regular file, the owner and mode asked for, a size
cap) before a byte is read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Collection
from pathlib import Path

__all__ = [
    "InputFileError",
    "atomic_write",
    "ensure_private_dir",
    "file_problem",
    "read_credential",
    "read_part",
    "read_regular",
    "resolve_dir",
    "shared_folder",
]

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a symbolic link",
}


class InputFileError(OSError):
    """A file that is not to be read: missing or unreadable (``errno`` set), not a regular
    file, owned by another user, open to others where it must be private, or past its size
    cap. ``str(error)`` names the file and what is wrong in a few words; ``too_large`` says
    it was the size cap."""

    def __init__(self, message: str, code: int | None = None, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.errno = code
        self.too_large = too_large

    def __str__(self) -> str:
        return str(self.args[0])


def _user(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def file_problem(
    info: os.stat_result, *, owners: Collection[int] | None = None, private: bool = False
) -> str | None:
    """What is wrong with a file of this ``stat`` for a reader that asks it be owned by one of
    ``owners`` and, when ``private``, give no access to its group or others; None when nothing.

    :param info: the file's ``os.stat``/``os.fstat`` result.
    :param owners: the uids that may own it (None: any).
    :param private: a credential or a secret: group and others must have no access at all.
    """
    kind = stat.S_IFMT(info.st_mode)
    if kind != stat.S_IFREG:
        return f"is {_KINDS.get(kind, 'not a regular file')}, not a regular file"
    if owners is not None and info.st_uid not in owners:
        wanted = " or ".join(_user(uid) for uid in sorted(owners))
        return (
            f"is owned by {_user(info.st_uid)}, not by {wanted}: its owner could replace it; "
            f"it must belong to {wanted}"
        )
    mode = stat.S_IMODE(info.st_mode)
    if private and mode & 0o077:
        return (
            f"has mode {mode:04o}: its group or others may read or write it; it must be "
            f"readable and writable by its owner only, mode 0600 or 0400 (chmod 600 it)"
        )
    return None


def read_regular(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    owners: Collection[int] | None = None,
    private: bool = False,
    follow_links: bool = True,
) -> bytes:
    """The whole content of ``path``, once it is known to be a regular file fit to read.

    The file is opened non-blocking (a FIFO someone put there cannot hang the caller), without
    a controlling terminal and, with ``follow_links=False``, without following a symbolic link
    at its last component; then the open descriptor is checked (:func:`file_problem`) and at
    most ``max_bytes`` are read.

    :param path: the file.
    :param max_bytes: the size cap: a longer file is refused, not cut.
    :param owners: the uids that may own it; None: any.
    :param private: a credential: refused when group or others have any access.
    :param follow_links: False refuses a link in place of the file (``O_NOFOLLOW``).
    :raises InputFileError: for a file that is missing, unreadable, not a regular file, of
        another owner, not private enough, or larger than ``max_bytes``.
    """
    name = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        if exc.errno == errno.EACCES:
            # not ours to read: say whose it is and what it must be, when that is the reason
            problem = None
            with contextlib.suppress(OSError):
                problem = file_problem(os.stat(name), owners=owners, private=private)
            if problem is not None:
                raise InputFileError(f"{name} {problem}") from None
        if exc.errno == errno.ELOOP and not follow_links:
            raise InputFileError(
                f"{name} is a symbolic link, not a regular file", errno.ELOOP
            ) from None
        raise InputFileError(f"{name}: {exc.strerror}", exc.errno) from None
    try:
        info = os.fstat(fd)
        problem = file_problem(info, owners=owners, private=private)
        if problem is not None:
            raise InputFileError(f"{name} {problem}")
        if info.st_size > max_bytes:
            raise InputFileError(
                f"{name} is {info.st_size} bytes, more than {max_bytes}", too_large=True
            )
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:  # it grew while being read
            raise InputFileError(f"{name} is longer than {max_bytes} bytes", too_large=True)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_part(
    path: str | os.PathLike[str], *, size: int, from_end: bool = False
) -> tuple[bytes, int]:
    """At most ``size`` bytes of the regular file ``path`` (its start, or its end with
    ``from_end``) and its whole length, for a file too large to read whole (a pilot's output).

    Opened as :func:`read_regular` opens (non-blocking, no controlling terminal), checked on
    the open descriptor to be a regular file before a byte is read. Never through another
    user's link: a pilot's output is written by another user, who could otherwise put a link
    there to a file only this process may read (the director's token) and have it printed. So
    the file itself is opened with ``O_NOFOLLOW``, a folder on the way that is a link must
    belong to root or to this process's user (a site's own ``/scratch -> /data/scratch``), and
    the path the open descriptor resolves to must be the one those links lead to (nothing
    swapped in between).

    :param path: the file.
    :param size: the most bytes to read (0: none, only its length).
    :param from_end: read the last ``size`` bytes instead of the first.
    :raises InputFileError: for a file that is missing (``errno`` ENOENT), unreadable or not a
        regular file.
    """
    name = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputFileError(f"{name} is a link: not read") from None
        raise InputFileError(f"{name}: {exc.strerror}", exc.errno) from None
    try:
        info = os.fstat(fd)
        problem = file_problem(info)
        if problem is not None:
            raise InputFileError(f"{name} {problem}")
        link = _foreign_link(name)
        if link:
            raise InputFileError(f"{name} is reached through {link}: not read")
        try:
            reached = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            reached = None  # no /proc: the checks above are what is checked
        if reached is not None and reached != os.path.realpath(name):
            raise InputFileError(f"{name} is reached through a link (to {reached}): not read")
        total = info.st_size
        if from_end and total > size:
            os.lseek(fd, total - size, os.SEEK_SET)
        chunks: list[bytes] = []
        got = 0
        while got < size:
            chunk = os.read(fd, min(1 << 20, size - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks), total
    finally:
        os.close(fd)


def _foreign_link(path: str) -> str:
    """The first folder on the way to ``path`` that is a link of a user other than root and
    this process's (``"a link of uid N, /scratch/p"``); "" when there is none."""
    trusted = {0, os.geteuid()}
    folder = os.path.dirname(os.path.abspath(path))
    seen = ""
    for part in folder.split("/")[1:]:
        seen += "/" + part
        try:
            info = os.lstat(seen)
        except OSError:
            return ""  # the open that follows says what is missing
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in trusted:
            return f"a link of uid {info.st_uid}, {seen}"
    return ""


def shared_folder(path: str | os.PathLike[str]) -> bool:
    """Whether the folder of ``path`` lets others create or replace names in it (its mode has
    ``o+w``, sticky ``/tmp`` included; unreadable: taken as shared).

    :param path: the file whose folder is judged.
    """
    try:
        mode = os.stat(os.path.dirname(os.path.abspath(path))).st_mode
    except OSError:
        return True
    return bool(mode & stat.S_IWOTH)


def read_credential(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """A credential file (a proxy, a bearer token) of this user, private to it: owner and mode
    checked on the file opened (``fstat``) and, in a folder others may write
    (:func:`shared_folder`: ``/tmp``, where ``x509up_u<uid>`` and ``bt_u<uid>`` are
    discovered), opened without following a link (``O_NOFOLLOW``): another user's link there
    to a private file of this user would otherwise pass every check on its target and send
    that file to the services as this user's credential.

    :param path: the credential file.
    :param max_bytes: the size cap, as :func:`read_regular`'s.
    :raises InputFileError: as :func:`read_regular` (a link in a shared folder is one).
    """
    return read_regular(
        path,
        max_bytes=max_bytes,
        owners={os.geteuid()},
        private=True,
        follow_links=not shared_folder(path),
    )


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
