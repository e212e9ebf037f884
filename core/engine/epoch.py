"""Noticing a state store that came back empty.

A Redis without persistence restarted, a sqlite file replaced: the store answers again, but the
pilots it knew are gone, and a director that went on would fill ``max_waiting`` beside pilots it no
longer counts. So the store keeps an identity, an **epoch** (a random value under
:data:`EPOCH_KEY`, written once by the first director that finds none), and each director keeps
the epoch it last saw in ``<state_dir>/store-epoch.json``. At every iteration's start the two are
compared: a store with no epoch, or another one, while this director knew one, lost its data (or
is another store). Then the director

- writes back what its local view of the store still holds (failing cache, episodes: no mail
  twice),
- searches every configured endpoint for its fleet's pilots by name
  (:meth:`~gridgate.core.engine.intents.Intents.search_fleet`) and adopts them, **before** it
  submits there again: an endpoint not searched yet (its CE cannot be asked now) gets no
  pilot, and is searched again at the next iteration (the list survives a restart),
- tells people once (of every director on the store).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec
from loguru import logger

from gridgate.core.engine.intents import Intents
from gridgate.core.engine.records import EpochFile, read_record
from gridgate.core.engine.runtime import Runtime
from gridgate.core.files import atomic_write
from gridgate.core.model import Endpoint, Notification
from gridgate.core.state import PilotRegistry, StateError
from gridgate.core.stores.memory import MemoryState

#: The store's identity. Keys under ``store/`` are never written back from a local view.
EPOCH_KEY = "store/epoch"
#: Of every director on the store, the first to claim this for an epoch tells people.
TOLD_KEY = "store/emptied-told/"
#: The file under ``director.state_dir``.
EPOCH_FILE = "store-epoch.json"


class StoreEpoch:
    """One director's watch on its store's identity.

    :param runtime: the director's runtime.
    :param intents: where the fleet's pilots are searched for.
    """

    def __init__(self, runtime: Runtime, intents: Intents) -> None:
        self.runtime = runtime
        self.intents = intents
        #: endpoint keys still to be searched for the fleet's pilots
        self.unsearched: set[str] = set()
        self._loaded = False
        #: the epoch last seen, kept in this process alone for a store that lives in it (the
        #: memory driver: empty at every start by design, not a store that lost its data)
        self._own: EpochFile | None = None

    @property
    def path(self) -> Path:
        return Path(self.runtime.settings.state_dir) / EPOCH_FILE

    def _in_process(self) -> bool:
        """Whether the director opened its store from a config saying ``driver: memory``: a
        store that lives and dies with this process. (A store handed to the director by its
        caller lives as long as the caller keeps it: its epoch is kept in the file.)"""
        state = self.runtime.state
        opened = getattr(getattr(state, "primary", state), "opened", None)  # opened from config
        return callable(opened) and isinstance(opened(), MemoryState)

    def _read(self) -> EpochFile | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.error(
                "{} unreadable: {} (a store that lost its data may go unseen)", self.path, exc
            )
            return None
        return read_record(raw, EpochFile, str(self.path))

    def _save(self, epoch: str) -> None:
        record = EpochFile(epoch=epoch, unsearched=sorted(self.unsearched))
        if self._in_process():
            self._own = record
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write(self.path, msgspec.json.encode(record), durable=True)
        except OSError as exc:
            logger.error("cannot keep the store's epoch in {}: {}", self.path, exc)

    def check(self, endpoints: list[Endpoint]) -> str | None:
        """Compare the store's epoch with the one last seen; the new epoch when the store lost
        its data (or is another), None otherwise. ``endpoints``: every configured one (those to
        search when it did).

        :raises StateError: the store could not be read (nothing is concluded)."""
        state = self.runtime.state
        primary = getattr(state, "primary", state)  # not the local view: it remembers the key
        known = self._own if self._in_process() else self._read()
        if not self._loaded:
            self._loaded = True
            if known is not None:
                self.unsearched = set(known.unsearched)
        current = primary.get(EPOCH_KEY)
        if current is None:
            fresh = uuid.uuid4().hex
            primary.add_if_absent(EPOCH_KEY, fresh)
            current = primary.get(EPOCH_KEY) or fresh
        if known is None:  # a new director: what the store holds is what it knows
            self._save(current)
            return None
        if known.epoch == current:
            return None
        self.unsearched = {e.key for e in endpoints}
        self._save(current)
        write_back = getattr(state, "write_back_local", None)
        if callable(write_back):
            try:
                write_back()
            except StateError as exc:
                logger.error("the local view could not be written back to the store: {}", exc)
        message = (
            f"The state store came back empty, or is another store (its epoch was "
            f"{known.epoch[:8]}, it is {current[:8]} now): the pilots it tracked are searched "
            f"for on {len(self.unsearched)} endpoint(s) by name and adopted before anything is "
            f"submitted there again. Check that the store keeps its data (docs/state.md, "
            f"'A Redis that keeps its data')."
        )
        logger.error(message)
        try:
            first = primary.add_if_absent(TOLD_KEY + current, "1", ttl=7 * 86400)
        except StateError:
            first = True
        if first:
            self.runtime.notify(
                Notification(
                    level="error",
                    subject="gridgate: the state store came back empty",
                    body=message,
                    created=self.runtime.clock.time(),
                    key=f"store-emptied/{current}",
                    logged=True,
                )
            )
        return current

    def search(self, registry: PilotRegistry, endpoints: list[Endpoint]) -> set[str]:
        """Search each endpoint still unsearched; the keys of those still not searched (no
        pilot goes there this iteration)."""
        if not self.unsearched:
            return set()
        for endpoint in endpoints:
            if endpoint.key not in self.unsearched:
                continue
            answered = self.intents.search_fleet(registry, endpoint)
            if answered is False:
                logger.error(
                    "{}: cannot search the CE for this fleet's pilots now; it gets no pilot "
                    "until it can be",
                    endpoint.key,
                )
                continue
            if answered is None:
                logger.warning(
                    "{}: its backend cannot look pilots up by name: pilots the lost store "
                    "tracked there are not known",
                    endpoint.key,
                )
            self.unsearched.discard(endpoint.key)
        configured = {e.key for e in endpoints}
        self.unsearched &= configured  # an endpoint no longer configured gets nothing anyway
        try:
            epoch = self.runtime.state.get(EPOCH_KEY)
        except StateError:
            epoch = None
        if epoch is not None:
            self._save(epoch)
        return set(self.unsearched)
