"""The director's config file, re-read at every iteration: a file that changed and validates
replaces the config in force; one that does not (or looks cut short) is refused with its reasons,
once, and the last good config stays."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gridgate.core.config import (
    Config,
    ConfigError,
    ConfigProblem,
    load_config,
    read_config_text,
)


def cut_problem(text: str, filename: str) -> ConfigProblem | None:
    """Why ``text`` may be a file cut short, or None.

    A file being written, or copied by a tool that stopped, can end inside a value where
    YAML cannot tell: ``max: 100`` cut to ``max: 1`` is still a valid document. Every editor
    and every whole copy ends the last line with a newline, so a non-empty file without one
    is taken for cut and refused on reload; the running director keeps its last good config.
    """
    if not text.strip() or text.endswith("\n"):
        return None
    last = text.count("\n") + 1
    return ConfigProblem(
        filename,
        last,
        (),
        "the file does not end with a newline: its last line "
        "may be cut short (a file still being written, or a truncated copy); "
        "refused until the file is whole",
    )


@dataclass(frozen=True)
class ReloadOutcome:
    """What :meth:`ConfigSource.reload` found: a new config (``previous`` is the one it
    replaced), no change, or a refusal."""

    changed: bool
    error: ConfigError | None = None
    previous: Config | None = None


class ConfigSource:
    """A config file re-read on demand; the last good config stays in force.

    A file that changed and validates replaces the current config; one that does not is
    refused with the reasons, and :attr:`current` keeps the last good one. The same bad
    content is reported once, not at every reload.
    """

    def __init__(self, path: str | os.PathLike[str], initial: Config | None = None) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._current = initial or load_config(self.path)
        self._refused_digest: str | None = None

    @property
    def current(self) -> Config:
        return self._current

    def reload(self, vet: Callable[[Config], list[ConfigProblem]] | None = None) -> ReloadOutcome:
        """Re-read the file. ``vet`` may refuse a new config that validates (its problems
        become the refusal). An unreadable file, like bad content, is reported once until it
        changes, not at every reload."""
        with self._lock:
            try:
                text = read_config_text(self.path)
            except ConfigError as err:
                return self._refused(f"io:{err}", err)
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            if digest == self._current.digest:
                self._refused_digest = None
                return ReloadOutcome(changed=False)
            cut = cut_problem(text, str(self.path))
            if cut is not None:
                return self._refused(digest, ConfigError([cut]))
            try:
                new = load_config(self.path, text=text)
                problems = vet(new) if vet is not None else []
                if problems:
                    raise ConfigError(problems)
            except ConfigError as exc:
                return self._refused(digest, exc)
            previous, self._current = self._current, new
            self._refused_digest = None
            return ReloadOutcome(changed=True, previous=previous)

    def _refused(self, fingerprint: str, error: ConfigError) -> ReloadOutcome:
        first_time = fingerprint != self._refused_digest
        self._refused_digest = fingerprint
        return ReloadOutcome(changed=False, error=error if first_time else None)
