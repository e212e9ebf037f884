"""Turns accounting rows into the seed's "pilots per hour per server" table and plot."""

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
    fmt = "%Y-%m-%d %H:00" if bucket >= 3600 and bucket % 3600 == 0 else "%Y-%m-%d %H:%M:%S" if bucket < 60 else "%Y-%m-%d %H:%M"
    return datetime.fromtimestamp(start, UTC).strftime(fmt)


def hourly_table(rows: Iterable[Mapping[str, Any]], bucket: float = 3600) -> dict[str, Any]:
    """Pilots submitted per time slot (an hour unless ``bucket`` says otherwise) per endpoint,
    plus failures per slot and totals per endpoint."""
    pilots: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    failures: dict[str, int] = defaultdict(int)
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
    hours = sorted(set(pilots) | set(failures))
    endpoints = sorted({e for h in pilots.values() for e in h})
    return {
        "bucket_s": bucket,
        "hours": hours,
        "endpoints": endpoints,
        "pilots": {h: dict(pilots[h]) for h in hours},
        "failures": {h: failures.get(h, 0) for h in hours},
        "totals": {e: dict(v) for e, v in sorted(totals.items())},
    }


def render_table(table: Mapping[str, Any]) -> str:
    """Plain text: one row per hour, one column per endpoint, then a totals block."""
    endpoints = table["endpoints"]
    if not table["hours"]:
        return "no submissions in this period\n"
    width = max([8, *(len(e) for e in endpoints)])
    head = f"{'from (UTC)':<17}" + "".join(f"{e:>{width + 1}}" for e in endpoints) + f"{'total':>8}{'failures':>10}"
    lines = [head, "-" * len(head)]
    for hour in table["hours"]:
        row = table["pilots"].get(hour, {})
        lines.append(
            f"{hour:<17}" + "".join(f"{row.get(e, 0):>{width + 1}}" for e in endpoints)
            + f"{sum(row.values()):>8}{table['failures'].get(hour, 0):>10}"
        )
    lines += ["", "per endpoint over the period:"]
    for endpoint, counts in table["totals"].items():
        lines.append(f"  {endpoint:<30} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines) + "\n"


def plot_png(rows: Iterable[Mapping[str, Any]], path: str, bucket: float = 3600) -> None:
    """Stacked bars of pilots per hour per endpoint, with failures per hour beneath,
    like the seed's PilotsperHour.png. Needs matplotlib (the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("the plot needs matplotlib: pip install 'gridgate[plot]'") from exc
    table = hourly_table(rows, bucket)
    hours, endpoints = table["hours"], table["endpoints"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    positions = range(len(hours))
    base = [0] * len(hours)
    colours = plt.get_cmap("tab20")
    for index, endpoint in enumerate(endpoints):
        values = [table["pilots"][h].get(endpoint, 0) for h in hours]
        top.bar(positions, values, bottom=base, label=endpoint, color=colours(index % 20), width=0.9)
        base = [b + v for b, v in zip(base, values, strict=True)]
    unit = "hour" if bucket == 3600 else f"{bucket:g} s"
    top.set_ylabel(f"pilots submitted per {unit}")
    top.set_title(f"Submitted pilots per {unit} per server")
    if endpoints:
        top.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    bottom.bar(positions, [table["failures"][h] for h in hours], color="firebrick", width=0.9)
    bottom.set_ylabel("failures")
    step = max(1, len(hours) // 12)
    bottom.set_xticks(list(positions)[::step])
    bottom.set_xticklabels(hours[::step], rotation=30, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
