"""lsf_proxy admission: per-server token policy in-process (local) and the daemon (remote),
driven through the hooks and through the real director against the stand-in WMS commands."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from gridgate.core.clock import FakeClock
from gridgate.core.config import ConfigError, load_config
from gridgate.core.engine.director import Director
from gridgate.core.model import AdmissionRequest, Endpoint, Grant, Refusal
from gridgate.core.plugins import PluginContext
from gridgate.core.testing import Collector, make_config, section_for
from gridgate.plugins.lsf_proxy.director.admission import ProxyAdmission
from gridgate.plugins.wms_glite.sim import (
    install_commands,
    max_concurrency,
    read_calls,
    write_scenario,
)

WMS1 = Endpoint("wms_glite", "wms01.example.org")
WMS2 = Endpoint("wms_glite", "wms02.example.org")


def admission(clock=None, config=None, **section) -> ProxyAdmission:
    context = PluginContext(config=config or {})
    return ProxyAdmission(section_for(ProxyAdmission, section), context, clock=clock)


def ask(
    plugin: ProxyAdmission,
    endpoint: Endpoint | None = WMS1,
    user: str = "root",
    category: str = "submission",
):
    return plugin.gridgate_admit(
        request=AdmissionRequest(
            category=category, opcode="JOB_SUBMIT", user=user, size=1, endpoint=endpoint
        )
    )


def in_thread(fn):
    box: list = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()
    return thread, box


def test_gridgate_admit_local_caps_in_flight_per_endpoint_even_for_root() -> None:
    plugin = admission(max=2, token_wait_time=30)
    first, second = ask(plugin), ask(plugin)
    assert isinstance(first, Grant) and isinstance(second, Grant)
    assert first.issuer == "lsf_proxy" and first.token and first.token != second.token
    # another server has its own policy
    assert isinstance(ask(plugin, WMS2), Grant)
    thread, box = in_thread(lambda: ask(plugin))
    thread.join(0.5)
    assert thread.is_alive() and not box  # the third on wms01 waits for a token
    plugin.gridgate_release(grant=first)
    thread.join(10)
    assert isinstance(box[0], Grant) and box[0].waited > 0
    assert plugin.in_use() == {WMS1.key: 2, WMS2.key: 1}
    stats = plugin.stats()[WMS1.key]
    assert (stats.granted, stats.waited, stats.refused, stats.max_in_use) == (3, 1, 0, 2)
    plugin.close()


def test_gridgate_admit_local_refuses_after_the_wait_limit() -> None:
    clock = FakeClock()
    plugin = admission(clock=clock, max=1, token_wait_time=5)
    held = ask(plugin)
    assert isinstance(held, Grant)
    thread, box = in_thread(lambda: ask(plugin))
    thread.join(0.3)
    assert thread.is_alive()
    clock.advance(5)
    thread.join(10)
    refusal = box[0]
    assert isinstance(refusal, Refusal) and refusal.issuer == "lsf_proxy"
    assert "wms01.example.org" in refusal.reason and "5 s" in refusal.reason
    assert plugin.stats()[WMS1.key].refused == 1
    plugin.gridgate_release(grant=held)
    assert plugin.in_use() == {WMS1.key: 0}


def test_gridgate_admit_local_throttles_above_nominal() -> None:
    clock = FakeClock()
    plugin = admission(clock=clock, max=4, nominal=1, throttle=1000, token_wait_time=60)
    assert isinstance(ask(plugin), Grant)  # below nominal: at once
    thread, box = in_thread(lambda: ask(plugin))
    thread.join(0.3)
    assert thread.is_alive()  # above nominal: one grant per second of the policy's clock
    clock.advance(1.0)
    thread.join(10)
    assert isinstance(box[0], Grant)


def test_gridgate_release_acts_only_on_its_own_grants() -> None:
    plugin = admission(max=1)
    grant = ask(plugin)
    plugin.gridgate_release(grant=Grant(issuer="all", token=grant.token))
    assert plugin.in_use() == {WMS1.key: 1}
    plugin.gridgate_release(grant=grant)
    plugin.gridgate_release(grant=grant)  # a second release is harmless
    assert plugin.in_use() == {WMS1.key: 0}


def test_other_categories_are_left_to_the_next_plugin() -> None:
    plugin = admission(max=1)
    assert ask(plugin, category="query") is None
    both = admission(max=1, categories=["query", "submission"])
    assert isinstance(ask(both, category="query"), Grant)


def test_config_errors_name_the_field() -> None:
    assert ProxyAdmission.config_errors({"max": 4, "nominal": 6}) == [
        (("nominal",), "nominal (6) must not exceed max (4)")
    ]
    assert ProxyAdmission.config_errors({"max": 4, "nominal": 2}) == []
    with pytest.raises(Exception, match="mode"):
        make_config({"admission": {"lsf_proxy": {"mode": "sideways"}}})


# --- the director behind admission ------------------------------------------------------------


def glite_site(
    tmp_path: Path,
    hosts: dict,
    admission_section: dict | None,
    demand: int,
    threads: int = 16,
    timeout: float = 10,
) -> tuple[Path, Path]:
    bin_dir = install_commands(tmp_path / "bin")
    calls = tmp_path / "calls.jsonl"
    scenario = write_scenario(
        tmp_path / "scenario.json",
        {
            "state_dir": str(tmp_path / "simstate"),
            "calls_log": str(calls),
            "default": {"behaviour": "healthy"},
            "hosts": hosts,
        },
    )
    (tmp_path / "simstate").mkdir(exist_ok=True)
    doc = {
        "director": {
            "cycle_seconds": 0.1,
            "max_threads": threads,
            "command_timeout": timeout,
            "state_dir": str(tmp_path / "state"),
        },
        "state": {"driver": "memory"},
        "backends": {
            "wms_glite": {
                "servers": list(hosts),
                "commands": {
                    "submit": str(bin_dir / "glite-wms-job-submit"),
                    "list_match": str(bin_dir / "glite-wms-job-list-match"),
                },
                "list_match": False,
                "env": {"GRIDGATE_SIM_SCENARIO": str(scenario)},
            }
        },
        "demand": {"static": {"wms_glite": demand}},
    }
    if admission_section is not None:
        doc["admission"] = {"lsf_proxy": admission_section}
    path = tmp_path / "site.yaml"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path, calls


def per_host_peak(calls_path: Path) -> dict[str, int]:
    calls = read_calls(calls_path)
    return {
        host: max_concurrency([c for c in calls if c.host == host])
        for host in {c.host for c in calls}
    }


def test_director_local_mode_keeps_each_server_under_max(tmp_path) -> None:
    hosts = {
        "wms01.example.org": {"behaviour": "healthy", "latency": 0.4},
        "wms02.example.org": {"behaviour": "healthy", "latency": 0.4},
    }
    config, calls = glite_site(tmp_path / "gated", hosts, {"mode": "local", "max": 2}, demand=12)
    director = Director(load_config(config))
    try:
        summary = director.run_iteration()
        stats = director.pm.get_plugin("admission:lsf_proxy").stats()
    finally:
        director.close()
    assert [r.outcome for r in summary.records].count("submitted") == 12
    peaks = per_host_peak(calls)
    assert peaks and max(peaks.values()) <= 2
    assert sum(s.granted for s in stats.values()) == 12
    assert sum(s.waited for s in stats.values()) > 0
    # the same burst without admission goes past 2 on a server: the limit above is the gate's
    # (3 s calls, so that they overlap however slowly a loaded machine starts them)
    slow = {host: {**spec, "latency": 3} for host, spec in hosts.items()}
    config, calls = glite_site(tmp_path / "open", slow, None, demand=12, timeout=30)
    director = Director(load_config(config))
    try:
        director.run_iteration()
    finally:
        director.close()
    assert max(per_host_peak(calls).values()) > 2


def test_director_counts_refusals_and_escalates_nothing(tmp_path) -> None:
    hosts = {"wms01.example.org": {"behaviour": "healthy", "latency": 1.5}}
    config, calls = glite_site(
        tmp_path, hosts, {"mode": "local", "max": 1, "token_wait_time": 0.3}, demand=4
    )
    collector = Collector()
    director = Director(load_config(config), extra_plugins=[collector])
    try:
        summary = director.run_iteration()
    finally:
        director.close()
    outcomes = sorted(r.outcome for r in summary.records)
    assert outcomes == ["refused", "refused", "refused", "submitted"]
    assert {r.failure_kind for r in summary.records if r.outcome == "refused"} == {"admission"}
    assert summary.excluded == () and summary.failures == ()
    assert collector.notes == []
    assert len(read_calls(calls)) == 1  # refused submissions never reached the server


# --- remote mode against a real daemon ---------------------------------------------------------


def test_gridgate_admit_remote_takes_and_returns_a_daemon_token(start_daemon, cli) -> None:
    daemon = start_daemon({"policies": "SUBMISSION[max=4]"})
    plugin = admission(mode="remote", socket=daemon.socket)
    grants = [ask(plugin), ask(plugin)]
    assert all(isinstance(g, Grant) and g.token and g.issuer == "lsf_proxy" for g in grants)

    def submission_in_use() -> int:
        out = cli("status", "--json", "--socket", daemon.socket)
        reply = json.loads(out.stdout)["hosts"][0]["reply"]
        return reply["status"]["categories"]["submission"]["in_use"]

    assert submission_in_use() == 2
    for grant in grants:
        plugin.gridgate_release(grant=grant)
    assert submission_in_use() == 0
    plugin.close()


def test_gridgate_admit_remote_when_the_daemon_is_down(sockdir) -> None:
    missing = str(sockdir / "nobody-home.sock")
    proceed = admission(mode="remote", socket=missing)
    grant = ask(proceed)
    assert isinstance(grant, Grant) and grant.token == "" and grant.note == "unavailable"
    proceed.gridgate_release(grant=grant)
    refuse = admission(mode="remote", socket=missing, when_unavailable="refuse")
    refusal = ask(refuse)
    assert isinstance(refusal, Refusal) and "unavailable" in refusal.reason


def test_gridgate_admit_remote_refusal_for_a_blocked_ordinary_user(
    start_daemon, cli, py_as
) -> None:
    daemon = start_daemon({"policies": "SUBMISSION[max=4]"})
    assert cli("block", "-u", "nobody", "--socket", daemon.socket).returncode == 0
    code = f"""
