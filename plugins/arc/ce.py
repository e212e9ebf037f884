"""A private NorduGrid ARC CE (A-REX 6) in a folder of its own, for tests, benches and people.

The tests, the benches and people trying the ARC backend start it the same way::

    with ArcCE() as ce:                  # or ArcCE(lrms="slurm", slurm_conf=cluster.conf)
        env = {"PATH": "/usr/bin:/bin", "HOME": home, **ce.env}
        run(["arcsub", "-z", env["ARC_CE_CLIENT_CONF"], "-j", env["ARC_CE_JOBLIST"],
             "-C", ce.url, "-T", "arcrest", "job.xrsl"], 60, env=env)

Everything lives under the folder: a test CA (``arcctl test-ca``), a host certificate for
localhost, a user certificate and proxy, arc.conf and its runtime config, the two arched XML
configs (written here as ``/usr/share/arc/arc-arex-start`` and ``arc-arex-ws-start`` of ARC 6.17
generate them, plus a short info-provider period), control, session and tmp folders, logs and
pid files. Nothing of the machine's own CE is used: not /etc/arc.conf, not
/etc/grid-security, not port 443, not ~/.arc (every client call passes ``-z``).

Bearer tokens (``tokens``, on unless ``ARC_CE_TOKENS=0``): the CE has a private token issuer of
its own (:mod:`.issuer`, an https server on loopback with a certificate from the test CA) and
accepts its tokens when they carry ``compute.create`` (with ``audience``, only those whose ``aud``
is the CE's URL: docs/arc.md, "Checking the audience"). A-REX fetches the issuer's keys over
https and checks the issuer against /etc/grid-security/certificates whatever its config says,
so the HTTPS arched runs in a mount namespace of its own (``unshare -m``) in which the CE's CA
folder is bound over that path: nothing of the machine changes, and no other process sees it.

A-REX runs as root and maps every job to ``nobody``; the folders above the CE's folder must
therefore let other users pass (o+x). ``stop()`` leaves no process behind: besides the two
arched it kills what the fork LRMS leaves running (``arckill`` does not end a fork payload) and,
with the Slurm LRMS, cancels the CE's Slurm jobs.

By hand (``bash dev.sh arc up``)::

    python -m gridgate.plugins.arc.ce up|down|env|status [DIR]
    python -m gridgate.plugins.arc.ce user [DIR] [UNIXUSER]

See shared/reference/arc.md for what the commands print and the traps behind the choices.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import pwd
import re
import resource
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

from gridgate.core.documents import DocumentError
from gridgate.core.model import CommandResult
from gridgate.core.runner import run
from gridgate.core.testing import ancestors, not_traversable
from gridgate.core.watchdog import Watchdog
from gridgate.plugins.arc.documents import CeRecord, arc_conf, ce_record, token_end
from gridgate.plugins.arc.issuer import COMPUTE_SCOPES, Issuer

#: Debian packages the CE needs (dev.sh installs them when missing, under a policy-rc.d guard
#: so that their postinst starts no system A-REX on port 443).
PACKAGES = (
    "nordugrid-arc-arex",
    "nordugrid-arc-client",
    "nordugrid-arc-arcctl",
    "nordugrid-arc-plugins-arcrest",
    "nordugrid-arc-plugins-needed",
)
#: Where a system without dpkg would show each package (program or plugin file).
_PACKAGE_FILES = {
    "nordugrid-arc-arex": "/usr/lib/arc/libarex.so",
    "nordugrid-arc-client": "/usr/bin/arcsub",
    "nordugrid-arc-arcctl": "/usr/sbin/arcctl",
    "nordugrid-arc-plugins-arcrest": "/usr/lib/arc/libaccARCREST.so",
    "nordugrid-arc-plugins-needed": "/usr/lib/arc/libmcctls.so",
}
ARC_LOCATION = Path("/usr")
ARC_LIBEXEC = ARC_LOCATION / "lib" / "arc"
ARC_SHARE = ARC_LOCATION / "share" / "arc"
ARCHED = ARC_LOCATION / "sbin" / "arched"
FIRST_PORT = 18443
#: Ports probed from FIRST_PORT before giving up.
PORT_RANGE = 200
#: Cross-process port reservations (one flock'ed file per port), so that two test processes
#: starting CEs at once, or one CE stopped for a while, never end up on one port.
PORT_LOCKS = Path(tempfile.gettempdir()) / "gridgate-arc-ports"
CA_ID = "gridgate"
#: The first port tried for the CE's token issuer.
ISSUER_FIRST_PORT = 19443
#: Where A-REX looks for the CA of a token issuer, whatever x509_cert_dir says (6.17's key
#: fetch uses a default TLS config): the HTTPS arched sees the CE's CA folder there.
SYSTEM_CA_DIR = Path("/etc/grid-security/certificates")
#: The pilot's token (ARC_CE_TOKEN): seconds it lives, and seconds left below which start()
#: writes a new one (WLCG access tokens live minutes to hours; 6 h is the profile's upper end).
TOKEN_LIFETIME = 6 * 3600
TOKEN_MIN_LEFT = 2 * 3600
PILOT_NAME = "gridgate pilot"
#: A proxy with less than this left is renewed by start() (seconds).
PROXY_MIN_LEFT = 2 * 3600
#: Seconds the grid manager gets to leave its job loop after SIGTERM before SIGKILL (it takes
#: under a second; then it idles ~8 s before exiting, which is cut short: see _stop_arched).
AREX_GRACE = 20.0
#: What the grid manager logs once it has left its job loop after SIGTERM.
GM_LEFT_LOOP = "Exiting jobs processing thread"
#: Seconds a leftover job process gets between SIGTERM and SIGKILL.
LEFTOVER_GRACE = 2.0
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DAEMONS = ("arex-ws", "arex")  # the order they are stopped in
#: What the token issuer's command line names (it is stopped with the daemons).
ISSUER_MODULE = "gridgate.plugins.arc.issuer"
_LOGLEVELS = {"0": "FATAL", "1": "ERROR", "2": "WARNING", "3": "INFO", "4": "VERBOSE", "5": "DEBUG"}
#: What arched-arex-ws logs when its port is taken; it then exits ("Failed to load service
#: side MCCs").
_BIND_FAILED = ("Failed to bind socket", "Failed to start listening")


class CEError(RuntimeError):
    """The CE could not be started (the message says what to fix)."""


def missing_packages() -> list[str]:
    """The Debian packages of :data:`PACKAGES` that are not installed (empty when all are)."""
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return [pkg for pkg in PACKAGES if not Path(_PACKAGE_FILES[pkg]).exists()]
    result = run([dpkg, "-W", "-f", "${Package} ${db:Status-Status}\n", *PACKAGES], 60)
    installed = {
        line.split()[0] for line in result.stdout.splitlines() if line.endswith(" installed")
    }
    return [pkg for pkg in PACKAGES if pkg not in installed]


def _install_hint(missing: Sequence[str]) -> str:
    return (
        f"the private ARC CE needs the Debian packages {' '.join(missing)}: "
        f"apt-get install -y --no-install-recommends {' '.join(PACKAGES)} "
        f"(bash dev.sh test does this, without letting the postinst start a system A-REX)"
    )


def _program(name: str) -> str:
    found = shutil.which(name, path=SYSTEM_PATH + ":" + str(ARC_LIBEXEC))
    if found is None:
        raise CEError(f"{name} is not installed; " + _install_hint(PACKAGES))
    return found


def _client_base_env(home: Path) -> dict[str, str]:
    """The environment of the CE's own client calls: nothing of the caller's X509_* (they
    would override client.conf) and a HOME inside the folder, so nothing lands in the real
    one even if a call forgot ``-z``."""
    return {"PATH": SYSTEM_PATH, "HOME": str(home), "LC_ALL": "C", "LANG": "C"}


# --- ports ---------------------------------------------------------------------------------------


def _port_free(port: int) -> bool:
    """Whether nothing listens on ``port`` (IPv4 and IPv6 wildcards, as arched binds).
    SO_REUSEADDR as a server sets it: connections in TIME_WAIT do not make a port busy."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this machine: arched cannot bind it either
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    continue
                return False
    return True


