"""Limits that follow the scheduler (plugins/lsf_proxy/daemon/adaptive.py): the AIMD rule on
readings of sdiag's shape, and a real daemon lowering its query max from the private Slurm
controller's own latency, applied to the tokens it grants."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading

from support.holders import holders, stop
from support.polling import until
from support.uids import as_user

from gridgate.core.scheduler import RpcCount, SchedulerRPCs
from gridgate.plugins.lsf_proxy.cli import render
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
    return AdaptiveLimit("query", AdaptiveSettings.of(given), ceiling)


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
    down = limit.observe(reading(10, 600), 5)  # 10 RPCs, 60 ms each: above 50
    assert (down.before, down.after) == (32, 24) and "slow" in down.reason
    assert down.latency_ms == 60
    seen = [limit.limit]
    for step in range(1, 10):  # 10 RPCs of 60 ms in each interval
        limit.observe(reading(10 + 10 * step, 600 + 600 * step), 5 + step)
        seen.append(limit.limit)
    assert seen == [24, 18, 13, 9, 6, 4, 3, 2, 2, 2], "x 0.75 each time, never below min"
    fast = limit.observe(reading(220, 6100), 30)  # 120 RPCs at 0.83 ms each
    assert (fast.before, fast.after) == (2, 3) and "within the target" in fast.reason


def test_far_over_the_target_the_cut_is_in_proportion() -> None:
    limit = rule()
    limit.observe(reading(0, 0), 0)
    steep = limit.observe(reading(10, 4000), 5)  # 400 ms each, 8x the target: x 1/8
    assert (steep.before, steep.after) == (32, 4)
    floor = limit.observe(reading(20, 104000), 10)  # 10 s each: down to min, not to 0
    assert floor.after == 2


def test_grow_after_waits_for_intervals_in_a_row_within_the_target() -> None:
    limit = rule(grow_after=3)
    limit.observe(reading(0, 0), 0)
    limit.limit = 5
    afters = []
    for step in range(1, 8):
        limit.observe(reading(10 * step, 10 * step), step)  # 1 ms: within the target
        afters.append(limit.limit)
    assert afters == [5, 5, 6, 6, 6, 7, 7]
    assert "1 of 3 intervals before it grows" in limit.decisions[-1].reason
    limit.observe(reading(80, 70 + 600), 8)  # slow: the count starts again
    assert limit.limit == 5
    limit.observe(reading(90, 680), 9)
    limit.observe(reading(100, 690), 10)
    assert limit.limit == 5 and limit.good == 2


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
    assert limit.cap(Limits(max=8, nominal=5, user_max=7)) == Limits(max=8, nominal=5, user_max=7)


def test_one_user_never_takes_the_reserve_of_the_adaptive_max() -> None:
    limit = rule(ceiling=8)  # reserve 1, the default
    limit.limit = 3
    assert limit.cap(Limits(max=8, nominal=8)).user_max == 2, "a token free for a newcomer"
    assert limit.user_max == 2 and limit.status()["user_max"] == 2
    limit.limit = 20  # at the policy's max: the reserve holds there too
    assert limit.cap(Limits(max=8, nominal=8)) == Limits(max=8, nominal=8, user_max=7)
    limit.limit = 6  # the policy's own user_max stays when it already leaves the reserve
    assert limit.cap(Limits(max=8, nominal=8, user_max=2)).user_max == 2
    limit.limit = 2
    assert limit.cap(Limits(max=8, nominal=8, user_max=2)).user_max == 1
    single = rule(ceiling=8, min=1)
    single.limit = 1  # nothing to keep back from a single token
    assert single.cap(Limits(max=8, nominal=8)) == Limits(max=1, nominal=1)
    wide = rule(ceiling=8, reserve=3)
    wide.limit = 5
    assert wide.cap(Limits(max=8, nominal=8)).user_max == 2
    none = rule(ceiling=8, reserve=0)
    none.limit = 5
    assert none.cap(Limits(max=8, nominal=8)) == Limits(max=5, nominal=5)


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
    assert daemon.status()["categories"]["query"]["token_limit"] == 12, "the adaptive max"
    done = threading.Event()

    def load() -> None:
        while not done.is_set():
            subprocess.run([SQUEUE, "-h"], capture_output=True, env=slurm.client_env(), timeout=60)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        assert until(lambda: daemon.status()["adaptive"]["query"]["limit"] == 2, timeout=60), (
            daemon.status()["adaptive"]
        )
    finally:
        done.set()
        worker.join(60)
    seen = daemon.status()
    assert seen["categories"]["query"]["token_limit"] == 2
    assert seen["categories"]["query"]["nominal"] == 2
    assert seen["adaptive"]["query"]["user_max"] == 1, "one of the 2 kept for a newcomer"
    assert seen["categories"]["submission"]["token_limit"] == 100, "only the category named"
    last = seen["adaptive"]["query"]["last"]
    assert last["after"] == 2 and "slow" in last["reason"] and last["latency_ms"] > target_ms
    # a latency thousands of times the target: cut to min in one step, not seven of x 0.75
    assert "proxyd.adaptive: query max 12 -> 2: slow: " in daemon.log()
    # reaching its low is the one step said as a WARNING (issue 42: 20 warnings in 90 s before)
    assert re.search(
        r"WARNING\s+proxyd\.adaptive: query max 12 -> 2: slow: .*\(its low\)", daemon.log()
    )


def test_the_max_goes_down_under_load_and_up_after_it_within_min_and_max(
    slurm, start_daemon
) -> None:
    # the controller's thread count is the signal here: idle it runs 3 threads, under a
    # dozen parallel squeue loops many more
    daemon = adaptive_daemon(
        start_daemon, slurm, "QUERY[max=16 nominal=16]", target_ms=100000, max_server_threads=4
    )

    def limit() -> int:
        return daemon.status()["adaptive"]["query"]["limit"]

    def flood(stop: threading.Event) -> None:
        while not stop.is_set():
            subprocess.run([SQUEUE, "-h"], capture_output=True, env=slurm.client_env(), timeout=60)

    heavy = threading.Event()
    workers = [threading.Thread(target=flood, args=(heavy,), daemon=True) for _ in range(12)]
    for worker in workers:
        worker.start()
    try:
        assert until(lambda: limit() <= 4, timeout=90), daemon.status()["adaptive"]
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
        assert until(lambda: limit() >= low + 3, timeout=90), daemon.status()["adaptive"]
        assert until(lambda: limit() == 12, timeout=90), "back to max, never above it"
    finally:
        light.set()
        one.join(60)
    decisions = daemon.status()["adaptive"]["query"]["decisions"]
    assert all(d["after"] <= 12 for d in decisions)
    assert "server threads" in daemon.log() and "within the target" in daemon.log()


ONE = r"""
import json, sys
from loguru import logger
logger.remove()
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
with ProxyClient([Daemon("proxyd", sys.argv[1])]) as client:
    with client.acquire("query", "squeue") as token:
        print(json.dumps({"waited": token.waited}))
