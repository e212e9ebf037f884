"""How a gated command holds its token: the run-time path imports only the standard library,
a nested call rides on its token at the daemon (forged, stale or another user's: refused), a
submission never carries it into its jobs, a SIGKILLed gate takes its command along, commands
that only start under a token give it back, a waiting call says why, relative socket paths."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.polling import until
from support.ports import free_port
from support.uids import AS_NOBODY

from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.gate.gate import install_shims
from gridgate.plugins.lsf_proxy.sim import install_commands, write_scenario

PYTHON = sys.executable
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or PYTHON


def status(socket: str) -> dict:
    with ProxyClient([Daemon("proxyd", socket)]) as client:
        [reply] = client.admin("status")
    return reply.reply["status"]


def in_use(socket: str) -> dict[str, int]:
    return {name: c["in_use"] for name, c in status(socket)["categories"].items()}


def _as(argv: list[str], user: str, env: dict | None = None) -> tuple[list[str], dict]:
    """``argv`` as ``user``, and the test's environment without a token of its own."""
    full = {k: v for k, v in os.environ.items() if k != "GRIDGATE_GATE_TOKEN"}
    full.update(env or {})
    return (AS_NOBODY + argv if user == "nobody" else argv), full


def run(
    argv: list[str], user: str = "root", env: dict | None = None, cwd: str = "/", **kwargs
) -> subprocess.CompletedProcess:
    argv, full = _as(argv, user, env)
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, cwd=cwd, env=full, **kwargs
    )


def start(argv: list[str], user: str = "root") -> subprocess.Popen:
    """:func:`run`, without waiting: its stdout and stderr are pipes."""
    argv, full = _as(argv, user)
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/", env=full
    )


def hold_code(ready: Path, go: Path, seconds: str = "60") -> str:
    """Python that says it is ``ready`` and runs until the test creates ``go`` (``seconds``, a
    Python expression, at most): it holds its token as long as the test needs, however slow
    the machine. It polls a file of the test's: a real process cannot take the test's clock."""
    return (
        f"import os, sys, time\nopen({str(ready)!r}, 'w').close()\n"
        f"end = time.monotonic() + {seconds}\n"
        f"while time.monotonic() < end and not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.02)\n"
    )


def holding(ready: Path, go: Path) -> list[str]:
    """:func:`hold_code` as a command."""
    return [PYTHON, "-c", hold_code(ready, go)]


