"""Turns accounting rows, failure rows and the pilot registry into the seed's "pilots per hour
per server" table and plot: pilots submitted, what became of them (finished per hour by state,
and by endpoint and state now), failures (of submissions, of status polls, and ``aborted``
verdicts on servers whose pilots abort) and demand trimmed by the limits on what waits."""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gridgate.core.commands.documents import (
    FailureRow,
    accounting_rows,
    episode_rows,
    failure_rows,
)
from gridgate.core.documents import decode_json
from gridgate.core.model import PILOT_STATES, TERMINAL_STATES
from gridgate.core.state import FinishedSlot, RecordGroup

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gridgate.core.state import Pilot

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
#: the skip causes that are a full limit or another director's group: the steady state (drawn
#: in grey beside the causes that stop demand: no_endpoint, credential, unavailable...)
LIMIT_CAUSES = ("max_waiting", "max_waiting_cores", "max_total", "claimed_elsewhere")
#: What failed, in the order the report stacks them: a submission (the accounting table), a
#: status poll or a cancel, and an ``aborted`` verdict (a server whose pilots abort, out of
#: rotation) (both from the failures table, ``gridgate.core.engine.runtime.FAILURES``).
FAILURE_SORTS = ("submission", "poll", "aborted")
_SORT_LABELS = {
    "submission": "failed submissions",
    "poll": "failed status polls or cancels",
    "aborted": "aborted: a server's pilots abort",
}
_SORT_COLOURS = {"submission": "firebrick", "poll": "mediumpurple", "aborted": "darkorange"}
#: The PNG text chunk that carries what the plot shows (:func:`plotted`), so that a picture can
#: be checked against what today's code draws without comparing pixels (fonts differ).
PLOTTED_KEY = "gridgate-plotted"


def failure_sort(row: FailureRow | Mapping[str, Any]) -> str:
    """Which of :data:`FAILURE_SORTS` a row of the failures table is."""
    typed = row if isinstance(row, FailureRow) else failure_rows([row])[0]
    return "aborted" if typed.kind == "aborted" else "poll"


#: The most slots a table fills in between its first and last (a tiny --bucket over a long
#: period would print a line per second of a week).
MAX_SLOTS = 2000