"""


def tokens_daemon(start_daemon, section: dict | None = None, **entry):  # noqa: ANN201
    """A real daemon whose query max (2-6, from 16) follows its tokens' holds, target 150 ms,
    a decision a second; ``section`` and ``entry`` add to its ``proxyd:`` and the entry."""
    query = {
        "source": "tokens",
        "target_ms": 150,
        "min": 2,
        "max": 6,
        "interval": 1,
        "min_requests": 1,
        **entry,
    }
    return start_daemon(
        {"policies": "QUERY[max=16 nominal=16]", **(section or {}), "adaptive": {"query": query}}
    )


def test_the_tokens_own_hold_times_lower_the_max_and_raise_it_keeping_a_newcomers_token(
    start_daemon,
) -> None:
    # source tokens reads no scheduler: the daemon times the holds of its own tokens
    daemon = tokens_daemon(start_daemon)

    def adaptive() -> dict:
        return daemon.status()["adaptive"]["query"]

    slow = holders(daemon.socket, 6, 0.4)  # every command holds its token 400 ms
    try:
        assert until(lambda: adaptive()["limit"] == 2, timeout=60), adaptive()
        seen = daemon.status()
        assert seen["categories"]["query"]["token_limit"] == 2
        assert seen["adaptive"]["query"]["user_max"] == 1
        last = seen["adaptive"]["query"]["last"]
        assert "median hold of" in last["reason"] and last["latency_ms"] >= 400
        with ProxyClient([Daemon("proxyd", daemon.socket)]) as client:
            lines = render.status_text(client.admin("status"))
        prefix = "  ADAPTIVE_LIMIT: QUERY=2 (tokens, 2-6, target 150 ms): slow: "
        assert any(line.startswith(prefix) for line in lines), lines
        # nobody floods at its cap of 1 (once the tokens it held over the new max came back:
        # a cut takes no token back); another user finds the reserved token free
        assert until(lambda: daemon.status()["categories"]["query"]["in_use"] == 1, timeout=30)
        other = subprocess.run(
            [*as_user("daemon"), sys.executable, "-c", ONE, daemon.socket],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert other.returncode == 0, other.stderr
        assert json.loads(other.stdout) == {"waited": 0.0}, "granted at once, no queue"
    finally:
        stop(slow)
    fast = holders(daemon.socket, 2, 0.005)
    try:
        assert until(lambda: adaptive()["limit"] == 6, timeout=90), adaptive()
    finally:
        stop(fast)
    decisions = adaptive()["decisions"]
    assert all(2 <= d["after"] <= 6 for d in decisions)
    assert "within the target" in decisions[-1]["reason"]
    log = daemon.log()
    assert "proxyd.adaptive: query follows its tokens' hold times" in log
    assert "proxyd.adaptive: query max 6 -> " in log and " ms median hold of " in log
    # the loop doing its work is INFO: growth within the target, and cuts above the low
    steps = re.findall(r"(\w+)\s+proxyd\.adaptive: query max (\d+) -> (\d+): ([^\n]*)", log)
    assert any("within the target" in why for _l, _b, _a, why in steps), steps
    for level, _before, after, why in steps:
        assert level == ("WARNING" if why.endswith("(its low)") else "INFO"), (level, why)
        assert why.endswith("(its low)") == (int(after) == 2 and "slow" in why), why


def test_light_users_holds_over_the_target_cut_the_max_when_the_intervals_are_within() -> None:
    limit = rule(source="tokens", light_window=10, min_requests=1)
    flood = [0.040] * 20  # a flood's niced commands: within the 50 ms target
    calm = limit.observe_holds(flood, 1, light=[0.060, 0.070])
    assert calm.after == calm.before == 32, "two light holds are no signal yet"
    cut = limit.observe_holds(flood, 2, light=[0.060, 0.070, 0.065])
    assert (cut.before, cut.after) == (32, 24) and cut.latency_ms == 65
    assert "65.0 ms median hold of 3 light users' tokens in 10 s" in cut.reason
    fine = limit.observe_holds(flood, 3, light=[0.030, 0.030, 0.030])
    assert fine.latency_ms == 40, "the higher of the two medians"
    # without light_window the light holds are not read
    assert rule(source="tokens", min_requests=1).observe_holds(flood, 1).latency_ms == 40


def test_the_daemon_cuts_the_max_for_a_light_users_slow_tokens_beside_a_fast_flood(
    start_daemon,
) -> None:
    daemon = tokens_daemon(start_daemon, {"busy_after": 2}, grow_after=100, light_window=30)

    def adaptive() -> dict:
        return daemon.status()["adaptive"]["query"]

    # nobody: 8 callers holding 50 ms each, so that it has 2 or more in flight (busy) whenever
    # a token of its comes back, however loaded the host (with 6 callers holding 5 ms and
    # busy_after 4, a loaded CI host saw some of them come back light, and the light median
    # was the flood's)
    flood = holders(daemon.socket, 8, 0.05)
    try:
        assert until(lambda: len(adaptive()["decisions"]) >= 3, timeout=60), adaptive()
        assert adaptive()["limit"] == 6, "the flood alone is within the target"
        # a light user (one call at a time) whose commands take 400 ms: five of them
        light = holders_as("daemon", daemon.socket, 5)
        assert light.returncode == 0, light.stderr
        assert until(lambda: adaptive()["limit"] < 6, timeout=60), adaptive()
        reasons = [d["reason"] for d in adaptive()["decisions"]]
        assert any("light users' tokens in 30 s" in why for why in reasons), reasons
    finally:
        stop(flood)


#: One call at a time: each token held while its "command" runs 400 ms (the hold the daemon
#: times on its own clock, so a real wait here, not an injected clock)
LIGHT = r"""
import sys, time
from loguru import logger
logger.remove()
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
with ProxyClient([Daemon("proxyd", sys.argv[1])]) as client:
    for _ in range(int(sys.argv[2])):
        with client.acquire("query", "squeue"):
            time.sleep(0.4)
"""


def holders_as(user: str, socket: str, calls: int) -> subprocess.CompletedProcess:
    """``calls`` query tokens one after the other as ``user``, each held 400 ms."""
    return subprocess.run(
        [*as_user(user), sys.executable, "-c", LIGHT, socket, str(calls)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


def test_light_window_under_a_scheduler_source_is_named() -> None:
    entry = {"source": "sdiag", "light_window": 10}
    problems = ProxydSection.config_errors({"adaptive": {"query": entry}})
    assert problems == [
        (
            ("adaptive", "query", "light_window"),
            "light_window watches the tokens' hold times; source sdiag reads the scheduler "
            "(use source: tokens)",
        )
    ]


def test_a_scheduler_only_key_under_source_tokens_is_named() -> None:
    entry = {"source": "tokens", "max_server_threads": 4}
    problems = ProxydSection.config_errors({"adaptive": {"query": entry}})
    assert problems == [
        (
            ("adaptive", "query", "max_server_threads"),
            "max_server_threads is read from the scheduler; source tokens measures the "
            "tokens' hold times (use source: sdiag)",
        )
    ]
