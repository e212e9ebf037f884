"""The ggus notifier: ticket fields and limits, sites, priorities, one ticket per episode,
spool files, REST delivery to a real loopback HTTP server, and mail through real SMTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridgate.core.clock import FakeClock
from gridgate.core.config import ConfigError, load_config
from gridgate.core.model import CommandResult, Endpoint, Failure, Notification
from gridgate.core.plugins import PluginContext
from gridgate.plugins.notify_ggus.notifier import GgusConfigError, GgusNotifier
from gridgate.plugins.notify_ggus.ticket import (
    DESCRIPTION_MAX,
    SUBJECT_MAX,
    TicketSettings,
    cut_middle,
    render_ticket,
    site_for,
)

EP = Endpoint(
    "wms_glite", "wms01.example.org", "https://wms01.example.org:7443/glite_wms_wmproxy_server"
)


def alarm(
    clock: FakeClock,
    *,
    level: str = "alarm",
    endpoint: Endpoint = EP,
    failures: int = 3,
    start: float | None = None,
    stdout: str = "",
    stderr: str = "Error - Operation failed\n",
    subject: str = "wms01.example.org: error executing Job Submit",
) -> Notification:
    return Notification(
        level,
        subject,
        "composed body\n",
        clock.time(),
        endpoint=endpoint,  # type: ignore[arg-type]
        failure=Failure("error", reason="exit code 1"),
        command=CommandResult(("glite-wms-job-submit", "-a", "pilot.jdl"), 1, stdout, stderr),
        episode_start=clock.time() - 3 * 3600 if start is None else start,
        failures_in_episode=failures,
        key=f"{endpoint.key}:submit",
    )


def make(
    tmp_path: Path, clock: FakeClock, config: dict[str, Any] | None = None, **over: Any
) -> GgusNotifier:
    section: dict[str, Any] = {
        "vo": "lhcb",
        "sites": {"wms01.example.org": "CERN-PROD"},
        "send_thread": False,
    }
    section.update(over)
    return GgusNotifier(
        section, PluginContext(clock=clock, state_dir=tmp_path / "state", config=config or {})
    )


def tickets(n: GgusNotifier) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(n.spool_dir.glob("*.json"))]


def test_gridgate_notify_spools_a_ticket_with_the_helpdesk_fields(tmp_path, clock):
    n = make(tmp_path, clock)
    n.gridgate_notify(notification=alarm(clock))
    n.close()
    (ticket,) = tickets(n)
    assert ticket["vo"] == "lhcb"
    assert ticket["affected_site"] == ticket["notified_site"] == "CERN-PROD"
    assert (ticket["category"], ticket["issue_type"]) == ("Incident", "Computing Services")
    assert (ticket["priority"], ticket["ticket_type"]) == ("very urgent", "USER")
    (txt,) = n.spool_dir.glob("*.txt")
    assert txt.stem == Path(ticket["ticket_id"]).name
    text = txt.read_text()
    for line in (
        "Subject: wms01.example.org: error executing Job Submit",
        "Concerned VO: lhcb",
        "Affected Site: CERN-PROD",
        "Priority: very urgent",
        "Ticket category: Incident",
        "Type of issue: Computing Services",
        "Command: glite-wms-job-submit -a pilot.jdl",
        "Error - Operation failed",
    ):
        assert line in text
    assert (
        "failing since 2026-09-21 11:13:20 UTC (at least 3.0 hours); 3 failures since then" in text
    )
    assert oct(txt.stat().st_mode & 0o777) == "0o600"


def test_errors_open_tickets_only_when_configured_with_their_priority(tmp_path, clock):
    n = make(tmp_path, clock)
    n.gridgate_notify(notification=alarm(clock, level="error"))
    n.gridgate_notify(notification=alarm(clock, level="info"))
    assert tickets(n) == []
    m = make(
        tmp_path / "b",
        clock,
        levels=["error", "alarm"],
        priorities={"alarm": "top priority"},
        ticket_type="ALARM",
        mou_area="WMS",
    )
    m.gridgate_notify(notification=alarm(clock, level="error"))
    m.gridgate_notify(
        notification=alarm(
            clock, level="alarm", endpoint=Endpoint("wms_glite", "wms02.example.org")
        )
    )
    assert [(t["priority"], t["ticket_type"], t["mou_area"]) for t in tickets(m)] == [
        ("urgent", "ALARM", "WMS"),
        ("top priority", "ALARM", "WMS"),
    ]
    assert "MoU Area: WMS" in next(m.spool_dir.glob("*.txt")).read_text()


def test_one_ticket_per_endpoint_per_episode(tmp_path, clock, logs):
    n = make(tmp_path, clock)
    start = clock.time() - 7200
    n.gridgate_notify(notification=alarm(clock, start=start, failures=2))
    clock.advance(3600)
    n.gridgate_notify(notification=alarm(clock, start=start, failures=3))  # same episode
    assert len(tickets(n)) == 1
    assert any("already opened" in line and "3 failures" in line for line in logs)
    other = Endpoint("wms_glite", "wms02.example.org")
    n.gridgate_notify(notification=alarm(clock, start=start, endpoint=other))  # other endpoint
    clock.advance(3600)
    n.gridgate_notify(notification=alarm(clock, start=clock.time(), failures=1))  # new episode
    assert len(tickets(n)) == 3
    n.close()
    # A restarted notifier remembers (file record without a state store).
    again = make(tmp_path, clock)
    again.gridgate_notify(notification=alarm(clock, start=start, failures=4))
    assert len(tickets(again)) == 3
    again.close()


def test_episode_rule_uses_the_state_store_when_there_is_one(tmp_path, clock):
    from gridgate.core.stores.memory import MemoryState

    store = MemoryState(clock=clock)
    n = GgusNotifier(
        {"vo": "lhcb", "send_thread": False, "episode_ttl": 1234},
        PluginContext(clock=clock, state_dir=tmp_path, state=store),
    )
    n.gridgate_notify(notification=alarm(clock, start=1000.0))
    ((key, value),) = store.items("notify_ggus:")
    assert key == "notify_ggus:ticket:wms_glite/wms01.example.org:1000"
    assert value == tickets(n)[0]["ticket_id"] and store.ttl(key) == 1234
    assert not (tmp_path / "ggus-outbox" / "records.json").exists()
    # a second notifier sharing the store (another director) opens no second ticket
    other = GgusNotifier(
        {"vo": "lhcb", "send_thread": False, "spool": str(tmp_path / "t2")},
        PluginContext(clock=clock, state_dir=tmp_path, state=store),
    )
    other.gridgate_notify(notification=alarm(clock, start=1000.0))
    assert list((tmp_path / "t2").glob("*")) == []
    n.close()
    other.close()


def test_site_mapping():
    sites = {"wms01.example.org": "CERN-PROD", ".gridpp.ac.uk": "UKI-LT2", ".ac.uk": "UK-OTHER"}
    assert site_for(EP, sites) == "CERN-PROD"
    assert site_for(Endpoint("wms_glite", "WMS01.Example.org"), sites) == "CERN-PROD"
    assert (
        site_for(Endpoint("wms_glite", "wms", "https://wms01.example.org:7443/x"), sites)
        == "CERN-PROD"
    )
    assert site_for(Endpoint("wms_glite", "lcgwms.gridpp.ac.uk"), sites) == "UKI-LT2"
    assert site_for(Endpoint("wms_glite", "wms.ox.ac.uk"), sites) == "UK-OTHER"
    assert site_for(Endpoint("wms_glite", "wms.in2p3.fr"), sites, "FALLBACK") == "FALLBACK"
    ticket = render_ticket(
        alarm(FakeClock(), endpoint=Endpoint("wms_glite", "wms.in2p3.fr")),
        TicketSettings.of({"vo": "lhcb", "sites": sites}),
    )
    assert ticket.affected_site == "UNKNOWN (no site configured for wms.in2p3.fr)"


def test_long_output_is_cut_in_the_middle_with_a_note():
    clock = FakeClock()
    stdout = "HEAD-OUT " + "o" * 20000 + " TAIL-OUT"
    stderr = "HEAD-ERR " + "e" * 9000 + " TAIL-ERR"
    ticket = render_ticket(
        alarm(clock, stdout=stdout, stderr=stderr, subject="S" * 400),
        TicketSettings.of({"vo": "lhcb"}),
    )
    d = ticket.description
    assert len(d) <= DESCRIPTION_MAX and len(d) > DESCRIPTION_MAX - 10
    for mark in ("HEAD-OUT", "TAIL-OUT", "HEAD-ERR", "TAIL-ERR", "Command: glite-wms-job-submit"):
        assert mark in d
    assert d.count("characters cut ...]") == 2
    assert len(ticket.subject) == SUBJECT_MAX and ticket.subject.endswith("...")
    short = render_ticket(
        alarm(clock, stdout="fine", stderr="short"), TicketSettings.of({"vo": "lhcb"})
    )
    assert "characters cut" not in short.description and "fine" in short.description


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=0, max_size=6000), limit=st.integers(min_value=40, max_value=5000))
def test_cut_middle_keeps_head_and_tail_within_the_limit(text, limit):
    out = cut_middle(text, limit)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
    else:
        cut = int(out.split("[... ")[1].split(" characters cut")[0])
        head, _, rest = out.partition("\n[... ")
        tail = rest.partition(" characters cut ...]\n")[2]
        assert text.startswith(head) and text.endswith(tail)
        assert len(head) + len(tail) + cut == len(text)
        assert len(out) == limit


@settings(max_examples=100, deadline=None)
@given(out=st.text(max_size=9000), err=st.text(max_size=9000), subject=st.text(max_size=600))
def test_ticket_fields_always_within_limits(out, err, subject):
    ticket = render_ticket(
        alarm(FakeClock(), stdout=out, stderr=err, subject=subject),
        TicketSettings.of({"vo": "lhcb"}),
    )
    assert 0 < len(ticket.subject) <= SUBJECT_MAX
    assert len(ticket.description) <= DESCRIPTION_MAX


def test_rest_delivery_201_with_token_header(tmp_path, clock, helpdesk, monkeypatch, logs):
    monkeypatch.setenv("GG_TEST_GGUS_TOKEN", "tok-123-secret")
    n = make(
        tmp_path,
        clock,
        deliver=["rest"],
        rest={"url": helpdesk.url, "token": {"env": "GG_TEST_GGUS_TOKEN"}, "timeout": 5},
    )
    n.gridgate_notify(notification=alarm(clock))
    assert helpdesk.requests == []  # queued, not sent from the hook
    assert n.flush(10).sent == 1
    n.close()
    (req,) = helpdesk.requests
    assert req.path == "/api/v1/tickets"
    assert req.headers["Authorization"] == "Token tok-123-secret"
    assert req.body["vo"] == "lhcb" and req.body["priority"] == "very urgent"
    assert req.body["affected_site"] == "CERN-PROD"
    assert not n.spool_dir.exists()  # spool not asked for
    stored = "".join(p.read_text() for p in (tmp_path / "state").rglob("*") if p.is_file())
    assert "tok-123-secret" not in stored and "tok-123-secret" not in "".join(logs)


def test_rest_500_is_retried_after_backoff(tmp_path, clock, helpdesk):
    helpdesk.status = 500
    n = make(
        tmp_path,
        clock,
        deliver=["rest"],
        rest={"url": helpdesk.url, "timeout": 5},
        retry_initial=60,
    )
    n.gridgate_notify(notification=alarm(clock))
    assert n.flush(10).retried == 1
    (waiting,) = n.outbox.pending()
    assert waiting.last_error.startswith("500") and "internal trouble" in waiting.last_error
    helpdesk.status = 201
    assert n.flush(10).sent == 0  # still backing off
    clock.advance(60)
    assert n.flush(10).sent == 1
    n.close()
    assert len(helpdesk.requests) == 2


def test_rest_4xx_is_dead_with_the_reply(tmp_path, clock, helpdesk):
    helpdesk.status = 400
    n = make(tmp_path, clock, deliver=["rest"], rest={"url": helpdesk.url, "timeout": 5})
    n.gridgate_notify(notification=alarm(clock))
    assert n.flush(10).dead == 1
    n.close()
    assert n.outbox.dead()[0].reply.startswith("400")


def test_rest_hang_times_out_and_is_retried(tmp_path, clock, helpdesk):
    helpdesk.hang = True
    n = make(tmp_path, clock, deliver=["rest"], rest={"url": helpdesk.url, "timeout": 0.5})
    n.gridgate_notify(notification=alarm(clock))
    result = n.flush(20)
    assert (result.sent, result.retried, result.waiting) == (0, 1, 1)
    assert "no complete answer within 0.5 s" in n.outbox.pending()[0].last_error
    helpdesk.hang = False
    clock.advance(3600)
    assert n.flush(20).sent == 1
    n.close()


def test_mail_delivery_through_the_email_transport(tmp_path, clock, smtp_server):
    config = {
        "notifiers": {
            "email": {
                "host": "127.0.0.1",
                "port": smtp_server.port,
                "from": "gridgate@example.org",
                "timeout": 5,
            }
        }
    }
    n = make(
        tmp_path,
        clock,
        config=config,
        deliver=["spool", "mail"],
        mail={"to": ["shifter@example.org", "ggus-helper@example.org"]},
    )
    n.gridgate_notify(notification=alarm(clock))
    assert n.flush(10).sent == 1
    n.close()
    (got,) = smtp_server.handler.messages
    assert got.rcpt_tos == ("shifter@example.org", "ggus-helper@example.org")
    msg = got.message
    assert msg["Subject"] == "[GGUS ticket] wms01.example.org: error executing Job Submit"
    (txt,) = n.spool_dir.glob("*.txt")
    assert msg["X-Gridgate-Ticket"] == txt.stem
    assert msg.get_content().replace("\r\n", "\n") == txt.read_text()


def test_mail_delivery_without_an_email_section_is_a_clear_error(tmp_path, clock):
    with pytest.raises(GgusConfigError, match="notifiers.email is not configured"):
        make(tmp_path, clock, deliver=["mail"], mail={"to": "x@example.org"})


def test_config_cross_checks(tmp_path):
    cfg = tmp_path / "site.yaml"
    cfg.write_text(
        "notifiers:\n"
        "  ggus:\n"
        "    vo: lhcb\n"
        "    deliver: [rest, mail]\n"
        "    ticket_type: TEAM\n"
        "    priorities: {alarm: top priority}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    text = str(err.value)
    for expected in (
        "notifiers.ggus.rest.url: deliver includes rest",
        "notifiers.ggus.mail.to: deliver includes mail",
        "notifiers.ggus.mou_area: TEAM tickets need a MoU Area",
        "notifiers.ggus.priorities.alarm: 'top priority' is for ALARM",
    ):
        assert expected in text
    cfg.write_text(
        "notifiers:\n  ggus:\n    vo: lhcb\n    sites: {wms01.example.org: CERN-PROD}\n"
        "    spool: ./gridgate-state/tickets\n"
    )
    section = load_config(cfg)["notifiers"]["ggus"]
    assert section["deliver"] == ["spool"] and section["priorities"]["error"] == "urgent"


def test_ggus_notifier_registers_with_pluggy_and_answers_gridgate_notify(tmp_path, clock):
    from gridgate.core.engine.loader import new_plugin_manager

    pm = new_plugin_manager()
    n = make(tmp_path, clock)
    pm.register(n, name="notifiers:ggus")
    pm.check_pending()
    assert pm.hook.gridgate_notify(notification=alarm(clock)) == []
    assert len(tickets(n)) == 1
    n.close()


def test_notification_without_endpoint_or_episode_opens_a_ticket_each_time(tmp_path, clock):
    n = make(tmp_path, clock)
    for i in range(2):
        n.gridgate_notify(
            notification=Notification("alarm", f"gridgate test {i}", "test\n", clock.time())
        )
    assert len(tickets(n)) == 2
    assert tickets(n)[0]["affected_site"].startswith("UNKNOWN")
    n.close()


def test_a_fault_of_the_directors_own_machine_opens_no_ticket(tmp_path, clock):
    n = make(tmp_path, clock, levels=["error", "alarm"])
    local = Failure("launch", transient=False, local=True, reason="could not start bsub")
    n.gridgate_notify(
        notification=Notification(
            "error", "gridgate: cannot run bsub", "x\n", clock.time(), failure=local
        )
    )
    assert tickets(n) == []
    n.gridgate_notify(notification=alarm(clock))  # a server's failure still does
    assert len(tickets(n)) == 1
    n.close()


def test_spool_failure_is_logged_and_the_episode_is_not_marked(tmp_path, clock, logs):
    n = make(tmp_path, clock)
    n.spool_dir.parent.mkdir(parents=True, exist_ok=True)
    n.spool_dir.write_text("not a folder")
    n.gridgate_notify(notification=alarm(clock))
    assert any("spool delivery of ticket" in line for line in logs)
    n.spool_dir.unlink()
    n.gridgate_notify(notification=alarm(clock))  # same episode: tried again, now it works
    assert len(tickets(n)) == 1
    n.close()


def test_a_ticket_seconds_into_an_episode_says_seconds_not_one_hour(tmp_path, clock):
    n = make(tmp_path, clock)
    n.gridgate_notify(notification=alarm(clock, start=clock.time() - 4))
    (txt,) = n.spool_dir.glob("*.txt")
    assert "(at least 4 seconds); 3 failures since then" in txt.read_text()


def test_mail_to_without_mail_in_deliver_is_a_config_error(tmp_path):
    # mail.to is read only by the mail delivery: without it the block validated and mailed nobody
    cfg = tmp_path / "site.yaml"
    cfg.write_text(
        "notifiers:\n  ggus:\n    vo: lhcb\n    deliver: [spool]\n"
        "    mail: {to: shifter@example.org}\n"
    )
    with pytest.raises(
        ConfigError, match=r"notifiers\.ggus\.mail\.to: mail\.to is set but deliver"
    ):
        load_config(cfg)
