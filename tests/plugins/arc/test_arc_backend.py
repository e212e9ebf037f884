"""The arc backend against a real ARC CE (A-REX 6.17 from Debian's packages, started by the
fixtures in conftest.py), driven as a site drives it: `gridgate run -c site.yaml --once --json`
with the issue's pinned sections, a managed proxy, through each interface (the module runs
once with ``interface: cli``, the real arcsub/arcstat/arckill/arcclean, and once with
``interface: rest``, A-REX's REST interface). What the CE has is read with the real ARC client
in both (for REST pilots, ``arcsync`` first makes a job list of what the CE holds).

A CE job takes 20-40 s from submission to a final state (arc.md section 4), so the pilots of
every scenario are submitted once, at the start of the module (``scenario``), and each test
then waits for its own outcome: the waits overlap instead of adding up. The module runs in
one xdist group, so one worker starts the CEs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from support.polling import until
from support.redis_server import RedisServer

from gridgate.core.model import CommandResult
from gridgate.core.runner import run

pytestmark = pytest.mark.xdist_group("arc")

BIN = Path(sys.executable).parent
#: The ARC client comes from Debian's packages; the tests name its folder, not the machine's PATH.
SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


def proxy_end(path: Path) -> datetime:
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc


@pytest.fixture(scope="module", params=["cli", "rest"])
def interface(request) -> str:
    """The backend's ``interface``: every test of this module runs with each."""
    return request.param


