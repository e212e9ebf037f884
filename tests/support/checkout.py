"""Can the ordinary user of the real-uid tests run this checkout? Checked once at suite start."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support.uids import AS_NOBODY


def checkout_problem(root: Path, bin_dir: Path) -> str | None:
    """Why ``nobody`` cannot run this checkout's gridgate (None when it can).

    The real-uid tests run clients as nobody with this checkout's .venv; in a clone inside a
    0700 folder (``mktemp -d``) they all fail with ``Permission denied`` and nothing says why.
    """
    if os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists():
        return None
    probe = subprocess.run(
        [*AS_NOBODY, str(bin_dir / "python"), "-c", "import gridgate.core"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    if probe.returncode == 0:
        return None
    blocked = [str(p) for p in (bin_dir, *bin_dir.parents) if not os.stat(p).st_mode & 0o001]
    hint = (
        f"these folders are not world-executable: {', '.join(blocked)} "
        f"(chmod o+x them, or clone somewhere readable such as /srv or /tmp)"
        if blocked
        else "make the checkout and its .venv readable by other users (chmod -R o+rX)"
    )
    return (
        f"the user 'nobody' cannot run {bin_dir / 'python'} of the checkout {root}, so every "
        f"test that runs a client as a real ordinary uid would fail with 'Permission "
        f"denied': {hint}. What nobody saw: {probe.stderr.strip()[-300:]}"
    )
