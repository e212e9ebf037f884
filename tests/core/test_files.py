"""Files others read while gridgate writes them (core/files.py), and the built-in ``files``
notifier on top: one complete, private text per notification, never a half-written one, also
when the disk refuses the write."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from gridgate.core.backend import file_output
from gridgate.core.builtin.notifiers import FileNotifier
from gridgate.core.files import InputFileError, atomic_write, read_part, read_regular
from gridgate.core.model import Endpoint, Notification
from gridgate.core.testing import build_plugin


def note(body: str, level: str = "error") -> Notification:
    return Notification(
        level=level,
        subject="gridgate: wms01 failing",
        body=body,
        created=1796068235.0,
        endpoint=Endpoint(backend="wms_glite", name="wms01.example.org"),
    )


def test_each_notification_is_one_complete_private_file(tmp_path) -> None:
    notifier = build_plugin(FileNotifier, {"folder": str(tmp_path / "notes")})
    notifier.gridgate_notify(notification=note("first"))
    notifier.gridgate_notify(notification=note("second", level="alarm"))
    notifier.gridgate_notify(notification=note("not written", level="info"))  # not in levels
    files = sorted((tmp_path / "notes").iterdir())
    assert [f.name.split("-", 3)[-1] for f in files] == [
        "error-wms01.example.org.txt",
        "alarm-wms01.example.org.txt",
    ]
    assert (
        files[0].read_text().startswith("Subject: gridgate: wms01 failing\nLevel: error\n\nfirst")
    )
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE((tmp_path / "notes").stat().st_mode) == 0o700


def test_a_write_the_disk_refuses_leaves_no_partial_file(tmp_path) -> None:
    # A child process with a 4 KiB file-size limit writes a 64 KiB notification: the write
    # fails (EFBIG) and neither the message nor a fragment of it may be left for a reader.
    folder = tmp_path / "notes"
    child = textwrap.dedent(f"""
        import resource
        from gridgate.core.defaults import FileNotifier
        from gridgate.core.model import Notification
        from gridgate.core.testing import build_plugin
        notifier = build_plugin(FileNotifier, {{"folder": {str(folder)!r}}})
        notifier.gridgate_notify(notification=Notification(
            level="error", subject="small", body="ok", created=0.0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        try:
            notifier.gridgate_notify(notification=Notification(
                level="error", subject="big", body="x" * 65536, created=0.0))
        except OSError as exc:
            print("refused", exc.errno)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused 27")  # EFBIG
    left = sorted(p.name for p in folder.iterdir())
    assert len(left) == 1 and left[0].endswith("-error-gridgate.txt"), left
    assert (folder / left[0]).read_text() == "Subject: small\nLevel: error\n\nok"


def test_atomic_write_replaces_whole_and_honours_the_mode_under_any_umask(tmp_path) -> None:
    target = tmp_path / "shim"
    target.write_text("old")
    previous = os.umask(0o077)
    try:
        atomic_write(target, b"#!/bin/sh\nexit 0\n", mode=0o755)
    finally:
        os.umask(previous)
    assert target.read_bytes() == b"#!/bin/sh\nexit 0\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shim"]  # no temporary left


def test_atomic_write_refused_part_way_keeps_the_old_file(tmp_path) -> None:
    # At a file-size limit os.write writes what fits and returns a short count; the next
    # write fails with EFBIG. The old content must survive and no fragment may remain.
    target = tmp_path / "blocklist.json"
    target.write_text('{"rules": []}')
    child = textwrap.dedent(f"""
        import pathlib, resource
        from gridgate.core.files import atomic_write
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
        try:
            atomic_write(pathlib.Path({str(target)!r}), b"y" * 5000)
        except OSError as exc:
            print("refused", exc.errno)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused 27")  # EFBIG
    assert target.read_text() == '{"rules": []}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocklist.json"]


def test_atomic_write_follows_no_link_planted_under_its_temporary_name(tmp_path) -> None:
    """The temporary name is predictable (.NAME.PID.THREAD.tmp): a link planted there by
    someone who can write the folder must not be followed, written or chmodded (issue 21,
    a member of item 1's class: before, the victim got the data and mode 0600)."""
    import threading

    victim = tmp_path / "victim"
    victim.write_text("keep me\n", encoding="utf-8")
    victim.chmod(0o644)
    target = tmp_path / "out.json"
    planted = tmp_path / f".out.json.{os.getpid()}.{threading.get_ident()}.tmp"
    planted.symlink_to(victim)
    atomic_write(target, b"new\n", durable=False)
    assert victim.read_text(encoding="utf-8") == "keep me\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert target.read_bytes() == b"new\n" and not target.is_symlink()
    assert not planted.exists() and not planted.is_symlink()


# --- read_regular: files another user or a broken tool can put in place (issue 31, 1/4) ----


def _blocked_reader(target: Path, **kwargs: Any) -> tuple[threading.Thread, list[object]]:
    """read_regular(target) in a thread: what it returned or raised lands in the list."""
    got: list[object] = []

    def read() -> None:
        try:
            got.append(read_regular(target, max_bytes=1024, **kwargs))
        except Exception as exc:  # what the test checks
            got.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


def test_a_fifo_is_refused_at_once_instead_of_blocking_in_open(tmp_path: Path) -> None:
    fifo = tmp_path / "x509up_u0"
    os.mkfifo(fifo)
    thread, got = _blocked_reader(fifo)
    thread.join(30)
    try:
        assert not thread.is_alive(), "read_regular blocked on a FIFO"
        (error,) = got
        assert isinstance(error, InputFileError)
        assert str(error) == f"{fifo} is a FIFO, not a regular file"
    finally:
        if thread.is_alive():  # unblock it, so the test process ends
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda p: p.mkdir(), "a folder"),
        (lambda p: p.symlink_to("/dev/null"), "a character device"),
    ],
)
def test_what_is_not_a_regular_file_is_named(tmp_path: Path, make: Any, what: str) -> None:
    target = tmp_path / "input"
    make(target)
    with pytest.raises(InputFileError, match=f"is {what}, not a regular file"):
        read_regular(target, max_bytes=1024)


