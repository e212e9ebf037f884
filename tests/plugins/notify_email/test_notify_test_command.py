"""``gridgate notify test`` says per notifier what became of its message, from the delivery
itself: a real SMTP server's reply, the ticket text spooled, the file written."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner
from support.servers import SmtpServer, free_port

from gridgate.core.commands.app import cli


def _config(tmp_path: Path, port: int) -> Path:
    """E-mail to a real SMTP server, GGUS tickets to the spool, texts to a folder; the
    outboxes send from their threads, as at a site."""
    email = {
        "host": "127.0.0.1",
        "port": port,
        "from": "gridgate@example.org",
        "error_address": "ops@example.org",
        "alarm_address": ["alarms@example.org", "shift@example.org"],
        "timeout": 5,
    }
    doc = {
        "director": {"state_dir": str(tmp_path / "state")},
        "state": {"driver": "memory"},
        "notifiers": {
            "email": email,
            "ggus": {"vo": "lhcb", "deliver": ["spool"]},
            "files": {"folder": str(tmp_path / "notes")},
        },
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(path: Path, *extra: str):
    return CliRunner().invoke(cli, ["notify", "test", "-c", str(path), "--level", "alarm", *extra])


def test_each_notifier_says_what_its_delivery_did(tmp_path, smtp) -> None:
    result = _run(_config(tmp_path, smtp.port))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    subject = "[gridgate] gridgate test alarm notification"
    [received] = smtp.handler.messages
    assert received.message["Subject"] == subject
    assert received.rcpt_tos == ("alarms@example.org", "shift@example.org")
    assert (
        f"notifiers:email: delivered {subject!r} to alarms@example.org, shift@example.org "
        "(250 accepted)" in lines
    ), result.output
    [ticket] = (tmp_path / "state" / "tickets").glob("*.txt")
    assert f"notifiers:ggus: written to {ticket}" in lines
    assert "gridgate test alarm notification" in ticket.read_text()
    [note] = (tmp_path / "notes").glob("*-alarm-gridgate.txt")
    assert f"notifiers:files: written to {note}" in lines
    assert "FlushResult" not in result.output and "sent=" not in result.output


def test_a_server_that_is_down_leaves_the_mail_in_the_outbox_and_fails(tmp_path) -> None:
    result = _run(_config(tmp_path, free_port()), "--wait", "5")
    assert result.exit_code == 1, result.output
    [line] = [x for x in result.output.splitlines() if x.startswith("notifiers:email:")]
    assert "NOT delivered '[gridgate] gridgate test alarm notification'" in line, line
    assert f"it waits in the outbox {tmp_path / 'state' / 'outbox'}" in line, line
    assert len(list((tmp_path / "state" / "outbox" / "queue").glob("*.json"))) == 1
    assert any(x.startswith("notifiers:ggus: written to ") for x in result.output.splitlines())


def test_a_recipient_refused_for_good_is_named_and_fails(tmp_path) -> None:
    server = SmtpServer()
    server.handler.refuse_rcpt["shift@example.org"] = "550 5.1.1 no such user"
    server.start()
    try:
        result = _run(_config(tmp_path, server.port))
    finally:
        server.stop()
    assert result.exit_code == 1, result.output
    [line] = [x for x in result.output.splitlines() if x.startswith("notifiers:email:")]
    assert "delivered" in line and "to alarms@example.org, shift@example.org" in line, line
    assert "refused for good for shift@example.org" in line, line
    assert [r.rcpt_tos for r in server.handler.messages] == [("alarms@example.org",)]
