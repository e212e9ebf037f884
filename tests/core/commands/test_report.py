"""`gridgate report`: the pilots-per-hour table and the PNG plot from the accounting and failures
tables and the pilot registry; what it says without matplotlib."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gridgate.core.commands.app import cli
from gridgate.core.commands.report import (
    draw,
    hourly_table,
    parse_duration,
    plot_png,
    plotted,
    read_plotted,
    render_table,
    save_png,
)
from gridgate.core.engine.runtime import ACCOUNTING
from gridgate.core.stores.sqlite import SqliteState

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
    from gridgate.core.state import Pilot

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
    assert (
        "demand not submitted, pilots per slot by cause" in text.output
        and "max_waiting" in text.output
    )
    finished = text.output.split("pilots finished per slot, by state:")[1].splitlines()
    assert finished[1].split() == ["from", "(UTC)", "done", "failed"]
    assert finished[2].split()[-2:] == ["30", "10"]
    assert "wms_glite/wms02.example.org" in text.output.split("pilots now")[1]
    # the panel of finished pilots is drawn, and the one of skipped pilots (17 trimmed)
    assert png_size(tmp_path / "r.png") == (1100, 1100)


# --- the plot without matplotlib -------------------------------------------------------------

#: Runs the gridgate command line in a Python that cannot import matplotlib, as one installed
#: without the plot extra: a meta path finder refuses the package before any other finder looks.
WITHOUT_MATPLOTLIB = """
import sys


class NoMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoMatplotlib())
if sys.argv[1:] == ["--probe"]:
    import matplotlib  # noqa: F401  (the block itself is checked: this must fail)
else:
    from gridgate.core.commands.launch import main

    sys.argv[0] = "gridgate"
    main()
