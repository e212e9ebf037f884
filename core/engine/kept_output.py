"""``director.pilots.keep_output``: the output of one done pilot in N per endpoint, kept by the
director, so that a healthy CE's pilots can still be read after the CE cleaned them up.

The tracker offers every pilot a poll saw become ``done`` (:meth:`OutputKeeper.offer`, from the
poll threads); the first of each N per endpoint is chosen, at most one per endpoint per
iteration. After the polls, :meth:`OutputKeeper.keep` reads its stdout and stderr through
:func:`~gridgate.core.engine.output.read_output` (under a ``query`` grant, capped at
:data:`~gridgate.core.engine.output.DEFAULT_CAP`) and writes them under
``STATE_DIR/pilot-output/BACKEND/ENDPOINT/DIGEST/`` (owner-only), keeping the newest
``keep_output_last`` pilots per endpoint. :func:`~gridgate.core.engine.output.kept_output`
reads a kept stream back for ``gridgate pilots output`` when the CE no longer holds it.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
from loguru import logger

from gridgate.core.engine.output import DEFAULT_CAP, KEPT_META, pilot_folder, read_output
from gridgate.core.engine.records import KeptOutputMeta
from gridgate.core.engine.runtime import Runtime
from gridgate.core.files import atomic_write, ensure_private_dir
from gridgate.core.model import OutputStream
from gridgate.core.state import Pilot

STREAMS: tuple[OutputStream, ...] = ("stdout", "stderr")


class OutputKeeper:
    """Chooses the done pilots whose output is kept, and keeps it (module docstring)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._lock = threading.Lock()
        #: done pilots seen per endpoint key, since this director started
        self._done: dict[str, int] = {}
        #: endpoint key -> the pilot chosen, kept after the polls
        self._chosen: dict[str, Pilot] = {}
        #: keep_output of the iteration under way (set before its polls; 0: none)
        self.every = 0

    def offer(self, changed: Sequence[Pilot]) -> None:
        """Pilots a poll just moved: the first done pilot of each :attr:`every` per endpoint
        is chosen."""
        every = self.every
        if every <= 0:
            return
        with self._lock:
            for pilot in changed:
                if pilot.state != "done":
                    continue
                key = f"{pilot.backend}/{pilot.endpoint}"
                seen = self._done.get(key, 0)
                self._done[key] = seen + 1
                if seen % every == 0 and key not in self._chosen:
                    self._chosen[key] = pilot

    def keep(self, last: int) -> int:
        """Read and write the chosen pilots' output; keep the newest ``last`` per endpoint.
        The number kept. A read that fails is logged and dropped (the next of N is chosen)."""
        with self._lock:
            chosen, self._chosen = list(self._chosen.values()), {}
        state_dir = Path(self.runtime.settings.state_dir)
        kept = 0
        for pilot in chosen:
            outputs = [read_output(self.runtime, pilot, s, cap=DEFAULT_CAP) for s in STREAMS]
            got = [o for o in outputs if o.ok and o.held]
            if not got:
                logger.info(
                    "output of pilot {} on {} not kept: {}",
                    pilot.job_id,
                    pilot.endpoint,
                    "; ".join(o.message for o in outputs if o.message) or "nothing read",
                )
                continue
            folder = pilot_folder(state_dir, pilot)
            try:
                ensure_private_dir(folder)
                meta = KeptOutputMeta(pilot.job_id, time.time())
                for out in got:
                    atomic_write(folder / out.stream, out.text.encode("utf-8"), mode=0o600)
                    meta.where[out.stream], meta.cut[out.stream] = out.where, out.cut
                atomic_write(folder / KEPT_META, msgspec.json.encode(meta), mode=0o600)
            except OSError as exc:
                logger.warning("output of pilot {} not kept: {}", pilot.job_id, exc)
                continue
            kept += 1
            _prune(folder.parent, last)
        return kept


def _prune(endpoint_folder: Path, last: int) -> None:
    """Keep the newest ``last`` pilots' folders of one endpoint."""
    try:
        folders = sorted(
            (p for p in endpoint_folder.iterdir() if p.is_dir() and not p.is_symlink()),
            key=lambda p: p.stat().st_mtime,
        )
    except OSError:
        return
    for old in folders[: max(0, len(folders) - last)]:
        shutil.rmtree(old, ignore_errors=True)