def test_a_link_is_refused_where_links_must_not_be_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_bytes(b"value\n")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert read_regular(link, max_bytes=1024) == b"value\n"
    with pytest.raises(InputFileError, match="is a symbolic link, not a regular file"):
        read_regular(link, max_bytes=1024, follow_links=False)


def test_the_size_cap_refuses_a_longer_file_instead_of_cutting_it(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1025)
    with pytest.raises(InputFileError, match="is 1025 bytes, more than 1024") as caught:
        read_regular(big, max_bytes=1024)
    assert caught.value.too_large
    big.write_bytes(b"x" * 1024)
    assert len(read_regular(big, max_bytes=1024)) == 1024


def test_a_private_file_of_another_owner_or_open_to_others_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s3cret\n")
    secret.chmod(0o644)
    me = os.geteuid()
    with pytest.raises(InputFileError, match=r"has mode 0644: .* mode 0600 or 0400"):
        read_regular(secret, max_bytes=1024, owners={me}, private=True)
    secret.chmod(0o600)
    assert read_regular(secret, max_bytes=1024, owners={me}, private=True) == b"s3cret\n"
    other = me + 1 if me != 65534 else 0
    os.chown(secret, other, -1)
    with pytest.raises(InputFileError, match=f"is owned by uid {other}.*, not by uid {me}"):
        read_regular(secret, max_bytes=1024, owners={me}, private=True)
    # without a wish for owner and mode, it is a readable regular file
    assert read_regular(secret, max_bytes=1024) == b"s3cret\n"


def test_a_missing_file_keeps_its_errno(tmp_path: Path) -> None:
    with pytest.raises(InputFileError) as caught:
        read_regular(tmp_path / "none", max_bytes=10)
    assert caught.value.errno == errno.ENOENT and "No such file" in str(caught.value)


def test_read_part_reads_the_start_or_the_end_and_tells_the_length(tmp_path) -> None:
    path = tmp_path / "out.txt"
    path.write_bytes(b"0123456789")
    assert read_part(path, size=4) == (b"0123", 10)
    assert read_part(path, size=4, from_end=True) == (b"6789", 10)
    assert read_part(path, size=40, from_end=True) == (b"0123456789", 10)
    assert read_part(path, size=0) == (b"", 10)
    with pytest.raises(InputFileError) as missing:
        read_part(tmp_path / "nothing", size=4)
    assert missing.value.errno == errno.ENOENT
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="a FIFO, not a regular file"):
        read_part(fifo, size=4)  # refused at once, never blocked on


def test_read_part_never_reads_through_a_link_a_pilot_could_plant(tmp_path) -> None:
    """A pilot's output file is written by another user, who can swap it (or a folder on the
    way) for a link to a file only the director may read: ``pilots output`` would print it."""
    secret = tmp_path / "credentials" / "token"
    secret.parent.mkdir()
    secret.write_bytes(b"eyJ.secret.token")
    secret.chmod(0o600)
    out = tmp_path / "pilots" / "123.out"
    out.parent.mkdir()
    out.symlink_to(secret)
    with pytest.raises(InputFileError, match="is a link: not read"):
        read_part(out, size=100)
    # a folder on the way that is another user's link (the pilot's user, here nobody)
    moved = tmp_path / "moved"
    moved.symlink_to(secret.parent, target_is_directory=True)
    os.lchown(moved, 65534, 65534)
    with pytest.raises(InputFileError, match="is reached through a link of uid 65534") as folder:
        read_part(moved / "token", size=100)
    assert "secret" not in str(folder.value)
    # a site's own link (root's, or the director user's) is a folder like any other
    os.lchown(moved, 0, 0)
    assert read_part(moved / "token", size=100) == (b"eyJ.secret.token", 16)
    # what the backends answer with: the pilot's output not read, nothing of the target shown
    answer = file_output("123", "stdout", str(out), 100)
    assert not answer.ok and answer.text == "" and "link" in answer.message
    # the real file, through a path without links, is read
    out.unlink()
    out.write_bytes(b"pilot says hello\n")
    assert read_part(out, size=100) == (b"pilot says hello\n", 17)
