"""The outage test of issue 4: SMTP down, 50 notifications from a producer that crashes and is
restarted (real processes), SMTP back: all delivered once, in order; a 550 ends in dead-letter.
Also: two processes flushing one outbox never send a message twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.servers import SmtpServer, free_port

from gridgate.core.clock import FakeClock
from gridgate.core.model import Notification
from gridgate.core.plugins import PluginContext
from gridgate.plugins.notify_email.notifier import EmailNotifier

PRODUCER = r"""
import json, sys
from pathlib import Path
from gridgate.core.clock import FakeClock
from gridgate.core.model import Notification
from gridgate.core.plugins import PluginContext
from gridgate.plugins.notify_email.notifier import EmailNotifier

cfg, first, last, t0, state, bad = json.loads(sys.argv[1])
clock = FakeClock(t0)
n = EmailNotifier(cfg, PluginContext(clock=clock, state_dir=Path(state)))
for i in range(first, last):
    n.gridgate_notify(notification=Notification("error", f"outage {i:03d}", f"body {i}\n", clock.time()))
    if i == bad:
        n.gridgate_notify(notification=Notification("alarm", "to a refused address", "x\n", clock.time()))
    clock.advance(1)
print(len(n.outbox.pending()), flush=True)
if sys.stdin.readline().strip() == "close":
    n.close()
"""

FLUSHER = r"""
import json, sys
from pathlib import Path
from gridgate.core.plugins import PluginContext
from gridgate.plugins.notify_email.notifier import EmailNotifier

cfg, state = json.loads(sys.argv[1])
n = EmailNotifier(cfg, PluginContext(state_dir=Path(state)))
print(n.flush(60).sent, flush=True)
n.close()
"""


def _spawn(code: str, args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(args)],
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_outage_restart_then_all_50_delivered_once_in_order(tmp_path):
    port = free_port()  # the SMTP server is down: nothing listens here yet
    state = str(tmp_path / "state")
    cfg = {
        "host": "127.0.0.1",
        "port": port,
        "from": "gridgate@example.org",
        "error_address": "ops@example.org",
        "alarm_address": "nobody@example.org",
        "poll_interval": 0.05,
        "timeout": 5,
    }
    t0 = 1_790_000_000.0

    # First producer: queues 25 (its sender thread keeps failing), then dies with SIGKILL.
    first = _spawn(PRODUCER, [cfg, 0, 25, t0, state, 10])
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() != ""
    finally:
        first.kill()
        first.wait(30)
    # Restarted producer: its clock starts *behind* the first one's last enqueue.
    second = _spawn(PRODUCER, [cfg, 25, 50, t0, state, -1])
    try:
        out, err = second.communicate("close\n", timeout=60)
    finally:
        second.kill()
        second.wait(30)
    assert second.returncode == 0, err
    assert int(out) == 51  # 50 errors + 1 alarm, nothing delivered yet

    server = SmtpServer(port=port)
    server.handler.refuse_rcpt["nobody@example.org"] = "550 5.1.1 <nobody@example.org>: unknown"
    server.start()
    try:
        clock = FakeClock(t0 + 7200)  # past any backoff the first producer's thread set
        n = EmailNotifier(
            {**cfg, "send_thread": False}, PluginContext(clock=clock, state_dir=Path(state))
        )
        result = n.flush(60)
        clock.advance(86400)
        again = n.flush(60)
        n.close()
    finally:
        server.stop()

    subjects = server.handler.subjects()
    assert subjects == [f"[gridgate] outage {i:03d}" for i in range(50)]
    assert (result.sent, result.dead, result.waiting) == (50, 1, 0)
    assert (again.sent, again.dead, again.retried) == (0, 0, 0)
    (dead,) = n.outbox.dead()
    assert dead.payload["to"] == ["nobody@example.org"] and "550 5.1.1" in dead.reply
    assert server.handler.rcpt_attempts["nobody@example.org"] == 1


def test_two_processes_flushing_one_outbox_send_each_message_once(tmp_path):
    server = SmtpServer().start()
    procs: list[subprocess.Popen[str]] = []
    try:
        state = str(tmp_path / "state")
        cfg = {
            "host": "127.0.0.1",
            "port": server.port,
            "from": "gridgate@example.org",
            "error_address": "ops@example.org",
            "send_thread": False,
            "timeout": 5,
        }
        clock = FakeClock()
        n = EmailNotifier(cfg, PluginContext(clock=clock, state_dir=Path(state)))
        for i in range(40):
            n.gridgate_notify(notification=Notification("error", f"m {i:02d}", "b\n", clock.time()))
        n.close()
        procs = [_spawn(FLUSHER, [cfg, state]) for _ in range(2)]
        sent = [int(p.communicate(timeout=120)[0]) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
        server.stop()
    assert sum(sent) == 40
    assert sorted(server.handler.subjects()) == [f"[gridgate] m {i:02d}" for i in range(40)]
