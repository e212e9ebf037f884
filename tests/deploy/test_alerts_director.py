"""Issue 42: every director alert proven on a real `gridgate run` and a real Prometheus with the
shipped rules, their numbers shortened in the file's text as a site edits them (every ``for``
cut to 0 s). Each scenario drives the director into one alert's condition with the stand-in
WMS servers (their scenario file rewritten while it runs), sees that alert fire alone, and sees
it resolve when the condition ends: nothing submitted with demand, an outbox that grows, a
director whose loop is stuck and one that is gone, a credential past its end."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from support.polling import until
from support.prometheus import firing, wait_for
from support.servers import SmtpServer
from support.wms_site import director_site, fake_jwt, scrape

from gridgate.core.devkit.services import free_port
from gridgate.plugins.wms_glite.sim import write_scenario

HOSTS = ("wms01.example.org", "wms02.example.org")


class Site:
    """A director on the stand-in WMS servers ``hosts``, its metrics on a port of its own."""

    def __init__(
        self,
        exe: str,
        folder: Path,
        hosts: tuple[str, ...] = HOSTS[:1],
        token_ends: float = 3600,
        notifiers: dict[str, Any] | None = None,
        **director: Any,
    ) -> None:
        self.exe, self.folder, self.port = exe, folder, free_port()
        # no max_waiting: a healthy server takes pilots at every iteration, so that "nothing
        # submitted" stays quiet beside the alert a test is about (a full limit would stop
        # the submissions while a failure or a skip of another kind goes on)
        director.setdefault("pilots", {"max_waiting": None})
        self.token = folder / "token"
        self.write_token(token_ends)
        self.config = director_site(folder, self.port, self.token, **director)
        doc = yaml.safe_load(self.config.read_text(encoding="utf-8"))
        wms = doc["backends"]["wms_glite"]
        wms["servers"] = list(hosts)
        doc["demand"]["static"]["wms_glite"] = 2 * len(hosts)
        doc["notifiers"] = notifiers or {}
        self.config.write_text(yaml.safe_dump(doc), encoding="utf-8")
        self.scenario = Path(wms["env"]["GRIDGATE_SIM_SCENARIO"])
        self.proc: subprocess.Popen[bytes] | None = None

    def write_token(self, ends_in: float) -> None:
        self.token.write_text(fake_jwt(time.time() + ends_in) + "\n")
        self.token.chmod(0o600)

    def behave(self, **hosts: Any) -> None:
        """Each host's behaviour (``wms01_example_org="unreachable"``), the others healthy."""
        write_scenario(
            self.scenario,
            {
                "state_dir": str(self.folder / "simstate"),
                "default": {"behaviour": "healthy"},
                "hosts": {k.replace("_", "."): v for k, v in hosts.items()},
            },
        )

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "run", "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.folder / "director.log", "ab"),  # noqa: SIM115 - the child holds it
            env={**os.environ, "PATH": "/usr/bin:/bin"},
        )
        wait_for("the first iteration", lambda: "gridgate_demand_pilots{" in scrape(self.port))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


def alerts(prom: Any) -> set[str]:
    return {a["labels"]["alertname"] for a in prom.firing()}


def submitted_seen(prom: Any) -> bool:
    """Whether Prometheus has seen the submission counter rise."""
    query = "sum(increase(gridgate_pilots_submitted_total[1h])) > 0"
    return bool(prom.get("/api/v1/query", query=query)["data"]["result"])


def test_demand_with_nothing_submitted_fires_and_resolves(
    gridgate_exe: str, tmp_path: Path, prometheus_factory: Any
) -> None:
    site = Site(gridgate_exe, tmp_path, failing_expiry=2)
    site.behave(wms01_example_org={"behaviour": "unreachable"})
    site.start()
    try:
        windows = {"[1h]": "[20s]"}  # the rule's hour, as a site would shorten it
        prom = prometheus_factory({"gridgate-director": site.port}, windows)
        (alert,) = wait_for(
            "nothing submitted", lambda: firing(prom, "GridgateNoSubmissionWithDemand")
        )
        assert alert["labels"]["backend"] == "wms_glite", alert
        assert " has demand, " in alert["annotations"]["summary"]
        assert alerts(prom) == {"GridgateNoSubmissionWithDemand"}
        site.behave()  # the server answers again: pilots go out
        assert until(lambda: not alerts(prom), timeout=90, pause=0.5), prom.firing()
    finally:
        site.stop()