@pytest.fixture
def root_cache():
    """A cache folder for root's gate inside root's home: root's gate keeps no cache outside
    it (test_gate_nested.py)."""
    import pwd
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=".gg-cache-", dir=pwd.getpwuid(0).pw_dir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def imported(stderr: str) -> set[str]:
    """Top-level names of the modules ``-X importtime`` reports."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.add(name.split(".")[0])
    return names


def test_the_run_time_path_imports_only_the_standard_library(
    start_daemon, gridgate_exe, sockdir, root_cache
) -> None:
    daemon = start_daemon({})
    # (a shim imports less still: test_gate_shim.py) the console script: beyond what the interpreter's own start-up imports (site, the
    # editable install's finder), only the standard library and gridgate's light modules
    base = imported(run([PYTHON, "-X", "importtime", "-c", "pass"]).stderr)
    # the first call resolves the settings the slow way and caches them for the next ones
    cache = {"XDG_CACHE_HOME": str(root_cache)}
    argv = [gridgate_exe, "gate", "--socket", daemon.socket, "--", "true"]
    assert run(argv, env=cache).returncode == 0
    gate = run([PYTHON, "-X", "importtime", *argv], env=cache)
    assert gate.returncode == 0, gate.stderr
    names = imported(gate.stderr)
    assert names - base - set(sys.stdlib_module_names) == {"gridgate"}
    assert not {"click", "loguru", "pluggy", "stevedore", "yaml", "jsonschema"} & names
    heavy = [
        line
        for line in gate.stderr.splitlines()
        if line.rstrip().endswith(("gridgate.core.cli", "gridgate.plugins.lsf_proxy.client.client"))
    ]
    assert heavy == []


def test_a_forged_stale_or_foreign_token_is_refused(
    start_daemon, gridgate_exe, cli, sockdir
) -> None:
    daemon = start_daemon({})
    gate = [gridgate_exe, "gate", "--socket", daemon.socket, "--"]
    got = run(gate + ["printenv", "GRIDGATE_GATE_TOKEN"], user="nobody")
    assert got.returncode == 0, got.stderr
    stale = got.stdout.strip()
    assert stale
    # root holds a live token in a long command
    ready = sockdir / "ready"
    holder = subprocess.Popen(
        gate
        + [
            PYTHON,
            "-c",
            "import os, time; "
            f"open({str(ready)!r}, 'w').write(os.environ['GRIDGATE_GATE_TOKEN']); "
            "time.sleep(60)",
        ],
        cwd="/",
    )
    try:
        until(lambda: ready.exists() and ready.read_text())
        foreign = ready.read_text()
        assert cli("block", "-u", "nobody", "--socket", daemon.socket).returncode == 0
        marker = sockdir / "ran"
        for token in ("forged", stale, foreign):
            proc = run(
                gate + ["/usr/bin/touch", str(marker)],
                user="nobody",
                env={"GRIDGATE_GATE_TOKEN": token},
            )
            # not taken as leave to skip the gate: the gate asked for a token and was refused
            assert proc.returncode == 75, (token, proc.stderr)
            assert "blocked" in proc.stderr
            assert not marker.exists()
        # root's own live token does cover a nested call of root's: it rides on it (a
        # token of its own on the parent's slot, not passed further down)
        nested = run(
            gate + ["sh", "-c", 'echo "ran:$GRIDGATE_GATE_TOKEN"'],
            env={"GRIDGATE_GATE_TOKEN": foreign},
        )
        assert nested.returncode == 0 and nested.stdout.strip() == "ran:"
        assert in_use(daemon.socket)["other"] == 1
    finally:
        holder.kill()
        holder.wait(30)


def test_a_gated_submission_does_not_carry_the_token_into_its_job(
    start_daemon, gridgate_exe, sockdir
) -> None:
    """bsub copies the submission environment into the job (the stand-in records it): a
    gated script (holding a token) calls the shimmed bsub; the job must not see the token."""
    daemon = start_daemon({})
    bin_dir = install_commands(sockdir / "lsfbin", python=SYSTEM_PYTHON)
    state = sockdir / "lsf"
    state.mkdir()
    state.chmod(0o777)
    scenario = write_scenario(sockdir / "scenario.json", {"state_dir": str(state)})
    shims = sockdir / "shims"
    env = {
        "PATH": f"{shims}{os.pathsep}{bin_dir}{os.pathsep}/usr/bin:/bin",
        "GRIDGATE_LSF_SCENARIO": str(scenario),
    }
    install_shims(shims, ["bsub"], socket_path=daemon.socket)
    for line in [
        ["bsub", "pilot.sh"],
        ["sh", "-c", 'echo "outer=$GRIDGATE_GATE_TOKEN"; bsub job.sh'],
    ]:
        proc = run(
            [gridgate_exe, "gate", "--socket", daemon.socket, "--", *line], user="nobody", env=env
        )
        assert proc.returncode == 0, proc.stderr
        assert "is submitted to" in proc.stdout
    outer = [ln for ln in proc.stdout.splitlines() if ln.startswith("outer=")]
    assert outer and outer[0] != "outer="  # the script itself did hold a token
    jobs = [json.loads(ln) for ln in (state / "jobs.jsonl").read_text().splitlines()]
    assert [j["command"] for j in jobs] == [["pilot.sh"], ["job.sh"]]
    for job in jobs:
        assert job["env"].get("GRIDGATE_LSF_SCENARIO") == str(scenario)  # the env was copied
        assert "GRIDGATE_GATE_TOKEN" not in job["env"]


def test_a_sigkilled_gate_leaves_no_command_running(start_daemon, gridgate_exe, sockdir) -> None:
    daemon = start_daemon({})
    pidfile = sockdir / "child.pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(77)"
    gate = subprocess.Popen(
        [gridgate_exe, "gate", "--socket", daemon.socket, "--", PYTHON, "-c", code], cwd="/"
    )
    try:
        until(lambda: pidfile.exists() and pidfile.read_text())
        child = int(pidfile.read_text())
        assert Path(f"/proc/{child}").exists()
        os.kill(gate.pid, signal.SIGKILL)  # the gate only, not its process group
        # (the gate execs its command, so the pid is the same; the token holder is not it)
        assert gate.wait(30) == -signal.SIGKILL

        def gone() -> bool:
            try:
                return Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] in "ZX"
            except OSError:
                return True

        assert until(gone, timeout=30)
        assert until(lambda: in_use(daemon.socket)["other"] == 0)
    finally:
        if gate.poll() is None:
            gate.kill()


def test_a_start_only_command_gives_its_token_back_while_it_runs(
    start_daemon, gridgate_exe, sockdir
) -> None:
    daemon = start_daemon({})
    config = sockdir / "gate.yaml"
    config.write_text(yaml.safe_dump({"proxyd": {"socket": daemon.socket, "start_hold": 0.5}}))
    config.chmod(0o644)
    real = sockdir / "bin"
    real.mkdir()
    squeue = real / "squeue"
    marker, finish = sockdir / "iterating", sockdir / "finish"
    # runs until the test says finish, or for its last argument's seconds
    squeue.write_text(f"#!{SYSTEM_PYTHON}\n" + hold_code(marker, finish, "float(sys.argv[-1])"))
    squeue.chmod(0o755)
    env = {"XDG_CACHE_HOME": str(sockdir / "cache")}
    # squeue -i: repeats by itself, so it holds its query token only to start
    proc = subprocess.Popen(
        [gridgate_exe, "gate", "-c", str(config), "--", str(squeue), "-i", "120"],
        cwd="/",
        env={**os.environ, **env},
    )
    try:
        # a loaded CI host took over 20 s to start it once: wait longer, and say so if not
        assert until(marker.exists, timeout=90), "the gated squeue -i never started"
        assert until(lambda: in_use(daemon.socket)["query"] == 0, timeout=30)
        assert proc.poll() is None  # still running, without the token
    finally:
        proc.kill()
        proc.wait(30)
    # the same command without -i holds its token to the end
    marker.unlink()
    proc = subprocess.Popen(
        [gridgate_exe, "gate", "-c", str(config), "--", str(squeue), "120"],
        cwd="/",
        env={**os.environ, **env},
    )
    try:
        assert until(marker.exists, timeout=90), "the gated squeue never started"
        time.sleep(1.0)  # twice start_hold: a start-only command would have given it back
        assert in_use(daemon.socket)["query"] == 1
        finish.touch()
        assert proc.wait(60) == 0
        assert until(lambda: in_use(daemon.socket)["query"] == 0)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_waiting_call_says_why_after_a_second_unless_quiet(
    start_daemon, gridgate_exe, sockdir
) -> None:
    daemon = start_daemon({"policies": "QUERY[max=1 nominal=1]", "token_wait_time": 60})
    shared = sockdir / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # the holder runs as nobody
    ready, go = shared / "ready", shared / "go"
    hold = [
        gridgate_exe,
        "gate",
        "--socket",
        daemon.socket,
        "--category",
        "query",
        "--",
        *holding(ready, go),
    ]
    # One holder, two waiters queued behind it: the quiet one first, so that by the time the
    # other says why (a second after it queued) the quiet one has waited longer than that.
    holder = subprocess.Popen(AS_NOBODY + hold, cwd="/")
    waiters: list[subprocess.Popen] = []
    try:
        assert until(ready.exists, 60)
        for queued, quiet in ((1, True), (2, False)):
            waiters.append(
                start(
                    [
                        gridgate_exe,
                        "gate",
                        "--socket",
                        daemon.socket,
                        "--category",
                        "query",
                        *(["-q"] if quiet else []),
                        "--",
                        "true",
                    ],
                    user="nobody",
                )
            )
            assert until(
                lambda n=queued: status(daemon.socket)["categories"]["query"]["queued"] == n, 60
            )
        quiet_waiter, loud_waiter = waiters
        assert (
            loud_waiter.stderr.readline()
            == "gridgate gate: true: waiting for a query token, 1 ahead\n"
        )
        go.touch()
        for waiter in waiters:
            _out, err = waiter.communicate(timeout=60)
            assert waiter.returncode == 0, err
            assert err == ""  # one line, once (or none when quiet)
    finally:
        go.touch()
        for waiter in waiters:
            if waiter.poll() is None:
                waiter.kill()
                waiter.communicate(timeout=30)
        holder.wait(60)


def test_a_relative_socket_path_works(start_daemon, gridgate_exe, sockdir) -> None:
    daemon = start_daemon({})
    relative = os.path.relpath(daemon.socket, sockdir)
    proc = run(
        [gridgate_exe, "gate", "--socket", relative, "--", "printenv", "GRIDGATE_GATE_TOKEN"],
        cwd=str(sockdir),
    )
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    proc = run(
        [gridgate_exe, "lsfproxyd", "status", "--json", "--socket", relative], cwd=str(sockdir)
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["hosts"][0]["address"] == daemon.socket


def test_a_changed_config_takes_effect_at_the_next_call(gridgate_exe, sockdir, root_cache) -> None:
    config = sockdir / "site.yaml"
    env = {"XDG_CACHE_HOME": str(root_cache)}
    nowhere = str(sockdir / "nobody-listens.sock")
    argv = [gridgate_exe, "gate", "-c", str(config), "--", "true"]
    for when, code in (("fail", 69), ("fail", 69), ("proceed", 0), ("fail", 69)):
        config.write_text(yaml.safe_dump({"proxyd": {"socket": nowhere, "when_unavailable": when}}))
        assert run(argv, env=env).returncode == code
    assert (root_cache / "gridgate" / "gate.json").exists()
    config.write_text("proxyd:\n  when_unavailable: sometimes\n")
    bad = run(argv, env=env)
    assert bad.returncode == 2 and "when_unavailable" in bad.stderr
    # a shim keeps the settings it was installed with, and re-reads a changed file
    config.write_text(yaml.safe_dump({"proxyd": {"socket": nowhere, "when_unavailable": "fail"}}))
    install_shims(sockdir / "shims", ["true"], config=str(config))
    assert run([str(sockdir / "shims" / "true")], env=env).returncode == 69
    config.write_text(
        yaml.safe_dump({"proxyd": {"socket": nowhere, "when_unavailable": "proceed"}})
    )
    assert run([str(sockdir / "shims" / "true")], env=env).returncode == 0


def test_the_fast_path_hands_other_calls_to_the_full_command_line(gridgate_exe) -> None:
    helped = run([gridgate_exe, "gate", "--help"])
    assert helped.returncode == 0 and "--install-shims" in helped.stdout
    bare = run([gridgate_exe, "gate"])
    assert bare.returncode == 2 and "give a command" in bare.stderr
    wrong = run([gridgate_exe, "gate", "--category", "queries", "--", "true"])
    assert wrong.returncode == 2 and "queries" in wrong.stderr


def test_client_defaults_are_the_schema_defaults() -> None:
    from gridgate.plugins.lsf_proxy.config import section_defaults
    from gridgate.plugins.lsf_proxy.gate.gating import CATEGORIES, CLIENT_DEFAULTS

    defaults = section_defaults()
    assert CLIENT_DEFAULTS == {k: defaults.get(k) for k in CLIENT_DEFAULTS}
    # the one reader: a section as written, or already resolved, gets every key
    from gridgate.plugins.lsf_proxy.gate.gating import client_section

    assert client_section({"start_hold": 5, "tcp": "x"}) == {**CLIENT_DEFAULTS, "start_hold": 5}
    assert client_section(None) == client_section(client_section({})) == CLIENT_DEFAULTS
    from gridgate.plugins.lsf_proxy.config import CATEGORIES as SCHEMA_CATEGORIES

    assert CATEGORIES == SCHEMA_CATEGORIES


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("squeue", ["-u", "alice"], False),
        ("squeue", ["-i", "5"], True),
        ("squeue", ["-i5"], True),
        ("squeue", ["--iterate=5"], True),
        ("srun", ["--pty", "bash"], True),
        ("salloc", [], True),
        ("bsub", ["-q", "normal", "job.sh"], False),
        ("bsub", ["-Is", "bash"], True),
        ("bsub", ["-K", "job.sh"], True),
        ("bpeek", ["-f", "12"], True),
        ("bjobs", ["-u", "all"], False),
    ],
)
def test_start_only_commands(name, args, expected) -> None:
    from gridgate.plugins.lsf_proxy.gate.gating import start_only

    assert start_only(name, args) is expected
    assert start_only("mywatch", ["-w"], {"start_only": {"mywatch": ["-w"]}}) is True
    assert start_only("squeue", ["-i", "5"], {"start_only": {"squeue": ["--never"]}}) is False


def test_the_token_is_not_in_a_gated_sbatch_jobs_environment(
    slurm, start_daemon, sockdir, gridgate_exe
) -> None:
    """On the private Slurm cluster: sbatch exports the whole environment into the job. Jobs
    submitted by a gated sbatch, and by a shimmed sbatch inside a gated script (which holds a
    live token), print their environment; neither has the token."""
    daemon = start_daemon({})
    shims = sockdir / "shims"
    path = f"{shims}{os.pathsep}/usr/bin:/bin"
    install_shims(shims, ["sbatch"], socket_path=daemon.socket)
    env = {"PATH": path, **slurm.env, "GRIDGATE_TEST_MARK": "copied"}
    out = Path(slurm.jobs_dir)
    submit = "sbatch --parsable -p batch --output={}/%j.env --wrap 'env'"
    direct = run(
        [gridgate_exe, "gate", "--socket", daemon.socket, "--", "sh", "-c", submit.format(out)],
        user="nobody",
        env=env,
    )
    nested = run(
        [
            gridgate_exe,
            "gate",
            "--socket",
            daemon.socket,
            "--",
            "sh",
            "-c",
            'echo "outer=$GRIDGATE_GATE_TOKEN"; ' + submit.format(out),
        ],
        user="nobody",
        env=env,
    )
    plain = run(
        [
            gridgate_exe,
            "gate",
            "--socket",
            daemon.socket,
            "--",
            "sbatch",
            "--parsable",
            "-p",
            "batch",
            f"--output={out}/%j.env",
            "--wrap",
            "env",
        ],
        user="nobody",
        env=env,
    )
    for proc in (direct, nested, plain):
        assert proc.returncode == 0, proc.stderr
    assert nested.stdout.splitlines()[0] != "outer="  # the script did hold a token
    jobs = [p.stdout.strip().splitlines()[-1] for p in (direct, nested, plain)]
    assert all(j.isdigit() for j in jobs), jobs
    for job in jobs:
        dump = out / f"{job}.env"
        until(
            lambda d=dump: d.exists() and "GRIDGATE_TEST_MARK=copied" in d.read_text(), timeout=120
        )
        assert "GRIDGATE_GATE_TOKEN" not in dump.read_text()


def test_the_gate_signs_its_requests_over_tcp(start_daemon, gridgate_exe, sockdir) -> None:
    """A config naming the daemon by host:port: the gate's own client signs acquire and check
    with the shared key (protocol.sign), and the daemon's verifier accepts them."""
    port = free_port()
    key = sockdir / "proxyd.key"
    key.write_text("a-shared-key\n")
    key.chmod(0o600)
    log = sockdir / "diag.log"
    daemon = start_daemon(
        {
            "tcp": f"127.0.0.1:{port}",
            "key": {"file": str(key)},
            "diagnose": True,
            "diagnose_file": str(log),
        }
    )
    config = sockdir / "client.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "proxyd": {
                    "hosts": [{"name": "tcp1", "address": f"127.0.0.1:{port}"}],
                    "key": {"file": str(key)},
                    "when_unavailable": "fail",
                }
            }
        )
    )
    env = {"XDG_CACHE_HOME": str(sockdir / "cache")}
    argv = [gridgate_exe, "gate", "-c", str(config), "--"]
    outer = run(
        argv + ["sh", "-c", f"printenv GRIDGATE_GATE_TOKEN; {' '.join(argv)} echo nested-ran"],
        env=env,
    )
    assert outer.returncode == 0, outer.stderr
    first, second = outer.stdout.split()
    assert first and second == "nested-ran"
    # the nested call's signed check rode on the live token: no request of its own, one ride
    # line (a grant with no wait, issue 31 item 9) after the outer request's
    lines = log.read_text().splitlines()
    assert len([ln for ln in lines if ",sh," in ln]) == 1
    rides = [ln for ln in lines if ",echo," in ln]
    assert len(rides) == 1 and rides[0].split(",")[4:6] == ["0", "1"]
    key.write_text("another-key\n")
    refused = run(argv + ["true"], env=env)
    assert refused.returncode == 75 and "signature" in refused.stderr
    assert daemon.proc.poll() is None


