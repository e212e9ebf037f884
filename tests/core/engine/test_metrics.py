"""The director's Prometheus endpoint, scraped over real HTTP while work happens."""

from __future__ import annotations

import re
import urllib.request
from typing import Any

from support.director import BACKEND, ScriptedBackend, config
from support.polling import until

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.model import (
    Availability,
    CredentialRegistry,
    CredentialStatus,
    DemandFigure,
    DemandRegistry,
)
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector


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
    director = Director(
        config(servers=3, pilots=6, max_threads=1, metrics_port=0),
        clock=clock,
        extra_plugins=[backend, Collector()],
        state=MemoryState(clock=clock),
    )
    try:
        before = scrape(director.metrics_port)
        assert value(before, r"gridgate_submissions_total\{.*\}") == 0
        director.run_iteration()
        after = scrape(director.metrics_port)
        assert (
            value(after, r'gridgate_submissions_total\{.*outcome="submitted"\}') == 6
        )  # the failed one retried on s1/s2
        assert value(after, r'gridgate_failures_total\{.*endpoint="s0",kind="error"\}') == 1
        assert value(after, r'gridgate_notifications_total\{level="error"\}') == 1
        assert value(after, r"gridgate_endpoints_excluded") == 1
        assert value(after, r'gridgate_cache_entries\{cache="failing"\}') == 1
        assert value(after, r"gridgate_iteration_duration_seconds_count") == 1
        director.run_iteration()
        again = scrape(director.metrics_port)
        assert value(again, r"gridgate_pilots_submitted_total\{.*\}") == 12
        assert value(again, r"gridgate_iteration_duration_seconds_count") == 2
    finally:
        director.close()


def test_pilot_gauges_by_backend_endpoint_state_and_trimmed_demand() -> None:
    from support.director import BACKEND, TrackingBackend

    clock = FakeClock()
    backend = TrackingBackend(2)
    cfg = config(servers=2, pilots=10, max_threads=1, metrics_port=0)
    cfg.data["director"]["pilots"]["max_waiting"] = 3
    director = Director(
        cfg, clock=clock, extra_plugins=[backend, Collector()], state=MemoryState(clock=clock)
    )
    try:
        director.run_iteration()
        first = scrape(director.metrics_port)
        assert (
            value(first, rf'gridgate_pilots\{{backend="{BACKEND}",endpoint="s0",state="waiting"\}}')
            == 3
        )
        assert value(first, r'gridgate_demand_trimmed_total\{.*limit="max_waiting"\}') == 4
        assert value(first, r'gridgate_pilots_skipped_total\{.*cause="max_waiting"\}') == 4
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


def test_idle_connections_to_the_metrics_port_hold_no_thread_and_few_descriptors() -> None:
    """Before (issue 21, item 5): prometheus_client's server took a thread and a descriptor per
    connection, with no timeout: 300 idle connections were 300 threads of the director."""
    import socket
    import threading

    from gridgate.core.engine.metrics import DirectorMetrics
    from gridgate.core.metrics import MAX_CONNECTIONS

    metrics = DirectorMetrics()
    port = metrics.serve(0)
    threads = threading.active_count()
    idle: list[socket.socket] = []
    try:
        for _ in range(300):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            idle.append(sock)
        # accepted at ACCEPT_RATE: poll until the server has taken what it will
        assert until(lambda: metrics._server.counts["accepted"] >= 20, 20)
        assert threading.active_count() <= threads
        assert metrics._server.open_connections <= MAX_CONNECTIONS
        # a scraper sends its request at once: it gets in past the idle ones
        series = scrape(port)
        assert "gridgate_endpoints_excluded" in series
        assert metrics._server.counts["evicted"] > 0
    finally:
        for sock in idle:
            sock.close()
        metrics.close()


def test_a_silent_scrape_connection_is_closed_at_the_timeout() -> None:
    import socket

    from prometheus_client import CollectorRegistry

    from gridgate.core.metrics import MetricsServer

    server = MetricsServer(CollectorRegistry(), 0, timeout=0.2)
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10) as s:
            s.sendall(b"GET /metr")  # and then nothing
            assert s.recv(100) == b""  # closed by the server, not by this test's timeout
        assert until(lambda: server.counts["timed_out"] == 1, 10)
        assert server.open_connections == 0
    finally:
        server.shutdown()
        server.server_close()


class SiteFacts:
    """What the metrics of issue 32 item 3 are made from, said through the plugin hooks as a
    GOCDB feed, a credential plugin and a queue demand would say it; ``facts`` is changed by
    the test between iterations."""

    def __init__(self, **facts: Any) -> None:
        self.facts = facts

    @hookimpl
    def gridgate_endpoint_availability(
        self, iteration: Any, endpoints: Any, changed: Any
    ) -> dict[str, Availability] | None:
        return self.facts.get("unavailable")

    @hookimpl
    def gridgate_check_credentials(
        self, iteration: Any, timeout: float, credentials: CredentialRegistry
    ) -> None:
        status = self.facts.get("credential")
        if status is not None:
            credentials.add(status)

    @hookimpl
    def gridgate_demand(self, iteration: Any, demand: DemandRegistry) -> None:
        jobs = self.facts.get("jobs")
        if jobs is not None:
            demand.figure(DemandFigure(BACKEND, "atlas", jobs=jobs, source="redis"))


