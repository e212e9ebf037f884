"""The ``queue`` demand mode (issue 23) through the real director, against a real redis-server
and a real local HTTP server: pilots for the jobs waiting in a task queue, less the group's
pilots already waiting, then the limits (max_waiting_cores among them)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from support.director import BACKEND, TrackingBackend
from support.ports import free_port
from support.web import Answers, WebServer

from gridgate.core import hookimpl
from gridgate.core.builtin.demand import QueueDemand
from gridgate.core.clock import FakeClock
from gridgate.core.config import ConfigError
from gridgate.core.engine.director import Director
from gridgate.core.model import DemandRegistry, IterationInfo, IterationSummary, Resources
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.redis import RedisState
from gridgate.core.testing import build_plugin, make_config


def _doc(groups: dict[str, Any], **pilots: Any) -> dict[str, Any]:
    return {
        "director": {
            "cycle_seconds": 0.01,
            "max_threads": 4,
            "command_timeout": 5,
            "pilots": pilots,
        },
        "state": {"driver": "memory"},
        "demand": {"queue": {"groups": groups}},
        "selectors": {"random": {"seed": 7}},
    }


def _director(
    backend: TrackingBackend, groups: dict[str, Any], clock: FakeClock | None = None, **pilots: Any
) -> Director:
    clock = clock or FakeClock()
    return Director(
        make_config(_doc(groups, **pilots)),
        clock=clock,
        extra_plugins=[backend],
        state=MemoryState(clock=clock),
    )


def _waiting(director: Director, group: str = "mc") -> int:
    found = director.state.pilot_registry().waiting()
    return sum(n for (_b, _e, g), (n, _c) in found.items() if g == group)


def _submitted(summary: IterationSummary) -> int:
    return sum(r.pilots for r in summary.records if r.outcome == "submitted")


@pytest.fixture
def web() -> Iterator[tuple[str, Answers]]:
    with WebServer() as server:
        yield server.url("/waiting"), server.answers


@pytest.mark.parametrize(("jobs", "per_pilot"), [(10, 3), (7, 1), (12, 4)])
def test_a_redis_list_of_w_jobs_settles_at_ceil_w_over_k_waiting_pilots_never_more(
    queue, redis_server, jobs: int, per_pilot: int
) -> None:
    client, key = queue
    client.rpush(key, *[f"job{i}" for i in range(jobs)])
    backend = TrackingBackend(servers=3)
    source = {"redis": {"url": redis_server.url, "key": key}}
    director = _director(
        backend, {"mc": {"backend": BACKEND, "source": source, "jobs_per_pilot": per_pilot}}
    )
    target = math.ceil(jobs / per_pilot)
    seen = []
    for step in range(8):
        director.run_iteration()
        seen.append(_waiting(director))
        if step == 3:  # some pilots start: the group is topped up to the target again
            backend.move("s0", "running", only="waiting")
            backend.move("s1", "running", only="waiting")
    print(f"W={jobs} k={per_pilot}: pilots waiting per iteration {seen}")
    assert seen[0] == target
    assert max(seen) == target, seen  # never more than ceil(W/k)
    assert seen[-1] == target
    assert min(seen[4:]) < target  # the pilots that started left room, and it was refilled
    director.close()


def test_draining_the_list_stops_submission_within_one_iteration(queue, redis_server) -> None:
    client, key = queue
    client.rpush(key, *range(6))
    backend = TrackingBackend(servers=2)
    source = {"redis": {"url": redis_server.url, "key": key}}
    director = _director(backend, {"mc": {"backend": BACKEND, "source": source}})
    assert _submitted(director.run_iteration()) == 6
    for endpoint in ("s0", "s1"):
        backend.move(endpoint, "running")
    client.delete(key)  # the task queue drains: its jobs went to the running pilots
    after = [_submitted(director.run_iteration()) for _ in range(4)]
    print(f"pilots submitted per iteration after the list drained: {after}")
    assert after == [0, 0, 0, 0]
    director.close()


def test_a_failing_source_keeps_the_last_figure_then_submits_nothing_never_more(web, logs) -> None:
    url, server = web
    server.body = json.dumps({"mc": 8}).encode()
    clock = FakeClock()
    backend = TrackingBackend(servers=2)
    source = {"http": {"url": url, "field": "mc", "timeout": 5}}
    director = _director(
        backend, {"mc": {"backend": BACKEND, "source": source, "keep_last": 120}}, clock=clock
    )
    assert _submitted(director.run_iteration()) == 8
    server.status, server.body = 500, b"oops"  # the task queue's web service breaks
    started = len(backend.move("s0", "running"))  # and some pilots start meanwhile
    assert started > 0
    clock.advance(30)
    assert _submitted(director.run_iteration()) == 0  # the poll sees them start, after demand
    clock.advance(30)
    # the last figure (8, read 60 s ago) is kept: the group is topped up to it, not beyond
    assert _submitted(director.run_iteration()) == started
    assert _waiting(director) == 8
    server.body = b"{}"
    clock.advance(120)  # the last figure is now older than keep_last
    backend.move("s1", "running")
    after = [_submitted(director.run_iteration()) for _ in range(3)]
    assert after == [0, 0, 0]
    errors = [m for level, m in logs if level == "ERROR" and "waiting work of group mc" in m]
    assert len(errors) == 1 and f"http {url} field mc" in errors[0], errors
    director.close()


def test_a_redis_that_is_down_asks_for_nothing_with_one_error(logs) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    backend = TrackingBackend(servers=2)
    source = {"redis": {"url": url, "key": "tq:mc", "timeout": 1}}
    director = _director(backend, {"mc": {"backend": BACKEND, "source": source}})
    assert [_submitted(director.run_iteration()) for _ in range(3)] == [0, 0, 0]
    errors = [m for level, m in logs if level == "ERROR" and "waiting work of group mc" in m]
    assert len(errors) == 1 and f"redis {url} key tq:mc" in errors[0], errors
    director.close()


def test_max_waiting_cores_trims_a_group_by_its_cores(queue, redis_server) -> None:
    client, key = queue
    client.rpush(key, *range(10))
    backend = TrackingBackend(servers=1)
    source = {"redis": {"url": redis_server.url, "key": key}}
    group = {"backend": BACKEND, "source": source, "resources": {"cores": 8}}
    director = _director(backend, {"mc": group}, max_waiting_cores=32)
    first = director.run_iteration()
    assert _submitted(first) == 4  # 4 pilots x 8 cores = 32
    (cut,) = [r for r in first.records if r.failure_kind == "max_waiting_cores"]
    assert cut.pilots == 6
    assert director.state.pilot_registry().waiting() == {(BACKEND, "s0", "mc"): (4, 32)}
    assert _submitted(director.run_iteration()) == 0  # still full
    backend.move("s0", "running", 1)
    # the demand still sees 4 waiting (it asks for 6), the poll then sees one start: 8 cores
    # of room, one pilot of 8 cores
    again = director.run_iteration()
    assert _submitted(again) == 1
    assert sum(r.pilots for r in again.records if r.failure_kind == "max_waiting_cores") == 5
    assert _submitted(director.run_iteration()) == 0
    director.close()


def test_the_requests_carry_the_group_and_its_resources(queue, redis_server) -> None:
    client, key = queue
    client.rpush(key, *range(3))
    seen = []

    class Watching(TrackingBackend):
        @hookimpl
        def gridgate_submit(self, endpoint, request, timeout):
            seen.append((request.group, request.resources))
            return super().gridgate_submit(endpoint, request, timeout)

    backend = Watching(servers=1)
    source = {"redis": {"url": redis_server.url, "key": key}}
    resources = {"cores": 2, "memory_mb": 4000, "walltime": 3600, "tags": {"gpu": "a100"}}
    director = _director(
        backend, {"mc": {"backend": BACKEND, "source": source, "resources": resources}}
    )
    director.run_iteration()
    assert {s[0] for s in seen} == {"mc"}
    assert seen[0][1] == Resources(cores=2, memory_mb=4000, walltime=3600)
    assert dict(seen[0][1].tags) == {"gpu": "a100"}
    assert director.state.pilot_registry().waiting() == {(BACKEND, "s0", "mc"): (3, 6)}
    director.close()


def test_the_queue_demand_without_pilot_tracking_is_a_config_error_naming_the_key() -> None:
    source = {"redis": {"url": "redis://127.0.0.1:6379/0", "key": "tq:mc"}}
    doc = _doc({"mc": {"backend": BACKEND, "source": source}}, track=False)
    with pytest.raises(ConfigError) as caught:
        make_config(doc)
    assert "demand.queue" in str(caught.value) and "pilot tracking" in str(caught.value)


def test_a_group_naming_a_backend_that_is_not_configured_is_a_config_error(tmp_path) -> None:
    source = {"redis": {"url": "redis://127.0.0.1:6379/0", "key": "tq:mc"}}
    doc = _doc({"mc": {"backend": "nowhere", "source": source}})
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\n", encoding="utf-8")
    doc["backends"] = {"slurm": {"partitions": ["p"], "script": str(script)}}
    with pytest.raises(ConfigError) as caught:
        make_config(doc)
    assert "demand.queue.groups.mc.backend" in str(caught.value), str(caught.value)
    assert "'nowhere'" in str(caught.value)


@pytest.mark.parametrize(
    ("resources", "key"),
    [
        ({"cores": 0}, "cores"),
        ({"cores": 1025}, "cores"),
        ({"walltime": 30 * 86400 + 1}, "walltime"),
        ({"memory_mb": 0}, "memory_mb"),
        ({"tags": {"gpu": "x" * 300}}, "tags"),
        ({"disk": 3}, "disk"),
    ],
)
def test_resources_out_of_bounds_are_config_errors_naming_them(
    resources: dict[str, Any], key: str
) -> None:
    source = {"redis": {"url": "redis://127.0.0.1:6379/0", "key": "tq:mc"}}
    doc = _doc({"mc": {"backend": BACKEND, "source": source, "resources": resources}})
    with pytest.raises(ConfigError) as caught:
        make_config(doc)
    assert "demand.queue.groups.mc.resources" in str(caught.value), str(caught.value)
    assert key in str(caught.value)


def test_a_pilot_registry_that_cannot_be_read_asks_for_nothing_with_one_error(web, logs) -> None:
    url, server = web
    server.body = json.dumps({"mc": 5}).encode()
    down = RedisState(
        {"url": f"redis://127.0.0.1:{free_port()}/0", "socket_connect_timeout": 1},
        clock=FakeClock(),
    )
    group = {"backend": BACKEND, "source": {"http": {"url": url, "field": "mc"}}}
    plugin = build_plugin(QueueDemand, {"groups": {"mc": group}}, state=down)
    try:
        for number in range(3):
            demand = DemandRegistry()
            plugin.gridgate_demand(iteration=IterationInfo(number, 0.0), demand=demand)
            assert demand.requests == ()  # without the waiting pilots the figure only grows
    finally:
        plugin.close()
        down.close()
    errors = [m for level, m in logs if level == "ERROR" and "queue demand" in m]
    assert len(errors) == 1 and "already waiting" in errors[0], errors


def test_an_answer_nested_past_the_recursion_limit_costs_only_its_own_group(logs) -> None:
    """200,000 levels of ``[`` in 400 kB (under the size cap) raised RecursionError out of
    the source, failed the whole queue demand every iteration and skipped keep_last (issue 31,
    item 3); now it is one bad answer of that group's source, counted in its episode."""
    clock = FakeClock()
    backend = TrackingBackend(servers=2)
    with WebServer() as hostile, WebServer() as good:
        hostile.answers.body = json.dumps({"mc": 4}).encode()
        good.answers.body = json.dumps({"user": 3}).encode()
        groups = {
            "mc": {
                "backend": BACKEND,
                "source": {"http": {"url": hostile.url("/waiting"), "field": "mc"}},
                "keep_last": 120,
            },
            "user": {
                "backend": BACKEND,
                "source": {"http": {"url": good.url("/waiting"), "field": "user"}},
            },
        }
        director = _director(backend, groups, clock=clock)
        try:
            assert _submitted(director.run_iteration()) == 7
            depth = 200_000
            hostile.answers.body = b'{"mc": ' + b"[" * depth + b"]" * depth + b"}"
            assert len(hostile.answers.body) < 1024 * 1024  # the source's default max_bytes
            good.answers.body = json.dumps({"user": 5}).encode()
            clock.advance(30)
            summary = director.run_iteration()
            assert _submitted(summary) == 2, "the good group is sized as before"
            figures = {f.group: f for f in summary.demand}
            assert figures["mc"].jobs == 4 and not figures["mc"].fresh, "keep_last applies"
            assert "nested deeper than" in figures["mc"].problem, figures["mc"]
            clock.advance(200)  # past keep_last: the group asks for nothing, the other goes on
            good.answers.body = json.dumps({"user": 6}).encode()
            summary = director.run_iteration()
            figures = {f.group: f for f in summary.demand}
            assert figures["mc"].stale and figures["mc"].jobs == 0, figures["mc"]
            assert figures["user"].jobs == 6 and _submitted(summary) == 1
        finally:
            director.close()
    errors = [m for level, m in logs if level == "ERROR" and "waiting work of group mc" in m]
    assert len(errors) == 1 and "nested deeper than" in errors[0], errors
    assert not [m for level, m in logs if "RecursionError" in m]