class _PortLock:
    """An flock on PORT_LOCKS/PORT held by this object: other CEs skip the port."""

    def __init__(self, port: int, fd: int) -> None:
        self.port = port
        self._fd: int | None = fd

    @classmethod
    def take(cls, port: int) -> _PortLock | None:
        PORT_LOCKS.mkdir(mode=0o1777, exist_ok=True)
        with contextlib.suppress(PermissionError):
            os.chmod(PORT_LOCKS, 0o1777)  # another user's folder: theirs to set
        fd = os.open(PORT_LOCKS / str(port), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return cls(port, fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _take_free_port(port: int) -> _PortLock | None:
    """The reservation of ``port``, when no other CE has reserved it and nothing listens on it."""
    lock = _PortLock.take(port)
    if lock is not None and not _port_free(port):
        lock.release()
        return None
    return lock


def _reserve_port(start: int = FIRST_PORT, skip: Sequence[int] = ()) -> _PortLock:
    """The first port from ``start`` that no other CE has reserved and nothing listens on."""
    for port in range(start, start + PORT_RANGE):
        lock = None if port in skip else _take_free_port(port)
        if lock is not None:
            return lock
    raise CEError(
        f"no free port in {start}-{start + PORT_RANGE - 1} for the ARC CE; "
        f"set ARC_CE_PORT (or port=) to a free one"
    )


# --- processes -----------------------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, session, ...]."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return raw[raw.rindex(")") + 2 :].split()


def _gone(pid: int) -> bool:
    """True when ``pid`` is no longer a live process (gone, or a zombie)."""
    fields = _stat_fields(pid)
    return not fields or fields[0] == "Z"


def _identity(pid: int) -> tuple[int, str] | None:
    """(pid, start time): a process that exits and whose pid is reused is another one."""
    fields = _stat_fields(pid)
    return (pid, fields[19]) if len(fields) > 19 and fields[0] != "Z" else None


def _arched_pid(folder: Path, name: str) -> int | None:
    """The live arched of daemon ``name`` named by its pid file (a stale pid reused by
    another process does not name our XML on its command line and is left alone)."""
    try:
        pid = int(Path(folder, "run", f"{name}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    cmdline = _cmdline(pid)
    if "arched" in cmdline and str(folder / "etc" / f"{name}.xml") in cmdline and not _gone(pid):
        return pid
    return None


def _issuer_pid(folder: Path) -> int | None:
    """The live token issuer of the CE in ``folder``, by its pid file (checked as arched's)."""
    try:
        pid = int(Path(folder, "run", "issuer.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    cmdline = _cmdline(pid)
    if ISSUER_MODULE in cmdline and str(folder / "issuer") in cmdline and not _gone(pid):
        return pid
    return None


def _stop_issuer(folder: Path) -> None:
    """Stop the CE's token issuer (SIGTERM; SIGKILL after LEFTOVER_GRACE)."""
    pid = _issuer_pid(folder)
    identity = _identity(pid) if pid is not None else None
    if identity is not None:
        _kill_all({identity}, LEFTOVER_GRACE)
    Path(folder, "run", "issuer.pid").unlink(missing_ok=True)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def _leftovers(folder: Path) -> list[int]:
    """Processes the CE in ``folder`` left: job payloads (cwd inside its session folder), its
    scripts (a command line naming /usr/share/arc/ and the folder: fork-job watchers,
    scan-*-job, CEinfo.pl), job scripts in its tmp folder, what runs in arched's own cwd
    (log/arccore: the helpers' children, such as cancel-fork-job's ``sleep 5``) and any
    arched of its XML."""
    mark = str(folder)
    session, tmp, etc = str(folder / "session"), str(folder / "tmp") + "/", str(folder / "etc")
    core = str(folder / "log" / "arccore")
    spare = ancestors()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        pid = int(entry.name)
        cmdline = _cmdline(pid)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        if not cmdline and not cwd:
            continue
        if (
            _inside(cwd, session)
            or _inside(cwd, core)
            or (str(ARC_SHARE) + "/" in cmdline and mark + "/" in cmdline)
            or tmp in cmdline
            or ("arched" in cmdline and etc + "/" in cmdline)
        ):
            if not _gone(pid):
                found.append(pid)
    return found


def _kill_all(identities: set[tuple[int, str]], grace: float) -> None:
    """SIGTERM each process, SIGKILL after ``grace`` those still there (same start time)."""

    def live() -> set[tuple[int, str]]:
        return {i for i in identities if _identity(i[0]) == i}

    for pid, _start in live():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and live():
        time.sleep(0.05)
    for pid, _start in live():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 5
    while time.monotonic() < end and live():
        time.sleep(0.02)


def sweep(folder: str | os.PathLike[str], *, announce: bool = False) -> list[int]:
    """Kill what the CE in ``folder`` left running (see :func:`_leftovers`); returns the pids.
    Rounds repeat until none is found: a dying watcher may still have started a child."""
    root = Path(folder).resolve()
    killed: list[int] = []
    for _round in range(10):
        pids = _leftovers(root)
        if not pids:
            break
        if announce:
            print(
                f"arc-ce: stopping leftover job processes: {' '.join(map(str, pids))}",
                file=sys.stderr,
            )
        killed += pids
        _kill_all({i for i in map(_identity, pids) if i is not None}, LEFTOVER_GRACE)
    return killed


def _session_members(pid: int) -> set[tuple[int, str]]:
    """Live processes in the session ``pid`` leads (arched's helpers that did not setsid)."""
    members = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if len(fields) > 19 and fields[3] == str(pid) and fields[0] != "Z":
                members.add((int(entry.name), fields[19]))
    return members


def _stop_arched(folder: Path, graces: Mapping[str, float]) -> None:
    """SIGTERM the arched of each daemon (by its recorded pid), arex-ws first; SIGKILL each
    still there after its grace; then the helpers of their sessions that outlived them.
    Both are signalled before either is waited for: arched-arex-ws takes ~2 s to go and the
    grid manager ~8 s, and nothing is gained by waiting for one before the other. The token
    issuer goes last."""
    targets: dict[str, int] = {}
    for name in DAEMONS:
        pid = _arched_pid(folder, name)
        if pid is not None:
            targets[name] = pid
    helpers: set[tuple[int, str]] = set()
    for pid in targets.values():
        helpers |= _session_members(pid)
    helpers = {i for i in helpers if i[0] not in targets.values()}
    gm_log = Path(folder, "log", "arex.log")
    try:
        gm_log_start = gm_log.stat().st_size
    except OSError:
        gm_log_start = 0
    begun = time.monotonic()
    for pid in targets.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    pending = dict(targets)
    left_loop: float | None = None
    while pending:
        if "arex" in pending and left_loop is None and _said(gm_log, gm_log_start, GM_LEFT_LOOP):
            left_loop = time.monotonic()
        for name, pid in list(pending.items()):
            # The grid manager leaves its job loop within a second of SIGTERM; it then
            # idles ~8 s on its data-staging threads before exiting. Its job states are on
            # disk by then: that wait is cut short.
            done_after_loop = (
                name == "arex" and left_loop is not None and time.monotonic() - left_loop > 0.5
            )
            if _gone(pid):
                del pending[name]
            elif done_after_loop or time.monotonic() - begun > graces.get(name, AREX_GRACE):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                end = time.monotonic() + 5
                while time.monotonic() < end and not _gone(pid):
                    time.sleep(0.02)
                del pending[name]
        time.sleep(0.05)
    _kill_all(helpers, LEFTOVER_GRACE)
    for name in DAEMONS:
        Path(folder, "run", f"{name}.pid").unlink(missing_ok=True)
    _stop_issuer(folder)


def _said(log: Path, offset: int, text: str) -> bool:
    """Whether ``log`` got ``text`` after byte ``offset``."""
    try:
        with open(log, "rb") as handle:
            handle.seek(offset)
            return text.encode() in handle.read()
    except OSError:
        return False


def _slurm_localids(folder: Path) -> list[str]:
    """Slurm job ids of the CE's jobs that are not finished (control/job.ID.local)."""
    ids = []
    for local in Path(folder, "control").glob("job.*.local"):
        job = local.name[len("job.") : -len(".local")]
        status = ""
        for sub in ("finished", "processing", "accepting", "restarting", ""):
            path = Path(folder, "control", sub, f"job.{job}.status")
            if path.exists():
                status = path.read_text(errors="replace").strip()
                break
        if status in ("FINISHED", "DELETED"):
            continue
        with contextlib.suppress(OSError):
            for line in local.read_text(errors="replace").splitlines():
                if line.startswith("localid=") and line[8:].strip():
                    ids.append(line[8:].strip())
    return sorted(set(ids))


def _settings(folder: Path) -> CeRecord | None:
    try:
        return ce_record(Path(folder, "etc", "ce.json").read_bytes())
    except (OSError, DocumentError):
        return None


def down(
    folder: str | os.PathLike[str],
    *,
    cancel: bool = True,
    announce: bool = False,
    grace: float = AREX_GRACE,
) -> None:
    """Stop the CE in ``folder``, however it was started: arex-ws, then arex, by recorded pid
    (SIGKILL after ``grace``); with the Slurm LRMS (and ``cancel``) its jobs are cancelled;
    then every leftover process. A missing folder or a stopped CE is no error."""
    root = Path(folder).resolve()
    if not root.is_dir():
        return
    _stop_arched(root, {"arex-ws": min(grace, 10.0), "arex": grace})
    if cancel:
        cancel_slurm_jobs(root)
    sweep(root, announce=announce)


def cancel_slurm_jobs(folder: str | os.PathLike[str]) -> CommandResult | None:
    """``scancel`` the Slurm jobs of the CE in ``folder`` that are not finished (nothing for a
    fork CE). The Slurm cluster may be gone already: the call is bounded."""
    root = Path(folder)
    settings = _settings(root)
    if settings is None or settings.lrms != "slurm" or not settings.slurm_conf:
        return None
    ids = _slurm_localids(root)
    if not ids:
        return None
    scancel = shutil.which("scancel", path=SYSTEM_PATH) or "scancel"
    return run(
        [scancel, *ids],
        20,
        env={"PATH": SYSTEM_PATH, "SLURM_CONF": settings.slurm_conf},
        cwd="/",
    )


def slurm_partitions(slurm_conf: str | os.PathLike[str]) -> list[str]:
    """The partitions a slurm.conf defines, its default partition first."""
    names, default = [], None
    for line in Path(slurm_conf).read_text(errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.match(r"(?i)PartitionName=(\S+)(.*)", line)
        if not match or match.group(1).upper() == "DEFAULT":
            continue
        names.append(match.group(1))
        if re.search(r"(?i)\bDefault=YES\b", match.group(2)):
            default = match.group(1)
    if default is not None:
        names.remove(default)
        names.insert(0, default)
    return names


# --- the CE --------------------------------------------------------------------------------------


class ArcCE:
    """One A-REX (two arched: the grid manager and the HTTPS listener), private to ``folder``.

    ``folder`` (default: a fresh folder in the system's temporary directory, removed by
    ``stop``) holds everything; every folder above it must be world-executable. ``lrms`` is
    ``fork`` or ``slurm``; ``slurm`` needs ``slurm_conf``, the slurm.conf of a running private
    cluster (:class:`gridgate.plugins.slurm.cluster.SlurmCluster`). ``port`` (default: the
    first free one from 18443) is the HTTPS port; ``info_period`` the info provider's period
    and ``wakeup`` the grid manager's, both in seconds (ARC's defaults are 60 and 180; job
    states over REST lag by about the info period). With ``tokens`` (the default) the CE runs
    a token issuer of its own and accepts its bearer tokens that carry ``compute.create``
    (:attr:`issuer`, :meth:`token`); with ``audience`` it admits only those whose ``aud`` is
    (or lists) that string: ``True`` for its own :attr:`audience`, ``https://localhost:PORT``
    (default ``False``: any audience). These settings are fixed when the folder is first set up;
    a CE started again on the same folder keeps its port, its jobs and its credentials. With
    ``watchdog`` (the default) the CE is brought down even when this process dies without
    calling ``stop``.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        lrms: str = "fork",
        slurm_conf: str | os.PathLike[str] | None = None,
        port: int | None = None,
        info_period: int = 10,
        wakeup: int = 10,
        start_timeout: float = 120.0,
        watchdog: bool = True,
        tokens: bool = True,
        issuer_port: int | None = None,
        audience: bool | str = False,
        drain_sessions: bool = False,
        max_walltime: int | None = None,
    ) -> None:
        if lrms not in ("fork", "slurm"):
            raise ValueError(f"lrms must be 'fork' or 'slurm', not {lrms!r}")
        if lrms == "slurm" and slurm_conf is None:
            raise ValueError(
                "lrms='slurm' needs slurm_conf, the private cluster's slurm.conf "
                "(SLURM_CONF; bash dev.sh slurm up prints it)"
            )
        self._own_folder = folder is None
        self._folder = Path(folder).resolve() if folder is not None else None
        self.lrms = lrms
        self.slurm_conf = Path(slurm_conf).resolve() if slurm_conf is not None else None
        self._port = int(port) if port is not None else None
        self._port_given = port is not None
        self.info_period = max(int(info_period), 1)
        self.wakeup = max(int(wakeup), 1)
        self.start_timeout = float(start_timeout)
        self.watchdog = watchdog
        self.tokens = bool(tokens)
        if audience and not tokens:
            raise ValueError("audience needs tokens=True (a CE without tokens checks none)")
        if isinstance(audience, str) and (not audience or any(c.isspace() for c in audience)):
            raise ValueError(f"audience must be a string with no blank, not {audience!r}")
        #: the audience asked for: True (the CE's own URL), a string, or False (any)
        self._audience = audience
        #: its session folder marked ``drain`` in a new arc.conf: A-REX takes no new job, and
        #: its info provider publishes its endpoints draining (a site's drain for a downtime)
        self.drain_sessions = bool(drain_sessions)
        #: ``maxwalltime`` (seconds) of its queues in a new arc.conf: published as the share's
        #: GLUE2 MaxWallTime
        self.max_walltime = max_walltime
        self._issuer_port: int | None = None
        #: the issuer's port asked for (None: the first free one from ISSUER_FIRST_PORT)
        self._issuer_port_given = int(issuer_port) if issuer_port is not None else None
        self._issuer_lock: _PortLock | None = None
        self._lock: _PortLock | None = None
        self._settings_loaded = False
        self._pids: dict[str, int] = {}  # the arched started by the last start()
        self._watchdog: Watchdog | None = None
        #: Seconds the last start() took (None before the first).
        self.last_start_seconds: float | None = None

    # --- paths and environment ------------------------------------------------------------

    def _path(self, *parts: str) -> Path:
        if self._folder is None:
            raise CEError("the CE has no folder yet: start() it first")
        return self._folder.joinpath(*parts)

    @property
    def folder(self) -> Path | None:
        """The CE's folder (None before the first start of a CE with a temporary folder)."""
        return self._folder

    @property
    def port(self) -> int:
        if self._port is None:
            raise CEError("the CE has no port yet: start() it first")
        return self._port

    @property
    def url(self) -> str:
        """The CE's endpoint, ``https://localhost:PORT/arex`` (arcsub -C, arcinfo -c)."""
        return f"https://localhost:{self.port}/arex"

    @property
    def certificates(self) -> Path:
        """The CA folder (X509_CERT_DIR): the test CA, its hash links and signing policy."""
        return self._path("certificates")

    @property
    def usercert(self) -> Path:
        return self._path("user", "usercert.pem")

    @property
    def userkey(self) -> Path:
        return self._path("user", "userkey.pem")

    @property
    def proxy(self) -> Path:
        return self._path("user", "proxy.pem")

    @property
    def client_conf(self) -> Path:
        return self._path("user", "client.conf")

    @property
    def joblist(self) -> Path:
        return self._path("user", "jobs.dat")

    @property
    def arc_conf(self) -> Path:
        return self._path("etc", "arc.conf")

    @property
    def runconfig(self) -> Path:
        return self._path("run", "arex.cfg")

    @property
    def allowed_subjects(self) -> Path:
        """The DNs the CE accepts (its authgroup's file, read per request)."""
        return self._path("etc", "allowed-subjects")

    @property
    def ca_cert(self) -> Path:
        """The test CA's certificate (its key, :attr:`ca_key`, is beside it)."""
        return self.certificates / f"ARC-TestCA-{CA_ID}.pem"

    @property
    def ca_key(self) -> Path:
        return self.certificates / f"ARC-TestCA-{CA_ID}-key.pem"

    @property
    def issuer_url(self) -> str:
        """The ``iss`` of the tokens this CE accepts, ``https://localhost:PORT``."""
        if self._issuer_port is None:
            raise CEError("the CE has no token issuer (tokens=False, or not started yet)")
        return f"https://localhost:{self._issuer_port}"

    @property
    def issuer(self) -> Issuer:
        """The CE's token issuer (:class:`~gridgate.plugins.arc.issuer.Issuer`): its tokens
        with ``compute.create`` are accepted."""
        return Issuer(self._path("issuer"))

    @property
    def token_file(self) -> Path:
        """The pilot's token (ARC_CE_TOKEN): all compute.* scopes, renewed by start()."""
        return self._path("user", "token")

    @property
    def own_audience(self) -> str:
        """The CE's URL as a token's audience, ``https://localhost:PORT`` (the WLCG profile's
        advice): what :meth:`token` puts in ``aud``, and what ``audience=True`` requires."""
        return f"https://localhost:{self.port}"

    @property
    def audience(self) -> str | None:
        """The ``aud`` the CE requires of a token (None: any)."""
        if self._audience is True:
            return self.own_audience
        return self._audience or None

    def token(self, **options: object) -> str:
        """A token of the CE's issuer: :meth:`Issuer.token` with the CE's URL as audience
        (``scope``, ``lifetime``, ``start``, ``claims``... as there)."""
        options.setdefault("aud", self.own_audience)
        return self.issuer.token(**options)  # type: ignore[arg-type]

    @property
    def env(self) -> dict[str, str]:
        """What an ARC client needs to use this CE as the pilot user (arc.md section 2); with
        tokens also ARC_CE_TOKEN (a token file), ARC_CE_ISSUER (its issuer's URL) and
        ARC_CE_ISSUER_DIR (the issuer's folder, for ``python -m gridgate.plugins.arc.issuer
        token``). Never BEARER_TOKEN_FILE: ARC 6.17's client reads it too, and its commands
        then skip their proxy check."""
        found = self._client_vars(self._path("user"))
        if self.tokens:
            found["ARC_CE_TOKEN"] = str(self.token_file)
            found["ARC_CE_ISSUER"] = self.issuer_url
            found["ARC_CE_ISSUER_DIR"] = str(self._path("issuer"))
        return found

    def _client_vars(self, creds: Path) -> dict[str, str]:
        return {
            "X509_USER_PROXY": str(creds / "proxy.pem"),
            "X509_USER_CERT": str(creds / "usercert.pem"),
            "X509_USER_KEY": str(creds / "userkey.pem"),
            "X509_CERT_DIR": str(self.certificates),
            "ARC_CE_URL": self.url,
            "ARC_CE_JOBLIST": str(creds / "jobs.dat"),
            "ARC_CE_CLIENT_CONF": str(creds / "client.conf"),
        }

    def client_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: a minimal one, HOME inside the folder) plus :attr:`env`."""
        return {**(_client_base_env(self._path("user")) if base is None else base), **self.env}

    def command(self, argv: Sequence[str], timeout: float = 60.0) -> CommandResult:
        """Run a client command (argv) as the pilot user; ARC commands still need ``-z``."""
        return run(list(argv), timeout, env=self.client_env(), cwd=str(self._path("user")))

    def log(self, name: str = "arex.log") -> str:
        """A log's text so far: ``arex.log`` (grid manager, job states), ``arex-ws.stdout``
        (the HTTPS side), ``infoprovider.log``, ``arex.stdout``, ``arc-config-check.log``..."""
        path = self._path("log", name)
        return path.read_text(errors="replace") if path.exists() else ""

    def pids(self) -> dict[str, int]:
        """The live arched of each daemon (``arex``, ``arex-ws``) by pid."""
        if self._folder is None:
            return {}
        found = {name: _arched_pid(self._folder, name) for name in DAEMONS}
        return {name: pid for name, pid in found.items() if pid is not None}

    def running(self) -> bool:
        """Whether both arched of this CE are running (says nothing of their answers)."""
        return len(self.pids()) == len(DAEMONS)

    # --- life cycle -------------------------------------------------------------------------

    def __enter__(self) -> ArcCE:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ArcCE:
        """Set the folder up (once), start both arched, return when ``arcinfo`` answers.

        On a running CE it only renews a proxy that has less than two hours left; on a
        stopped one (``stop_service``, ``down``) it starts the daemons again with the same
        port, credentials and jobs."""
        begun = time.monotonic()
        if (
            self._folder is not None
            and not self._settings_loaded
            and self._path("etc", "ce.json").exists()
        ):
            self._load_settings()
        if self.running():
            self._renew_if_short()
            if self.tokens:
                self._renew_token_if_short()
                if _issuer_pid(self._path()) is None:
                    self._start_issuer()
            return self
        missing = missing_packages()
        if missing:
            raise CEError(_install_hint(missing))
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="gridgate-arc-")).resolve()
        try:
            self._prepare_folder()
            if self.watchdog and self._watchdog is None:
                self._start_watchdog()
            fresh = not self.arc_conf.exists()
            if fresh:
                self._claim_port()
                self._write_arc_conf()
            else:
                if not self._settings_loaded:
                    self._load_settings()
                self._claim_existing_port()
            self._credentials()
            tried: list[int] = []
            while True:
                self._configure()
                failure = self._start_daemons()
                if failure is None:
                    break
                tried.append(self.port)
                # Only a new CE may move: a CE with jobs keeps its URL (the job ids name it).
                if failure != "port" or not fresh or self._port_given or len(tried) >= 5:
                    raise CEError(self._start_failure(failure))
                self._stop_daemons(grace=1.0)  # a new CE: no job to let it save
                self._release_port(issuer=False)
                self._lock = _reserve_port(skip=tried)
                self._port = self._lock.port
                self._write_arc_conf()
        except BaseException:
            # Down again, but its Slurm jobs (if any) are left alone: a CE that failed to
            # restart keeps its jobs for the next try.
            self.stop_service()
            self._release_port()
            if self._own_folder:
                shutil.rmtree(self._path(), ignore_errors=True)
            self._stop_watchdog()
            raise
        self.last_start_seconds = time.monotonic() - begun
        return self

    def stop_service(self, grace: float = AREX_GRACE) -> None:
        """Stop the CE's daemons and kill its leftover processes, keeping the folder, the
        port reservation and the jobs: a CE that is down (``start()`` brings it back).
        The grid manager gets up to ``grace`` seconds to leave its job loop (it takes less
        than one), then SIGKILL."""
        self._stop_daemons(grace)
        if self._folder is not None:
            sweep(self._folder)

    def stop(self) -> None:
        """Stop everything: both arched, the Slurm jobs of a Slurm CE, every leftover process;
        remove the folder when it was made here (then the grid manager is not waited for:
        nothing of it is kept)."""
        self._stop_daemons(LEFTOVER_GRACE if self._own_folder else None)
        if self._folder is not None and self._folder.exists():
            with contextlib.suppress(OSError):
                cancel_slurm_jobs(self._folder)
            sweep(self._folder)
        self._release_port()
        if self._own_folder and self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        self._stop_watchdog()

    # --- setting the folder up --------------------------------------------------------------

    def _prepare_folder(self) -> None:
        folder = self._path()
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
        blocked = not_traversable(folder)
        if blocked is not None:
            raise CEError(
                f"{blocked} is not world-executable (mode "
                f"{stat.S_IMODE(os.stat(blocked).st_mode):o}): A-REX maps jobs to nobody, who "
                f"must reach {folder}/session; chmod o+x {blocked} or use another folder"
            )
        for sub in (
            "etc",
            "run",
            "log",
            "control",
            "session",
            "user",
            "users",
            "host",
            "log/arccore",
        ):
            self._path(sub).mkdir(mode=0o755, exist_ok=True)
        self._path("tmp").mkdir(exist_ok=True)
        os.chmod(self._path("tmp"), 0o1777)  # arc-config-check insists on the sticky bit
        self.allowed_subjects.touch(exist_ok=True)

    def _claim_port(self) -> None:
        if self._port_given:
            assert self._port is not None
            self._lock = _take_free_port(self._port)
            if self._lock is None:
                self._release_port()
                raise CEError(
                    f"port {self._port} is busy; choose another (ARC_CE_PORT, port=)"
                    f" or leave it unset for the first free one from {FIRST_PORT}"
                )
        else:
            self._lock = _reserve_port()
            self._port = self._lock.port
        if self.tokens and self._issuer_port_given is not None:
            self._issuer_lock = _take_free_port(self._issuer_port_given)
            if self._issuer_lock is None:
                self._release_port()
                raise CEError(
                    f"port {self._issuer_port_given} for the token issuer is busy; choose "
                    "another (ARC_CE_ISSUER_PORT, issuer_port=) or leave it unset"
                )
            self._issuer_port = self._issuer_lock.port
        elif self.tokens:
            self._issuer_lock = _reserve_port(ISSUER_FIRST_PORT, skip=(self._port,))
            self._issuer_port = self._issuer_lock.port

    def _claim_existing_port(self) -> None:
        if self._lock is None:  # else ours since the first start
            assert self._port is not None
            self._lock = _take_free_port(self._port)
            if self._lock is None:
                self._release_port()
                raise CEError(
                    f"port {self._port} of the CE in {self._folder} is busy (another CE "
                    f"or program holds it); stop that, or rm -r {self._folder} for a new"
                    f" CE on another port"
                )
        if self.tokens and self._issuer_lock is None and _issuer_pid(self._path()) is None:
            assert self._issuer_port is not None
            self._issuer_lock = _take_free_port(self._issuer_port)
            if self._issuer_lock is None:
                self._release_port()
                raise CEError(
                    f"port {self._issuer_port} of the token issuer of the CE in "
                    f"{self._folder} is busy; stop what holds it, or rm -r {self._folder} "
                    f"for a new CE"
                )

    def _release_port(self, *, issuer: bool = True) -> None:
        """Release the reservation of the CE's port (and of the issuer's, with ``issuer``)."""
        locks = [self._lock, self._issuer_lock if issuer else None]
        self._lock = None
        if issuer:
            self._issuer_lock = None
        for lock in locks:
            if lock is not None:
                lock.release()

    def _load_settings(self) -> None:
        """A CE set up before keeps its settings (arc.conf is written once)."""
        settings = _settings(self._path())
        if settings is None:
            raise CEError(
                f"{self.arc_conf} exists but {self._path('etc', 'ce.json')} does "
                f"not: the folder was not set up by this module; rm -r it"
            )
        if self._port_given and settings.port != self._port:
            raise CEError(
                f"the CE in {self._folder} runs on port {settings.port}, not "
                f"{self._port}; rm -r {self._folder} for a new CE"
            )
        if settings.lrms != self.lrms:
            raise CEError(
                f"the CE in {self._folder} was set up with lrms={settings.lrms}, "
                f"not {self.lrms}; rm -r {self._folder} for a new CE"
            )
        self._port = settings.port
        self._settings_loaded = True
        self.info_period = settings.info_period
        self.wakeup = settings.wakeup
        self.tokens = settings.tokens
        self._issuer_port = settings.issuer_port if self.tokens else None
        self._audience = settings.audience if self.tokens else False
        if settings.slurm_conf:
            self.slurm_conf = Path(settings.slurm_conf)

    def _write_arc_conf(self) -> None:
        p = self._path
        queues: list[str] = ["fork"]
        lrms = ["[lrms]", "lrms = fork"]
        if self.lrms == "slurm":
            assert self.slurm_conf is not None
            if not self.slurm_conf.exists():
                raise CEError(
                    f"{self.slurm_conf} does not exist: start the private Slurm "
                    f"cluster first (SlurmCluster().start(), bash dev.sh slurm up)"
                )
            queues = slurm_partitions(self.slurm_conf)
            if not queues:
                raise CEError(f"{self.slurm_conf} defines no partition")
            sbatch = shutil.which("sbatch", path=SYSTEM_PATH)
            if sbatch is None:
                raise CEError("sbatch is not installed (apt-get install slurm-client)")
            # No slurmdbd behind the private cluster: sacct would only fail.
            lrms = [
                "[lrms]",
                "lrms = slurm",
                f"slurm_bin_path = {Path(sbatch).parent}",
                "slurm_use_sacct = no",
                "slurm_wakeupperiod = 5",
            ]
        # Tokens: an authgroup of the tokens of our issuer that carry compute.create, mapped and
        # allowed like the DN group. Several authtokens lines would be OR'ed, and 6.17 knows
        # no per-operation scopes (any member may create, read, modify and cancel), so the one
        # scope that admits a client is compute.create. An audience asked for is the rule's
        # third field: A-REX compares it as a string with each of the token's aud values.
        tokens_group, tokens_map, tokens_block, allowed = [], [], [], ["allowaccess = pilots"]
        if self.tokens:
            tokens_group = [
                "[authgroup:tokens]",
                f"authtokens = * {self.issuer_url} {self.audience or '*'} compute.create *",
                "",
            ]
            tokens_map = ["map_to_user = tokens nobody:nogroup"]
            tokens_block = ["[authtokens]", ""]
            allowed.append("allowaccess = tokens")
        lines = [
            "# A private ARC CE for gridgate's tests (gridgate.plugins.arc.ce): do not edit;",
            "# rm -r the folder for a new CE.",
            "[common]",
            "hostname = localhost",
            f"x509_host_key = {p('host', 'hostkey.pem')}",
            f"x509_host_cert = {p('host', 'hostcert.pem')}",
            f"x509_cert_dir = {self.certificates}",
            "",
            "[authgroup:pilots]",
            f"file = {self.allowed_subjects}",
            "",
            *tokens_group,
            "[mapping]",
            "map_to_user = pilots nobody:nogroup",
            *tokens_map,
            "",
            *tokens_block,
            *lrms,
            "",
            "[arex]",
            f"controldir = {p('control')}",
            f"sessiondir = {p('session')}" + (" drain" if self.drain_sessions else ""),
            f"tmpdir = {p('tmp')}",
            f"logfile = {p('log', 'arex.log')}",
            f"joblog = {p('log', 'arex-jobs.log')}",
            f"helperlog = {p('log', 'job.helper.errors')}",
            f"pidfile = {p('run', 'arex.pid')}",
            f"wakeupperiod = {self.wakeup}",
            "",
            "[arex/ws]",
            f"wsurl = {self.url}",
            f"logfile = {p('log', 'ws-interface.log')}",
            f"pidfile = {p('run', 'arex-ws.pid')}",
            "",
            "[arex/ws/jobs]",
            *allowed,
            "",
            "[infosys]",
            f"logfile = {p('log', 'infoprovider.log')}",
            "",
            "[infosys/glue2]",
            "",
            "[infosys/cluster]",
            "",
        ]
        for queue in queues:
            limit = [] if self.max_walltime is None else [f"maxwalltime = {self.max_walltime}"]
            lines += [f"[queue:{queue}]", *limit, ""]
        self.arc_conf.write_text("\n".join(lines), encoding="utf-8")
        settings = {
            "port": self._port,
            "lrms": self.lrms,
            "info_period": self.info_period,
            "wakeup": self.wakeup,
            "slurm_conf": str(self.slurm_conf) if self.slurm_conf else None,
            "queues": queues,
            "tokens": self.tokens,
            "issuer_port": self._issuer_port,
            "audience": self._audience,
        }
        self._path("etc", "ce.json").write_text(json.dumps(settings, indent=1) + "\n")
        self._settings_loaded = True

    def _arcctl(self, args: Sequence[str], cwd: Path) -> CommandResult:
        # No ARC_CONFIG, no -c: arcctl then reads its cached parse of the system's arc.conf
        # (read only); with either it would save our config over /run/arc/arcctl.runtime.conf.
        result = run(
            [
                _program("arcctl"),
                "test-ca",
                "--ca-dir",
                str(self.certificates),
                "--ca-id",
                CA_ID,
                *args,
            ],
            120,
            env={"PATH": SYSTEM_PATH, "LC_ALL": "C"},
            cwd=str(cwd),
        )
        if not result.ok:
            raise CEError(
                f"arcctl test-ca {' '.join(args)}: {result.describe()}: "
                f"{(result.stdout + result.stderr).strip()[-2000:]}"
            )
        return result

    def _issue(self, kind: str, name: str, into: Path, cert: str, key: str) -> None:
        """A certificate and key from the test CA, saved as ``into/cert`` and ``into/key``."""
        work = Path(tempfile.mkdtemp(prefix=".issue-", dir=into))
        try:
            extra = ["--no-auth"] if kind == "usercert" else []  # not /etc/grid-security's list
            self._arcctl([kind, "-n", name, "-v", "365", *extra], work)
            certs, keys = list(work.glob("*-cert.pem")), list(work.glob("*-key.pem"))
            if len(certs) != 1 or len(keys) != 1:
                raise CEError(f"arcctl test-ca {kind} left {sorted(os.listdir(work))} in {work}")
            os.chmod(keys[0], 0o400)
            os.chmod(certs[0], 0o644)
            os.replace(keys[0], into / key)
            os.replace(certs[0], into / cert)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _credentials(self) -> None:
        """The test CA, the host certificate, the pilot's certificate and proxy (each once)."""
        if not any(self.certificates.glob("*.0")):
            self.certificates.mkdir(mode=0o755, exist_ok=True)
            self._arcctl(["init", "-v", "365"], self._path())
        if not self._path("host", "hostcert.pem").exists():
            self._issue("hostcert", "localhost", self._path("host"), "hostcert.pem", "hostkey.pem")
        user = self._path("user")
        if not self.usercert.exists():
            self._issue("usercert", PILOT_NAME, user, "usercert.pem", "userkey.pem")
        self._allow(self.usercert)
        self._write_client_conf(user)
        self._renew_if_short()
        if self.tokens:
            Issuer.create(
                self._path("issuer"), self.issuer_url, ca_cert=self.ca_cert, ca_key=self.ca_key
            )
            self._renew_token_if_short()

    def token_seconds_left(self) -> float:
        """Seconds the pilot's token (:attr:`token_file`) has left; 0 when expired or missing."""
        try:
            ends = token_end(self.token_file.read_text().strip())
        except (OSError, DocumentError):
            return 0.0
        return max(ends - time.time(), 0.0) if ends is not None else 0.0

    def renew_token(self, lifetime: float = TOKEN_LIFETIME) -> Path:
        """Write the pilot's token afresh (all compute.* scopes, ``lifetime`` seconds)."""
        return self.issuer.write_token(
            self.token_file,
            scope=COMPUTE_SCOPES,
            aud=f"https://localhost:{self.port}",
            lifetime=lifetime,
        )

    def _renew_token_if_short(self) -> None:
        if self.token_seconds_left() < TOKEN_MIN_LEFT:
            self.renew_token()

    def _write_client_conf(self, creds: Path) -> None:
        """client.conf naming the credentials and the CA folder (-z FILE). ARC 6.17 knows no
        joblist here ("Unknown attribute"): callers pass -j ARC_CE_JOBLIST."""
        v = self._client_vars(creds)
        text = (
            "[common]\n"
            f"certificatepath={v['X509_USER_CERT']}\n"
            f"keypath={v['X509_USER_KEY']}\n"
            f"proxypath={v['X509_USER_PROXY']}\n"
            f"cacertificatesdirectory={v['X509_CERT_DIR']}\n"
        )
        (creds / "client.conf").write_text(text, encoding="utf-8")

    def _allow(self, cert: Path) -> str:
        """Add the certificate's DN to the CE's allowed subjects (once); return the DN."""
        result = run(
            [
                _program("openssl"),
                "x509",
                "-in",
                str(cert),
                "-noout",
                "-subject",
                "-nameopt",
                "compat",
            ],
            30,
            env={"PATH": SYSTEM_PATH},
        )
        if not result.ok or not result.stdout.startswith("subject="):
            raise CEError(f"openssl x509 -subject {cert}: {result.describe()}: {result.stderr}")
        dn = result.stdout.strip()[len("subject=") :].strip()
        line = f'"{dn}"'
        known = self.allowed_subjects.read_text().splitlines()
        if line not in known:
            with open(self.allowed_subjects, "a", encoding="utf-8") as out:
                out.write(line + "\n")
        return dn

    def _arcproxy(self, creds: Path, path: Path, constraints: Sequence[str]) -> None:
        argv = [
            _program("arcproxy"),
            "-z",
            str(creds / "client.conf"),
            "-C",
            str(creds / "usercert.pem"),
            "-K",
            str(creds / "userkey.pem"),
            "-T",
            str(self.certificates),
            "-P",
            str(path),
        ]
        for constraint in constraints:
            argv += ["-c", constraint]
        result = run(argv, 60, env=_client_base_env(creds), cwd=str(creds))
        if not result.ok:
            raise CEError(
                f"arcproxy: {result.describe()}: {(result.stdout + result.stderr).strip()}"
            )

    def proxy_seconds_left(self, path: str | os.PathLike[str] | None = None) -> int:
        """Seconds a proxy (default: the pilot's) has left; 0 when expired or missing."""
        proxy = Path(path) if path is not None else self.proxy
        if not proxy.exists():
            return 0
        result = run(
            [
                _program("arcproxy"),
                "-z",
                str(self.client_conf),
                "-P",
                str(proxy),
                "-i",
                "validityLeft",
            ],
            60,
            env=_client_base_env(self._path("user")),
            cwd=str(self._path("user")),
        )
        try:
            return int(result.stdout.split()[0]) if result.ok else 0
        except (ValueError, IndexError):
            return 0

    def renew_proxy(self, validity: str = "24H") -> Path:
        """Make the pilot's proxy afresh, valid for ``validity`` (arcproxy's validityPeriod:
        ``24H``, ``90M``, ``3600``...)."""
        self._arcproxy(self._path("user"), self.proxy, [f"validityPeriod={validity}"])
        return self.proxy

    def _renew_if_short(self) -> None:
        if self.proxy_seconds_left() < PROXY_MIN_LEFT:
            self.renew_proxy()

    def make_proxy(
        self,
        path: str | os.PathLike[str],
        *,
        start: dt.datetime | str | None = None,
        end: dt.datetime | str | None = None,
        validity: str = "24H",
    ) -> Path:
        """An extra proxy of the pilot's certificate at ``path``, e.g. an expired one::

            ce.make_proxy(tmp / "old.pem", start=now - timedelta(hours=2),
                          end=now - timedelta(hours=1))

        ``start``/``end`` are datetimes (naive ones are UTC) or arcproxy's own text
        (``2026-12-01T10:00:00Z``); without ``end`` the proxy lasts ``validity``."""

        def text(when: dt.datetime | str) -> str:
            if isinstance(when, str):
                return when
            if when.tzinfo is not None:
                when = when.astimezone(dt.UTC).replace(tzinfo=None)
            return when.strftime("%Y-%m-%dT%H:%M:%SZ")

        constraints = []
        if start is not None:
            constraints.append(f"validityStart={text(start)}")
        constraints.append(
            f"validityEnd={text(end)}" if end is not None else f"validityPeriod={validity}"
        )
        target = Path(path).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        self._arcproxy(self._path("user"), target, constraints)
        return target

    def add_user(self, unix_user: str) -> dict[str, str]:
        """Credentials for another unix user: a certificate "gridgate USER" from the test CA,
        a proxy and a client.conf in ``users/USER`` (mode 0700, owned by the user), its DN
        added to the CE's allowed subjects (read per request: no restart). Returns that
        user's :attr:`env`. Calling it again renews a short proxy and changes nothing else."""
        try:
            entry = pwd.getpwnam(unix_user)
        except KeyError:
            raise CEError(f"no unix user {unix_user!r}") from None
        creds = self._path("users", unix_user)
        creds.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self._path("users"), 0o755)
        if not (creds / "usercert.pem").exists():
            self._issue("usercert", f"gridgate {unix_user}", creds, "usercert.pem", "userkey.pem")
        self._allow(creds / "usercert.pem")
        self._write_client_conf(creds)
        if self.proxy_seconds_left(creds / "proxy.pem") < PROXY_MIN_LEFT:
            self._arcproxy(creds, creds / "proxy.pem", ["validityPeriod=24H"])
        for path in (creds, *creds.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        os.chmod(creds, 0o700)
        return self._client_vars(creds)

    # --- arched -----------------------------------------------------------------------------

    def _configure(self) -> None:
        """The runtime config (arcconfig-parser), the validator, DH params and both XMLs."""
        parser = str(ARC_LIBEXEC / "arcconfig-parser")
        env = {"PATH": SYSTEM_PATH, "LC_ALL": "C"}
        saved = run(
            [parser, "--config", str(self.arc_conf), "--runconfig", str(self.runconfig), "--save"],
            60,
            env=env,
        )
        if not saved.ok:
            raise CEError(
                f"arcconfig-parser could not process {self.arc_conf}: "
                f"{saved.describe()}: {(saved.stdout + saved.stderr).strip()}"
            )
        loaded = run(
            [parser, "--runconfig", str(self.runconfig), "--load", "--export", "json"], 60, env=env
        )
        try:
            conf = arc_conf(loaded.stdout)
        except DocumentError:
            raise CEError(
                f"arcconfig-parser --export json: {loaded.describe()}: {loaded.stderr.strip()}"
            ) from None
        check = run(
            [str(ARC_LIBEXEC / "arc-config-check"), "--config", str(self.arc_conf)], 60, env=env
        )
        self._path("log", "arc-config-check.log").write_text(check.stdout + check.stderr)
        if not check.ok:
            raise CEError(
                f"arc-config-check rejects {self.arc_conf} ({check.describe()}):\n"
                + "\n".join(
                    ln
                    for ln in (check.stdout + check.stderr).splitlines()
                    if "ERROR" in ln or "failure" in ln
                )
            )
        self._dhparam(Path(conf["arex"]["controldir"]) / "dhparam.pem")
        self._path("etc", "arex.xml").write_text(_arex_xml(conf, self.runconfig, self.info_period))
        self._path("etc", "arex-ws.xml").write_text(_arex_ws_xml(conf, self.runconfig))

    def _dhparam(self, path: Path) -> None:
        """RFC 7919's ffdhe2048 group: instant, where the start script's ``openssl dhparam
        4096`` takes minutes of CPU in the background."""
        openssl = _program("openssl")
        if (
            path.exists()
            and run(
                [openssl, "dhparam", "-in", str(path), "-check", "-noout"],
                30,
                env={"PATH": SYSTEM_PATH},
            ).ok
        ):
            return
        path.unlink(missing_ok=True)
        made = run(
            [
                openssl,
                "genpkey",
                "-genparam",
                "-algorithm",
                "DH",
                "-pkeyopt",
                "group:ffdhe2048",
                "-out",
                str(path),
            ],
            60,
            env={"PATH": SYSTEM_PATH},
        )
        if not made.ok:
            raise CEError(f"openssl genpkey -genparam: {made.describe()}: {made.stderr}")
        os.chmod(path, 0o600)

    def _daemon_env(self, conf: dict) -> dict[str, str]:
        """What the start scripts export before ``exec arched``, plus ARC_CONFIG (the LRMS
        scripts fall back to /etc/arc.conf without it) and SLURM_CONF for a Slurm CE."""
        common = conf["common"]
        staging = conf.get("arex/data-staging", {})  # not config: arc.conf, as ARC parsed it
        ports = "9000,9300"  # the start scripts' default of both ranges
        tcp = staging.get("globus_tcp_port_range", ports)  # not config: arc.conf
        udp = staging.get("globus_udp_port_range", ports)  # not config: arc.conf
        env = {
            "PATH": SYSTEM_PATH,
            "HOME": str(self._path("run")),
            "LC_ALL": "C",
            "MALLOC_ARENA_MAX": "2",
            "GLOBUS_LOCATION": str(ARC_LOCATION),
            "ARC_LOCATION": str(ARC_LOCATION),
            "LD_LIBRARY_PATH": f"{ARC_LOCATION}/lib:{ARC_LOCATION}/lib64",
            "X509_USER_CERT": common["x509_host_cert"],
            "X509_USER_KEY": common["x509_host_key"],
            "X509_CERT_DIR": common["x509_cert_dir"],
            "GLOBUS_TCP_PORT_RANGE": tcp,
            "GLOBUS_UDP_PORT_RANGE": udp,
            "HOSTNAME": common.get("hostname", "localhost"),  # not config: arc.conf
            "TMPDIR": conf["arex"]["tmpdir"],
            "ARC_CONFIG": str(self.runconfig),
        }
        if self.lrms == "slurm" and self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def _start_daemons(self) -> str | None:
        """Start both arched and wait for arcinfo; None when the CE answers, else why not:
        ``port`` (arched-arex-ws could not listen), ``exited`` or ``timeout``."""
        loaded = run(
            [
                str(ARC_LIBEXEC / "arcconfig-parser"),
                "--runconfig",
                str(self.runconfig),
                "--load",
                "--export",
                "json",
            ],
            60,
            env={"PATH": SYSTEM_PATH},
        )
        try:
            env = self._daemon_env(arc_conf(loaded.stdout))
        except DocumentError:
            raise CEError(
                f"arcconfig-parser --export json: {loaded.describe()}: {loaded.stderr.strip()}"
            ) from None
        if self.tokens:
            self._start_issuer()
        for name in ("arex", "arex-ws"):
            argv = [str(ARCHED), "-f", "-c", str(self._path("etc", f"{name}.xml"))]
            if name == "arex-ws" and self.tokens:
                argv = self._in_private_ca_namespace(argv)
            pid = self._launch(name, argv, env)
            self._pids[name] = pid
            # As the start scripts' `ulimit -S -n $(ulimit -H -n)`.
            with contextlib.suppress(OSError, ValueError):
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
        return self._wait_ready()

    def _launch(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
        """Start ``argv`` as daemon ``name`` (stdout in log/NAME.stdout, pid in run/NAME.pid,
        cwd log/arccore) and return its pid.

        It is started by a launcher that exits at once, so it is no descendant of this
        process: arched's helpers (scan-*-job, CEinfo.pl) come and go all the time, and a test
        that checks it left no child running would count them. arched -f writes no PidFile of
        its own: the launcher records the pid for stop() and down()."""
        stdout = self._path("log", f"{name}.stdout")
        with contextlib.suppress(OSError):
            if stdout.stat().st_size > 0:  # keep the previous run's for a look
                os.replace(stdout, stdout.with_suffix(".stdout.old"))
        pidfile = self._path("run", f"{name}.pid")
        pidfile.unlink(missing_ok=True)
        launched = run(
            [
                sys.executable,
                "-c",
                _LAUNCHER,
                str(stdout),
                str(pidfile),
                str(self._path("log", "arccore")),
                *argv,
            ],
            60,
            env=dict(env),
            cwd="/",
        )
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            raise CEError(
                f"could not start {name}: {launched.describe()}: {launched.stderr.strip()}"
            ) from None

    def _in_private_ca_namespace(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in a mount namespace of its own in which the CE's CA folder is bound
        over /etc/grid-security/certificates: A-REX 6.17 checks a token issuer's certificate
        there (its key fetch uses a default TLS config), and the issuer's is from the test CA.
        Nothing outside the namespace sees the bind; it ends with the process."""
        if not SYSTEM_CA_DIR.is_dir():
            # the bind needs a folder to cover; the package's postinst makes this one
            SYSTEM_CA_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        return [
            _program("unshare"),
            "--mount",
            "--propagation",
            "private",
            "--",
            sys.executable,
            "-c",
            _BIND_THEN_EXEC,
            _program("mount"),
            str(self.certificates),
            str(SYSTEM_CA_DIR),
            *argv,
        ]

    def _start_issuer(self) -> None:
        """Start the CE's token issuer (``python -m gridgate.plugins.arc.issuer serve``) and
        wait until it listens."""
        folder = self._path()
        _stop_issuer(folder)
        argv = [sys.executable, "-m", ISSUER_MODULE, "serve", str(self._path("issuer"))]
        argv += ["--log", str(self._path("log", "issuer.log"))]
        # the launcher's own Python finds gridgate as this one does
        env = {"PATH": SYSTEM_PATH, "LC_ALL": "C", "HOME": str(self._path("run"))}
        pid = self._launch("issuer", argv, env)
        port = self.issuer.port
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if _gone(pid):
                break
            with contextlib.suppress(OSError), socket.create_connection(("localhost", port), 1):
                return
            time.sleep(0.05)
        tail = "\n".join(self.log("issuer.stdout").splitlines()[-10:])
        raise CEError(f"the CE's token issuer did not listen on localhost:{port}:\n{tail}")

    def _wait_ready(self) -> str | None:
        end = time.monotonic() + self.start_timeout
        listening = f"Listening on TCP port {self.port}"
        argv = [_program("arcinfo"), "-z", str(self.client_conf), "-t", "10", "-c", self.url]
        while time.monotonic() < end:
            for name, pid in self._pids.items():
                if _gone(pid):
                    if name == "arex-ws" and any(
                        m in self.log("arex-ws.stdout") for m in _BIND_FAILED
                    ):
                        return "port"
                    return "exited"
            said = self.log("arex-ws.stdout")
            if any(m in said for m in _BIND_FAILED):
                return "port"
            # Ask only once our arched listens: on a port taken by something else, arcinfo
            # would talk to that (and may hang there for its whole timeout).
            if listening in said:
                result = run(
                    argv,
                    max(min(end - time.monotonic(), 20.0), 1.0),
                    env=_client_base_env(self._path("user")),
                    cwd=str(self._path("user")),
                )
                if "Computing service:" in result.stdout:
                    return None
                time.sleep(0.3)
            else:
                time.sleep(0.05)
        return "timeout"

    def _start_failure(self, why: str) -> str:
        said = {
            "port": f"arched could not listen on port {self.port}",
            "exited": "an arched exited",
            "timeout": f"arcinfo -c {self.url} did not answer 'Computing service:' "
            f"within {self.start_timeout:.0f} s",
        }[why]
        tail = "".join(
            f"\n--- {name} (last lines) ---\n" + "\n".join(self.log(name).splitlines()[-25:])
            for name in ("arex-ws.stdout", "arex.stdout", "arex.log", "infoprovider.log")
        )
        return f"the ARC CE in {self._folder} did not come up: {said}{tail}"

    def _stop_daemons(self, grace: float | None = None) -> None:
        """arex-ws, then arex; ``grace`` bounds the wait of each before SIGKILL."""
        if self._folder is None:
            return
        graces = {"arex-ws": 10.0, "arex": AREX_GRACE}
        if grace is not None:
            graces = {name: min(grace, value) for name, value in graces.items()}
        self._pids = {}
        _stop_arched(self._folder, graces)

    # --- watchdog ---------------------------------------------------------------------------

    def _start_watchdog(self) -> None:
        """Core's watchdog brings the CE down (``down``, and removes a folder made here) if
        this process dies without ``stop`` (SIGKILL, ``os._exit`` of a test timeout)."""
        folder = self._path()
        teardown = [sys.executable, "-m", "gridgate.plugins.arc.ce", "down", str(folder)]
        teardown += ["--remove"] if self._own_folder else []
        self._watchdog = Watchdog(teardown, only_if=folder, stop_timeout=90).start()

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            # it finds the CE already down (its folder gone, when made here) and exits
            watchdog.stop()


# Started as ``python -c _LAUNCHER STDOUT PIDFILE CWD ARGV...``: starts ARGV in a session of
# its own, records its pid and exits, leaving it to init.
_LAUNCHER = r"""
import os, subprocess, sys
stdout, pidfile, cwd, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with open(stdout, "ab") as out:
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            cwd=cwd, start_new_session=True, close_fds=True)
with open(pidfile + ".new", "w") as f:
    f.write(f"{proc.pid}\n")
os.replace(pidfile + ".new", pidfile)
"""


# Run as ``python -c _BIND_THEN_EXEC MOUNT SOURCE TARGET ARGV...`` inside ``unshare --mount``:
# binds SOURCE over TARGET in that namespace, then becomes ARGV (same pid).
_BIND_THEN_EXEC = r"""
import os, subprocess, sys
mount, source, target, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
subprocess.run([mount, "--bind", source, target], check=True)
os.execv(argv[0], argv)
"""


# --- the two arched XML configs, as ARC 6.17's start scripts write them -------------------------


def _x(value: object) -> str:
    return escape(str(value))


def _common_xml(conf: dict) -> tuple[str, str, str]:
    arex = conf["arex"]
    level = _LOGLEVELS.get(str(arex.get("loglevel", "3")), "INFO")  # not config: arc.conf
    watchdog = "true" if arex.get("watchdog") == "yes" else "false"
    mail = f"<serviceMail>{_x(arex['mail'])}</serviceMail>" if arex.get("mail") else ""
    return level, watchdog, mail


def _arex_xml(conf: dict, runconfig: Path, info_period: int) -> str:
    """arc-arex-start's AREXCFG (the grid manager), plus InfoproviderWakeupPeriod: in tenths
    of a second (A-REX waits value x 100 ms; its default 600 is the 60 s)."""
    arex = conf["arex"]
    level, watchdog, mail = _common_xml(conf)
    endpoint = ""
    if "arex/ws" in conf:
        endpoint = f"<arex:endpoint>{_x(conf['arex/ws']['wsurl'])}</arex:endpoint>"
    return f"""<?xml version="1.0"?>
<ArcConfig
  xmlns="http://www.nordugrid.org/schemas/ArcConfig/2007"
  xmlns:arex="http://www.nordugrid.org/schemas/a-rex/Config">
  <Server>
    <PidFile>{_x(arex["pidfile"])}</PidFile>
    <Logger>
      <File>{_x(arex["logfile"])}</File>
      <Level>{level}</Level>
    </Logger>
    <Watchdog>{watchdog}</Watchdog>
  </Server>
  <ModuleManager>
    <Path>{ARC_LIBEXEC}/</Path>
  </ModuleManager>
  <Plugins><Name>arex</Name></Plugins>
  <Chain>
    <Service name="a-rex" id="a-rex">
      {mail}
      {endpoint}
      <arex:gmconfig>{_x(runconfig)}</arex:gmconfig>
      <arex:InfoproviderWakeupPeriod>{int(info_period) * 10}</arex:InfoproviderWakeupPeriod>
    </Service>
  </Chain>
</ArcConfig>
"""


def _arex_ws_xml(conf: dict, runconfig: Path) -> str:
    """arc-arex-ws-start's AREXCFGWSS (HTTPS: REST and EMI-ES, ``gmrun`` none)."""
    common, ws = conf["common"], conf["arex/ws"]
    level, watchdog, mail = _common_xml(conf)
    wsurl = ws["wsurl"]
    match = re.match(r"^(https?)://([^:/]*)(?::([^/]*))?(/.*)?$", wsurl)
    if match is None or match.group(1) != "https":
        raise CEError(f"wsurl {wsurl!r}: this CE speaks https only")
    port = match.group(3) or "443"
    path = match.group(4) or "/"
    mapping = ""
    if "mapping" in conf:
        mapping = f"""
<!-- Perform client mapping according to rules of gridftpd -->
<SecHandler name="arclegacy.map" event="incoming">
  <ConfigBlock>
    <ConfigFile>{_x(runconfig)}</ConfigFile>
    <BlockName>mapping</BlockName>
  </ConfigBlock>
</SecHandler>"""
    plexer = f'<next id="a-rex">^{_x(path)}</next>' if "arex/ws/jobs" in conf else ""
    order = ' ServerOrder="true"' if ws.get("tlsserverorder") == "yes" else ""
    tls = f"<Ciphers{order}>{_x(ws.get('tlsciphers', ''))}</Ciphers>"  # not config: arc.conf
    if ws.get("tlsprotocols"):
        tls += f"\n      <Protocol>{_x(ws['tlsprotocols'])}</Protocol>"
    if ws.get("tlscurve"):
        tls += f"\n      <Curve>{_x(ws['tlscurve'])}</Curve>"
    tls += (
        f"\n      <DHParamFile>{_x(Path(conf['arex']['controldir']) / 'dhparam.pem')}</DHParamFile>"
    )
    voms = common.get("voms_processing", "standard")  # not config: arc.conf, as ARC parsed it
    tokens_plugin = tokens_handler = ""
    if "authtokens" in conf:
        tokens_plugin = "<Plugins><Name>arcshcotokens</Name></Plugins>"
        tokens_handler = (
            "\n<!-- Collect OTokens information -->\n"
            '<SecHandler name="otokens.handler" event="incoming"/>'
        )
    return f"""<?xml version="1.0"?>
<ArcConfig
  xmlns="http://www.nordugrid.org/schemas/ArcConfig/2007"
  xmlns:tcp="http://www.nordugrid.org/schemas/ArcMCCTCP/2007"
  xmlns:arex="http://www.nordugrid.org/schemas/a-rex/Config"
  xmlns:candypond="urn:candypond_config">
  <Server>
    <PidFile>{_x(ws["pidfile"])}</PidFile>
    <Logger>
      <File>{_x(ws["logfile"])}</File>
      <Level>{level}</Level>
    </Logger>
    <Watchdog>{watchdog}</Watchdog>
  </Server>
  <ModuleManager>
    <Path>{ARC_LIBEXEC}/</Path>
  </ModuleManager>
  <Plugins><Name>mcctcp</Name></Plugins>
  <Plugins><Name>mcctls</Name></Plugins>
  <Plugins><Name>mcchttp</Name></Plugins>
  <Plugins><Name>mccsoap</Name></Plugins>
  <Plugins><Name>arex</Name></Plugins>
  <Plugins><Name>identitymap</Name></Plugins>
  <Plugins><Name>arcshc</Name></Plugins>
  <Plugins><Name>arcshclegacy</Name></Plugins>
  {tokens_plugin}
  <Chain>
    <Component name="tcp.service" id="tcp">
      <next id="tls"/>
      <tcp:Listen><tcp:Port>{_x(port)}</tcp:Port></tcp:Listen>
    </Component>
    <Component name="tls.service" id="tls">
      <next id="http"/>
      <KeyPath>{_x(common["x509_host_key"])}</KeyPath>
      <CertificatePath>{_x(common["x509_host_cert"])}</CertificatePath>
      <CACertificatesDir PolicyGlobus="true">{_x(common["x509_cert_dir"])}</CACertificatesDir>
      <VOMSProcessing>{_x(voms)}</VOMSProcessing>
      <ClientAuthn>false</ClientAuthn>
      {tls}
    </Component>
    <Component name="http.service" id="http">
      <next id="soap">POST</next>
      <next id="plexer"/>{tokens_handler}
      <!-- Make dumb security probes happy -->
      <Header>Strict-Transport-Security: max-age=31536000; includeSubDomains</Header>
      <!-- Match client to legacy authorization groups -->
      <SecHandler name="arclegacy.handler" event="incoming">
        <ConfigFile>{_x(runconfig)}</ConfigFile>
      </SecHandler>
    </Component>
    <Component name="soap.service" id="soap">
      <next id="plexer"/>
      <ContinueNonSOAP>true</ContinueNonSOAP>
    </Component>
    <Plexer name="plexer.service" id="plexer">
      {plexer}
    </Plexer>
    <Service name="a-rex" id="a-rex">
      {mail}{mapping}
      <arex:endpoint>{_x(wsurl)}</arex:endpoint>
      <arex:gmconfig>{_x(runconfig)}</arex:gmconfig>
      <arex:gmrun>none</arex:gmrun>
      <arex:InfosysInterfaceMaxClients>{_x(ws["max_infosys_requests"])}</arex:InfosysInterfaceMaxClients>
      <arex:JobControlInterfaceMaxClients>{_x(ws["max_job_control_requests"])}</arex:JobControlInterfaceMaxClients>
      <arex:DataTransferInterfaceMaxClients>{_x(ws["max_data_transfer_requests"])}</arex:DataTransferInterfaceMaxClients>
    </Service>
  </Chain>
</ArcConfig>
"""


# --- by hand: ``python -m gridgate.plugins.arc.ce up|down|env|status|user`` (bash dev.sh arc) ---

DEFAULT_HAND_FOLDER = "./arc-ce"


def _exports(env: Mapping[str, str]) -> str:
    return "".join(f"export {name}={value}\n" for name, value in env.items())


def _hand_ce(folder: Path) -> ArcCE:
    """An ArcCE for ``folder`` with the knobs of the environment; a folder set up before keeps
    its own settings unless a knob says otherwise."""
    settings = _settings(folder)
    environ = os.environ
    lrms = environ.get("ARC_CE_LRMS") or (settings.lrms if settings else "") or "fork"
    slurm_conf = environ.get("SLURM_CONF") or (settings.slurm_conf if settings else None)
    port = environ.get("ARC_CE_PORT")
    issuer_port = environ.get("ARC_CE_ISSUER_PORT")
    tokens = environ.get("ARC_CE_TOKENS", "1").strip().lower() not in ("0", "no", "off", "false")
    if settings is not None:
        tokens = settings.tokens
    return ArcCE(
        folder,
        lrms=lrms,
        slurm_conf=slurm_conf if lrms == "slurm" else None,
        port=int(port) if port else None,
        info_period=int(environ.get("ARC_CE_INFO_PERIOD", "10")),
        wakeup=int(environ.get("ARC_CE_WAKEUP", "10")),
        watchdog=False,
        tokens=tokens,
        issuer_port=int(issuer_port) if issuer_port else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gridgate.plugins.arc.ce",
        description="Bring a private ARC CE (A-REX) up in a folder, or down again. Knobs, read "
        "when the folder is first set up: ARC_CE_PORT, ARC_CE_ISSUER_PORT (the token "
        "issuer's), ARC_CE_LRMS=fork|slurm, SLURM_CONF, ARC_CE_INFO_PERIOD (s), "
        "ARC_CE_WAKEUP (s), ARC_CE_TOKENS=0 (no token issuer, no bearer tokens).",
    )
    parser.add_argument(
        "action",
        choices=("up", "start", "stop", "down", "env", "status", "user"),
        help="up/start: start the CE (a folder that held one keeps its port, credentials and "
        "jobs); stop: stop its daemons and the issuer, keeping the jobs (a Slurm CE's too) for "
        "start; down: stop it and cancel a Slurm CE's jobs (with --remove, the folder goes)",
    )
    parser.add_argument(
        "folder",
        nargs="?",
        default=os.environ.get("ARC_CE_DIR", DEFAULT_HAND_FOLDER),
        help="where the CE lives (default: $ARC_CE_DIR or %(default)s)",
    )
    parser.add_argument(
        "unix_user",
        nargs="?",
        default="nobody",
        help="user: whose credentials to make (default: %(default)s)",
    )
    parser.add_argument(
        "--remove",
        action="store_true",
        help="down: remove the folder too once the CE is down (A-REX is not waited for)",
    )
    args = parser.parse_args(argv)
    folder = Path(args.folder).resolve()
    if args.action == "stop":
        begun = time.monotonic()
        down(folder, cancel=False, announce=True)
        print(
            f"arc-ce: the CE in {folder} is stopped, its jobs kept for start "
            f"({time.monotonic() - begun:.1f} s)",
            file=sys.stderr,
        )
        return 0
    if args.action == "down":
        begun = time.monotonic()
        # A folder about to be removed keeps nothing: no need to let A-REX save it.
        down(folder, announce=True, grace=LEFTOVER_GRACE if args.remove else AREX_GRACE)
        if args.remove:
            shutil.rmtree(folder, ignore_errors=True)
        print(
            f"arc-ce: the CE in {folder} is down ({time.monotonic() - begun:.1f} s)",
            file=sys.stderr,
        )
        return 0
    exists = (folder / "etc" / "ce.json").exists()
    if args.action in ("env", "status", "user") and not exists:
        print(f"arc-ce: no CE in {folder} (bash dev.sh arc up)", file=sys.stderr)
        return 1
    try:
        ce = _hand_ce(folder)
        if args.action == "env":
            ce._load_settings()
            print(_exports(ce.env), end="")
            return 0
        if args.action == "status":
            ce._load_settings()
            pids = ce.pids()
            up = ce.running()
            print(
                f"arc-ce: {'running' if up else 'stopped'}: {ce.url} in {folder} "
                f"(lrms {ce.lrms}; "
                + (", ".join(f"{n} pid {p}" for n, p in pids.items()) or "no arched")
                + ")"
            )
            return 0 if up else 1
        if args.action == "user":
            ce._load_settings()
            print(_exports(ce.add_user(args.unix_user)), end="")
            return 0
        begun = time.monotonic()
        ce.start()
    except (CEError, ValueError) as exc:  # ValueError: knobs that make no CE (slurm, no conf)
        print(f"arc-ce: {exc}", file=sys.stderr)
        return 1
    # The daemons run in sessions of their own and outlive this command; ``down`` stops them.
    print(
        f"arc-ce: {ce.url} up in {folder} (lrms {ce.lrms}, {time.monotonic() - begun:.1f} s)",
        file=sys.stderr,
    )
    print(_exports(ce.env), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
