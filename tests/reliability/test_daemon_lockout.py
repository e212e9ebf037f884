"""The token daemon cannot be locked out by whoever reaches its TCP port, nor by running out of
file descriptors: the Unix socket and the administrators keep their capacity."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest
from daemonkit import AS_NOBODY, PYTHON, free_port, lsf_fixtures, start_flood, status
from support.polling import until

from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient

sockdir = lsf_fixtures.sockdir
start_daemon = lsf_fixtures.start_daemon
py_as = lsf_fixtures.py_as
cli = lsf_fixtures.cli

pytestmark = pytest.mark.timeout(300)

KEY = "k3y-shared-by-the-daemons"
STDERR_BOUND = 64 * 1024


def _key(folder: Path) -> Path:
    key = folder / "proxyd.key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    return key


def _root_acquires(path: str, count: int, pause: float = 0.02) -> list[float]:
    """Seconds each of ``count`` acquires by root took, each on a new Unix connection."""
    took = []
    for _ in range(count):
        start = time.monotonic()
        with ProxyClient([Daemon("d", path)], when_unavailable="fail", notoken_ntries=1) as c:
            token = c.acquire("query", "bjobs")
            assert token.id and not token.proceed, token
            token.release()
        took.append(time.monotonic() - start)
        time.sleep(pause)
    return took


def _nobody_acquires(path: str, count: int) -> str:
    return (
        "import json, time\n"
        "from gridgate.plugins.lsf_proxy.client.client import ProxyClient, Daemon\n"
        "took = []\n"
        f"for _ in range({count}):\n"
        "    start = time.monotonic()\n"
        f"    with ProxyClient([Daemon('d', {path!r})], when_unavailable='fail',"
        " notoken_ntries=1) as c:\n"
        "        c.acquire('query', 'bjobs').release()\n"
        "    took.append(time.monotonic() - start)\n"
        "    time.sleep(0.02)\n"
        "print(json.dumps(took))\n"
    )


def _tcp_acquires(port: int, count: int, source_ok: bool = True) -> tuple[int, int, list[float]]:
    """A key holder over TCP: (granted, turned away busy, seconds per grant)."""
    granted, busy, took = 0, 0, []
    for _ in range(count):
        start = time.monotonic()
        with ProxyClient(
            [Daemon("t", f"127.0.0.1:{port}")],
            key=KEY,
            user="alice",
            host="ui01",
            when_unavailable="fail",
            notoken_ntries=1,
            backoff=(0.01, 0.01),
        ) as c:
            try:
                c.acquire("query", "bjobs").release()
            except Exception as exc:  # NoToken(busy) when the unauthenticated pool is full
                assert "busy" in str(exc), exc
                busy += 1
                continue
        granted += 1
        took.append(time.monotonic() - start)
    return granted, busy, took


def _turned_away(refused: dict) -> int:
    return refused["auth_timeout"] + refused.get("displaced", 0)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@pytest.mark.parametrize("spread", ["one-address", "fifty-addresses"])
def test_a_thousand_unauthenticated_tcp_connections_lock_nobody_out(
    start_daemon, sockdir, py_as, cli, figures, spread
):
    port = free_port()
    key = _key(sockdir)
    # max_connections 500, as on the machine where 500 idle sockets locked root out
    d = start_daemon(
        {
            "tcp": f"127.0.0.1:{port}",
            "key": {"file": str(key)},
            "policies": "QUERY[max=64 nominal=64]",
            "max_connections": 500,
            "tcp_auth_timeout": 2,
        }
    )
    quiet = _root_acquires(d.socket, 30)
    sources = ["127.0.0.2"] if spread == "one-address" else [f"127.0.0.{i}" for i in range(2, 52)]
    flood = start_flood(port, 1000, 12, sources)
    try:
        # the flood is in place (a loaded host may take seconds to start its process), and
        # has met its first deadlines (tcp_auth_timeout 2 s)
        assert until(lambda: status(d.socket)["capacity"]["open"]["unauthenticated"] > 0, 30)
        # (one address: its connections time out; fifty fill the pool, and each new one
        # displaces the oldest that said nothing)
        assert until(lambda: _turned_away(status(d.socket)["capacity"]["refused"]) > 0, 30)
        # a sample while it holds connections: it reconnects in waves as its sockets time out,
        # and between two waves a loaded machine may show none open

        def holding() -> dict | None:
            sample = status(d.socket)["capacity"]
            return sample if sample["open"]["unauthenticated"] > 0 else None

        early = until(holding, 30)
        assert early, "the flood held no connection"
        nobody = py_as(_nobody_acquires(d.socket, 50), timeout=120)
        during = _root_acquires(d.socket, 150)
        shown = cli("status", "--socket", d.socket)
        tcp = _tcp_acquires(port, 30)
        seen = status(d.socket)["capacity"]
    finally:
        out, err = flood.communicate(timeout=60)
    assert flood.returncode == 0, err
    hostile = json.loads(out)
    assert nobody.returncode == 0, nobody.stderr
    nobody_took = json.loads(nobody.stdout)
    assert len(nobody_took) == 50
    assert shown.returncode == 0 and "STATUS: CONNECTED" in shown.stdout, (
        shown.stdout + shown.stderr
    )
    assert "Unable to contact" not in shown.stdout
    cap = seen["capacity"]
    # the flood held its pool (one address: its per-address share) and no more
    held = early["open"]["unauthenticated"]
    assert (
        0
        < held
        <= (cap["tcp_max_per_peer"] if spread == "one-address" else cap["tcp_max_unauthenticated"])
    ), early
    if spread == "one-address":
        assert seen["refused"]["unauthenticated"] > 0
        assert seen["refused"]["auth_timeout"] > 0
    else:
        assert seen["refused"]["displaced"] > 0
    assert hostile["opened"] > 1000 and hostile["closed_by_daemon"] > 0
    granted, busy, tcp_took = tcp
    if spread == "one-address":
        # one address takes at most tcp_max_per_peer: another host's key holder gets in
        assert (granted, busy) == (30, 0)
    log = d.stderr.stat().st_size
    assert log < STDERR_BOUND, d.log()[-4000:]
    assert "Traceback" not in d.log()
    assert d.proc.poll() is None
    figures(
        spread=spread,
        flood=hostile,
        root_quiet_median=statistics.median(quiet),
        root_flood_median=statistics.median(during),
        root_flood_p99=_pct(during, 0.99),
        root_flood_max=max(during),
        nobody_flood_median=statistics.median(nobody_took),
        nobody_flood_max=max(nobody_took),
        tcp_granted=granted,
        tcp_busy=busy,
        tcp_median=statistics.median(tcp_took) if tcp_took else None,
        capacity=seen,
        flood_held=held,
        stderr_bytes=log,
    )


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _lowest_free_fd(pid: int) -> int:
    """The daemon's lowest free descriptor number, once closings in progress are over."""
    last = None
    while True:
        used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
        if used == last:
            return min(set(range(len(used) + 1)) - used)
        last = used
        time.sleep(0.5)


