"""A private one-host Son of Grid Engine cell (sge_qmaster, sge_execd) in a folder of its own.

The tests, the benches and people trying the backend start it the same way::

    with SgeCell() as cell:
        cell.run(["qsub", "-terse", "-q", cell.queues[0], "-b", "y", "/bin/true"], 30)

Nothing is shared with the machine's own cell (``/var/lib/gridengine``) or with another private
cell running at the same time: a fresh ``SGE_ROOT`` in the folder (links to the Debian
binaries), a unique cell name, free loopback ports for the qmaster and the execd, classic
spooling under the folder, and a group-id range of its own for job tracking. The cell is set
up without the interactive installer, and each trap a site administrator met on a machine
like this one is handled here (docs/sge.md lists them). ``stop()`` deletes the jobs, stops
the daemons by process group and waits until none of them (nor a job they started) is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from gridgate.core.documents import decode_json
from gridgate.core.model import CommandResult
from gridgate.core.runner import run
from gridgate.core.testing import exited, free_port, not_traversable, signal_group, sweep_processes
from gridgate.core.watchdog import Watchdog

#: Debian packages that provide what the cell runs (dev.sh installs them when missing).
PACKAGES = ("gridengine-master", "gridengine-exec", "gridengine-client")
#: Where Debian puts the real binaries (/usr/bin/qsub and friends are wrappers that exec these).
LIBEXEC = Path("/usr/lib/gridengine")
#: Templates and helper scripts of gridengine-common (complexes, usersets, ``util/arch``).
SHARE = Path("/usr/share/gridengine")
PROGRAMS = {
    "sge_qmaster": "gridengine-master",
    "sge_execd": "gridengine-exec",
    "sge_shepherd": "gridengine-exec",
    "qsub": "gridengine-client",
    "qstat": "gridengine-client",
    "qacct": "gridengine-client",
    "qdel": "gridengine-client",
    "qconf": "gridengine-client",
    "qhost": "gridengine-client",
    "qmod": "gridengine-client",
    "spoolinit": "gridengine-client",
    "spooldefaults.bin": "gridengine-client",
    "gethostbyaddr": "gridengine-client",
}
DEFAULT_QUEUES = ("pilots.q", "short.q")
DEFAULT_SLOTS = 4
#: The parallel environment every queue offers (``qsub -pe smp N``: N slots on one host).
PE_NAME = "smp"
#: The ordinary user pilots are submitted as: the cell refuses root (``min_uid``), as sites do.
SUBMIT_USER = "nobody"
SUBMIT_GROUP = "nogroup"
#: Seconds sge_qmaster gets to shut down after SIGTERM (it takes about 7 s when idle).
QMASTER_GRACE = 30.0
#: ... and when the cell's folder is about to be removed: nothing it saves is kept (it is
#: killed after this; sweep() then removes whatever it left).
LEFTOVER_GRACE = 1.0
#: Seconds one readiness probe (qconf, qping) may take.
PROBE_TIMEOUT = 5.0
#: Seconds ``cancel_all`` waits for the execd to confirm a deletion before it forces it.
FORCE_DELETE_AFTER = 5.0


class CellError(RuntimeError):
    """The cell could not be started or changed (the message says what to fix)."""


def missing_programs() -> list[str]:
    """The Debian packages whose programs are not installed (empty when all are)."""
    missing = {pkg for prog, pkg in PROGRAMS.items() if not (LIBEXEC / prog).exists()}
    if not (SHARE / "util" / "arch").exists():
        missing.add("gridengine-common")
    if shutil.which("setpriv") is None and not Path("/usr/bin/setpriv").exists():
        missing.add("util-linux")
    return sorted(missing)


def _require_programs() -> None:
    missing = missing_programs()
    if missing:
        raise CellError(
            f"the private Grid Engine cell needs the Debian packages {' '.join(missing)} "
            f"(apt-get install -y {' '.join(PACKAGES)}; dev.sh does this)"
        )


def home_problem(user: str = SUBMIT_USER, home: str | os.PathLike[str] | None = None) -> str | None:
    """Why ``user``'s qsub would fail because of its home folder (default: the one in the
    passwd entry), or None.

    qsub reads ``~/.sge_request`` and ``~/.sge_aliases`` from the home of the passwd entry
    (not $HOME) and gives up with exit 14 ("can't read path aliasing file") when the folder
    exists but the user may not enter it. nobody's home is /nonexistent: a program run as
    root with HOME=/nonexistent that writes "~/something" creates it with mode 700.
    """
    entry = pwd.getpwnam(user)
    home = Path(home if home is not None else entry.pw_dir)
    try:
        st = os.stat(home)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{user}'s home {home} cannot be examined ({exc})"
    mode = st.st_mode
    allowed = (
        mode & stat.S_IXOTH
        or (st.st_uid == entry.pw_uid and mode & stat.S_IXUSR)
        or (st.st_gid == entry.pw_gid and mode & stat.S_IXGRP)
    )
    if allowed:
        return None
    return (
        f"{user}'s home {home} exists and {user} may not enter it (mode {stat.S_IMODE(mode):o}, "
        f"owner uid {st.st_uid}): every qsub as {user} fails with exit 14 \"can't read path "
        f'aliasing file {home}/.sge_aliases: Permission denied". Something run as root with '
        f"HOME={home} created it; remove it (rm -r {home}) and find what wrote there"
    )


def _arch() -> str:
    """Grid Engine's name for this platform (``lx-amd64``): the binaries live below it."""
    try:
        out = subprocess.run(
            [str(SHARE / "util" / "arch")], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out or "lx-amd64"


def _host_names() -> tuple[str, list[str]]:
    """This host's short name, and every other name its addresses resolve back to.

    On a machine whose name resolves to 127.0.0.1 while 127.0.0.1 resolves back to
    ``localhost``, the daemons see the execd's connection come from ``localhost`` and refuse
    it as an unknown host: these names go into ``host_aliases``.
    """
    host = socket.gethostname().split(".")[0] or "localhost"
    names: set[str] = {socket.getfqdn()}
    try:
        canonical, aliases, addresses = socket.gethostbyname_ex(host)
        names.update([canonical, *aliases])
    except OSError:
        addresses = ["127.0.0.1"]
    for address in addresses:
        try:
            canonical, aliases, _ = socket.gethostbyaddr(address)
            names.update([canonical, *aliases])
        except OSError:
            continue
        if address.startswith("127."):
            names.add("localhost")
    shorts = {name.split(".")[0] for name in names if name}
    return host, sorted((names | shorts) - {host, ""})


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds a socket listening on TCP ``port`` (not another
    process that took the port: a client would wait on that one for an answer)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local address is HEX_IP:HEX_PORT; state 0A is LISTEN; field 9 is the inode
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1][-4:], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue  # closed meanwhile
    return False


