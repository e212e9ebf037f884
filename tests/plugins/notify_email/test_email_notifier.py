"""The email notifier against a real SMTP server (aiosmtpd): levels, headers, TLS, AUTH,
refusals, retry with backoff, de-duplication and secrets."""

from __future__ import annotations

import ssl
import threading
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
from support.servers import Authenticator, SmtpServer, free_port, make_cert

from gridgate.core.clock import FakeClock
from gridgate.core.model import CommandResult, Endpoint, Failure, Notification
from gridgate.core.plugins import PluginContext
from gridgate.plugins.notify_email.notifier import EmailNotifier

EP = Endpoint(
    "wms_glite", "wms01.example.org", "https://wms01.example.org:7443/glite_wms_wmproxy_server"
)


def note(
    clock: FakeClock,
    level: str = "error",
    subject: str = "wms01.example.org: error executing Job Submit",
    body: str = "glite-wms-job-submit -a ...\nreturns: 1\nstderr: Unable to contact\n",
) -> Notification:
    return Notification(
        level,
        subject,
        body,
        clock.time(),
        endpoint=EP,  # type: ignore[arg-type]
        failure=Failure("error", reason="exit code 1"),
        command=CommandResult(("glite-wms-job-submit", "-a"), 1, "", "boom"),
    )


def make(tmp_path: Path, clock: FakeClock, port: int, **over: Any) -> EmailNotifier:
    section: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "from": "gridgate@example.org",
        "error_address": "ops@example.org",
        "alarm_address": "alarms@example.org",
        "send_thread": False,
        "timeout": 5,
    }
    section.update(over)
    return EmailNotifier(section, PluginContext(clock=clock, state_dir=tmp_path / "state"))


def test_gridgate_notify_error_and_alarm_reach_their_addresses(tmp_path, clock, smtp):
    n = make(tmp_path, clock, smtp.port)
    try:
        n.gridgate_notify(notification=note(clock, "error", body="stdout: ok\nstderr: é ✓ 中\n"))
        n.gridgate_notify(notification=note(clock, "alarm", subject="wms01.example.org: alarm"))
        assert smtp.handler.messages == []  # notify only queues
        assert len(n.outbox.pending()) == 2
        result = n.flush(10)
        assert (result.sent, result.waiting) == (2, 0)
    finally:
        n.close()
    first, second = smtp.handler.messages
    assert first.rcpt_tos == ("ops@example.org",)
    assert second.rcpt_tos == ("alarms@example.org",)
    msg = first.message
    assert msg["Subject"] == "[gridgate] wms01.example.org: error executing Job Submit"
    assert msg["From"] == "gridgate@example.org"
    assert msg["Message-ID"].endswith("@example.org>")
    assert parsedate_to_datetime(msg["Date"]).timestamp() == clock.time()
    assert msg["X-Gridgate-Level"] == "error"
    assert msg.get_content().replace("\r\n", "\n") == "stdout: ok\nstderr: é ✓ 中\n"
    assert second.message["X-Gridgate-Level"] == "alarm"
    assert n.outbox.pending() == [] and n.outbox.dead() == []


def test_empty_address_disables_a_level_and_info_needs_opt_in(tmp_path, clock, smtp):
    n = make(
        tmp_path,
        clock,
        smtp.port,
        alarm_address="",
        error_address=["a@example.org", "b@example.org"],
    )
    n.gridgate_notify(notification=note(clock, "alarm"))
    n.gridgate_notify(notification=note(clock, "info", subject="config refused"))
    assert n.outbox.pending() == []
    n.gridgate_notify(notification=note(clock, "error"))
    n.flush(10)
    assert [m.rcpt_tos for m in smtp.handler.messages] == [("a@example.org", "b@example.org")]
    n.close()

    m = make(tmp_path / "2", clock, smtp.port, info_to_error=True)
    m.gridgate_notify(notification=note(clock, "info", subject="config refused"))
    m.flush(10)
    m.close()
    assert smtp.handler.messages[-1].rcpt_tos == ("ops@example.org",)
    assert smtp.handler.messages[-1].message["Subject"] == "[gridgate] config refused"


