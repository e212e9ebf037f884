"""A watchdog: brings a private service down when the process that started it dies.

The real services the tests and ``dev.sh`` start (a private Slurm cluster, an ARC CE) run their
daemons in sessions of their own, so that a Ctrl-C in a terminal does not half-stop them; they
would then outlive a test run killed with SIGKILL, or ended by ``os._exit`` at a timeout. The
process that starts such a service starts a :class:`Watchdog` with the service's teardown
command. The watchdog is a small Python process in a session of its own that waits for the end
of a pipe only its owner holds: when the owner dies, however it dies, the kernel closes the pipe
and the watchdog runs the teardown. :meth:`Watchdog.stop` closes the pipe too, after the owner
has stopped the service itself; the teardown then finds nothing to do (or, with ``only_if``,
is not run once the service's folder is gone).

Run as ``python -m gridgate.core.watchdog [--only-if PATH] [--timeout S] -- ARGV...``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Watchdog"]


class Watchdog:
    """Runs ``teardown`` (an argv) when the process that called :meth:`start` dies.

    :param teardown: the command that brings the service down (no shell: an argv list).
    :param only_if: run it only while this path exists (the service's folder: its owner may
        have removed it, and with it everything there was to bring down).
    :param timeout: seconds the teardown may take before it is killed.
    :param stop_timeout: seconds :meth:`stop` waits for the watchdog to finish before it
        kills it.
    """

    def __init__(
        self,
        teardown: Sequence[str],
        *,
        only_if: str | os.PathLike[str] | None = None,
        timeout: float = 120.0,
        stop_timeout: float = 60.0,
    ) -> None:
        if not teardown:
            raise ValueError("a watchdog needs a teardown command")
        self.teardown = [str(word) for word in teardown]
        self.only_if = Path(only_if) if only_if is not None else None
        self.timeout = float(timeout)
        self.stop_timeout = float(stop_timeout)
        self._process: subprocess.Popen[bytes] | None = None
        self._last: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        """The watchdog's own command line."""
        argv = [sys.executable, "-m", "gridgate.core.watchdog", "--timeout", str(self.timeout)]
        if self.only_if is not None:
            argv += ["--only-if", str(self.only_if)]
        return [*argv, "--", *self.teardown]

    def start(self) -> Watchdog:
        """Start the watchdog process (again after :meth:`stop`); a no-op while it runs."""
        if self._process is None:
            self._process = subprocess.Popen(
                self.argv(),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,
                close_fds=True,
            )
        return self

    def stop(self) -> None:
        """Close the pipe and wait for the watchdog's end (its teardown, if any, included)."""
        process, self._process = self._process, None
        self._last = process
        if process is None:
            return
        try:
            process.communicate(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def pid(self) -> int | None:
        """The running watchdog's pid; None when it is not running."""
        return self._process.pid if self._process is not None else None

    def poll(self) -> int | None:
        """The exit status of the watchdog last started (None while it runs or never ran)."""
        process = self._process or self._last
        return process.poll() if process is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gridgate.core.watchdog",
        description="Wait for stdin to close (its writer stopped or died), then run ARGV.",
    )
    parser.add_argument("--only-if", default=None, help="run ARGV only while this path exists")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds ARGV may take")
    parser.add_argument("teardown", nargs="+", help="the teardown command (after --)")
    args = parser.parse_args(argv)
    # in a session of its own already; a signal meant for the owner's group must not end it
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        sys.stdin.buffer.read()
    except OSError:
        pass  # a broken pipe ends the wait as an EOF does
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)  # the teardown's processes inherit no SIG_IGN
    if args.only_if is not None and not Path(args.only_if).exists():
        return 0
    try:
        finished = subprocess.run(
            args.teardown,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=args.timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 1
    except OSError:
        return 127
    return 0 if finished.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
