"""Turns accounting rows and the pilot registry into the seed's "pilots per hour per server"
table and plot: pilots submitted, what became of them (finished per hour by state, and by
endpoint and state now), failures and demand trimmed by the limits on what waits."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``90m``, ``24h``, ``7d``, ``3600`` (seconds) -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90m, 24h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _slot(ts: float, bucket: float) -> str:
    start = ts - (ts % bucket)
    fmt = (
        "%Y-%m-%d %H:00"
        if bucket >= 3600 and bucket % 3600 == 0
        else "%Y-%m-%d %H:%M:%S"
        if bucket < 60
        else "%Y-%m-%d %H:%M"
    )
    return datetime.fromtimestamp(start, UTC).strftime(fmt)


#: accounting ``failure_kind`` of demand that a limit kept from being submitted
TRIM_KINDS = ("max_waiting", "max_total")


def hourly_table(
    rows: Iterable[Mapping[str, Any]],
    bucket: float = 3600,
    finished: Iterable[Any] = (),
    now: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """Pilots submitted per time slot (an hour unless ``bucket`` says otherwise) per endpoint,
    plus failures and demand trimmed per slot and totals per endpoint.

    ``finished`` are terminal pilots of the registry (:class:`~gridgate.core.pilots.Pilot`),
    counted per slot (when they finished) and state; ``now`` is the registry's pilots by
    endpoint and state at the time of the report.
    """
    pilots: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    failures: dict[str, int] = defaultdict(int)
    trimmed: dict[str, int] = defaultdict(int)
    ended: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        hour = _slot(float(row["time"]), bucket)
        endpoint = row.get("endpoint") or "-"
        outcome = row["outcome"]
        totals[endpoint][outcome] += int(row.get("pilots", 0)) if outcome == "submitted" else 1
        if outcome == "submitted":
            pilots[hour][endpoint] += int(row.get("pilots", 0))
        elif outcome == "failed":
            failures[hour] += 1
        elif row.get("failure_kind") in TRIM_KINDS:
            trimmed[hour] += int(row.get("pilots", 0))
    for pilot in finished:
        ended[_slot(float(pilot.changed), bucket)][pilot.state] += 1
    hours = sorted(set(pilots) | set(failures) | set(trimmed) | set(ended))
    endpoints = sorted({e for h in pilots.values() for e in h})
    return {
        "bucket_s": bucket,
        "hours": hours,
        "endpoints": endpoints,
        "pilots": {h: dict(pilots[h]) for h in hours},
        "failures": {h: failures.get(h, 0) for h in hours},
        "trimmed": {h: trimmed.get(h, 0) for h in hours},
        "finished": {h: dict(ended[h]) for h in hours if h in ended},
        "totals": {e: dict(v) for e, v in sorted(totals.items())},
        "pilots_now": {k: dict(v) for k, v in sorted((now or {}).items())},
    }


def render_table(table: Mapping[str, Any]) -> str:
    """Plain text: one row per hour, one column per endpoint, then a totals block."""
    endpoints = table["endpoints"]
    if not table["hours"]:
        return "no submissions in this period\n"
    width = max([8, *(len(e) for e in endpoints)])
    head = (
        f"{'from (UTC)':<17}"
        + "".join(f"{e:>{width + 1}}" for e in endpoints)
        + f"{'total':>8}{'failures':>10}"
    )
    lines = [head, "-" * len(head)]
    for hour in table["hours"]:
        row = table["pilots"].get(hour, {})
        lines.append(
            f"{hour:<17}"
            + "".join(f"{row.get(e, 0):>{width + 1}}" for e in endpoints)
            + f"{sum(row.values()):>8}{table['failures'].get(hour, 0):>10}"
        )
    lines += ["", "per endpoint over the period:"]
    for endpoint, counts in table["totals"].items():
        lines.append(
            f"  {endpoint:<30} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        )
    trimmed = table.get("trimmed", {})
    if any(trimmed.values()):
        lines += ["", "demand trimmed by max_waiting / max_total (pilots not submitted):"]
        lines += [f"  {h:<17}{n:>8}" for h, n in trimmed.items() if n]
    finished = table.get("finished", {})
    if finished:
        ended = [s for s in FINISHED_STATES if any(s in v for v in finished.values())]
        lines += [
            "",
            "pilots finished per slot, by state:",
            f"  {'from (UTC)':<17}" + "".join(f"{s:>11}" for s in ended),
        ]
        lines += [
            f"  {h:<17}" + "".join(f"{row.get(s, 0):>11}" for s in ended)
            for h, row in finished.items()
        ]
    if table.get("pilots_now"):
        lines += ["", "pilots now, by endpoint and state:"]
        lines += ["  " + line for line in render_states(table["pilots_now"]).splitlines()]
    return "\n".join(lines) + "\n"


#: terminal states in the order the report shows them
FINISHED_STATES = ("done", "failed", "cancelled", "lost")
_STATE_COLOURS = {
    "done": "seagreen",
    "failed": "firebrick",
    "cancelled": "darkgrey",
    "lost": "black",
}


def render_states(table: Mapping[str, Mapping[str, int]]) -> str:
    """Plain text: one row per endpoint, one column per pilot state, and a total row."""
    from gridgate.core.model import PILOT_STATES

    if not table:
        return "no pilots tracked\n"
    width = max(30, *(len(k) for k in table))
    lines = [f"{'ENDPOINT':<{width}}" + "".join(f"{s:>10}" for s in PILOT_STATES)]
    totals = dict.fromkeys(PILOT_STATES, 0)
    for key, row in table.items():
        lines.append(f"{key:<{width}}" + "".join(f"{row.get(s, 0):>10}" for s in PILOT_STATES))
        for s in PILOT_STATES:
            totals[s] += row.get(s, 0)
    lines.append(f"{'total':<{width}}" + "".join(f"{totals[s]:>10}" for s in PILOT_STATES))
    return "\n".join(lines) + "\n"


def plot_png(
    rows: Iterable[Mapping[str, Any]], path: str, bucket: float = 3600, finished: Iterable[Any] = ()
) -> None:
    """Stacked bars of pilots per hour per endpoint, with failures per hour beneath,
    like the seed's PilotsperHour.png; with ``finished`` pilots (the registry's terminal ones)
    a middle panel shows what became of them: finished per hour by state. Needs matplotlib
    (the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("the plot needs matplotlib: pip install 'gridgate[plot]'") from exc
    table = hourly_table(rows, bucket, finished)
    hours, endpoints = table["hours"], table["endpoints"]
    if table["finished"]:
        fig, (top, middle, bottom) = plt.subplots(
            3, 1, figsize=(11, 9), sharex=True, gridspec_kw={"height_ratios": [3, 2, 1]}
        )
    else:
        fig, (top, bottom) = plt.subplots(
            2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
        )
        middle = None
    positions = range(len(hours))
    base = [0] * len(hours)
    colours = plt.get_cmap("tab20")
    for index, endpoint in enumerate(endpoints):
        values = [table["pilots"][h].get(endpoint, 0) for h in hours]
        top.bar(
            positions, values, bottom=base, label=endpoint, color=colours(index % 20), width=0.9
        )
        base = [b + v for b, v in zip(base, values, strict=True)]
    unit = "hour" if bucket == 3600 else f"{bucket:g} s"
    top.set_ylabel(f"pilots submitted per {unit}")
    top.set_title(f"Submitted pilots per {unit} per server")
    if endpoints:
        top.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if middle is not None:
        base = [0] * len(hours)
        for state in FINISHED_STATES:
            values = [table["finished"].get(h, {}).get(state, 0) for h in hours]
            if any(values):
                middle.bar(
                    positions,
                    values,
                    bottom=base,
                    label=state,
                    color=_STATE_COLOURS[state],
                    width=0.9,
                )
                base = [b + v for b, v in zip(base, values, strict=True)]
        middle.set_ylabel(f"pilots finished per {unit}")
        middle.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    bottom.bar(
        positions,
        [table["failures"][h] for h in hours],
        color="firebrick",
        width=0.9,
        label="failed submissions",
    )
    if any(table["trimmed"].values()):
        bottom.bar(
            positions,
            [table["trimmed"][h] for h in hours],
            bottom=[table["failures"][h] for h in hours],
            color="orange",
            width=0.9,
            label="pilots trimmed by limits",
        )
        bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    bottom.set_ylabel("failures")
    step = max(1, len(hours) // 12)
    bottom.set_xticks(list(positions)[::step])
    bottom.set_xticklabels(hours[::step], rotation=30, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def pilots_for_report(state: Any, since: float) -> tuple[list[Any], dict[str, dict[str, int]]]:
    """The registry's pilots that finished since ``since`` and its pilots by endpoint and state
    now; nothing (and a log line) when the store holds no registry it can read."""
    from loguru import logger

    from gridgate.core.state import StateError
    from gridgate.core.tracking import state_counts

    try:
        registry = state.pilot_registry()
        finished = [p for p in registry.query(states=FINISHED_STATES) if p.changed >= since]
        return finished, state_counts(registry.counts())
    except StateError as exc:
        logger.error("pilot registry unreadable, the report shows submissions only: {}", exc)
        return [], {}