def test_descriptor_exhaustion_pauses_accepts_and_logs_once(start_daemon, sockdir, py_as, figures):
    port = free_port()
    key = _key(sockdir)
    d = start_daemon(
        {
            "tcp": f"127.0.0.1:{port}",
            "key": {"file": str(key)},
            "policies": "QUERY[max=64 nominal=64]",
            "tcp_auth_timeout": 2,
        },
        argv_prefix=("prlimit", "--nofile=256:256", "--"),
    )
    cap = status(d.socket)["capacity"]["capacity"]
    # max_connections follows the real limit: the pools together fit in 256 descriptors
    assert cap["nofile"] == 256
    assert (
        cap["max_connections"] + cap["admin_reserve"] + cap["tcp_max_unauthenticated"] <= 256 - 32
    )
    # 1. nobody opens 400 Unix connections and floods TCP: refused beyond the pools, never EMFILE
    # the hog reads until the refusals it expects have come (30 s at most), then once more
    # after half a second for any beyond them; a socket with nothing to read was accepted
    expected = 400 - cap["max_connections"]
    hog = (
        "import socket, sys, time, json\n"
        "socks = []\n"
        "for _ in range(400):\n"
        "    s = socket.socket(socket.AF_UNIX); s.settimeout(10)\n"
        f"    s.connect({d.socket!r}); s.setblocking(False); socks.append(s)\n"
        "refused = set()\n"
        "def read():\n"
        "    for i, s in enumerate(socks):\n"
        "        if i in refused: continue\n"
        "        try:\n"
        "            if b'busy' in s.recv(4096): refused.add(i)\n"
        "        except BlockingIOError: pass  # nothing sent yet: accepted, not refused\n"
        "end = time.monotonic() + 30\n"
        f"while len(refused) < {expected} and time.monotonic() < end:\n"
        "    read(); time.sleep(0.05)\n"
        "time.sleep(0.5); read()\n"
        "print(json.dumps({'refused': len(refused)}), flush=True)\n"
        "sys.stdin.readline()\n"
    )
    holder = subprocess.Popen(
        [*AS_NOBODY, PYTHON, "-c", hog],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    flood = start_flood(port, 1000, 8, ["127.0.0.2"])
    try:
        refused = json.loads(holder.stdout.readline())["refused"]
        assert refused == expected, refused
        during = _root_acquires(d.socket, 50)  # root: from the admin reserve
        flood_seen = json.loads(flood.communicate(timeout=60)[0])
        assert "cannot accept" not in d.log()
        # 2. the limit lowered under the running daemon, below what it has open: accepting
        # pauses, is logged once, open connections are still served
        with ProxyClient([Daemon("d", d.socket)], when_unavailable="fail") as kept:
            kept.acquire("query").release()  # a root connection open before the squeeze
            # a new descriptor takes the lowest free number: a limit at that number makes
            # every accept fail (for as long as nothing below it is closed)
            open_now = _lowest_free_fd(d.pid)
            subprocess.run(["prlimit", f"--pid={d.pid}", f"--nofile={open_now}:256"], check=True)
            probe = (
                "import socket\n"
                "s = socket.socket(socket.AF_UNIX); s.settimeout(1)\n"
                f's.connect({d.socket!r}); s.sendall(b\'{{"v":1,"id":1,"op":"hello"}}\\n\')\n'
                "try:\n    print('answered' if s.recv(4096) else 'closed')\n"
                "except TimeoutError:\n    print('waiting')\n"
            )
            # new clients wait in the backlog (unanswered, not refused); the daemon neither
            # spins nor logs per attempt
            probes = [py_as(probe, timeout=60) for _ in range(5)]
            attempts = [p.stdout.strip() for p in probes]
            assert attempts == ["waiting"] * 5, [p.stderr for p in probes]
            squeezed = time.monotonic()
            time.sleep(3)
            token = kept.acquire("query")  # the pooled connection still works
            token.release()
            log_while_squeezed = d.log()
            subprocess.run(["prlimit", f"--pid={d.pid}", "--nofile=256:256"], check=True)
            holder.stdin.write("\n")
            holder.stdin.flush()
            holder.wait(30)
            start = time.monotonic()
            _root_acquires(d.socket, 1)
            resumed = time.monotonic() - start
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)
        if flood.poll() is None:
            flood.kill()
        flood.communicate(timeout=60)
    lines = [ln for ln in log_while_squeezed.splitlines() if "cannot accept" in ln]
    assert 1 <= len(lines) <= 2, lines  # once per period per listener at most
    assert "Traceback" not in d.log()
    assert d.stderr.stat().st_size < STDERR_BOUND
    assert d.proc.poll() is None
    figures(
        capacity=cap,
        nobody_unix_refused=refused,
        root_median=statistics.median(during),
        root_max=max(during),
        squeezed_to=open_now,
        squeeze_seconds=time.monotonic() - squeezed,
        squeezed_probes=attempts,
        cannot_accept_lines=len(lines),
        resumed_seconds=resumed,
        stderr_bytes=d.stderr.stat().st_size,
        flood=flood_seen,
    )


def test_admin_cli_says_busy_not_unable_to_contact(start_daemon, cli):
    d = start_daemon({"max_connections": 1, "admin_reserve": 1})
    held = [ProxyClient([Daemon("d", d.socket)]) for _ in range(2)]
    try:
        # root's two tokens, each on its connection, fill the pool and the reserve
        tokens = [client.acquire("query") for client in held]
        assert all(t.id for t in tokens)
        shown = cli("status", "--socket", d.socket)
        blocked = cli("block", "-u", "user1", "--socket", d.socket)
    finally:
        for client in held:
            client.close()
    assert shown.returncode == 1
    assert "Unable to contact" not in shown.stdout, shown.stdout
    assert "is busy: " in shown.stdout and "too many connections" in shown.stdout, shown.stdout
    assert "is busy" in blocked.stdout and "Unable to contact" not in blocked.stdout