def test_a_grant_after_a_denial_is_handed_over_too(start_daemon, gridgate_exe, sockdir) -> None:
    """The holder forked while the first request waits gives up when that request is denied;
    the token granted to a later attempt goes to a holder of its own, and comes back."""
    daemon = start_daemon({"policies": "QUERY[max=1 nominal=1]", "token_wait_time": 0.5})
    config = sockdir / "client.yaml"
    config.write_text(yaml.safe_dump({"proxyd": {"socket": daemon.socket, "token_wait_time": 0.5}}))
    config.chmod(0o644)
    shared = sockdir / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    ready, go = shared / "ready", shared / "go"
    gate = [gridgate_exe, "gate", "-c", str(config), "--category", "query", "-q", "--"]
    holder = subprocess.Popen(AS_NOBODY + gate + holding(ready, go), cwd="/")
    waiter = None
    try:
        assert until(ready.exists, 60)
        waiter = start(gate + ["printenv", "GRIDGATE_GATE_TOKEN"], user="nobody")
        # denied at the 0.5 s wait limit while the holder keeps the only token; it tries again
        assert until(lambda: status(daemon.socket)["metrics"]["rejected.query"]["current"] >= 1, 60)
        go.touch()
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
        assert out.strip()
        assert until(lambda: in_use(daemon.socket)["query"] == 0)
        assert until(lambda: status(daemon.socket)["connections"] <= 1)  # holders all gone
    finally:
        go.touch()
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
            waiter.communicate(timeout=30)
        holder.wait(60)