class ArcSite:
    """A gridgate config for the ``arc`` backend on one CE, and gridgate's commands on it."""

    def __init__(
        self,
        ce: Any,
        folder: Path,
        pilot: str,
        *,
        endpoints: list[Any] | None = None,
        interface: str = "cli",
    ) -> None:
        self.ce = ce
        self.interface = interface
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.home = folder / "home"  # the client must never write ~/.arc: HOME is watched
        self.home.mkdir(exist_ok=True)
        self.state_dir = folder / "state"
        self.notes = folder / "notes"
        self.script = folder / "pilot.sh"
        self.script.write_text(f"#!/bin/sh\n{pilot}\n", encoding="utf-8")
        self.script.chmod(0o755)
        self.proxy = folder / "proxy.pem"
        shutil.copyfile(ce.proxy, self.proxy)
        self.proxy.chmod(0o600)
        self.endpoints = endpoints or [ce.url]

    def renew_argv(self, usercert: str | None = None) -> list[str]:
        return [
            "/usr/bin/arcproxy",
            "-z",
            str(self.ce.env["ARC_CE_CLIENT_CONF"]),
            "-C",
            usercert or str(self.ce.usercert),
            "-K",
            str(self.ce.userkey),
            "-T",
            str(self.ce.certificates),
            "-P",
            str(self.proxy),
            "-c",
            "validityPeriod=12H",
        ]

    def doc(
        self,
        pilots: int = 2,
        *,
        paused: bool = False,
        renew: list[str] | None = None,
        **backend: Any,
    ) -> dict[str, Any]:
        return {
            "director": {
                "state_dir": str(self.state_dir),
                "command_timeout": 60,
                "max_threads": 4,
                "paused": paused,
                "pilots": {"abort_min_finished": 2, "abort_window": 5},
            },
            "state": {"driver": "sqlite", "path": str(self.state_dir / "state.db")},
            "credentials": {
                "x509_proxy": {
                    "path": str(self.proxy),
                    "min_lifetime": 3600,
                    "renew": renew or self.renew_argv(),
                }
            },
            "backends": {
                "arc": {
                    "interface": self.interface,
                    "endpoints": self.endpoints,
                    "script": str(self.script),
                    "env": {"X509_CERT_DIR": str(self.ce.certificates)},
                    "command_timeout": 60,
                    **backend,
                }
            },
            "demand": {"static": {"arc": pilots}},
            "notifiers": {"files": {"folder": str(self.notes)}},
        }

    def write(self, doc: dict[str, Any]) -> Path:
        path = self.folder / "site.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        return path

    def env(self) -> dict[str, str]:
        return {"PATH": SYSTEM_PATH, "HOME": str(self.home), "LANG": "C.UTF-8"}

    def gridgate(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "gridgate"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
        )

    def run_once(self, doc: dict[str, Any]) -> dict[str, Any]:
        proc = self.gridgate("run", "-c", str(self.write(doc)), "--once", "--json")
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        assert len(lines) == 1, proc.stdout
        return lines[0]

    def pilots(self) -> list[dict[str, Any]]:
        proc = self.gridgate("pilots", "list", "-c", str(self.folder / "site.yaml"), "--json")
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        return data["pilots"] if isinstance(data, dict) else data

    def client_files(self, endpoint_folder: str | None = None) -> tuple[Path, Path]:
        folders = sorted((self.state_dir / "arc").iterdir())
        folder = self.state_dir / "arc" / endpoint_folder if endpoint_folder else folders[0]
        return folder / "client.conf", folder / "jobs.dat"

    def arcstat(self, ids: list[str]) -> CommandResult:
        """The real arcstat of ``ids``: with the backend's own job list (cli), or with one that
        arcsync makes of every job the CE holds for this DN (rest: no job list is kept)."""
        env = {
            **self.env(),
            "X509_USER_PROXY": str(self.proxy),
            "X509_CERT_DIR": str(self.ce.certificates),
        }
        if self.interface == "rest":
            conf = Path(self.ce.env["ARC_CE_CLIENT_CONF"])
            jobs = self.folder / "synced.dat"
            jobs.unlink(missing_ok=True)
            synced = run(
                ["/usr/bin/arcsync", "-z", str(conf), "-j", str(jobs), "-f", "-C", self.ce.url],
                60,
                env=env,
            )
            assert synced.ok, synced.stdout + synced.stderr
        else:
            conf, jobs = self.client_files()
        return run(["/usr/bin/arcstat", "-z", str(conf), "-j", str(jobs), *ids], 60, env=env)

    def session_gone(self, job: str, timeout: float = 90.0) -> bool:
        """Whether ``job``'s session folder on the CE is gone (REST's clean is done by the CE
        once it took it: allow it a moment)."""
        folder = self.ce.folder / "session" / job.rsplit("/", 1)[-1]
        return bool(until(lambda: not folder.exists(), timeout=timeout, pause=2))

    def wait_for_states(self, want: set[str], timeout: float = 240.0) -> list[dict[str, Any]]:
        """Poll (paused director: no new pilots) until every pilot is in one of ``want``."""
        doc = self.doc(paused=True)
        seen: list[list[dict[str, Any]]] = []

        def settled() -> list[dict[str, Any]] | None:
            self.last = self.run_once(doc)
            seen.append(self.pilots())
            done = seen[-1] and all(p["state"] in want for p in seen[-1])
            return seen[-1] if done else None

        pilots = until(settled, timeout=timeout, pause=3)
        assert pilots, f"pilots still {[(p['state'], p.get('native')) for p in seen[-1]]}"
        return pilots


def submitted_ids(summary: dict[str, Any]) -> list[str]:
    return [j for row in summary["submitted"] for j in row["job_ids"]]


@pytest.fixture(scope="module")
def scenario(arc_ce, arc_ce_slurm, tmp_path_factory, interface):
    """Every scenario's pilots, submitted at once: healthy ones, failing ones, one that runs
    until cancelled, and healthy ones on the CE whose LRMS is the private Slurm cluster."""
    root = tmp_path_factory.mktemp(f"arc-scenario-{interface}")
    pilots = {
        "ok": (arc_ce, "echo pilot ok on $(hostname); exit 0"),
        "fail": (arc_ce, "echo pilot cannot start its payload >&2; exit 1"),
        "long": (arc_ce, "sleep 600"),
        "slurm": (arc_ce_slurm, "echo pilot via slurm; exit 0"),
    }
    sites = {
        name: ArcSite(ce, root / name, pilot, interface=interface)
        for name, (ce, pilot) in pilots.items()
    }
    counts = {"ok": 3, "fail": 3, "long": 1, "slurm": 1}
    # the healthy pilots go in one arcsub call of three descriptions (pilots_per_submission)
    bulk = {"ok": {"pilots_per_submission": 3}}
    first = {
        name: site.run_once(site.doc(pilots=counts[name], **bulk.get(name, {})))
        for name, site in sites.items()
    }
    return sites, first


