"""Fixtures of the reliability suite (helpers live in relkit.py, importable by the tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from relkit import Site
from support.proctable import live_descendants


@pytest.fixture(autouse=True)
def _no_child_left() -> Iterator[None]:
    """Every test here must leave no process of its own running (directors, servers, guards)."""
    before = live_descendants(os.getpid())
    yield
    # A process told to stop a moment ago may still be running its own shutdown.
    end = time.monotonic() + 5
    while (left := live_descendants(os.getpid()) - before) and time.monotonic() < end:
        time.sleep(0.05)
    assert not left, f"test left child processes running: {sorted(left)}"


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path / "site")


@pytest.fixture
def director_procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Director processes a test starts in the background; killed if the test leaves them."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