"""


def without_matplotlib(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8"},
    )


def store_with_rows(tmp_path) -> Path:
    db = tmp_path / "state.db"
    store = SqliteState({"path": str(db)})
    for row in generated_rows(hours=2):
        store.append_record(ACCOUNTING, row)
    store.close()
    config = tmp_path / "site.yaml"
    config.write_text(f"state: {{driver: sqlite, path: {db}}}\n", encoding="utf-8")
    return config


def test_report_png_without_matplotlib_names_the_plot_extra(tmp_path) -> None:
    probe = without_matplotlib("--probe", cwd=tmp_path)
    assert probe.returncode == 1 and "ModuleNotFoundError: No module named 'matplotlib'" in (
        probe.stderr
    ), probe.stderr  # the Python below really has no matplotlib
    config = store_with_rows(tmp_path)
    png = tmp_path / "pilots.png"
    done = without_matplotlib(
        "report", "-c", str(config), "--since", "100000d", "--png", str(png), cwd=tmp_path
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("Error: the plot needs matplotlib"), done.stderr
    assert "pip install 'gridgate[plot]'" in done.stderr
    assert done.stdout == "" and not png.exists()  # said before anything was printed or drawn
    # the table alone needs no matplotlib
    table = without_matplotlib("report", "-c", str(config), "--since", "100000d", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "wms01.example.org" in table.stdout


def test_demo_png_without_matplotlib_says_so_before_running(tmp_path) -> None:
    done = without_matplotlib(
        "demo", "--dir", str(tmp_path / "demo"), "--png", str(tmp_path / "d.png"), cwd=tmp_path
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "pip install 'gridgate[plot]'" in done.stderr
    assert not (tmp_path / "demo").exists()  # nothing was started


# --- failures: submissions, status polls, aborted --------------------------------------------


def test_hourly_table_counts_failure_rows_with_failed_submissions() -> None:
    rows = [
        {"time": T0 + 1, "endpoint": "a", "outcome": "submitted", "pilots": 3},
        {"time": T0 + 2, "endpoint": "b", "outcome": "failed", "failure_kind": "timeout"},
    ]
    failures = [
        {"time": T0 + 3, "endpoint": "c", "kind": "aborted"},
        {"time": T0 + 3600, "endpoint": "b", "kind": "unreachable"},
    ]
    table = hourly_table(rows, failures=failures)
    first, second = table["hours"]
    assert table["failures"] == {first: 2, second: 1}
    assert table["failures_by_sort"][first] == {"submission": 1, "poll": 0, "aborted": 1}
    assert table["failures_by_sort"][second] == {"submission": 0, "poll": 1, "aborted": 0}
    assert table["failure_kinds"] == {
        "b": {"timeout": 1, "unreachable": 1},
        "c": {"aborted": 1},
    }
    text = render_table(table)
    assert "c                              nothing submitted; failures by kind: aborted 1" in text


GOOD, ABORTS, LB_DOWN = "wms01.example.org", "wms02.example.org", "wms03.example.org"


def test_report_of_a_director_whose_servers_abort_and_fail_polls(tmp_path) -> None:
    """A real director against the gLite stand-ins (real processes, a real sqlite store): one
    server's pilots all abort, one server's bookkeeping server is down (its status polls fail).
    Neither fails a submission; the report counts both, by kind, and draws them."""
    from gridgate.core.clock import FakeClock
    from gridgate.core.engine.director import Director
    from gridgate.core.testing import make_config
    from gridgate.plugins.wms_glite.sim import commands_section, install_commands, write_scenario
    from gridgate.plugins.wms_glite.sim.jobs import set_clock

    clock_file = tmp_path / "simclock"
    set_clock(clock_file, T0)
    scenario = write_scenario(
        tmp_path / "scenario.json",
        {
            "state_dir": str(tmp_path / "simstate"),
            "calls_log": str(tmp_path / "calls.jsonl"),
            "clock_file": str(clock_file),
            "default": {"behaviour": "healthy"},
            "hosts": {
                GOOD: {"pilots": {"outcome": "done"}},
                ABORTS: {"pilots": {"outcome": "aborted"}},
                LB_DOWN: {"pilots": {"outcome": "done", "status": "lb_down"}},
            },
        },
    )
    bin_dir = install_commands(tmp_path / "bin")
    db = tmp_path / "state" / "state.db"
    doc = {
        "director": {
            "cycle_seconds": 1,
            "max_threads": 4,
            "command_timeout": 20,
            "state_dir": str(tmp_path / "state"),
            "pilots": {"abort_min_finished": 5},
        },
        "state": {"driver": "sqlite", "path": str(db)},
        "backends": {
            "wms_glite": {
                "servers": [GOOD, ABORTS, LB_DOWN],
                "commands": commands_section(bin_dir),
                "list_match": False,
                "work_dir": str(tmp_path),
                "env": {"GRIDGATE_SIM_SCENARIO": str(scenario)},
            }
        },
        "demand": {"static": {"wms_glite": 30}},
        "selectors": {"round_robin": {}},
    }
    clock = FakeClock(T0)
    director = Director(make_config(doc), clock=clock)
    try:
        first = director.run_iteration()
        clock.advance(10)  # the aborting server's pilots have aborted, the others run
        set_clock(clock_file, clock.time())
        second = director.run_iteration()
    finally:
        director.close()
    assert "failed" not in {r.outcome for r in (*first.records, *second.records)}
    kinds = {(f.endpoint, f.kind) for f in second.failures}
    assert (ABORTS, "aborted") in kinds and any(e == LB_DOWN for e, _ in kinds), kinds
    poll_kind = next(k for e, k in kinds if e == LB_DOWN)

    config = tmp_path / "site.yaml"
    config.write_text(f"state: {{driver: sqlite, path: {db}}}\n", encoding="utf-8")
    doc_out = CliRunner().invoke(cli, ["report", "-c", str(config), "--since", "100000d", "--json"])
    assert doc_out.exit_code == 0, doc_out.output
    table = json.loads(doc_out.output)
    assert sum(table["failures"].values()) == 2
    (slot,) = [h for h, n in table["failures"].items() if n]
    assert table["failures_by_sort"][slot] == {"submission": 0, "poll": 1, "aborted": 1}
    assert table["failure_kinds"] == {ABORTS: {"aborted": 1}, LB_DOWN: {poll_kind: 1}}
    png = tmp_path / "r.png"
    text = CliRunner().invoke(
        cli, ["report", "-c", str(config), "--since", "100000d", "--png", str(png)]
    )
    assert text.exit_code == 0, text.output
    assert f"{ABORTS:<30} submitted 10 pilots; failures by kind: aborted 1" in text.output
    assert f"{LB_DOWN:<30} submitted 10 pilots; failures by kind: {poll_kind} 1" in text.output
    shown = read_plotted(png)
    assert shown is not None
    (failures_panel,) = [p for p in shown["panels"] if p["ylabel"] == "failures"]
    drawn = {s["label"]: sum(s["values"]) for s in failures_panel["series"]}
    assert drawn == {
        "failed submissions": 0,
        "failed status polls or cancels": 1,
        "aborted: a server's pilots abort": 1,
    }


# --- the picture carries what it shows ----------------------------------------------------------


def test_a_png_carries_what_it_plots(tmp_path) -> None:
    table = hourly_table(generated_rows(hours=3), failures=[{"time": T0 + 5, "kind": "aborted"}])
    fig = draw(table)
    path = tmp_path / "p.png"
    save_png(fig, path)
    assert read_plotted(path) == json.loads(json.dumps(plotted(fig)))
    bottom = fig.axes[-1]
    assert [t for t in bottom.get_yticks() if not float(t).is_integer()] == []
    other = tmp_path / "q.png"
    fig.savefig(other)  # no text chunk of ours
    assert read_plotted(other) is None
    # a different report draws differently (the comparison the docs' picture test makes)
    assert plotted(draw(hourly_table(generated_rows(hours=3)))) != plotted(fig)


def test_the_plot_draws_skips_by_cause_apart_from_failures() -> None:
    """Issue 42: the failures panel was mostly normal max_waiting trims, and an outage's
    no_endpoint skips were not drawn at all. Failures are failures alone; the skipped pilots
    have a panel of their own, by cause, a full limit in grey."""
    rows = [
        {"time": T0 + 10, "backend": "arc", "endpoint": "", "outcome": "skipped",
         "pilots": 5, "failure_kind": "max_waiting"},
        {"time": T0 + 20, "backend": "arc", "endpoint": "", "outcome": "skipped",
         "pilots": 3, "failure_kind": "no_endpoint"},
        {"time": T0 + 30, "backend": "arc", "endpoint": "ce1", "outcome": "submitted",
         "pilots": 2, "job_ids": ["a", "b"]},
    ]  # fmt: skip
    shown = plotted(draw(hourly_table(rows)))
    labels = [p["ylabel"] for p in shown["panels"]]
    assert labels[-2:] == ["failures", "pilots skipped"], labels
    failures, skips = shown["panels"][-2:]
    assert {s["label"] for s in failures["series"]} == {"failed submissions"}
    assert {s["label"]: sum(s["values"]) for s in skips["series"]} == {
        "max_waiting": 5,
        "no_endpoint": 3,
    }


# --- skips by cause, episodes, empty slots (issue 32, item 9) ------------------------------------


def test_report_shows_skips_by_cause_credential_and_availability_episodes_and_empty_slots(
    tmp_path: Path,
) -> None:
    """Three iterations 30 minutes apart on a real sqlite store: the first submits, the second
    has an unusable credential (its pilots skipped, cause credential) and one endpoint in an
    operator ban, the third is fine again; `gridgate report --bucket 10m` shows the empty
    slots between them, the skips by cause, and a row for each episode with its start and end."""
    import dataclasses

    import yaml
    from support.director import BACKEND, ScriptedBackend

    from gridgate.core import hookimpl
    from gridgate.core.builtin.bans import OperatorBans
    from gridgate.core.clock import FakeClock
    from gridgate.core.config import load_config
    from gridgate.core.engine.director import Director
    from gridgate.core.model import BackendInfo, CredentialStatus
    from gridgate.core.stores.sqlite import SqliteState

    class NeedsProxy(ScriptedBackend):
        @hookimpl
        def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
            info = super().gridgate_backend_info(backend=backend)
            return None if info is None else dataclasses.replace(info, credentials=("x509",))

    class Proxy:
        usable = True

        @hookimpl
        def gridgate_check_credentials(self, iteration, timeout, credentials) -> None:
            credentials.add(
                CredentialStatus(
                    name="x509_proxy",
                    kind="x509",
                    usable=self.usable,
                    path="/var/lib/gridgate/proxy.pem",
                    expires=None,
                    message="proxy ok" if self.usable else "proxy expired at 10:00",
                )
            )

    db = tmp_path / "state.db"
    config = tmp_path / "site.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "director": {"state_dir": str(tmp_path / "state"), "command_timeout": 5},
                "state": {"driver": "sqlite", "path": str(db)},
                "demand": {"static": {BACKEND: 2}},
            }
        )
    )
    clock = FakeClock(start=time.time() - 3 * 3600)
    proxy = Proxy()
    store = SqliteState({"path": str(db)}, clock=clock)
    director = Director(
        load_config(config),
        clock=clock,
        state=store,
        extra_plugins=[NeedsProxy(2, {"s0": "fake-ok", "s1": "fake-ok"}), proxy],
    )
    try:
        director.run_iteration()
        clock.advance(1800)
        proxy.usable = False
        OperatorBans(store).ban(f"{BACKEND}/s1", who="alice", why="upgrade", duration=900)
        director.run_iteration()
        clock.advance(1800)
        proxy.usable = True
        director.run_iteration()
    finally:
        director.close()
    doc = CliRunner().invoke(
        cli, ["report", "-c", str(config), "--since", "4h", "--bucket", "10m", "--json"]
    )
    assert doc.exit_code == 0, doc.output
    table = json.loads(doc.output)
    assert len(table["hours"]) >= 19  # every 10-minute slot from --since to now, empty or not
    assert sum(1 for h in table["hours"] if table["pilots"].get(h)) == 2
    assert table["skipped_by_cause"] == {"credential": 2}
    episodes = {(e["what"], e["state"]): e for e in table["episodes"]}
    credential = episodes[("credential", "unusable")]
    assert credential["end"] - credential["start"] == pytest.approx(1800, abs=1)
    assert "proxy expired" in credential["reason"]
    banned = episodes[("availability", "banned")]
    assert banned["subject"] == f"{BACKEND}/s1" and banned["end"] is not None
    text = CliRunner().invoke(
        cli, ["report", "-c", str(config), "--since", "4h", "--bucket", "10m"]
    )
    assert "demand not submitted, pilots per slot by cause" in text.output
    assert (
        "credential" in text.output and "x509 /var/lib/gridgate/proxy.pem: unusable" in text.output
    )
    assert f"{BACKEND}/s1: banned (operator:alice)" in text.output
    assert (
        "(no endpoint chosen)" in text.output and "skipped 2 pilots (credential 2)" in text.output
    )


def history(seed: int = 11) -> tuple[list[dict], list[dict], list]:
    """Accounting rows of every outcome, failure rows and finished pilots over 5 hours."""
    from gridgate.core.state import Pilot

    rng = random.Random(seed)
    rows, failures, pilots = [], [], []
    for i in range(1500):
        when = T0 + rng.random() * 5 * 3600
        outcome = rng.choice(["submitted", "submitted", "failed", "skipped"])
        kind = {
            "failed": rng.choice(["error", "timeout"]),
            "skipped": rng.choice(["max_waiting", "credential"]),
        }
        rows.append(
            {
                "time": when,
                "endpoint": rng.choice([f"ce{n}" for n in range(4)] + [None]),
                "outcome": outcome,
                "pilots": rng.randrange(1, 6),
                "failure_kind": kind.get(outcome, ""),
                "n": i,  # every row its own, as real rows are
            }
        )
    for i in range(300):
        failures.append(
            {
                "time": T0 + rng.random() * 5 * 3600,
                "endpoint": f"ce{i % 4}",
                "kind": rng.choice(["poll", "aborted"]),
            }
        )
    for i in range(800):
        changed = T0 + rng.random() * 5 * 3600
        state = rng.choice(["done", "failed", "lost", "running", "waiting"])
        pilots.append(Pilot(f"j{i}", "b", f"ce{i % 4}", "g", changed - 60, state, changed))
    return rows, failures, pilots


@pytest.mark.parametrize("driver", ["sqlite", "redis", "postgresql"])
def test_a_report_counted_in_the_store_is_the_report_counted_from_every_row(
    driver, tmp_path, request
) -> None:
    """`gridgate report` asks the store to count the history per slot (a SQL store counts in the
    database: a year of a large VO's pilots is a few thousand rows to read, not millions); its
    table is the one counted from every row and every pilot, on every driver, and
    `gridgate report` on that store prints it."""
    import uuid

    from gridgate.core.commands.report import read_report
    from gridgate.core.engine.runtime import FAILURES
    from gridgate.core.engine.tracking import state_counts
    from gridgate.core.state import open_state

    if driver == "sqlite":
        section = f"{{driver: sqlite, path: {tmp_path / 'state.db'}}}"
    elif driver == "redis":
        server = request.getfixturevalue("redis_server")
        section = f"{{driver: redis, url: '{server.url}', prefix: 'r{uuid.uuid4().hex}:'}}"
    else:
        section = json.dumps(
            request.getfixturevalue("postgres_server").state_section(tmp_path)
        )  # JSON is YAML
    config = tmp_path / "site.yaml"
    config.write_text(f"state: {section}\n", encoding="utf-8")
    import yaml

    store = open_state(yaml.safe_load(config.read_text()))
    rows, failures, pilots = history()
    try:
        for row in rows:
            store.append_record(ACCOUNTING, row)
        for row in failures:
            store.append_record(FAILURES, row)
        registry = store.pilot_registry()
        registry.put(pilots)
        finished = [p for p in pilots if p.terminal]
        now = state_counts(registry.counts())
        for width in (600.0, 3600.0):
            expected = hourly_table(rows, width, finished, now, failures)
            data = read_report(store, 0.0, width)
            keys = {
                (r["time"] // width, r["endpoint"], r["outcome"], r["pilots"], r["failure_kind"])
                for r in rows
            }
            assert len(data.rows) == len(keys) < len(rows)  # groups, not row by row
            assert sum(g.count for g in data.rows) == len(rows)
            assert data.table() == expected
        assert read_report(store, 0.0, 600).table(3600) == expected  # a multiple of the slots
        with pytest.raises(ValueError, match="whole number"):
            read_report(store, 0.0, 600).table(900)
    finally:
        store.close()
    result = CliRunner().invoke(cli, ["report", "-c", str(config), "--since", "100000d", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["totals"] == expected["totals"] and shown["pilots_now"] == expected["pilots_now"]
    assert {h: v for h, v in shown["finished"].items()} == expected["finished"]
