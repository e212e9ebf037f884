"""What the built-in default plugins give a backend: the ``local_io`` failure of a command that
could not be prepared on this machine.

The defaults themselves (selectors, the rule classifier, the log and file notifiers, admit-all)
are plugins in :mod:`gridgate.core.builtin`, found through their entry points like any other.
"""

from __future__ import annotations

from gridgate.core._moved import moved_names
from gridgate.core.kinds import KINDS
from gridgate.core.model import Failure

__all__ = ["local_io_failure"]


def local_io_failure(reason: str) -> Failure:
    """The ``local_io`` failure of a command that could not be prepared on this machine (its
    files could not be written: ``SubmitResult.local_fault``); ``reason`` says what failed. No
    server is blamed: the backend is paused for the rest of the iteration."""
    return KINDS["local_io"].failure(reason)


#: names of API 1.4 that moved to gridgate.core.builtin (a DeprecationWarning says where)
__getattr__ = moved_names(__name__)
