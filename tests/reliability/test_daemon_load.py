"""Token daemon load: acquire/release pairs from 64 clients while thousands of idle connections sit."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import time

import pytest
from daemonkit import AS_NOBODY, PYTHON, lsf_fixtures, read_replies, rss_mib, status

sockdir = lsf_fixtures.sockdir
start_daemon = lsf_fixtures.start_daemon

pytestmark = pytest.mark.timeout(1800)

# CI sizes; the figures in docs/reliability.md were measured once with
# GRIDGATE_RELIABILITY_DAEMON_PAIRS=1000000 GRIDGATE_RELIABILITY_DAEMON_IDLE=10000.
PAIRS = int(os.environ.get("GRIDGATE_RELIABILITY_DAEMON_PAIRS", "50000"))
IDLE = int(os.environ.get("GRIDGATE_RELIABILITY_DAEMON_IDLE", "2000"))
CLIENTS = 64
WORKERS = 4  # processes of CLIENTS // WORKERS threads, one connection per thread

# One worker process (run as nobody: an ordinary user, so the limits apply): each thread
# owns a connection and runs acquire/release pairs; first a short warm-up, then it waits for
# the go file so the measured phase starts together. Prints a JSON summary.
WORKER = r"""
import json, os, socket, sys, threading, time
path, threads, pairs, warm, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
errors, done = [], [0]
lock = threading.Lock()

def run(share):
    s = socket.socket(socket.AF_UNIX); s.settimeout(60); s.connect(path)
    buf = bytearray(); ident = 0
    def call(line):
        nonlocal buf
        s.sendall(line)
        while True:
            end = buf.find(b"\n")
            if end >= 0:
                out = bytes(buf[:end]); del buf[:end + 1]; return json.loads(out)
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
    def pair():
        nonlocal ident
        ident += 1
        got = call(b'{"v":1,"id":%d,"op":"acquire","category":"query","opcode":"bjobs","size":1}\n' % ident)
        if got.get("result") != "granted":
            errors.append(got); return False
        ident += 1
        back = call(b'{"v":1,"id":%d,"op":"release","token":%s}\n' % (ident, json.dumps(got["token"]).encode()))
        if back.get("released") is not True or back.get("id") != ident:
            errors.append(back); return False
        return True
    try:
        for _ in range(warm):
            pair()
        ready.wait()
        while not os.path.exists(go):
            time.sleep(0.005)
        n = 0
        for _ in range(share):
            n += pair()
        with lock:
            done[0] += n
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        s.close()

ready = threading.Barrier(threads + 1)
shares = [pairs // threads + (1 if i < pairs % threads else 0) for i in range(threads)]
ts = [threading.Thread(target=run, args=(n,)) for n in shares]
for t in ts: t.start()
ready.wait()
print("ready", flush=True)
for t in ts: t.join()
print(json.dumps({"pairs": done[0], "errors": errors[:5], "error_count": len(errors)}), flush=True)
"""


def _raise_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if target < need:
            pytest.fail(f"RLIMIT_NOFILE hard limit {hard} is below the {need} sockets needed")
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def test_pairs_from_64_clients_with_idle_connections(start_daemon, sockdir, figures):
    _raise_nofile(IDLE + 1024)
    d = start_daemon(
        {
            "policies": "QUERY[max=64 nominal=64]",
            "sample_period": 86400,
            "max_connections": IDLE + 1000,
        }
    )
    rss_start = rss_mib(d.pid)
    idle: list[socket.socket] = []
    worker_py = sockdir / "worker.py"
    worker_py.write_text(WORKER)
    go = sockdir / "go"
    workers: list[subprocess.Popen[str]] = []
    try:
        for _ in range(IDLE):  # root's idle sockets (not counted against nobody's cap)
            sock = socket.socket(socket.AF_UNIX)
            idle.append(sock)
            # blocking: a non-blocking Unix connect fails with EAGAIN while the backlog is full
            sock.connect(d.socket)
            sock.settimeout(30)
        per = CLIENTS // WORKERS
        warm = 20
        for _ in range(WORKERS):
            workers.append(
                subprocess.Popen(
                    [
                        *AS_NOBODY,
                        PYTHON,
                        str(worker_py),
                        d.socket,
                        str(per),
                        str(PAIRS // WORKERS),
                        str(warm),
                        str(go),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd="/",
                )
            )
        for proc in workers:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        before = status(d.socket)
        assert before["connections"] >= IDLE + CLIENTS
        rss_loaded = rss_mib(d.pid)  # idle connections and clients connected, warmed up
        started = time.monotonic()
        go.touch()
        summaries = []
        for proc in workers:
            out, _ = proc.communicate(timeout=1700)
            assert proc.returncode == 0
            summaries.append(json.loads(out.strip().splitlines()[-1]))
        elapsed = time.monotonic() - started
        rss_end = rss_mib(d.pid)
        # the idle connections are still served after the load
        sample = idle[:: max(1, IDLE // 100)]
        for i, sock in enumerate(sample):
            sock.sendall(b'{"v":1,"id":%d,"op":"hello"}\n' % i)
        answers = [read_replies(sock, 1) for sock in sample]
    finally:
        go.touch()
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)
        for sock in idle:
            sock.close()
    assert all(s["error_count"] == 0 for s in summaries), summaries
    served = sum(s["pairs"] for s in summaries)
    assert served == PAIRS // WORKERS * WORKERS
    assert all(len(a) == 1 and a[0]["ok"] and a[0]["user"] == "root" for a in answers)
    after = status(d.socket)
    query = after["categories"]["query"]
    assert (query["in_use"], query["in_use_privileged"], query["queued"]) == (0, 0, 0)
    metrics = after["metrics"]
    warmups = WORKERS * (CLIENTS // WORKERS) * 20
    assert metrics["requests.query"]["current"] == served + warmups
    assert metrics["error"]["current"] == 0 and metrics["rejected.query"]["current"] == 0
    # RSS bounded: the load adds no per-request memory (a token table that never shrinks, a
    # nonce or id log...) beyond allocator slack
    assert rss_end <= rss_loaded * 1.25 + 8, (rss_start, rss_loaded, rss_end)
    assert rss_end <= 200
    figures(
        pairs=served,
        clients=CLIENTS,
        idle=IDLE,
        seconds=round(elapsed, 1),
        pairs_per_s=round(served / elapsed),
        rss_start_mib=round(rss_start, 1),
        rss_loaded_mib=round(rss_loaded, 1),
        rss_end_mib=round(rss_end, 1),
        requests_counted=metrics["requests.query"]["current"],
        in_use_after=query["in_use"],
    )