def test_availability_credential_end_and_demand_gauges_follow_each_iteration() -> None:
    clock = FakeClock()
    ends = clock.time() + 5 * 3600
    facts = SiteFacts(
        unavailable={
            f"{BACKEND}/s0": Availability("banned", "OUTAGE 123", clock.time() + 3600, "gocdb")
        },
        credential=CredentialStatus(
            "x509_proxy", "x509", True, "/var/lib/gridgate/proxy.pem", ends, "valid"
        ),
        jobs=42,
    )
    director = Director(
        config(servers=2, pilots=4, max_threads=1, metrics_port=0),
        clock=clock,
        extra_plugins=[ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"}), facts, Collector()],
        state=MemoryState(clock=clock),
    )
    try:
        director.run_iteration()
        first = scrape(director.metrics_port)
        banned = (
            rf'gridgate_endpoint_availability\{{backend="{BACKEND}",endpoint="s0",'
            r'source="gocdb",state="banned"\}'
        )
        assert value(first, banned) == 1
        assert value(first, r"gridgate_endpoint_availability\{.*\}") == 1  # s1 is available
        path = r'kind="x509",name="x509_proxy",path="/var/lib/gridgate/proxy.pem"'
        assert value(first, rf"gridgate_credential_expiry_timestamp_seconds\{{{path}\}}") == ends
        assert value(first, rf"gridgate_credential_usable\{{{path}\}}") == 1
        assert value(first, r'gridgate_demand_waiting_jobs\{group="atlas"\}') == 42
        assert value(first, rf'gridgate_demand_pilots\{{backend="{BACKEND}",.*\}}') == 4
        assert value(first, r"gridgate_last_iteration_timestamp_seconds") >= clock.time() - 1
        # the downtime is over, the proxy can no longer be read, the source counts no work
        facts.facts = {
            "credential": CredentialStatus(
                "x509_proxy", "x509", False, "/var/lib/gridgate/proxy.pem", None, "is a FIFO"
            ),
            "jobs": 0,
        }
        clock.advance(60)
        director.run_iteration()
        second = scrape(director.metrics_port)
        assert not any(k.startswith("gridgate_endpoint_availability{") for k in second)
        assert not any(
            k.startswith("gridgate_credential_expiry_timestamp_seconds{") for k in second
        )
        assert value(second, rf"gridgate_credential_usable\{{{path}\}}") == 0
        assert value(second, r'gridgate_demand_waiting_jobs\{group="atlas"\}') == 0
    finally:
        director.close()


def test_a_ce_found_down_by_its_polls_is_counted_as_the_report_counts_and_stays_out() -> None:
    """Issue 42: a CE whose status polls fail is a failure in the metrics as in `gridgate
    report` (one source: the failures table's rows), and gridgate_endpoint_out_of_rotation
    holds 1 for it through the whole episode, not only in the iteration that excluded it
    (gridgate_endpoints_excluded is 1 then 0 while the failing cache keeps it out)."""
    from support.director import TrackingBackend

    from gridgate.core.commands.report import FAILURE_SORTS, failure_sort, read_report

    clock = FakeClock()
    backend = TrackingBackend(2)
    cfg = config(servers=2, pilots=2, max_threads=1, metrics_port=0, failing_expiry=600)
    state = MemoryState(clock=clock)
    director = Director(cfg, clock=clock, extra_plugins=[backend, Collector()], state=state)
    out = (
        rf'gridgate_endpoint_out_of_rotation\{{backend="{BACKEND}",cause="failing",endpoint="s0"\}}'
    )
    try:
        director.run_iteration()  # pilots on s0 and s1
        backend.status_mode["s0"] = "fail"  # s0 goes down: its polls fail
        held, excluded = [], []
        for _ in range(4):
            clock.advance(60)
            director.run_iteration()
            series = scrape(director.metrics_port)
            held.append(value(series, out))
            excluded.append(value(series, r"gridgate_endpoints_excluded"))
        assert held == [1, 1, 1, 1], held
        since = rf'gridgate_endpoint_out_of_rotation_since_timestamp_seconds\{{backend="{BACKEND}",cause="failing",endpoint="s0"\}}'
        assert value(series, since) == clock.time() - 180  # its episode began 3 iterations ago
        assert excluded[1:] == [0, 0, 0], excluded  # why the old alert could never fire
        report = read_report(state, since=0)  # the store's groups of rows
        polls = [g for g in report.failures if failure_sort(g.record) == "poll"]
        failures = sum(g.count for g in report.failures)
        failed_rows = sum(g.count for g in report.rows if g.record["outcome"] == "failed")
        counted = value(series, r"gridgate_failures_total\{.*\}")
        assert polls and "poll" in FAILURE_SORTS
        assert counted == failures + failed_rows, (counted, report.failures)
        backend.status_mode["s0"] = "ok"
        director.failing.clear([f"{BACKEND}/s0"])  # an operator clears it: back in rotation
        clock.advance(60)
        director.run_iteration()
        assert value(scrape(director.metrics_port), out) == 0
    finally:
        director.close()
