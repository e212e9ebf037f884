"""Running a command as a real ordinary uid: the tests that check permissions and socket
modes run their clients as ``nobody`` (the suite runs as root in CI)."""

from __future__ import annotations

import contextlib
import pwd
import secrets
import subprocess
from collections.abc import Iterator

from support.polling import until

#: argv prefix: ``[*AS_NOBODY, program, ...]`` runs ``program`` as nobody:nogroup with no
#: supplementary groups (util-linux setpriv; no shell involved).
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def as_user(name: str) -> list[str]:
    """argv prefix running a program as ``name`` with its own group and no other groups."""
    return ["setpriv", f"--reuid={name}", f"--regid={name}", "--clear-groups"]


@contextlib.contextmanager
def real_user(prefix: str = "ggt", group: str | None = None) -> Iterator[str]:
    """A real user made for one test (``useradd``, no home), deleted after: with a group of its
    own, or with ``group`` (another test user's) as its primary group. The name is unique, so
    tests in parallel workers never share one."""
    name = f"{prefix}{secrets.token_hex(3)}"
    argv = ["useradd", "-M", "-s", "/usr/sbin/nologin"]
    argv += ["-g", group, "-N"] if group else ["-U"]
    # a uid of its own, never the one a deleted test user had: slurmctld keeps the names of
    # the uids it has seen, and would count a reused uid's requests under the old name
    for _ in range(20):
        uid = 20000 + secrets.randbelow(40000)
        if _retried([*argv, "-u", str(uid), name], check=False) != 4:  # 4: uid in use
            break
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise AssertionError(f"useradd {name} failed") from None
    try:
        yield name
    finally:
        _retried(["userdel", name], check=False)
        if group is None:
            subprocess.run(["groupdel", name], capture_output=True, timeout=60)


def _retried(argv: list[str], check: bool = True) -> int:
    """``argv``, again while another worker's useradd holds the lock of /etc/passwd (exit 10):
    a real lock of a real process, polled with the suite's poller; its exit status."""
    runs: list[subprocess.CompletedProcess[str]] = []

    def unlocked() -> bool:
        runs.append(subprocess.run(argv, capture_output=True, text=True, timeout=60))
        return runs[-1].returncode != 10

    until(unlocked, timeout=10, pause=0.2)
    done = runs[-1]
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} failed: {done.stderr}")
    return done.returncode
