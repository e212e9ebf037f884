"""The director's Prometheus endpoint, scraped over real HTTP while work happens."""

from __future__ import annotations

import re
import urllib.request

from directorkit import Collector, ScriptedBackend, config

from gridgate.core.clock import FakeClock
from gridgate.core.director import Director
from gridgate.core.state import MemoryState


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    series = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            series[name] = float(value)
    return series


def value(series: dict[str, float], pattern: str) -> float:
    return sum(v for k, v in series.items() if re.fullmatch(pattern, k))


def test_director_metrics_move_when_work_happens() -> None:
    clock = FakeClock()
    backend = ScriptedBackend(3, {"s0": "fake-fail", "s1": "fake-ok", "s2": "fake-ok"})
    director = Director(config(servers=3, pilots=6, max_threads=1, metrics_port=0), clock=clock,
                        extra_plugins=[backend, Collector()], state=MemoryState(clock=clock))
    try:
        before = scrape(director.metrics_port)
        assert value(before, r"gridgate_submissions_total\{.*\}") == 0
        director.run_iteration()
        after = scrape(director.metrics_port)
        assert value(after, r'gridgate_submissions_total\{.*outcome="submitted"\}') == 6  # the failed one retried on s1/s2
        assert value(after, r'gridgate_failures_total\{.*endpoint="s0",kind="error"\}') == 1
        assert value(after, r'gridgate_notifications_total\{level="error"\}') == 1
        assert value(after, r"gridgate_endpoints_excluded") == 1
        assert value(after, r'gridgate_cache_entries\{cache="failing"\}') == 1
        assert value(after, r"gridgate_iteration_duration_seconds_count") == 1
        director.run_iteration()
        again = scrape(director.metrics_port)
        assert value(again, r'gridgate_pilots_submitted_total\{.*\}') == 12
        assert value(again, r"gridgate_iteration_duration_seconds_count") == 2
    finally:
        director.close()


def test_pilot_gauges_by_backend_endpoint_state_and_trimmed_demand() -> None:
    from directorkit import BACKEND, TrackingBackend

    clock = FakeClock()
    backend = TrackingBackend(2)
    cfg = config(servers=2, pilots=10, max_threads=1, metrics_port=0)
    cfg.data["director"]["pilots"]["max_waiting"] = 3
    director = Director(cfg, clock=clock, extra_plugins=[backend, Collector()], state=MemoryState(clock=clock))
    try:
        director.run_iteration()
        first = scrape(director.metrics_port)
        assert value(first, rf'gridgate_pilots\{{backend="{BACKEND}",endpoint="s0",state="waiting"\}}') == 3
        assert value(first, r'gridgate_demand_trimmed_total\{.*limit="max_waiting"\}') == 4
        backend.move("s0", "running", 2)
        backend.move("s1", "done", 3)
        director.run_iteration()
        second = scrape(director.metrics_port)
        assert value(second, r'gridgate_pilots\{.*endpoint="s0",state="running"\}') == 2
        assert value(second, r'gridgate_pilots\{.*endpoint="s0",state="waiting"\}') == 3
        assert value(second, r'gridgate_pilots\{.*endpoint="s1",state="done"\}') == 3
        assert value(second, r'gridgate_pilots\{.*state="waiting"\}') == 6
        assert value(second, r'gridgate_status_polls_total\{.*outcome="ok"\}') == 2
    finally:
        director.close()
