"""What a client may choose, against real daemons and real uids (issue 21, items 9, 13-15, 17):
a nested gated call rides on its parent's token one at a time and only in its category, never
for a blocked user; a submission command never carries the token whatever category it is gated
in; root's gate keeps no cache outside its own home and follows no link to one; seconds have
a maximum; a category's hold limit binds every command name; an admin is not privileged."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from support.polling import until
from support.uids import AS_NOBODY

from gridgate.core.config import ConfigError, load_config
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient
from gridgate.plugins.lsf_proxy.config import SECTION_SCHEMA
from gridgate.plugins.lsf_proxy.director.admission import ProxyAdmission

PYTHON = sys.executable
NOBODY = pwd.getpwnam("nobody")


def status(socket: str) -> dict:
    with ProxyClient([Daemon("proxyd", socket)]) as client:
        [reply] = client.admin("status")
    return reply.reply["status"]


def run(
    argv: list[str], user: str = "root", env: dict | None = None, drop: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("GRIDGATE_GATE_TOKEN", *drop)}
    full.update(env or {})
    argv = AS_NOBODY + argv if user == "nobody" else argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/", env=full)


@pytest.fixture
def shared(sockdir: Path) -> Path:
    """A folder every user may write, sticky as /tmp."""
    path = sockdir / "shared"
    path.mkdir()
    path.chmod(0o1777)
    return path


# --- item 9: a nested call rides on its parent's token ------------------------------------

#: A nested command: counts the nested commands running beside it (itself included) in a
#: line of its own, runs a moment so that overlaps show, then leaves.
SPAN = """import os, sys, time
me = os.path.join(sys.argv[1], f"run.{os.getpid()}")
open(me, "w").close()
beside = len([n for n in os.listdir(sys.argv[1]) if n.startswith("run.")])
with open(os.path.join(sys.argv[1], "spans"), "a") as out:
    out.write(f"{beside}\\n")
time.sleep(0.3)
os.unlink(me)
"""


def test_nested_calls_ride_one_at_a_time_and_only_in_their_category(
    start_daemon, gridgate_exe, shared, sockdir
) -> None:
    log = sockdir / "diagnose.log"
    daemon = start_daemon(
        {
            "policies": "QUERY[max=1 nominal=1] OTHER[max=1 nominal=1]",
            "diagnose": True,
            "diagnose_file": str(log),
            "metrics_port": 0,
        }
    )
    span = shared / "span.py"
    span.write_text(SPAN)
    gate = f"{gridgate_exe} gate --socket {daemon.socket} -q"
    nested = f"{gate} --category query -- {PYTHON} {span} {shared}"
    script = f"for i in 1 2 3 4 5 6 7 8; do {nested} & done; wait; {gate} --category other -- true"
    proc = run(
        [
            gridgate_exe,
            "gate",
            "--socket",
            daemon.socket,
            "-q",
            "--category",
            "query",
            "--",
            "sh",
            "-c",
            script,
        ],
        user="nobody",
    )
    assert proc.returncode == 0, proc.stderr
    spans = [int(n) for n in (shared / "spans").read_text().split()]
    assert len(spans) == 8  # every nested call ran, in turn on the parent's one query token
    assert max(spans) == 1, spans
    # the nested `other` call took an other token of its own (the query token covers no other)
    assert status(daemon.socket)["metrics"]["requests.other"]["current"] == 1
    assert until(
        lambda: all(c["in_use"] == 0 for c in status(daemon.socket)["categories"].values())
    )
    # issue 31, item 9: every ride is a grant: in the diagnostic log, and in grants_total
    lines = log.read_text().splitlines()
    assert sum(",".join(line.split(",")[:1]).endswith("QUERY_REQ") for line in lines) == 9
    assert all(line.split(",")[5] == "1" for line in lines), lines
    import urllib.request

    port = daemon.info["metrics_port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'gridgate_proxyd_grants_total{category="query"} 9.0' in text
    assert 'gridgate_proxyd_grants_total{category="other"} 1.0' in text


PARENT = """import os, subprocess, sys, time
shared = sys.argv[1]
open(os.path.join(shared, "ready"), "w").close()
end = time.monotonic() + 60
while time.monotonic() < end and not os.path.exists(os.path.join(shared, "go")):
    time.sleep(0.02)
