"""`gridgate demo`: the director against 11 simulated WMS servers of mixed health, with time
compressed from hours to seconds, ending with a per-server table. No config, no network."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import click
import yaml

from gridgate.core import hookimpl
from gridgate.core.config import load_config
from gridgate.core.director import ACCOUNTING, Director
from gridgate.core.model import IterationSummary, Notification
from gridgate.plugins.wms_glite.sim import install_commands, write_scenario

#: host -> (behaviour spec, what a person should expect of it)
FLEET: dict[str, tuple[dict[str, Any], str]] = {
    "wms01.example.org": ({"behaviour": "healthy", "latency": 0.2}, "healthy"),
    "wms02.example.org": ({"behaviour": "healthy", "latency": 0.3}, "healthy"),
    "wms03.example.org": ({"behaviour": "healthy", "latency": 0.4}, "healthy"),
    "wms04.example.org": ({"behaviour": "healthy", "latency": 0.25}, "healthy"),
    "wms05.example.org": ({"behaviour": "healthy", "latency": 1.5}, "slow"),
    "wms06.example.org": ({"behaviour": "overloaded", "latency": 0.2}, "overloaded"),
    "wms07.example.org": ({"behaviour": "drained", "latency": 0.1}, "drained"),
    "wms08.example.org": ({"behaviour": "hang_before_print"}, "hangs"),
    "wms09.example.org": ({"behaviour": "error", "latency": 0.2}, "failing"),
    "wms10.example.org": ({"behaviour": "flapping", "every": 4, "fail_as": "unreachable", "latency": 0.2},
                          "flapping"),
    "wms11.example.org": ({"behaviour": "slow_then_recover", "calls": 3, "fail_as": "print_then_hang",
                           "latency": 0.3}, "hangs, then recovers"),
}


class _Watch:
    """Collects notifications for the final table."""

    def __init__(self) -> None:
        self.notes: list[Notification] = []
        self.lock = threading.Lock()

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        with self.lock:
            self.notes.append(notification)


def build_site(folder: Path, duration: float) -> Path:
    """Write the stand-ins, the scenario and the site config into ``folder``."""
    bin_dir = install_commands(folder / "bin")
    scenario = write_scenario(folder / "scenario.json", {
        "state_dir": str(folder / "sim-state"),
        "calls_log": str(folder / "calls.jsonl"),
        "default": {"behaviour": "healthy", "hang": 600},
        "hosts": {host: spec for host, (spec, _) in FLEET.items()},
    })
    (folder / "sim-state").mkdir(exist_ok=True)
    config = {
        "director": {
            "cycle_seconds": 4, "max_threads": 16, "command_timeout": 3,
            "failing_expiry": 12, "ticket_expiry": 12, "state_dir": str(folder / "state"),
        },
        "state": {"driver": "sqlite", "path": str(folder / "state" / "state.db")},
        "backends": {"wms_glite": {
            "servers": list(FLEET),
            "commands": {"submit": str(bin_dir / "glite-wms-job-submit"),
                         "list_match": str(bin_dir / "glite-wms-job-list-match")},
            "list_match": False,
            "env": {"GRIDGATE_SIM_SCENARIO": str(scenario)},
            "vo": "demo",
        }},
        "demand": {"static": {"wms_glite": 40}},
        "notifiers": {"files": {"folder": str(folder / "notifications")}},
    }
    path = folder / "site.yaml"
    header = (f"# Written by `gridgate demo`: 11 simulated WMS servers, time compressed\n"
              f"# (failing cache {config['director']['failing_expiry']} s instead of 1 h). "
              f"Run for {duration:.0f} s.\n")
    path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def run_demo(folder: Path, duration: float, echo: Any = click.echo) -> dict[str, Any]:
    """Run the director for about ``duration`` seconds; return the figures shown."""
    config_path = build_site(folder, duration)
    config = load_config(config_path)
    watch = _Watch()
    director = Director(config, extra_plugins=[watch])
    started = time.monotonic()
    deadline = started + duration

    def progress(summary: IterationSummary) -> None:
        counts = Counter(r.outcome for r in summary.records)
        pilots = sum(r.pilots for r in summary.records if r.outcome == "submitted")
        excluded = ", ".join(k.split("/", 1)[1].split(".")[0] for k in summary.excluded) or "-"
        echo(f"  iteration {summary.number:>2}  {summary.duration:5.1f} s  submitted {pilots:>3}  "
             f"failed {counts['failed']:>2}  skipped {counts['skipped']:>2}  excluded now: {excluded}",
             err=True)
        if time.monotonic() >= deadline:
            director.stop()

    echo(f"gridgate demo: 11 simulated WMS servers, ~{duration:.0f} s, work folder {folder}", err=True)
    try:
        director.run(on_iteration=progress)
    finally:
        elapsed = time.monotonic() - started
        rows = director.state.records(ACCOUNTING)
        director.close()
    return summarise(rows, watch.notes, elapsed, folder)


def summarise(rows: list[dict[str, Any]], notes: list[Notification], elapsed: float, folder: Path) -> dict[str, Any]:
    per: dict[str, dict[str, Any]] = defaultdict(lambda: {"submitted": 0, "failures": Counter(), "errors": 0, "alarms": 0})
    for row in rows:
        host = row["endpoint"]
        if not host:
            continue
        if row["outcome"] == "submitted":
            per[host]["submitted"] += row["pilots"]
        elif row["outcome"] == "failed":
            per[host]["failures"][row["failure_kind"]] += 1
    for note in notes:
        if note.endpoint is not None:
            per[note.endpoint.name]["errors" if note.level == "error" else "alarms"] += 1
    pilots = sum(r["pilots"] for r in rows if r["outcome"] == "submitted")
    skipped = sum(1 for r in rows if r["outcome"] == "skipped")
    return {
        "servers": {host: {"expect": FLEET.get(host, ({}, "?"))[1], "submitted": v["submitted"],
                           "failures": dict(v["failures"]), "errors": v["errors"], "alarms": v["alarms"]}
                    for host, v in sorted(per.items())},
        "pilots": pilots,
        "skipped": skipped,
        "elapsed_s": round(elapsed, 1),
        "pilots_per_hour": round(pilots / elapsed * 3600) if elapsed > 0 else 0,
        "notifications": str(folder / "notifications"),
        "config": str(folder / "site.yaml"),
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        "",
        f"{'server':<20}{'behaves':<22}{'pilots':>7}  {'failures by kind':<34}{'errors':>7}{'alarms':>7}",
        "-" * 97,
    ]
    for host in FLEET:
        row = result["servers"].get(host, {"expect": FLEET[host][1], "submitted": 0, "failures": {}, "errors": 0, "alarms": 0})
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(row["failures"].items())) or "-"
        lines.append(f"{host:<20}{row['expect']:<22}{row['submitted']:>7}  {kinds:<34}{row['errors']:>7}{row['alarms']:>7}")
    lines += [
        "-" * 97,
        f"{result['pilots']} pilots in {result['elapsed_s']} s = {result['pilots_per_hour']} pilots/hour "
        f"(the seed's bar: > 1000/hour from 11 servers); {result['skipped']} submissions skipped "
        "because every server was excluded at that moment",
        f"error and alarm texts: {result['notifications']}",
        f"site config used:      {result['config']}",
        "",
    ]
    return "\n".join(lines)


@click.command("demo")
@click.option("--duration", default=60.0, show_default=True, help="Seconds to run the director.")
@click.option("--dir", "folder", type=click.Path(file_okay=False), help="Work folder (default: a new temporary one).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def demo_command(duration: float, folder: str | None, as_json: bool) -> None:
    """Run the director against 11 simulated WMS servers (no config, no network)."""
    work = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="gridgate-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    result = run_demo(work.resolve(), duration)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(render(result))
    sys.stdout.flush()
