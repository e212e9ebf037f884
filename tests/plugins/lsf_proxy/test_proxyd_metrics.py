"""Prometheus metrics of the token daemon, scraped over real HTTP from a real daemon process."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from support.polling import until
from support.uids import AS_NOBODY

from gridgate.core.clock import FakeClock
from gridgate.core.config import ConfigError, load_config
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.config import section_defaults
from gridgate.plugins.lsf_proxy.daemon.daemon import ProxyDaemon, StartupError

pytestmark = pytest.mark.timeout(300)

ACQUIRE = """
import json, sys
from gridgate.plugins.lsf_proxy.client.client import ProxyClient, Daemon, NoToken
c = ProxyClient([Daemon("d", {sock!r})], notoken_ntries=1, when_unavailable="fail")
try:
    t = c.acquire({category!r}, {opcode!r}, 12)
except NoToken as exc:
    print(json.dumps({{"denied": exc.reason}}), flush=True)
    sys.exit(3)
print(json.dumps({{"granted": t.id}}), flush=True)
t.release()
"""


def acquire_code(sock: str, category: str = "query", opcode: str = "BATCH_JOB_QUERY") -> str:
    return ACQUIRE.format(sock=sock, category=category, opcode=opcode)


def scrape(port: int) -> dict[str, float]:
    """Every sample of /metrics as ``{'name{labels}': value}``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    series = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            series[key] = float(value)
    return series


def delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def q(name: str, **labels: str) -> str:
    # prometheus_client writes labels sorted by name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def test_series_move_with_grants_rejections_blocks_and_errors(start_daemon, cli, py_as):
    # the waiter shows in the queue gauge for token_wait_time: 3 s, for scrapes on a slow machine
    d = start_daemon(
        {"policies": "QUERY[max=1 nominal=1]", "token_wait_time": 3, "metrics_port": 0}
    )
    port = d.info["metrics_port"]
    assert isinstance(port, int) and port > 0
    (reply,) = _talk(d.socket, b'{"v":1,"id":1,"op":"status"}\n')
    assert reply["status"]["metrics_port"] == port

    before = scrape(port)
    for category in ("query", "submission", "other"):
        assert before[q("gridgate_proxyd_tokens_in_use", category=category)] == 0
        assert before[q("gridgate_proxyd_queue_length", category=category)] == 0
    assert before[q("gridgate_proxyd_token_limit", category="query")] == 1
    assert before[q("gridgate_proxyd_grants_total", category="query")] == 0

    # root takes the only query token: privileged, and it fills max for everybody else
    client = ProxyClient([Daemon("d", d.socket)], when_unavailable="fail")
    try:
        token = client.acquire("query", "BATCH_JOB_QUERY", 1)
        assert token.privileged
        held = scrape(port)
        assert held[q("gridgate_proxyd_tokens_in_use", category="query")] == 1
        assert held[q("gridgate_proxyd_tokens_in_use_privileged", category="query")] == 1

        # nobody's request waits in the queue, then is denied after token_wait_time
        waiter = subprocess.Popen(
            AS_NOBODY + [sys.executable, "-c", acquire_code(d.socket)],
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        try:
            queued = until(
                lambda: scrape(port)[q("gridgate_proxyd_queue_length", category="query")] == 1
            )
            assert queued, "the waiting request never showed in the queue gauge"
            out, _ = waiter.communicate(timeout=60)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait(10)
        assert waiter.returncode == 3 and json.loads(out) == {"denied": "timeout"}
        token.release()
    finally:
        client.close()

    # an ordinary grant once the token is back
    out = py_as(acquire_code(d.socket))
    assert out.returncode == 0, out.stderr
    assert "granted" in json.loads(out.stdout)

    # a block
    blocked = cli("block", "-u", "nobody", "--socket", d.socket)
    assert blocked.returncode == 0, blocked.stderr
    out = py_as(acquire_code(d.socket))
    assert out.returncode == 3 and json.loads(out.stdout) == {"denied": "blocked"}

    # a protocol error
    (bad,) = _talk(d.socket, b"this is not json\n")
    assert bad["ok"] is False

    after = scrape(port)
    assert delta(before, after, q("gridgate_proxyd_grants_total", category="query")) == 2
    assert (
        delta(
            before, after, q("gridgate_proxyd_rejections_total", category="query", reason="timeout")
        )
        == 1
    )
    assert (
        delta(
            before,
            after,
            q("gridgate_proxyd_rejections_total", category="query", reason="queue_full"),
        )
        == 0
    )
    assert delta(before, after, q("gridgate_proxyd_blocked_total", category="query")) == 1
    assert delta(before, after, q("gridgate_proxyd_errors_total", kind="protocol")) == 1
    assert delta(before, after, q("gridgate_proxyd_errors_total", kind="lease_expired")) == 0
    assert delta(before, after, q("gridgate_proxyd_grants_total", category="submission")) == 0
    granted = q("gridgate_proxyd_wait_seconds_count", category="query", outcome="granted")
    denied = q("gridgate_proxyd_wait_seconds_count", category="query", outcome="denied")
    assert after[granted] == 2
    assert after[denied] == 2  # the timeout and the block
    # the timed-out request waited token_wait_time; the block was answered at once
    denied_sum = after[q("gridgate_proxyd_wait_seconds_sum", category="query", outcome="denied")]
    assert 3.0 <= denied_sum < 30
    fast = q("gridgate_proxyd_wait_seconds_bucket", category="query", outcome="denied", le="0.5")
    assert after[fast] == 1
    assert after[q("gridgate_proxyd_tokens_in_use", category="query")] == 0
    assert after[q("gridgate_proxyd_queue_length", category="query")] == 0
    assert d.stop() == 0


def test_metrics_off_by_default(start_daemon):
    d = start_daemon({})
    assert d.info["metrics_port"] is None


def _talk(path: str, *lines: bytes) -> list[dict]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(b"".join(lines))
        data = b""
        while data.count(b"\n") < len(lines):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return [json.loads(x) for x in data.splitlines()[: len(lines)]]


@pytest.mark.parametrize("port", [-1, 65536, "9100"])
def test_metrics_port_is_checked(tmp_path, port):
    config = tmp_path / "site.yaml"
    config.write_text(json.dumps({"proxyd": {"metrics_port": port}}), encoding="utf-8")
    with pytest.raises(ConfigError, match="metrics_port"):
        load_config(config)


def test_missing_prometheus_client_is_a_clear_startup_error(tmp_path, monkeypatch):
    # None in sys.modules makes the import fail as if the package were not installed
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(StartupError, match=r"gridgate\[metrics\]"):
        ProxyDaemon({"metrics_port": 0}, socket_path=str(tmp_path / "p.sock"))


def test_metrics_port_in_use_is_a_startup_error(gridgate_exe, sockdir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        config = sockdir / "busy.yaml"
        config.write_text(
            json.dumps({"proxyd": {"socket": str(sockdir / "busy.sock"), "metrics_port": taken}}),
            encoding="utf-8",
        )
        out = subprocess.run(
            [gridgate_exe, "lsfproxyd", "serve", "-c", str(config), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode != 0
    assert f"cannot serve metrics on 127.0.0.1:{taken}" in out.stderr
    assert not (sockdir / "busy.sock").exists()


def test_wait_times_and_expired_leases_on_a_fake_clock(sockdir):
    """In-process daemon on a FakeClock: the histogram holds the exact waits, and a lease
    taken back counts as an error, without anybody sleeping for an expiry."""
    section = section_defaults()
    section.update(
        socket=str(sockdir / "fake.sock"),
        metrics_port=0,
        token_wait_time=10,
        lease_time=30,
        policies="SUBMISSION[max=1 nominal=1]",
    )
    clock = FakeClock(time.time())
    daemon = ProxyDaemon(section, clock=clock)
    ready = threading.Event()
    daemon.on_ready = lambda _d: ready.set()
    thread = threading.Thread(
        target=lambda: asyncio.run(daemon.serve(install_signals=False)), daemon=True
    )
    thread.start()
    try:
        assert ready.wait(20), "daemon did not start"
        port = daemon.metrics_port
        assert port
        holder = ProxyClient([Daemon("d", daemon.socket_path)])
        # kept referenced: a collected Token drops its connection, which returns the token
        token = holder.acquire("submission", "BATCH_JOB_SUB")
        assert token.privileged
        code = acquire_code(daemon.socket_path, "submission", "BATCH_JOB_SUB")
        waiter = subprocess.Popen(
            AS_NOBODY + [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd="/"
        )
        try:
            assert until(
                lambda: scrape(port)[q("gridgate_proxyd_queue_length", category="submission")] == 1
            )
            clock.advance(10)
            daemon.wake()
            out, _ = waiter.communicate(timeout=60)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait(10)
        assert json.loads(out) == {"denied": "timeout"}
        series = scrape(port)
        labels = {"category": "submission", "outcome": "denied"}
        assert series[q("gridgate_proxyd_wait_seconds_sum", **labels)] == 10
        assert series[q("gridgate_proxyd_wait_seconds_bucket", **labels, le="5.0")] == 0
        assert series[q("gridgate_proxyd_wait_seconds_bucket", **labels, le="10.0")] == 1
        assert series[q("gridgate_proxyd_errors_total", kind="lease_expired")] == 0
        # the holder never releases: its lease ends 30 s after the grant
        clock.advance(20)
        daemon.wake()
        assert until(
            lambda: scrape(port)[q("gridgate_proxyd_errors_total", kind="lease_expired")] == 1
        )
        assert scrape(port)[q("gridgate_proxyd_tokens_in_use", category="submission")] == 0
        holder.close()
    finally:
        daemon.stop()
        thread.join(20)
    assert not thread.is_alive()
    # the HTTP server went with the daemon
    with pytest.raises(OSError):
        scrape(port)
