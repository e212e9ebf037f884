"""Security rows: secrets never leak into anything a run produces; files are private;
shell metacharacters stay literal in argv, JDL and mail headers."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from relkit import HOSTS, Site, gridgate, json_lines, wait_for
from support.servers import Authenticator, HttpServer, SmtpServer

from gridgate.core.clock import FakeClock
from gridgate.core.model import Endpoint, Notification
from gridgate.core.plugins import PluginContext
from gridgate.plugins.notify_email.notifier import EmailNotifier
from gridgate.plugins.wms_glite.sim import read_calls

PASSWORD = "Pw-7f3c1e9a-smtp-SECRET"
TOKEN = "Tok-52b8d0c4-ggus-SECRET"


@pytest.fixture(scope="module")
def run_with_secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A director run (-vv, metrics on) with an SMTP password from the environment and a GGUS
    REST token from a file; everything it produced is gathered for the tests below."""
    import sys

    exe = str(Path(sys.executable).parent / "gridgate")
    tmp = tmp_path_factory.mktemp("secrets")
    site = Site(tmp / "site", hosts=HOSTS[:3])
    site.scenario(hosts={HOSTS[0]: {"behaviour": "error"}}, log_calls=False)
    token_file = tmp / "ggus.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    smtp = SmtpServer(
        authenticator=Authenticator("gridgate", PASSWORD), auth_require_tls=False
    ).start()
    helpdesk = HttpServer().start()
    doc = site.doc(failing_expiry=1, ticket_expiry=600, cycle_seconds=0.2, metrics_port=0)
    doc["notifiers"] = {
        "files": {"folder": str(site.notes)},
        "email": {
            "host": "127.0.0.1",
            "port": smtp.port,
            "from": "gridgate@example.org",
            "error_address": "ops@example.org",
            "alarm_address": "alarms@example.org",
            "username": "gridgate",
            "password": {"env": "GG_REL_SMTP_PASSWORD"},
            "dedup_window": 0,
            "poll_interval": 0.05,
            "retry_initial": 0.1,
        },
        "ggus": {
            "vo": "lhcb",
            "deliver": ["spool", "rest"],
            "spool": str(tmp / "spool"),
            "levels": ["error", "alarm"],
            "rest": {"url": helpdesk.url, "token": {"file": str(token_file)}},
        },
    }
    config = site.write(doc)
    out, err = tmp / "run.out", tmp / "run.err"
    env = {**os.environ, "GG_REL_SMTP_PASSWORD": PASSWORD}
    try:
        with out.open("w") as o, err.open("w") as e:
            proc = subprocess.Popen(
                [exe, "-vv", "run", "-c", str(config), "--json"], stdout=o, stderr=e, env=env
            )
        try:
            url = wait_for(
                lambda: re.search(r"metrics on (http://\S+)", err.read_text()),
                60,
                "the metrics endpoint",
            ).group(1)
            wait_for(
                lambda: len(smtp.handler.messages) >= 2 and helpdesk.requests,
                60,
                "an error mail, an alarm mail and a ticket",
            )
            with urllib.request.urlopen(url, timeout=10) as answer:
                metrics = answer.read().decode()
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        report = gridgate(exe, "report", "-c", str(config), "--json")
        outbox = gridgate(exe, "outbox", "list", "--json", "-c", str(config), env=env)
    finally:
        smtp.stop()
        helpdesk.stop()
    return {
        "code": code,
        "tmp": tmp,
        "token_file": token_file,
        "stdout": out.read_text(),
        "stderr": err.read_text(),
        "metrics": metrics,
        "report": report.stdout + report.stderr,
        "outbox": outbox.stdout + outbox.stderr,
        "smtp": smtp,
        "helpdesk": helpdesk,
        "site": site,
    }