def test_an_outbox_that_grows_fires_and_resolves_when_mail_gets_out(
    gridgate_exe: str, tmp_path: Path, prometheus_factory: Any
) -> None:
    smtp_port = free_port()
    email = {
        "host": "127.0.0.1",
        "port": smtp_port,
        "from": "gridgate@example.org",
        "error_address": "ops@example.org",
        "alarm_address": "ops@example.org",
        "retry_initial": 1,
        "retry_max": 2,
    }
    # one server fails (an error, then alarms at each expiry of the failing cache), the other
    # takes the pilots: only the mail is stuck, nothing else is wrong
    site = Site(
        gridgate_exe,
        tmp_path,
        hosts=HOSTS,
        notifiers={"email": email},
        failing_expiry=1,
        ticket_expiry=600,
    )
    site.behave(wms02_example_org={"behaviour": "unreachable"})
    site.start()
    relay = SmtpServer(smtp_port)
    try:
        prom = prometheus_factory({"gridgate-director": site.port}, {"[30m]": "[20s]"})
        wait_for("submissions seen", lambda: submitted_seen(prom))  # wms01 takes the pilots
        (alert,) = wait_for("the outbox alert", lambda: firing(prom, "GridgateOutboxGrowing"))
        assert alert["labels"]["notifier"] == "email", alert
        assert alerts(prom) == {"GridgateOutboxGrowing"}
        site.behave()  # no more failures, and the relay comes up: the outbox drains
        relay.start()
        assert until(lambda: not alerts(prom), timeout=120, pause=0.5), prom.firing()
        assert relay.handler.messages, "the waiting mail went out"
    finally:
        relay.stop()
        site.stop()


def test_a_stuck_loop_then_a_director_gone_fire_their_alerts(
    gridgate_exe: str, tmp_path: Path, prometheus_factory: Any
) -> None:
    # failing_expiry 2: the server the hung command got excluded is tried again soon after
    site = Site(gridgate_exe, tmp_path, command_timeout=12, failing_expiry=2)
    site.behave()
    site.start()
    try:
        # 900 s, shortened as a site would: a command that hangs holds an iteration 12 s
        prom = prometheus_factory({"gridgate-director": site.port}, {"> 900": "> 5"})
        # Prometheus has seen pilots go out (else "nothing submitted" would count the hang's
        # skips against a submission counter it never saw move)
        wait_for("submissions seen", lambda: submitted_seen(prom))
        assert alerts(prom) == set()
        site.behave(wms01_example_org={"behaviour": "hang_before_print", "hang": 600})
        wait_for("the stuck loop", lambda: firing(prom, "GridgateDirectorNotIterating"))
        assert alerts(prom) == {"GridgateDirectorNotIterating"}
        site.behave()
        assert until(lambda: not alerts(prom), timeout=90, pause=0.5), prom.firing()
        assert site.proc is not None
        site.proc.kill()
        site.proc.wait(30)
        wait_for("the director gone", lambda: firing(prom, "GridgateDirectorDown"))
        assert alerts(prom) == {"GridgateDirectorDown"}
    finally:
        site.stop()


def test_a_credential_past_its_end_fires_unusable_alone_and_resolves_when_renewed(
    gridgate_exe: str, tmp_path: Path, prometheus_factory: Any
) -> None:
    site = Site(gridgate_exe, tmp_path, token_ends=-60)  # ended a minute ago
    site.behave()
    site.start()
    try:
        prom = prometheus_factory({"gridgate-director": site.port})
        (alert,) = wait_for("unusable", lambda: firing(prom, "GridgateCredentialUnusable"))
        assert alert["labels"]["path"] == str(site.token), alert
        # three more iterations seen and evaluated: "ending soon" never joins it past the end
        prom.wait_seen("max(gridgate_iteration_duration_seconds_count)", 3)
        assert alerts(prom) == {"GridgateCredentialUnusable"}
        site.write_token(3600)  # renewed by hand
        assert until(lambda: not alerts(prom), timeout=90, pause=0.5), prom.firing()
    finally:
        site.stop()


def test_an_endpoint_banned_past_the_threshold_fires_and_resolves_when_lifted(
    gridgate_exe: str, tmp_path: Path, prometheus_factory: Any
) -> None:
    site = Site(gridgate_exe, tmp_path, hosts=HOSTS)
    doc = yaml.safe_load(site.config.read_text(encoding="utf-8"))
    doc["state"] = {"driver": "sqlite", "path": str(tmp_path / "state.db")}  # the CLI shares it
    site.config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    site.behave()
    site.start()

    def servers(*argv: str) -> None:
        done = subprocess.run(
            [gridgate_exe, "servers", *argv, "-c", str(site.config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    try:
        # 6 hours, shortened as a site would edit them
        prom = prometheus_factory({"gridgate-director": site.port}, {"> 6 * 3600": "> 3"})
        wait_for("submissions seen", lambda: submitted_seen(prom))  # wms01 takes the pilots
        servers("ban", "wms02.example.org", "--for", "1h", "--reason", "disk replaced")
        (alert,) = wait_for("the ban", lambda: firing(prom, "GridgateEndpointUnavailableLong"))
        assert (alert["labels"]["endpoint"], alert["labels"]["cause"]) == (
            "wms02.example.org",
            "banned",
        ), alert
        assert alerts(prom) == {"GridgateEndpointUnavailableLong"}
        servers("unban", "wms02.example.org")
        assert until(lambda: not alerts(prom), timeout=90, pause=0.5), prom.firing()
    finally:
        site.stop()