rc = subprocess.call(sys.argv[2:])
open(os.path.join(shared, "rc"), "w").write(str(rc))
"""


def test_a_user_blocked_after_taking_the_token_runs_no_nested_call(
    start_daemon, gridgate_exe, cli, shared
) -> None:
    daemon = start_daemon({})
    parent = shared / "parent.py"
    parent.write_text(PARENT)
    marker = shared / "ran"
    gate = [gridgate_exe, "gate", "--socket", daemon.socket, "-q", "--category", "query", "--"]
    outer = subprocess.Popen(
        AS_NOBODY + gate + [PYTHON, str(parent), str(shared), *gate, "/usr/bin/touch", str(marker)],
        cwd="/",
        env={k: v for k, v in os.environ.items() if k != "GRIDGATE_GATE_TOKEN"},
    )
    try:
        assert until((shared / "ready").exists, 60)
        assert cli("block", "-u", "nobody", "--socket", daemon.socket).returncode == 0
        (shared / "go").touch()
        assert outer.wait(60) == 0
    finally:
        (shared / "go").touch()
        if outer.poll() is None:
            outer.kill()
            outer.wait(30)
    assert (shared / "rc").read_text() == "75"
    assert not marker.exists()


# --- item 14: the command decides whether it carries the token ----------------------------


def test_a_submission_command_never_carries_the_token_whatever_its_category(
    start_daemon, gridgate_exe, shared, sockdir
) -> None:
    daemon = start_daemon({})
    bin_dir = shared / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "bsub", "qsub", "condor_submit"):
        fake = bin_dir / name  # stands for the real one: prints what its jobs would inherit
        fake.write_text('#!/bin/sh\necho "token=$GRIDGATE_GATE_TOKEN"\n')
        fake.chmod(0o755)
    config = sockdir / "moved.yaml"
    config.write_text(
        yaml.safe_dump(
            {"proxyd": {"socket": daemon.socket, "categories": {"query": ["sbatch", "qsub"]}}}
        )
    )
    config.chmod(0o644)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "XDG_CACHE_HOME": str(shared / "cache")}
    calls = [
        ["--category", "query", "--", "sbatch"],
        ["--category", "other", "--", "bsub"],
        ["--category", "query", "--", str(bin_dir / "condor_submit")],
        ["-c", str(config), "--", "sbatch"],
        ["-c", str(config), "--", "qsub"],
    ]
    for call in calls:
        proc = run([gridgate_exe, "gate", "--socket", daemon.socket, *call], user="nobody", env=env)
        assert proc.returncode == 0, (call, proc.stderr)
        assert proc.stdout.strip() == "token=", (call, proc.stdout)
    # a query command still carries it (nested calls ride on it)
    printed = run(
        [gridgate_exe, "gate", "--socket", daemon.socket, "--", "printenv", "GRIDGATE_GATE_TOKEN"],
        user="nobody",
        env=env,
    )
    assert printed.returncode == 0 and printed.stdout.strip()


def test_a_nested_submission_command_never_rides_whatever_its_category(
    start_daemon, gridgate_exe, shared
) -> None:
    """Gated as query inside a gated query script, sbatch would ride on the script's query
    token and submit outside the submission limits: it asks for a token of its own (here
    none is free: the script holds the only one), while a query command rides."""
    daemon = start_daemon({"policies": "QUERY[max=1 nominal=1]", "token_wait_time": 0.5})
    fake = shared / "sbatch"
    fake.write_text("#!/bin/sh\necho submitted\n")
    fake.chmod(0o755)
    config = shared / "client.yaml"
    config.write_text(
        json.dumps(
            {"proxyd": {"socket": daemon.socket, "token_wait_time": 0.5, "notoken_ntries": 1}}
        )
    )
    config.chmod(0o644)
    gate = f"{gridgate_exe} gate -c {config} -q --category query --"
    script = f"{gate} {fake}; echo sbatch=$?; {gate} /bin/echo query-rode"
    proc = run(
        [*gate.split(), "sh", "-c", script],
        user="nobody",
        env={"XDG_CACHE_HOME": str(shared / "c")},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["sbatch=75", "query-rode"], proc.stdout


# --- item 15: root's cache ----------------------------------------------------------------


def test_roots_gate_writes_no_cache_through_a_link_or_outside_its_home(
    start_daemon, gridgate_exe, shared, sockdir
) -> None:
    daemon = start_daemon({})
    home = shared / "home"  # another user's home, as with sudo without -H
    home.mkdir()
    os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
    victim = sockdir / "victim"  # a root-owned folder root's gate must not write into
    victim.mkdir()
    victim.chmod(0o755)
    (home / ".cache").mkdir()
    os.chown(home / ".cache", NOBODY.pw_uid, NOBODY.pw_gid)
    (home / ".cache" / "gridgate").symlink_to(victim)
    os.lchown(home / ".cache" / "gridgate", NOBODY.pw_uid, NOBODY.pw_gid)
    argv = [gridgate_exe, "gate", "--socket", daemon.socket, "--", "true"]
    assert run(argv, env={"HOME": str(home)}, drop=("XDG_CACHE_HOME",)).returncode == 0
    # ~/.cache itself a link to a root-owned folder that holds a gridgate folder
    (victim / "gridgate").mkdir(mode=0o700)
    (home / ".cache" / "gridgate").unlink()
    (home / ".cache").rename(home / "old-cache")
    (home / ".cache").symlink_to(victim)
    assert run(argv, env={"HOME": str(home)}, drop=("XDG_CACHE_HOME",)).returncode == 0
    # a root-owned folder outside root's home, named by XDG_CACHE_HOME
    assert run(argv, env={"XDG_CACHE_HOME": str(victim)}).returncode == 0
    assert sorted(p.name for p in victim.rglob("*")) == ["gridgate"]
    # root's own home still caches, and so does an ordinary user in a folder of its own
    own = Path(tempfile.mkdtemp(prefix=".gg-cache-", dir=pwd.getpwuid(0).pw_dir))
    try:
        assert run(argv, env={"XDG_CACHE_HOME": str(own)}).returncode == 0
        assert (own / "gridgate" / "gate.json").is_file()
    finally:
        shutil.rmtree(own)
    mine = shared / "nobody-cache"
    assert run(["mkdir", "-m", "700", str(mine)], user="nobody").returncode == 0
    assert run(argv, user="nobody", env={"XDG_CACHE_HOME": str(mine)}).returncode == 0
    assert (mine / "gridgate" / "gate.json").is_file()


# --- item 17: numbers with a maximum; hold limits nobody dodges by name -------------------


def _seconds_keys(schema: dict) -> list[str]:
    return sorted(
        k
        for k, v in schema["properties"].items()
        if "number" in ([v.get("type")] if isinstance(v.get("type"), str) else v.get("type") or [])
    )


def test_every_number_of_seconds_has_a_maximum_and_a_huge_one_is_refused(
    write, gridgate_exe, sockdir
) -> None:
    schemas = {"proxyd": SECTION_SCHEMA, "admission": ProxyAdmission.config_schema}
    for name, schema in schemas.items():
        for key in _seconds_keys(schema):
            assert "maximum" in schema["properties"][key], (name, key)
    for key in _seconds_keys(SECTION_SCHEMA):
        for value in ("1.0e+10", ".inf"):
            with pytest.raises(ConfigError, match=key):
                load_config(write("site.yaml", f"proxyd:\n  {key}: {value}\n"))
    for text in (
        "hold_limits: {squeue: 1.0e+10}",
        "rate_limit: {query: {refill_period: 1.0e+10}}",
        'policies: "QUERY[max=4 throttle=100000000000]"',
    ):
        with pytest.raises(ConfigError):
            load_config(write("site.yaml", f"proxyd:\n  {text}\n"))
    # the gate says which key, instead of dying in OverflowError while it waits
    config = sockdir / "huge.yaml"
    config.write_text(f"proxyd:\n  socket: {sockdir}/none.sock\n  token_wait_time: 1.0e+10\n")
    proc = run(
        [gridgate_exe, "gate", "-c", str(config), "--", "true"],
        env={"XDG_CACHE_HOME": str(sockdir / "cache")},
    )
    assert proc.returncode == 2 and "token_wait_time" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_category_hold_limit_binds_every_command_name(start_daemon, gridgate_exe, shared) -> None:
    daemon = start_daemon({"hold_limits": {"query": 40, "squeue": 20}})
    ready, go = shared / "ready", shared / "go"
    hold = (
        f"import os, time\nopen({str(ready)!r}, 'w').close()\nend = time.monotonic() + 60\n"
        f"while time.monotonic() < end and not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.02)\n"
    )
    copy = shared / "myq"  # a renamed copy of the command
    shutil.copy(PYTHON, copy)
    copy.chmod(0o755)
    gate = [gridgate_exe, "gate", "--socket", daemon.socket, "-q", "--category", "query"]
    held = []
    try:
        for argv in (
            [*gate, "--opcode", "X", "--", PYTHON, "-c", hold],
            [*gate, "--", str(copy), "-c", hold],
        ):
            ready.unlink(missing_ok=True)
            held.append(subprocess.Popen(AS_NOBODY + argv, cwd="/"))
            assert until(ready.exists, 60)
        tokens = until(
            lambda: (
                [t for t in status(daemon.socket)["longest_held"] if t["user"] == "nobody"][1:]
                and [t for t in status(daemon.socket)["longest_held"] if t["user"] == "nobody"]
            )
        )
        assert sorted(t["opcode"] for t in tokens) == ["X", "myq"]
        assert all(t["left"] <= 40 for t in tokens), tokens  # not lease_time's 300
    finally:
        go.touch()
        for proc in held:
            proc.wait(60)


# --- item 13: an admin service account is paced ------------------------------------------


def test_an_admin_service_account_is_paced_when_privileged_leaves_it_out(
    start_daemon, gridgate_exe, shared
) -> None:
    daemon = start_daemon(
        {
            "policies": "SUBMISSION[max=1 nominal=1]",
            "token_wait_time": 0.5,
            "admins": ["root", "nobody"],
            "privileged": ["root"],
        }
    )
    ready, go = shared / "ready", shared / "go"
    hold = (
        f"import os, time\nopen({str(ready)!r}, 'w').close()\nend = time.monotonic() + 60\n"
        f"while time.monotonic() < end and not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.02)\n"
    )
    gate = [gridgate_exe, "gate", "--socket", daemon.socket, "-q", "--category", "submission"]
    first = subprocess.Popen(AS_NOBODY + [*gate, "--", PYTHON, "-c", hold], cwd="/")
    try:
        assert until(ready.exists, 60)
        config = shared / "client.yaml"
        config.write_text(
            json.dumps(
                {"proxyd": {"socket": daemon.socket, "token_wait_time": 0.5, "notoken_ntries": 1}}
            )
        )
        config.chmod(0o644)
        second = run(
            [
                gridgate_exe,
                "gate",
                "-c",
                str(config),
                "-q",
                "--category",
                "submission",
                "--",
                "true",
            ],
            user="nobody",
            env={"XDG_CACHE_HOME": str(shared / "c")},
        )
        assert second.returncode == 75, second.stderr  # paced: denied at the wait limit
        row = status(daemon.socket)["categories"]["submission"]
        assert (row["in_use"], row["in_use_privileged"]) == (1, 0)
        # still an admin: the admin commands answer it
        with_admin = run(
            [gridgate_exe, "lsfproxyd", "status", "--socket", daemon.socket], user="nobody"
        )
        assert with_admin.returncode == 0, with_admin.stderr
    finally:
        go.touch()
        first.wait(60)


def test_a_director_served_as_privileged_says_so_once(start_daemon) -> None:
    """mode: remote, as root (or an account in privileged): nothing it submits is paced, which
    the operator must hear of rather than find out from a flattened scheduler."""
    from loguru import logger

    from gridgate.core.model import AdmissionRequest, Endpoint
    from gridgate.core.plugins import PluginContext
    from gridgate.core.testing import section_for

    daemon = start_daemon({})
    plugin = ProxyAdmission(
        section_for(ProxyAdmission, {"mode": "remote", "socket": daemon.socket}),
        PluginContext(config={}),
    )
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        endpoint = Endpoint("wms_glite", "wms01.example.org")
        grants = [
            plugin.gridgate_admit(
                request=AdmissionRequest(
                    category="submission",
                    opcode="JOB_SUBMIT",
                    user="root",
                    size=1,
                    endpoint=endpoint,
                )
            )
            for _ in range(3)
        ]
        for grant in grants:
            plugin.gridgate_release(grant=grant)
    finally:
        logger.remove(sink)
        plugin.close()
    assert len([ln for ln in lines if "privileged" in ln]) == 1, lines


def test_shims_are_not_written_into_a_folder_others_may_change(gridgate_exe, shared) -> None:
    """Further member of item 15: a shim folder others may write lets them replace the shims
    every user runs, or plant a link where root is about to write one."""
    for mode in (0o777, 0o775, 0o1777):
        folder = shared / f"shims-{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        proc = run([gridgate_exe, "gate", "--install-shims", str(folder), "--shim", "squeue"])
        assert proc.returncode == 1 and "may write" in proc.stderr, (mode, proc.stderr)
        assert list(folder.iterdir()) == []
    mine = shared / "shims-ok"
    proc = run([gridgate_exe, "gate", "--install-shims", str(mine), "--shim", "squeue"])
    assert proc.returncode == 0, proc.stderr
    assert (mine / "squeue").is_file()