@pytest.mark.timeout(150)
def test_secrets_never_appear_in_anything_produced(
    run_with_secrets: dict[str, Any], figures
) -> None:
    run = run_with_secrets
    assert run["code"] == 0, run["stderr"][-2000:]
    # The secrets were really used: AUTH succeeded, the token was sent as the header.
    assert all(m.authenticated for m in run["smtp"].handler.messages)
    assert {r.headers.get("Authorization") for r in run["helpdesk"].requests} == {f"Token {TOKEN}"}

    produced: dict[str, bytes] = {
        "stdout": run["stdout"].encode(),
        "stderr": run["stderr"].encode(),
        "metrics scrape": run["metrics"].encode(),
        "report": run["report"].encode(),
        "outbox list": run["outbox"].encode(),
    }
    for index, message in enumerate(run["smtp"].handler.messages):
        produced[f"mail {index}"] = message.data
    for index, request in enumerate(run["helpdesk"].requests):
        produced[f"ticket body {index}"] = json.dumps(request.body).encode()
    files = [p for p in run["tmp"].rglob("*") if p.is_file() and p != run["token_file"]]
    for path in files:
        produced[str(path)] = path.read_bytes()
    assert any("/outbox/" in name for name in produced), "no outbox files were examined"
    assert any("/spool/" in name for name in produced), "no spooled tickets were examined"
    assert any(name.endswith("state.db") for name in produced)
    assert "DEBUG" in run["stderr"]  # the most talkative log level was examined
    for secret in (PASSWORD, TOKEN):
        for variant in (secret, secret[:12]):
            leaks = [name for name, data in produced.items() if variant.encode() in data]
            assert not leaks, f"{variant!r} found in {leaks}"
    figures(
        artefacts=len(produced),
        files=len(files),
        mails=len(run["smtp"].handler.messages),
        tickets=len(run["helpdesk"].requests),
        stderr_bytes=len(run["stderr"]),
    )


@pytest.mark.timeout(150)
def test_files_a_run_creates_are_private(run_with_secrets: dict[str, Any], figures) -> None:
    run = run_with_secrets
    site: Site = run["site"]
    roots = [site.state_dir, site.notes, run["tmp"] / "spool"]
    checked = []
    for root in roots:
        assert root.exists(), root
        for path in [root, *root.rglob("*")]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            checked.append(path)
            assert mode & 0o007 == 0, f"{path} is world-accessible: {oct(mode)}"
    names = {p.name for p in checked}
    assert {"state.db", "outbox"} <= names
    assert any(n.endswith(".json") for n in names) and any(n.endswith(".txt") for n in names)
    figures(paths_checked=len(checked))


@pytest.mark.timeout(60)
def test_endpoint_name_cannot_inject_mail_headers(tmp_path: Path) -> None:
    smtp = SmtpServer().start()
    try:
        cfg = {
            "host": "127.0.0.1",
            "port": smtp.port,
            "from": "gridgate@example.org",
            "error_address": "ops@example.org",
            "alarm_address": "",
            "send_thread": False,
            "timeout": 5,
        }
        clock = FakeClock(1_790_000_000.0)
        notifier = EmailNotifier(cfg, PluginContext(clock=clock, state_dir=tmp_path))
        evil = "wms01.example.org\r\nBcc: x@y.example\r\nX-Evil: 1"
        endpoint = Endpoint("wms_glite", evil)
        notifier.gridgate_notify(
            notification=Notification(
                "error",
                f"{evil}: error executing Job Submit",
                "body\r\nBcc: z@y.example\n",
                clock.time(),
                endpoint=endpoint,
            )
        )
        result = notifier.flush(30)
        notifier.close()
        received = list(smtp.handler.messages)
    finally:
        smtp.stop()
    assert result.sent == 1 and len(received) == 1, result  # delivered, not lost
    message = received[0].message
    assert received[0].rcpt_tos == ("ops@example.org",)
    assert message["Bcc"] is None and message["X-Evil"] is None
    assert "\r" not in message["Subject"] and "\n" not in message["Subject"]
    assert "wms01.example.org" in message["Subject"]


