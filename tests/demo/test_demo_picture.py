"""docs/demo-pilots-per-slot.png is what today's report draws: the picture carries what it shows
(its ``gridgate-plotted`` text chunk), the table it was drawn from sits beside it
(``gridgate demo --png``), and drawing that table again must show the same. A change to the
plot or to the report's table that is not followed by a new picture fails here; make one with
``.venv/bin/gridgate demo --duration 60 --png docs/demo-pilots-per-slot.png``."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from gridgate.core.commands.report import draw, hourly_table, plotted, read_plotted

DOCS = Path(__file__).resolve().parents[2] / "docs"
PNG = DOCS / "demo-pilots-per-slot.png"
TABLE = DOCS / "demo-pilots-per-slot.json"
REGENERATE = "make it again: .venv/bin/gridgate demo --duration 60 --png " + str(
    PNG.relative_to(DOCS.parent)
)


def table() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(TABLE.read_text(encoding="utf-8"))
    return doc


def series(panel: dict[str, Any]) -> dict[str, list[int]]:
    return {s["label"]: s["values"] for s in panel["series"]}


def test_the_picture_is_what_the_report_draws_today() -> None:
    shown = read_plotted(PNG)
    assert shown is not None, f"{PNG} carries no record of what it shows; {REGENERATE}"
    assert plotted(draw(table())) == shown, f"{PNG} is not what the report draws; {REGENERATE}"
    # the table is the one today's report makes: no field missing or left over
    assert set(table()) == set(hourly_table([])), f"the report's table changed; {REGENERATE}"


def test_the_comparison_sees_a_different_picture() -> None:
    """Not vacuous: one failure fewer, or one server's pilots moved, is another picture."""
    shown = read_plotted(PNG)
    fewer = table()
    slot = next(h for h, n in fewer["failures"].items() if n)
    sort = next(s for s, n in fewer["failures_by_sort"][slot].items() if n)
    fewer["failures_by_sort"][slot][sort] -= 1
    assert plotted(draw(fewer)) != shown
    moved = table()
    first = moved["hours"][0]
    moved["pilots"][first] = {e: n + 1 for e, n in moved["pilots"][first].items()}
    assert plotted(draw(moved)) != shown


def test_the_picture_shows_three_panels_and_the_aborting_server_leaving_rotation() -> None:
    data = PNG.read_bytes()
    assert struct.unpack(">II", data[16:24]) == (1100, 900)  # 11 x 9 in at 100 dpi
    shown = read_plotted(PNG)
    assert shown is not None
    submitted, finished, failures = shown["panels"]
    assert submitted["ylabel"] == "pilots submitted per 5 s"
    assert finished["ylabel"] == "pilots finished per 5 s"
    assert failures["ylabel"] == "failures"
    # wms04 takes pilots, then has none in slots where a healthy server has some: out of rotation
    wms04, wms01 = series(submitted)["wms04.example.org"], series(submitted)["wms01.example.org"]
    start = next(i for i, n in enumerate(wms04) if n)
    assert any(wms04[i] == 0 and wms01[i] > 0 for i in range(start + 1, len(wms04)))
    assert sum(series(failures)["aborted: a server's pilots abort"]) >= 1
    assert sum(series(finished)["failed"]) > 0


def test_the_failures_axis_has_whole_number_ticks() -> None:
    """Counts: a slot with one failure gets ticks 0 and 1, never 0.25 (matplotlib's default)."""
    one = table()
    for slot in one["hours"]:
        one["failures"][slot] = 0
        one["failures_by_sort"][slot] = {}
    one["failures_by_sort"][one["hours"][0]] = {"aborted": 1}
    one["trimmed"] = dict.fromkeys(one["hours"], 0)
    for fig in (draw(table()), draw(one)):
        ticks = fig.axes[-1].get_yticks()
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
