"""What the whole-exchange deadline (gridgate.core.cutoff, issue 31 item 2) costs a Redis state
store call, for docs/performance.md.

One real redis-server (started here, loopback). The measured call is ``RedisState.call`` of a
GET, which since issue 31 runs inside ``cut_after`` (a heap push on the process's one watchdog,
and its removal); the baseline is the same GET on the same client without the guard. Rounds of
``--calls`` calls alternate between the two in this process, so load from elsewhere hits both
alike; the figure is the ratio of the medians, with the absolute times beside it.

    .venv/bin/python bench/bench_cutoff.py [--rounds 9] [--calls 5000] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

from gridgate.core.stores.redis import RedisState


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (bash dev.sh test installs it)")
    port = _free_port()
    with tempfile.TemporaryDirectory() as folder:
        server = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder],
            stdout=subprocess.DEVNULL,
        )
        try:
            store = RedisState({"url": f"redis://127.0.0.1:{port}/0"})
            client = store.client
            deadline = time.monotonic() + 15
            while True:
                try:
                    client.ping()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            client.set("bench:k", "v")

            def guarded() -> None:
                for _ in range(args.calls):
                    store.call("get", client.get, "bench:k")

            def bare() -> None:
                for _ in range(args.calls):
                    client.get("bench:k")

            times: dict[str, list[float]] = {"guarded": [], "bare": []}
            for _ in range(args.rounds):
                for name, fn in (("bare", bare), ("guarded", guarded)):
                    start = time.perf_counter()
                    fn()
                    times[name].append((time.perf_counter() - start) / args.calls)
            store.close()
        finally:
            server.terminate()
            server.wait(10)
    medians = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "guarded_us": round(medians["guarded"] * 1e6, 2),
        "bare_us": round(medians["bare"] * 1e6, 2),
        "ratio": round(medians["guarded"] / medians["bare"], 3),
        "rounds": args.rounds,
        "calls": args.calls,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"state store GET: {result['guarded_us']} us with the cutoff, {result['bare_us']} "
            f"us without: {result['ratio']}x ({args.rounds} rounds of {args.calls} calls)"
        )


if __name__ == "__main__":
    main()