def test_submits_the_pilots_that_the_real_arcstat_knows(scenario) -> None:
    sites, first = scenario
    ok = first["ok"]
    ids = submitted_ids(ok)
    assert ok["pilots_submitted"] == 3 and len(ids) == 3, ok
    assert [len(row["job_ids"]) for row in ok["submitted"]] == [3], "one submission for the bulk"
    assert all("/rest/1.0/jobs/" in i for i in ids), "submitted over ARC REST"
    status = sites["ok"].arcstat(ids)
    assert status.ok, status.stderr
    assert "Status of 3 jobs was queried, 3 jobs returned information" in status.stdout, (
        status.stdout
    )
    assert not (sites["ok"].home / ".arc").exists(), (
        "the client wrote ~/.arc: -z/-j missing somewhere"
    )


def test_pilots_reach_done_and_are_cleaned_off_the_ce(scenario) -> None:
    sites, first = scenario
    site = sites["ok"]
    ids = submitted_ids(first["ok"])
    pilots = site.wait_for_states({"done"})
    assert sorted(p["job_id"] for p in pilots) == sorted(ids)
    # the run that recorded them done cleaned them at its end: neither the CE nor the job
    # list knows them any more, and their session folders are gone
    for job in ids:
        assert site.session_gone(job), job
    status = site.arcstat(ids)
    assert "Job not found in job list" in status.stdout + status.stderr, (
        status.stdout + status.stderr
    )
    assert not (site.home / ".arc").exists()


@pytest.mark.timeout(600)
def test_a_ce_whose_pilots_all_fail_leaves_rotation_as_aborted(scenario) -> None:
    sites, _first = scenario
    site = sites["fail"]
    # Under the whole suite's load A-REX has kept one job EXITINGLRMS (its process gone, the
    # fork scan's lrms_done not written) for 240 s (CI of stop 48) and past 480 s (a CI run on
    # 2026-12-07), its two siblings failed. The verdict needs abort_min_finished (2) failed
    # pilots, so the test waits for two, the third failed too or stuck there, none done.
    doc = site.doc(paused=True)
    seen: list[dict[str, Any]] = []

    def failed_enough() -> list[dict[str, Any]] | None:
        site.last = site.run_once(doc)
        seen.append(site.last)
        pilots = site.pilots()
        failed = [p for p in pilots if p["state"] == "failed"]
        rest = [p for p in pilots if p["state"] != "failed"]
        stuck = all(p.get("native") == "EXITINGLRMS" for p in rest)
        return pilots if len(failed) >= 2 and (not rest or stuck) else None

    pilots = until(failed_enough, timeout=480, pause=3)
    assert pilots, site.pilots()
    assert len(pilots) == 3 and not [p for p in pilots if p["state"] == "done"], pilots
    assert any(
        "exit code" in (p.get("reason") or "") or "LRMS error" in (p.get("reason") or "")
        for p in pilots
    ), pilots
    # the verdict fired in the iteration that saw them fail, or fires in the next one
    seen.append(site.run_once(doc))
    aborted = [s for s in seen if s["pilots"].get("aborted")]
    assert aborted, seen
    summary = aborted[0]
    assert any(f["kind"] == "aborted" for f in summary["failures"]), summary["failures"]
    assert summary["excluded"], summary
    mails = "\n".join(p.read_text(encoding="utf-8") for p in site.notes.rglob("*") if p.is_file())
    assert "pilot cannot start its payload" in mails, (
        "the stderr sample (arcget, or the session over REST) reaches the notification"
    )


