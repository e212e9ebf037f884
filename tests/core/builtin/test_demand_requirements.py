"""Demand matched to requirements (issue 45): a task queue that counts its waiting jobs per
requirement (cores, memory, walltime, tags), each count sent only to the endpoints whose
declared ``endpoint_resources`` can run it, each pilot asking what its jobs need; a
requirement no endpoint can run is told and accounted, never sent. Against a real
redis-server (a hash of requirement -> count) and a real local HTTP server (a JSON list)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.director import BACKEND, TrackingBackend
from support.web import Answers, WebServer

from gridgate.core import hookimpl
from gridgate.core.builtin.demand import QueueDemand
from gridgate.core.builtin.documents import requirement_of_label
from gridgate.core.builtin.waiting import WaitingGauges
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.fitting import Capacity, capacities, fits, requirement_label, unfit_reason
from gridgate.core.model import (
    BackendInfo,
    Endpoint,
    Resources,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.runner import run
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import make_config

#: s0 and s1 run 8-core pilots, s2 only single-core ones
DECLARED = {"s0": {"cores": 8}, "s1": {"cores": 8, "memory_mb": 32000}, "s2": {"cores": 1}}


class RecordingBackend(TrackingBackend):
    """The tracking testbed, keeping (endpoint name, request) of every submission."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.requests: list[tuple[str, SubmitRequest]] = []

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend == BACKEND:
            with self.lock:
                self.requests.append((endpoint.name, request))
        return super().gridgate_submit(endpoint, request, timeout)


def _director(backend: TrackingBackend, source: dict[str, Any], **group: Any) -> Director:
    clock = FakeClock()
    doc = {
        "director": {"cycle_seconds": 0.01, "max_threads": 4, "command_timeout": 5},
        "state": {"driver": "memory"},
        "demand": {"queue": {"groups": {"mc": {"backend": BACKEND, "source": source, **group}}}},
        "selectors": {"random": {"seed": 7}},
    }
    director = Director(
        make_config(doc), clock=clock, extra_plugins=[backend], state=MemoryState(clock=clock)
    )
    # the testbed backend is registered in-process: its section is set on the loaded config
    director.config.data["backends"] = {BACKEND: {"endpoint_resources": DECLARED}}
    return director


def test_a_redis_hash_of_requirements_sends_each_only_where_it_fits_asking_what_it_needs(
    queue, redis_server, logs
) -> None:
    client, key = queue
    client.hset(key, mapping={"cores=8,memory_mb=16000": 12, "cores=1": 4, "cores=64": 2})
    backend = RecordingBackend(servers=3)
    source = {"redis": {"url": redis_server.url, "key": key}}
    director = _director(backend, source, resources={"walltime": 3600})
    try:
        first = director.run_iteration()
        second = director.run_iteration()
    finally:
        director.close()
    asked: dict[str, set[tuple[str, Resources | None]]] = {}
    for name, request in backend.requests:
        asked.setdefault(request.group, set()).add((name, request.resources))
    eight = "mc[cores=8,memory_mb=16000,walltime=3600]"
    one = "mc[cores=1,walltime=3600]"
    # the 8-core pilots went only to the endpoints declaring 8 cores, each asking for 8
    assert {name for name, _r in asked[eight]} == {"s0", "s1"}
    assert {r for _n, r in asked[eight]} == {Resources(cores=8, memory_mb=16000, walltime=3600)}
    assert sum(r.count for _n, r in backend.requests if r.group == eight) == 12
    # the single-core ones anywhere, asking one core and the group's walltime
    assert {r for _n, r in asked[one]} == {Resources(cores=1, walltime=3600)}
    assert sum(r.count for _n, r in backend.requests if r.group == one) == 4
    # 64 cores: nobody can; skipped as no_fit both times, never sent, told once
    big = "mc[cores=64,walltime=3600]"
    assert big not in asked
    for summary in (first, second):
        skipped = [r for r in summary.records if r.group == big]
        assert [(r.outcome, r.failure_kind, r.pilots) for r in skipped] == [
            ("skipped", "no_fit", 2)
        ]
    told = [line for line in logs if "no endpoint can run" in line[1]]
    assert len(told) == 1 and told[0][0] == "WARNING", told
    assert "testbed/s0: cores=64 > 8" in told[0][1] and "testbed/s2: cores=64 > 1" in told[0][1]
    # the second iteration asked nothing more: each requirement's waiting pilots count apart
    assert [r for r in second.records if r.outcome == "submitted"] == []