def niceness(stat: str) -> int:
    """Field 19 of /proc/PID/stat (the fields after the command's name start at field 3)."""
    return int(stat.rsplit(")", 1)[1].split()[16])


# As nobody: the in-process client's token says the niceness the grant named (Token.nice).
TOKEN_NICE = """
import sys
from loguru import logger
logger.remove()
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
with ProxyClient([Daemon("proxyd", sys.argv[1])]) as client:
    with client.acquire("query", "squeue") as token:
        print(token.nice)
"""


def in_process_nice(socket: str) -> int:
    done = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", TOKEN_NICE, socket],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_a_busy_users_gated_command_runs_niced(start_daemon, gridgate_exe, sockdir) -> None:
    # two query calls in flight make a user busy here: the second runs at busy_nice
    daemon = start_daemon({"policies": "QUERY[max=4 nominal=4]", "busy_after": 2, "busy_nice": 7})
    gate = [gridgate_exe, "gate", "-q", "--socket", daemon.socket, "--category", "query", "--"]
    stat = [*gate, "/bin/cat", "/proc/self/stat"]
    alone = run(stat, user="nobody")
    assert alone.returncode == 0, alone.stderr
    assert niceness(alone.stdout) == 0
    assert in_process_nice(daemon.socket) == 0
    holders = []
    try:
        for user in ("nobody", "root"):
            argv = [*gate, "/bin/sleep", "60"]
            holders.append(
                subprocess.Popen(AS_NOBODY + argv if user == "nobody" else argv, cwd="/")
            )
        assert until(lambda: in_use(daemon.socket)["query"] == 2)
        busy = run(stat, user="nobody")
        assert busy.returncode == 0, busy.stderr
        assert niceness(busy.stdout) == 7
        # the in-process client hands the same word on to its caller
        assert in_process_nice(daemon.socket) == 7
        # a user who already runs nicer stays there; root and the admins are never niced
        nicer = run(["nice", "-n", "15", *AS_NOBODY, *stat])
        assert niceness(nicer.stdout) == 15
        assert niceness(run(stat).stdout) == 0
        # the first sleep was alone when granted: it runs as it was started
        assert niceness(Path(f"/proc/{holders[0].pid}/stat").read_text()) == 0
    finally:
        for proc in holders:
            proc.kill()
            proc.wait(30)
    assert until(lambda: in_use(daemon.socket)["query"] == 0)
