"""The stand-in LSF master daemon: a small Unix-socket server that the stand-in commands contact,
counting requests in flight and answering slower as their number grows.

It plays mbatchd for the admission tests and benches: every stand-in ``bsub``/``bjobs`` opens one
connection, sends one JSON line and waits for the answer. Service time grows with the number of
requests in flight (``base * (1 + ((n - 1) / knee) ** 2)``), so past ``knee`` the daemon completes
fewer requests per second the more it is asked, as an overloaded mbatchd does. ``stats`` reports
the highest concurrency seen, completions and latency percentiles.

Run it as ``python -m gridgate.plugins.lsf_proxy.sim.master --socket PATH``; it prints one JSON
line when it listens and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socketserver
import sys
import threading
import time
from typing import Any

from gridgate.plugins.lsf_proxy.sim.cli import call

__all__ = ["MasterState", "call", "main", "percentile", "serve", "service_time"]

#: Longest request line accepted; the stand-ins send a few dozen bytes.
MAX_LINE = 4096


def service_time(in_flight: int, base: float, knee: float) -> float:
    """Seconds one request takes when ``in_flight`` requests (itself included) are running."""
    return base * (1.0 + (max(0, in_flight - 1) / knee) ** 2)


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile by the nearest-rank method (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-fraction * len(ordered) // 1))))
    return ordered[rank - 1]


class MasterState:
    """Counters shared by the handler threads."""

    def __init__(self, base: float, knee: float) -> None:
        self.base, self.knee = base, knee
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.completed = 0
        self.by_command: dict[str, int] = {}
        self.running: dict[str, int] = {}
        self.max_running: dict[str, int] = {}
        self.latencies: list[float] = []

    def enter(self, command: str) -> float:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.by_command[command] = self.by_command.get(command, 0) + 1
            self.running[command] = self.running.get(command, 0) + 1
            self.max_running[command] = max(self.max_running.get(command, 0), self.running[command])
            return service_time(self.in_flight, self.base, self.knee)

    def leave(self, command: str, latency: float) -> int:
        with self.lock:
            self.in_flight -= 1
            self.running[command] -= 1
            self.completed += 1
            self.latencies.append(latency)
            return self.in_flight

    def stats(self) -> dict[str, Any]:
        with self.lock:
            values = list(self.latencies)
            return {
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "completed": self.completed,
                "by_command": dict(self.by_command),
                "max_in_flight_by_command": dict(self.max_running),
                "p50": percentile(values, 0.50),
                "p99": percentile(values, 0.99),
                "max_latency": max(values) if values else 0.0,
                "base": self.base,
                "knee": self.knee,
            }


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        line = self.rfile.readline(MAX_LINE)
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            self._reply({"ok": False, "error": f"bad request: {exc}"})
            return
        state = self.server.state
        op = request.get("op")
        if op == "stats":
            self._reply({"ok": True, **state.stats()})
        elif op == "reset":
            with state.lock:
                state.reset()
            self._reply({"ok": True})
        elif op == "request":
            started = time.monotonic()
            command = str(request.get("command", "?"))
            delay = state.enter(command)
            try:
                time.sleep(delay)  # the simulated work of the master daemon
            finally:
                latency = time.monotonic() - started
                state.leave(command, latency)
            self._reply({"ok": True, "latency": latency})
        else:
            self._reply({"ok": False, "error": f"unknown op {op!r}"})

    def _reply(self, message: dict[str, Any]) -> None:
        try:
            self.wfile.write(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the client went away (killed by its deadline): nothing to tell it


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = 1024
    state: MasterState


def serve(path: str, base: float, knee: float, mode: int = 0o666) -> _Server:
    """Bind the socket and return the server (call ``serve_forever``)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server = _Server(path, _Handler)
    os.chmod(path, mode)  # ordinary users' stand-in commands must reach it
    server.state = MasterState(base, knee)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stand-in LSF master daemon (tests, benches).")
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on.")
    parser.add_argument(
        "--base", type=float, default=0.01, help="Service time of a lone request, seconds."
    )
    parser.add_argument(
        "--knee",
        type=float,
        default=8.0,
        help="Concurrency past which service time grows quadratically.",
    )
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="Stop when the process that started it is gone (tests: a killed "
        "test run leaves no master behind).",
    )
    args = parser.parse_args(argv)
    if args.base < 0 or args.knee <= 0:
        parser.error("--base must be >= 0 and --knee > 0")
    server = serve(args.socket, args.base, args.knee)

    def stop(_signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.exit_with_parent:
        parent = os.getppid()

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            server.shutdown()

        threading.Thread(target=watch, daemon=True).start()
    print(json.dumps({"ready": True, "socket": args.socket, "pid": os.getpid()}), flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
        try:
            os.unlink(args.socket)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
