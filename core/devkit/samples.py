"""Regenerates the generated parts of docs/notifications.md: the notifiers' config keys and the
messages of the failure path as people receive them.

``gridgate docs`` rewrites the doc (:mod:`.docs`), ``--check`` exits 1 when it is stale.
Nothing here writes a message body: the error, the alarm, the local fault and the credential
episode are composed by :mod:`gridgate.core.engine.compose` (the functions the director
sends them with), then handed to the real ``email`` and ``ggus`` notifiers, loaded by their
entry-point names as the director loads them; the mails are read back from the real outbox,
the ticket from the real spool.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping
from email import message_from_string, policy
from pathlib import Path
from typing import Any

from gridgate.core.clock import FakeClock
from gridgate.core.engine.compose import compose_credential, compose_failure, compose_local_fault
from gridgate.core.engine.loader import new_plugin_manager
from gridgate.core.engine.section import DIRECTOR_SCHEMA
from gridgate.core.model import (
    CommandResult,
    CredentialStatus,
    Endpoint,
    Escalation,
    Failure,
    Notification,
    SubmitResult,
)
from gridgate.core.plugins import CONFIG_GROUPS, PluginContext, load_class

REGENERATE = "gridgate docs"
BEGIN = "<!-- BEGIN GENERATED {name}: " + REGENERATE + " -->"
END = "<!-- END GENERATED {name} -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "notifications.md"

START = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC
HOST = "director01.example.org"
ENDPOINT = Endpoint(
    "wms_glite", "wms01.example.org", "https://wms01.example.org:7443/glite_wms_wmproxy_server"
)
ARGV = ("glite-wms-job-submit", "-a", "--nomsg", "-e", ENDPOINT.url, "/tmp/gridgate/pilot.jdl")
STDERR = (
    "\nError - Operation failed\nUnable to submit the job to the service: "
    f"{ENDPOINT.url}\nSystem load is too high:\nThreshold for Load Average(15 min): 10 "
    "=> Detected value for Load Average(15 min): 23.51\n\n"
)
#: The notifiers' sections: the sample site's.
EMAIL = {
    "host": "smtp.example.org",
    "from": "gridgate@example.org",
    "error_address": "lhcb-ops@example.org",
    "alarm_address": "lhcb-alarms@example.org",
    "send_thread": False,
}
GGUS = {"vo": "lhcb", "sites": {"wms01.example.org": "CERN-PROD"}, "send_thread": False}
PROXY = "/etc/gridgate/x509up_lhcb"
#: The director's defaults: how often a lasting fault is told again, and when an alarm follows.
FAILING_EXPIRY = float(DIRECTOR_SCHEMA["properties"]["failing_expiry"]["default"])
TICKET_EXPIRY = float(DIRECTOR_SCHEMA["properties"]["ticket_expiry"]["default"])


def server_failure() -> tuple[Notification, Notification]:
    """The error of an overloaded WMS's first failure, and the alarm three hours on."""
    command = CommandResult(ARGV, 1, "", STDERR, duration=3.2)
    failure = Failure("error", reason="Unable to submit the job to the service")
    result = SubmitResult(ENDPOINT, ok=False, command=command)
    error = compose_failure(ENDPOINT, failure, Escalation("error", START, 1), result, START)
    later = START + 3 * 3600 + 600
    alarm = compose_failure(ENDPOINT, failure, Escalation("alarm", START, 4), result, later)
    return error, alarm


def local_fault() -> Notification:
    """The error for a submit command missing on the director's own machine."""
    command = CommandResult(
        ARGV, None, launch_error="No such file or directory: 'glite-wms-job-submit'"
    )
    failure = Failure(
        "launch",
        transient=False,
        local=True,
        reason="could not start glite-wms-job-submit: No such file or directory",
    )
    result = SubmitResult(ENDPOINT, ok=False, command=command)
    return compose_local_fault(ENDPOINT, failure, result, START + 600, FAILING_EXPIRY, host=HOST)


def credential_error() -> Notification:
    """The error when the X.509 proxy has expired and its renewal failed."""
    renew = CommandResult(
        ("voms-proxy-init", "--voms", "lhcb", "--valid", "24:00", "--out", PROXY),
        1,
        "",
        "Enter GRID pass phrase for this identity:\nError: could not load the user key\n",
        duration=0.4,
    )
    status = CredentialStatus(
        name="x509_proxy",
        kind="x509",
        usable=False,
        path=PROXY,
        expires=START - 300,
        message=f"X.509 proxy {PROXY} expired at 2026-09-21 14:08:20 UTC (5 minutes ago); "
        f"the renewal failed ({renew.describe()})",
        command=renew,
    )
    return compose_credential(
        status, "error", START, START, ["wms_glite"], TICKET_EXPIRY, FAILING_EXPIRY, host=HOST
    )


