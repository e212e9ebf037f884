"""Several token daemons as one service: who is alive, each one's share, one service state.

The daemons listed in ``proxyd.hosts`` send each other a ``heartbeat`` every
``heartbeat_interval`` seconds through the ordinary client (Unix socket or signed TCP, so a
heartbeat is authenticated like any admin command), or, with ``heartbeat_via: state``, keep a
key with a TTL in the site's shared state store (Redis, where the directors already share one). There is no consensus protocol: each
daemon sorts the names it believes alive and takes its share of that list
(:func:`~gridgate.plugins.lsf_proxy.config.split_limits`), so daemons that hear each other
agree on the split. Tokens already granted are never taken back: a shrunk share only stops new
grants until use falls under it. docs/proxyd.md states the over-grant this allows while views
differ.

:class:`PeerView` is the pure part (liveness and service state on an injected clock);
:class:`Heartbeat` runs it inside the asyncio daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.secrets import read_secret
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.config import CATEGORIES, Limits, split_limits
from gridgate.plugins.lsf_proxy.daemon.documents import (
    ServiceState,
    heartbeat,
    peer_grants,
    peer_reply,
    stored_heartbeat,
)
from gridgate.plugins.lsf_proxy.settings import ProxydSettings

#: A peer not heard for this many heartbeat intervals is taken for dead.
MISSES = 3
#: State-store keys of the daemons' heartbeats (``heartbeat_via: state``), then the name.
STORE_KEY = "proxyd.heartbeat."


class PeerView:
    """What one daemon believes about the others, on an injected clock.

    A peer is alive while it was heard (its heartbeat reply, or its own heartbeat) less than
    ``MISSES`` intervals ago. A peer that was heard and then refuses connections is dead at
    once (its socket is gone: it stopped or crashed). A peer never heard since this daemon
    started counts as alive for the first ``MISSES`` intervals: a daemon that starts takes the
    smaller share until it knows better, never the larger.
    """

    def __init__(
        self, name: str, names: Iterable[str], interval: float, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.name = name
        self.clock = clock
        self.interval = float(interval)
        self._started = clock.monotonic()
        self._heard: dict[str, float] = {}
        self._down: set[str] = set()
        self.names: list[str] = []
        self.set_names(names)
        self.service = ServiceState(dict.fromkeys(CATEGORIES, True))

    @property
    def timeout(self) -> float:
        return MISSES * self.interval

    def _now(self, now: float | None) -> float:
        return self.clock.monotonic() if now is None else now

    def set_names(self, names: Iterable[str]) -> None:
        """The daemons of ``proxyd.hosts`` (this one included); others are forgotten."""
        self.names = sorted(set(names) | {self.name})
        for gone in set(self._heard) - set(self.names):
            del self._heard[gone]
        self._down &= set(self.names)

    def heard(self, name: str, now: float | None = None) -> None:
        """``name`` answered or sent a heartbeat."""
        if name in self.names and name != self.name:
            self._heard[name] = self._now(now)
            self._down.discard(name)

    def failed(self, name: str, refused: bool, now: float | None = None) -> None:
        """A heartbeat to ``name`` got no answer; ``refused``: not even a connection."""
        if refused and name in self._heard:
            self._down.add(name)

    def is_live(self, name: str, now: float | None = None) -> bool:
        if name == self.name:
            return True
        if name in self._down:
            return False
        now = self._now(now)
        last = self._heard.get(name)
        if last is None:
            return now - self._started < self.timeout
        return now - last < self.timeout

    def live(self, names: Iterable[str] | None = None, now: float | None = None) -> list[str]:
        """The live daemons among ``names`` (default: the configured ones), sorted."""
        now = self._now(now)
        chosen = self.names if names is None else sorted(set(names) | {self.name})
        return [n for n in chosen if self.is_live(n, now)]

    def share(
        self,
        limits: Mapping[str, Limits],
        names: Iterable[str] | None = None,
        now: float | None = None,
    ) -> dict[str, Limits]:
        """This daemon's share of ``limits`` split over the live daemons."""
        live = self.live(names, now)
        return split_limits(limits, live.index(self.name), len(live))

    def local_change(self, enabled: Mapping[str, bool], wall: float | None = None) -> None:
        """An administrator enabled or disabled categories here."""
        self.service = ServiceState(
            dict(enabled), self.clock.time() if wall is None else wall, self.name
        )

    def offer(self, state: ServiceState) -> bool:
        """A peer's service state; taken (True) when it is newer than ours."""
        if state.newer_than(self.service):
            self.service = state
            return True
        return False

    def status(self, now: float | None = None) -> dict[str, Any]:
        now = self._now(now)
        return {
            "interval": self.interval,
            "live": self.live(now=now),
            "peers": {
                n: {
                    "live": self.is_live(n, now),
                    "heard_ago": (round(now - self._heard[n], 3) if n in self._heard else None),
                }
                for n in self.names
                if n != self.name
            },
            "service": self.service.to_json(),
        }