def _slots(first: float, last: float, bucket: float) -> list[str]:
    """Every slot from the one holding ``first`` to the one holding ``last``."""
    start = first - (first % bucket)
    count = min(MAX_SLOTS, int((last - start) // bucket) + 1)
    return [_slot(start + i * bucket, bucket) for i in range(max(0, count))]


def episodes_table(
    rows: Iterable[Mapping[str, Any]], since: float | None = None
) -> list[dict[str, Any]]:
    """The episodes table's rows (an endpoint's availability, a credential) paired into
    episodes: subject, what, state, source, reason, start and end (None: still on); those
    that ended before ``since`` are left out (one that began before it is kept whole)."""
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for row in sorted(episode_rows(rows), key=lambda r: r.time):
        key = (row.what, row.subject)
        if key in open_:
            ended = open_.pop(key)
            ended["end"] = row.time
            done.append(ended)
        if row.state not in ("available", "usable"):
            open_[key] = {
                "what": row.what,
                "subject": row.subject,
                "state": row.state,
                "source": row.source or "",
                "reason": row.reason or "",
                "start": row.time,
                "end": None,
            }
    done += open_.values()
    kept = [e for e in done if since is None or e["end"] is None or e["end"] >= since]
    return sorted(kept, key=lambda e: (e["start"], e["subject"]))


def hourly_table(
    rows: Iterable[Mapping[str, Any] | RecordGroup],
    bucket: float = 3600,
    finished: Iterable[Pilot | FinishedSlot] = (),
    now: Mapping[str, Mapping[str, int]] | None = None,
    failures: Iterable[Mapping[str, Any] | RecordGroup] = (),
    episodes: Iterable[Mapping[str, Any]] = (),
    since: float | None = None,
    until: float | None = None,
) -> dict[str, Any]:
    """Pilots submitted per time slot (an hour unless ``bucket`` says otherwise) per endpoint,
    plus failures and demand trimmed per slot and totals per endpoint.

    ``rows`` are the accounting table's (one per submission attempt); ``failures`` the
    failures table's (a failed status poll or cancel, an ``aborted`` verdict), counted with the
    failed submissions: per slot, per slot and :data:`FAILURE_SORTS`, and per endpoint and
    kind. Either may be the store's groups of them
    (:class:`~gridgate.core.state.RecordGroup`, grouped by slots of ``bucket`` or a divisor
    of it), each counted as the records it stands for. ``finished`` are terminal pilots of the
    registry (:class:`~gridgate.core.state.Pilot`) or its counts of them per slot
    (:class:`~gridgate.core.state.FinishedSlot`), counted per slot (when they finished) and
    state;
    ``now`` is the registry's pilots by endpoint and state at the time of the report.
    Demand that was not submitted is counted per slot by its cause (``skipped``: a limit, a
    paused backend's credential or local fault, every endpoint unavailable, another director
    holding the group...); ``episodes`` (the episodes table) become rows with a start and an
    end. Every slot from the first (``since`` when given) to the last (``until``) is in the
    table, the empty ones too.
    """
    pilots: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    failed: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    kinds: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    trimmed: dict[str, int] = defaultdict(int)
    skipped: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    causes: dict[str, int] = defaultdict(int)
    skip_causes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    ended: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    times: list[float] = []
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    records, weights = _weighed(rows)
    for row, n in zip(accounting_rows(records), weights, strict=True):
        times.append(row.time)
        hour = _slot(row.time, bucket)
        endpoint = row.endpoint or "-"
        outcome = row.outcome
        count = (row.pilots or 0) * n
        totals[endpoint][outcome] += count if outcome in ("submitted", "skipped") else n
        if outcome == "submitted":
            pilots[hour][endpoint] += count
        elif outcome == "failed":
            failed[hour]["submission"] += n
            kinds[endpoint][row.failure_kind or "error"] += n
        elif outcome == "skipped":
            cause = row.failure_kind or "skipped"
            skipped[hour][cause] += count
            causes[cause] += count
            skip_causes[endpoint][cause] += count
            if cause in TRIM_KINDS:
                trimmed[hour] += count
    records, weights = _weighed(failures)
    for failure, n in zip(failure_rows(records), weights, strict=True):
        times.append(failure.time)
        failed[_slot(failure.time, bucket)][failure_sort(failure)] += n
        kinds[failure.endpoint or "-"][failure.kind or "error"] += n
    for pilot in finished:
        times.append(float(pilot.changed))
        n = pilot.count if isinstance(pilot, FinishedSlot) else 1
        ended[_slot(float(pilot.changed), bucket)][pilot.state] += n
    seen = set(pilots) | set(failed) | set(skipped) | set(ended)
    if times or since is not None:
        first = min(times) if times else float(since or 0.0)
        if since is not None and since > 0:
            first = since
        last = max([*times, *([until] if until is not None else [])] or [first])
        seen |= set(_slots(first, last, bucket))
    hours = sorted(seen)
    endpoints = sorted({e for h in pilots.values() for e in h})
    return {
        "bucket_s": bucket,
        "hours": hours,
        "endpoints": endpoints,
        "pilots": {h: dict(pilots[h]) for h in hours},
        "failures": {h: sum(failed[h].values()) if h in failed else 0 for h in hours},
        "failures_by_sort": {
            h: {s: failed[h].get(s, 0) for s in FAILURE_SORTS} if h in failed else {} for h in hours
        },
        "failure_kinds": {e: dict(sorted(v.items())) for e, v in sorted(kinds.items())},
        "trimmed": {h: trimmed.get(h, 0) for h in hours},
        "skipped": {h: dict(skipped[h]) for h in hours if h in skipped},
        "skipped_by_cause": dict(sorted(causes.items())),
        "skipped_by_endpoint": {e: dict(sorted(v.items())) for e, v in sorted(skip_causes.items())},
        "episodes": episodes_table(episodes, since),
        "finished": {h: dict(ended[h]) for h in hours if h in ended},
        "totals": {e: dict(v) for e, v in sorted(totals.items())},
        "pilots_now": {k: dict(v) for k, v in sorted((now or {}).items())},
    }


def _weighed(
    rows: Iterable[Mapping[str, Any] | RecordGroup],
) -> tuple[list[Mapping[str, Any]], list[int]]:
    """The records of ``rows`` and how many each stands for: a group of the store's
    (:meth:`~gridgate.core.state.StateStore.record_groups`) its count, a record 1."""
    records: list[Mapping[str, Any]] = []
    weights: list[int] = []
    for row in rows:
        if isinstance(row, RecordGroup):
            records.append(row.record)
            weights.append(row.count)
        else:
            records.append(row)
            weights.append(1)
    return records, weights


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
    lines += [
        "failures: failed submissions, failed status polls or cancels, and aborted verdicts",
        "  (a server taken out of rotation because its pilots abort)",
    ]
    lines += ["", "per endpoint over the period:"]
    kinds = table["failure_kinds"]
    by_cause = table["skipped_by_endpoint"]
    for endpoint in sorted(set(table["totals"]) | set(kinds)):
        counts = table["totals"].get(endpoint, {})
        parts = []
        for k, v in sorted(counts.items()):
            if k == "skipped" and by_cause.get(endpoint):
                why = ", ".join(f"{c} {n}" for c, n in by_cause[endpoint].items())
                parts.append(f"skipped {v} pilots ({why})")
            elif k in ("submitted", "skipped"):
                parts.append(f"{k} {v} pilots")
            else:
                parts.append(f"{k} {v}")
        text = ", ".join(parts) or "nothing submitted"
        if kinds.get(endpoint):
            text += "; failures by kind: " + ", ".join(
                f"{k} {v}" for k, v in kinds[endpoint].items()
            )
        shown = "(no endpoint chosen)" if endpoint == "-" else endpoint
        lines.append(f"  {shown:<30} {text}")
    skipped = table["skipped"]
    causes = list(table["skipped_by_cause"])
    if causes:
        lines += [
            "",
            "demand not submitted, pilots per slot by cause (a limit, a paused backend, no "
            "usable endpoint, another director's group...):",
            f"  {'from (UTC)':<17}" + "".join(f"{c:>{max(12, len(c) + 2)}}" for c in causes),
        ]
        lines += [
            f"  {h:<17}" + "".join(f"{row.get(c, 0):>{max(12, len(c) + 2)}}" for c in causes)
            for h, row in skipped.items()
        ]
    episodes = table["episodes"]
    if episodes:
        lines += ["", "episodes (an endpoint not available, a credential unusable):"]
        for e in episodes:
            start = datetime.fromtimestamp(e["start"], UTC).strftime("%Y-%m-%d %H:%M:%S")
            end = (
                "still on"
                if e["end"] is None
                else datetime.fromtimestamp(e["end"], UTC).strftime("%Y-%m-%d %H:%M:%S")
            )
            source = f" ({e['source']})" if e["source"] else ""
            lines.append(
                f"  {start} -> {end:<19}  {e['what']:<12} {e['subject']}: {e['state']}{source}"
                + (f": {e['reason']}" if e["reason"] else "")
            )
    finished = table["finished"]
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


#: terminal states in the order the report shows them (the model's order)
FINISHED_STATES = tuple(s for s in PILOT_STATES if s in TERMINAL_STATES)
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


# --- what the report reads ---------------------------------------------------------------------


#: the accounting fields the report counts (:func:`hourly_table`), by which it asks the store
#: to group the accounting table
ACCOUNTING_FIELDS = ("endpoint", "outcome", "pilots", "failure_kind")
#: the failures fields it counts
FAILURE_FIELDS = ("endpoint", "kind")


@dataclass(frozen=True)
class ReportData:
    """What `gridgate report` reads from a state store for one period, counted per slot of
    ``bucket`` seconds in the store where it can (a SQL store counts a year of history in the
    database): the accounting and failures rows, the registry's pilots that finished, and
    its pilots by endpoint and state now."""

    rows: list[Any] = field(default_factory=list)
    failures: list[Any] = field(default_factory=list)
    finished: list[Any] = field(default_factory=list)
    now: dict[str, dict[str, int]] = field(default_factory=dict)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    #: the period read (None: from the first row; to the last)
    since: float | None = None
    until: float | None = None
    #: the slot the rows were counted in
    bucket: float = 3600

    def table(self, bucket: float | None = None) -> dict[str, Any]:
        """The report's table of this data (:func:`hourly_table`), in slots of ``bucket``
        seconds: those it was read in, or a multiple of them.

        :raises ValueError: a slot that is not a whole number of the slots read."""
        width = self.bucket if bucket is None else float(bucket)
        ratio = width / self.bucket
        if ratio < 1 or abs(ratio - round(ratio)) > 1e-9:
            raise ValueError(
                f"this report was read in slots of {self.bucket:g} s; a table of {width:g} s "
                "slots needs a whole number of them"
            )
        return hourly_table(
            self.rows,
            width,
            self.finished,
            self.now,
            self.failures,
            self.episodes,
            self.since,
            self.until,
        )


def read_report(state: Any, since: float, bucket: float = 3600) -> ReportData:
    """What the report shows of ``state`` (a :class:`~gridgate.core.state.StateStore`) from
    ``since`` on, counted in slots of ``bucket`` seconds. Raises
    :class:`~gridgate.core.state.StateError` when the store cannot be read; a registry it
    cannot read only costs the pilots (see :func:`pilots_for_report`)."""
    import time

    from gridgate.core.engine.runtime import ACCOUNTING, EPISODES, FAILURES

    finished, now = pilots_for_report(state, since, bucket)
    return ReportData(
        rows=state.record_groups(ACCOUNTING, ACCOUNTING_FIELDS, bucket, since=since),
        failures=state.record_groups(FAILURES, FAILURE_FIELDS, bucket, since=since),
        finished=finished,
        now=now,
        # an episode that began before the period and lasts into it is shown from its start
        episodes=state.records(EPISODES, since=max(0.0, since - 30 * 86400)),
        since=since if since > 0 else None,
        until=time.time() if since > 0 else None,
        bucket=bucket,
    )


def pilots_for_report(
    state: Any, since: float, bucket: float = 3600
) -> tuple[list[FinishedSlot], dict[str, dict[str, int]]]:
    """The registry's pilots that finished since ``since``, counted per slot of ``bucket``
    seconds and state, and its pilots by endpoint and state now; nothing (and a log line)
    when the store holds no registry it can read."""
    from loguru import logger

    from gridgate.core.engine.tracking import state_counts
    from gridgate.core.state import StateError

    try:
        registry = state.pilot_registry()
        finished = registry.finished_per_slot(bucket, since=since)
        return finished, state_counts(registry.counts())
    except StateError as exc:
        logger.error("pilot registry unreadable, the report shows submissions only: {}", exc)
        return [], {}


# --- the plot ------------------------------------------------------------------------------------

#: what to install for the plot (pyproject's ``plot`` extra)
PLOT_EXTRA = "pip install 'gridgate[plot]'"


def plot_unavailable() -> str | None:
    """Why the plot cannot be drawn here (matplotlib missing or broken), None when it can: a
    command asks before it reads anything, so a person learns what to install, not a
    traceback."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError as exc:
        return (
            f"the plot needs matplotlib, which this Python cannot import ({exc}); install "
            f"gridgate's plot extra: {PLOT_EXTRA}"
        )
    return None


def draw(table: Mapping[str, Any]) -> Figure:
    """The figure of a report's ``table`` (:func:`hourly_table`): stacked bars of pilots per
    slot per endpoint; with finished pilots, what became of them per slot by state; beneath,
    failures per slot by sort, and, when demand was skipped, the pilots skipped per slot by
    cause (a full limit in grey). Needs matplotlib (the ``plot`` extra): see
    :func:`plot_unavailable`."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    hours, endpoints = table["hours"], table["endpoints"]
    bucket = float(table["bucket_s"])
    skipped = table.get("skipped") or {}
    causes = sorted({c for h in hours for c, n in skipped.get(h, {}).items() if n})
    ratios = [3, *([2] if table["finished"] else []), 1, *([1] if causes else [])]
    fig = Figure(figsize=(11, 5 + 2 * (len(ratios) - 1)))
    panels = list(fig.subplots(len(ratios), 1, sharex=True, gridspec_kw={"height_ratios": ratios}))
    top = panels.pop(0)
    middle = panels.pop(0) if table["finished"] else None
    failures_axes = panels.pop(0)
    skips_axes = panels.pop(0) if causes else None
    bottom = skips_axes if skips_axes is not None else failures_axes
    positions = list(range(len(hours)))
    colours = matplotlib.colormaps["tab20"]

    def stack(axes: Any, series: Iterable[tuple[str, list[int], Any]]) -> None:
        base = [0] * len(hours)
        for label, values, colour in series:
            axes.bar(positions, values, bottom=base, label=label, color=colour, width=0.9)
            base = [b + v for b, v in zip(base, values, strict=True)]

    stack(
        top,
        (
            (e, [table["pilots"][h].get(e, 0) for h in hours], colours(i % 20))
            for i, e in enumerate(endpoints)
        ),
    )
    unit = "hour" if bucket == 3600 else f"{bucket:g} s"
    top.set_ylabel(f"pilots submitted per {unit}")
    top.set_title(f"Submitted pilots per {unit} per server")
    if endpoints:
        top.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if middle is not None:
        ended = [
            (s, [table["finished"].get(h, {}).get(s, 0) for h in hours], _STATE_COLOURS[s])
            for s in FINISHED_STATES
        ]
        stack(middle, (e for e in ended if any(e[1])))
        middle.set_ylabel(f"pilots finished per {unit}")
        middle.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    by_sort = table.get("failures_by_sort") or {
        h: {"submission": n} for h, n in table["failures"].items()
    }
    failed = [
        (_SORT_LABELS[s], [by_sort.get(h, {}).get(s, 0) for h in hours], _SORT_COLOURS[s])
        for s in FAILURE_SORTS
    ]
    # failed submissions always drawn, the other sorts when there are any
    shown = [f for f in failed if f is failed[0] or any(f[1])]
    stack(failures_axes, shown)
    if len(shown) > 1:
        failures_axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    failures_axes.set_ylabel("failures")
    if skips_axes is not None:
        # demand not submitted, by cause: a full limit is the steady state, an outage's
        # no_endpoint or a credential's skips are not (each its own colour)
        palette = matplotlib.colormaps["Set2"]
        stack(
            skips_axes,
            (
                (
                    cause,
                    [skipped.get(h, {}).get(cause, 0) for h in hours],
                    "lightgrey" if cause in LIMIT_CAUSES else palette(i % 8),
                )
                for i, cause in enumerate(causes)
            ),
        )
        skips_axes.set_ylabel("pilots skipped")
        skips_axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for axes in (top, middle, failures_axes, skips_axes):
        if axes is not None:  # counts: no tick at 0.5 failures, none below 0 when all are 0
            axes.yaxis.set_major_locator(
                MaxNLocator(nbins="auto" if axes is top or axes is middle else 4, integer=True)
            )
            axes.set_ylim(0, max(1.0, axes.get_ylim()[1]))
    step = max(1, len(hours) // 12)
    bottom.set_xticks(positions[::step])
    bottom.set_xticklabels(hours[::step], rotation=30, ha="right", fontsize=7)
    fig.tight_layout()
    return fig


def plotted(fig: Figure) -> dict[str, Any]:
    """What ``fig`` shows, as data: per panel its title, y label, legend, x tick labels and
    each bar series (label and heights). Two figures that draw the same report give the same
    answer whatever fonts or matplotlib version render them."""
    panels = []
    for axes in fig.axes:
        legend = axes.get_legend()
        panels.append(
            {
                "title": axes.get_title(),
                "ylabel": axes.get_ylabel(),
                "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
                "xticklabels": [t.get_text() for t in axes.get_xticklabels()],
                "series": [
                    {
                        "label": bars.get_label(),
                        "values": [_number(bar.get_height()) for bar in bars],
                    }
                    for bars in axes.containers
                ],
            }
        )
    width, height = fig.get_size_inches()
    return {"size_in": [_number(width), _number(height)], "panels": panels}


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else float(value)


def plot_png(
    rows: Iterable[Mapping[str, Any]],
    path: str,
    bucket: float = 3600,
    finished: Iterable[Any] = (),
    failures: Iterable[Mapping[str, Any]] = (),
) -> None:
    """Stacked bars of pilots per hour per endpoint, with failures per hour beneath,
    like the seed's PilotsperHour.png; with ``finished`` pilots (the registry's terminal ones)
    a middle panel shows what became of them: finished per hour by state. ``failures`` are the
    failures table's rows (failed polls, ``aborted``). Needs matplotlib (the ``plot`` extra):
    raises :class:`RuntimeError` saying what to install when it is missing."""
    problem = plot_unavailable()
    if problem is not None:
        raise RuntimeError(problem)
    save_png(draw(hourly_table(rows, bucket, finished, failures=failures)), path)


def save_png(fig: Figure, path: str | Path) -> None:
    """Write ``fig`` as a PNG at 100 dpi, with what it shows (:func:`plotted`) in its
    :data:`PLOTTED_KEY` text chunk."""
    fig.savefig(
        str(path), dpi=100, metadata={PLOTTED_KEY: json.dumps(plotted(fig), sort_keys=True)}
    )


def read_plotted(path: str | Path) -> dict[str, Any] | None:
    """What a PNG :func:`save_png` wrote shows (its :data:`PLOTTED_KEY` text chunk), None for
    a PNG without one. Reads the chunks itself: no imaging library needed."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        body = data[at + 8 : at + 8 + length]
        at += 12 + length
        if kind not in (b"tEXt", b"zTXt", b"iTXt"):
            continue
        key, _, rest = body.partition(b"\0")
        if key.decode("latin-1") != PLOTTED_KEY:
            continue
        if kind == b"zTXt":
            text = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            compressed, _method, rest = rest[0], rest[1], rest[2:]
            _lang, _, rest = rest.partition(b"\0")
            _translated, _, rest = rest.partition(b"\0")
            text = (zlib.decompress(rest) if compressed else rest).decode("utf-8")
        else:
            text = rest.decode("latin-1")
        doc: dict[str, Any] = decode_json(text, dict[str, Any], kind=f"{path}: plotted table")
        return doc
    return None
