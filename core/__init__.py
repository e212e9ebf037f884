"""gridgate's engine: the hook contract, plugin loading, config, runner, state and director."""

from __future__ import annotations

import pluggy

__version__ = "0.1.0"

#: The plugin API's version, ``MAJOR.MINOR``: MINOR grows when hooks, fields or names are
#: added, MAJOR when one a plugin may use changes or goes away (docs/api.md says what is kept).
API_VERSION = "1.0"

PROJECT = "gridgate"

#: Decorate a plugin method with this to implement a hook (``@hookimpl``).
hookimpl = pluggy.HookimplMarker(PROJECT)
#: Used only by :mod:`gridgate.core.hookspecs`.
hookspec = pluggy.HookspecMarker(PROJECT)

__all__ = ["API_VERSION", "PROJECT", "__version__", "hookimpl", "hookspec"]