def test_pilots_cancel_kills_the_pilot_on_the_ce(scenario) -> None:
    sites, first = scenario
    site = sites["long"]
    (job,) = submitted_ids(first["long"])
    proc = site.gridgate(
        "pilots", "cancel", "-c", str(site.folder / "site.yaml"), "--all", "--json"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outcome = json.loads(proc.stdout)
    assert [job] in list(outcome["cancelled"].values()), outcome
    # the CE reports Killed ~30 s after arckill on fork (arc.md section 4)
    killed = until(lambda: "State: Killed" in site.arcstat([job]).stdout, timeout=180, pause=3)
    assert killed, site.arcstat([job]).stdout
    # a cancelled pilot is never polled again, yet it is cleaned off the CE: by the end of the
    # first iteration after the CE finished killing it (arcclean deletes only finished jobs)
    site.run_once(site.doc(paused=True))
    assert site.session_gone(job)
    status = site.arcstat([job])
    assert "Job not found in job list" in status.stdout + status.stderr, (
        status.stdout + status.stderr
    )


def test_pilots_through_a_ce_whose_lrms_is_slurm(scenario, arc_ce_slurm) -> None:
    sites, first = scenario
    site = sites["slurm"]
    (job,) = submitted_ids(first["slurm"])
    pilots = site.wait_for_states({"done", "failed"})
    assert [p["state"] for p in pilots] == ["done"], pilots
    local = site.ce.folder / "control" / f"job.{job.rsplit('/', 1)[-1]}.local"
    if local.exists():  # not yet cleaned: the CE's record names the Slurm job
        assert "localid=" in local.read_text(encoding="utf-8", errors="replace")


# --- credentials on the real CE ------------------------------------------------------------------


def test_an_expired_proxy_with_a_failing_renewal_submits_nothing_and_blames_no_ce(
    arc, tmp_path, interface
) -> None:
    site = ArcSite(arc, tmp_path / "expired", "exit 0", interface=interface)
    now = datetime.now(UTC)
    arc.make_proxy(site.proxy, start=now - timedelta(hours=3), end=now - timedelta(hours=1))
    doc = site.doc(pilots=2, renew=site.renew_argv(usercert=str(tmp_path / "no-such-usercert.pem")))
    runs = [site.run_once(doc) for _ in range(3)]
    for summary in runs:
        assert summary["pilots_submitted"] == 0 and summary["excluded"] == [], summary
        assert not any(f.get("endpoint") for f in summary["failures"] if f["kind"] != "credential")
    errors = [n for s in runs for n in s["notifications"] if n["level"] == "error"]
    assert len(errors) == 1, errors
    assert str(site.proxy) in "".join(
        p.read_text(encoding="utf-8") for p in site.notes.rglob("*") if p.is_file()
    )
    listed = site.gridgate("servers", "list", "-c", str(site.folder / "site.yaml"))
    # no CE is blamed (none in the failing cache); the CE is listed as waiting for the proxy
    assert "no failure episode is open" in listed.stdout, listed.stdout
    ce = f"arc/{arc.url.split('//', 1)[1].split('/', 1)[0]}"
    assert f"{ce} " in listed.stdout and "itself for x509_proxy" in listed.stdout, listed.stdout


def test_a_proxy_near_its_end_is_renewed_before_any_submission(arc, tmp_path, interface) -> None:
    site = ArcSite(arc, tmp_path / "near", "exit 0", interface=interface)
    now = datetime.now(UTC)
    arc.make_proxy(site.proxy, start=now - timedelta(minutes=5), end=now + timedelta(minutes=20))
    before = proxy_end(site.proxy)
    summary = site.run_once(site.doc(pilots=1))
    after = proxy_end(site.proxy)
    assert after - before > timedelta(hours=10), (before, after)
    assert summary["pilots_submitted"] == 1, summary
    assert os.stat(site.proxy).st_mtime <= summary["started"] + summary["duration_s"]


def test_a_queue_demand_of_two_core_pilots_then_an_operator_ban(arc, tmp_path, interface) -> None:
    """Issue 23's tests on the real CE, as on the real Slurm cluster: a queue demand group whose
    waiting work is a real Redis list submits ceil(W/k) pilots, each one asking 2 cores (the
    A-REX's own record of the job says 2 slots on one host); once an operator bans the CE with
    `gridgate servers ban`, the next iteration submits nothing to it and says why."""
    site = ArcSite(arc, tmp_path / "site", "echo two-core pilot; exit 0", interface=interface)
    with RedisServer(tmp_path / "redis") as redis:
        redis.client().rpush("tq:mc", "j1", "j2", "j3")
        doc = site.doc()
        doc["demand"] = {
            "queue": {
                "groups": {
                    "mc": {
                        "backend": "arc",
                        "source": {"redis": {"url": redis.url, "key": "tq:mc"}},
                        "jobs_per_pilot": 2,
                        "resources": {"cores": 2, "walltime": 600},
                    }
                }
            }
        }
        first = site.run_once(doc)
        ids = submitted_ids(first)
        assert first["failures"] == [] and len(ids) == 2, first  # ceil(3 / 2)
        for job in ids:
            # what A-REX keeps of the description: the ADL arcsub sent, the xRSL of REST
            kept = (arc.folder / "control" / f"job.{job.rsplit('/', 1)[-1]}.description").read_text(
                encoding="utf-8", errors="replace"
            )
            if interface == "cli":
                assert "<adl:NumberOfSlots>2</adl:NumberOfSlots>" in kept
                assert "<adl:SlotsPerHost>2</adl:SlotsPerHost>" in kept
            else:
                assert '(count="2")' in kept and '(countpernode="2")' in kept
        [endpoint] = {row["endpoint"] for row in first["submitted"]}
        config = str(site.folder / "site.yaml")
        ban = site.gridgate(
            "servers", "ban", "-c", config, endpoint, "--for", "1h", "--reason", "CE upgrade"
        )
        assert ban.returncode == 0, ban.stderr
        redis.client().rpush("tq:mc", *[f"more{i}" for i in range(6)])
        second = site.run_once(doc)
    assert submitted_ids(second) == [], second
    assert second["unavailable"] and all(
        state["state"] == "banned" for state in second["unavailable"].values()
    ), second
    listed = site.gridgate("servers", "list", "-c", config)
    assert "CE upgrade" in listed.stdout, listed.stdout


def test_a_stopped_ce_is_unreachable(tmp_path, interface) -> None:
    from gridgate.plugins.arc.ce import ArcCE

    ce = ArcCE().start()  # its own CE: stopping the shared one would kill the scenarios' pilots
    try:
        site = ArcSite(ce, tmp_path / "site", "exit 0", interface=interface)
        ce.stop_service()
        summary = site.run_once(site.doc(pilots=1))
    finally:
        ce.stop()
    assert summary["pilots_submitted"] == 0
    kinds = {f["kind"] for f in summary["failures"]}
    assert kinds == {"unreachable"}, summary["failures"]
    assert summary["excluded"], summary


# --- the gate and the token daemon ----------------------------------------------------------------


def test_arc_commands_take_tokens_of_their_category_and_get_shims(arc, tmp_path, interface) -> None:
    """The director's submission (arcsub, or the REST POSTs) takes a submission token and its
    poll (arcstat, or the status POST) a query token from a real `gridgate lsfproxyd serve`,
    its cancel an other token; `gate --install-shims` puts every ARC command behind it."""
    socket_dir = Path(tempfile.mkdtemp(prefix="ggarc-", dir="/tmp"))
    try:
        socket, diag = socket_dir / "proxyd.sock", socket_dir / "diag.log"
        proxyd = {"socket": str(socket), "diagnose": True, "diagnose_file": str(diag)}
        conf = socket_dir / "proxyd.yaml"
        conf.write_text(yaml.safe_dump({"proxyd": proxyd}), encoding="utf-8")
        daemon = subprocess.Popen(
            [str(BIN / "gridgate"), "lsfproxyd", "serve", "-c", str(conf), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            assert daemon.stdout is not None and daemon.stdout.readline(), (
                "the daemon did not start"
            )
            site = ArcSite(arc, tmp_path / "gated", "sleep 120", interface=interface)
            doc = {
                **site.doc(pilots=1),
                "admission": {
                    "lsf_proxy": {"mode": "remote", "categories": ["submission", "query", "other"]}
                },
                "proxyd": {"socket": str(socket)},
            }
            assert site.run_once(doc)["pilots_submitted"] == 1
            polled = site.run_once({**doc, "director": {**doc["director"], "paused": True}})
            assert [p["outcome"] for p in polled["pilots"]["polls"]] == ["ok"], polled["pilots"]
            assert (
                site.gridgate(
                    "pilots", "cancel", "-c", str(site.folder / "site.yaml"), "--all"
                ).returncode
                == 0
            )
            log = diag.read_text(encoding="utf-8")
            assert " SUBMISSION_REQ,JOB_SUBMIT," in log, log
            assert " QUERY_REQ,JOB_STATUS," in log, log
            assert " OTHER_REQ,JOB_CANCEL," in log, log
            shims = socket_dir / "shims"
            out = subprocess.run(
                [
                    str(BIN / "gridgate"),
                    "gate",
                    "--install-shims",
                    str(shims),
                    "--socket",
                    str(socket),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                env={**site.env(), "PATH": f"{shims}:{SYSTEM_PATH}"},
            )
            assert out.returncode == 0, out.stderr
            for name in (
                "arcsub",
                "arcstat",
                "arcinfo",
                "arckill",
                "arcclean",
                "arcget",
                "arcsync",
            ):
                assert f"{name} -> /usr/bin/{name}" in out.stdout, out.stdout
            info = run(
                [str(shims / "arcinfo"), "-z", str(arc.env["ARC_CE_CLIENT_CONF"]), "-c", arc.url],
                60,
                env={**site.env(), **arc.env, "PATH": f"{shims}:{SYSTEM_PATH}"},
            )
            assert "Computing service:" in info.stdout, info.stdout + info.stderr
            assert " QUERY_REQ,ARC_INFO," in diag.read_text(encoding="utf-8")
        finally:
            daemon.terminate()
            daemon.wait(30)
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_a_poll_with_an_expired_unmanaged_proxy_blames_no_ce(arc, tmp_path, interface) -> None:
    """Without credentials.x509_proxy the proxy comes from the backend's env; arcstat then says
    only 'wrong response: <garbage>' and exits 0: the backend reads the file, so the failed
    poll is the site's credential, not the CE's fault."""
    site = ArcSite(arc, tmp_path / "unmanaged", "sleep 120", interface=interface)
    doc = site.doc(pilots=1)
    del doc["credentials"]
    doc["backends"]["arc"]["env"]["X509_USER_PROXY"] = str(site.proxy)
    assert site.run_once(doc)["pilots_submitted"] == 1
    now = datetime.now(UTC)
    arc.make_proxy(site.proxy, start=now - timedelta(hours=3), end=now - timedelta(hours=1))
    polled = site.run_once({**doc, "director": {**doc["director"], "paused": True}})
    assert [p["outcome"] for p in polled["pilots"]["polls"]] == ["failed"], polled["pilots"]
    assert [f["kind"] for f in polled["failures"]] == ["credential"], polled["failures"]
    assert polled["excluded"] == [], polled
    assert all(n["level"] != "alarm" for n in polled["notifications"])
    shutil.copyfile(arc.proxy, site.proxy)  # a good proxy again: the pilot is cancelled on the CE
    assert (
        site.gridgate("pilots", "cancel", "-c", str(site.folder / "site.yaml"), "--all").returncode
        == 0
    )
