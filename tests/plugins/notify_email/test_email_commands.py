"""``gridgate outbox list|retry|purge`` on outboxes filled by the real notifiers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner
from support.servers import SmtpServer, free_port

from gridgate.core.clock import FakeClock
from gridgate.core.commands.app import cli
from gridgate.core.commands.outbox import Commands
from gridgate.core.config import load_config
from gridgate.core.model import Notification
from gridgate.core.plugins import PluginContext
from gridgate.plugins.notify_email.notifier import EmailNotifier
from gridgate.plugins.notify_ggus.notifier import GgusNotifier


def _group() -> click.Group:
    Commands().gridgate_register_commands(cli=cli)
    return cli


def _config(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(
        f"director:\n  state_dir: {tmp_path / 'state'}\n"
        "notifiers:\n"
        "  email:\n"
        "    host: 127.0.0.1\n"
        f"    port: {port}\n"
        "    from: gridgate@example.org\n"
        "    error_address: ops@example.org\n"
        "    alarm_address: [alarms@example.org, gone@example.org]\n"
        "    send_thread: false\n"
        "    timeout: 5\n"
        "  ggus:\n"
        "    vo: lhcb\n"
        "    deliver: [spool, mail]\n"
        "    mail: {to: shifter@example.org}\n"
        "    send_thread: false\n"
    )
    return path


def _fill(path: Path, clock: FakeClock) -> tuple[EmailNotifier, GgusNotifier]:
    config = load_config(path)
    ctx = PluginContext(
        clock=clock, state_dir=Path(config["director"]["state_dir"]), config=config.data
    )
    email = EmailNotifier(config["notifiers"]["email"], ctx)
    ggus = GgusNotifier(config["notifiers"]["ggus"], ctx)
    for i in range(3):
        note = Notification("alarm" if i == 2 else "error", f"event {i}", "body\n", clock.time())
        email.gridgate_notify(notification=note)
        ggus.gridgate_notify(notification=note)
    return email, ggus


def test_outbox_list_retry_purge(tmp_path):
    clock = FakeClock()
    server = SmtpServer()
    server.handler.refuse_rcpt["gone@example.org"] = "550 5.1.1 gone"
    cfg = _config(tmp_path, server.port)
    email, ggus = _fill(cfg, clock)
    runner = CliRunner()
    group = _group()

    out = runner.invoke(group, ["outbox", "list", "-c", str(cfg), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert [m["summary"] for m in report["email"]["messages"]] == [
        "[gridgate] event 0",
        "[gridgate] event 1",
        "[gridgate] event 2",
    ]
    assert [m["summary"] for m in report["ggus"]["messages"]] == ["[GGUS ticket] event 2"]

    server.start()
    try:
        email.flush(10)
        ggus.flush(10)
        text = runner.invoke(group, ["outbox", "list", "-c", str(cfg)]).output
        assert "email outbox" in text and "0 waiting, 1 dead" in text
        assert "refused" in text and "550 5.1.1 gone" in text
        # The address is fixed; the dead part goes back and is delivered.
        del server.handler.refuse_rcpt["gone@example.org"]
        out = runner.invoke(group, ["outbox", "retry", "-c", str(cfg), "-n", "email", "--flush"])
        assert out.exit_code == 0, out.output
        assert "email: 1 message(s) due now" in out.output and "sent 1" in out.output
    finally:
        server.stop()
    assert server.handler.rcpt_attempts["gone@example.org"] == 2
    rcpts = [m.rcpt_tos for m in server.handler.messages]
    assert rcpts.count(("gone@example.org",)) == 1 and rcpts.count(("alarms@example.org",)) == 1

    # Purge: needs to be told what; waiting ones need confirmation.
    email.gridgate_notify(notification=Notification("error", "late", "b\n", clock.time()))
    out = runner.invoke(group, ["outbox", "purge", "-c", str(cfg)])
    assert out.exit_code == 2 and "say what to delete" in out.output
    out = runner.invoke(group, ["outbox", "purge", "-c", str(cfg), "--waiting"], input="n\n")
    assert out.exit_code == 1 and len(email.outbox.pending()) == 1
    (late,) = email.outbox.pending()
    out = runner.invoke(group, ["outbox", "purge", "-c", str(cfg), "-n", "email", late.id])
    assert out.exit_code == 0 and "email: 1 message(s) deleted" in out.output
    assert email.outbox.pending() == []
    email.close()
    ggus.close()


def test_outbox_commands_report_a_bad_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "notifiers:\n  email:\n    host: x\n    from: gridgate@example.org\n"
        "    password: inline-secret\n"
    )
    out = CliRunner().invoke(_group(), ["outbox", "list", "-c", str(bad)])
    assert out.exit_code == 2
    assert "bad.yaml:5: notifiers.email.password" in out.output


def test_gridgate_console_script_has_the_outbox_command(tmp_path):
    cfg = _config(tmp_path, free_port())
    _fill(cfg, FakeClock())
    gridgate = Path(sys.executable).with_name("gridgate")
    done = subprocess.run(
        [str(gridgate), "outbox", "list", "-c", str(cfg), "-n", "email"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "3 waiting, 0 dead" in done.stdout
