"""What deploy/ ships for Prometheus and Grafana (issue 32, item 4), checked with the real
tools: ``promtool check rules`` and ``promtool test rules`` (Debian's ``prometheus``) on
deploy/prometheus/gridgate-rules.yml; every metric a rule or a dashboard query names is one a
real director or token daemon exports; and a real Prometheus server scrapes a real
``gridgate run`` and a real token daemon and evaluates the rules: the credential alert fires
for a token ending within the hour, the daemon alert when the daemon is stopped."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from support.prometheus import ENV, ROOT, RULES, wait_for
from support.wms_site import director_site, fake_jwt, scrape

from gridgate.core.devkit.services import free_port

RULE_TESTS = ROOT / "deploy" / "prometheus" / "gridgate-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gridgate-dashboard.json"
PROMTOOL = "/usr/bin/promtool"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=ENV
    )


def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    checked = promtool("check", "rules", str(RULES), cwd=RULES.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 12 rules found" in checked.stdout
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULES.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_rule_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    """The unit tests can fail: with the failing endpoint's 2 hours turned into 3, the case of
    a CE out for 2 h 10 min no longer fires and promtool says so."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    text = RULES.read_text(encoding="utf-8")
    assert "> 2 * 3600" in text
    (tmp_path / RULES.name).write_text(text.replace("> 2 * 3600", "> 3 * 3600"))
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "GridgateEndpointFailing" in tested.stdout + tested.stderr


def test_no_alert_text_says_a_number_a_site_may_change() -> None:
    """A site edits the thresholds (the file invites it): the summaries take their figures from
    the expression's value or the labels, so an edited number leaves no text saying the old
    one. The numbers are the `for:` durations and the figures in the expressions."""
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    words = re.compile(r"\b\d+\s*(?:s|m|h|d|sec|second|minute|hour|day)s?\b", re.IGNORECASE)
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name, text in rule["annotations"].items():
                assert not words.search(text), (rule["alert"], name, text)


# --- what the rules and the dashboard name is what gridgate exports -----------------------


def exported(text: str) -> set[str]:
    """The sample names a /metrics page can carry, from its ``# TYPE`` lines."""
    names: set[str] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[:2] == ["#", "TYPE"]:
            name, kind = parts[2], parts[3]
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
            elif kind == "summary":
                names |= {f"{name}_count", f"{name}_sum"}
    return names


def named_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(gridgate_[a-z0-9_]+)\b", expr))


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    assert exprs and all(exprs)
    return exprs


# --- a real Prometheus over a real director and daemon -----------------------------------


def test_a_real_prometheus_scrapes_a_director_and_a_daemon_and_the_alerts_fire(
    gridgate_exe: str, tmp_path: Path, start_daemon: Any, prometheus_factory: Any, slurm: Any
) -> None:
    director_port, daemon_port = free_port(), free_port()
    token = tmp_path / "token"
    # ends in an hour, within its min_lifetime of two, and no renew command configured: the
    # renewal is due and nothing extends it
    token.write_text(fake_jwt(time.time() + 3600) + "\n")
    token.chmod(0o600)
    config = director_site(tmp_path, director_port, token, min_lifetime=7200)
    director = subprocess.Popen(
        [gridgate_exe, "run", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "director.log", "wb"),  # noqa: SIM115 - the child holds it
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )
    try:
        # with the adaptive limit and the bypass audit (on the private Slurm cluster), so that
        # their series are on the page too; nothing drives either into its alert here
        sdiag, scontrol = (shutil.which(t, path="/usr/bin:/bin") for t in ("sdiag", "scontrol"))
        daemon = start_daemon(
            {
                "metrics_port": daemon_port,
                "adaptive": {"query": {"source": "tokens", "min": 2, "max": 12}},
                "bypass": {
                    "scheduler": "slurm",
                    "scheduler_options": {
                        "commands": {"sdiag": sdiag, "scontrol": scontrol},
                        "env": dict(slurm.env),
                    },
                },
            }
        )
        # both pages carry every metric a rule or a dashboard query names
        names = wait_for(
            "the director's first iteration",
            lambda: (text := scrape(director_port)) and "gridgate_demand_pilots{" in text and text,
        )
        names = exported(names) | exported(scrape(daemon_port))
        for expr in rule_exprs() + dashboard_exprs():
            missing = named_metrics(expr) - names
            assert not missing, f"{expr!r} names {sorted(missing)}, which nothing exports"
        prom = prometheus_factory(
            {"gridgate-director": director_port, "gridgate-proxyd": daemon_port}
        )

        def credential_alert() -> list[dict[str, Any]]:
            return [
                a
                for a in prom.firing()
                if a["labels"]["alertname"] == "GridgateCredentialEndingSoon"
            ]

        (alert,) = wait_for("the credential alert", credential_alert)
        assert alert["labels"]["kind"] == "token" and alert["labels"]["path"] == str(token)
        assert alert["annotations"]["summary"].startswith(
            f"token credential bearer_token ({token}) ends in "
        )
        fired = {a["labels"]["alertname"] for a in prom.firing()}
        # a director that iterates and submits, a usable token, an empty outbox: only that one
        assert fired == {"GridgateCredentialEndingSoon"}, fired
        # every dashboard query is one Prometheus accepts, and the director's have data
        for expr in dashboard_exprs():
            answer = prom.get("/api/v1/query", query=expr)
            assert answer["status"] == "success", (expr, answer)
        for expr in ("gridgate_demand_pilots", "gridgate_last_iteration_timestamp_seconds"):
            assert prom.get("/api/v1/query", query=expr)["data"]["result"], expr
        daemon.stop()

        def daemon_alert() -> list[dict[str, Any]]:
            return [
                a for a in prom.firing() if a["labels"]["alertname"] == "GridgateTokenDaemonDown"
            ]

        (down,) = wait_for("the daemon alert", daemon_alert)
        assert down["labels"]["instance"] == f"127.0.0.1:{daemon_port}"
    finally:
        director.terminate()
        director.wait(60)