@pytest.mark.timeout(90)
def test_metacharacters_stay_literal_in_argv_and_jdl(tmp_path: Path, gridgate_exe: str) -> None:
    site = Site(tmp_path / "site", hosts=HOSTS[:2])
    pwned = tmp_path / "pwned"
    payloads = [
        f"$(touch {pwned})",
        f"`touch {pwned}`",
        f"'; touch {pwned}; echo '",
        '"; Executable = "/bin/evil"; X = "',
        "line1\nline2",
        "a & b | c > d",
    ]
    doc = site.doc(max_threads=2)
    glite = doc["backends"]["wms_glite"]
    glite.update(
        {
            "executable": f"pilot$(touch {pwned}).sh",
            "arguments": " ".join(payloads),
            "vo": f"lhcb`touch {pwned}`",
            "std_output": "out; rm -rf /",
            "input_sandbox": payloads[:4],
            "extra_attributes": {"SiteTag": payloads[3]},
            "requirements": f'other.GlueCEUniqueID != "{payloads[0]}"',
        }
    )
    doc["demand"] = {"static": {"wms_glite": 4}}
    config = site.write(doc)
    proc = gridgate(gridgate_exe, "run", "-c", str(config), "--once", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    [it] = json_lines(proc.stdout)
    assert len(it["submitted"]) == 4, it
    assert not pwned.exists(), "a config value reached a shell"
    calls = read_calls(site.calls_log)
    assert calls
    for call in calls:
        # The argv is the fixed shape; no payload ever lands in it.
        assert call.argv[0].startswith(str(site.bin))
        assert list(call.argv[1:5]) == [
            "--noint",
            "--endpoint",
            f"https://{call.host}:7443/glite_wms_wmproxy_server",
            "-a",
        ]
        assert len(call.argv) == 6 and call.argv[5].endswith(".jdl"), call.argv
        jdl = call.jdl
        # One Executable attribute: the quote in the payload did not end the string.
        assert len(re.findall(r"^\s*Executable\s*=", jdl, re.MULTILINE)) == 1, jdl
        assert "line1\\nline2" in jdl and "line1\nline2" not in jdl
        assert '\\"; Executable = \\"/bin/evil\\"' in jdl
        assert f"$(touch {pwned})" in jdl


@pytest.mark.timeout(60)
def test_metacharacters_stay_literal_in_bsub_argv(tmp_path: Path) -> None:
    from gridgate.core.model import SubmitRequest
    from gridgate.core.stores.memory import MemoryState
    from gridgate.core.testing import build_plugin
    from gridgate.plugins.lsf_proxy.director.backend import LsfBackend
    from gridgate.plugins.lsf_proxy.sim import install_commands as install_lsf
    from gridgate.plugins.lsf_proxy.sim import write_scenario as write_lsf_scenario

    pwned = tmp_path / "pwned"
    bin_dir = install_lsf(tmp_path / "lsfbin")
    scenario = write_lsf_scenario(tmp_path / "lsf.json", {"state_dir": str(tmp_path / "lsf")})
    name = f"pilot$(touch {pwned})"
    command = ["pilot.sh", f"; touch {pwned}", f"`touch {pwned}`", "a\nb", "'\""]
    backend = build_plugin(
        LsfBackend,
        {
            "queues": ["short"],
            "commands": {"bsub": str(bin_dir / "bsub"), "bjobs": str(bin_dir / "bjobs")},
            "env": {"GRIDGATE_LSF_SCENARIO": str(scenario)},
            "job_name": name,
            "command": command,
            "resources": f'select[type=="X86_64"] order[$(touch {pwned})]',
        },
        state=MemoryState(),
        state_dir=tmp_path / "state",
        name="lsf",
    )
    try:
        endpoint = backend.endpoints()[0]
        result = backend.gridgate_submit(
            endpoint=endpoint, request=SubmitRequest(backend="lsf"), timeout=30
        )
    finally:
        backend.close()
    assert result is not None and result.ok, result
    assert not pwned.exists(), "a config value reached a shell"
    [job] = [
        json.loads(line) for line in (tmp_path / "lsf" / "jobs.jsonl").read_text().splitlines()
    ]
    assert job["name"] == name and job["command"] == command  # each argument arrived whole
