"""The settings of a built-in plugin whose section has no keys (``all``, ``caches``,
``round_robin``): an empty object, and nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gridgate.core.settings import Settings

#: The schema of a section with no keys.
NO_KEYS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}


@dataclass(frozen=True)
class NoKeys(Settings):
    """A section with no keys: nothing to read."""

    section_schema: ClassVar[dict[str, Any]] = NO_KEYS_SCHEMA
