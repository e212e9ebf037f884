"""A real, throw-away redis-server on a free loopback port, for tests that need Redis.

Use it as a context manager (``with RedisServer(tmp_path) as server: server.url``) or through
the ``redis_server`` fixture of tests/core/conftest.py. When redis-server is not installed the
test fails with a message saying how to install it; it is never skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from support.ports import free_port

INSTALL_HINT = (
    "redis-server is not on PATH: the Redis tests need a real server. Install the Debian "
    "package (apt-get install -y redis-server; dev.sh and .ci/run do this)."
)


class RedisServer:
    """One redis-server process without persistence, bound to 127.0.0.1."""

    def __init__(
        self, workdir: Path, start_timeout: float = 15.0, password: str | None = None
    ) -> None:
        self.workdir = Path(workdir)
        self.start_timeout = start_timeout
        self.password = password
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=5, password=self.password
        )

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(INSTALL_HINT, pytrace=False)
        self.workdir.mkdir(parents=True, exist_ok=True)
        last_log = ""
        # Another test process may grab the free port between probe and bind: try a few.
        for _attempt in range(5):
            self.port = free_port()
            log = self.workdir / f"redis-{self.port}.log"
            # the server dies with the test process that started it, even one killed outright
            # (a crashed xdist worker, a pytest-timeout): SIGKILL when its parent thread ends
            argv = [
                "setpriv",
                "--pdeathsig",
                "KILL",
                "--",
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--daemonize",
                "no",
                "--logfile",
                str(log),
            ]
            if self.password is not None:
                argv += ["--requirepass", self.password]
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            if self._wait_ready():
                return self
            last_log = log.read_text(errors="replace") if log.exists() else ""
            self.stop()
        pytest.fail(f"redis-server did not start; last log:\n{last_log}", pytrace=False)

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        end = time.monotonic() + self.start_timeout
        client = self.client()
        try:
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.exceptions.RedisError:
                    pass
                time.sleep(0.02)  # waiting for a real server to listen, not for an expiry
            return False
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
