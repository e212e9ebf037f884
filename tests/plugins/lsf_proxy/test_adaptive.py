"""Limits that follow the scheduler (plugins/lsf_proxy/daemon/adaptive.py): the AIMD rule on
readings of sdiag's shape, and a real daemon lowering its query max from the private Slurm
controller's own latency, applied to the tokens it grants."""

from __future__ import annotations

import shutil
import subprocess
import threading

from support.polling import until

from gridgate.core.model import RpcCount, SchedulerRPCs
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.config import Limits
from gridgate.plugins.lsf_proxy.daemon.adaptive import (
    AdaptiveLimit,
    AdaptiveSettings,
    category_types,
)
from gridgate.plugins.lsf_proxy.section import ProxydSection


def rule(ceiling: int = 100, **entry) -> AdaptiveLimit:
    given = {"target_ms": 50, "min": 2, "max": 32, "min_requests": 5, **entry}
    return AdaptiveLimit(AdaptiveSettings.from_entry("query", given), ceiling)


def reading(count: int, total_ms: float, since: float = 1.0, **load: float) -> SchedulerRPCs:
    return SchedulerRPCs(
        "slurm",
        ok=True,
        since=since,
        by_type={"REQUEST_JOB_INFO": RpcCount(count, total_ms)},
        load={"server_threads": 3, **load},
    )


def test_slow_multiplies_the_max_down_and_fast_adds_one_back_within_min_and_max() -> None:
    limit = rule()
    assert limit.limit == 32, "starts where the configuration puts it"
    assert limit.observe(reading(0, 0), 0) is None, "the first reading is a baseline"
    down = limit.observe(reading(10, 1000), 5)  # 10 RPCs, 100 ms each: above 50
    assert (down.before, down.after) == (32, 24) and "slow" in down.reason
    assert down.latency_ms == 100
    seen = [limit.limit]
    for step in range(1, 10):  # 10 RPCs of 100 ms in each interval
        limit.observe(reading(10 + 10 * step, 1000 + 1000 * step), 5 + step)
        seen.append(limit.limit)
    assert seen == [24, 18, 13, 9, 6, 4, 3, 2, 2, 2], "x 0.75 each time, never below min"
    fast = limit.observe(reading(220, 10100), 30)  # 120 RPCs at 0.83 ms each
    assert (fast.before, fast.after) == (2, 3) and "within the target" in fast.reason


def test_no_signal_keeps_the_max_and_a_reset_is_a_new_baseline() -> None:
    limit = rule()
    limit.observe(reading(100, 100), 0)
    quiet = limit.observe(reading(103, 1000), 5)  # 3 RPCs: fewer than min_requests
    assert (quiet.before, quiet.after) == (32, 32) and "no signal" in quiet.reason
    assert limit.observe(reading(5, 10, since=2.0), 10) is None, "restart: new baseline"
    assert limit.observe(SchedulerRPCs("slurm", ok=False, message="down"), 15) is None
    assert limit.limit == 32


def test_the_controllers_own_load_can_count_as_slow() -> None:
    limit = rule(max_server_threads=10, max_agent_queue=4)
    limit.observe(reading(0, 0), 0)
    busy = limit.observe(reading(10, 10, server_threads=40), 5)
    assert busy.after == 24 and "40 server threads" in busy.reason
    queued = limit.observe(reading(20, 20, agent_queue=9), 10)
    assert queued.after == 18 and "agent queue 9" in queued.reason


def test_the_policy_max_is_a_ceiling_and_nominal_follows_the_cap() -> None:
    limit = rule(ceiling=8)
    assert limit.limit == 8, "never above the category's max in policies"
    limit.limit = 3
    capped = limit.cap(Limits(max=8, nominal=5, throttle=0.001))
    assert (capped.max, capped.nominal) == (3, 3)
    limit.limit = 20
    assert limit.cap(Limits(max=8, nominal=5)) == Limits(max=8, nominal=5)


def test_the_signal_is_the_categorys_rpc_types_not_the_daemons_own_reading() -> None:
    query = category_types("query")
    assert {"REQUEST_JOB_INFO", "REQUEST_PARTITION_INFO", "REQUEST_NODE_INFO"} <= set(query)
    assert "REQUEST_STATS_INFO" not in query, "the daemon's own sdiag"
    assert category_types("submission") == (
        "REQUEST_RESOURCE_ALLOCATION",
        "REQUEST_SUBMIT_BATCH_JOB",
    )