@dataclass(frozen=True)
class BeatResult:
    """One heartbeat's outcome: the peer's reply, or why there was none."""

    name: str
    reply: Mapping[str, Any] | None = None
    busy: bool = False
    error: str = ""
    #: the peer itself answered that it had no room: alive
    answered: bool = False


class Heartbeat:
    """Runs a :class:`PeerView` in the daemon: sends heartbeats, answers them.

    ``on_change(service)`` is called on the event loop when the set of live daemons changed or
    a newer service state arrived (``service`` is then its categories, else None).
    """

    def __init__(
        self,
        name: str,
        settings: ProxydSettings,
        clock: Clock,
        on_change: Callable[[Mapping[str, bool] | None], None],
        config_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """:raises ValueError: ``heartbeat_via: state`` without a usable state store."""
        self.name = name
        self.config_path = config_path
        self.store: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self.clock = clock
        self.on_change = on_change
        self.view = PeerView(name, (), settings.heartbeat_interval, clock)
        self.addresses: dict[str, str] = {}
        self.settings = settings
        self._warned: set[str] = set()
        #: what this daemon adds to its heartbeats (the bypass audit's grants and blocks), and
        #: what the peers' heartbeats brought: name -> {"at": wall time, "covered": {user:
        #: cover}, "blocked": {user: until}}
        self.extra: Callable[[], Mapping[str, Any]] | None = None
        self.peer_grants: dict[str, dict[str, Any]] = {}
        self.configure(settings)
        # the transport is chosen once: a reload that changes heartbeat_via is logged and
        # takes effect at the next start
        if settings.heartbeat_via == "state" and self.addresses:
            self.store = self._open_store()

    def configure(self, settings: ProxydSettings) -> None:
        """Take ``proxyd.hosts`` and ``heartbeat_interval`` (start and reload)."""
        self.settings = settings
        self.view.interval = settings.heartbeat_interval
        self.addresses = {h.name: h.address for h in settings.hosts if h.name != self.name}
        self.view.set_names(settings.host_names)
        #: the live daemons the daemon's share was last computed from
        self.last_live = self.view.live()

    def _open_store(self) -> Any:
        from gridgate.core.config import load_config
        from gridgate.core.state import open_state

        if self.config_path is None:
            raise ValueError(
                "proxyd.heartbeat_via: state needs the site config (-c FILE) "
                "with its state: section"
            )
        state = load_config(self.config_path)["state"]  # filled: the driver is always there
        if state["driver"] == "memory":
            raise ValueError(
                "proxyd.heartbeat_via: state needs a store the daemons share "
                "(state.driver redis, or sqlite on one host), not memory"
            )
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="proxyd-heartbeat")
        return open_state({"state": state}, clock=self.clock)

    @property
    def active(self) -> bool:
        return bool(self.addresses)

    def payload(self, leaving: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.name, "service": self.view.service.to_json()}
        if self.extra is not None:
            out["grants"] = dict(self.extra())
        if leaving:
            out["leaving"] = True
        return out

    def keep_grants(self, name: str, data: Any) -> None:
        """A peer's grants as its heartbeat (or its answer) gave them (:func:`peer_grants`);
        anything else is ignored (an older daemon sends none)."""
        grants = peer_grants(data)
        if grants is not None:
            self.peer_grants[name] = grants

    # -- answering a peer's heartbeat (the ``heartbeat`` admin op)

    def answer(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Reply fields for a peer's heartbeat.

        :raises ValueError: the sender is not one of ``proxyd.hosts`` or sent a bad state.
        """
        beat = heartbeat(message)
        if beat.sender not in self.addresses:
            raise ValueError(
                f"heartbeat from {beat.sender!r}, which is not another daemon of proxyd.hosts"
            )
        self.view.heard(beat.sender)
        if beat.grants is not None:
            self.peer_grants[beat.sender] = beat.grants
        if beat.leaving:
            # a clean stop says so: its share is free now, not at our next heartbeat
            self.view.failed(beat.sender, refused=True)
        self._settle(beat.service)
        return {"name": self.name, **self.payload(), "live": self.view.live()}

    def status(self) -> dict[str, Any]:
        """The view for ``status``, after dropping peers that fell silent since the last
        heartbeat (so that the share in force matches it)."""
        now = self.clock.monotonic()
        self._settle(None, now)
        return self.view.status(now)

    def service_changed(self, enabled: Mapping[str, bool]) -> None:
        """``enable``/``disable`` was run on this daemon."""
        self.view.local_change(enabled)

    # -- sending

    def _beat(self, name: str, payload: Mapping[str, Any]) -> BeatResult:
        """One heartbeat to ``name`` through the client (runs in a worker thread)."""
        address = self.addresses.get(name)
        if address is None:
            return BeatResult(name, error="no longer configured")
        try:
            key = read_secret(self.settings.key) if not address.startswith("/") else None
        except Exception as exc:  # a key that went missing must not stop the heartbeat
            return BeatResult(name, busy=True, error=str(exc))
        timeout = max(0.5, min(self.view.interval, self.settings.client_timeout))
        client = ProxyClient(
            [Daemon(name, address)],
            key=key,
            connect_timeout=timeout,
            reply_timeout=max(timeout, self.view.interval),
        )
        try:
            (host,) = client.admin("heartbeat", **payload)
        finally:
            client.close()
        if host.reply is None:
            # "busy" written by the peer itself (its connection pools are full: a flood of
            # its TCP port) is an answer: it runs and grants its share. Taking it for dead
            # would make the survivors serve its share too (issue 21: max=8 gave out 16).
            answered = bool(host.busy and host.error and f"{name}: busy: " in host.error)
            return BeatResult(name, busy=host.busy, error=host.error, answered=answered)
        return BeatResult(name, reply=host.reply)

    def _store_round(self, payload: Mapping[str, Any], leaving: bool = False) -> list[BeatResult]:
        """``heartbeat_via: state``: refresh this daemon's key (TTL: 3 intervals), read the
        others' (runs in the heartbeat thread)."""
        try:
            if leaving:
                self.store.delete(STORE_KEY + self.name)
                return []
            self.store.set(STORE_KEY + self.name, json.dumps(payload), ttl=self.view.timeout)
            found = dict(self.store.items(STORE_KEY))
        except Exception as exc:  # StateError, RedisError: the store, not the daemons, failed
            # no news is not news of death: count the others as alive (the smaller share)
            return [
                BeatResult(n, reply={"ok": False, "error": {"message": f"state store: {exc}"}})
                for n in sorted(self.addresses)
            ]
        out = []
        for name in sorted(self.addresses):
            value = found.get(STORE_KEY + name)
            if value is None:
                out.append(BeatResult(name, error="no heartbeat key in the state store"))
                continue
            out.append(BeatResult(name, reply=stored_heartbeat(value)))
        return out

    def _settle(self, state: ServiceState | None, now: float | None = None) -> None:
        old = dict(self.view.service.enabled)
        # a later stamp with the same categories (the same command run on every daemon) is
        # taken quietly: nothing changes here
        adopted = state is not None and self.view.offer(state) and old != dict(state.enabled)
        before, after = self.last_live, self.view.live(now=now)
        self.last_live = after
        if after != before:
            logger.info(
                "lsfproxyd {}: live daemons now {} (were {})",
                self.name,
                " ".join(after),
                " ".join(before),
            )
        if adopted:
            logger.info(
                "lsfproxyd {}: service state taken from {}: {}",
                self.name,
                self.view.service.origin,
                self.view.service.enabled,
            )
        if adopted or after != before:
            self.on_change(dict(self.view.service.enabled) if adopted else None)

    def take(self, results: Iterable[BeatResult]) -> None:
        """Fold the outcomes of one round of heartbeats into the view (on the event loop)."""
        newest: ServiceState | None = None
        for result in results:
            if result.reply is None and result.answered:
                self.view.heard(result.name)
                logger.debug("heartbeat to {}: {} (alive)", result.name, result.error)
                continue
            if result.reply is None:
                self.view.failed(result.name, refused=not result.busy)
                logger.debug("heartbeat to {}: {}", result.name, result.error)
                continue
            # any answer, even an error, means the peer runs and grants its share
            self.view.heard(result.name)
            reply = peer_reply(result.reply)
            if not reply.ok:
                if result.name not in self._warned:
                    self._warned.add(result.name)
                    logger.warning("heartbeat to {} not accepted: {}", result.name, reply.error)
                continue
            if reply.grants is not None:
                self.peer_grants[result.name] = reply.grants
            state = reply.service
            if state is None:
                logger.warning("heartbeat reply of {}: {}", result.name, reply.problem)
                continue
            if newest is None or state.newer_than(newest):
                newest = state
        self._settle(newest)

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat every other daemon at once, then every interval, until ``stop`` is set,
        then once more saying this daemon leaves.

        Each peer has its own beat in flight (one that hangs does not delay the others), and
        liveness is re-checked at least every interval, so a silent peer drops out on time.
        """
        if self.store is not None:
            await self._run_store(stop)
            return
        loop = asyncio.get_running_loop()
        stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        beats: dict[str, asyncio.Future[BeatResult]] = {}
        due: dict[str, float] = {}
        try:
            while not stop.is_set():
                now = loop.time()
                payload = self.payload()
                for name in sorted(self.addresses):
                    if name not in beats and due.get(name, now) <= now:
                        beats[name] = loop.run_in_executor(None, self._beat, name, payload)
                        due[name] = now + self.view.interval
                wake = min(
                    [due[n] for n in self.addresses if n not in beats] + [now + self.view.interval]
                )
                await asyncio.wait(
                    [stopping, *beats.values()],
                    timeout=max(0.0, wake - now),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                results = []
                for name, beat in list(beats.items()):
                    if beat.done():
                        del beats[name]
                        try:
                            results.append(beat.result())
                        except Exception as exc:
                            logger.error(
                                "heartbeat to {} failed: {}: {}", name, type(exc).__name__, exc
                            )
                self.take(results)
        finally:
            stopping.cancel()
        if self.active:
            # stopping: tell the others, so that they take the whole limit at once
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._round(self.payload(leaving=True)), 3)

    async def _run_store(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                self.take(await loop.run_in_executor(self._pool, self._store_round, self.payload()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.view.interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    loop.run_in_executor(self._pool, self._store_round, self.payload(), True), 3
                )
        finally:
            assert self._pool is not None
            self._pool.shutdown(wait=False)
            with contextlib.suppress(Exception):
                self.store.close()

    async def _round(self, payload: Mapping[str, Any]) -> list[BeatResult]:
        """One heartbeat to every other daemon at once (each in a worker thread)."""
        loop = asyncio.get_running_loop()
        beats = [
            loop.run_in_executor(None, self._beat, name, payload) for name in sorted(self.addresses)
        ]
        results = await asyncio.gather(*beats, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                logger.error("heartbeat failed: {}: {}", type(r).__name__, r)
        return [r for r in results if isinstance(r, BeatResult)]
