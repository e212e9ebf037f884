"""Small files of names with the time each was first noted, in a CE's folder under the state
folder: the pilots to clean off the CE (``clean-pending.json``). (An ``unconfirmed.json`` an
older version kept, of pilots whose creation answer was lost, is no longer read: core's
intents look for those by name.) A file that cannot be read counts as
empty (and is said in the log); one that cannot be written is said in the log, never raised."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from loguru import logger

from gridgate.core.documents import DocumentError
from gridgate.core.files import atomic_write, ensure_private_dir
from gridgate.plugins.arc.documents import stamps

__all__ = ["add_stamps", "read_stamps", "write_stamps"]


def read_stamps(path: Path, valid: re.Pattern[str] | None = None) -> dict[str, float]:
    """Name -> when it was first noted (the names ``valid`` matches, when given)."""
    try:
        return stamps(path.read_bytes(), valid)
    except FileNotFoundError:
        return {}
    except (OSError, DocumentError) as exc:
        logger.error("unreadable {}: {}", path, exc)
        return {}


def write_stamps(path: Path, stamps: Mapping[str, float], what: str) -> None:
    """Write ``stamps`` (none: remove the file); ``what`` names them in a failure's log line."""
    try:
        if stamps:
            ensure_private_dir(path.parent)
            atomic_write(path, json.dumps(dict(sorted(stamps.items()))).encode(), durable=False)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        logger.error("cannot record {} in {}: {}", what, path, exc)


def add_stamps(path: Path, names: Iterable[str], now: float, what: str) -> None:
    """Note ``names`` at ``now`` (a name noted before keeps its first time); the caller holds
    the lock of the file's CE."""
    stamps = read_stamps(path)
    for name in names:
        stamps.setdefault(name, now)
    write_stamps(path, stamps, what)
