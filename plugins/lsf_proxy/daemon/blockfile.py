"""The persisted blocklist (``persist_blocklist``): a daemon's block rules kept in a JSON file,
read when it starts and written at each change and when it stops.

The file lives next to the socket (``blocklist.<name>.json``) or at ``blocklist_file``, in a
folder only its owner (this user or root) can write, created 0600.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gridgate.core.files import atomic_write
from gridgate.plugins.lsf_proxy.daemon.diagnose import private_folder
from gridgate.plugins.lsf_proxy.daemon.documents import persisted_blocklist
from gridgate.plugins.lsf_proxy.daemon.policy import Blocklist
from gridgate.plugins.lsf_proxy.daemon.startup import StartupError


@dataclass(frozen=True)
class BlocklistFile:
    """Where the rules are kept; ``persist`` false keeps them nowhere (the seed's way).

    ``complain`` logs a failed write, at most once a minute.
    """

    path: Path
    persist: bool
    complain: Callable[..., None]

    def load(self) -> Blocklist:
        """The rules kept (none when not persisted, or nothing written yet).

        :raises StartupError: the file is there but cannot be read.
        """
        if not self.persist:
            return Blocklist()
        try:
            os.close(private_folder(self.path.parent))
            kept = persisted_blocklist(self.path.read_bytes())
            return Blocklist(kept, kept)
        except FileNotFoundError:
            return Blocklist()
        except (OSError, ValueError) as exc:  # DocumentError: not a blocklist
            raise StartupError(f"cannot read the persisted blocklist {self.path}: {exc}") from None

    def save(self, blocklist: Blocklist) -> None:
        if not self.persist:
            return
        held = blocklist.holders()
        rules = [{**r.to_json(), **({"by": held[r]} if r in held else {})} for r in blocklist.rules]
        try:
            # the write goes through a predictable temporary name: only in a private folder
            os.close(private_folder(self.path.parent))
            atomic_write(self.path, json.dumps({"rules": rules}).encode("utf-8"))
        except OSError as exc:
            # the rules hold in memory; what is lost is their surviving a restart
            self.complain("lsfproxyd: blocklist not saved to {}: {}", self.path, exc)
