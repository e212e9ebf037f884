"""Helpers of the token-daemon reliability tests: the lsf_proxy daemon fixtures, raw socket talk."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

# The daemon fixtures of the plugin's own tests (a real `gridgate lsfproxyd serve` process, a
# socket directory `nobody` can reach, commands run as `nobody`) are reused, not copied; the
# names below are re-exported for the daemon tests.
from support import lsfproxyd as lsf_fixtures
from support.polling import until
from support.ports import free_port
from support.uids import AS_NOBODY

__all__ = [
    "AS_NOBODY",
    "PYTHON",
    "start_flood",
    "free_port",
    "hello_as_nobody_code",
    "in_use",
    "lsf_fixtures",
    "read_replies",
    "rss_mib",
    "status",
    "talk",
    "until",
]

ROOT = Path(__file__).resolve().parents[2]
PYTHON = lsf_fixtures.PYTHON
#: the flood client (a real process): ``count`` idle TCP connections for ``seconds``
FLOOD = Path(__file__).with_name("flood_tcp.py")


def start_flood(port: int, count: int, seconds: float, sources: list[str]) -> subprocess.Popen[str]:
    """Start the TCP flood against ``port`` as ``nobody``, from the loopback ``sources``."""
    return subprocess.Popen(
        [
            *AS_NOBODY,
            PYTHON,
            str(FLOOD),
            "127.0.0.1",
            str(port),
            str(count),
            str(seconds),
            ",".join(sources),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )


def _reply_lines(data: bytes) -> list[dict[str, Any]]:
    # events (``queued``, ``expired``) come between replies: they answer no request
    return [m for m in map(json.loads, data.splitlines()) if "event" not in m]


def read_replies(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    """Read ``count`` replies (fewer if the daemon closes the connection); events skipped."""
    data = b""
    while len(_reply_lines(data[: data.rfind(b"\n") + 1])) < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return _reply_lines(data[: data.rfind(b"\n") + 1])[:count]


def talk(path: str, *lines: bytes, timeout: float = 20) -> list[dict[str, Any]]:
    """Send raw lines on one Unix connection, read one reply per line."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(b"".join(lines))
        return read_replies(sock, len(lines))


def status(path: str) -> dict[str, Any]:
    (reply,) = talk(path, b'{"v":1,"id":1,"op":"status"}\n')
    assert reply["ok"], reply
    return reply["status"]


def in_use(path: str) -> dict[str, int]:
    """category -> in_use on the daemon at ``path``."""
    return {name: cat["in_use"] for name, cat in status(path)["categories"].items()}


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def hello_as_nobody_code(path: str, messages: list[dict[str, Any]], count: int) -> str:
    """Python code that sends ``messages`` on one Unix connection and prints ``count`` replies
    as a JSON list (run it as ``nobody`` with the ``py_as`` fixture)."""
    return (
        "import json, socket\n"
        "data = b''\n"
        "s = socket.socket(socket.AF_UNIX); s.settimeout(30)\n"
        f"s.connect({path!r})\n"
        f"s.sendall(b''.join(json.dumps(m).encode() + b'\\n' for m in {messages!r}))\n"
        "def replies():  # events (queued, expired) answer no request: skipped\n"
        "    done = data[:data.rfind(b'\\n') + 1]\n"
        "    return [m for m in map(json.loads, done.splitlines()) if 'event' not in m]\n"
        f"while len(replies()) < {count}:\n"
        "    chunk = s.recv(65536)\n"
        "    if not chunk: break\n"
        "    data += chunk\n"
        f"print(json.dumps(replies()[:{count}]))\n"
    )
