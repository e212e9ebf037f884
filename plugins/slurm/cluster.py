"""A private one-node Slurm cluster (munged, slurmctld, slurmd) in a folder of its own.

The tests, the benches and people trying the backend start it the same way::

    with SlurmCluster() as cluster:
        run(["sbatch", "--parsable", "-p", "debug", "pilot.sh"], 30, env=cluster.env)

Nothing is shared with the machine's own Slurm or with another private cluster running at the
same time: a fresh munge key and a munged on a private socket, free loopback ports, a unique
cluster and node name, and every state, spool, pid and log file inside the folder. ``stop()``
cancels the jobs, stops the daemons by process group and waits until none of them (nor a job
step they started) is left.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gridgate.core.model import CommandResult
from gridgate.core.runner import run
from gridgate.core.testing import exited, free_port, not_traversable, signal_group, sweep_processes
from gridgate.core.watchdog import Watchdog

#: Debian packages that provide what the cluster runs (dev.sh installs them when missing).
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "sinfo": "slurm-client"}
DEFAULT_PARTITIONS = ("debug", "batch")
#: Finished jobs stay visible to squeue this long (slurm.conf MinJobAge; Slurm's default is
#: 300 s). There is no slurmdbd, so squeue is the only witness of a finished pilot.
MIN_JOB_AGE = 3600


class ClusterError(RuntimeError):
    """The cluster could not be started (the message says what to fix)."""


def missing_programs() -> list[str]:
    """The Debian packages whose programs are not installed (empty when all are)."""
    return sorted(
        {
            pkg
            for prog, pkg in DAEMONS.items()
            if shutil.which(prog) is None and not Path(f"/usr/sbin/{prog}").exists()
        }
    )


def _program(name: str) -> str:
    found = shutil.which(name) or (
        f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None
    )
    if found is None:
        raise ClusterError(
            f"{name} is not installed: the private Slurm cluster needs the Debian packages "
            f"{' '.join(PACKAGES)} (apt-get install -y {' '.join(PACKAGES)}; dev.sh does this)"
        )
    return found


def _node_resources() -> tuple[int, int]:
    """This machine's CPUs and memory (MiB), as slurmd itself would report them."""
    cpus = os.cpu_count() or 1
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = max(int(pages // (1024 * 1024)) - 256, 512)
    except (ValueError, OSError):
        memory = 1024
    return cpus, memory


def sweep(folder: str | os.PathLike[str]) -> None:
    """Kill what a cluster's daemons left: job steps (slurmstepd runs in the folder) and jobs
    (their scripts live in its spool). Each leftover's process group goes at once."""
    sweep_processes(folder)


class SlurmCluster:
    """One slurmctld, one slurmd and their munged, all private to ``folder``.

    ``folder`` (default: a fresh folder in the system's temporary directory, removed by
    ``stop``) must be reachable by other users: munged refuses a socket below a folder that is
    not world-executable, and jobs of ordinary users run from it. ``partitions`` are created on
    the one node; the first is the default. ``extra_conf`` lines are appended to slurm.conf.
    ``message_timeout`` is slurm.conf's MessageTimeout (Slurm's default 10): a client gives up
    on a stopped controller after about ``message_timeout - 1`` seconds and on one that does
    not answer after ``message_timeout``. With ``watchdog`` (the default) the daemons are
    brought down even when this process dies without calling ``stop``.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        partitions: Sequence[str] = DEFAULT_PARTITIONS,
        extra_conf: Sequence[str] = (),
        start_timeout: float = 120.0,
        message_timeout: int = 10,
        watchdog: bool = True,
        ctld_port: int = 0,
        slurmd_port: int = 0,
    ) -> None:
        self._own_folder = folder is None
        self.folder = Path(folder) if folder is not None else None
        self.partitions = tuple(partitions)
        if not self.partitions:
            raise ValueError("a cluster needs at least one partition")
        self.extra_conf = tuple(extra_conf)
        self.message_timeout = int(message_timeout)
        self.start_timeout = start_timeout
        # A folder that held a cluster keeps its names and ports: slurmctld refuses a state
        # folder written under another ClusterName, and the clients' SLURM_CONF stays right.
        before = previous_conf(self.folder) if self.folder is not None else {}
        tag = secrets.token_hex(4)
        self.cluster_name = before.get("ClusterName") or f"gg{tag}"
        self.node_name = before.get("NodeName") or f"ggnode{tag}"
        #: the ports asked for (0: a free one; a folder's previous ones are tried first)
        self.wanted_ports = (
            ctld_port or int(before.get("SlurmctldPort") or 0),
            slurmd_port or int(before.get("SlurmdPort") or 0),
        )
        self.fixed_ports = bool(ctld_port or slurmd_port)
        self.ctld_port = 0
        self.slurmd_port = 0
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.watchdog = watchdog
        self._watchdog: Watchdog | None = None

    # --- paths and environment ------------------------------------------------------------

    def _path(self, *parts: str) -> Path:
        assert self.folder is not None, "the cluster is not started"
        return self.folder.joinpath(*parts)

    @property
    def conf(self) -> Path:
        """The generated slurm.conf."""
        return self._path("etc", "slurm.conf")

    @property
    def munge_socket(self) -> Path:
        return self._path("munge", "munge.socket")

    @property
    def jobs_dir(self) -> Path:
        """A folder every user may write job output to (mode 1777, like /tmp)."""
        return self._path("jobs")

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to talk to this cluster (``SLURM_CONF``)."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) plus :attr:`env`."""
        return {**(os.environ if base is None else base), **self.env}

    def log(self, daemon: str = "slurmctld") -> str:
        """The daemon's log so far (for error messages)."""
        path = self._path("log", f"{daemon}.log")
        return path.read_text(errors="replace") if path.exists() else ""

    # --- commands ---------------------------------------------------------------------------

    def command(self, argv: Sequence[str], timeout: float = 30.0) -> CommandResult:
        """Run a Slurm client command (argv) against this cluster."""
        return run(list(argv), timeout, env=self.client_env(), cwd=str(self.folder))

    def scontrol(self, *args: str, timeout: float = 30.0) -> CommandResult:
        """``scontrol ARGS...`` against this cluster; raises ClusterError when it fails."""
        result = self.command(["scontrol", *args], timeout)
        if not result.ok:
            raise ClusterError(
                f"scontrol {' '.join(args)}: {result.describe()}: {result.stderr.strip()}"
            )
        return result

    def set_partition_state(self, partition: str, state: str) -> None:
        """``scontrol update PartitionName=P State=UP|DOWN|DRAIN|INACTIVE``."""
        self.scontrol("update", f"PartitionName={partition}", f"State={state}")

    def job_ids(self) -> list[str]:
        """Every job id the controller holds (array tasks as ``<base>_<idx>``)."""
        result = self.command(["squeue", "-h", "-t", "all", "-o", "%i"])
        return result.stdout.split() if result.ok else []

    def cancel_all(self, wait: float = 30.0) -> bool:
        """Cancel every job of every user (root's scancel), then wait up to ``wait`` seconds
        until no job is live and the node is idle again (a cancelled job's node stays
        ``completing`` or ``mixed`` for a moment). Returns whether it got there."""
        ids = [i.split("_")[0] for i in self.job_ids()]
        if not ids:
            return True
        self.command(["scancel", *sorted(set(ids))])
        end = time.monotonic() + wait
        while time.monotonic() < end:
            live = self.command(["squeue", "-h", "-o", "%i"])  # default filter: live jobs only
            node = self.command(["sinfo", "-h", "-n", self.node_name, "-o", "%T"])
            if (
                live.ok
                and not live.stdout.split()
                and node.ok
                and {t.rstrip("*~#$@+") for t in node.stdout.split()} == {"idle"}
            ):
                return True
            time.sleep(0.05)
        return False

    # --- life cycle ---------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> SlurmCluster:
        """Start munged, slurmctld and slurmd; return when the node is idle."""
        for name in ("munged", "slurmctld", "slurmd", "sinfo"):
            _program(name)
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="gridgate-slurm-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder = self.folder.resolve()
        os.chmod(self.folder, 0o755)
        blocked = not_traversable(self.folder)
        if blocked is not None:
            raise ClusterError(
                f"{blocked} is not world-executable (mode {stat.S_IMODE(os.stat(blocked).st_mode):o}):"
                f" munged refuses a socket below it and other users cannot reach the cluster; "
                f"use a folder whose every parent has o+x"
            )
        for sub in ("etc", "munge", "state", "spool", "log", "run"):
            self._path(sub).mkdir(mode=0o755, exist_ok=True)
        self.jobs_dir.mkdir(exist_ok=True)
        os.chmod(self.jobs_dir, 0o1777)
        if self.watchdog:
            self._start_watchdog()
        try:
            self._start_munged(new_key=not self._path("munge", "munge.key").exists())
            # Another process may take a probed port before slurmctld binds it: try again then,
            # and only then (on a loaded machine a slow start is not cured by restarting).
            for attempt in range(4):
                wanted_ctld, wanted_slurmd = self.wanted_ports if attempt == 0 else (0, 0)
                if attempt and self.fixed_ports:
                    break  # ports a person chose are not swapped for others
                self.ctld_port = wanted_ctld or free_port()
                self.slurmd_port = wanted_slurmd or free_port()
                self._write_conf()
                self.start_controller(wait=False)
                self._start(
                    "slurmd", [_program("slurmd"), "-D", "-N", self.node_name, "-f", str(self.conf)]
                )
                if self.wait_idle(raise_on_timeout=False):
                    return self
                logs = self.log("slurmctld") + self.log("slurmd")
                if "Address already in use" not in logs:
                    break
                self._stop_slurm_daemons()
            gone = [
                n
                for n in ("slurmctld", "slurmd")
                if (p := self._procs.get(n)) and p.poll() is not None
            ]
            why = (
                f"{' and '.join(gone)} exited"
                if gone
                else f"did not come up within {self.start_timeout:.0f} s"
            )
            raise ClusterError(
                f"the private Slurm cluster in {self.folder} {why}; last logs:\n"
                f"{self.log('slurmctld')[-3000:]}{self.log('slurmd')[-2000:]}"
            )
        except BaseException:
            self.stop()
            raise

    def _start_watchdog(self) -> None:
        """Core's watchdog brings the cluster down (``down``, and removes a folder made here)
        if this process dies without ``stop`` (SIGKILL, ``os._exit`` of a test timeout)."""
        assert self.folder is not None
        teardown = [sys.executable, "-m", "gridgate.plugins.slurm.cluster", "down"]
        teardown += ["--folder", str(self.folder), *(["--remove"] if self._own_folder else [])]
        self._watchdog = Watchdog(teardown, only_if=self.folder, stop_timeout=60).start()

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            # it finds the cluster already down (its folder gone, when made here) and exits
            watchdog.stop()

    def _start(self, name: str, argv: list[str]) -> None:
        out = open(self._path("log", f"{name}.out"), "ab")  # noqa: SIM115 - handed to the child
        try:
            self._procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(self.folder),
                start_new_session=True,
                close_fds=True,
            )
        finally:
            out.close()

    def _start_munged(self, new_key: bool = True) -> None:
        key = self._path("munge", "munge.key")
        if new_key:
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, secrets.token_bytes(1024))
            finally:
                os.close(fd)
        munge_dir = self._path("munge")
        self._start(
            "munged",
            [
                _program("munged"),
                "-F",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--log-file={munge_dir / 'munged.log'}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
                # Slurm's own advice when munged cannot keep up ("restart with --num-threads=10"):
                # with the default 2 a loaded machine sees "Connection refused" on its socket.
                "--num-threads=10",
            ],
        )
        end = time.monotonic() + self.start_timeout
        while time.monotonic() < end:
            if self.munge_socket.exists():
                return
            if self._procs["munged"].poll() is not None:
                break
            time.sleep(0.02)
        out = self._path("log", "munged.out").read_text(errors="replace")
        raise ClusterError(f"munged did not start on {self.munge_socket}:\n{out}")

    def _write_conf(self) -> None:
        cpus, memory = _node_resources()
        # the node offers at least 2 CPUs, so that a 2-core pilot runs on a 1-CPU machine too
        # (slurmd takes the configured count over the hardware's with config_overrides)
        overrides = ["SlurmdParameters=config_overrides"] if cpus < 2 else []
        cpus = max(cpus, 2)
        p = self._path
        lines = [
            f"ClusterName={self.cluster_name}",
            "SlurmctldHost=localhost(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            f"StateSaveLocation={p('state')}",
            f"SlurmdSpoolDir={p('spool')}/%n",
            f"SlurmctldPidFile={p('run', 'slurmctld.pid')}",
            f"SlurmdPidFile={p('run', 'slurmd-%n.pid')}",
            f"SlurmctldLogFile={p('log', 'slurmctld.log')}",
            f"SlurmdLogFile={p('log', 'slurmd.log')}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            # Without it one job takes the node's whole memory and the rest wait.
            "DefMemPerCPU=1024",
            "MailProg=/bin/true",
            "MpiDefault=none",
            "ReturnToService=2",
            # Reject at submission what a partition's limits forbid, as sites usually do.
            "EnforcePartLimits=ALL",
            f"MinJobAge={MIN_JOB_AGE}",
            f"MessageTimeout={self.message_timeout}",
            "SchedulerType=sched/backfill",
            *overrides,
            f"NodeName={self.node_name} NodeHostname=localhost NodeAddr=127.0.0.1 "
            f"CPUs={cpus} RealMemory={memory} State=UNKNOWN",
        ]
        for index, name in enumerate(self.partitions):
            default = " Default=YES" if index == 0 else ""
            lines.append(
                f"PartitionName={name} Nodes={self.node_name}{default} MaxTime=INFINITE State=UP"
            )
        lines += list(self.extra_conf)
        (p("spool", self.node_name)).mkdir(exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.chmod(self.conf, 0o644)

    def wait_idle(self, timeout: float | None = None, *, raise_on_timeout: bool = True) -> bool:
        """Wait until ``sinfo`` shows the node idle (or mixed/allocated: it answers jobs)."""
        end = time.monotonic() + (timeout or self.start_timeout)
        while time.monotonic() < end:
            for name in ("slurmctld", "slurmd"):
                proc = self._procs.get(name)
                if proc is None or proc.poll() is not None:
                    if raise_on_timeout:
                        raise ClusterError(f"{name} exited:\n{self.log(name)[-3000:]}")
                    return False
            result = self.command(
                ["sinfo", "-h", "-n", self.node_name, "-o", "%T"],
                timeout=max(end - time.monotonic(), 1.0),
            )
            states = result.stdout.split()
            if (
                result.ok
                and states
                and all(s.rstrip("*~#$@+") in ("idle", "mixed", "allocated") for s in states)
            ):
                return True
            time.sleep(0.05)
        if raise_on_timeout:
            raise ClusterError(
                f"node {self.node_name} not idle after the wait; slurmctld log:\n"
                f"{self.log('slurmctld')[-3000:]}"
            )
        return False

    def start_controller(self, *, wait: bool = True) -> None:
        """(Re)start slurmctld; it recovers its jobs from the state folder."""
        proc = self._procs.get("slurmctld")
        if proc is not None and proc.poll() is None:
            return
        self._start("slurmctld", [_program("slurmctld"), "-D", "-f", str(self.conf)])
        if wait:
            self.wait_idle()

    def stop_controller(self) -> None:
        """Stop slurmctld (the clients then cannot contact the controller)."""
        self._stop_process("slurmctld")

    def pause_controller(self) -> None:
        """SIGSTOP slurmctld: it still accepts connections but answers nothing."""
        proc = self._procs.get("slurmctld")
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGSTOP)

    def resume_controller(self) -> None:
        proc = self._procs.get("slurmctld")
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)

    @property
    def controller_pid(self) -> int | None:
        proc = self._procs.get("slurmctld")
        return proc.pid if proc is not None and proc.poll() is None else None

    def _stop_process(self, name: str, grace: float = 10.0) -> None:
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
        """Start again whichever daemon is gone (killed from outside), then wait for the node."""
        restarted = False
        munged = self._procs.get("munged")
        if munged is None or munged.poll() is not None:
            self._procs.pop("munged", None)
            self.munge_socket.unlink(missing_ok=True)
            self._start_munged(new_key=False)
            restarted = True
        for name in ("slurmctld", "slurmd"):
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                self._procs.pop(name, None)
                if name == "slurmctld":
                    self.start_controller(wait=False)
                else:
                    self._start(
                        "slurmd",
                        [_program("slurmd"), "-D", "-N", self.node_name, "-f", str(self.conf)],
                    )
                restarted = True
        if restarted:
            self.wait_idle()

    def _stop_slurm_daemons(self) -> None:
        self._stop_process("slurmd")
        self._stop_process("slurmctld")
        self._sweep()

    def _sweep(self) -> None:
        if self.folder is not None:
            sweep(self.folder)

    def stop(self) -> None:
        """Cancel the jobs, stop every daemon, remove the folder when it was made here."""
        if self._procs.get("slurmctld") is not None and self._procs["slurmctld"].poll() is None:
            self.resume_controller()
            try:
                self.cancel_all(wait=0)  # the daemons stop next: no need to see the node idle
            except OSError:
                pass  # a controller that cannot be reached is stopped below all the same
        self._stop_slurm_daemons()
        self._stop_process("munged")
        self._sweep()
        if self._own_folder and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self._stop_watchdog()


