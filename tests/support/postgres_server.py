"""A real, throw-away PostgreSQL cluster on a free loopback port, for the postgresql driver's tests.

Use it as a context manager (``with PostgresServer() as server: server.dsn``) or through the
``postgres_server`` fixture of tests/core/conftest.py. The cluster is made with the Debian
package's own ``initdb`` and run by its ``postgres`` binary (``/usr/lib/postgresql/<ver>/bin``),
never the system's service: in a temporary folder, listening on 127.0.0.1 and on a Unix socket
in that folder, with a password for its one user, and it is stopped and removed at the end.
PostgreSQL refuses to run as root, so it runs as the package's ``postgres`` user (``nobody``
where there is none) through ``setpriv``. When the binaries are missing the test fails with a
message saying how to install them; it is never skipped.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from support.ports import free_port

INSTALL_HINT = (
    "no PostgreSQL server binaries under /usr/lib/postgresql/<version>/bin: the postgresql "
    "driver's tests need a real server. Install the Debian package (apt-get install -y "
    "postgresql; dev.sh does this)."
)

#: the cluster's one user; its password is the server's ``password``
USER = "gridgate"


def server_bin() -> Path | None:
    """The newest installed ``/usr/lib/postgresql/<version>/bin`` holding initdb and postgres."""
    found = []
    for path in Path("/usr/lib/postgresql").glob("*/bin"):
        if re.fullmatch(r"\d+", path.parent.name) and (path / "initdb").is_file():
            if (path / "postgres").is_file():
                found.append((int(path.parent.name), path))
    return max(found)[1] if found else None


#: a cluster folder younger than this is never taken for a crashed run's (initdb may be filling it)
STALE_AFTER = 600.0


def remove_stale_clusters() -> None:
    """Remove the cluster folders that test processes killed outright left behind (their server
    died with them, by its parent-death signal, but nobody removed the folder, ~40 MB each): an
    old folder whose postmaster is not running."""
    for folder in Path(tempfile.gettempdir()).glob("gridgate-pg-*"):
        try:
            if time.time() - folder.stat().st_mtime < STALE_AFTER:
                continue
            pidfile = folder / "data" / "postmaster.pid"
            if pidfile.exists() and Path(f"/proc/{pidfile.read_text().split()[0]}").exists():
                continue
        except (OSError, IndexError):
            continue  # being removed by another process, or not ours to judge
        shutil.rmtree(folder, ignore_errors=True)


def _owner() -> str:
    """The unprivileged user the cluster runs as."""
    try:
        pwd.getpwnam("postgres")
        return "postgres"
    except KeyError:
        return "nobody"


class PostgresServer:
    """One PostgreSQL cluster without durability (fsync off), bound to 127.0.0.1."""

    def __init__(self, password: str = "pg-test-pw", start_timeout: float = 60.0) -> None:
        self.password = password
        self.start_timeout = start_timeout
        self.port = 0
        self.workdir: Path | None = None
        self._server_argv: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """A libpq URL of the cluster's ``postgres`` database, without the password."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    @property
    def socket_dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "socket"

    def state_section(self, folder: Path, schema: str | None = None) -> dict[str, Any]:
        """A ``state:`` section of the postgresql driver on this cluster: its password in a
        private file under ``folder``, in ``schema`` (a fresh one when not given)."""
        secret = folder / f"pg-{uuid.uuid4().hex}.pw"
        secret.write_text(self.password + "\n")
        secret.chmod(0o600)
        return {
            "driver": "postgresql",
            "dsn": self.dsn,
            "password": {"file": str(secret)},
            "schema": schema or f"t_{uuid.uuid4().hex}",
        }

    def connect(self) -> psycopg.Connection:
        """A plain psycopg connection as the cluster's user (autocommit), for checks."""
        return psycopg.connect(self.dsn, password=self.password, connect_timeout=5, autocommit=True)

    def start(self) -> PostgresServer:
        bindir = server_bin()
        if bindir is None:
            pytest.fail(INSTALL_HINT, pytrace=False)
        remove_stale_clusters()
        entry = pwd.getpwnam(_owner())
        # Not under pytest's tmp_path: that folder is root's 0700, which the server's uid
        # cannot enter. /tmp is open to everybody; the folder itself is the owner's alone.
        self.workdir = Path(tempfile.mkdtemp(prefix="gridgate-pg-"))
        data = self.workdir / "data"
        pwfile = self.workdir / "pwfile"
        pwfile.write_text(self.password + "\n")
        self.socket_dir.mkdir()
        for path in (self.workdir, pwfile, self.socket_dir):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        pwfile.chmod(0o600)
        self.workdir.chmod(0o700)
        run_as = [
            "setpriv",
            f"--reuid={entry.pw_uid}",
            f"--regid={entry.pw_gid}",
            "--clear-groups",
        ]
        initdb = [
            *run_as,
            str(bindir / "initdb"),
            "--pgdata",
            str(data),
            "--username",
            USER,
            "--pwfile",
            str(pwfile),
            "--auth",
            "scram-sha-256",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            "--no-sync",
        ]
        done = subprocess.run(initdb, capture_output=True, text=True, timeout=120, cwd="/")
        pwfile.unlink()
        if done.returncode != 0:
            self._remove()
            pytest.fail(f"initdb failed:\n{done.stdout}\n{done.stderr}", pytrace=False)
        self._server_argv = [
            *run_as,
            # the server dies with the test process that started it, even one killed outright
            # (a crashed xdist worker, a pytest-timeout): SIGKILL when its parent thread ends
            "--pdeathsig",
            "KILL",
            "--",
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-k",
            str(self.socket_dir),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=200",
            "-c",
            "logging_collector=off",
            # no worker forked later on: the server is a descendant of the test process, and
            # tests/core/test_runner.py counts new descendants as a test's leftovers
            "-c",
            "autovacuum=off",
        ]
        last_log = ""
        # Another test process may grab the free port between probe and bind: try a few.
        for _attempt in range(5):
            self.port = free_port()
            last_log = self._launch()
            if not last_log:
                return self
        self._remove()
        pytest.fail(f"postgres did not start; last log:\n{last_log}", pytrace=False)

    def _launch(self) -> str:
        """Start the server on ``self.port``: '' when it accepts connections, else its log."""
        assert self.workdir is not None
        log = self.workdir / f"postgres-{self.port}.log"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [*self._server_argv, "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd="/",
            )
        if self._wait_ready():
            return ""
        self._stop_process()
        return log.read_text(errors="replace") or "(empty)"

    def restart(self) -> None:
        """Stop the server ("fast": every session ended) and start it again on the same port
        with the same data, as an operator's restart does."""
        self._stop_process()
        last_log = self._launch()
        if last_log:
            pytest.fail(f"postgres did not start again; log:\n{last_log}", pytrace=False)

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        end = time.monotonic() + self.start_timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                self.connect().close()
                return True
            except psycopg.OperationalError:
                # waiting for a real server to accept connections, not for an expiry
                time.sleep(0.05)
        return False

    def _stop_process(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # "fast" shutdown: end sessions, stop
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _remove(self) -> None:
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def stop(self) -> None:
        self._stop_process()
        self._remove()

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
