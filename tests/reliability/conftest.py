"""Fixtures of the reliability suite (helpers live in relkit.py, importable by the tests)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from relkit import Site
from support.proctable import no_child_left


@pytest.fixture(autouse=True)
def _no_child_left() -> Iterator[None]:
    """Every test here must leave no process of its own running (directors, servers, guards)."""
    with no_child_left():
        yield


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
