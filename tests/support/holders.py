"""Token holders as an ordinary user, for the adaptive limit's tests: ``holders(socket, n,
hold)`` runs ``n`` loops each taking a query token, running a real command of ``hold`` seconds
under it (coreutils' sleep), giving it back, until :func:`stop` (root is never paced, so its
holds are no signal)."""

from __future__ import annotations

import subprocess
import sys

from support.uids import AS_NOBODY

HOLDER = r"""
import subprocess, sys, threading
from loguru import logger
logger.remove()
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
socket, threads, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3]
client = ProxyClient([Daemon("proxyd", socket)])
def loop():
    while True:
        with client.acquire("query", "squeue"):
            subprocess.run(["/bin/sleep", hold], check=True)
for _ in range(threads):
    threading.Thread(target=loop, daemon=True).start()
print("holding", flush=True)
threading.Event().wait()
"""


def holders(socket: str, threads: int, hold: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", HOLDER, socket, str(threads), str(hold)],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(30)
    if proc.stdout:
        proc.stdout.close()