def test_min_above_max_is_named() -> None:
    problems = ProxydSection.config_errors({"adaptive": {"query": {"min": 9, "max": 4}}})
    assert problems == [(("adaptive", "query", "min"), "min (9) must not exceed max (4)")]


def status(daemon) -> dict:
    with ProxyClient([Daemon("proxyd", daemon.socket)]) as client:
        [reply] = client.admin("status")
    return reply.reply["status"]


SQUEUE = shutil.which("squeue", path="/usr/bin:/bin")


def adaptive_daemon(start_daemon, slurm, policies: str, **query):
    """A real daemon whose query max follows the private cluster (min 2, max 12, every second)."""
    sdiag = shutil.which("sdiag", path="/usr/bin:/bin")
    entry = {"min": 2, "max": 12, "interval": 1, "min_requests": 1, **query}
    return start_daemon(
        {
            "policies": policies,
            "bypass": {"scheduler_options": {"commands": {"sdiag": sdiag}, "env": slurm.env}},
            "adaptive": {"query": entry},
        }
    )


def test_a_slow_controller_lowers_the_daemons_query_max_to_min(slurm, start_daemon) -> None:
    target_ms = 0.001  # any RPC takes longer than 1 us: the controller is "slow"
    daemon = adaptive_daemon(start_daemon, slurm, "QUERY[max=16 nominal=8]", target_ms=target_ms)
    assert status(daemon)["categories"]["query"]["token_limit"] == 12, "the adaptive max"
    done = threading.Event()

    def load() -> None:
        while not done.is_set():
            subprocess.run([SQUEUE, "-h"], capture_output=True, env=slurm.client_env(), timeout=60)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        assert until(lambda: status(daemon)["adaptive"]["query"]["limit"] == 2, timeout=60), status(
            daemon
        )["adaptive"]
    finally:
        done.set()
        worker.join(60)
    seen = status(daemon)
    assert seen["categories"]["query"]["token_limit"] == 2
    assert seen["categories"]["query"]["nominal"] == 2
    assert seen["categories"]["submission"]["token_limit"] == 100, "only the category named"
    last = seen["adaptive"]["query"]["last"]
    assert last["after"] == 2 and "slow" in last["reason"] and last["latency_ms"] > target_ms
    assert "proxyd.adaptive: query max 12 -> 9" in daemon.log()


def test_the_max_goes_down_under_load_and_up_after_it_within_min_and_max(
    slurm, start_daemon
) -> None:
    # the controller's thread count is the signal here: idle it runs 3 threads, under a
    # dozen parallel squeue loops many more
    daemon = adaptive_daemon(
        start_daemon, slurm, "QUERY[max=16 nominal=16]", target_ms=100000, max_server_threads=4
    )

    def limit() -> int:
        return status(daemon)["adaptive"]["query"]["limit"]

    def flood(stop: threading.Event) -> None:
        while not stop.is_set():
            subprocess.run([SQUEUE, "-h"], capture_output=True, env=slurm.client_env(), timeout=60)

    heavy = threading.Event()
    workers = [threading.Thread(target=flood, args=(heavy,), daemon=True) for _ in range(12)]
    for worker in workers:
        worker.start()
    try:
        assert until(lambda: limit() <= 4, timeout=90), status(daemon)["adaptive"]
    finally:
        heavy.set()
        for worker in workers:
            worker.join(60)
    low = limit()
    assert low >= 2, "never below min"
    light = threading.Event()
    one = threading.Thread(target=flood, args=(light,), daemon=True)  # one caller at a time
    one.start()
    try:
        assert until(lambda: limit() >= low + 3, timeout=90), status(daemon)["adaptive"]
        assert until(lambda: limit() == 12, timeout=90), "back to max, never above it"
    finally:
        light.set()
        one.join(60)
    decisions = status(daemon)["adaptive"]["query"]["decisions"]
    assert all(d["after"] <= 12 for d in decisions)
    assert "server threads" in daemon.log() and "within the target" in daemon.log()