def test_dedup_window_holds_back_identical_mail_then_lets_it_through(tmp_path, clock, smtp):
    n = make(tmp_path, clock, smtp.port, dedup_window=3600)
    n.gridgate_notify(notification=note(clock))
    n.gridgate_notify(notification=note(clock))
    n.gridgate_notify(notification=note(clock, body="something else"))
    clock.advance(3599)
    n.gridgate_notify(notification=note(clock))
    assert len(n.outbox.pending()) == 2
    clock.advance(2)
    n.gridgate_notify(notification=note(clock))
    assert len(n.outbox.pending()) == 3
    n.flush(10)
    n.close()
    assert len(smtp.handler.messages) == 3


def test_header_injection_is_neutralised(tmp_path, clock, smtp):
    n = make(tmp_path, clock, smtp.port)
    n.gridgate_notify(notification=note(clock, subject="bad\r\nBcc: victim@example.org"))
    n.flush(10)
    n.close()
    msg = smtp.handler.messages[0]
    assert msg.rcpt_tos == ("ops@example.org",)
    assert msg.message["Bcc"] is None
    assert msg.message["Subject"] == "[gridgate] bad Bcc: victim@example.org"


@pytest.fixture
def cert(tmp_path) -> tuple[Path, Path]:
    return make_cert(tmp_path)


