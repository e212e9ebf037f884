"""Daemon behaviour that depends on time, on a FakeClock: the daemon runs in-process (a thread
with its own event loop) on a real socket, clients are real processes; nobody sleeps for an
expiry."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from loguru import logger
from support.polling import until
from support.uids import AS_NOBODY

from gridgate.core.clock import FakeClock
from gridgate.plugins.lsf_proxy.cli import render
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.config import section_defaults
from gridgate.plugins.lsf_proxy.daemon.daemon import ProxyDaemon

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def fake_daemon(sockdir):
    """Start a daemon on a FakeClock in a thread; yields (daemon, clock)."""
    started = []

    def start(**overrides):
        section = section_defaults()
        section.update(socket=str(sockdir / "fake.sock"), **overrides)
        clock = FakeClock(time.time())
        daemon = ProxyDaemon(section, clock=clock)
        ready = threading.Event()
        daemon.on_ready = lambda _d: ready.set()
        thread = threading.Thread(
            target=lambda: asyncio.run(daemon.serve(install_signals=False)), daemon=True
        )
        thread.start()
        assert ready.wait(20), "daemon did not start"
        started.append((daemon, thread))
        return daemon, clock

    yield start
    for daemon, thread in started:
        daemon.stop()
        thread.join(20)
        assert not thread.is_alive()


def admin_status(path: str) -> dict:
    with ProxyClient([Daemon("d", path)]) as client:
        (reply,) = client.admin("status")
    return reply.reply["status"]


def test_lease_expiry_counts_as_error_and_is_logged(fake_daemon):
    daemon, clock = fake_daemon(lease_time=30)
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="WARNING", format="{message}")
    try:
        client = ProxyClient([Daemon("d", daemon.socket_path)])
        token = client.acquire("submission", "BATCH_JOB_SUB")
        assert admin_status(daemon.socket_path)["categories"]["submission"]["in_use"] == 1
        clock.advance(29)
        daemon.wake()
        assert admin_status(daemon.socket_path)["categories"]["submission"]["in_use"] == 1
        clock.advance(1)
        daemon.wake()
        assert until(
            lambda: admin_status(daemon.socket_path)["categories"]["submission"]["in_use"] == 0
        )
        status = admin_status(daemon.socket_path)
        assert status["metrics"]["error"]["current"] == 1
        assert any(
            "lease of token" in line and "root@" in line and "expired" in line for line in seen
        )
        client.release(token)  # late release: harmless
        client.close()
    finally:
        logger.remove(sink)


def test_ordinary_user_waits_then_is_denied_at_the_wait_limit(fake_daemon):
    daemon, clock = fake_daemon(policies="QUERY[max=1]", token_wait_time=15)
    root = ProxyClient([Daemon("d", daemon.socket_path)])
    held = root.acquire("query")  # root counts: max reached
    code = (
        "import json; from gridgate.plugins.lsf_proxy.client.client import *\n"
        f"c = ProxyClient([Daemon('d', {daemon.socket_path!r})], notoken_ntries=1)\n"
        "try:\n    t = c.acquire('query', 'BATCH_JOB_QUERY')\n    print(json.dumps({'token': t.id}))\n"
        "except NoToken as e:\n    print(json.dumps({'denied': e.reason}))\n"
    )
    waiter = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd="/"
    )
    try:
        assert until(lambda: admin_status(daemon.socket_path)["categories"]["query"]["queued"] == 1)
        clock.advance(14.5)
        daemon.wake()
        assert admin_status(daemon.socket_path)["categories"]["query"]["queued"] == 1
        clock.advance(0.5)
        daemon.wake()
        assert json.loads(waiter.stdout.readline()) == {"denied": "timeout"}
        assert waiter.wait(20) == 0
        assert admin_status(daemon.socket_path)["metrics"]["rejected.query"]["current"] == 1
    finally:
        if waiter.poll() is None:
            waiter.kill()
        waiter.wait(10)
        waiter.stdout.close()
        root.release(held)
        root.close()


def test_waiter_granted_round_robin_when_tokens_come_back(fake_daemon):
    daemon, clock = fake_daemon(policies="QUERY[max=1 throttle=1]")
    root = ProxyClient([Daemon("d", daemon.socket_path)])
    held = root.acquire("query")
    code = (
        "import json, sys; from gridgate.plugins.lsf_proxy.client.client import *\n"
        f"c = ProxyClient([Daemon('d', {daemon.socket_path!r})])\n"
        "t = c.acquire('query'); print(json.dumps({'token': t.id, 'waited': t.waited}), flush=True)\n"
        "sys.stdin.readline(); t.release()\n"
    )
    waiter = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert until(lambda: admin_status(daemon.socket_path)["categories"]["query"]["queued"] == 1)
        clock.advance(3)
        root.release(held)
        got = json.loads(waiter.stdout.readline())
        assert got["token"] and got["waited"] == pytest.approx(3, abs=0.01)
        assert admin_status(daemon.socket_path)["categories"]["query"]["in_use"] == 1
        waiter.stdin.write("\n")
        waiter.stdin.flush()
        assert waiter.wait(20) == 0
        assert until(lambda: admin_status(daemon.socket_path)["categories"]["query"]["in_use"] == 0)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        waiter.wait(10)
        waiter.stdout.close()
        waiter.stdin.close()
        root.close()


def test_diagnose_for_a_duration_turns_itself_off(fake_daemon, sockdir):
    daemon, clock = fake_daemon()
    with ProxyClient([Daemon("d", daemon.socket_path)]) as client:
        (on,) = client.admin("diagnose", on=True, minutes=1, file="timed.log")
        assert on.reply["ok"], on.reply
        assert on.reply["file"] == str(sockdir / "timed.log")
        assert abs(on.reply["until"] - (clock.time() + 60)) < 1
        client.acquire("query", "bjobs", 13).release()
        clock.advance(59)
        daemon.wake()
        assert admin_status(daemon.socket_path)["diagnose"] is True
        client.acquire("query", "bhosts", 7).release()
        clock.advance(1)
        daemon.wake()
        assert until(lambda: admin_status(daemon.socket_path)["diagnose"] is False)
        client.acquire("query", "bjobs", 13).release()  # not logged: diagnosis is over
        # the named file held for that diagnosis only
        assert admin_status(daemon.socket_path)["diagnose_file"].endswith(
            "info.lsfproxydlog." + daemon.local_host
        )
    lines = (sockdir / "timed.log").read_text().splitlines()
    assert [line.split(" ", 4)[4].split(",")[:5] for line in lines] == [
        ["QUERY_REQ", "BATCH_JOB_QUERY", "root", daemon.local_host, "13"],
        ["QUERY_REQ", "BATCH_HOST_INFO", "root", daemon.local_host, "7"],
    ]


RATED = """
import json, sys
from gridgate.plugins.lsf_proxy.client.client import Daemon, NoToken, ProxyClient
c = ProxyClient([Daemon("d", sys.argv[1])], notoken_ntries=1, when_unavailable="fail")
for _ in range(int(sys.argv[2])):
    try:
        t = c.acquire("query", "bjobs")
    except NoToken as exc:
        print(json.dumps({"denied": exc.reason}), flush=True)
        continue
    print(json.dumps({"granted": bool(t.id), "waited": t.waited}), flush=True)
    t.release()
