"""Issue 42: the token daemon's alerts proven on a real daemon and a real Prometheus with the
shipped rules (every ``for`` cut to 0 s, as a site may shorten it): a category the adaptive limit
holds at its low, and a user going around the gate (the bypass audit on the private Slurm
cluster). Each fires when its condition holds, alone, and resolves when it ends."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from support.holders import holders, stop
from support.lsfproxyd import system_tool
from support.polling import until
from support.prometheus import firing, wait_for
from support.uids import AS_NOBODY, as_user, real_user

from gridgate.core.devkit.services import free_port


def alerts(prom: Any) -> set[str]:
    return {a["labels"]["alertname"] for a in prom.firing()}


def test_a_category_held_at_its_adaptive_low_fires_its_alert_and_resolves(
    start_daemon: Any, prometheus_factory: Any
) -> None:
    port = free_port()
    daemon = start_daemon(
        {
            "metrics_port": port,
            "policies": "QUERY[max=16 nominal=16]",
            "adaptive": {
                "query": {
                    "source": "tokens",
                    "target_ms": 150,
                    "min": 2,
                    "max": 6,
                    "interval": 1,
                    "min_requests": 1,
                }
            },
        }
    )
    prom = prometheus_factory({"gridgate-proxyd": port})
    slow = holders(daemon.socket, 3, 0.5)  # holds of 500 ms against a target of 150
    try:
        (alert,) = wait_for(
            "the adaptive alert", lambda: firing(prom, "GridgateTokenDaemonAdaptiveAtLow"), 120
        )
        assert alert["labels"]["category"] == "query", alert
        assert alert["annotations"]["summary"].endswith(
            "query held at its adaptive low of 2 tokens"
        )
        assert {a["labels"]["alertname"] for a in prom.firing()} == {
            "GridgateTokenDaemonAdaptiveAtLow"
        }
    finally:
        stop(slow)
    fast = holders(daemon.socket, 2, 0.005)  # within the target: the max grows off its low
    try:
        assert until(
            lambda: not firing(prom, "GridgateTokenDaemonAdaptiveAtLow"), timeout=120, pause=0.5
        ), daemon.status()["adaptive"]
        assert prom.firing() == []
    finally:
        stop(fast)


def test_a_user_going_around_the_gate_fires_the_bypass_alert_and_it_resolves(
    slurm: Any, start_daemon: Any, prometheus_factory: Any
) -> None:
    port = free_port()
    daemon = start_daemon(
        {
            "metrics_port": port,
            "bypass": {
                "scheduler": "slurm",
                "scheduler_options": {
                    "commands": {
                        "sdiag": system_tool("sdiag"),
                        "scontrol": system_tool("scontrol"),
                    },
                    "env": dict(slurm.env),
                },
                "audit": {"interval": 1, "tolerance": 3},
            },
        }
    )
    assert until(lambda: daemon.status()["bypass"]["windows"] >= 1, timeout=30), daemon.log()
    prom = prometheus_factory({"gridgate-proxyd": port})
    with real_user("ggby") as rogue:
        going = {"on": True}

        def around() -> list[dict[str, Any]]:
            if going["on"]:  # squeue straight to the controller, no token: the bypass
                done = subprocess.run(
                    [*as_user(rogue), system_tool("squeue"), "-h"],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    env=slurm.client_env(),
                    cwd="/",
                )
                assert done.returncode == 0, done.stderr
            return firing(prom, "GridgateSchedulerBypassed")

        (alert,) = wait_for("the bypass alert", around, 120)
        assert alert["labels"]["user"] == rogue, alert
        assert alert["annotations"]["summary"].startswith(f"user {rogue} made ")
        assert {a["labels"]["alertname"] for a in prom.firing()} == {"GridgateSchedulerBypassed"}
        going["on"] = False  # clean windows: the user leaves the gauge, the alert resolves
        assert until(lambda: not around(), timeout=120, pause=0.5), daemon.status()["bypass"]
        assert prom.firing() == []


#: an ordinary user's client asking for query tokens in a loop, a denial taken as it comes
ASKER = r"""
import sys, threading
from loguru import logger
logger.remove()
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
client = ProxyClient([Daemon("proxyd", sys.argv[1])])
def loop():
    while True:
        try:
            with client.acquire("query", "squeue"):
                threading.Event().wait(1.0)
        except Exception:
            pass
for _ in range(int(sys.argv[2])):
    threading.Thread(target=loop, daemon=True).start()
print("asking", flush=True)
threading.Event().wait()
"""


def test_a_daemon_refusing_for_lack_of_tokens_fires_and_resolves(
    start_daemon: Any, prometheus_factory: Any
) -> None:
    port = free_port()
    daemon = start_daemon(
        {
            "metrics_port": port,
            "policies": "QUERY[max=1 nominal=1]",
            "token_wait_time": 0.2,  # 4 askers, 1 token held a second: most are denied
        }
    )
    prom = prometheus_factory({"gridgate-proxyd": port}, {"[10m]": "[10s]"})
    askers = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", ASKER, daemon.socket, "4"],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert askers.stdout is not None and askers.stdout.readline() == "asking\n"
        (alert,) = wait_for("refusing", lambda: firing(prom, "GridgateTokenDaemonRefusing"))
        assert alert["labels"]["category"] == "query", alert
        assert alerts(prom) == {"GridgateTokenDaemonRefusing"}
    finally:
        stop(askers)
    assert until(lambda: not prom.firing(), timeout=90, pause=0.5), prom.firing()
