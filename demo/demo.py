"""`gridgate demo`: the director against 11 simulated WMS servers of mixed health, with time
compressed from hours to seconds, its submissions behind token admission, ending with a
per-server table. No config; no network beyond loopback.

Admission (``--admission``): ``remote`` (the default) starts a token daemon (``gridgate lsfproxyd
serve``) on a private socket and a loopback TCP port, and every submission takes a token from
it first, signed as the service account ``demo-director`` (the demo runs as whoever starts it,
often root, whom the daemon never limits); ``local`` runs the same policy in-process, per server;
``none`` submits without admission.

``--png FILE`` ends with the report of the run (``gridgate report --bucket 5s``) drawn to FILE,
and what it was drawn from beside it (FILE with ``.json``): docs/demo-pilots-per-slot.png is
made so, and a test draws it again from its JSON (tests/demo/test_demo_picture.py)."""

from __future__ import annotations

import json
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import click
import yaml

from gridgate.core import hookimpl
from gridgate.core.commands.report import ReportData, draw, plot_unavailable, read_report, save_png
from gridgate.core.config import load_config
from gridgate.core.engine.director import Director
from gridgate.core.engine.runtime import ACCOUNTING, FAILURES
from gridgate.core.model import IterationSummary, Notification
from gridgate.core.testing import free_port
from gridgate.demo.pilots import (
    DIRECTOR_PILOTS,
    aborted_lines,
    left_rotation,
    pilots_spec,
    render_pilots,
    scenario_of,
    stand_in_states,
    tracked_states,
)
from gridgate.plugins.wms_glite.sim import install_commands, write_scenario

#: The director's threads and the token daemon's limits on submissions: fewer tokens than
#: threads, so submissions wait their turn.
MAX_THREADS = 16
SUBMISSION_MAX, SUBMISSION_NOMINAL, THROTTLE_MS = 8, 4, 20
REMOTE_POLICY = (
    f"SUBMISSION[max={SUBMISSION_MAX} nominal={SUBMISSION_NOMINAL} throttle={THROTTLE_MS}]"
)
#: Seconds a submission waits for a token before it is refused.
TOKEN_WAIT = 15
#: Seconds a failed server stays out of rotation (a site: an hour): time compressed.
FAILING_EXPIRY = 12
LOCAL_MAX = 2
#: The slot of the demo's plot: the run lasts about a minute.
PLOT_BUCKET = 5.0

