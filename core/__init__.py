"""gridgate's core: the plugin API at the top level, the engine and its parts in sub-packages.

A module directly in ``gridgate.core`` is public: its ``__all__`` is its part of docs/api.md. A
sub-package (``engine``, ``builtin``, ``stores``, ``commands``, ``devkit``) is internal and may
change in any release (CONTRIBUTING.md, "Where things go"). The old paths of moved modules and
names keep importing until 2.0, with a DeprecationWarning (``gridgate.core._moved``).
"""

from __future__ import annotations

# the tables of what moved where; importing the module lets the old module paths import
from gridgate.core._moved import MOVED_MODULES as MOVED_MODULES
from gridgate.core._moved import MOVED_NAMES as MOVED_NAMES

TYPE_CHECKING = False  # typing is not imported at run time: see __getattr__
if TYPE_CHECKING:
    from typing import Any

    import pluggy

    #: Decorate a plugin method with this to implement a hook (``@hookimpl``,
    #: ``@hookimpl(trylast=True)``); typed as pluggy's marker, so the method keeps its type.
    hookimpl: pluggy.HookimplMarker
    hookspec: pluggy.HookspecMarker

__version__ = "0.1.0"

#: The plugin API's version, ``MAJOR.MINOR``: MINOR grows when hooks, fields or names are
#: added, MAJOR when one a plugin may use changes or goes away (docs/api.md says what is kept).
API_VERSION = "1.13"

PROJECT = "gridgate"

__all__ = ["API_VERSION", "hookimpl"]


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
