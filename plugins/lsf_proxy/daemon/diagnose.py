"""Arguments of the ``diagnose`` admin command, as ``badmin diagnose`` takes them: on or off, a
duration after which diagnosis turns itself off, and the log file's name."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gridgate.plugins.lsf_proxy.protocol import ProtocolError


def diagnose_args(message: Mapping[str, Any], folder: Path) -> tuple[bool, float | None, Path | None]:
    """``(on, minutes, file)`` of a ``diagnose`` request.

    ``minutes`` (> 0) ends the diagnosis by itself; ``file`` is a bare name (put in ``folder``,
    where the default log lives) or an absolute path.

    :raises ProtocolError: ``bad_request`` naming the field.
    """
    on = message.get("on")
    if not isinstance(on, bool):
        raise ProtocolError("bad_request", "diagnose needs \"on\": true or false")
    minutes = message.get("minutes")
    if minutes is not None and (isinstance(minutes, bool) or not isinstance(minutes, int | float)
                                or not 0 < minutes <= 525600):
        raise ProtocolError("bad_request", "minutes must be a number of minutes above 0 "
                                           "(at most a year)")
    name = message.get("file")
    path = None
    if name is not None:
        if not isinstance(name, str) or not name or "\0" in name or len(name) > 4096:
            raise ProtocolError("bad_request", "file must be a file name or an absolute path")
        given = Path(name)
        if given.is_absolute():
            path = given
        elif len(given.parts) == 1 and name not in (".", ".."):
            path = folder / name
        else:
            raise ProtocolError("bad_request", f"file {name!r}: give a bare name (written next "
                                               f"to the default log, in {folder}) or an "
                                               "absolute path")
    if not on and (minutes is not None or path is not None):
        raise ProtocolError("bad_request", "minutes and file go with diagnose on")
    return on, (float(minutes) if minutes is not None else None), path


def earliest(*times: float | None) -> float | None:
    """The earliest of the given monotonic times (None: none)."""
    given = [t for t in times if t is not None]
    return min(given) if given else None