#: host -> (behaviour spec, what a person should expect of it)
FLEET: dict[str, tuple[dict[str, Any], str]] = {
    "wms01.example.org": ({"behaviour": "healthy", "latency": 0.2}, "healthy"),
    "wms02.example.org": ({"behaviour": "healthy", "latency": 0.3}, "healthy"),
    "wms03.example.org": ({"behaviour": "healthy", "latency": 0.4}, "healthy"),
    "wms04.example.org": ({"behaviour": "healthy", "latency": 0.25}, "pilots abort"),
    "wms05.example.org": ({"behaviour": "healthy", "latency": 1.5}, "slow"),
    "wms06.example.org": ({"behaviour": "overloaded", "latency": 0.2}, "overloaded"),
    "wms07.example.org": ({"behaviour": "drained", "latency": 0.1}, "drained"),
    "wms08.example.org": ({"behaviour": "hang_before_print"}, "hangs"),
    "wms09.example.org": ({"behaviour": "error", "latency": 0.2}, "failing"),
    "wms10.example.org": (
        {"behaviour": "flapping", "every": 4, "fail_as": "unreachable", "latency": 0.2},
        "flapping",
    ),
    "wms11.example.org": (
        {
            "behaviour": "slow_then_recover",
            "calls": 3,
            "fail_as": "print_then_hang",
            "latency": 0.3,
        },
        "hangs, then recovers",
    ),
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


def start_token_daemon(folder: Path) -> tuple[Any, dict[str, Any]]:
    """Start a token daemon for the demo; return it and the ``proxyd:`` section clients use."""
    from gridgate.plugins.lsf_proxy.sim import start_proxyd

    key = folder / "proxyd.key"
    key.write_text(secrets.token_hex(16) + "\n", encoding="utf-8")
    key.chmod(0o600)
    address = f"127.0.0.1:{free_port()}"
    daemon = start_proxyd(
        folder,
        {
            "policies": REMOTE_POLICY,
            "token_wait_time": TOKEN_WAIT,
            "tcp": address,
            "key": {"file": str(key)},
        },
    )
    return daemon, {
        "hosts": [{"name": "demo-proxyd", "address": address}],
        "key": {"file": str(key)},
    }


def build_site(
    folder: Path, duration: float, admission: str = "none", proxyd: dict[str, Any] | None = None
) -> Path:
    """Write the stand-ins, the scenario and the site config into ``folder``."""
    bin_dir = install_commands(folder / "bin")
    scenario = write_scenario(
        folder / "scenario.json",
        {
            "state_dir": str(folder / "sim-state"),
            "calls_log": str(folder / "calls.jsonl"),
            "default": {"behaviour": "healthy", "hang": 600},
            "hosts": {
                host: {**spec, "pilots": pilots_spec(host)} for host, (spec, _) in FLEET.items()
            },
        },
    )
    (folder / "sim-state").mkdir(exist_ok=True)
    config: dict[str, Any] = {
        "director": {
            "cycle_seconds": 4,
            "max_threads": MAX_THREADS,
            "command_timeout": 3,
            "failing_expiry": FAILING_EXPIRY,
            "ticket_expiry": FAILING_EXPIRY,
            "state_dir": str(folder / "state"),
            "pilots": DIRECTOR_PILOTS,
        },
        "state": {"driver": "sqlite", "path": str(folder / "state" / "state.db")},
        "backends": {
            "wms_glite": {
                "servers": list(FLEET),
                "commands": {
                    "submit": str(bin_dir / "glite-wms-job-submit"),
                    "list_match": str(bin_dir / "glite-wms-job-list-match"),
                    "status": str(bin_dir / "glite-wms-job-status"),
                    "cancel": str(bin_dir / "glite-wms-job-cancel"),
                },
                "list_match": False,
                "env": {"GRIDGATE_SIM_SCENARIO": str(scenario)},
                "vo": "demo",
            }
        },
        "demand": {"static": {"wms_glite": 40}},
        # A site keeps the seed's uniform random choice (the default). The demo goes round-robin
        # so that every one of its eleven behaviours is met in the first iteration, whatever the
        # duration: with random choice a short run could miss the failing server altogether.
        "selectors": {"round_robin": {}},
        "notifiers": {"files": {"folder": str(folder / "notifications")}},
    }
    if admission == "remote":
        config["proxyd"] = dict(proxyd or {})
        config["admission"] = {
            "lsf_proxy": {"mode": "remote", "user": "demo-director", "notoken_ntries": 1}
        }
    elif admission == "local":
        config["admission"] = {"lsf_proxy": {"mode": "local", "max": LOCAL_MAX}}
    path = folder / "site.yaml"
    header = (
        f"# Written by `gridgate demo`: 11 simulated WMS servers, time compressed\n"
        f"# (failing cache {config['director']['failing_expiry']} s instead of 1 h). "
        f"Run for {duration:.0f} s.\n"
    )
    path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def run_demo(
    folder: Path,
    duration: float,
    echo: Any = click.echo,
    admission: str = "remote",
    png: Path | None = None,
) -> dict[str, Any]:
    """Run the director for about ``duration`` seconds; return the figures shown. With ``png``,
    draw the run's report there and write its data beside it (:func:`write_picture`)."""
    daemon, proxyd = start_token_daemon(folder) if admission == "remote" else (None, None)
    try:
        return _run(folder, duration, echo, admission, proxyd, daemon, png)
    finally:
        if daemon is not None:
            daemon.stop()


def _admission_figures(mode: str, plugin: Any, daemon: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"mode": mode, "servers": {}}
    if mode == "remote":
        out.update(policy=REMOTE_POLICY, daemon=daemon.info["socket"])
    elif mode == "local":
        out["max_per_server"] = LOCAL_MAX
    if plugin is None:
        return out
    for key, stats in plugin.stats().items():
        out["servers"][key.split("/", 1)[-1]] = {
            "granted": stats.granted,
            "waited": stats.waited,
            "wait_s": round(stats.wait_seconds, 1),
            "refused": stats.refused,
        }
    return out


def _run(
    folder: Path,
    duration: float,
    echo: Any,
    admission: str,
    proxyd: dict[str, Any] | None,
    daemon: Any,
    png: Path | None = None,
) -> dict[str, Any]:
    config_path = build_site(folder, duration, admission, proxyd)
    config = load_config(config_path)
    watch = _Watch()
    director = Director(config, extra_plugins=[watch])
    started = time.monotonic()
    deadline = started + duration

    def progress(summary: IterationSummary) -> None:
        counts = Counter(r.outcome for r in summary.records)
        pilots = sum(r.pilots for r in summary.records if r.outcome == "submitted")
        excluded = ", ".join(k.split("/", 1)[1].split(".")[0] for k in summary.excluded) or "-"
        echo(
            f"  iteration {summary.number:>2}  {summary.duration:5.1f} s  submitted {pilots:>3}  "
            f"failed {counts['failed']:>2}  skipped {counts['skipped']:>2}  excluded now: {excluded}",
            err=True,
        )
        for line in aborted_lines(summary):
            echo(line, err=True)
        if time.monotonic() >= deadline:
            director.stop()

    behind = {
        "remote": f"a token daemon ({REMOTE_POLICY})",
        "local": f"in-process tokens (max {LOCAL_MAX} per server)",
        "none": "no admission",
    }
    echo(
        f"gridgate demo: 11 simulated WMS servers, ~{duration:.0f} s, submissions behind "
        f"{behind[admission]}, work folder {folder}",
        err=True,
    )
    try:
        director.run(on_iteration=progress)
    finally:
        elapsed = time.monotonic() - started
        rows = director.state.records(ACCOUNTING)
        failed = director.state.records(FAILURES)
        tracked = tracked_states(director)
        report = read_report(director.state, 0.0, PLOT_BUCKET) if png is not None else None
        figures = _admission_figures(
            admission, director.pm.get_plugin("admission:lsf_proxy"), daemon
        )
        director.close()
    result = summarise(rows, watch.notes, elapsed, folder, failed)
    if report is not None and png is not None:
        result["picture"] = str(write_picture(report, png))
    result["pilot_states"] = tracked
    result["stand_in_states"] = stand_in_states(scenario_of(folder))
    result["left_rotation"] = left_rotation(watch.notes)
    result["admission"] = figures
    result["refused"] = sum(1 for r in rows if r["outcome"] == "refused")
    return result


def write_picture(data: ReportData, png: Path) -> Path:
    """Draw the report of ``data`` (slots of :data:`PLOT_BUCKET`) to ``png``, and write its
    table beside it (``png`` with ``.json``, what ``gridgate report --json`` prints), from which
    the picture can be drawn again."""
    png.parent.mkdir(parents=True, exist_ok=True)
    table = data.table(PLOT_BUCKET)
    save_png(draw(table), png)
    png.with_suffix(".json").write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return png


def summarise(
    rows: list[dict[str, Any]],
    notes: list[Notification],
    elapsed: float,
    folder: Path,
    failed: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The figures of a run: per server its pilots, its failures by kind (of submissions, from
    ``rows``, the accounting table; of status polls and ``aborted``, from ``failed``, the
    failures table), its failed submissions, errors and alarms."""

    def blank() -> dict[str, Any]:
        return {
            "submitted": 0,
            "failures": Counter(),
            "failed_submissions": 0,
            "errors": 0,
            "alarms": 0,
        }

    # a server the run never reached still gets its row, with zeros
    per: dict[str, dict[str, Any]] = defaultdict(blank, {host: blank() for host in FLEET})
    for row in rows:
        host = row["endpoint"]
        if not host:
            continue
        if row["outcome"] == "submitted":
            per[host]["submitted"] += row["pilots"]
        elif row["outcome"] == "failed":
            per[host]["failures"][row["failure_kind"]] += 1
            per[host]["failed_submissions"] += 1
    for failure in failed:
        if failure.get("endpoint"):
            per[failure["endpoint"]]["failures"][failure["kind"]] += 1
    for note in notes:
        if note.endpoint is not None:
            per[note.endpoint.name]["errors" if note.level == "error" else "alarms"] += 1
    pilots = sum(r["pilots"] for r in rows if r["outcome"] == "submitted")
    skipped = sum(1 for r in rows if r["outcome"] == "skipped")
    return {
        "servers": {
            host: {
                "expect": FLEET.get(host, ({}, "?"))[1],
                "submitted": v["submitted"],
                "failures": dict(v["failures"]),
                "failed_submissions": v["failed_submissions"],
                "errors": v["errors"],
                "alarms": v["alarms"],
            }
            for host, v in sorted(per.items())
        },
        "pilots": pilots,
        "skipped": skipped,
        "elapsed_s": round(elapsed, 1),
        "pilots_per_hour": round(pilots / elapsed * 3600) if elapsed > 0 else 0,
        "notifications": str(folder / "notifications"),
        "config": str(folder / "site.yaml"),
    }


def render(result: dict[str, Any]) -> str:
    admission = result.get("admission") or {"mode": "none", "servers": {}}
    gated = admission["mode"] != "none"
    extra = f"{'tokens':>8}{'waited':>8}{'wait s':>8}{'refused':>8}" if gated else ""
    width = 97 + (32 if gated else 0)
    lines = [
        "",
        f"{'server':<20}{'behaves':<22}{'pilots':>7}  {'failures by kind':<34}{'errors':>7}{'alarms':>7}{extra}",
        "-" * width,
    ]
    for host in FLEET:
        row = result["servers"].get(
            host,
            {"expect": FLEET[host][1], "submitted": 0, "failures": {}, "errors": 0, "alarms": 0},
        )
        kinds = ", ".join(_kind_count(k, n) for k, n in sorted(row["failures"].items())) or "-"
        line = f"{host:<20}{row['expect']:<22}{row['submitted']:>7}  {kinds:<34}{row['errors']:>7}{row['alarms']:>7}"
        if gated:
            tokens = admission["servers"].get(
                host, {"granted": 0, "waited": 0, "wait_s": 0.0, "refused": 0}
            )
            line += (
                f"{tokens['granted']:>8}{tokens['waited']:>8}{tokens['wait_s']:>8.1f}"
                f"{tokens['refused']:>8}"
            )
        lines.append(line)
    lines += [
        "-" * width,
        *legend(admission),
        "",
        f"{result['pilots']} pilots in {result['elapsed_s']} s = {result['pilots_per_hour']} pilots/hour "
        f"(the seed's bar: > 1000/hour from 11 servers); {result['skipped']} submissions skipped "
        "because every server was excluded at that moment",
        _admission_line(admission, result.get("refused", 0)),
        f"error and alarm texts: {result['notifications']}",
        f"site config used:      {result['config']}",
        *(
            [f"report plot:           {result['picture']} (drawn from the .json beside it)"]
            if result.get("picture")
            else []
        ),
        *render_pilots(result.get("pilot_states") or {}, list(FLEET), result.get("left_rotation")),
        "",
    ]
    return "\n".join(lines)


def _kind_count(kind: str, n: int) -> str:
    # an aborted verdict is one per time a server's finished pilots failed too often, not a
    # count of pilots (the registry's "failed" column, below, counts those)
    return f"aborted verdicts {n}" if kind == "aborted" else f"{kind} {n}"


def legend(admission: Mapping[str, Any]) -> list[str]:
    """What the table's columns and the progress lines mean, for someone seeing them first."""
    lines = [
        "failures by kind: its failed submissions and status polls, and its aborted verdicts (each a",
        "  time its last finished pilots failed too often: out of rotation; not a count of pilots);",
        "  errors, alarms: the mails and GGUS alarms written on it",
    ]
    if admission["mode"] != "none":
        source = "the token daemon" if admission["mode"] == "remote" else "in-process admission"
        lines += [
            f"tokens: submissions that held a token from {source}; waited: how many waited for",
            "  one; wait s: seconds waited in all; refused: none came in time (counted, never "
            "escalated)",
        ]
    if admission["mode"] == "remote":
        lines += [
            f"{admission['policy']}: at most {SUBMISSION_MAX} submissions at once; past "
            f"{SUBMISSION_NOMINAL} at once,",
            f"  one more per {THROTTLE_MS} ms ({MAX_THREADS} director threads: submissions "
            "wait their turn)",
        ]
    lines += [
        "excluded now (progress lines): servers that failed in that iteration, out of rotation",
        f"  for {FAILING_EXPIRY} s (failing_expiry, an hour on a site), then tried again",
    ]
    return lines


def _admission_line(admission: dict[str, Any], refused: int) -> str:
    if admission["mode"] == "remote":
        return (
            f"admission: every submission took a token from lsfproxyd ({admission['policy']}, "
            f"{admission['daemon']}); {refused} refused (counted, never escalated)"
        )
    if admission["mode"] == "local":
        return (
            f"admission: in-process tokens, at most {admission['max_per_server']} submissions "
            f"in flight per server; {refused} refused (counted, never escalated)"
        )
    return "admission: none (every submission went ahead)"


@click.command("demo")
@click.option("--duration", default=60.0, show_default=True, help="Seconds to run the director.")
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False),
    help="Work folder (default: a new temporary one).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--png",
    "png",
    type=click.Path(dir_okay=False),
    help="Also draw the run's report (5 s slots) to this PNG, and its data to the same name "
    "with .json.",
)
@click.option(
    "--admission",
    type=click.Choice(["remote", "local", "none"]),
    default="remote",
    show_default=True,
    help="Submissions take tokens from a token daemon started for the demo (remote), "
    "from an in-process per-server policy (local), or none.",
)
def demo_command(
    duration: float, folder: str | None, as_json: bool, png: str | None, admission: str
) -> None:
    """Run the director against 11 simulated WMS servers (no config, no network)."""
    if png and (problem := plot_unavailable()):  # said before a minute is spent running
        raise click.ClickException(problem)
    work = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="gridgate-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    result = run_demo(
        work.resolve(), duration, admission=admission, png=Path(png).resolve() if png else None
    )
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(render(result))
    sys.stdout.flush()
