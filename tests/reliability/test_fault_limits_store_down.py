"""Fault row (issue 21, item 8): the pilot limits hold while Redis is unavailable under a running
`gridgate run`. redis-server is SIGSTOPped (every call times out; its data is still there when
it is SIGCONTed) for several iterations; the stand-in gLite pilots never start (their clock
stands still), so `max_waiting` is the only thing that stops submission. Over the whole run the
director submits exactly `max_waiting` pilots, and every one of them is in the registry after
Redis is back. Before: each iteration during the outage submitted its whole demand, and those
pilots were never recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from relkit import HOSTS, Site, gridgate, wait_for
from support.redis_server import RedisServer

from gridgate.plugins.wms_glite.sim import write_scenario
from gridgate.plugins.wms_glite.sim.jobs import set_clock

MAX_WAITING = 10
DEMAND = 4


@pytest.mark.timeout(150)
def test_limits_hold_while_redis_is_stopped_under_a_running_director(
    tmp_path: Path, gridgate_exe: str, director_procs: list, figures
) -> None:
    site = Site(tmp_path / "site", hosts=HOSTS[:1])
    clock = tmp_path / "simclock"
    set_clock(clock, 1_800_000_000.0)
    write_scenario(
        site.scenario_path,
        {
            "state_dir": str(site.root / "simstate"),
            "calls_log": "",
            "clock_file": str(clock),
            "default": {"behaviour": "healthy"},
            "hosts": {},
        },
    )
    server = RedisServer(tmp_path / "redis").start()
    try:
        # a retry interval shorter than the socket timeout: during the outage every store call
        # goes to the stopped Redis and times out, none is answered from the local view unasked
        doc = site.doc(
            cycle_seconds=0.2, state_retry_seconds=0.1, pilots={"max_waiting": MAX_WAITING}
        )
        backend = doc["backends"]["wms_glite"]
        backend["list_match"] = False
        backend["commands"].update(
            {
                "status": str(site.bin / "glite-wms-job-status"),
                "cancel": str(site.bin / "glite-wms-job-cancel"),
            }
        )
        doc["state"] = {
            "driver": "redis",
            "url": server.url,
            "prefix": "lim:",
            # each call to the stopped Redis waits this long (0.5 s made the outage 25 s)
            "socket_timeout": 0.2,
            "socket_connect_timeout": 0.2,
        }
        doc["demand"] = {"static": {"wms_glite": DEMAND}}
        config = site.write(doc)
        out = tmp_path / "run.jsonl"
        with out.open("w") as sink, (tmp_path / "run.err").open("w") as err:
            proc = subprocess.Popen(
                [gridgate_exe, "run", "-c", str(config), "--json"], stdout=sink, stderr=err
            )
        director_procs.append(proc)

        def lines() -> list[dict]:
            return [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")]

        wait_for(lambda: len(lines()) >= 1, 60, "the first iteration")
        os.kill(server.proc.pid, signal.SIGSTOP)
        stopped_at = len(lines())
        try:
            wait_for(lambda: len(lines()) >= stopped_at + 8, 90, "8 iterations with Redis stopped")
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        outage = lines()[stopped_at:]
        resumed_at = len(lines())
        wait_for(lambda: len(lines()) >= resumed_at + 5, 60, "5 iterations with Redis back")
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        docs = lines()
        submitted = [j for d in docs for s in d["submitted"] for j in s["job_ids"]]
        summary = gridgate(gridgate_exe, "pilots", "list", "-c", str(config), "--json")
        assert summary.returncode == 0, summary.stderr
        registry = {p["job_id"]: p["state"] for p in json.loads(summary.stdout)["pilots"]}
        figures(
            iterations=len(docs),
            outage_iterations=len(outage),
            submitted=len(submitted),
            during_outage=sum(d["pilots_submitted"] for d in outage),
            in_registry=len(registry),
        )
        assert len(outage) >= 8
        assert len(submitted) == MAX_WAITING  # never more, outage included
        assert set(registry) == set(submitted)  # the outage's pilots were written back
        assert set(registry.values()) == {"waiting"}
        assert "Traceback" not in (tmp_path / "run.err").read_text()
    finally:
        server.stop()