def _server_tls(cert: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def test_starttls_with_auth_password_from_env(tmp_path, clock, cert, monkeypatch, logs):
    monkeypatch.setenv("GG_TEST_SMTP_PASSWORD", "s3cret-Pa55")
    auth = Authenticator("gridgate", "s3cret-Pa55")
    server = SmtpServer(
        tls_context=_server_tls(cert),
        require_starttls=True,
        authenticator=auth,
        auth_require_tls=True,
    ).start()
    try:
        n = make(
            tmp_path,
            clock,
            server.port,
            security="starttls",
            ca_file=str(cert[0]),
            username="gridgate",
            password={"env": "GG_TEST_SMTP_PASSWORD"},
        )
        n.gridgate_notify(notification=note(clock))
        assert n.flush(10).sent == 1
        n.close()
    finally:
        server.stop()
    (got,) = server.handler.messages
    assert got.tls and got.authenticated
    assert auth.attempts == 1
    stored = "".join(p.read_text() for p in (tmp_path / "state").rglob("*") if p.is_file())
    assert "s3cret-Pa55" not in stored and "s3cret-Pa55" not in "".join(logs)


def test_wrong_password_keeps_mail_queued_and_never_shows_the_secret(tmp_path, clock, cert, logs):
    secret = tmp_path / "pw"
    secret.write_text("wrong-Pa55\n")
    secret.chmod(0o600)
    server = SmtpServer(
        tls_context=_server_tls(cert),
        require_starttls=True,
        authenticator=Authenticator("gridgate", "right"),
        auth_require_tls=True,
    ).start()
    try:
        n = make(
            tmp_path,
            clock,
            server.port,
            security="starttls",
            ca_file=str(cert[0]),
            username="gridgate",
            password={"file": str(secret)},
        )
        n.gridgate_notify(notification=note(clock))
        result = n.flush(10)
        n.close()
    finally:
        server.stop()
    assert (result.sent, result.retried, result.waiting) == (0, 1, 1)
    (waiting,) = n.outbox.pending()
    assert "login refused" in waiting.last_error and "535" in waiting.last_error
    stored = "".join(p.read_text() for p in (tmp_path / "state").rglob("*") if p.is_file())
    assert "wrong-Pa55" not in stored and "wrong-Pa55" not in "".join(logs)
    assert server.handler.messages == []


def test_untrusted_certificate_is_retried_not_sent(tmp_path, clock, cert):
    server = SmtpServer(tls_context=_server_tls(cert), require_starttls=True).start()
    try:
        n = make(tmp_path, clock, server.port, security="starttls")  # system CAs only
        n.gridgate_notify(notification=note(clock))
        assert n.flush(10).retried == 1
        n.close()
    finally:
        server.stop()
    assert server.handler.messages == []
    assert "CERTIFICATE_VERIFY_FAILED" in n.outbox.pending()[0].last_error


def test_implicit_ssl(tmp_path, clock, cert):
    server = SmtpServer(ssl_context=_server_tls(cert)).start()
    try:
        n = make(tmp_path, clock, server.port, security="ssl", ca_file=str(cert[0]))
        n.gridgate_notify(notification=note(clock))
        assert n.flush(10).sent == 1
        n.close()
    finally:
        server.stop()
    assert server.handler.messages[0].tls


def test_permanent_refusal_goes_to_dead_letter_with_the_reply(tmp_path, clock, smtp, logs):
    smtp.handler.refuse_rcpt["ops@example.org"] = "550 5.1.1 <ops@example.org>: user unknown"
    n = make(tmp_path, clock, smtp.port)
    n.gridgate_notify(notification=note(clock))
    result = n.flush(10)
    assert (result.dead, result.waiting) == (1, 0)
    (dead,) = n.outbox.dead()
    assert "550 5.1.1" in dead.reply and "user unknown" in dead.reply
    assert dead.payload["to"] == ["ops@example.org"] and dead.payload["raw"]
    assert any("refused for good" in line for line in logs)
    clock.advance(10 * 86400)
    n.flush(10)
    n.close()
    assert smtp.handler.rcpt_attempts["ops@example.org"] == 1  # not retried


def test_data_refused_5xx_is_dead_and_4xx_is_retried(tmp_path, clock, smtp):
    n = make(tmp_path, clock, smtp.port, retry_initial=60)
    smtp.handler.refuse_data = "451 4.3.0 try later"
    n.gridgate_notify(notification=note(clock))
    assert n.flush(10).retried == 1
    assert n.flush(10).retried == 0  # backing off: nothing due
    smtp.handler.refuse_data = "554 5.7.1 rejected as spam"
    clock.advance(60)
    assert n.flush(10).dead == 1
    n.close()
    assert "554 5.7.1" in n.outbox.dead()[0].reply


def test_partial_recipient_refusal(tmp_path, clock, smtp):
    """Accepted recipients get it once; 5xx ones go to dead-letter; 4xx ones are retried."""
    smtp.handler.refuse_rcpt = {
        "gone@example.org": "550 5.1.1 no such user",
        "busy@example.org": "452 4.2.2 mailbox full",
    }
    n = make(
        tmp_path,
        clock,
        smtp.port,
        error_address=["ops@example.org", "gone@example.org", "busy@example.org"],
    )
    n.gridgate_notify(notification=note(clock))
    n.flush(10)
    assert [m.rcpt_tos for m in smtp.handler.messages] == [("ops@example.org",)]
    (dead,) = n.outbox.dead()
    assert dead.payload["to"] == ["gone@example.org"] and "550" in dead.reply
    (waiting,) = n.outbox.pending()
    assert waiting.payload["to"] == ["busy@example.org"] and "452" in waiting.last_error
    del smtp.handler.refuse_rcpt["busy@example.org"]
    clock.advance(3600)
    n.flush(10)
    n.close()
    assert [m.rcpt_tos for m in smtp.handler.messages] == [
        ("ops@example.org",),
        ("busy@example.org",),
    ]
    assert smtp.handler.rcpt_attempts["gone@example.org"] == 1
    assert n.outbox.pending() == []


def test_server_down_backoff_doubles_then_gives_up_after_max_age(tmp_path, clock):
    port = free_port()  # nobody listens
    n = make(tmp_path, clock, port, retry_initial=10, retry_max=40, max_age=300)
    n.gridgate_notify(notification=note(clock))
    delays = []
    for _ in range(5):
        n.flush(10)
        (m,) = n.outbox.pending()
        delays.append(m.next_attempt - clock.time())
        assert "cannot connect" in m.last_error
        clock.advance(delays[-1])
    assert delays == [10, 20, 40, 40, 40]
    clock.advance(300)
    assert n.flush(10).dead == 1
    n.close()
    assert "gave up after 6 attempts" in n.outbox.dead()[0].reply


def test_sender_thread_delivers_without_flush_and_close_stops_it(tmp_path, smtp):
    n = EmailNotifier(
        {
            "host": "127.0.0.1",
            "port": smtp.port,
            "from": "gridgate@example.org",
            "error_address": "ops@example.org",
            "poll_interval": 0.2,
        },
        PluginContext(state_dir=tmp_path),
    )
    clock = FakeClock()
    n.gridgate_notify(notification=note(clock))
    assert n.outbox.running
    done = threading.Event()
    for _ in range(200):  # bounded poll of a real thread
        if smtp.handler.messages:
            done.set()
            break
        done.wait(0.05)
    n.close()
    assert done.is_set()
    assert not n.outbox.running
    assert n.outbox.pending() == []


def test_unwritable_outbox_is_reported_and_does_not_raise(tmp_path, clock, smtp, logs):
    n = make(tmp_path, clock, smtp.port)
    queue = n.outbox.queue_dir
    queue.rmdir()
    queue.write_text("not a folder")  # fails for root too, unlike a chmod
    n.gridgate_notify(notification=note(clock))
    assert any("cannot queue" in line for line in logs)
    queue.unlink()
    queue.mkdir()
    # the de-duplication record was undone, so the same event can be queued now
    n.gridgate_notify(notification=note(clock))
    assert len(n.outbox.pending()) == 1
    n.close()


def test_server_that_never_answers_times_out_and_is_retried(tmp_path, clock):
    import socket

    with socket.socket() as silent:  # accepts connections (backlog) but never greets
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        n = make(tmp_path, clock, silent.getsockname()[1], timeout=0.5)
        n.gridgate_notify(notification=note(clock))
        result = n.flush(20)
        n.close()
    assert (result.sent, result.retried, result.waiting) == (0, 1, 1)
    error = n.outbox.pending()[0].last_error
    # the read's own timeout or the whole exchange's cutoff, whichever fires first (both 0.5 s)
    assert "timed out" in error or "Timeout" in error or "no complete answer within 0.5 s" in error


def test_two_directors_sharing_sqlite_state_send_one_mail(tmp_path, clock, smtp):
    """De-duplication goes through the state store: two notifiers (two directors with their
    own outboxes) sharing one SQLite state queue the same event once."""
    from gridgate.core.stores.sqlite import SqliteState

    stores = [SqliteState({"path": str(tmp_path / "state.db")}, clock) for _ in range(2)]
    notifiers = [
        EmailNotifier(
            {
                "host": "127.0.0.1",
                "port": smtp.port,
                "from": "gridgate@example.org",
                "error_address": "ops@example.org",
                "send_thread": False,
                "outbox": str(tmp_path / f"outbox{i}"),
            },
            PluginContext(clock=clock, state_dir=tmp_path, state=stores[i]),
        )
        for i in range(2)
    ]
    for n in notifiers:
        n.gridgate_notify(notification=note(clock))
    assert sum(len(n.outbox.pending()) for n in notifiers) == 1
    for n in notifiers:
        n.flush(10)
        n.close()
    for s in stores:
        s.close()
    assert len(smtp.handler.messages) == 1
    assert not (tmp_path / "outbox0" / "records.json").exists()


def test_info_to_error_without_error_address_is_a_config_error(tmp_path):
    # info_to_error sends info to error_address: with none it validated and sent nothing
    from gridgate.core.config import ConfigError, load_config

    cfg = tmp_path / "site.yaml"
    cfg.write_text(
        "notifiers:\n  email:\n    from: gridgate@example.org\n    error_address: ''\n"
        "    alarm_address: alarms@example.org\n    info_to_error: true\n"
    )
    with pytest.raises(ConfigError, match=r"notifiers\.email\.info_to_error: info_to_error is set"):
        load_config(cfg)
