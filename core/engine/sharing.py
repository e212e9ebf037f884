"""Demand shared among the live directors of one store (``director.demand_lock: true``).

Directors on one shared store know each other by a heartbeat (``directors/<instance>``, kept
``lease_seconds``) and split the demand groups among the live ones: every director computes
the same assignment from the same two lists (the live directors, the groups any of them has
demand for), by rendezvous hashing bounded to a fair share: each group goes to the director
that ranks it highest (a hash of group and director) among those below ``ceil(groups /
directors)``. A director fills a group only while it holds the group's lease
(``demand-lock/<backend>/<group>``, taken with the store's atomic add and renewed with its
atomic compare-and-renew): the assignment says who should, the lease makes sure no two do.

A timer thread renews the heartbeat and the leases every third of ``lease_seconds``,
independent of how long an iteration lasts, and stops renewing when the director makes no
progress (no iteration started nor submission finished for a cycle and two command
deadlines): a director that dies or hangs loses its groups within one lease period, and the
others take them at their next iteration (within two lease periods of the last renewal). A
clean stop hands every lease back at once. A director submits to a group only while its lease
is held by the director's own reckoning too (the time of the last renewal that the store
confirmed, plus ``lease_seconds``), so a lease that lapsed mid-iteration stops the tail.

While the store cannot be reached nobody can tell who holds what: each director keeps filling
the groups it held when the store last answered and no other (issue 31), until it is back.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from loguru import logger

from gridgate.core.engine.limits import cores_of
from gridgate.core.engine.runtime import Runtime, Sending
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.state import RoomClaim, StateError

if TYPE_CHECKING:
    from gridgate.core.engine.tracking import PilotTracker

__all__ = ["DemandShare", "StoreRoom", "assign"]

#: A live director's heartbeat: ``directors/<instance>`` -> its host, pid and start.
DIRECTORS = "directors/"
#: A director that can fill a demand group now: ``demand-groups/<backend>/<group>/<instance>``.
GROUPS = "demand-groups/"
#: A group's lease: ``demand-lock/<backend>/<group>`` -> the holder's instance.
LEASE = "demand-lock/"

Group = tuple[str, str]


def _score(group: str, director: str) -> bytes:
    return hashlib.sha256(f"{group}\0{director}".encode()).digest()


def assign(candidates: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Group -> director, among each group's candidates (the live directors that can fill
    it): rendezvous hashing bounded to a fair share, each director getting at most
    ``ceil(groups / directors)`` unless a group has no other candidate. The same inputs give
    the same answer in every process; a director joining or leaving moves few groups."""
    everyone = sorted({d for names in candidates.values() for d in names})
    if not everyone:
        return {}
    cap = math.ceil(len(candidates) / len(everyone))
    load = dict.fromkeys(everyone, 0)
    out: dict[str, str] = {}
    for group in sorted(candidates):
        ranked = sorted(set(candidates[group]), key=lambda d: _score(group, d), reverse=True)
        if not ranked:
            continue
        chosen = next((d for d in ranked if load[d] < cap), ranked[0])
        out[group] = chosen
        load[chosen] += 1
    return out


def _name(group: Group) -> str:
    return f"{group[0]}/{group[1]}"


