"""Per-iteration cost of issue 23's availability and demand sources, for docs/performance.md.

- ``gocdb``: GOCDB states of 1,000 endpoints against a feed of 200 downtimes on 150 hosts
  (200 of the endpoints on those hosts), as :class:`GocdbAvailability` answers them once per
  iteration between two reads of the feed; and one read (parse and index) of that feed. The
  baseline is the same 1,000 endpoints given a fixed state (a dict built from the list), the
  least any availability hook costs.
- ``redis``: 1,000 demand groups, each a Redis list on one real redis-server (started here),
  read once per iteration all together (:meth:`WaitingGauges.waiting_all`, one pipelined round
  trip) and one by one (:meth:`WaitingGauge.waiting` per group, a round trip each). The baseline
  is one PING, the least a networked source costs.
- ``hook``: the director's whole availability step (``gridgate_endpoint_availability`` asked of
  every source, each isolated, the answers merged, the notices decided) for one backend of
  1,000 endpoints on a sqlite store holding 20 finished pilots per endpoint: the three built-in
  sources (operator with 50 bans, gocdb with the feed above, efficiency with 20 endpoints
  whose pilots changed, as the tracker reports them) against the same step with one source
  that says nothing (the hook's own floor: pluggy, the merge, the backend's endpoint list).

Every figure is a ratio of medians of rounds run alternately in this process, so that load from
elsewhere hits both sides alike; absolute times are given as well.

    .venv/bin/python bench/bench_sources.py [gocdb|redis|hook|all] [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gridgate.core import hookimpl
from gridgate.core.builtin.gocdb import GocdbAvailability, parse_downtimes
from gridgate.core.builtin.waiting import WaitingGauge, WaitingGauges
from gridgate.core.clock import FakeClock
from gridgate.core.model import AVAILABLE, BackendInfo

T0 = 1_700_000_000
ENDPOINTS = 1000
DOWNTIMES = 200
HOSTS_DOWN = 150


def _median_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Median of ``repeat`` timed calls of ``fn``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def feed_document() -> bytes:
    """A get_downtime answer of DOWNTIMES entries on HOSTS_DOWN hosts: a third ongoing OUTAGEs,
    a third ongoing WARNINGs, a third future or ended."""
    rows = []
    for n in range(DOWNTIMES):
        host = f"ce{n % HOSTS_DOWN:03d}.site{n % 37}.example.org"
        severity = "OUTAGE" if n % 2 else "WARNING"
        start, end = [(T0 - 3600, T0 + 3600), (T0 + 86400, T0 + 90000), (T0 - 9000, T0 - 60)][n % 3]
        rows.append(
            f'<DOWNTIME ID="{n}" PRIMARY_KEY="{n}G0" CLASSIFICATION="SCHEDULED">'
            f"<PRIMARY_KEY>{n}G0</PRIMARY_KEY><HOSTNAME>{host}</HOSTNAME>"
            f"<SERVICE_TYPE>ARC-CE</SERVICE_TYPE><ENDPOINT>{host}ARC-CE</ENDPOINT>"
            f"<HOSTED_BY>SITE{n % 37}</HOSTED_BY>"
            f"<GOCDB_PORTAL_URL>https://goc.egi.eu/portal/index.php?Page_Type=Downtime&amp;id={n}"
            f"</GOCDB_PORTAL_URL><AFFECTED_ENDPOINTS/><SEVERITY>{severity}</SEVERITY>"
            f"<DESCRIPTION>Bench downtime {n}</DESCRIPTION><INSERT_DATE>{T0 - 86400}</INSERT_DATE>"
            f"<START_DATE>{start}</START_DATE><END_DATE>{end}</END_DATE>"
            f"<FORMATED_START_DATE>x</FORMATED_START_DATE><FORMATED_END_DATE>x</FORMATED_END_DATE>"
            "</DOWNTIME>"
        )
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<results>' + "".join(rows)).encode() + (
        b"</results>\n"
    )


def bench_gocdb(rounds: int, folder: Path) -> dict[str, Any]:
    document = feed_document()
    path = folder / "downtimes.xml"
    path.write_bytes(document)
    endpoints = [
        f"https://ce{n:03d}.site{n % 37}.example.org:443/arex"
        if n < HOSTS_DOWN
        else f"https://other{n:04d}.example.net:8443/arex"
        for n in range(ENDPOINTS)
    ]
    endpoints[HOSTS_DOWN : HOSTS_DOWN + 50] = [
        f"ce{n % HOSTS_DOWN:03d}.site{n % 37}.example.org:2811"
        for n in range(HOSTS_DOWN, HOSTS_DOWN + 50)
    ]  # 200 endpoints on hosts with downtimes, some written HOST:PORT
    clock = FakeClock(T0)
    watch = GocdbAvailability({"url": path.as_uri(), "refresh": 86400}, clock=clock)
    states, _changes = watch.evaluate(endpoints)  # the read; later calls use the feed in force
    counts = {s: sum(1 for a in states.values() if a.state == s) for s in ("banned", "degraded")}

    def baseline() -> object:
        return dict.fromkeys(endpoints, AVAILABLE)

    def evaluate() -> object:
        return watch.evaluate(endpoints)

    def read() -> object:
        return parse_downtimes(path.read_bytes())

    repeat = 50
    base, cost, reads = [], [], []
    for _ in range(rounds):
        base.append(_median_seconds(baseline, repeat))
        cost.append(_median_seconds(evaluate, repeat))
        reads.append(_median_seconds(read, 10))
    return {
        "endpoints": ENDPOINTS,
        "downtimes": DOWNTIMES,
        "feed_bytes": len(document),
        "banned": counts["banned"],
        "degraded": counts["degraded"],
        "rounds": rounds,
        "baseline_ms": [round(s * 1000, 3) for s in base],
        "evaluate_ms": [round(s * 1000, 3) for s in cost],
        "read_feed_ms": [round(s * 1000, 3) for s in reads],
        "evaluate_over_baseline": round(statistics.median(cost) / statistics.median(base), 1),
        "evaluate_ms_median": round(statistics.median(cost) * 1000, 3),
        "read_feed_ms_median": round(statistics.median(reads) * 1000, 3),
        "share_of_a_60s_cycle": f"{statistics.median(cost) / 60:.1e}",
    }


class _Redis:
    """A throw-away redis-server on a free loopback port, without persistence."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("the redis bench needs redis-server on PATH (apt-get install)")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "no", "--dir", str(folder)],
            stdout=subprocess.DEVNULL,
        )
        import redis

        self.client = redis.Redis(port=self.port)
        for _ in range(500):
            try:
                self.client.ping()
                return
            except redis.exceptions.ConnectionError:
                time.sleep(0.02)  # waiting for a real server to listen
        raise SystemExit("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)


def bench_redis(rounds: int, folder: Path) -> dict[str, Any]:
    server = _Redis(folder)
    try:
        pipe = server.client.pipeline(transaction=False)
        keys = [f"tq:group{n:04d}" for n in range(ENDPOINTS)]
        for n, key in enumerate(keys):
            pipe.rpush(key, *range(n % 20 + 1))
        pipe.execute()
        clock = FakeClock(T0)
        specs = {key: {"redis": {"url": server.url, "key": key}} for key in keys}
        together = WaitingGauges(specs, clock=clock)
        one_server = next(iter(together.gauges.values())).source
        # one by one: the same gauges' sources, each read on its own (one round trip each)
        singles = [
            WaitingGauge(g, gauge.source, clock=clock) for g, gauge in together.gauges.items()
        ]
        expected = {key: n % 20 + 1 for n, key in enumerate(keys)}
        figures = together.waiting_all()
        assert {g: f.jobs for g, f in figures.items()} == expected
        assert [s.waiting().jobs for s in singles] == list(expected.values())

        def ping() -> object:
            return server.client.ping()

        def all_together() -> object:
            return together.waiting_all()

        def one_by_one() -> object:
            return [s.waiting() for s in singles]

        base, piped, single = [], [], []
        for _ in range(rounds):
            base.append(_median_seconds(ping, 200))
            piped.append(_median_seconds(all_together, 10))
            single.append(_median_seconds(one_by_one, 3))
        together.close()
        del one_server
    finally:
        server.stop()
    return {
        "groups": ENDPOINTS,
        "rounds": rounds,
        "ping_ms": [round(s * 1000, 3) for s in base],
        "pipelined_ms": [round(s * 1000, 2) for s in piped],
        "one_by_one_ms": [round(s * 1000, 2) for s in single],
        "pipelined_over_ping": round(statistics.median(piped) / statistics.median(base), 1),
        "one_by_one_over_ping": round(statistics.median(single) / statistics.median(base), 1),
        "one_by_one_over_pipelined": round(statistics.median(single) / statistics.median(piped), 1),
        "pipelined_ms_median": round(statistics.median(piped) * 1000, 2),
        "one_by_one_ms_median": round(statistics.median(single) * 1000, 2),
    }


class _Backend:
    """A backend of ENDPOINTS endpoints that only describes itself (the hook needs no more)."""

    def __init__(self, endpoints: tuple[Any, ...]) -> None:
        self.endpoints = endpoints

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> Any:
        return BackendInfo("bench", self.endpoints) if backend == "bench" else None


class _Silent:
    """An availability source that says nothing: the floor of the hook."""

    @hookimpl
    def gridgate_endpoint_availability(self, endpoints: Any) -> None:
        return None


def bench_hook(rounds: int, folder: Path) -> dict[str, Any]:
    from gridgate.core.builtin.bans import OperatorBans
    from gridgate.core.engine.director import Director
    from gridgate.core.engine.runtime import Iteration
    from gridgate.core.model import DemandRegistry, Endpoint, IterationInfo
    from gridgate.core.state import Pilot
    from gridgate.core.stores.sqlite import SqliteState
    from gridgate.core.testing import make_config

    clock = FakeClock(T0)
    hosts = [f"ce{n:03d}.site{n % 37}.example.org" for n in range(ENDPOINTS)]
    endpoints = tuple(Endpoint("bench", h, f"https://{h}:443/arex") for h in hosts)
    path = folder / "downtimes.xml"
    path.write_bytes(feed_document())
    store = SqliteState({"path": str(folder / "hook.db")}, clock=clock)
    registry = store.pilot_registry()
    registry.put(
        Pilot(
            f"{e.name}.{i}",
            "bench",
            e.name,
            submitted=T0 - 7200,
            state="failed" if i % (2 if e.name[2:5] < "005" else 21) == 0 else "done",
            changed=T0 - 600,
        )
        for e in endpoints
        for i in range(20)
    )
    for endpoint in endpoints[:50]:
        OperatorBans(store).ban(endpoint.key, who="bench", why="bench", duration=86400)

    def director(availability: dict[str, Any], *extra: object) -> Director:
        doc = {
            "director": {"pilots": {"track": False}},
            "state": {"driver": "sqlite", "path": str(folder / "hook.db")},
            "demand": {"static": {}},
            "availability": availability,
        }
        made = Director(
            make_config(doc), clock=clock, extra_plugins=[_Backend(endpoints), *extra], state=store
        )
        made.runner._backends["bench"] = None  # noqa: SLF001 - as if demand had named it
        return made

    full = director({"gocdb": {"url": path.as_uri(), "refresh": 86400}, "efficiency": {}})
    floor = director({})
    floor.pm.unregister(name="availability:operator")
    floor.pm.register(_Silent(), name="availability:silent")
    changed = frozenset(e.key for e in endpoints[:20])
    demand = DemandRegistry()

    def step(d: Director) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            it = Iteration(info=IterationInfo(1, clock.time()), failing=set())
            d.runner._changed = changed  # noqa: SLF001 - what the tracker's polls would set
            d.runner._availability(it, demand)  # noqa: SLF001 - the step alone, as run() calls it
            return dict(it.availability)

        return run

    started = time.perf_counter()
    unavailable = step(full)()  # the first look reads every endpoint and tells every change
    first_look = time.perf_counter() - started
    silent = step(floor)()
    assert not silent and len(unavailable) >= 50
    base, cost = [], []
    for _ in range(rounds):
        base.append(_median_seconds(step(floor), 20))
        cost.append(_median_seconds(step(full), 5))
    full.close()
    floor.close()
    store.close()
    return {
        "endpoints": ENDPOINTS,
        "unavailable": len(unavailable),
        "rounds": rounds,
        "floor_ms": [round(s * 1000, 2) for s in base],
        "built_in_ms": [round(s * 1000, 2) for s in cost],
        "built_in_over_floor": round(statistics.median(cost) / statistics.median(base), 1),
        "floor_ms_median": round(statistics.median(base) * 1000, 2),
        "built_in_ms_median": round(statistics.median(cost) * 1000, 2),
        "first_look_ms": round(first_look * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", default="all", choices=["gocdb", "redis", "hook", "all"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sources-") as tmp:
        folder = Path(tmp)
        if args.what in ("gocdb", "all"):
            results["gocdb"] = bench_gocdb(args.rounds, folder)
        if args.what in ("redis", "all"):
            results["redis"] = bench_redis(args.rounds, folder)
        if args.what in ("hook", "all"):
            results["hook"] = bench_hook(args.rounds, folder)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    if "gocdb" in results:
        g = results["gocdb"]
        print(
            f"gocdb: {g['endpoints']} endpoints vs {g['downtimes']} downtimes: "
            f"{g['evaluate_ms_median']} ms per iteration, {g['evaluate_over_baseline']}x a fixed "
            f"state; reading the feed ({g['feed_bytes']} bytes) {g['read_feed_ms_median']} ms"
        )
    if "redis" in results:
        r = results["redis"]
        print(
            f"redis: {r['groups']} groups: {r['pipelined_ms_median']} ms pipelined "
            f"({r['pipelined_over_ping']}x one PING), {r['one_by_one_ms_median']} ms one by one "
            f"({r['one_by_one_over_pipelined']}x pipelined)"
        )

    if "hook" in results:
        h = results["hook"]
        print(
            f"hook: {h['endpoints']} endpoints, {h['unavailable']} unavailable: the built-in "
            f"sources {h['built_in_ms_median']} ms per iteration, {h['built_in_over_floor']}x "
            f"a source that says nothing ({h['floor_ms_median']} ms); the first look, every "
            f"endpoint's pilots read, {h['first_look_ms']} ms"
        )


if __name__ == "__main__":
    main()
