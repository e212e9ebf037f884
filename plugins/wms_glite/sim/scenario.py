"""The stand-ins' scenario file: which behaviour each simulated WMS host has, and call records.

A scenario is YAML or JSON::

    state_dir: /tmp/x/state        # per-host call counters (or env GRIDGATE_SIM_STATE)
    calls_log: /tmp/x/calls.jsonl  # one JSON line per call start and end (optional)
    default: {behaviour: healthy, latency: 0}
    hosts:
      wms01.example.org: {behaviour: overloaded}
      wms02.example.org: {behaviour: flapping, every: 3, fail_as: unreachable}

Host entries are merged over ``default``. The calls log is what tests and benches count:
calls per host, and concurrency from the start/end times.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gridgate.core.files import atomic_write
from gridgate.plugins.wms_glite.sim.jobs import LifecycleError, check_pilots

SCENARIO_ENV = "GRIDGATE_SIM_SCENARIO"
STATE_ENV = "GRIDGATE_SIM_STATE"
CALLS_LOG_ENV = "GRIDGATE_SIM_CALLS_LOG"

#: Every behaviour the stand-ins know.
BEHAVIOURS = (
    "healthy",
    "overloaded",
    "drained",
    "unreachable",
    "auth",
    "usage",
    "print_then_hang",
    "hang_before_print",
    "grandchild",
    "garbage",
    "no_match",
    "error",
    "flapping",
    "slow_then_recover",
)
#: Behaviours a flapping or recovering host can fail with (they must be self-contained).
SIMPLE_BEHAVIOURS = tuple(b for b in BEHAVIOURS if b not in ("flapping", "slow_then_recover"))


class ScenarioError(ValueError):
    """The scenario file is unreadable or names an unknown behaviour."""


def load_scenario(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Read a scenario file (YAML or JSON); an absent path means every host is healthy."""
    if not path:
        return {"default": {"behaviour": "healthy"}, "hosts": {}}
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = yaml.safe_load(text) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {path}: top level must be a mapping")
    data.setdefault("default", {"behaviour": "healthy"})
    data.setdefault("hosts", {})
    for where, spec in [("default", data["default"]), *data["hosts"].items()]:
        check_spec(spec, str(where))
    return data


def check_spec(spec: Any, where: str) -> None:
    if not isinstance(spec, Mapping):
        raise ScenarioError(f"scenario {where}: expected a mapping")
    behaviour = spec.get("behaviour", "healthy")
    if behaviour not in BEHAVIOURS:
        raise ScenarioError(
            f"scenario {where}: unknown behaviour {behaviour!r} (known: {', '.join(BEHAVIOURS)})"
        )
    fail_as = spec.get("fail_as")
    if fail_as is not None and fail_as not in (*SIMPLE_BEHAVIOURS, "slow"):
        raise ScenarioError(f"scenario {where}: fail_as {fail_as!r} is not a simple behaviour")
    try:
        check_pilots(spec.get("pilots"), where)
    except LifecycleError as exc:
        raise ScenarioError(str(exc)) from None


def host_spec(scenario: Mapping[str, Any], host: str) -> dict[str, Any]:
    """The behaviour spec of ``host``: its own entry over the default."""
    spec = dict(scenario.get("default") or {})
    spec.update((scenario.get("hosts") or {}).get(host) or {})
    spec.setdefault("behaviour", "healthy")
    return spec


def write_scenario(path: Path, scenario: Mapping[str, Any]) -> Path:
    """Write ``scenario`` as JSON (a YAML subset) and return its path; for tests and demo.

    The file is replaced whole: a stand-in starting while it is rewritten reads the old
    scenario or the new one, never an empty file (which would mean every host is healthy and
    nothing is logged)."""
    atomic_write(path, json.dumps(scenario, indent=2).encode("utf-8"), mode=0o644, durable=False)
    return path


@dataclass(frozen=True)
class Call:
    """One stand-in invocation from the calls log; ``end`` is None if it never finished
    (killed at its deadline)."""

    pid: int
    command: str
    host: str
    behaviour: str
    effective: str
    call: int
    start: float
    end: float | None
    grandchild: int | None = None
    jdl: str = ""
    argv: tuple[str, ...] = ()
    ids: int = 0


def read_calls(path: str | os.PathLike[str]) -> list[Call]:
    """Pair the start and end lines of the calls log into :class:`Call` values, by start."""
    starts: dict[tuple[int, float], dict[str, Any]] = {}
    ends: dict[int, list[dict[str, Any]]] = {}
    grandchildren: dict[int, int] = {}
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if entry.get("event") == "start":
            starts[(entry["pid"], entry["time"])] = entry
        elif entry.get("event") == "grandchild":
            grandchildren[entry["pid"]] = entry["grandchild"]
        elif entry.get("event") == "end":
            ends.setdefault(entry["pid"], []).append(entry)
    calls = []
    for (pid, start), entry in sorted(starts.items(), key=lambda kv: kv[0][1]):
        finished = [e for e in ends.get(pid, []) if e.get("start") == start]
        calls.append(
            Call(
                pid=pid,
                command=entry.get("command", ""),
                host=entry.get("host", ""),
                behaviour=entry.get("behaviour", ""),
                effective=entry.get("effective", ""),
                call=int(entry.get("call", 0)),
                start=start,
                end=finished[0]["time"] if finished else None,
                grandchild=(finished[0].get("grandchild") if finished else None)
                or grandchildren.get(pid),
                jdl=entry.get("jdl", ""),
                argv=tuple(entry.get("argv", ())),
                ids=int(entry.get("ids", 0)),
            )
        )
    return calls


def max_concurrency(calls: list[Call], now: float | None = None) -> int:
    """The largest number of calls running at the same moment (unfinished ones run until
    ``now``, or forever when None)."""
    events: list[tuple[float, int]] = []
    for call in calls:
        events.append((call.start, 1))
        end = call.end if call.end is not None else (now if now is not None else float("inf"))
        events.append((end, -1))
    # An end and a start at the same instant do not overlap: process ends first.
    events.sort(key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak
