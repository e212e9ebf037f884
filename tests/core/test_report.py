"""`gridgate report`: the pilots-per-hour table and the PNG plot from an accounting table."""

from __future__ import annotations

import random
import struct

import pytest
from click.testing import CliRunner

from gridgate.core.cli import cli
from gridgate.core.director import ACCOUNTING
from gridgate.core.report import hourly_table, parse_duration, plot_png, render_table
from gridgate.core.state import SqliteState

T0 = 1_780_000_000.0 - (1_780_000_000.0 % 3600)


def generated_rows(hours: int = 24, servers: int = 11, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for h in range(hours):
        for s in range(servers):
            for _ in range(rng.randrange(0, 20)):
                outcome = "failed" if rng.random() < 0.1 else "submitted"
                rows.append(
                    {
                        "time": T0 + h * 3600 + rng.random() * 3599,
                        "backend": "wms_glite",
                        "endpoint": f"wms{s + 1:02d}.example.org",
                        "outcome": outcome,
                        "pilots": 1,
                        "failure_kind": "error" if outcome == "failed" else "",
                    }
                )
    return rows


def test_hourly_table_counts_pilots_per_hour_per_endpoint() -> None:
    rows = generated_rows()
    table = hourly_table(rows)
    assert len(table["hours"]) == 24
    total = sum(sum(v.values()) for v in table["pilots"].values())
    assert total == sum(1 for r in rows if r["outcome"] == "submitted")
    assert sum(table["failures"].values()) == sum(1 for r in rows if r["outcome"] == "failed")
    text = render_table(table)
    assert "wms11.example.org" in text and len(text.splitlines()) > 24


def test_parse_duration() -> None:
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("90m") == 5400
    assert parse_duration("30") == 30
    with pytest.raises(ValueError):
        parse_duration("a week")


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plot_png_renders_a_real_image(tmp_path) -> None:
    path = tmp_path / "pilots.png"
    plot_png(generated_rows(), str(path))
    width, height = png_size(path)
    assert (width, height) == (1100, 700)
    assert path.stat().st_size > 20_000  # bars, legend and labels, not an empty canvas


def test_report_command_reads_the_state_database(tmp_path) -> None:
    db = tmp_path / "state.db"
    store = SqliteState({"path": str(db)})
    rows = generated_rows(hours=3)
    for row in rows:
        store.append_record(ACCOUNTING, row)
    store.close()
    config = tmp_path / "site.yaml"
    config.write_text(f"state: {{driver: sqlite, path: {db}}}\n", encoding="utf-8")
    result = CliRunner().invoke(
        cli,
        [
            "report",
            "-c",
            str(config),
            "--since",
            "100000d",
            "--json",
            "--png",
            str(tmp_path / "r.png"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.png").stat().st_size > 10_000


def test_report_shows_pilots_by_state_and_trimmed_demand(tmp_path) -> None:
    from gridgate.core.pilots import Pilot

    db = tmp_path / "state.db"
    store = SqliteState({"path": str(db)})
    rows = generated_rows(hours=3)
    rows.append(
        {
            "time": T0 + 100,
            "backend": "wms_glite",
            "endpoint": "",
            "outcome": "skipped",
            "pilots": 17,
            "failure_kind": "max_waiting",
        }
    )
    for row in rows:
        store.append_record(ACCOUNTING, row)
    ended = [
        Pilot(
            f"j{i}",
            "wms_glite",
            "wms01.example.org",
            submitted=T0,
            changed=T0 + 3600 + i,
            state="failed" if i % 4 == 0 else "done",
            native="Aborted" if i % 4 == 0 else "Done",
        )
        for i in range(40)
    ]
    waiting = [
        Pilot(f"w{i}", "wms_glite", "wms02.example.org", submitted=T0, changed=T0) for i in range(5)
    ]
    store.pilot_registry().put(ended + waiting)
    store.close()
    config = tmp_path / "site.yaml"
    config.write_text(f"state: {{driver: sqlite, path: {db}}}\n", encoding="utf-8")
    doc = CliRunner().invoke(cli, ["report", "-c", str(config), "--since", "100000d", "--json"])
    assert doc.exit_code == 0, doc.output
    table = __import__("json").loads(doc.output)
    assert sum(table["trimmed"].values()) == 17
    (slot,) = table["finished"]
    assert table["finished"][slot] == {"done": 30, "failed": 10}
    assert table["pilots_now"]["wms_glite/wms02.example.org"]["waiting"] == 5
    text = CliRunner().invoke(
        cli, ["report", "-c", str(config), "--since", "100000d", "--png", str(tmp_path / "r.png")]
    )
    assert "demand trimmed by max_waiting / max_total" in text.output
    finished = text.output.split("pilots finished per slot, by state:")[1].splitlines()
    assert finished[1].split() == ["from", "(UTC)", "done", "failed"]
    assert finished[2].split()[-2:] == ["30", "10"]
    assert "wms_glite/wms02.example.org" in text.output.split("pilots now")[1]
    assert png_size(tmp_path / "r.png") == (1100, 900)  # the panel of finished pilots is drawn