class DemandShare:
    """This director's share of the demand groups (see the module)."""

    def __init__(self, runtime: Runtime, instance: str) -> None:
        self.runtime = runtime
        self.instance = instance
        self._lock = threading.Lock()
        #: group -> monotonic time until which its lease is surely ours
        self._held: dict[Group, float] = {}
        #: the groups held when the store last answered (kept through an outage)
        self._kept: set[Group] = set()
        self._down = False
        self._progress = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.time()
        #: the groups this director last said it can fill
        self._published: set[Group] = set()

    # --- settings --------------------------------------------------------------------------

    @property
    def lease_seconds(self) -> float:
        settings = self.runtime.settings
        return float(settings.lease_seconds or settings.cycle_seconds)

    @property
    def hang_after(self) -> float:
        """Seconds without progress after which this director stops renewing."""
        settings = self.runtime.settings
        return settings.cycle_seconds + 2 * settings.command_timeout + self.lease_seconds

    # --- the timer ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the renewal timer (once)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._renew_loop, name="demand-leases", daemon=True
            )
            self._thread.start()

    def progress(self) -> None:
        """The director did something (an iteration started, a submission ended)."""
        self._progress = time.monotonic()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            if time.monotonic() - self._progress > self.hang_after:
                continue  # hung: let the leases lapse, the others take the groups
            try:
                self.renew()
            except Exception as exc:  # the timer must outlive any surprise
                logger.opt(exception=exc).error("demand leases not renewed: {}", exc)

    def renew(self) -> None:
        """Renew the heartbeat and every lease held (what the timer does)."""
        state, ttl = self.runtime.state, self.lease_seconds
        started = time.monotonic()
        try:
            self._heartbeat()
            if self._stop.is_set():
                # stop() ran while this call hung (it waits for the timer a few seconds only)
                # and removed the heartbeat before this one landed: take it back, or the
                # others count a stopped director as live for a lease period
                state.delete(DIRECTORS + self.instance)
                return
            with self._lock:
                held = list(self._held)
            for group in held:
                if state.renew(LEASE + _name(group), self.instance, ttl):
                    with self._lock:
                        if group in self._held:
                            self._held[group] = started + ttl
                else:
                    with self._lock:
                        self._held.pop(group, None)
                        self._kept.discard(group)
                    logger.warning(
                        "demand group {}: its lease lapsed and is held elsewhere now",
                        _name(group),
                    )
        except StateError as exc:
            logger.debug("demand leases not renewed, state store failed: {}", exc)

    def _heartbeat(self) -> None:
        record = json.dumps(
            {"host": socket.gethostname(), "pid": os.getpid(), "since": self._started}
        )
        self.runtime.state.set(DIRECTORS + self.instance, record, ttl=self.lease_seconds)

    # --- an iteration ------------------------------------------------------------------------

    def plan(self, groups: Iterable[Group]) -> set[Group]:
        """At an iteration's plan: say which of ``groups`` (those with demand here) this
        director fills now. Publishes them, reads the live directors and every group, hands
        back the leases now assigned to another director, takes those assigned to it."""
        self.progress()
        self.start()
        wanted = set(groups)
        state, ttl = self.runtime.state, self.lease_seconds
        kept_for = 2 * max(ttl, self.runtime.settings.cycle_seconds)  # to the next plan
        started = time.monotonic()
        try:
            if getattr(state, "degraded", False):
                raise StateError("the state store is unavailable")
            self._heartbeat()
            for group in self._published - wanted:  # no longer a candidate for these
                state.delete(f"{GROUPS}{_name(group)}/{self.instance}")
            for group in wanted:
                state.set(f"{GROUPS}{_name(group)}/{self.instance}", "1", ttl=kept_for)
            self._published = wanted
            live = {key.removeprefix(DIRECTORS) for key, _ in state.items(DIRECTORS)}
            live.add(self.instance)
            candidates: dict[str, set[str]] = {}
            for key, _ in state.items(GROUPS):
                name, _, director = key.removeprefix(GROUPS).rpartition("/")
                if director in live:
                    candidates.setdefault(name, set()).add(director)
            mine = {g for g, d in assign(candidates).items() if d == self.instance}
            with self._lock:
                held = set(self._held)
            for group in {g for g in held if _name(g) not in mine}:
                state.delete_if(LEASE + _name(group), self.instance)  # handed over
                with self._lock:
                    self._held.pop(group, None)
            taken: dict[Group, float] = {}
            for group in wanted:
                if _name(group) not in mine:
                    continue
                key = LEASE + _name(group)
                if state.add_if_absent(key, self.instance, ttl=ttl) or state.renew(
                    key, self.instance, ttl
                ):
                    taken[group] = started + ttl
            if getattr(state, "degraded", False):
                # it failed during this plan, and what it answered since came from the local
                # view, which grants any lease it has not seen held: none of them is ours
                raise StateError("the state store failed while the leases were taken")
            with self._lock:
                for group in wanted:  # assigned here but held elsewhere (it lapsed): not ours
                    if _name(group) in mine and group not in taken:
                        self._held.pop(group, None)
                self._held.update(taken)
                self._kept = set(self._held)
                if self._down:
                    logger.info("demand leases: the state store answers again")
                self._down = False
                return wanted & set(self._held)
        except StateError as exc:
            with self._lock:
                if not self._down:
                    logger.error(
                        "demand leases unavailable ({}): this director fills only the groups "
                        "it held ({}) until the store answers",
                        exc,
                        ", ".join(sorted(_name(g) for g in self._kept)) or "none",
                    )
                self._down = True
                return wanted & self._kept

    def holds(self, group: Group) -> bool:
        """Whether this director may submit to ``group`` now: its lease is held and has not
        lapsed by this director's own clock (or the store is down and it held it then)."""
        self.progress()
        with self._lock:
            if self._down:
                return group in self._kept
            until = self._held.get(group)
        return until is not None and time.monotonic() < until

    def stop(self) -> None:
        """Stop the timer and hand every lease back (a clean stop: the others take the
        groups at their next iteration)."""
        self._stop.set()
        if self._thread is None:
            return  # never shared anything (demand_lock off): nothing to hand back
        self._thread.join(timeout=5)
        with self._lock:
            held, self._held, self._kept = list(self._held), {}, set()
        state = self.runtime.state
        try:
            for group in held:
                state.delete_if(LEASE + _name(group), self.instance)
            for group in self._published:
                state.delete(f"{GROUPS}{_name(group)}/{self.instance}")
            state.delete(DIRECTORS + self.instance)
        except StateError as exc:
            logger.warning("demand leases not handed back (they lapse by themselves): {}", exc)


