"""The outbox on its own, with a transport written for the test: ordering under concurrent
producers, crash leftovers, unreadable files, unknown transports, failing transports."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pluggy

from gridgate.core.clock import FakeClock
from gridgate.core.engine.loader import new_plugin_manager
from gridgate.core.model import Notification
from gridgate.core.outbox import Delivery, Message, Outbox
from gridgate.core.plugins import PluginContext
from gridgate.plugins.notify_email.notifier import EmailNotifier


class ListTransport:
    """Delivers into a list; answers with the scripted deliveries first."""

    def __init__(self, script: list[Delivery] | None = None) -> None:
        self.delivered: list[str] = []
        self.script = list(script or [])
        self.finished = 0

    def deliver(self, message: Message) -> Delivery:
        if self.script:
            return self.script.pop(0)
        self.delivered.append(message.payload["n"])
        return Delivery("sent", "ok")

    def finish(self) -> None:
        self.finished += 1


def test_concurrent_producers_get_unique_increasing_names(tmp_path):
    box = Outbox(tmp_path / "o", {"t": ListTransport()}, clock=FakeClock())

    def produce(k: int) -> None:
        for i in range(25):
            box.enqueue("t", {"n": f"{k}-{i}"})

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    names = [m.id for m in box.pending()]
    assert len(names) == len(set(names)) == 200
    seqs = [int(n.split("-")[1]) for n in names]
    assert seqs == list(range(1, 201))
    # each producer's own messages stay in its order
    transport = box.transports["t"]
    assert box.flush(30).sent == 200
    for k in range(8):
        mine = [d for d in transport.delivered if d.startswith(f"{k}-")]
        assert mine == [f"{k}-{i}" for i in range(25)]


def test_files_are_private_and_crash_leftovers_are_not_delivered(tmp_path):
    transport = ListTransport()
    box = Outbox(tmp_path / "o", {"t": transport}, clock=FakeClock())
    box.enqueue("t", {"n": "real"})
    (box.tmp_dir / ".half-written.tmp").write_text('{"id": "x", "transport": "t"')
    old = box.tmp_dir / ".old.tmp"
    old.write_text("{")
    os.utime(old, (0, 0))
    for folder in (box.directory, box.queue_dir, box.dead_dir, box.tmp_dir):
        assert folder.stat().st_mode & 0o777 == 0o700
    (queued,) = box.queue_dir.iterdir()
    assert queued.stat().st_mode & 0o777 == 0o600
    assert json.loads(queued.read_text())["payload"] == {"n": "real"}
    assert box.flush(10).sent == 1
    assert transport.delivered == ["real"] and transport.finished == 1
    Outbox(tmp_path / "o", {"t": transport})  # a restart sweeps old leftovers only
    assert not old.exists() and (box.tmp_dir / ".half-written.tmp").exists()


def test_unreadable_message_goes_to_dead_and_the_rest_flows(tmp_path):
    transport = ListTransport()
    box = Outbox(tmp_path / "o", {"t": transport}, clock=FakeClock())
    box.enqueue("t", {"n": "a"})
    (box.queue_dir / "0000000000000-0000000000.json").write_text("not json")
    assert box.flush(10).dead == 1
    assert transport.delivered == ["a"]
    assert [m.id for m in box.dead()] == ["0000000000000-0000000000"]
    assert box.dead()[0].last_error.startswith("unreadable")


def test_unknown_transport_waits_and_a_crashing_transport_is_retried(tmp_path):
    class Broken(ListTransport):
        def deliver(self, message: Message) -> Delivery:
            raise RuntimeError("bug")

    clock = FakeClock()
    box = Outbox(tmp_path / "o", {"t": Broken()}, clock=clock)
    box.enqueue("other", {"n": "x"})
    box.enqueue("t", {"n": "y"})
    result = box.flush(10)
    assert (result.retried, result.waiting) == (1, 2)
    other, mine = box.pending()
    assert other.attempts == 0 and mine.attempts == 1
    assert mine.last_error == "internal error: RuntimeError"


def test_message_scoped_retry_does_not_hold_back_the_others(tmp_path):
    clock = FakeClock()
    transport = ListTransport([Delivery("retry", "452 mailbox full", blocking=False)])
    box = Outbox(tmp_path / "o", {"t": transport}, clock=clock)
    for n in "abc":
        box.enqueue("t", {"n": n})
    assert box.flush(10).sent == 2
    assert transport.delivered == ["b", "c"]
    blocking = ListTransport([Delivery("retry", "connection refused")])
    box2 = Outbox(tmp_path / "o2", {"t": blocking}, clock=clock)
    for n in "abc":
        box2.enqueue("t", {"n": n})
    assert box2.flush(10).sent == 0  # the server is down: order is kept
    clock.advance(30)
    assert box2.flush(10).sent == 3 and blocking.delivered == ["a", "b", "c"]


def test_email_notifier_registers_with_pluggy_and_answers_gridgate_notify(tmp_path):
    pm: pluggy.PluginManager = new_plugin_manager()
    clock = FakeClock()
    n = EmailNotifier(
        {"from": "g@example.org", "error_address": "o@example.org", "send_thread": False},
        PluginContext(clock=clock, state_dir=Path(tmp_path)),
    )
    pm.register(n, name="notifiers:email")
    pm.check_pending()
    assert pm.hook.gridgate_notify(notification=Notification("error", "s", "b", clock.time())) == []
    assert len(n.outbox.pending()) == 1
    n.close()
