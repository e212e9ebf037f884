"""The private ARC CE itself (gridgate.plugins.arc.ce), driven by the real ARC client.

A job takes ~20-30 s from submission to a final state on this CE, so each test submits all
it needs first and waits once.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.polling import until
from support.uids import AS_NOBODY

from gridgate.core.runner import run
from gridgate.plugins.arc.ce import PACKAGES, ArcCE, missing_packages

# one xdist worker runs every ARC test, so the suite starts one CE of each kind, not two
pytestmark = pytest.mark.xdist_group("arc")

ENV_NAMES = [
    "X509_USER_PROXY",
    "X509_USER_CERT",
    "X509_USER_KEY",
    "X509_CERT_DIR",
    "ARC_CE_URL",
    "ARC_CE_JOBLIST",
    "ARC_CE_CLIENT_CONF",
]
#: with tokens (the session's fork CE): the pilot's token, its issuer's URL and folder
TOKEN_NAMES = ["ARC_CE_TOKEN", "ARC_CE_ISSUER", "ARC_CE_ISSUER_DIR"]


def _session_id(job_id: str) -> str:
    return job_id.rsplit("/", 1)[-1]


def test_the_ce_answers_arcinfo_with_its_own_credentials(arc, arc_client, tmp_path) -> None:
    assert missing_packages() == [], PACKAGES
    assert list(arc.env) == ENV_NAMES + TOKEN_NAMES
    assert arc.env["ARC_CE_URL"] == arc.url and arc.url.startswith("https://localhost:")
    assert arc.port != 443
    for name in ENV_NAMES + TOKEN_NAMES:
        if name not in ("ARC_CE_URL", "ARC_CE_JOBLIST", "ARC_CE_ISSUER"):
            assert Path(arc.env[name]).exists(), name
    assert Path(arc.env["X509_CERT_DIR"]) == arc.certificates
    assert (arc.usercert, arc.userkey, arc.proxy) == tuple(
        Path(arc.env[n]) for n in ("X509_USER_CERT", "X509_USER_KEY", "X509_USER_PROXY")
    )
    client = arc_client(arc)
    info = client.run("arcinfo", "-c", arc.url)
    assert info.ok and "Computing service:" in info.stdout, (info.stdout, info.stderr)
    assert arc.proxy_seconds_left() > 20 * 3600
    assert not (client.home / ".arc").exists()  # -z keeps the client out of HOME
    assert "Starting jobs' monitoring" in arc.log("arex.log")
    assert f"Listening on TCP port {arc.port}" in arc.log("arex-ws.stdout")
    assert arc.log("infoprovider.log")
    # an expired extra proxy, as a test of expiry needs one
    now = datetime.now(UTC)
    old = arc.make_proxy(
        tmp_path / "old.pem", start=now - timedelta(hours=3), end=now - timedelta(hours=1)
    )
    assert arc.proxy_seconds_left(old) == 0
    expired = arc_client(arc, creds={**arc.env, "X509_USER_PROXY": str(old)})
    refused = expired.run(
        "arcsub", "-C", arc.url, "-T", "arcrest", "-e", '&(executable="/bin/true")'
    )
    assert refused.returncode == 1 and "Proxy expired" in refused.stdout + refused.stderr


def test_jobs_reach_their_final_state_for_the_pilot_and_for_another_user(arc, arc_client) -> None:
    pilot = arc_client(arc)
    ok, failing = pilot.submit(
        '&(executable="/bin/sh")(arguments="-c" "echo hello as $(id -un) in $PWD")'
        '(jobname="gg-ok")(stdout="out.txt")',
        '&(executable="/bin/sh")(arguments="-c" "exit 1")(jobname="gg-fail")',
    )
    # nobody, with credentials of its own (its DN let in without a restart) and an
    # environment built here; its HOME does not exist: -z and -j keep the client out of it
    creds = arc.add_user("nobody")
    assert Path(creds["X509_USER_PROXY"]).stat().st_uid == 65534
    other = arc_client(arc, creds=creds, as_user=AS_NOBODY, home=Path("/nonexistent"))
    [theirs] = other.submit(
        '&(executable="/bin/sh")(arguments="-c" "id -un")(jobname="gg-nobody")(stdout="out.txt")'
    )
    mine = pilot.wait_final([ok, failing])
    assert mine[ok].get("State") == "Finished" and mine[ok].get("Exit Code") == "0", mine
    assert mine[failing].get("State") == "Failed" and mine[failing].get("Exit Code") == "1", mine
    done = other.wait_final([theirs])
    assert done[theirs].get("State") == "Finished", done
    out = Path(arc.folder, "session", _session_id(ok), "out.txt").read_text()
    assert out.startswith("hello as nobody in ") and _session_id(ok) in out
    # each DN sees its own jobs only
    assert theirs not in pilot.status([theirs])
    assert not (pilot.home / ".arc").exists()


def test_a_slurm_ce_runs_its_job_through_slurm(arc_ce_slurm, slurm_cluster, arc_client) -> None:
    # a CE set up with tokens=False: no token issuer, no [authtokens], no token variables
    assert "[authtokens]" not in arc_ce_slurm.arc_conf.read_text()
    assert not set(TOKEN_NAMES) & set(arc_ce_slurm.env)
    assert not Path(arc_ce_slurm.folder, "run", "issuer.pid").exists()
    assert "otokens" not in Path(arc_ce_slurm.folder, "etc", "arex-ws.xml").read_text()
    client = arc_client(arc_ce_slurm)
    # -Q NONE: no brokering, so no queue chosen by the client (its Random broker would pick
    # any partition); the CE then uses its first queue, which must be Slurm's default.
    [job] = client.submit(
        '&(executable="/bin/sh")(arguments="-c" "echo slurm job $SLURM_JOB_ID")'
        '(jobname="gg-slurm")(stdout="out.txt")',
        options=["-Q", "NONE"],
    )
    done = client.wait_final([job])
    assert done[job].get("State") == "Finished" and done[job].get("Exit Code") == "0", done
    local = Path(arc_ce_slurm.folder, "control", f"job.{_session_id(job)}.local").read_text()
    localid = next(line[8:] for line in local.splitlines() if line.startswith("localid="))
    shown = slurm_cluster.scontrol("show", "job", localid).stdout
    assert "JobState=COMPLETED" in shown and "UserId=nobody(" in shown, shown
    assert f"Partition={slurm_cluster.partitions[0]} " in shown, shown
    out = Path(arc_ce_slurm.folder, "session", _session_id(job), "out.txt").read_text()
    assert out.strip() == f"slurm job {localid}"


def test_a_stopped_ce_starts_again_with_its_jobs_and_stop_leaves_nothing(
    arc_client, ce_processes, rest
) -> None:
    # A CE of its own: stopping the shared one would kill other tests' jobs.
    ce = ArcCE().start()
    folder, watchdog, url = ce.folder, ce._watchdog, ce.url
    try:
        client = arc_client(ce)
        [kept] = client.submit('&(executable="/bin/sleep")(arguments="600")(jobname="gg-kept")')
        assert until(lambda: any("sleep 600" in p for p in ce_processes(folder)), 120)
        ce.stop_service()
        assert not ce.running() and ce_processes(folder) == []
        down = client.run("arcinfo", "-c", url)
        assert down.returncode == 1 and "Failed to connect" in down.stdout + down.stderr, down
        began = time.monotonic()
        ce.start()
        assert time.monotonic() - began < 60
        assert ce.running() and ce.url == url
        info = client.run("arcinfo", "-c", url)
        assert info.ok and "Computing service:" in info.stdout, info
        assert kept in client.status([kept])  # the same URL, and the CE still has the job
        # its token issuer came back too, on the same URL: a token is accepted again
        assert rest(ce, "GET", "/jobs", ce.token()).status == 200

        [job] = client.submit('&(executable="/bin/sleep")(arguments="600")(jobname="gg-long")')
        assert until(
            lambda: [p for p in ce_processes(folder) if p.endswith(" /bin/sleep 600 ")], 120
        )
        killed = client.run("arckill", job)
        assert killed.ok and "successfully killed: 1" in killed.stdout, killed
        # Stop while the grid manager cancels it (cancel-fork-job: TERM, sleep 5, KILL). Its
        # payload outlives even a finished cancel (arc.md section 10): only stop() ends it.
        assert until(lambda: any("cancel-fork-job" in p for p in ce_processes(folder)), 90)
        assert any("sleep 600" in p for p in ce_processes(folder))
    finally:
        ce.stop()
    assert ce_processes(folder) == []
    assert not [p for p in _all_cmdlines() if "arched" in p and str(folder) in p]
    assert not folder.exists()
    assert watchdog is not None and watchdog.poll() == 0


def _all_cmdlines() -> list[str]:
    result = run(["ps", "-eo", "args="], 30, env={"PATH": "/usr/bin:/bin"})
    return result.stdout.splitlines()


def test_by_hand_stop_and_start_keep_the_ce_and_its_ports_and_the_issuer_port_is_settable(
    tmp_path,
) -> None:
    """Issue 42: Python had stop/start that keep jobs, the command line only `down` (which
    cancels a Slurm CE's jobs), and the token issuer's port could not be set."""
    import os
    import subprocess
    import sys

    from gridgate.core.devkit.services import free_port

    top = Path(tempfile.mkdtemp(prefix="gg-arc-hand-", dir="/tmp"))  # every parent o+x
    top.chmod(0o755)
    folder = top / "ce"
    issuer = free_port()
    env = {**os.environ, "ARC_CE_ISSUER_PORT": str(issuer), "ARC_CE_INFO_PERIOD": "5"}

    def hand(action: str, *more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gridgate.plugins.arc.ce", action, str(folder), *more],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd="/",
        )

    try:
        up = hand("up")
        assert up.returncode == 0, up.stderr
        assert f"https://localhost:{issuer}" in up.stdout, up.stdout  # the issuer's URL
        running = hand("status")
        assert running.returncode == 0 and "running" in running.stdout, running
        stopped = hand("stop")
        assert stopped.returncode == 0 and "jobs kept" in stopped.stderr, stopped.stderr
        assert hand("status").returncode == 1
        assert (folder / "etc" / "ce.json").exists(), "stop keeps the CE's folder"
        again = hand("start")
        assert again.returncode == 0, again.stderr
        assert again.stdout == up.stdout, "the same URL, issuer and credentials"
        assert hand("status").returncode == 0
    finally:
        hand("down", "--remove")
        shutil.rmtree(top, ignore_errors=True)


def test_an_audience_needs_tokens_and_is_one_word() -> None:
    with pytest.raises(ValueError, match="audience needs tokens=True"):
        ArcCE(tokens=False, audience=True)
    for bad in ("", "https://ce.example.org other"):
        with pytest.raises(ValueError, match="no blank"):
            ArcCE(audience=bad)
    assert ArcCE(audience="https://ce.example.org").audience == "https://ce.example.org"
    assert ArcCE().audience is None
