"""What the pilot tracker keeps while the state store cannot: the counts it last read from the
registry and the pilots the store did not take, held in memory and in a file under
``director.state_dir``, so that a director restarted while the store is still down keeps the
limits closed (fail closed), and writes those pilots back when the store returns."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from loguru import logger

from gridgate.core.documents import DocumentError, decode_json
from gridgate.core.engine.records import PendingFile
from gridgate.core.files import atomic_write
from gridgate.core.state import Counts, Pilot, PilotRegistry, StateError
from gridgate.core.stores.records import pilot_from_dict, readable

#: The file under ``director.state_dir``.
PENDING_FILE = "pilots-pending.json"


class PendingPilots:
    """The last known counts (and waiting cores per endpoint key) and the unrecorded pilots.

    ``folder`` gives the state folder of the config in force (None: nothing is kept on disk).
    Safe for the submission threads."""

    def __init__(self, folder: Callable[[], str | None]) -> None:
        self._folder = folder
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        #: the registry's counts at the last iteration that could read them
        self._known: Counts = {}
        #: the cores of the waiting pilots per endpoint key, read and kept as the counts are
        self._known_cores: dict[str, int] = {}
        #: pilots submitted since that the store could not take
        self._unrecorded: list[Pilot] = []
        self._loaded = False
        self._saved: str | None = None
        self._failed = False

    @property
    def path(self) -> Path | None:
        folder = self._folder()
        return Path(folder) / PENDING_FILE if folder else None

    @property
    def unrecorded(self) -> int:
        """How many pilots wait to be written back."""
        with self._lock:
            return len(self._unrecorded)

    # --- what the tracker tells it ---------------------------------------------------------

    def read(self, counts: Counts, cores: dict[str, int] | None) -> None:
        """The registry answered: these are the counts now (and the waiting cores, when a
        limit counts them)."""
        with self._lock:
            self._known = dict(counts)
            if cores is not None:
                self._known_cores = dict(cores)

    def recorded(self, pilots: Sequence[Pilot]) -> None:
        """``pilots`` were written to the registry: they wait, until the next read says more."""
        with self._lock:
            for pilot in pilots:
                where = (pilot.backend, pilot.endpoint, "waiting")
                self._known[where] = self._known.get(where, 0) + 1
                key = pilot.endpoint_key
                self._known_cores[key] = self._known_cores.get(key, 0) + pilot.cores

    def unrecorded_pilots(self, pilots: Sequence[Pilot]) -> None:
        """``pilots`` were submitted and the store did not take them."""
        with self._lock:
            self._unrecorded.extend(pilots)

    # --- what the limits read while the store is down ----------------------------------------

    def counts(self) -> Counts:
        """The last counts read from the registry plus the pilots it could not take (as
        ``waiting``)."""
        with self._lock:
            counts = dict(self._known)
            for pilot in self._unrecorded:
                where = (pilot.backend, pilot.endpoint, pilot.state)
                counts[where] = counts.get(where, 0) + 1
        return counts

    def cores(self) -> dict[str, int]:
        """The last known waiting cores plus those of the unrecorded pilots."""
        with self._lock:
            cores = dict(self._known_cores)
            for pilot in self._unrecorded:
                if pilot.state == "waiting":
                    cores[pilot.endpoint_key] = cores.get(pilot.endpoint_key, 0) + pilot.cores
        return cores

    # --- the store back --------------------------------------------------------------------------

    def write_back(self, registry: PilotRegistry) -> None:
        """Write into the registry the pilots submitted while it could not take them.

        :raises StateError: the registry refused them again (they are kept)."""
        with self._lock:
            pending, self._unrecorded = self._unrecorded, []
        if not pending:
            return
        try:
            registry.put(pending)
        except StateError:
            with self._lock:
                self._unrecorded[:0] = pending
            raise
        logger.warning(
            "{} pilot(s) submitted while the state store was down written back to it", len(pending)
        )

    # --- the file ------------------------------------------------------------------------------

    def load(self) -> None:
        """Once per process: what a previous director on this state folder left in
        :data:`PENDING_FILE` (its last counts, the pilots its store did not take)."""
        if self._loaded:
            return
        self._loaded = True
        path = self.path
        if path is None:
            return
        try:
            data: PendingFile = decode_json(path.read_bytes(), PendingFile, kind=str(path))
        except FileNotFoundError:
            return
        except (OSError, DocumentError) as exc:
            logger.error("{} unreadable, the pilots it kept are not known: {}", path, exc)
            return
        known = {(b, e, st): n for b, e, st, n in data.known}
        known_cores = dict(data.known_cores)
        pilots = readable(data.unrecorded, pilot_from_dict, str(path))
        with self._lock:
            if not self._known:
                self._known = known
                self._known_cores = known_cores
            self._unrecorded[:0] = pilots
        if pilots:
            logger.warning(
                "{} pilot(s) submitted while the state store was down found in {}; "
                "they are written back when it answers",
                len(pilots),
                path,
            )

    def save(self) -> None:
        """Keep the last known counts and the unrecorded pilots in :data:`PENDING_FILE`
        (written only when they changed; a write that fails is said once)."""
        path = self.path
        if path is None:
            return
        with self._save_lock:
            with self._lock:
                text = json.dumps(
                    {
                        "known": sorted([*k, n] for k, n in self._known.items()),
                        "known_cores": self._known_cores,
                        "unrecorded": [p.as_dict() for p in self._unrecorded],
                    },
                    sort_keys=True,
                )
                durable = bool(self._unrecorded)
            if text == self._saved:
                return
            try:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                atomic_write(path, text.encode("utf-8"), durable=durable)
            except OSError as exc:
                if not self._failed:
                    logger.error(
                        "cannot keep the pilot counts in {}: {} (a director restarted "
                        "while the state store is down would not know them)",
                        path,
                        exc,
                    )
                self._failed = True
                return
            self._saved, self._failed = text, False
