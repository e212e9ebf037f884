"""The clock file the stand-ins read and tests move (core.clock.file_time / write_file_time)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gridgate.core.clock import file_time, write_file_time


def test_a_written_clock_file_is_the_time(tmp_path: Path) -> None:
    clock = tmp_path / "clock"
    write_file_time(clock, 1_700_000_123.5)
    assert file_time(clock) == 1_700_000_123.5
    assert [p.name for p in tmp_path.iterdir()] == ["clock"]  # no temporary file left


def test_no_path_or_no_file_yet_is_the_wall_clock(tmp_path: Path) -> None:
    before = time.time()
    assert before <= file_time(None) <= time.time()
    assert before <= file_time(tmp_path / "not-written") <= time.time()


def test_a_clock_file_without_a_number_is_an_error(tmp_path: Path) -> None:
    clock = tmp_path / "clock"
    clock.write_text("", encoding="ascii")
    with pytest.raises(ValueError, match="is not a time"):
        file_time(clock)
