"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# Helper modules shared by every test folder (proctable.py, redis_server.py) live in tests/.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def gridgate_exe() -> str:
    """The installed ``gridgate`` console script of the environment running the tests."""
    exe = BIN / "gridgate"
    assert exe.exists(), f"gridgate is not installed in {BIN}"
    return str(exe)


@pytest.fixture
def write(tmp_path: Path):
    """Write a text file under tmp_path and return its path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    return _write


@pytest.fixture(autouse=True)
def _private_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths in configs (./gridgate-state) land in the test's own folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", os.environ.get("HOME", str(tmp_path)))