class StoreRoom:
    """The limits' room taken in the store's registry (issue 43): each submission reserves
    what :class:`~gridgate.core.engine.limits.PilotRoom` gave it, in one atomic step of the
    store that counts every director's waiting pilots and live reservations, and settles it
    once its pilots are in the registry. A director that dies holding room leaves it to lapse
    after two command deadlines. While the store is down the local room alone decides (the
    pilot tracker keeps the limits closed on the last counts it read)."""

    def __init__(self, runtime: Runtime, tracker: PilotTracker, instance: str) -> None:
        self.runtime = runtime
        self.tracker = tracker
        self.instance = instance
        self._lock = threading.Lock()
        #: submission name -> the reservation its pilots settle when they are registered
        self._by_name: dict[str, str] = {}
        tracker._reservation_of = self._taken

    def named(self, sending: Sending) -> None:
        """``sending``'s request has its name now: the tracker registers its pilots and
        settles its room in one step (:meth:`PilotRegistry.put_reserved`)."""
        if sending.reservation and sending.request.name:
            with self._lock:
                self._by_name[sending.request.name] = sending.reservation
            sending.reservation_named = True

    def _taken(self, name: str) -> str:
        with self._lock:
            return self._by_name.pop(name, "")

    def reserve(
        self, sending: Sending, endpoint: Endpoint, request: SubmitRequest
    ) -> SubmitRequest | None:
        """``request`` as the store has room for it on ``endpoint`` (maybe fewer pilots), or
        None when it has none; the reservation's holder is kept in ``sending``."""
        limits = sending.it.limits
        if limits is None or not limits.limited(endpoint):
            return request
        registry = self.tracker.registry()
        if registry is None:
            return request
        pilots = self.tracker.settings
        cores = cores_of(request)
        now = self.runtime.clock.time()
        claim = RoomClaim(
            holder=f"{self.instance}/{uuid.uuid4().hex[:12]}",
            backend=endpoint.backend,
            endpoint=endpoint.name,
            count=request.count,
            expires=now + 2 * self.runtime.timeout(sending.info) + 60,
            cores=cores,
            max_waiting=pilots.for_endpoint(endpoint, "max_waiting"),
            max_waiting_cores=pilots.for_endpoint(endpoint, "max_waiting_cores"),
            # pilots of endpoints no longer configured leave the limits: the store counts
            # every pilot of the backend, so max_total stays with the local room then
            max_total=None
            if endpoint.backend in limits.retired_backends
            else pilots.for_backend(endpoint.backend, "max_total"),
        )
        try:
            granted = registry.reserve(claim, now)
        except StateError as exc:
            logger.debug("room on {} not reserved in the store: {}", endpoint.key, exc)
            return request
        if granted < request.count:
            limits.give_back(endpoint, request.count - granted, cores, full=granted == 0)
        if granted <= 0:
            return None
        self.settle(sending)  # one reservation an attempt
        sending.reservation = claim.holder
        return request if granted == request.count else replace(request, count=granted)

    def settle(self, sending: Sending) -> None:
        """Drop the room ``sending`` holds in the store (its pilots are registered now)."""
        holder, sending.reservation = sending.reservation, ""
        was_named, sending.reservation_named = sending.reservation_named, False
        if not holder:
            return
        if was_named:
            with self._lock:
                left = self._by_name.pop(sending.request.name, None)
            if left is None:
                return  # the tracker registered its pilots and settled it in one step
        registry = self.tracker.registry()
        try:
            if registry is not None:
                registry.settle(holder)
        except StateError as exc:  # it lapses by itself
            logger.debug("reservation {} not settled: {}", holder, exc)