from gridgate.core.model import AdmissionRequest, Refusal
from gridgate.core.plugins import PluginContext
from gridgate.core.testing import section_for
from gridgate.plugins.lsf_proxy.director.admission import ProxyAdmission
plugin = ProxyAdmission(section_for(ProxyAdmission, {{"mode": "remote", "socket": {daemon.socket!r}}}),
                        PluginContext())
answer = plugin.gridgate_admit(request=AdmissionRequest(category="submission", opcode="JOB_SUBMIT",
                                                         user="nobody"))
print(type(answer).__name__, answer.reason)
"""
    proc = py_as(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Refusal") and "blocked" in proc.stdout


def test_a_token_never_given_back_is_taken_back_after_its_lease() -> None:
    clock = FakeClock()
    plugin = admission(clock=clock, max=1, lease_time=30, token_wait_time=60)
    lost = ask(plugin)
    assert isinstance(lost, Grant)
    thread, box = in_thread(lambda: ask(plugin))
    thread.join(0.3)
    assert thread.is_alive()
    clock.advance(30)  # the lease of the lost token ends: its slot goes to the waiter
    thread.join(10)
    assert isinstance(box[0], Grant)
    plugin.gridgate_release(grant=lost)  # a late release of the expired token changes nothing
    assert plugin.in_use() == {WMS1.key: 1}


def test_default_lease_follows_the_director_command_timeout() -> None:
    plugin = admission(config={"director": {"command_timeout": 300}})
    assert plugin._settings.lease_time == 960
    assert admission()._settings.lease_time == 600


# --- a key of the other mode is an error, not a no-op (issue 39) ------------------------------


@pytest.mark.parametrize(
    ("mode", "key", "value"),
    [
        ("local", "socket", "/run/gridgate/proxyd.sock"),
        ("local", "user", "svc"),
        ("local", "when_unavailable", "refuse"),
        ("local", "notoken_ntries", 3),
        ("remote", "max", 2),
        ("remote", "nominal", 4),
        ("remote", "throttle", 50),
        ("remote", "token_wait_time", 2),
        ("remote", "queue_limit", 10),
        ("remote", "lease_time", 900),
    ],
)
def test_a_key_of_the_other_mode_is_a_config_error(mode: str, key: str, value: object) -> None:
    other = "remote" if mode == "local" else "local"
    with pytest.raises(ConfigError) as caught:
        section_for(ProxyAdmission, {"mode": mode, key: value})
    assert f"{key} is read in mode: {other} only, and mode is {mode}" in str(caught.value)
    section_for(ProxyAdmission, {"mode": other, key: value})  # its own mode reads it