def test_a_ce_down_fires_the_endpoint_alert_on_a_real_prometheus_and_it_resolves(
    gridgate_exe: str, tmp_path: Path, prometheus_factory: Any
) -> None:
    """Issue 42: the shipped endpoint alert could never fire (it read an event count). A real
    `gridgate run` with two stand-in WMS servers, one of which goes unreachable: the failing
    cache keeps it out, its tries at each expiry fail again, and a real Prometheus with the
    shipped rules (the 2 hours edited to 4 s, as a site edits its numbers) fires
    GridgateEndpointFailing for it and nothing else; the server back, the alert resolves."""
    from gridgate.plugins.wms_glite.sim import write_scenario

    director_port = free_port()
    token = tmp_path / "token"
    token.write_text(fake_jwt(time.time() + 3600) + "\n")
    token.chmod(0o600)
    config = director_site(tmp_path, director_port, token, failing_expiry=3, ticket_expiry=600)
    doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    wms = doc["backends"]["wms_glite"]
    wms["servers"] = ["wms01.example.org", "wms02.example.org"]
    doc["demand"]["static"]["wms_glite"] = 4  # both servers are tried at each iteration
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    scenario = Path(wms["env"]["GRIDGATE_SIM_SCENARIO"])

    def outage(behaviour: str) -> None:
        write_scenario(
            scenario,
            {
                "state_dir": str(tmp_path / "simstate"),
                "default": {"behaviour": "healthy"},
                "hosts": {"wms02.example.org": {"behaviour": behaviour}},
            },
        )

    outage("unreachable")
    director = subprocess.Popen(
        [gridgate_exe, "run", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "director.log", "wb"),  # noqa: SIM115 - the child holds it
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )
    try:
        wait_for("the first iteration", lambda: "gridgate_demand_pilots{" in scrape(director_port))
        prom = prometheus_factory({"gridgate-director": director_port}, {"> 2 * 3600": "> 4"})

        def endpoint_alerts() -> list[dict[str, Any]]:
            return [
                a for a in prom.firing() if a["labels"]["alertname"] == "GridgateEndpointFailing"
            ]

        (alert,) = wait_for("the endpoint alert", endpoint_alerts)
        assert alert["labels"]["endpoint"] == "wms02.example.org", alert
        assert alert["labels"]["cause"] == "failing", alert
        summary = alert["annotations"]["summary"]
        assert summary.startswith("wms_glite/wms02.example.org out of rotation (failing) for ")
        # several expiries of the failing cache, each try failing again, seen and evaluated
        prom.wait_seen('sum(gridgate_failures_total{endpoint="wms02.example.org"})', 3)
        # nothing else fires (the endpoint alert itself may be between a failing cache's
        # expiry and the next failed try at this instant: seen at load 17 with a 3 s expiry)
        assert {a["labels"]["alertname"] for a in prom.firing()} <= {"GridgateEndpointFailing"}
        outage("healthy")
        wait_for("the alert resolved", lambda: not endpoint_alerts(), deadline=90)
        assert prom.firing() == [], prom.firing()
    finally:
        director.terminate()
        director.wait(60)
