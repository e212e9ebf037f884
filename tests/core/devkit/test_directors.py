"""The director processes' kit (gridgate.core.devkit.directors): what the sharing tests and
bench/bench_scaleout.py conclude from the notes depends on reading them right."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from gridgate.core.devkit.directors import (
    Submission,
    overlap_seconds,
    overlaps,
    pilots_per_endpoint,
    submissions,
)


def _s(director: str, group: str, start: float, end: float, endpoint: str = "ce0") -> Submission:
    return Submission(director, group, endpoint, start, end, 1)


def test_overlaps_are_two_directors_on_one_group_at_once() -> None:
    noted = [
        _s("a", "g0", 0.0, 1.0),
        _s("a", "g0", 0.5, 1.5),  # the same director twice: its own threads
        _s("b", "g1", 0.2, 0.8),  # another group
        _s("b", "g0", 1.5, 2.0),  # right after a's: touching is not overlapping
        _s("c", "g0", 1.9, 3.0),  # during b's
    ]
    assert overlaps(noted) == [(noted[3], noted[4])]
    assert overlap_seconds(noted) == 2.0 - 1.9
    assert overlaps(noted[:4]) == [] and overlap_seconds(noted[:4]) == 0.0


def test_a_note_cut_short_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "d0.jsonl"
    whole = [_s("a", "g0", 0.0, 1.0, "ce1"), _s("a", "g1", 1.0, 2.0, "ce1")]
    text = "".join(json.dumps(asdict(s)) + "\n" for s in whole)
    path.write_text(text + text[:20], encoding="utf-8")  # SIGKILLed while writing
    assert submissions([path, tmp_path / "none.jsonl"]) == whole
    assert pilots_per_endpoint(whole) == {"ce1": 2}
