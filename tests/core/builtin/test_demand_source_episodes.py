"""A demand source that fails longer than its group's keep_last is told to people once, and
again when it answers (issue 32, item 7): a real redis-server holds the task queue and is
stopped with SIGSTOP (it accepts connections and answers nothing, as a hung server does)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator

import pytest
from loguru import logger
from support.director import BACKEND, TrackingBackend
from support.redis_server import RedisServer

from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.engine.runtime import EPISODES
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector, make_config


@pytest.fixture
def queue_server(tmp_path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


def _director(server: RedisServer, key: str, clock: FakeClock, collector: Collector) -> Director:
    source = {"redis": {"url": server.url, "key": key, "timeout": 1}}
    doc = {
        "director": {"cycle_seconds": 0.01, "max_threads": 2, "command_timeout": 5},
        "state": {"driver": "memory"},
        "demand": {
            "queue": {"groups": {"mc": {"backend": BACKEND, "source": source, "keep_last": 60}}}
        },
    }
    return Director(
        make_config(doc),
        clock=clock,
        extra_plugins=[TrackingBackend(servers=2), collector],
        state=MemoryState(clock=clock),
    )


def _about_mc(collector: Collector) -> list[tuple[str, str]]:
    return [(n.level, n.subject) for n in collector.notes if "demand group mc" in n.subject]


def test_a_source_down_past_keep_last_is_one_error_and_one_notice_when_it_answers(
    queue_server,
) -> None:
    key = f"tq:{uuid.uuid4().hex}"
    client = queue_server.client()
    client.rpush(key, *range(4))
    client.close()
    clock, collector = FakeClock(), Collector()
    lines: list[str] = []  # what the log shows at INFO and above, with the default log notifier
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    director = _director(queue_server, key, clock, collector)
    try:
        director.run_iteration()
        assert queue_server.proc is not None
        os.kill(queue_server.proc.pid, signal.SIGSTOP)  # the queue's Redis hangs
        clock.advance(30)
        director.run_iteration()
        assert _about_mc(collector) == [], "within keep_last the last figure holds: no mail"
        clock.advance(45)  # 75 s without an answer, keep_last is 60
        summary = director.run_iteration()
        [figure] = [f for f in summary.demand if f.group == "mc"]
        assert figure.stale and not figure.fresh and figure.jobs == 0, figure
        for _ in range(3):
            clock.advance(60)
            director.run_iteration()
        told = _about_mc(collector)
        assert len(told) == 1, told
        level, subject = told[0]
        assert level == "error" and "cannot be read: no pilots for it" in subject, subject
        [error] = [n for n in collector.notes if n.subject == subject]
        assert f"redis {queue_server.url} key {key}" in error.body, error.body
        assert "keep_last" in error.body and "Failing for: " in error.body
        os.kill(queue_server.proc.pid, signal.SIGCONT)  # it answers again
        clock.advance(60)
        director.run_iteration()
        director.run_iteration()
        told = _about_mc(collector)
        assert [lvl for lvl, _s in told] == ["error", "info"], told
        assert "is read again" in told[1][1]
        rows = [r for r in director.state.records(EPISODES) if r.get("what") == "demand"]
        assert [r["state"] for r in rows] == ["unreadable", "available"], rows
        # one line per event (issue 42): the tracker's, not the log notifier's again
        about = [line for line in lines if "group mc" in line]
        assert len([line for line in about if "answers again" in line]) == 1, about
        assert len([line for line in about if "cannot read" in line]) == 1, about
        assert not [line for line in about if line.startswith("[")], about
    finally:
        director.close()
        logger.remove(sink)