def previous_conf(folder: Path) -> dict[str, str]:
    """What the slurm.conf a cluster left in ``folder`` says of its identity and ports
    (``ClusterName``, ``NodeName``, ``SlurmctldPort``, ``SlurmdPort``); empty when none."""
    try:
        text = (folder / "etc" / "slurm.conf").read_text(encoding="utf-8")
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        for word in line.split()[:1]:
            key, _, value = word.partition("=")
            if key in ("ClusterName", "NodeName", "SlurmctldPort", "SlurmdPort") and value:
                found.setdefault(key, value)
    ports = ("SlurmctldPort", "SlurmdPort")
    if any(not found.get(k, "0").isdigit() for k in ports):  # a hand edit: new ports
        for key in ports:
            found.pop(key, None)
    return found


# --- by hand: ``python -m gridgate.plugins.slurm.cluster up|down`` (``bash dev.sh slurm``) ----

DEFAULT_HAND_FOLDER = "/tmp/gridgate-slurm"


def _pids(folder: Path) -> list[int]:
    """The live daemons named by the folder's pid files (a stale pid, reused by some other
    process since, does not name this folder on its command line and is left alone)."""
    pids = []
    for pidfile in [*folder.glob("run/*.pid"), folder / "munge" / "munged.pid"]:
        try:
            pid = int(pidfile.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if str(folder) + "/" in cmdline:
            pids.append(pid)
    return pids


def _partitions(conf: Path) -> list[str]:
    """The partitions a cluster's slurm.conf names, in order."""
    names = []
    for line in conf.read_text(encoding="utf-8").splitlines():
        if line.startswith("PartitionName="):
            names.append(line.split()[0].partition("=")[2])
    return names or list(DEFAULT_PARTITIONS)


def down(folder: str | os.PathLike[str]) -> int:
    """Stop the daemons of the cluster in ``folder`` (started by ``up``); 0 when none is left."""
    root = Path(folder).resolve()
    for pid in _pids(root):
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass  # already gone: the wait below finds it so
    end = time.monotonic() + 10
    while time.monotonic() < end and any(Path(f"/proc/{p}").exists() for p in _pids(root)):
        time.sleep(0.05)
    sweep(root)
    for pidfile in [*root.glob("run/*.pid"), root / "munge" / "munged.pid"]:
        pidfile.unlink(missing_ok=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gridgate.plugins.slurm.cluster",
        description="Bring a private one-node Slurm cluster up in a folder, or down again.",
    )
    parser.add_argument(
        "action",
        choices=("up", "down", "stop", "start", "env"),
        help="up/start: start the daemons (a folder that held a cluster keeps its name, ports, "
        "key and jobs); stop: stop them, keeping the jobs for start; down: cancel the jobs "
        "and stop them (with --remove, the folder goes too)",
    )
    parser.add_argument(
        "--folder",
        default=os.environ.get("GRIDGATE_SLURM_DIR", DEFAULT_HAND_FOLDER),
        help="where its conf, state and logs live (default: %(default)s)",
    )
    parser.add_argument(
        "--remove",
        action="store_true",
        help="down: remove the folder too once the cluster is down",
    )
    parser.add_argument(
        "--partition",
        action="append",
        default=None,
        help="a partition to create (repeat; default: debug and batch)",
    )
    parser.add_argument(
        "--ctld-port",
        type=int,
        default=0,
        help="up/start: slurmctld's port (default: the folder's last one, else a free one)",
    )
    parser.add_argument(
        "--slurmd-port",
        type=int,
        default=0,
        help="up/start: slurmd's port (default: the folder's last one, else a free one)",
    )
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    conf = folder / "etc" / "slurm.conf"
    if args.action == "stop":
        down(folder)
        print(f"slurm: the cluster in {folder} is stopped; its jobs wait for `start`")
        return 0
    if args.action == "down":
        if conf.exists() and _pids(folder.resolve()):
            # the full tear-down: every user's jobs go too, as the tests' cluster does it
            SlurmCluster(folder, watchdog=False).cancel_all(wait=0)
        down(folder)
        if args.remove:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"slurm: the cluster in {folder} is down{' and removed' if args.remove else ''}")
        return 0
    if args.action == "env":
        if not conf.exists():
            print(f"slurm: no cluster in {folder}", file=sys.stderr)
            return 1
        print(f"export SLURM_CONF={conf}")
        return 0
    if any(Path(f"/proc/{p}").exists() for p in _pids(folder.resolve()) if folder.exists()):
        print(f"slurm: a cluster is already up in {folder}; export SLURM_CONF={conf}")
        return 0
    partitions = args.partition or (_partitions(conf) if conf.exists() else DEFAULT_PARTITIONS)
    cluster = SlurmCluster(
        folder,
        partitions=tuple(partitions),
        watchdog=False,
        ctld_port=args.ctld_port,
        slurmd_port=args.slurmd_port,
    )
    try:
        cluster.start()
    except ClusterError as exc:
        print(f"slurm: {exc}", file=sys.stderr)
        return 1
    # The daemons run in sessions of their own and outlive this command; ``down`` stops them.
    print(
        f"slurm: cluster {cluster.cluster_name} up in {folder} (node {cluster.node_name}, "
        f"partitions {', '.join(cluster.partitions)}, controller port {cluster.ctld_port})"
    )
    print(f"export SLURM_CONF={conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
