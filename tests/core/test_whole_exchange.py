"""A wall-clock deadline over each whole exchange, for the clients that read with per-read
timeouts (issue 31, item 2): SMTP (the outbox's transport), a Redis demand source and the
Redis state store, each against a real loopback server that trickles a byte every 50 ms so
that no single read ever times out. HTTP (sources, GOCDB, GGUS REST, ARC REST) goes through
core/http, whose phases are tested the same way in test_http.py."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.tcp import trickle_after

from gridgate.core.builtin.waiting import SourceError, make_source
from gridgate.core.mail import SmtpSettings, SmtpTransport
from gridgate.core.outbox import Delivery, Message
from gridgate.core.state import StateError
from gridgate.core.stores.redis import RedisState

GRACE = 2.0
PAUSE = 0.05
#: a line that never ends, a byte every PAUSE seconds: longer than any deadline here
SLOW = b"250-still going, " * 40


def _finishes(
    call: Callable[[], Any], within: float, catch: tuple[type[Exception], ...] = ()
) -> tuple[Any, float]:
    """``call()``'s result (or the ``catch`` exception it raised) and its wall time; fails
    (instead of hanging) past ``within``."""
    box: list[Any] = []

    def work() -> None:
        try:
            box.append(call())
        except catch as exc:
            box.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(within)
    assert not worker.is_alive(), f"still blocked after {within} s: no deadline held"
    return box[0], time.monotonic() - started


def _message() -> Message:
    raw = "From: g@example.org\r\nTo: ops@example.org\r\nSubject: t\r\n\r\nbody\r\n"
    payload = {"from": "g@example.org", "to": ["ops@example.org"], "raw": raw}
    return Message(id="1-1", transport="smtp", payload=payload, enqueued=time.time())


def _smtp_until_data(conn: socket.socket) -> bytes:
    """A quick SMTP dialogue up to the end of DATA, as a server that then stalls its reply."""
    conn.sendall(b"220 mx.example ESMTP\r\n")
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
        while b"\r\n" in data:
            line, data = data.split(b"\r\n", 1)
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                conn.sendall(b"250 mx.example\r\n")
            elif verb in (b"MAIL", b"RCPT"):
                conn.sendall(b"250 ok\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 go ahead\r\n")
                while b"\r\n.\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return b""
                    data += more
                return b"data"


@pytest.mark.parametrize(
    ("handler", "doing"),
    [
        (trickle_after(b"220-mx.example\r\n", SLOW, PAUSE), "connecting and greeting"),
        (trickle_after(b"", SLOW, PAUSE, first=_smtp_until_data), "sending the message"),
    ],
    ids=["greeting", "reply-to-data"],
)
def test_an_smtp_server_that_trickles_is_cut_at_the_timeout(serve, handler, doing) -> None:
    server = serve(handler)
    transport = SmtpTransport(
        SmtpSettings.of({"host": "127.0.0.1", "port": server.port, "timeout": 1.0})
    )
    delivery, elapsed = _finishes(lambda: transport.deliver(_message()), within=20)
    transport.finish()
    assert isinstance(delivery, Delivery) and delivery.status == "retry", delivery
    assert f"no complete answer within 1 s while {doing}: cut" in delivery.reply, delivery
    assert elapsed < 1.0 + GRACE, f"cut after {elapsed:.2f} s"


def test_a_redis_demand_source_that_trickles_is_cut_at_twice_its_timeout(serve) -> None:
    server = serve(trickle_after(b"", b"+lis" * 100, PAUSE, first=lambda c: c.recv(65536)))
    source = make_source(
        {"redis": {"url": f"redis://127.0.0.1:{server.port}/0", "key": "tq", "timeout": 1}}
    )
    failure, elapsed = _finishes(source.read, within=20, catch=(SourceError,))
    assert isinstance(failure, SourceError), failure
    assert "no complete answer within 2 s: cut" in str(failure), failure
    assert elapsed < 2.0 + GRACE, f"cut after {elapsed:.2f} s"


def test_a_redis_state_store_that_trickles_is_cut_within_its_call_budget(serve) -> None:
    server = serve(trickle_after(b"", b"+lis" * 100, PAUSE, first=lambda c: c.recv(65536)))
    store = RedisState(
        {
            "url": f"redis://127.0.0.1:{server.port}/0",
            "socket_timeout": 0.5,
            "socket_connect_timeout": 0.5,
        }
    )
    try:
        failure, elapsed = _finishes(lambda: store.get("k"), within=20, catch=(StateError,))
    finally:
        store.close()
    assert isinstance(failure, StateError), failure
    assert "no complete answer within 1.5 s: cut" in str(failure), failure
    assert elapsed < 1.5 + GRACE, f"cut after {elapsed:.2f} s"


def test_the_token_clients_call_holds_its_timeout_against_events_without_end(tmp_path) -> None:
    """The long-lived client skipped events until its reply, each recv under the timeout: a
    daemon (or something at its socket) sending an event every 50 ms held it for ever."""
    from gridgate.plugins.lsf_proxy.client.client import Connection, Daemon
    from gridgate.plugins.lsf_proxy.wire import DaemonBusy

    path = tmp_path / "d.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    stop = threading.Event()

    def chatter() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the request
            while not stop.is_set():
                conn.sendall(b'{"v": 1, "event": "queue", "id": 0}\n')
                time.sleep(PAUSE)

    threading.Thread(target=chatter, daemon=True).start()
    link = Connection(Daemon("d", str(path)), 1.0, None, "alice", "host")
    try:
        failure, elapsed = _finishes(
            lambda: link.call("status", timeout=1.0), within=20, catch=(DaemonBusy,)
        )
    finally:
        stop.set()
        listener.close()
    assert isinstance(failure, DaemonBusy) and "no reply within 1 s" in str(failure), failure
    assert elapsed < 1.0 + GRACE, f"cut after {elapsed:.2f} s"
