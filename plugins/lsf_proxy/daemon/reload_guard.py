"""What the daemon checks before a re-read ``proxyd.yaml`` replaces its policy, and the count of
accepted and refused reloads.

logrotate's reload sends SIGHUP at any time, also while an editor or a deployment tool is
halfway through writing the file. An empty file, one without its ``proxyd:`` section, or one
cut short so that settings in force silently fall back to their defaults, or one whose last
line has no newline (cut inside a value: ``token_wait_time: 40`` read as ``4``) is refused: the
last good policy stays. A setting is taken back to its default only by writing the default, or at
a restart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from gridgate.core.config import ConfigError, ConfigProblem, load_config
from gridgate.plugins.lsf_proxy.config import section_defaults


def _refused(
    path: Path, message: str, line: int = 0, where: tuple[str | int, ...] = ()
) -> ConfigError:
    return ConfigError([ConfigProblem(str(path), line, where, message)])


def checked_section(path: Path, current: Mapping[str, Any]) -> dict[str, Any]:
    """The filled ``proxyd:`` section of ``path`` if it may replace ``current``.

    :raises ConfigError: unreadable, empty, no ``proxyd:`` section, invalid, or settings in
        force (not at their default) that the file no longer states.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            [ConfigProblem(str(path), 0, (), f"cannot read: {exc}")], kind="io"
        ) from None
    if not text.strip():
        raise _refused(
            path,
            f"empty file ({os.path.getsize(path)} bytes): refused, a config "
            "being written or truncated",
        )
    if not text.endswith("\n"):
        # a file cut inside a value can still be valid YAML ("max: 100" cut to "max: 1"), and
        # every editor and deploy tool ends its last line: the cut cannot be told otherwise
        raise _refused(
            path,
            "the last line has no newline: refused, the file may be cut short "
            "inside a value (end the file with a newline)",
            line=text.count("\n") + 1,
        )
    config = load_config(path, text)
    # the keys the file states itself (load_config fills defaults): those it has a line for
    stated = {p[1] for p in config.lines if len(p) >= 2 and p[0] == "proxyd"}
    defaults = section_defaults()
    in_force = {k for k, v in current.items() if k in defaults and v != defaults[k]}
    if ("proxyd",) not in config.lines and in_force:
        raise _refused(
            path,
            "no proxyd: section (the file is cut short or is not this "
            f"daemon's): refused; in force: {', '.join(sorted(in_force))}",
        )
    dropped = sorted(k for k in in_force if k not in stated)
    if dropped:
        raise _refused(
            path,
            f"{', '.join(dropped)} no longer given (the file may be cut "
            "short): refused rather than falling back to the default; write "
            "the default value to mean it",
            where=("proxyd",),
        )
    return dict(config.get("proxyd") or defaults)


class ReloadLog:
    """Accepted and refused reloads: in ``status`` (``reloads``) and, with metrics on, as
    ``gridgate_proxyd_reloads_total{result}``."""

    def __init__(self) -> None:
        self.accepted = 0
        self.refused = 0
        self.last_refusal = ""
        self._counter: Any = None

    def attach(self, registry: Any) -> None:
        import prometheus_client as prom

        self._counter = prom.Counter(
            "gridgate_proxyd_reloads",
            "Config re-reads (SIGHUP, reconfig) by result",
            ["result"],
            registry=registry,
        )
        for result in ("accepted", "refused"):
            self._counter.labels(result)

    def ok(self) -> None:
        self.accepted += 1
        if self._counter is not None:
            self._counter.labels("accepted").inc()

    def refuse(self, exc: Exception) -> None:
        self.refused += 1
        self.last_refusal = str(exc)
        if self._counter is not None:
            self._counter.labels("refused").inc()
        logger.error(
            "config refused ({} so far), the last good policy stays: {}", self.refused, exc
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "refused": self.refused,
            "last_refusal": self.last_refusal,
        }
