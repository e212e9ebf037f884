"""Figures of the token daemon (run by hand, not in CI): throughput vs an echo server, grant
latency, fairness at saturation, memory with 10,000 idle connections.

    .venv/bin/python bench/bench_proxyd.py all [--seconds 5] [--write bench/results/bench_proxyd-DATE.md]

Every daemon is a real ``gridgate lsfproxyd serve`` process; clients are separate processes
(throughput) or asyncio connections in this one. Each part stays well under two minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

GRIDGATE = str(Path(sys.executable).parent / "gridgate")
ROOT = Path(__file__).resolve().parent.parent


# --- processes under test --------------------------------------------------------------------


class Proc:
    def __init__(self, args: list[str], workdir: Path) -> None:
        self.err = open(workdir / f"stderr.{len(list(workdir.iterdir()))}", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.err)
        assert self.proc.stdout is not None  # stdout=PIPE
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{args[:3]} did not start")
        self.info = json.loads(line)

    @property
    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    @property
    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.err.close()


def start_daemon(workdir: Path, section: dict) -> Proc:
    section = {"socket": str(workdir / "proxyd.sock"), **section}
    config = workdir / "proxyd.yaml"
    config.write_text(yaml.safe_dump({"proxyd": section}))
    return Proc([GRIDGATE, "lsfproxyd", "serve", "-c", str(config), "--json"], workdir)


def start_echo(workdir: Path) -> Proc:
    return Proc([sys.executable, __file__, "_echo", str(workdir / "echo.sock")], workdir)


async def _echo_server(path: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # the same framing as the daemon: read chunks, answer every complete line
        buffer = bytearray()
        while chunk := await reader.read(65536):
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                writer.write(bytes(buffer[: end + 1]))
                del buffer[: end + 1]
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    print(json.dumps({"ready": True, "socket": path}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


# --- throughput and latency ------------------------------------------------------------------


async def _pairs(path: str, conns: int, seconds: float, echo: bool) -> tuple[int, list[float]]:
    pairs = 0
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def loop(index: int) -> None:
        nonlocal pairs
        reader, writer = await asyncio.open_unix_connection(path)
        n = 0
        while time.perf_counter() < stop_at:
            n += 2
            acquire = {
                "v": 1,
                "id": n,
                "op": "acquire",
                "category": "query",
                "opcode": "BATCH_JOB_QUERY",
                "size": 184,
            }
            t0 = time.perf_counter()
            writer.write(json.dumps(acquire, separators=(",", ":")).encode() + b"\n")
            reply = json.loads(await reader.readline())
            latencies.append(time.perf_counter() - t0)
            token = "x" * 10 if echo else reply["token"]
            release = {"v": 1, "id": n + 1, "op": "release", "token": token}
            writer.write(json.dumps(release, separators=(",", ":")).encode() + b"\n")
            await reader.readline()
            pairs += 1
        writer.close()

    await asyncio.gather(*(loop(i) for i in range(conns)))
    return pairs, latencies


def _client_process(
    path: str, conns: int, seconds: float, echo: bool, out: multiprocessing.Queue
) -> None:
    out.put(asyncio.run(_pairs(path, conns, seconds, echo)))


def run_pairs(
    path: str, clients: int, procs: int, seconds: float, echo: bool
) -> tuple[float, list[float]]:
    out: multiprocessing.Queue = multiprocessing.Queue()
    workers = [
        multiprocessing.Process(
            target=_client_process, args=(path, clients // procs, seconds, echo, out)
        )
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=seconds + 60) for _ in workers]
    for w in workers:
        w.join(30)
    total = sum(r[0] for r in results)
    latencies = [x for r in results for x in r[1]]
    return total / seconds, latencies


def bench_throughput(workdir: Path, seconds: float, clients: int = 64, procs: int = 2) -> dict:
    daemon = start_daemon(workdir, {"policies": "QUERY[max=1000 nominal=1000]"})
    echo = start_echo(workdir)
    try:
        run_pairs(daemon.info["socket"], clients, procs, 1.0, False)  # warm-up
        cpu0 = daemon.cpu_seconds
        proxy_rate, latencies = run_pairs(daemon.info["socket"], clients, procs, seconds, False)
        proxy_cpu = (daemon.cpu_seconds - cpu0) / (proxy_rate * seconds)
        cpu0 = echo.cpu_seconds
        echo_rate, echo_lat = run_pairs(echo.info["socket"], clients, procs, seconds, True)
        echo_cpu = (echo.cpu_seconds - cpu0) / (echo_rate * seconds)
    finally:
        daemon.stop()
        echo.stop()
    q = statistics.quantiles(latencies, n=100)
    eq = statistics.quantiles(echo_lat, n=100)
    return {
        "clients": clients,
        "client_processes": procs,
        "seconds": seconds,
        "proxy_pairs_per_s": round(proxy_rate),
        "echo_pairs_per_s": round(echo_rate),
        "ratio": round(proxy_rate / echo_rate, 3),
        "proxy_server_cpu_us_per_pair": round(proxy_cpu * 1e6, 1),
        "echo_server_cpu_us_per_pair": round(echo_cpu * 1e6, 1),
        "cpu_ratio_echo_over_proxy": round(echo_cpu / proxy_cpu, 3),
        "grant_p50_ms": round(q[49] * 1000, 3),
        "grant_p99_ms": round(q[98] * 1000, 3),
        "echo_p50_ms": round(eq[49] * 1000, 3),
        "echo_p99_ms": round(eq[98] * 1000, 3),
    }


# --- fairness ---------------------------------------------------------------------------------


async def _fair(port: int, key: str, seconds: float, hold: float) -> Counter:
    from gridgate.plugins.lsf_proxy.protocol import encode, sign

    grants: Counter = Counter()
    stop_at = time.perf_counter() + seconds

    async def loop(user: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # every signature covers the challenge and name of this connection's hello
        writer.write(encode({"v": 1, "id": 0, "op": "hello"}))
        hello = json.loads(await reader.readline())
        bound = {"challenge": hello.get("challenge"), "daemon": hello.get("name")}
        n = 0
        while time.perf_counter() < stop_at:
            n += 2
            writer.write(
                encode(
                    sign(
                        {"v": 1, "id": n, "op": "acquire", "category": "query"},
                        key,
                        user,
                        "benchhost",
                        **bound,
                    )
                )
            )
            reply = json.loads(await reader.readline())
            while "event" in reply:  # "queued" (and how many ahead) comes before the answer
                reply = json.loads(await reader.readline())
            if reply.get("result") != "granted":
                continue
            if time.perf_counter() < stop_at:
                grants[user] += 1
            await asyncio.sleep(hold)
            writer.write(
                encode(
                    sign(
                        {"v": 1, "id": n + 1, "op": "release", "token": reply["token"]},
                        key,
                        user,
                        "benchhost",
                        **bound,
                    )
                )
            )
            await reader.readline()
        writer.close()

    await asyncio.gather(
        *([loop("heavy") for _ in range(64)] + [loop(f"light{i}") for i in range(4)])
    )
    return grants


def bench_fairness(workdir: Path, seconds: float, hold: float = 0.005) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["GG_BENCH_KEY"] = "bench-key"
    # 68 connections from one address, unauthenticated until their first signed request
    daemon = start_daemon(
        workdir,
        {
            "policies": "QUERY[max=4 nominal=2 throttle=1]",
            "tcp": f"127.0.0.1:{port}",
            "key": {"env": "GG_BENCH_KEY"},
            "tcp_max_per_peer": 128,
        },
    )
    try:
        grants = asyncio.run(_fair(port, "bench-key", seconds, hold))
    finally:
        daemon.stop()
    total = sum(grants.values())
    fair = total / 5
    return {
        "seconds": seconds,
        "max_tokens": 4,
        "hold_ms": hold * 1000,
        "total_grants": total,
        "grants": dict(sorted(grants.items())),
        "light_share_of_fair": {
            u: round(grants[u] / fair, 3) for u in sorted(grants) if u.startswith("light")
        },
        "heavy_share_of_fair": round(grants["heavy"] / fair, 3),
    }


# --- idle connections -------------------------------------------------------------------------


def bench_idle(workdir: Path, count: int = 10_000) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < count + 100:
        raise SystemExit(f"RLIMIT_NOFILE hard limit {hard} is below {count + 100}")
    daemon = start_daemon(workdir, {})
    path = daemon.info["socket"]
    socks: list[socket.socket] = []
    try:
        rss_before = daemon.rss_mb
        t0 = time.perf_counter()
        hello = b'{"v":1,"id":1,"op":"hello"}\n'
        for _ in range(count):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)  # blocking: waits while the listen backlog is full
            s.settimeout(30)
            s.sendall(hello)
            socks.append(s)
        answered = sum(1 for s in socks if s.recv(4096).startswith(b'{"v":1,"id":1,"ok":true'))
        connect_s = time.perf_counter() - t0
        rss = daemon.rss_mb
        # still serving while they all stay connected
        from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient

        with ProxyClient([Daemon("d", path)]) as client:
            t1 = time.perf_counter()
            token = client.acquire("query")
            grant_ms = (time.perf_counter() - t1) * 1000
            token.release()
            (status,) = client.admin("status")
        assert status.reply is not None, status
        connections = status.reply["status"]["connections"]
    finally:
        for s in socks:
            s.close()
        daemon.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return {
        "connections": count,
        "answered_hello": answered,
        "daemon_saw": connections,
        "connect_all_s": round(connect_s, 2),
        "rss_mb_idle_daemon": round(rss_before, 1),
        "rss_mb_with_connections": round(rss, 1),
        "grant_ms_meanwhile": round(grant_ms, 2),
    }


# --- report -----------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    lines = [
        "## Token daemon",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with "
        "`.venv/bin/python bench/bench_proxyd.py all` on this machine "
        f"({os.cpu_count()} cores, Python {sys.version.split()[0]}, shared with other "
        "work, so figures vary by some 10 %). The daemon is a real `gridgate lsfproxyd "
        "serve` process; figures are client-side.",
        "",
    ]
    t = results.get("throughput")
    if t:
        lines += [
            "| figure | result | target |",
            "|---|---|---|",
            f"| acquire+release pairs/s, {t['clients']} clients over the Unix socket "
            f"({t['client_processes']} client processes, {t['seconds']:g} s) | "
            f"{t['proxy_pairs_per_s']} | |",
            f"| echo server, same transport, same messages, same run | {t['echo_pairs_per_s']} | |",
            f"| ratio daemon / echo | **{t['ratio']}** | >= 0.5 |",
            f"| server CPU per pair: daemon / echo (echo's over daemon's, i.e. the rate ratio "
            f"if the server alone were the limit) | {t['proxy_server_cpu_us_per_pair']} us / "
            f"{t['echo_server_cpu_us_per_pair']} us (**{t['cpu_ratio_echo_over_proxy']}**) | |",
            f"| grant latency below nominal, 64 clients: p50 / p99 | **{t['grant_p50_ms']} ms / "
            f"{t['grant_p99_ms']} ms** (echo: {t['echo_p50_ms']} / {t['echo_p99_ms']} ms) | |",
        ]
    f = results.get("fairness")
    if f:
        light = ", ".join(f"{u} {v}" for u, v in f["light_share_of_fair"].items())
        lines.append(
            f"| fairness at saturation (max={f['max_tokens']}, tokens held "
            f"{f['hold_ms']:g} ms, 1 user x 64 loops vs 4 users x 1 loop, "
            f"{f['seconds']:g} s, {f['total_grants']} grants): light users' share "
            f"of fair | **{light}** (heavy {f['heavy_share_of_fair']}) | >= 0.9 each |"
        )
    i = results.get("idle")
    if i:
        lines.append(
            f"| daemon RSS with {i['connections']} idle connections (each said hello; "
            f"{i['daemon_saw']} seen by the daemon) | **{i['rss_mb_with_connections']} MB** "
            f"(idle daemon {i['rss_mb_idle_daemon']} MB; a grant meanwhile took "
            f"{i['grant_ms_meanwhile']} ms) | <= 200 MB |"
        )
    lines += [
        "",
        "How to read them: the echo server is an asyncio Unix-socket server with the daemon's "
        "framing that returns each line; the clients send the very same acquire/release lines "
        "to both. Server and client processes share the two cores, so both rates are partly "
        "client-bound (a ratio near or above 1 means the clients, not the daemon, were the "
        "limit); the server CPU per pair, read from /proc for the daemon and the echo process, "
        "gives the ratio one would see if only the server were the limit. Latency is "
        "the acquire round trip seen by the client (no throttling: nominal 1000). Fairness: "
        "fair share = total grants / 5 users; a light user's loop cannot ask again while it "
        "holds its token, which is why the heavy user ends above 1.",
        "",
        "Raw results:",
        "",
        "```json",
        json.dumps(results, indent=2),
        "```",
        "",
    ]
    return "\n".join(lines)


def write_section(path: Path, section: str) -> None:
    """Replace (or append) the ``## Token daemon`` section, leaving the others alone."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Performance\n\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.strip() == "## Token daemon"), None)
    if start is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        text = (
            "".join(lines[:start])
            + section
            + ("\n" if end < len(lines) else "")
            + "".join(lines[end:])
        )
    path.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["all", "throughput", "fairness", "idle", "_echo"])
    parser.add_argument("path", nargs="?")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--write", type=Path, help="Update the Token daemon section of this file.")
    args = parser.parse_args()
    if args.what == "_echo":
        asyncio.run(_echo_server(args.path))
        return
    workdir = Path(tempfile.mkdtemp(prefix="bench-proxyd-"))
    results: dict = {}
    try:
        if args.what in ("all", "throughput"):
            results["throughput"] = bench_throughput(workdir, args.seconds)
            print(json.dumps(results["throughput"]), flush=True)
        if args.what in ("all", "fairness"):
            results["fairness"] = bench_fairness(workdir, max(args.seconds, 10))
            print(json.dumps(results["fairness"]), flush=True)
        if args.what in ("all", "idle"):
            results["idle"] = bench_idle(workdir)
            print(json.dumps(results["idle"]), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = markdown(results)
    print(section)
    if args.write:
        write_section(args.write, section)


if __name__ == "__main__":
    main()
