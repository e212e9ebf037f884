"""gridgate's engine: the hook contract, plugin loading, config, runner, state and director."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: see __getattr__
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

#: The plugin API's version, ``MAJOR.MINOR``: MINOR grows when hooks, fields or names are
#: added, MAJOR when one a plugin may use changes or goes away (docs/api.md says what is kept).
API_VERSION = "1.4"

PROJECT = "gridgate"

__all__ = ["API_VERSION", "PROJECT", "__version__", "hookimpl", "hookspec"]


def __getattr__(name: str) -> Any:
    """``hookimpl`` (decorate a plugin method with it to implement a hook) and ``hookspec``
    (used only by :mod:`gridgate.core.hookspecs`), made on first use: a program that imports
    a light module of gridgate (the gate's run-time path) does not pay for pluggy."""
    if name not in ("hookimpl", "hookspec"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import pluggy

    marker = pluggy.HookimplMarker if name == "hookimpl" else pluggy.HookspecMarker
    value = globals()[name] = marker(PROJECT)
    return value
