"""The suite's start-up check that the ordinary user of the real-uid tests can run the checkout."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from support.checkout import checkout_problem

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_this_checkout_is_usable_by_nobody() -> None:
    assert checkout_problem(ROOT, BIN) is None


def test_a_checkout_inside_a_private_folder_is_named_with_the_fix() -> None:
    private = Path(tempfile.mkdtemp(prefix="gg-private-"))  # mode 0700, as mktemp -d makes it
    try:
        bin_dir = private / "clone" / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        os.symlink(os.path.realpath(BIN / "python"), bin_dir / "python")
        problem = checkout_problem(private / "clone", bin_dir)
    finally:
        shutil.rmtree(private)
    assert problem is not None
    assert f"not world-executable: {private}" in problem
    assert "Permission denied" in problem