def _raw_mail(outbox_message: Mapping[str, Any]) -> str:
    """The queued mail's headers as sent, and its body decoded (it travels quoted-printable
    when a line is longer than 78 characters)."""
    raw = outbox_message["payload"]["raw"].replace("\r\n", "\n")
    # The Message-ID is random by design; a fixed one keeps the doc stable.
    raw = re.sub(r"(?m)^Message-ID: .*$", "Message-ID: <sample@example.org>", raw)
    headers = raw.split("\n\n", 1)[0]
    body = message_from_string(raw, policy=policy.default).get_content()
    return f"{headers}\n\n{body}"


def notifier_classes() -> dict[str, type]:
    """The ``email`` and ``ggus`` notifier classes, found by entry-point name."""
    return {name: load_class(CONFIG_GROUPS["notifiers"], name) for name in ("email", "ggus")}


def sent() -> tuple[list[str], tuple[str, str, str, str]]:
    """Every sample notification broadcast to the real notifiers: the mails in the order they
    were queued, and the ticket (``.txt`` name and text, ``.json`` name and text)."""
    error, alarm = server_failure()
    notes = [error, alarm, local_fault(), credential_error()]
    classes = notifier_classes()
    with tempfile.TemporaryDirectory() as tmp:
        context = PluginContext(
            clock=FakeClock(START),
            state_dir=Path(tmp),
            config={"notifiers": {"email": EMAIL, "ggus": GGUS}},
        )
        email = classes["email"](EMAIL, context)
        ggus = classes["ggus"](GGUS, context)
        pm = new_plugin_manager()
        pm.register(email, name="notifiers:email")
        pm.register(ggus, name="notifiers:ggus")
        try:
            for note in notes:
                pm.hook.gridgate_notify(notification=note)
            queued = sorted(email.outbox.queue_dir.glob("*.json"))
            mails = [_raw_mail(json.loads(p.read_text(encoding="utf-8"))) for p in queued]
            (txt,) = ggus.spool_dir.glob("*.txt")
            (js,) = ggus.spool_dir.glob("*.json")
            ticket = (
                txt.name,
                txt.read_text(encoding="utf-8"),
                js.name,
                js.read_text(encoding="utf-8"),
            )
        finally:
            email.close()
            ggus.close()
    return mails, ticket


def _block(title: str, text: str, lang: str = "text", note: str = "") -> list[str]:
    fence = "```"
    return [
        f"### {title}",
        "",
        *([note, ""] if note else []),
        f"{fence}{lang}",
        text.rstrip("\n"),
        fence,
        "",
    ]


def generate() -> dict[str, str]:
    """The generated sections, by name."""
    mails, (txt_name, txt, js_name, js) = sent()
    classes = notifier_classes()
    error, alarm, fault, credential = mails
    samples = [
        *_block("Error mail (`error_address`)", error),
        *_block("Alarm mail (`alarm_address`)", alarm),
        *_block(
            "A fault of the director's own machine (`error_address`; never a GGUS ticket)",
            fault,
            note="The program could not be started at all (here: not installed), so no server "
            "is blamed: one such error per `failing_expiry` while it lasts.",
        ),
        *_block(
            "A credential that cannot be used (`error_address`; never a GGUS ticket)",
            credential,
            note="The proxy expired and its renewal failed: the backends that need it submit "
            "nothing until it works again, then a notice says so; an alarm follows when it "
            "lasts `ticket_expiry`.",
        ),
        *_block(f"GGUS ticket, spool file `{txt_name}`", txt),
        *_block(f"The same ticket, `{js_name}` (the body POSTed by `deliver: [rest]`)", js, "json"),
    ]
    return {
        "email-config": config_table(classes["email"].config_schema),  # type: ignore[attr-defined]
        "ggus-config": config_table(classes["ggus"].config_schema),  # type: ignore[attr-defined]
        "samples": "\n".join(samples).rstrip("\n"),
    }


def _default(spec: Mapping[str, Any]) -> str:
    if "default" not in spec:
        return "required" if spec.get("_required") else "unset"
    return f"`{json.dumps(spec['default'])}`"


def config_table(schema: Mapping[str, Any], prefix: str = "") -> str:
    """A Markdown table of a section's keys: name, default, meaning (nested objects flattened)."""
    rows = ["| key | default | meaning |", "|---|---|---|"] if not prefix else []
    required = set(schema.get("required", ()))
    for key, spec in schema.get("properties", {}).items():
        name = f"{prefix}{key}"
        spec = {**spec, "_required": key in required}
        allowed = f" One of: {', '.join(f'`{v}`' for v in spec['enum'])}." if "enum" in spec else ""
        rows.append(f"| `{name}` | {_default(spec)} | {spec.get('description', '')}{allowed} |")
        if (
            spec.get("type") == "object"
            and spec.get("properties")
            and "env" not in spec["properties"]
        ):
            rows.append(config_table(spec, prefix=f"{name}."))
    return "\n".join(rows)


def render(doc: str, sections: Mapping[str, str]) -> str:
    """``doc`` with each generated section replaced by its fresh content."""
    for name, content in sections.items():
        begin, end = BEGIN.format(name=name), END.format(name=name)
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        found = pattern.search(doc)
        if found is None:
            raise ValueError(f"section markers for {name!r} missing from the doc")
        doc = f"{doc[: found.start()]}{begin}\n{content}\n{end}{doc[found.end() :]}"
    return doc