"""


def test_rate_limit_per_user_waits_then_denies(fake_daemon):
    """Two real ordinary uids against rate_limit query {bucket 2, 1 per 10 s}: each gets its
    own burst, an over-rate request waits for the refill, one past the wait limit is denied."""
    daemon, clock = fake_daemon(
        token_wait_time=15,
        metrics_port=0,
        rate_limit={"query": {"bucket_size": 2, "refill_rate": 1, "refill_period": 10}},
    )
    path = daemon.socket_path

    def rate_waiting():
        return admin_status(path)["categories"]["query"]["rate_waiting"]

    def as_user(user, count):
        cmd = [
            "setpriv",
            f"--reuid={user}",
            f"--regid={user if user != 'nobody' else 'nogroup'}",
            "--clear-groups",
            sys.executable,
            "-c",
            RATED,
            path,
            str(count),
        ]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd="/")

    procs = []
    try:
        procs.append(nobody := as_user("nobody", 3))
        assert [json.loads(nobody.stdout.readline())["granted"] for _ in range(2)] == [True] * 2
        assert until(lambda: rate_waiting() == 1)
        # another user is not slowed by nobody's empty bucket
        procs.append(other := as_user("daemon", 2))
        assert other.communicate(timeout=60)[0].count('"granted": true') == 2
        clock.advance(10)
        daemon.wake()
        third = json.loads(nobody.stdout.readline())
        assert third["granted"] and third["waited"] == pytest.approx(10, abs=0.01)
        assert nobody.wait(20) == 0
        procs.append(late := as_user("nobody", 1))
        assert until(lambda: rate_waiting() == 1)
        clock.advance(15)
        daemon.wake()
        assert json.loads(late.stdout.readline()) == {"denied": "rate_limited"}
        assert late.wait(20) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            proc.stdout.close()
    status = admin_status(path)
    assert status["metrics"]["ratelimited.query"]["current"] == 1
    assert status["metrics"]["rejected.query"]["current"] == 0
    assert status["metrics"]["requests.query"]["current"] == 5
    with ProxyClient([Daemon("d", path)]) as client:
        lines = render.status_text(client.admin("status"))
    # its own row after the seed's, for the rate-limited category only (no sample period has
    # ended on this clock yet: Last, Max and Avg are 0; the count is in "current" above)
    assert lines[-3].startswith("Error ")
    assert lines[-2:] == ["Rate limited", f"{'     Query':<42}{0:>12}{0:>12}{0:>12}"]
    scrape = (
        urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics_port}/metrics", timeout=10)
        .read()
        .decode()
    )
    assert 'gridgate_proxyd_rate_limited_total{category="query"} 1.0' in scrape
