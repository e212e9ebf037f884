"""Connection pools of the token daemon (guard.py), as pure objects; then its accept loop on
a real TCP socket."""

from __future__ import annotations

import asyncio
import socket

from loguru import logger

from gridgate.core.clock import FakeClock
from gridgate.plugins.lsf_proxy.daemon.guard import (
    ORDINARY,
    OWN_FDS,
    PRIVILEGED,
    TCP_BURST,
    UNAUTH,
    ConnectionGuard,
    Listener,
    PeriodicLog,
    capacity,
    listening_socket,
)
from gridgate.plugins.lsf_proxy.settings import ProxydSettings


def _warnings(action) -> list[str]:
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="WARNING", format="{message}")
    try:
        action()
    finally:
        logger.remove(sink)
    return seen


def test_max_connections_follows_the_descriptor_limit():
    cap = capacity(ProxydSettings.of({}), nofile=256)
    assert (
        cap.max_connections + cap.admin_reserve + cap.tcp_max_unauthenticated + TCP_BURST
        == 256 - OWN_FDS
    )
    big = capacity(ProxydSettings.of({}), nofile=20000)
    assert (big.tcp_max_unauthenticated, big.admin_reserve) == (256, 64)
    assert big.max_connections == 20000 - OWN_FDS - 256 - TCP_BURST - 64


def test_a_configured_max_beyond_the_limit_is_lowered_with_a_warning():
    lowered: list = []
    seen = _warnings(
        lambda: lowered.append(capacity(ProxydSettings.of({"max_connections": 5000}), nofile=256))
    )
    assert lowered[0].max_connections == capacity(ProxydSettings.of({}), nofile=256).max_connections
    assert len(seen) == 1 and "max_connections 5000" in seen[0]
    assert (
        _warnings(
            lambda: capacity(ProxydSettings.of({"max_connections": 5000}), nofile=256, warn=False)
        )
        == []
    )
    assert capacity(ProxydSettings.of({"max_connections": 10}), nofile=256).max_connections == 10


def test_unauthenticated_tcp_never_takes_from_the_other_pools():
    guard = ConnectionGuard(
        capacity(
            ProxydSettings.of(
                {
                    "max_connections": 2,
                    "admin_reserve": 1,
                    "tcp_max_unauthenticated": 3,
                    "tcp_max_per_peer": 2,
                }
            ),
            nofile=1000,
        )
    )
    assert guard.admit("t1", UNAUTH, "10.0.0.1") is None
    assert guard.admit("t2", UNAUTH, "10.0.0.1") is None
    assert "from 10.0.0.1" in guard.admit("t3", UNAUTH, "10.0.0.1")  # per address
    assert guard.admit("t4", UNAUTH, "10.0.0.2") is None
    assert "unauthenticated" in guard.admit("t5", UNAUTH, "10.0.0.3")  # the pool is full
    # the Unix socket's users and the admins still have all their room
    assert guard.admit("u1", ORDINARY) is None and guard.admit("u2", ORDINARY) is None
    assert "too many connections (2)" in guard.admit("u3", ORDINARY)
    assert guard.admit("root", PRIVILEGED) is None  # the admin reserve
    assert guard.admit("root2", PRIVILEGED) is not None
    # a TCP peer that authenticates moves to the ordinary pool, which is full now
    assert guard.authenticated("t1", privileged=False) is not None
    assert guard.counts == {UNAUTH: 2, ORDINARY: 2, PRIVILEGED: 1}
    guard.release("u1")  # root's connection counts too: u2 + root fill max_connections
    assert guard.authenticated("t2", privileged=False) is not None
    guard.release("root")
    assert guard.authenticated("t4", privileged=False) is None
    assert guard.counts == {UNAUTH: 0, ORDINARY: 2, PRIVILEGED: 0}
    assert guard.tcp_authenticated == 1
    guard.release("t4")
    assert guard.tcp_authenticated == 0 and guard.admit("t6", UNAUTH, "10.0.0.1") is None
    assert guard.refused[UNAUTH] == 2 and guard.refused[ORDINARY] == 3


def test_a_recurring_problem_is_logged_once_per_period_with_a_count():
    clock = FakeClock(1000.0)
    log = PeriodicLog(period=60, clock=clock)

    def storm() -> None:
        for _ in range(500):
            log("cannot accept on {}", "unix /x")
        clock.advance(30)
        log("cannot accept on {}", "unix /x")
        log("another kind {}", 1)  # its own period
        clock.advance(30)
        log("cannot accept on {}", "unix /x")

    seen = _warnings(storm)
    assert len(seen) == 3, seen
    assert seen[0].startswith("cannot accept on unix /x (1 time(s)")
    assert seen[1].startswith("another kind 1 (1 time(s)")
    assert seen[2].startswith("cannot accept on unix /x (501 time(s)")  # 499 + 1 + 1 since
    assert log.total == 503


def test_accepted_tcp_connections_send_without_delay():
    # the listener's socket says proto 0, so asyncio would leave Nagle on for the connections
    # it accepts: a second small write (a grant after its "queued" event) then waited for the
    # client's delayed ACK, 40 ms per queued request on loopback
    seen: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(
            writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        )
        writer.write(b"ok\n")
        await writer.drain()

    async def main() -> None:
        sock = listening_socket(socket.AF_INET, ("127.0.0.1", 0))
        listener = Listener(
            asyncio.get_running_loop(),
            sock,
            handler,
            "tcp test",
            PeriodicLog(60.0),
            1 << 16,
            lambda _listener: 8,
        )
        try:
            reader, writer = await asyncio.open_connection(*sock.getsockname())
            assert await reader.readline() == b"ok\n"
            writer.close()
        finally:
            listener.close()

    asyncio.run(main())
    assert seen and seen[0] != 0
