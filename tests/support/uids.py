"""Running a command as a real ordinary uid: the tests that check permissions and socket
modes run their clients as ``nobody`` (the suite runs as root in CI)."""

from __future__ import annotations

#: argv prefix: ``[*AS_NOBODY, program, ...]`` runs ``program`` as nobody:nogroup with no
#: supplementary groups (util-linux setpriv; no shell involved).
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
