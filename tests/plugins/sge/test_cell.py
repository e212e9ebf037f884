"""The private Grid Engine cell the sge tests run against: real daemons, real clients, jobs
run as a real ordinary uid."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.polling import until
from support.proctable import alive

from gridgate.plugins.sge.cell import CellError, SgeCell, home_problem


def _processes_in(folder: Path) -> list[str]:
    """Command lines of live processes that belong to the cell in ``folder``: the daemons and
    shepherds work in its spool, the jobs in its jobs folder or from its scripts."""
    mark = str(folder)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and (mark + "/" in cmdline or cwd == mark or cwd.startswith(mark + "/")):
            found.append(cmdline)
    return found


def _script(cell: SgeCell, name: str, body: str) -> Path:
    path = cell.jobs_dir / name
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(0o755)
    return path


def _qsub(cell: SgeCell, *args: str) -> str:
    result = cell.run(["qsub", "-terse", *args])
    assert result.ok, result.stderr
    return result.stdout.strip()


def _rows(cell: SgeCell) -> list[list[str]]:
    """``qstat -u '*'`` rows (as root), header lines dropped."""
    out = cell.run(["qstat", "-u", "*"], as_user=False)
    assert out.ok, out.stderr
    return [line.split() for line in out.stdout.splitlines()[2:] if line.strip()]


def _accounted(cell: SgeCell, job: str) -> dict[str, str]:
    """The last ``qacct -j`` record of ``job`` as key -> value (empty until there is one)."""
    out = cell.run(["qacct", "-j", job])
    if not out.ok:
        return {}
    record = out.stdout.split("=" * 62)[-1]
    fields = {}
    for line in record.splitlines():
        key, _, value = line.partition(" ")
        if key:
            fields[key] = value.strip()
    return fields


def test_every_queue_is_up_with_slots_the_pe_and_no_load_threshold(sge) -> None:
    states = sge.queue_states()
    assert states == {f"{q}@{sge.host}": "" for q in sge.queues}
    for queue in sge.queues:
        shown = dict(
            line.split(None, 1) for line in sge.qconf("-sq", queue).stdout.splitlines() if line
        )
        assert shown["slots"] == str(sge.slots)
        assert shown["pe_list"] == "smp"
        assert shown["load_thresholds"] == "NONE"
        assert shown["suspend_thresholds"] == "NONE"
    pe = sge.qconf("-sp", "smp").stdout.split()
    assert pe[pe.index("allocation_rule") + 1] == "$pe_slots"


def test_the_installer_traps_are_handled_in_the_cell_files(sge) -> None:
    # act_qmaster is written, and the resolver maps every address of the host back to its name
    assert (sge.common / "act_qmaster").read_text().strip() == sge.host
    sge.verify_host_resolution()
    # classic spooling inside the folder, not the Debian default berkeleydb in /var/spool
    bootstrap = (sge.common / "bootstrap").read_text()
    assert "spooling_method         classic" in bootstrap
    assert str(sge.folder) in bootstrap and "/var/spool/gridengine" not in bootstrap
    assert sge.global_config("min_uid") == "100"


def test_a_job_of_the_ordinary_user_runs_leaves_qstat_and_is_in_qacct(sge) -> None:
    script = _script(sge, "hello.sh", 'echo "hello from $JOB_ID as $(id -un)"\n')
    job = _qsub(sge, "-q", sge.queues[1], str(script))
    assert job.isdigit()
    assert until(lambda: job not in sge.job_ids(), timeout=60), _rows(sge)
    record = until(lambda: _accounted(sge, job), timeout=30)
    assert record["owner"] == sge.submit_user
    assert record["qname"] == sge.queues[1]
    assert (record["failed"], record["exit_status"]) == ("0", "0")
    output = sge.jobs_dir / f"hello.sh.o{job}"
    assert output.read_text() == f"hello from {job} as {sge.submit_user}\n"
    assert output.stat().st_uid == sge.submit_uid


def test_an_array_job_has_one_id_per_task(sge) -> None:
    script = _script(sge, "sleeper.sh", "sleep 300\n")
    terse = _qsub(sge, "-q", sge.queues[0], "-t", "1-3", "-o", "/dev/null", "-j", "y", str(script))
    base, _, tasks = terse.partition(".")
    assert tasks == "1-3:1"

    def running() -> set[str]:
        return {f"{r[0]}.{r[-1]}" for r in _rows(sge) if r[0] == base and r[4] == "r"}

    assert until(lambda: running() == {f"{base}.{t}" for t in (1, 2, 3)}, timeout=60), _rows(sge)


def test_a_parallel_job_gets_its_slots_on_one_host(sge) -> None:
    script = _script(sge, "pe.sh", "echo $NSLOTS\n")
    job = _qsub(sge, "-q", sge.queues[0], "-pe", "smp", "2", str(script))
    record = until(lambda: _accounted(sge, job), timeout=60)
    assert (record["granted_pe"], record["slots"], record["exit_status"]) == ("smp", "2", "0")
    assert (sge.jobs_dir / f"pe.sh.o{job}").read_text() == "2\n"


def test_root_may_not_submit(sge) -> None:
    refused = sge.run(["qsub", "-terse", "-b", "y", "/bin/true"], as_user=False)
    assert refused.returncode == 1
    assert "your user id 0 is lower than minimum user id 100" in refused.stderr


def test_the_qmaster_stops_and_comes_back_with_its_jobs(sge) -> None:
    job = _qsub(sge, "-q", sge.queues[0], "-o", "/dev/null", "-b", "y", "/bin/sleep", "300")
    sge.stop_qmaster()
    assert sge.qmaster_pid is None
    down = sge.run(["qsub", "-terse", "-b", "y", "/bin/true"])
    assert down.returncode == 1
    assert "unable to send message to qmaster" in down.stderr
    sge.start_qmaster()
    assert job in sge.job_ids()


def test_limits_and_access_lists_refuse_and_reset_lifts_them(sge) -> None:
    sge.set_user_job_limit(1)
    first = sge.run(["qsub", "-terse", "-o", "/dev/null", "-b", "y", "/bin/sleep", "300"])
    assert first.ok, first.stderr
    over = sge.run(["qsub", "-terse", "-b", "y", "/bin/true"])
    assert over.returncode == 25
    assert "only 1 jobs are allowed per user" in over.stderr
    sge.set_user_job_limit(0)
    sge.restrict_cell_to(["root"])
    barred = sge.run(["qsub", "-terse", "-b", "y", "/bin/true"])
    assert "is not allowed to submit jobs" in barred.stderr
    sge.disable_queue(sge.queues[0])
    assert sge.queue_states()[f"{sge.queues[0]}@{sge.host}"] == "d"
    sge.reset()
    assert sge.job_ids() == []
    assert set(sge.queue_states().values()) == {""}
    again = sge.run(["qsub", "-terse", "-b", "y", "/bin/true"])
    assert again.ok, again.stderr


def test_a_queue_access_list_keeps_the_job_waiting_unless_w_e(sge) -> None:
    queue = sge.queues[1]
    sge.restrict_queue_to(queue, ["root"])
    waiting = _qsub(sge, "-q", queue, "-b", "y", "/bin/true")
    refused = sge.run(["qsub", "-terse", "-w", "e", "-q", queue, "-b", "y", "/bin/true"])
    assert "no suitable queues" in refused.stderr
    assert [r[4] for r in _rows(sge) if r[0] == waiting] == ["qw"]


def test_an_unreadable_home_of_the_submit_user_is_named(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    problem = home_problem("nobody", home)
    assert problem is not None and f"rm -r {home}" in problem and ".sge_aliases" in problem
    home.chmod(0o755)
    assert home_problem("nobody", home) is None
    assert home_problem("nobody", tmp_path / "absent") is None


# A second cell on a loaded machine: start and stop are bounded (start_timeout, 30 s commands,
# a few seconds of grace per daemon) but add up; the test has room for them.
@pytest.mark.timeout(600)
def test_a_second_cell_runs_beside_and_stop_leaves_no_process(sge) -> None:
    second = SgeCell(queues=("only.q",), slots=2, start_timeout=90)
    with second:
        assert second.cell_name != sge.cell_name
        assert {second.qmaster_port, second.execd_port}.isdisjoint(
            {sge.qmaster_port, sge.execd_port}
        )
        assert second.gid_range != sge.gid_range
        job = second.run(["qsub", "-terse", "-o", "/dev/null", "-b", "y", "/bin/sleep", "300"])
        assert job.ok, job.stderr
        assert until(lambda: [r for r in _rows(second) if r[4] == "r"], timeout=60)
        folder = second.folder
        assert folder is not None and len(_processes_in(folder)) >= 3  # daemons and the job
        pids = [second.qmaster_pid]
        assert "only.q" in second.run(["qstat", "-f"], as_user=False).stdout
        assert "only.q" not in sge.run(["qstat", "-f"], as_user=False).stdout
    assert _processes_in(folder) == []
    assert not any(alive(pid) for pid in pids if pid is not None)
    assert not folder.exists()
    # the first cell did not notice
    assert set(sge.queue_states().values()) == {""}


@pytest.mark.timeout(600)
def test_a_port_taken_before_the_daemon_binds_it_is_tried_again(monkeypatch) -> None:
    import socket

    from gridgate.plugins.sge import cell as module

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # the qmaster's port is taken on the first try, the execd's on the second
        picks = iter([port, module.free_port(), module.free_port(), port])
        real = module.free_port
        monkeypatch.setattr(module, "free_port", lambda: next(picks, None) or real())
        with SgeCell(queues=("only.q",), start_timeout=90) as cell:
            assert port not in (cell.qmaster_port, cell.execd_port)
            assert b"can't bind socket" in (cell.folder / "log" / "qmaster.out").read_bytes()
            assert b"can't bind socket" in (cell.folder / "log" / "execd.out").read_bytes()
            assert cell.queue_states() == {f"only.q@{cell.host}": ""}


def test_a_folder_other_users_cannot_reach_is_refused(tmp_path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    with pytest.raises(CellError, match="not world-executable"):
        SgeCell(private / "cell").start()


@pytest.mark.timeout(600)
def test_up_env_and_down_by_hand_leave_nothing_running() -> None:
    folder = Path(tempfile.mkdtemp(prefix="gg-hand-", dir="/tmp")) / "cell"
    folder.parent.chmod(0o755)
    module = [sys.executable, "-m", "gridgate.plugins.sge.cell"]

    def hand(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*module, *args, str(folder)], capture_output=True, text=True, timeout=300, cwd="/"
        )

    try:
        up = hand("up")
        assert up.returncode == 0, up.stderr
        exports = dict(
            line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines()
        )
        assert exports["SGE_ROOT"] == f"{folder}/root"
        env = {**exports, "PATH": exports["PATH"].split(":")[0] + ":/usr/bin:/bin"}
        qstat = subprocess.run(
            ["qstat", "-f"], capture_output=True, text=True, env=env, timeout=120, cwd="/"
        )
        assert "pilots.q@" in qstat.stdout and "short.q@" in qstat.stdout, qstat.stderr
        assert hand("env").stdout == up.stdout
        again = hand("up")
        assert "already up" in again.stderr and again.stdout == up.stdout
        assert _processes_in(folder)
    finally:
        down = hand("down")
        shutil.rmtree(folder.parent, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert _processes_in(folder) == []


@pytest.mark.timeout(600)
def test_stop_and_start_by_hand_keep_the_cells_jobs() -> None:
    """Issue 42: the command line had no way to stop the cell and start it again with its
    jobs (`up` lays a new cell out). `stop` leaves a held job in the qmaster's spool; `start`
    brings the same cell (its ports, so the exports stay right) back with it."""
    from gridgate.plugins.sge.cell import SUBMIT_USER

    folder = Path(tempfile.mkdtemp(prefix="gg-hand-", dir="/tmp")) / "cell"
    folder.parent.chmod(0o755)
    module = [sys.executable, "-m", "gridgate.plugins.sge.cell"]

    def hand(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*module, *args, str(folder)], capture_output=True, text=True, timeout=300, cwd="/"
        )
        assert done.returncode == 0, (args, done.stderr)
        return done

    try:
        up = hand("up")
        exports = dict(
            line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines()
        )
        env = {**exports, "PATH": exports["PATH"].split(":")[0] + ":/usr/bin:/bin"}

        def sge(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["setpriv", f"--reuid={SUBMIT_USER}", "--regid=nogroup", "--clear-groups", *argv],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                cwd="/",
            )

        held = sge("qsub", "-terse", "-h", "-q", "pilots.q", "-o", "/dev/null", "-b", "y",
                   "/bin/sleep", "600")  # fmt: skip
        assert held.returncode == 0, held.stderr
        job = held.stdout.strip()
        hand("stop")
        assert _processes_in(folder) == []
        again = hand("start")
        assert again.stdout == up.stdout, "the same cell: its exports hold"
        listed = sge("qstat", "-u", "*")
        assert job in listed.stdout and "hqw" in listed.stdout, listed.stdout + listed.stderr
    finally:
        subprocess.run([*module, "down", str(folder)], timeout=300, cwd="/")
        shutil.rmtree(folder.parent, ignore_errors=True)
    assert _processes_in(folder) == []


@pytest.mark.timeout(600)
def test_a_killed_owner_leaves_no_daemon_behind() -> None:
    # What a pytest-timeout (os._exit) or a SIGKILL does to a test process holding a cell.
    code = (
        "import sys, time\n"
        "from gridgate.plugins.sge.cell import SgeCell\n"
        "c = SgeCell().start()\n"
        "r = c.run(['qsub', '-o', '/dev/null', '-b', 'y', '/bin/sleep', '300'])\n"
        "assert r.ok, r.stderr\n"
        "print(c.folder, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd="/"
    )
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().strip()
        assert line, "the owner did not start its cell"
        folder = Path(line)
        assert _processes_in(folder)
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
        until(lambda: not (_processes_in(folder) or folder.exists()), timeout=120, pause=0.2)
        assert _processes_in(folder) == []
        assert not folder.exists()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(30)
        if owner.stdout is not None:
            owner.stdout.close()