def _job_of(root_var: bytes) -> Callable[[int, str], bool]:
    """Whether a process is a job of the cell whose SGE_ROOT is ``root_var`` (``SGE_ROOT=...``,
    as bytes): the daemons, shepherds and job scripts run in or name the folder, which the sweep
    finds itself; a job that left it still carries the cell's SGE_ROOT and a JOB_ID."""

    def job(pid: int, _mark: str) -> bool:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        # A person's shell that exported the cell's variables is not a job: jobs have JOB_ID too.
        return root_var in environ and any(v.startswith(b"JOB_ID=") for v in environ)

    return job


def sweep(folder: str | os.PathLike[str]) -> None:
    """Kill what a cell's daemons left: shepherds and jobs. Each leftover's process group goes
    at once (a job's children with it)."""
    mark = str(Path(folder).resolve())
    sweep_processes(mark, _job_of(f"SGE_ROOT={mark}/root".encode()), rounds=100)


class SgeCell:
    """One sge_qmaster and one sge_execd, private to ``folder``, with ``queues`` on the host.

    ``folder`` (default: a fresh folder in the system's temporary directory, removed by
    ``stop``) must be reachable by other users: jobs run as :data:`SUBMIT_USER` and read their
    scripts from it. Each queue has ``slots`` slots on the one exec host and the ``smp``
    parallel environment. With ``watchdog`` (the default) the daemons are brought down even
    when this process dies without calling ``stop``.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        queues: Sequence[str] = DEFAULT_QUEUES,
        slots: int = DEFAULT_SLOTS,
        start_timeout: float = 120.0,
        watchdog: bool = True,
    ) -> None:
        self._own_folder = folder is None
        self.folder = Path(folder) if folder is not None else None
        self.queues = tuple(queues)
        if not self.queues:
            raise ValueError("a cell needs at least one queue")
        self.slots = int(slots)
        self.start_timeout = start_timeout
        self.cell_name = f"gg{secrets.token_hex(4)}"
        self.host, self.host_aliases = _host_names()
        self._arch = _arch()
        self.qmaster_port = 0
        self.execd_port = 0
        # job tracking uses one supplementary group per job from this range; another cell's
        # execd must not take the same ones for its own jobs
        base = 20000 + 100 * secrets.randbelow(400)
        self.gid_range = f"{base}-{base + 99}"
        self.submit_user = SUBMIT_USER
        entry = pwd.getpwnam(SUBMIT_USER)
        self.submit_uid = entry.pw_uid
        self.submit_gid = entry.pw_gid
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._out_marks: dict[str, int] = {}  # where each daemon's console output began
        self.watchdog = watchdog
        self._watchdog: Watchdog | None = None

    # --- paths and environment ------------------------------------------------------------

    def _path(self, *parts: str) -> Path:
        assert self.folder is not None, "the cell is not started"
        return self.folder.joinpath(*parts)

    @property
    def sge_root(self) -> Path:
        """The cell's private SGE_ROOT (links to the installed binaries, and the cell)."""
        return self._path("root")

    @property
    def common(self) -> Path:
        """``$SGE_ROOT/$SGE_CELL/common``: bootstrap, act_qmaster, accounting..."""
        return self.sge_root / self.cell_name / "common"

    @property
    def spool(self) -> Path:
        return self.sge_root / self.cell_name / "spool"

    @property
    def bin_dir(self) -> Path:
        """Where the client commands are (``$SGE_ROOT/bin/<arch>``)."""
        return self.sge_root / "bin" / self._arch

    @property
    def accounting_file(self) -> Path:
        """Where sge_qmaster writes a record per finished job (what ``qacct`` reads)."""
        return self.common / "accounting"

    @property
    def jobs_dir(self) -> Path:
        """A folder every user may write job scripts and output to (mode 1777, like /tmp);
        also every job's default working folder (``-wd``, in the cell's ``sge_request``)."""
        return self._path("jobs")

    @property
    def env(self) -> dict[str, str]:
        """What a Grid Engine client needs to talk to this cell, with a PATH to its commands
        and a HOME the submit user can read."""
        return {
            "SGE_ROOT": str(self.sge_root),
            "SGE_CELL": self.cell_name,
            "SGE_QMASTER_PORT": str(self.qmaster_port),
            "SGE_EXECD_PORT": str(self.execd_port),
            "PATH": f"{self.bin_dir}:/usr/bin:/bin",
            # qsub reads $HOME/.sge_request and $HOME/.sge_aliases and gives up (exit 14) when
            # it may not: nobody's home is /nonexistent, which need not stay nonexistent
            "HOME": str(self.jobs_dir),
        }

    def client_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) plus :attr:`env` (its PATH first)."""
        merged = {**(os.environ if base is None else base)}
        env = self.env
        if merged.get("PATH"):
            env["PATH"] = f"{self.bin_dir}:{merged['PATH']}"
        return {**merged, **env}

    @property
    def submit_prefix(self) -> list[str]:
        """argv prefix that runs a command as the submit user (util-linux setpriv)."""
        return [
            "setpriv",
            f"--reuid={self.submit_user}",
            f"--regid={SUBMIT_GROUP}",
            "--clear-groups",
        ]

    def log(self, daemon: str = "qmaster") -> str:
        """The daemon's messages file and console output so far (for error messages)."""
        texts = []
        if daemon == "qmaster":
            paths = [self.spool / "qmaster" / "messages"]
        else:
            paths = sorted(self.spool.glob("execd/*/messages"))
        for path in [self._path("log", f"{daemon}.out"), *paths]:
            if path.exists():
                lines = path.read_text(errors="replace").splitlines(keepends=True)
                # the scheduler's per-run summary (twice a second on the console) says nothing
                texts += [ln for ln in lines if not ln.startswith(("Q:", "--------------S"))]
        return "".join(texts)

    # --- commands ---------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        timeout: float = 30.0,
        *,
        as_user: bool = True,
        cwd: str | os.PathLike[str] | None = None,
        input: bytes | None = None,
    ) -> CommandResult:
        """Run a Grid Engine command (argv) against this cell: as the submit user through
        setpriv when ``as_user`` (the default), else as this process's user (root: a manager
        of the cell). It runs in :attr:`jobs_dir` unless ``cwd`` says otherwise."""
        full = [*self.submit_prefix, *argv] if as_user else list(argv)
        return run(
            full,
            timeout,
            env=self.env,
            cwd=str(cwd if cwd is not None else self.jobs_dir),
            input=input,
        )

    def qconf(self, *args: str, timeout: float = 30.0) -> CommandResult:
        """``qconf ARGS...`` as the manager; raises CellError when it fails."""
        result = self.run(["qconf", *args], timeout, as_user=False)
        if not result.ok:
            raise CellError(
                f"qconf {' '.join(args)}: {result.describe()}: "
                f"{(result.stderr + result.stdout).strip()}"
            )
        return result

    def _write_conf_file(self, name: str, values: Mapping[str, str]) -> Path:
        """A ``key value`` file in the folder's conf/ for ``qconf -A.../-M...``."""
        path = self._path("conf", name)
        path.write_text("".join(f"{k} {v}\n" for k, v in values.items()), encoding="utf-8")
        return path

    def _modify_global(self, **changes: str) -> None:
        """Change keys of the global configuration (``qconf -Mconf``)."""
        shown = self.qconf("-sconf", "global").stdout
        values: dict[str, str] = {}
        for line in shown.splitlines():
            if line.strip() and not line.startswith("#"):
                key, _, value = line.partition(" ")
                values[key] = value.strip()
        values.update(changes)
        folder = self._path("conf", "global.d")
        folder.mkdir(exist_ok=True)
        path = folder / "global"  # qconf takes the configuration's name from the file's
        path.write_text("".join(f"{k} {v}\n" for k, v in values.items()), encoding="utf-8")
        self.qconf("-Mconf", str(path))

    def _modify_scheduler(self, **changes: str) -> None:
        """Change keys of the scheduler configuration (``qconf -Msconf``)."""
        shown = self.qconf("-ssconf").stdout
        values: dict[str, str] = {}
        for line in shown.splitlines():
            if line.strip() and not line.startswith("#"):
                key, _, value = line.partition(" ")
                values[key] = value.strip()
        values.update(changes)
        self.qconf("-Msconf", str(self._write_conf_file("scheduler", values)))

    def global_config(self, key: str) -> str:
        """One value of the global configuration as the qmaster has it."""
        for line in self.qconf("-sconf", "global").stdout.splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return value.strip()
        raise CellError(f"the global configuration has no {key}")

    def disable_queue(self, name: str) -> None:
        """``qmod -d``: the queue takes no new job (state ``d``); its running jobs go on."""
        self._qmod("-d", name)

    def enable_queue(self, name: str) -> None:
        self._qmod("-e", name)

    def _qmod(self, flag: str, name: str) -> None:
        result = self.run(["qmod", flag, name], as_user=False)
        if not result.ok:
            raise CellError(f"qmod {flag} {name}: {result.describe()}: {result.stderr.strip()}")

    def set_user_job_limit(self, limit: int) -> None:
        """``max_u_jobs`` in the global configuration: a user's qsub past ``limit`` live jobs
        is refused (0: no limit)."""
        self._modify_global(max_u_jobs=str(int(limit)))

    def set_running_job_limit(self, limit: int) -> None:
        """The scheduler's ``maxujobs``: at most ``limit`` running jobs per user; the rest
        wait in ``qw`` (0: no limit)."""
        self._modify_scheduler(maxujobs=str(int(limit)))

    def restrict_queue_to(self, queue: str, users: Sequence[str] = ("root",)) -> None:
        """Allow only ``users`` in ``queue`` (an access list ``<queue>_acl``, the queue's
        ``user_lists``). Grid Engine does not refuse such a submission by default: the job
        waits in ``qw`` (``qsub -w e`` refuses it)."""
        acl = self._acl_name(queue)
        self.qconf("-au", ",".join(users), acl)
        self.qconf("-mattr", "queue", "user_lists", acl, queue)

    def restrict_cell_to(self, users: Sequence[str] = ("root",)) -> None:
        """Allow only ``users`` to submit at all (the global ``user_lists``): any other
        user's qsub is refused."""
        self.qconf("-au", ",".join(users), "gg_cell_acl")
        self._modify_global(user_lists="gg_cell_acl")

    def lift_restrictions(self) -> None:
        """Undo :meth:`restrict_queue_to`, :meth:`restrict_cell_to` and the job limits."""
        if self.global_config("user_lists") != "none" or self.global_config("max_u_jobs") != "0":
            self._modify_global(user_lists="none", max_u_jobs="0")
        listed = self.run(["qconf", "-sul"], as_user=False).stdout.split()
        for queue in self.queues:
            acl = self._acl_name(queue)
            if acl in listed:
                self.qconf("-rattr", "queue", "user_lists", "NONE", queue)
                self.qconf("-dul", acl)
        if "gg_cell_acl" in listed:
            self.qconf("-dul", "gg_cell_acl")
        shown = self.qconf("-ssconf").stdout.split()
        if shown[shown.index("maxujobs") + 1] != "0":
            self._modify_scheduler(maxujobs="0")

    @staticmethod
    def _acl_name(queue: str) -> str:
        return "gg_" + "".join(c if c.isalnum() else "_" for c in queue) + "_acl"

    def queue_states(self) -> dict[str, str]:
        """Each queue instance's state letters (``""`` when healthy; ``d`` disabled, ``u``
        unknown, ``a`` alarm...), as ``qstat -f`` shows them."""
        result = self.run(["qstat", "-f", "-u", "*"], as_user=False)
        states: dict[str, str] = {}
        for line in result.stdout.splitlines():
            fields = line.split()
            if fields and "@" in fields[0] and len(fields) >= 5:
                states[fields[0]] = fields[5] if len(fields) > 5 else ""
        return states

    def job_ids(self) -> list[str]:
        """Every job the qmaster holds, of every user (array tasks listed once per job)."""
        result = self.run(["qstat", "-u", "*"], as_user=False)
        ids = []
        for line in result.stdout.splitlines()[2:]:
            fields = line.split()
            if fields and fields[0].isdigit() and fields[0] not in ids:
                ids.append(fields[0])
        return ids

    def cancel_all(self, wait: float = 60.0) -> bool:
        """Delete every job of every user (the manager's qdel), then wait up to ``wait``
        seconds until none is left. Returns whether it got there.

        A job the execd does not confirm soon (one it took over when it was restarted waits a
        minute for that) is deleted again with ``-f``: the qmaster forgets it, the execd
        still kills it."""
        if not self.job_ids():
            return True
        self.run(["qdel", "-u", "*"], as_user=False)
        begun = time.monotonic()
        end = begun + wait
        forced = False
        while time.monotonic() < end:
            ids = self.job_ids()
            if not ids:
                return True
            if not forced and time.monotonic() > begun + FORCE_DELETE_AFTER:
                self.run(["qdel", "-f", *ids], as_user=False)
                forced = True
            time.sleep(0.1)
        return False

    # --- life cycle ---------------------------------------------------------------------------

    def __enter__(self) -> SgeCell:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> SgeCell:
        """Lay the cell out, start sge_qmaster, configure it, start sge_execd; return when
        every queue instance is up and healthy."""
        _require_programs()
        problem = home_problem(self.submit_user)
        if problem is not None:
            raise CellError(problem)
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="gridgate-sge-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder = self.folder.resolve()
        os.chmod(self.folder, 0o755)
        blocked = not_traversable(self.folder)
        if blocked is not None:
            if self._own_folder:
                shutil.rmtree(self.folder, ignore_errors=True)
            raise CellError(
                f"{blocked} is not world-executable (mode {stat.S_IMODE(os.stat(blocked).st_mode):o}):"
                f" jobs run as {self.submit_user} and cannot reach the cell's scripts and spool "
                f"below it; use a folder whose every parent has o+x"
            )
        if self.watchdog:
            self._start_watchdog()
        try:
            self._lay_out()
            # Another process may take a probed port before a daemon binds it: try again then,
            # and only then (on a loaded machine a slow start is not cured by restarting).
            configured = False
            for _attempt in range(4):
                self.qmaster_port, self.execd_port = free_port(), free_port()
                self._save_state()
                if not self._start_qmaster(raise_on_failure=False):
                    if not self._bind_failed("qmaster"):
                        self._raise_not_up("sge_qmaster")
                    # it never served (and retries its bind for half a minute): no grace
                    self._stop_process("qmaster", 0)
                    continue
                if not configured:
                    self._configure()
                    configured = True
                self._start("execd", [str(LIBEXEC / "sge_execd")])
                if self._wait_queues(time.monotonic() + self.start_timeout)[0]:
                    return self
                if not self._bind_failed("execd"):
                    self._raise_not_up("sge_execd")
                self._stop_process("execd", 0)
                self._stop_process("qmaster", LEFTOVER_GRACE)
            raise CellError(
                f"the private Grid Engine cell in {self.folder} found no free ports in 4 tries;"
                f" last log:\n{self.log('qmaster')[-2000:]}{self.log('execd')[-2000:]}"
            )
        except BaseException:
            self.stop()
            raise

    def _bind_failed(self, daemon: str) -> bool:
        """Whether the daemon's console output since its last start says its port was taken
        (it then retries for half a minute before it gives up: no need to wait for that)."""
        path = self._path("log", f"{daemon}.out")
        try:
            with open(path, "rb") as out:
                out.seek(self._out_marks.get(daemon, 0))
                return b"can't bind socket" in out.read()
        except OSError:
            return False

    def _raise_not_up(self, daemon: str) -> NoReturn:
        key = "qmaster" if daemon == "sge_qmaster" else "execd"
        raise CellError(
            f"{daemon} of the private Grid Engine cell in {self.folder} did not come up within "
            f"{self.start_timeout:.0f} s; last log:\n{self.log(key)[-3000:]}"
        )

    def _lay_out(self) -> None:
        """SGE_ROOT, bootstrap, act_qmaster, host_aliases, classic spool and the defaults:
        what the interactive installer would write, without it."""
        for sub in ("log", "conf", "run"):
            self._path(sub).mkdir(mode=0o755, exist_ok=True)
        self.jobs_dir.mkdir(exist_ok=True)
        os.chmod(self.jobs_dir, 0o1777)
        root = self.sge_root
        if root.exists():
            shutil.rmtree(root)  # a cell left by an earlier ``up`` of this folder: start afresh
        for sub in ("bin", "utilbin", "lib"):
            (root / sub).mkdir(parents=True, mode=0o755)
            (root / sub / self._arch).symlink_to(LIBEXEC)
        (root / "util").symlink_to(SHARE / "util")
        self.common.mkdir(parents=True, mode=0o755)
        for sub in ("qmaster", "execd"):
            (self.spool / sub).mkdir(parents=True, mode=0o755)
        spooling = f"{self.common};{self.spool / 'qmaster'}"
        # admin_user none: the daemons stay root (they run as root here, and switch to the
        # job's owner for each job)
        self._write(
            self.common / "bootstrap",
            {
                "admin_user": "none",
                "default_domain": "none",
                "ignore_fqdn": "true",
                "spooling_method": "classic",
                "spooling_lib": "libspoolc",
                "spooling_params": spooling,
                "binary_path": str(root / "bin"),
                "qmaster_spool_dir": str(self.spool / "qmaster"),
                "security_mode": "none",
                "listener_threads": "2",
                "worker_threads": "2",
                "scheduler_threads": "1",
                "jvm_threads": "0",
            },
            header="# Version: 8.1.9\n",
        )
        # Trap: the installer run without questions leaves act_qmaster empty, and every
        # client then fails to find the qmaster.
        (self.common / "act_qmaster").write_text(self.host + "\n", encoding="utf-8")
        # Trap: this host's name resolves to 127.0.0.1 and 127.0.0.1 back to "localhost".
        aliases = f"{self.host} {' '.join(self.host_aliases)}\n" if self.host_aliases else ""
        (self.common / "host_aliases").write_text(aliases, encoding="utf-8")
        # nobody's home (/nonexistent) cannot be a job's working folder (qacct's "failed 28:
        # changing into working directory"); a site's users have homes, the cell's has this.
        (self.common / "sge_request").write_text(f"-wd {self.jobs_dir}\n", encoding="utf-8")
        (self.common / "cluster_name").write_text(self.cell_name + "\n", encoding="utf-8")
        env = {**self.env, "LD_LIBRARY_PATH": str(LIBEXEC)}
        spoolinit = [str(LIBEXEC / "spoolinit"), "classic", "libspoolc", spooling, "init"]
        self._setup_step(spoolinit, env)
        defaults = str(LIBEXEC / "spooldefaults.bin")
        self._write(self.common / "configuration.template", self._global_configuration())
        pes = self._path("conf", "pe")
        pes.mkdir(exist_ok=True)
        self._write(
            pes / PE_NAME,
            {
                "pe_name": PE_NAME,
                "slots": "999",
                "user_lists": "NONE",
                "xuser_lists": "NONE",
                "start_proc_args": "NONE",
                "stop_proc_args": "NONE",
                "allocation_rule": "$pe_slots",
                "control_slaves": "TRUE",
                "job_is_first_task": "TRUE",
                "urgency_slots": "min",
                "accounting_summary": "TRUE",
                "qsort_args": "NONE",
            },
        )
        for args in (
            ["configuration", str(self.common / "configuration.template")],
            ["complexes", str(SHARE / "util" / "resources" / "centry")],
            ["usersets", str(SHARE / "util" / "resources" / "usersets")],
            ["pes", str(pes)],
            ["managers", "root"],
        ):
            self._setup_step([defaults, *args], env)
        self.verify_host_resolution()

    def verify_host_resolution(self) -> None:
        """Raise CellError unless Grid Engine's resolver (with the cell's host_aliases) names
        every address of this host after it: else the execd's connection is refused."""
        env = {**self.env, "LD_LIBRARY_PATH": str(LIBEXEC)}
        try:
            addresses = socket.gethostbyname_ex(self.host)[2]
        except OSError as exc:
            raise CellError(
                f"this host's name {self.host!r} does not resolve ({exc}): add it to /etc/hosts"
            ) from exc
        for address in addresses:
            result = run([str(LIBEXEC / "gethostbyaddr"), "-aname", address], 30, env=env)
            if result.stdout.strip() != self.host:
                raise CellError(
                    f"Grid Engine resolves {address} (an address of {self.host}) to "
                    f"{result.stdout.strip() or result.stderr.strip()!r}, not {self.host}, "
                    f"even with {self.common / 'host_aliases'}: fix /etc/hosts"
                )

    def _global_configuration(self) -> dict[str, str]:
        return {
            "conf_version": "0",
            "execd_spool_dir": str(self.spool / "execd"),
            "mailer": "/bin/true",
            "xterm": "/bin/true",
            "load_sensor": "none",
            "prolog": "none",
            "epilog": "none",
            "shell_start_mode": "posix_compliant",
            "login_shells": "sh,bash",
            # Trap: root may not submit, as at a site (the installer's own value).
            "min_uid": "100",
            "min_gid": "100",
            "user_lists": "none",
            "xuser_lists": "none",
            "projects": "none",
            "xprojects": "none",
            "enforce_project": "false",
            "enforce_user": "auto",
            "load_report_time": "00:00:05",
            "max_unheard": "00:05:00",
            "reschedule_unknown": "00:00:00",
            "loglevel": "log_info",
            "administrator_mail": "none",
            "set_token_cmd": "none",
            "pag_cmd": "none",
            "token_extend_time": "none",
            "shepherd_cmd": "none",
            "qmaster_params": "none",
            "execd_params": "none",
            # every finished job in the accounting file at once (qacct -j), not after 15 s
            "reporting_params": "accounting=true reporting=false flush_time=00:00:01 "
            "joblog=false sharelog=00:00:00 accounting_flush_time=00:00:00",
            "finished_jobs": "100",
            "gid_range": self.gid_range,
            "qlogin_command": "builtin",
            "qlogin_daemon": "builtin",
            "rlogin_command": "builtin",
            "rlogin_daemon": "builtin",
            "rsh_command": "builtin",
            "rsh_daemon": "builtin",
            "max_aj_instances": "2000",
            "max_aj_tasks": "75000",
            "max_u_jobs": "0",
            "max_jobs": "0",
            "max_advance_reservations": "0",
            "auto_user_oticket": "0",
            "auto_user_fshare": "0",
            "auto_user_default_project": "none",
            "auto_user_delete_time": "86400",
            "delegated_file_staging": "false",
            "reprioritize": "0",
            "jsv_url": "none",
            "jsv_allowed_mod": "ac,h,i,e,o,j,M,N,p,w",
        }

    def _queue(self, name: str) -> dict[str, str]:
        """A cluster queue from a template of our own: the stock one names parallel
        environments that do not exist, and its load threshold puts the queue in alarm on a
        loaded machine (state ``a``: no job starts)."""
        values = {
            "qname": name,
            "hostlist": self.host,
            "seq_no": str(self.queues.index(name)),
            "load_thresholds": "NONE",
            "suspend_thresholds": "NONE",
            "nsuspend": "1",
            "suspend_interval": "00:05:00",
            "priority": "0",
            "min_cpu_interval": "00:05:00",
            "processors": "UNDEFINED",
            "qtype": "BATCH INTERACTIVE",
            "ckpt_list": "NONE",
            "pe_list": PE_NAME,
            "rerun": "FALSE",
            "slots": str(self.slots),
            "tmpdir": "/tmp",
            "shell": "/bin/sh",
            "prolog": "NONE",
            "epilog": "NONE",
            "shell_start_mode": "posix_compliant",
            "starter_method": "NONE",
            "suspend_method": "NONE",
            "resume_method": "NONE",
            "terminate_method": "NONE",
            "notify": "00:00:60",
            "owner_list": "NONE",
            "user_lists": "NONE",
            "xuser_lists": "NONE",
            "subordinate_list": "NONE",
            "complex_values": "NONE",
            "projects": "NONE",
            "xprojects": "NONE",
            "calendar": "NONE",
            "initial_state": "default",
        }
        for limit in ("rt", "cpu", "fsize", "data", "stack", "core", "rss", "vmem"):
            values[f"s_{limit}"] = values[f"h_{limit}"] = "INFINITY"
        return values

    def _configure(self) -> None:
        """Scheduler intervals, the exec and submit host, the queues."""
        self._modify_scheduler(
            schedule_interval="0:0:1",
            flush_submit_sec="1",
            flush_finish_sec="1",
            queue_sort_method="seqno",
            job_load_adjustments="NONE",
            load_adjustment_decay_time="0:0:0",
            maxujobs="0",
        )
        host = {
            "hostname": self.host,
            "load_scaling": "NONE",
            "complex_values": "NONE",
            "user_lists": "NONE",
            "xuser_lists": "NONE",
            "projects": "NONE",
            "xprojects": "NONE",
            "usage_scaling": "NONE",
            "report_variables": "NONE",
        }
        self.qconf("-Ae", str(self._write_conf_file("exechost", host)))
        self.qconf("-as", self.host)
        for name in self.queues:
            self.qconf("-Aq", str(self._write_conf_file(f"queue-{name}", self._queue(name))))

    @staticmethod
    def _write(path: Path, values: Mapping[str, str], header: str = "") -> None:
        text = header + "".join(f"{k:<24}{v}\n" for k, v in values.items())
        path.write_text(text, encoding="utf-8")
        os.chmod(path, 0o644)

    def _setup_step(self, argv: list[str], env: Mapping[str, str]) -> None:
        result = run(argv, 60, env=env, cwd=str(self.folder))
        if not result.ok:
            raise CellError(
                f"setting up the cell in {self.folder}: {' '.join(argv)}: {result.describe()}: "
                f"{(result.stderr + result.stdout).strip()}"
            )

    def _save_state(self) -> None:
        """What ``env`` and ``down`` need later, in another process (``cell.json``)."""
        state = {
            "cell": self.cell_name,
            "sge_root": str(self.sge_root),
            "qmaster_port": self.qmaster_port,
            "execd_port": self.execd_port,
            "host": self.host,
            "queues": list(self.queues),
            "bin": str(self.bin_dir),
            "jobs": str(self.jobs_dir),
        }
        self._path("cell.json").write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")

    def _start_watchdog(self) -> None:
        """Core's watchdog brings the cell down (``down``, and removes a folder made here)
        if this process dies without ``stop`` (SIGKILL, ``os._exit`` of a test timeout)."""
        assert self.folder is not None
        teardown = [sys.executable, "-m", "gridgate.plugins.sge.cell", "down", str(self.folder)]
        teardown += ["--remove"] if self._own_folder else []
        self._watchdog = Watchdog(teardown, only_if=self.folder, stop_timeout=60).start()

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            # it finds the cell already down (its folder gone, when made here) and exits
            watchdog.stop()

    def _start(self, name: str, argv: list[str]) -> None:
        out = open(self._path("log", f"{name}.out"), "ab")  # noqa: SIM115 - handed to the child
        self._out_marks[name] = out.tell()
        # Trap: the init scripts cannot run here; the daemons are started by hand, in the
        # foreground (SGE_ND) so that they stay our children, each in a session of its own.
        env = {**self.env, "SGE_ND": "1"}
        try:
            self._procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(self.folder),
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            out.close()

    def _alive(self, name: str) -> bool:
        proc = self._procs.get(name)
        return proc is not None and proc.poll() is None

    def _start_qmaster(self, *, raise_on_failure: bool = True) -> bool:
        """Start sge_qmaster and wait until it answers; False (or CellError) when it does not."""
        if not self._alive("qmaster"):
            self._procs.pop("qmaster", None)
            self._start("qmaster", [str(LIBEXEC / "sge_qmaster")])
        end = time.monotonic() + self.start_timeout
        while time.monotonic() < end:
            if not self._alive("qmaster") or self._bind_failed("qmaster"):
                break
            # a client probes only the qmaster's own listener: on a port someone else took
            # meanwhile it would wait for an answer that never comes (the bind failure shows
            # in the console output at once instead)
            if not _listens(self._procs["qmaster"].pid, self.qmaster_port):
                time.sleep(0.05)
                continue
            # a short deadline per probe: a client that reached someone else's listener on a
            # port taken meanwhile waits for an answer that never comes
            probe = min(max(end - time.monotonic(), 1.0), PROBE_TIMEOUT)
            result = self.run(["qconf", "-sss"], probe, as_user=False)
            if result.ok and result.stdout.strip():
                return True
            time.sleep(0.1)
        if raise_on_failure:
            self._raise_not_up("sge_qmaster")
        return False

    def resume(self) -> SgeCell:
        """Start again the cell an earlier ``up`` left in the folder and ``stop`` stopped: its
        name, host, ports and spool as ``cell.json`` records them, so that the qmaster
        recovers the jobs it held and the execd takes over those still running."""
        saved = _saved(self._path("cell.json"))
        self.cell_name = str(saved["cell"])
        self.qmaster_port = int(str(saved["qmaster_port"]))
        self.execd_port = int(str(saved["execd_port"]))
        queues = saved.get("queues")
        if isinstance(queues, list) and queues:
            self.queues = tuple(str(q) for q in queues)
        self._start_qmaster()
        if not self._alive("execd"):
            self._procs.pop("execd", None)
            self._start("execd", [str(LIBEXEC / "sge_execd")])
        self.wait_for_exec_host(disabled_ok=True)
        return self

    def start_qmaster(self) -> None:
        """(Re)start sge_qmaster; it recovers its jobs from the spool. A running execd is
        restarted (:meth:`_reregister_execd`); it takes its running jobs over."""
        self._start_qmaster()
        if self._alive("execd"):
            self._reregister_execd()
            self.wait_for_exec_host(disabled_ok=True)

    def _reregister_execd(self) -> None:
        """Restart the running execd so that it registers with a qmaster started again now.

        An execd that lost its qmaster tries to register again only every 30 s
        (EXECD_MAX_RECONNECT_TIMEOUT, compiled in): until then the queues stay ``u`` and no
        job starts. A restarted execd registers at once and takes its jobs over (their
        shepherds go on)."""
        self._stop_process("execd")
        self._start("execd", [str(LIBEXEC / "sge_execd")])

    def stop_qmaster(self) -> None:
        """Stop sge_qmaster (the clients then cannot contact it; the execd and its jobs go on)."""
        self._stop_process("qmaster")

    @property
    def qmaster_pid(self) -> int | None:
        proc = self._procs.get("qmaster")
        return proc.pid if proc is not None and proc.poll() is None else None

    def start_execd(self) -> None:
        """(Re)start sge_execd and wait until every queue instance is healthy."""
        if not self._alive("execd"):
            self._procs.pop("execd", None)
            self._start("execd", [str(LIBEXEC / "sge_execd")])
        self.wait_for_exec_host()

    def stop_execd(self) -> None:
        """Stop sge_execd (its jobs go on; the qmaster marks the host unknown after a while)."""
        self._stop_process("execd")

    def wait_for_exec_host(
        self, timeout: float | None = None, *, disabled_ok: bool = False
    ) -> None:
        """Wait until the execd answers and every queue instance on the host is up with no
        state letter (not ``u`` unknown, ``a`` alarm, ``E`` error; nor ``d`` disabled unless
        ``disabled_ok``: a queue disabled on purpose is healthy); CellError when not in time."""
        ready, states = self._wait_queues(
            time.monotonic() + (timeout or self.start_timeout), disabled_ok=disabled_ok
        )
        if ready:
            return
        for name in ("qmaster", "execd"):
            if not self._alive(name):
                raise CellError(f"sge_{name} exited:\n{self.log(name)[-3000:]}")
        raise CellError(
            f"the queues of the cell in {self.folder} are not all up (states {states}); "
            f"execd log:\n{self.log('execd')[-3000:]}"
        )

    def _wait_queues(self, end: float, *, disabled_ok: bool = False) -> tuple[bool, dict[str, str]]:
        """Poll until :meth:`wait_for_exec_host`'s condition holds (True) or a daemon exits or
        ``end`` passes (False); also the queue states last seen."""
        wanted = {f"{queue}@{self.host}" for queue in self.queues}
        states: dict[str, str] = {}
        while time.monotonic() < end:
            if not (self._alive("qmaster") and self._alive("execd")):
                return False, states
            if self._bind_failed("execd"):
                return False, states
            states = self.queue_states()
            healthy = wanted <= states.keys() and not any(
                states[q].replace("d", "") if disabled_ok else states[q] for q in wanted
            )
            # the qmaster shows an execd that was just restarted as healthy until it notices
            if healthy and self._execd_answers():
                return True, states
            time.sleep(0.1)
        return False, states

    def _execd_answers(self) -> bool:
        """``qping`` of the execd: it is up and listening on the cell's execd port."""
        probe = ["qping", "-info", self.host, str(self.execd_port), "execd", "1"]
        return self.run(probe, PROBE_TIMEOUT, as_user=False).ok

    def _stop_process(self, name: str, grace: float = QMASTER_GRACE) -> None:
        """TERM, then KILL, the daemon's process group, and reap it.

        The group is signalled only while its leader is not reaped (alive or a zombie): this
        machine's pids wrap within minutes, and a pid that was reaped may already lead someone
        else's process group.
        """
        proc = self._procs.pop(name, None)
        if proc is None or proc.returncode is not None:
            return
        for sig in (signal.SIGCONT, signal.SIGTERM):
            signal_group(proc.pid, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end and not exited(proc.pid):
            time.sleep(0.02)
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()

    def ensure_running(self) -> None:
        """Start again whichever daemon is gone (stopped, or killed from outside), then wait
        for the queues."""
        qmaster_started = not self._alive("qmaster")
        if qmaster_started:
            self._start_qmaster()
        if not self._alive("execd"):
            self._procs.pop("execd", None)
            self._start("execd", [str(LIBEXEC / "sge_execd")])
        elif qmaster_started:
            self._reregister_execd()
        self.wait_for_exec_host(disabled_ok=True)

    def reset(self) -> None:
        """Healthy again: daemons running, every queue enabled, no restriction, no job."""
        problem = home_problem(self.submit_user)
        if problem is not None:
            raise CellError(problem)
        self.ensure_running()
        for queue in self.queues:
            self.enable_queue(queue)
        self.lift_restrictions()
        if not self.cancel_all():
            raise CellError(f"jobs are left in the cell after qdel: {self.job_ids()}")
        self.wait_for_exec_host()

    def stop(self) -> None:
        """Delete the jobs, stop both daemons, remove the folder when it was made here."""
        removing = self._own_folder
        if self._alive("qmaster"):
            try:
                # the daemons stop next: no need to wait long for the jobs to go
                self.cancel_all(wait=0 if removing else 10)
            except OSError:
                pass  # a qmaster that cannot be reached is stopped below all the same
        grace = LEFTOVER_GRACE if removing else QMASTER_GRACE
        self._stop_process("execd", grace)
        self._stop_process("qmaster", grace)
        if self.folder is not None:
            sweep(self.folder)
            for pidfile in self._pidfiles(self.folder):
                pidfile.unlink(missing_ok=True)
        if removing and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self._stop_watchdog()

    @staticmethod
    def _pidfiles(folder: Path) -> list[Path]:
        return [
            *folder.glob("root/*/spool/qmaster/qmaster.pid"),
            *folder.glob("root/*/spool/execd/*/execd.pid"),
        ]


# --- by hand: ``python -m gridgate.plugins.sge.cell up|down|env [DIR]`` (``bash dev.sh sge``) ---

DEFAULT_HAND_FOLDER = "/tmp/gridgate-sge"


def _pids(folder: Path) -> list[int]:
    """The live daemons named by the folder's pid files (a stale pid, reused by some other
    process since, does not work in this folder and is left alone)."""
    pids = []
    mark = str(folder) + "/"
    for pidfile in SgeCell._pidfiles(folder):
        try:
            pid = int(pidfile.read_text().split()[0])
            cwd = os.readlink(f"/proc/{pid}/cwd")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        if cwd.startswith(mark) and state != "Z":
            pids.append(pid)
    return pids


def _term_daemons(root: Path, grace: float) -> None:
    """SIGTERM the daemons of the cell in ``root`` and wait up to ``grace`` for them to go."""
    for pid in _pids(root):
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass  # already gone: the wait below finds it so
    end = time.monotonic() + grace
    while time.monotonic() < end and _pids(root):
        time.sleep(0.05)


def stop_daemons(folder: str | os.PathLike[str], grace: float = QMASTER_GRACE) -> None:
    """Stop sge_qmaster and sge_execd of the cell in ``folder``, leaving its jobs: pending
    ones in the qmaster's spool, running ones under their shepherds (``start`` takes both
    over)."""
    root = Path(folder).resolve()
    _term_daemons(root, grace)
    for pid in _pids(root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for pidfile in SgeCell._pidfiles(root):
        pidfile.unlink(missing_ok=True)


def down(folder: str | os.PathLike[str], grace: float = QMASTER_GRACE) -> int:
    """Stop the daemons of the cell in ``folder`` (started by ``up``) and its jobs; 0 when
    none is left."""
    root = Path(folder).resolve()
    _term_daemons(root, grace)
    sweep(root)
    for pidfile in SgeCell._pidfiles(root):
        pidfile.unlink(missing_ok=True)
    return 0


def _saved(path: Path) -> dict[str, object]:
    """The record ``up`` saved of the cell it started (``cell.json``)."""
    record: dict[str, object] = decode_json(path.read_bytes(), dict[str, object], kind=str(path))
    return record


def _exports(state: Mapping[str, object]) -> list[str]:
    return [
        f"export SGE_ROOT={state['sge_root']}",
        f"export SGE_CELL={state['cell']}",
        f"export SGE_QMASTER_PORT={state['qmaster_port']}",
        f"export SGE_EXECD_PORT={state['execd_port']}",
        f'export PATH={state["bin"]}:"$PATH"',
    ]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gridgate.plugins.sge.cell",
        description="Bring a private one-host Grid Engine cell up in a folder, or down again.",
    )
    parser.add_argument(
        "action",
        choices=("up", "start", "stop", "down", "env"),
        help="up: a new cell in the folder; stop: stop its daemons, keeping its jobs; start: "
        "the stopped cell again (its name, ports, spool and jobs); down: stop it and its jobs "
        "(with --remove, the folder goes too)",
    )
    parser.add_argument(
        "folder",
        nargs="?",
        default=os.environ.get("GRIDGATE_SGE_DIR", DEFAULT_HAND_FOLDER),
        help="where its SGE_ROOT, spool, jobs and logs live (default: $GRIDGATE_SGE_DIR or "
        "%(default)s)",
    )
    parser.add_argument(
        "--remove", action="store_true", help="down: remove the folder too once the cell is down"
    )
    parser.add_argument(
        "--queue",
        action="append",
        default=None,
        help=f"a queue to create (repeat; default: {' and '.join(DEFAULT_QUEUES)})",
    )
    args = parser.parse_args(argv)
    folder = Path(args.folder).resolve()
    saved = folder / "cell.json"
    if args.action == "down":
        begun = time.monotonic()
        down(folder, grace=LEFTOVER_GRACE if args.remove else QMASTER_GRACE)
        if args.remove:
            shutil.rmtree(folder, ignore_errors=True)
        print(
            f"sge: the cell in {folder} is down{' and removed' if args.remove else ''} "
            f"({time.monotonic() - begun:.1f} s)",
            file=sys.stderr,
        )
        return 0
    if args.action == "stop":
        stop_daemons(folder)
        print(f"sge: the cell in {folder} is stopped; its jobs wait for `start`", file=sys.stderr)
        return 0
    if args.action == "start":
        if not saved.exists():
            print(f"sge: no cell in {folder} (bash dev.sh sge up)", file=sys.stderr)
            return 1
        if _pids(folder):
            print(f"sge: the cell in {folder} is running", file=sys.stderr)
        else:
            try:
                SgeCell(folder, watchdog=False).resume()
            except CellError as exc:
                print(f"sge: {exc}", file=sys.stderr)
                return 1
            print(f"sge: the cell in {folder} is up again with its jobs", file=sys.stderr)
        print("\n".join(_exports(_saved(saved))))
        return 0
    if args.action == "env":
        if not saved.exists():
            print(f"sge: no cell in {folder}", file=sys.stderr)
            return 1
        print("\n".join(_exports(_saved(saved))))
        return 0
    if saved.exists() and _pids(folder):
        print(f"sge: a cell is already up in {folder}", file=sys.stderr)
        print("\n".join(_exports(_saved(saved))))
        return 0
    cell = SgeCell(folder, queues=tuple(args.queue or DEFAULT_QUEUES), watchdog=False)
    begun = time.monotonic()
    try:
        cell.start()
    except CellError as exc:
        print(f"sge: {exc}", file=sys.stderr)
        return 1
    # The daemons run in sessions of their own and outlive this command; ``down`` stops them.
    print(
        f"sge: cell {cell.cell_name} up in {folder} ({time.monotonic() - begun:.1f} s; host "
        f"{cell.host}, queues {', '.join(cell.queues)}, qmaster port {cell.qmaster_port}); "
        f"submit as {cell.submit_user}: setpriv --reuid={cell.submit_user} "
        f"--regid={SUBMIT_GROUP} --clear-groups qsub ...; jobs folder {cell.jobs_dir}",
        file=sys.stderr,
    )
    print("\n".join(_exports(_saved(saved))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