def test_a_json_list_of_requirements_from_http_is_read_as_the_redis_hash_is(logs) -> None:
    with WebServer() as server:
        answers: Answers = server.answers
        answers.body = (
            json.dumps(
                {
                    "mc": [
                        {"count": 2, "cores": 8, "tags": {"gpu": "a100"}},
                        {"count": 1, "cores": 1},
                    ]
                }
            )
        ).encode()
        backend = RecordingBackend(servers=3)
        DECLARED["s1"]["tags"] = {"gpu": "a100"}
        try:
            source = {"http": {"url": server.url("/waiting"), "field": "mc"}}
            director = _director(backend, source)
            try:
                director.run_iteration()
            finally:
                director.close()
        finally:
            del DECLARED["s1"]["tags"]
    gpu = [(n, r) for n, r in backend.requests if r.group == "mc[cores=8,tags.gpu=a100]"]
    # only s1 offers the tag
    assert {n for n, _r in gpu} == {"s1"} and sum(r.count for _n, r in gpu) == 2
    assert {r.resources for _n, r in gpu} == {Resources(cores=8, tags={"gpu": "a100"})}
    assert gpu[0][1].resources is not None and gpu[0][1].resources.tags == {"gpu": "a100"}


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"cores=8,gpus=1": 2}, "'gpus' is unknown"),
        ({"cores=eight": 2}, "cores='eight' is not a whole number"),
        ({"cores=8": "many"}, "'many', not a count of jobs"),
        ({"cores=8": 2, "cores=8,": 1}, "is not NAME=VALUE"),
        ({"cores=2000": 1}, "<= 1024"),
    ],
)
def test_a_requirements_hash_that_is_not_one_is_a_source_failure_naming_the_field(
    queue, redis_server, fields: dict[str, Any], problem: str
) -> None:
    client, key = queue
    client.hset(key, mapping=fields)
    gauges = WaitingGauges({"mc": {"redis": {"url": redis_server.url, "key": key}}})
    try:
        figure = gauges.waiting_all()["mc"]
    finally:
        gauges.close()
    assert figure.problem is not None and problem in figure.problem, figure.problem
    assert f"the hash {key!r} field" in figure.problem
    assert figure.jobs == 0 and figure.by_requirement is None


def test_a_failing_source_keeps_its_last_figure_per_requirement(queue, redis_server) -> None:
    client, key = queue
    client.hset(key, mapping={"cores=8": 3, "cores=1": 1})
    clock = FakeClock()
    gauges = WaitingGauges({"mc": {"redis": {"url": redis_server.url, "key": key}}}, clock=clock)
    try:
        good = gauges.waiting_all()["mc"]
        client.delete(key)
        client.set(key, "not a queue")
        held = gauges.waiting_all()["mc"]
    finally:
        gauges.close()
    assert good.jobs == 4 and good.by_requirement is not None
    assert held.problem and not held.fresh and held.jobs == 4
    assert held.by_requirement == good.by_requirement


def test_fitting_compares_each_value_and_tag_and_what_the_backend_expresses() -> None:
    eight = Resources(cores=8, memory_mb=16000, walltime=7200, tags={"gpu": "a100"})
    assert fits(eight, None)  # declares nothing: runs anything
    assert fits(eight, Capacity(cores=8, memory_mb=16000, walltime=7200, tags={"gpu": "a100"}))
    assert unfit_reason(eight, Capacity(cores=4, walltime=3600, tags={"gpu": "v100"})) == (
        "cores=8 > 4, walltime=7200 > 3600, tags.gpu=a100 not offered"
    )
    info = BackendInfo("b", (Endpoint("b", "e"),), resources=("cores",))
    assert "memory_mb=16000, walltime=7200, tags.gpu=a100 cannot be expressed by backend b" in (
        unfit_reason(eight, None, info)
    )
    assert fits(Resources(cores=4), None, info)
    assert requirement_label(eight) == "cores=8,memory_mb=16000,walltime=7200,tags.gpu=a100"
    again = requirement_of_label(requirement_label(eight), "label")
    assert again.resources() == eight and again.resources().tags == {"gpu": "a100"}
    endpoints = (Endpoint("b", "e1"), Endpoint("b", "e2"))
    by_key = capacities({"endpoint_resources": {"b/e1": {"cores": 2}, "e2": {}}}, endpoints)
    assert by_key == {"b/e1": Capacity(cores=2), "b/e2": Capacity()}


def test_endpoint_resources_naming_an_unknown_endpoint_is_a_config_error_at_its_line(
    tmp_path: Path,
) -> None:
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\n")
    site = tmp_path / "site.yaml"
    doc = {
        "director": {"paused": True, "state_dir": str(tmp_path / "state")},
        "backends": {
            "slurm": {
                "partitions": ["grid", "long"],
                "script": str(script),
                "endpoint_resources": {"grid": {"cores": 8}, "gird": {"cores": 8}},
            }
        },
        "demand": {"static": {"slurm": 1}},
    }
    site.write_text(yaml.safe_dump(doc, sort_keys=False))
    gridgate = str(Path(sys.executable).parent / "gridgate")
    result = run([gridgate, "config", "validate", str(site)], 60)
    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    line = next(i for i, s in enumerate(site.read_text().splitlines(), 1) if "gird:" in s)
    assert f"{site}:{line}:" in text and "no endpoint is named 'gird'" in text, text
    assert "it has grid, long" in text, text


def test_a_queue_group_without_requirements_is_sized_as_before(queue, redis_server) -> None:
    client, key = queue
    client.rpush(key, *range(5))
    backend = RecordingBackend(servers=3)
    director = _director(backend, {"redis": {"url": redis_server.url, "key": key}})
    try:
        director.run_iteration()
    finally:
        director.close()
    assert {r.group for _n, r in backend.requests} == {"mc"}
    assert sum(r.count for _n, r in backend.requests) == 5
    assert isinstance(director, Director) and QueueDemand is not None
