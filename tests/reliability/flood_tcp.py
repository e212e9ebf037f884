"""A hostile TCP client without the key (run as ``nobody``): holds COUNT connections to
HOST:PORT spread over the given source addresses, says nothing, and reconnects at once when the
daemon closes one, for SECONDS. Prints what it saw as one JSON line.

    python flood_tcp.py HOST PORT COUNT SECONDS SOURCE[,SOURCE...]
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import sys
import time


def main() -> None:
    host, port, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    sources = sys.argv[5].split(",")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(count + 64, hard), hard))
    sel = selectors.DefaultSelector()
    seen = {"opened": 0, "closed_by_daemon": 0, "connect_errors": 0, "error_lines": 0}

    def open_one(index: int) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.bind((sources[index % len(sources)], 0))
            sock.connect_ex((host, port))
        except OSError:
            seen["connect_errors"] += 1
            sock.close()
            return
        seen["opened"] += 1
        sel.register(sock, selectors.EVENT_READ, index)

    for index in range(count):
        open_one(index)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for key, _ in sel.select(0.1):
            sock = key.fileobj
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                seen["error_lines"] += data.count(b"\n")
                continue
            sel.unregister(sock)
            sock.close()
            seen["closed_by_daemon"] += 1
            open_one(key.data)  # hostile: straight back
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
