"""Who went around the gate, on the private Slurm cluster: a real token daemon with
``proxyd.bypass`` reads the real sdiag, real users call the real squeue through the gate's shims
or directly, and what the daemon does about the one who went around it (report, block,
deny_partition, each undone after ``for``) is checked with real commands."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

from support.lsfproxyd import install_shims, system_tool
from support.polling import until
from support.uids import as_user, real_user

from gridgate.plugins.lsf_proxy.cli import render
from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient

SLURM_TOOLS = ("squeue", "sbatch", "sinfo", "scontrol", "sdiag")


def start(start_daemon, sockdir: Path, slurm, extra: dict | None = None, name: str = "", **bypass):
    section = {
        "diagnose": True,
        "diagnose_file": str(sockdir / "diag.log"),
        "bypass": {
            "scheduler": "slurm",
            "scheduler_options": {
                "commands": {"sdiag": system_tool("sdiag"), "scontrol": system_tool("scontrol")},
                "env": dict(slurm.env),
            },
            "audit": {"interval": 1, "tolerance": 3},
            **bypass,
        },
    }
    daemon = start_daemon(section, name=name, extra=extra)
    # the first reading is the baseline; one judged window shows the audit runs
    assert until(lambda: daemon.status()["bypass"]["windows"] >= 1, timeout=30), daemon.log()
    return daemon


def run_as(user: str, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*as_user(user), *argv], capture_output=True, text=True, timeout=120, env=env, cwd="/"
    )


def squeue_loop(user: str, slurm, times: int) -> None:
    """``squeue`` straight to the controller, no token: the bypass."""
    for _ in range(times):
        done = run_as(user, [system_tool("squeue"), "-h"], slurm.client_env())
        assert done.returncode == 0, done.stderr


def test_a_gated_user_is_never_reported_and_one_who_went_around_is(
    slurm, start_daemon, sockdir, gridgate_exe
) -> None:
    daemon = start(start_daemon, sockdir, slurm)
    path, _, _ = install_shims(gridgate_exe, sockdir, daemon, *SLURM_TOOLS)
    gated_env = {"PATH": path, **slurm.env}
    with real_user("gggt") as gated, real_user("ggrg") as rogue:
        for _ in range(15):  # through the gate: a token each
            done = run_as(gated, ["squeue", "-h"], gated_env)
            assert done.returncode == 0, done.stderr
        squeue_loop(rogue, slurm, 40)
        assert until(lambda: f"proxyd.bypass: {rogue} made" in daemon.log(), timeout=30), (
            daemon.log()
        )
        windows = daemon.status()["bypass"]["windows"]
        assert until(lambda: daemon.status()["bypass"]["windows"] >= windows + 2, timeout=30)
        log = daemon.log()
        assert f"proxyd.bypass: {gated} made" not in log, log
        assert f"{rogue} blocked" not in log, "report only reports"
        lines = (sockdir / "diag.log").read_text().splitlines()
        assert any(f"BYPASS,-,{rogue}," in line for line in lines), lines
        assert not any(f"BYPASS,-,{gated}," in line for line in lines)
        # the gated user's calls are in the same log, as requests that held a token
        assert sum(f",{gated}," in line and "QUERY_REQ" in line for line in lines) == 15


def test_block_stops_the_bypassers_gated_calls_for_a_while(
    slurm, start_daemon, sockdir, gridgate_exe
) -> None:
    daemon = start(start_daemon, sockdir, slurm, action="block", **{"for": 4})
    path, _, _ = install_shims(gridgate_exe, sockdir, daemon, *SLURM_TOOLS)
    env = {"PATH": path, **slurm.env}
    with real_user("ggbk") as rogue:
        assert run_as(rogue, ["squeue", "-h"], env).returncode == 0
        squeue_loop(rogue, slurm, 40)
        assert until(lambda: rogue in daemon.status()["bypass"]["acting"], timeout=30), daemon.log()
        refused = run_as(rogue, ["squeue", "-h"], env)
        assert refused.returncode == 75, refused.stderr
        assert f"{rogue} blocked for 4 s" in daemon.log()
        # told who, why and until when (issue 40 item 11), not "the administrator"
        until_text = time.strftime(
            "%a %b %d %H:%M:%S", time.localtime(daemon.status()["bypass"]["acting"][rogue]["until"])
        )
        assert (
            f"request blocked by the bypass audit until {until_text}: user {rogue}'s scheduler "
            "calls went around the gate" in refused.stderr
        ), refused.stderr
        # `lsfproxyd status` says so in its text too, not only under --json
        with ProxyClient([Daemon("proxyd", daemon.socket)]) as client:
            lines = render.status_text(client.admin("status"))
        [audit] = [line for line in lines if line.startswith("  BYPASS_AUDIT: ")]
        assert audit.startswith("  BYPASS_AUDIT: slurm every 1 s, action block, "), audit
        assert f"; acting on: {rogue} (block until " in audit, audit
        # `for` passed: off the blocklist again, by the audit itself
        assert until(lambda: not daemon.status()["bypass"]["acting"], timeout=30)
        assert run_as(rogue, ["squeue", "-h"], env).returncode == 0
        assert f"{rogue} unblocked" in daemon.log()


def test_deny_partition_makes_slurmctld_refuse_the_bypassers_jobs_until_for_passes(
    slurm, start_daemon, sockdir
) -> None:
    daemon = start(start_daemon, sockdir, slurm, action="deny_partition", **{"for": 5})
    sbatch = [system_tool("sbatch"), "-p", "batch", "-o", "/dev/null", "--wrap", "true"]
    try:
        with real_user("ggdp") as rogue:
            # a list: a partition open to ALL is left as it is (docs/proxyd-limits.md)
            slurm.scontrol("update", "PartitionName=batch", f"AllowGroups={rogue},root")
            squeue_loop(rogue, slurm, 40)
            assert until(lambda: rogue in daemon.status()["bypass"]["acting"], timeout=30), (
                daemon.log()
            )
            refused = run_as(rogue, sbatch, slurm.client_env())
            assert refused.returncode != 0
            assert "not permitted to use this partition" in refused.stderr
            assert until(lambda: not daemon.status()["bypass"]["acting"], timeout=30)
            again = run_as(rogue, sbatch, slurm.client_env())
            assert again.returncode == 0, again.stderr
            assert "put back in AllowGroups" in daemon.log()
    finally:
        for partition in slurm.partitions:
            slurm.scontrol("update", f"PartitionName={partition}", "AllowGroups=ALL")


def test_a_denial_refused_by_one_partition_leaves_none_narrowed(
    slurm, start_daemon, sockdir
) -> None:
    # issue 40 item 1 through the daemon: debug (shown first) allows ALL, batch only the
    # bypasser's own group: debug is narrowed, batch refused, and debug must be put back
    try:
        with real_user("ggpf") as rogue:
            slurm.scontrol("update", "PartitionName=debug", f"AllowGroups={rogue},root")
            slurm.scontrol("update", "PartitionName=batch", f"AllowGroups={rogue}")
            daemon = start(start_daemon, sockdir, slurm, action="deny_partition", **{"for": 30})
            squeue_loop(rogue, slurm, 40)
            assert until(lambda: f"{rogue} could not be denied" in daemon.log(), timeout=30), (
                daemon.log()
            )
            assert "batch: " in daemon.log() and "groups are all it allows" in daemon.log()
            assert "debug put back" in daemon.log()
            shown = slurm.scontrol("-o", "show", "partition", "debug").stdout
            assert f" AllowGroups={rogue},root " in f" {shown} ", "debug put back, exactly"
            assert not daemon.status()["bypass"]["acting"]
            sbatch = [system_tool("sbatch"), "-p", "debug", "-o", "/dev/null", "--wrap", "true"]
            assert run_as(rogue, sbatch, slurm.client_env()).returncode == 0
    finally:
        for partition in slurm.partitions:
            slurm.scontrol("update", f"PartitionName={partition}", "AllowGroups=ALL")


def test_a_block_an_older_version_kept_in_its_file_is_lifted_at_its_time(
    slurm, start_daemon, sockdir, gridgate_exe, cli
) -> None:
    with real_user("ggup") as rogue:
        # 20 s: the daemon's start, the block and the shims' install took over 8 s once in a
        # full run at load 12, and the block had ended before it could be seen
        old = {rogue: {"action": "block", "until": time.time() + 20}}
        (sockdir / "bypass.pa.json").write_text(json.dumps(old))
        daemon = start(start_daemon, sockdir, slurm, name="pa", action="block", **{"for": 20})
        assert not (sockdir / "bypass.pa.json").exists(), "read once, into the journal"
        assert daemon.status()["bypass"]["acting"][rogue]["action"] == "block"
        # the block itself, as the older version left it on the blocklist
        assert cli("block", "-u", rogue, "--socket", daemon.socket).returncode == 0
        path, _, _ = install_shims(gridgate_exe, sockdir, daemon, *SLURM_TOOLS)
        env = {"PATH": path, **slurm.env}
        assert run_as(rogue, ["squeue", "-h"], env).returncode == 75
        assert until(lambda: not daemon.status()["bypass"]["acting"], timeout=60), daemon.log()
        assert run_as(rogue, ["squeue", "-h"], env).returncode == 0
        assert f"proxyd.bypass: {rogue} unblocked" in daemon.log()


def test_a_controller_restart_starts_a_new_baseline_and_holds_no_one(
    slurm, start_daemon, sockdir
) -> None:
    daemon = start(start_daemon, sockdir, slurm)
    before = daemon.status()["bypass"]["baselines"]
    slurm.stop_controller()
    try:
        assert until(lambda: daemon.status()["bypass"]["problem"], timeout=30)
        assert "cannot read slurm's counters" in daemon.log()
    finally:
        slurm.start_controller()
    assert until(lambda: daemon.status()["bypass"]["baselines"] > before, timeout=60), daemon.log()
    assert not daemon.status()["bypass"]["problem"]
    assert "made" not in "".join(
        line for line in daemon.log().splitlines() if "proxyd.bypass:" in line
    )


def debug_flags(slurm) -> str:
    shown = slurm.scontrol("show", "config")
    return next(ln for ln in shown.stdout.splitlines() if ln.startswith("DebugFlags"))


def test_diagnose_bypass_logs_each_request_with_whether_it_held_a_token(
    slurm, start_daemon, sockdir, gridgate_exe, cli
) -> None:
    daemon = start(start_daemon, sockdir, slurm)
    path, _, _ = install_shims(gridgate_exe, sockdir, daemon, *SLURM_TOOLS)
    gated_env = {"PATH": path, **slurm.env}
    log = sockdir / "diag.log"
    try:
        with real_user("ggdg") as gated, real_user("ggdr") as rogue:
            on = cli("diagnose", "on", "-c", "bypass", "-t", "0.2", "--socket", daemon.socket)
            assert on.returncode == 0 and "bypass diagnosis ON" in on.stdout, on.stderr
            assert until(lambda: daemon.status()["bypass"]["trace"]["on"], timeout=30)
            assert "Protocol" in debug_flags(slurm)
            for _ in range(3):
                assert run_as(gated, ["squeue", "-h"], gated_env).returncode == 0
            squeue_loop(rogue, slurm, 3)

            def lines(user: str) -> list[list[str]]:
                rows = [ln.split(" ", 4)[4].split(",") for ln in log.read_text().splitlines()]
                return [r for r in rows if r[0] == "SCHEDULER_REQ" and r[2] == user]

            assert until(lambda: len(lines(rogue)) >= 6, timeout=30), log.read_text()
            assert until(lambda: len(lines(gated)) >= 6, timeout=30), log.read_text()
            assert {r[5] for r in lines(rogue)} == {"0"}, "went around: held no token"
            assert {r[5] for r in lines(gated)} == {"1"}, "each while its token was held"
            assert {r[1] for r in lines(rogue)} >= {"REQUEST_JOB_INFO"}
            assert daemon.status()["bypass"]["trace"]["without_token"] >= 6
            # the window (12 s) ends by itself and the controller's flags are as before
            assert until(lambda: not daemon.status()["bypass"]["trace"]["on"], timeout=60)
            assert "Protocol" not in debug_flags(slurm)
            assert "request trace off" in daemon.log()
        refused = cli("diagnose", "on", "-c", "bypass", "-t", "90", "--socket", daemon.socket)
        assert refused.returncode != 0 and "at most 60 minutes" in refused.stderr + refused.stdout
    finally:
        slurm.scontrol("setdebugflags", "-protocol")


def test_diagnose_bypass_needs_the_scheduler(start_daemon, cli) -> None:
    daemon = start_daemon({})
    told = cli("diagnose", "on", "-c", "bypass", "--socket", daemon.socket)
    assert told.returncode != 0 and "proxyd.bypass.scheduler" in told.stderr + told.stdout


def test_a_trace_a_killed_daemon_left_on_is_ended_when_it_starts_again(
    slurm, start_daemon, sockdir, cli
) -> None:
    daemon = start(start_daemon, sockdir, slurm)
    try:
        assert cli("diagnose", "on", "-c", "bypass", "--socket", daemon.socket).returncode == 0
        assert until(lambda: daemon.status()["bypass"]["trace"]["on"], timeout=30)
        daemon.stop(signal.SIGKILL)
        assert "Protocol" in debug_flags(slurm), "nobody switched it back"
        again = start(start_daemon, sockdir, slurm)
        assert "Protocol" not in debug_flags(slurm)
        assert "a request trace left on was ended" in again.log()
    finally:
        slurm.scontrol("setdebugflags", "-protocol")


def test_a_trace_whose_end_failed_is_ended_at_a_later_audit(
    slurm, start_daemon, sockdir, cli
) -> None:
    daemon = start(start_daemon, sockdir, slurm)
    try:
        on = cli("diagnose", "on", "-c", "bypass", "-t", "0.1", "--socket", daemon.socket)
        assert on.returncode == 0, on.stderr
        assert until(lambda: daemon.status()["bypass"]["trace"]["on"], timeout=30)
        slurm.stop_controller()  # the window (6 s) ends while nobody can switch it off
        try:
            assert until(lambda: "could not be switched off" in daemon.log(), timeout=60), (
                daemon.log()
            )
        finally:
            slurm.start_controller()
        assert until(lambda: "request trace off at last" in daemon.log(), timeout=60), daemon.log()
        assert "Protocol" not in debug_flags(slurm)
        assert not daemon.status()["bypass"]["trace"]["problem"]
    finally:
        slurm.scontrol("setdebugflags", "-protocol")


def test_a_user_who_keeps_going_around_the_gate_is_mailed_once(
    slurm, start_daemon, sockdir, smtp_server
) -> None:
    email = {
        "host": "127.0.0.1",
        "port": smtp_server.port,
        "from": "lsfproxyd@example.org",
        "error_address": "batch-admins@example.org",
        "alarm_address": "",
        "dedup_window": 0,
        "poll_interval": 0.05,
        "timeout": 5,
    }
    extra = {"state": {"driver": "memory"}, "notifiers": {"email": email}}
    daemon = start(start_daemon, sockdir, slurm, extra=extra, notify_after=2)
    with real_user("ggml") as rogue:
        stop = threading.Event()

        def loop() -> None:  # several windows in a row, as a cron job's loop would
            while not stop.is_set():
                run_as(rogue, [system_tool("squeue"), "-h"], slurm.client_env())

        worker = threading.Thread(target=loop, daemon=True)
        worker.start()
        try:
            assert until(lambda: smtp_server.handler.messages, timeout=60), daemon.log()
            assert until(lambda: f"{rogue} made" in daemon.log() and "going around" in daemon.log())
        finally:
            stop.set()
            worker.join(60)
        # more windows: still one mail for the run of windows
        windows = daemon.status()["bypass"]["windows"]
        assert until(lambda: daemon.status()["bypass"]["windows"] >= windows + 3, timeout=30)
    [mail] = smtp_server.handler.messages
    text = mail.message.as_string()
    assert mail.rcpt_tos == ("batch-admins@example.org",)
    assert f"{rogue} goes around the gate" in text and "reported only" in text
    assert "diagnose on -c bypass" in text


def two_daemons(start_daemon, sockdir: Path, slurm, **bypass):
    """Daemons pa and pb of one service (proxyd.hosts, heartbeats every second), auditing
    with ``bypass``; returned once pa, the first live one, has judged two windows."""
    hosts = [
        {"name": "pa", "address": str(sockdir / "pa.sock")},
        {"name": "pb", "address": str(sockdir / "pb.sock")},
    ]
    section = {
        "hosts": hosts,
        "socket": "",
        "heartbeat_interval": 1,
        "bypass": {
            "scheduler": "slurm",
            "scheduler_options": {
                "commands": {"sdiag": system_tool("sdiag")},
                "env": dict(slurm.env),
            },
            "audit": {"interval": 1, "tolerance": 3},
            **bypass,
        },
    }
    pa = start_daemon(section, name="pa", config_name="site.yaml")
    pb = start_daemon(section, name="pb", config_name="site.yaml")
    assert until(lambda: pa.status()["bypass"]["windows"] >= 2, timeout=60), pa.log()
    return pa, pb


def test_several_daemons_audit_once_with_every_daemons_grants(
    slurm, start_daemon, sockdir, gridgate_exe
) -> None:
    pa, pb = two_daemons(start_daemon, sockdir, slurm)
    assert "audited by pa" in pb.status()["bypass"]["skipped"]
    # the gated user's tokens come from pb only: pa must count them
    path, _, _ = install_shims(gridgate_exe, sockdir, pb, *SLURM_TOOLS)
    with real_user("ggpg") as gated, real_user("ggpr") as rogue:
        for _ in range(20):
            done = run_as(gated, ["squeue", "-h"], {"PATH": path, **slurm.env})
            assert done.returncode == 0, done.stderr
        squeue_loop(rogue, slurm, 40)
        assert until(lambda: f"proxyd.bypass: {rogue} made" in pa.log(), timeout=60), pa.log()
        windows = pa.status()["bypass"]["windows"]
        assert until(lambda: pa.status()["bypass"]["windows"] >= windows + 2, timeout=60)
        assert f"proxyd.bypass: {gated} made" not in pa.log(), pa.log()
        assert "proxyd.bypass:" not in "".join(
            ln for ln in pb.log().splitlines() if " made " in ln
        ), "one auditor for the service"


def test_a_block_of_the_auditor_reaches_every_daemon_of_the_service_and_ends_there_too(
    slurm, start_daemon, sockdir, gridgate_exe
) -> None:
    pa, pb = two_daemons(start_daemon, sockdir, slurm, action="block", **{"for": 8})
    # the rogue's gated calls go through pb, which does not audit: pa's block must reach it
    path, _, _ = install_shims(gridgate_exe, sockdir, pb, *SLURM_TOOLS)
    env = {"PATH": path, **slurm.env}
    with real_user("ggsb") as rogue:
        assert run_as(rogue, ["squeue", "-h"], env).returncode == 0
        squeue_loop(rogue, slurm, 40)
        assert until(lambda: rogue in pa.status()["bypass"]["acting"], timeout=60), pa.log()
        assert until(lambda: rogue in pb.status()["bypass"]["acting"], timeout=30), pb.log()
        assert pb.status()["bypass"]["acting"][rogue]["from"] == "pa"
        refused = run_as(rogue, ["squeue", "-h"], env)
        assert refused.returncode == 75, refused.stderr
        assert f"proxyd.bypass: {rogue} blocked for " in pb.log()
        assert ", as pa's audit blocked it" in pb.log()
        # `for` passed: each daemon lifts the block itself
        assert until(lambda: not pb.status()["bypass"]["acting"], timeout=40), pb.log()
        assert until(lambda: not pa.status()["bypass"]["acting"], timeout=30), pa.log()
        assert run_as(rogue, ["squeue", "-h"], env).returncode == 0
        assert f"proxyd.bypass: {rogue} unblocked" in pb.log()


def test_an_operators_block_is_left_to_the_operator(
    slurm, start_daemon, sockdir, gridgate_exe, cli
) -> None:
    daemon = start(start_daemon, sockdir, slurm, action="block", **{"for": 2})
    path, _, _ = install_shims(gridgate_exe, sockdir, daemon, *SLURM_TOOLS)
    env = {"PATH": path, **slurm.env}
    with real_user("ggob") as rogue:
        done = cli("block", "-u", rogue, "--socket", daemon.socket)
        assert done.returncode == 0, done.stderr
        squeue_loop(rogue, slurm, 40)
        assert until(lambda: f"proxyd.bypass: {rogue} made" in daemon.log(), timeout=30)
        windows = daemon.status()["bypass"]["windows"]
        # more than `for` later: the audit neither took the block over nor lifted it
        assert until(lambda: daemon.status()["bypass"]["windows"] >= windows + 4, timeout=30)
        assert rogue not in daemon.status()["bypass"]["acting"]
        assert run_as(rogue, ["squeue", "-h"], env).returncode == 75
        assert f"{rogue} unblocked" not in daemon.log()


def test_a_denial_made_by_one_daemon_is_put_back_by_another_on_the_shared_store(
    slurm, start_daemon, sockdir, tmp_path
) -> None:
    """``heartbeat_via: state``: the daemons of a service share the site's Redis, and the
    Slurm plugin keeps its journal there, not in each daemon's folder: when the auditor that
    denied a bypasser dies, the daemon that takes over puts the partitions back at ``for``."""
    from support.redis_server import RedisServer

    (sockdir / "b").mkdir(mode=0o755)
    hosts = [
        {"name": "pa", "address": str(sockdir / "pa.sock")},
        {"name": "pb", "address": str(sockdir / "b" / "pb.sock")},  # a folder of its own
    ]
    try:
        with RedisServer(tmp_path / "redis") as server, real_user("ggsh") as rogue:
            section = {
                "hosts": hosts,
                "socket": "",
                "heartbeat_interval": 1,
                "heartbeat_via": "state",
                "bypass": {
                    "scheduler": "slurm",
                    "scheduler_options": {
                        "commands": {
                            "sdiag": system_tool("sdiag"),
                            "scontrol": system_tool("scontrol"),
                        },
                        "env": dict(slurm.env),
                    },
                    "audit": {"interval": 1, "tolerance": 3},
                    "action": "deny_partition",
                    "for": 15,
                },
            }
            extra = {"state": {"driver": "redis", "url": server.url, "prefix": "gg-deny:"}}
            for partition in slurm.partitions:  # lists: an ALL partition is left as it is
                slurm.scontrol("update", f"PartitionName={partition}", f"AllowGroups={rogue},root")
            pa = start_daemon(section, name="pa", config_name="site.yaml", extra=extra)
            pb = start_daemon(section, name="pb", config_name="site.yaml", extra=extra)
            assert until(lambda: pa.status()["bypass"]["windows"] >= 2, timeout=60), pa.log()
            squeue_loop(rogue, slurm, 40)
            assert until(lambda: rogue in pa.status()["bypass"]["acting"], timeout=60), pa.log()
            shown = slurm.scontrol("-o", "show", "partition", "debug").stdout
            assert " AllowGroups=root " in f" {shown} ", "denied"
            pa.stop(signal.SIGKILL)  # the auditor dies while the denial is in force
            assert until(lambda: not pb.status()["bypass"]["acting"], timeout=60), pb.log()
            for partition in slurm.partitions:
                shown = slurm.scontrol("-o", "show", "partition", partition).stdout
                assert f" AllowGroups={rogue},root " in f" {shown} ", (partition, shown, pb.log())
            assert "was not denied here" not in pb.log()
    finally:
        for partition in slurm.partitions:
            slurm.scontrol("update", f"PartitionName={partition}", "AllowGroups=ALL")


def blocked_users(daemon) -> list[str]:
    with ProxyClient([Daemon("proxyd", daemon.socket)]) as client:
        [reply] = client.admin("blocklist")
    return reply.reply["blocklist"]["users"]


def test_the_audits_undo_leaves_an_operators_block_in_its_place(
    slurm, start_daemon, sockdir, cli
) -> None:
    """Issue 40 item 10: an operator blocks a user the audit blocked (on the auditor, and on
    a peer that adopted the audit's block) during ``for``: at ``for``'s end the audit lifts
    only the block it made, which is no longer in force: the operator's stays on both."""
    pa, pb = two_daemons(start_daemon, sockdir, slurm, action="block", **{"for": 8})
    with real_user("ggop") as rogue:
        squeue_loop(rogue, slurm, 40)
        assert until(lambda: rogue in pa.status()["bypass"]["acting"], timeout=60), pa.log()
        assert until(lambda: rogue in pb.status()["bypass"]["acting"], timeout=30), pb.log()
        for daemon in (pa, pb):  # the operator's own block, over the audit's
            done = cli("block", "-u", rogue, "--socket", daemon.socket)
            assert done.returncode == 0, done.stderr
        assert until(lambda: not pa.status()["bypass"]["acting"], timeout=40), pa.log()
        assert until(lambda: not pb.status()["bypass"]["acting"], timeout=40), pb.log()
        assert rogue in blocked_users(pa) and rogue in blocked_users(pb)
        assert f"{rogue} unblocked" not in pa.log() + pb.log()
