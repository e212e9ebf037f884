"""Regenerates the generated parts of docs/notifications.md: config keys and sample messages.

Run ``python -m gridgate.plugins.notify_ggus.samples [DOC]`` to rewrite the doc, or with
``--check`` to exit 1 when it is stale. The samples are produced by the notifiers themselves
(the e-mails are read back from a real outbox, the ticket from a real spool), so the doc shows
what the code sends.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections.abc import Mapping
from email import message_from_string, policy
from pathlib import Path
from typing import Any

from gridgate.core.clock import FakeClock
from gridgate.core.model import CommandResult, Endpoint, Failure, Notification, SubmitResult
from gridgate.core.plugins import PluginContext
from gridgate.plugins.notify_email.notifier import EmailNotifier
from gridgate.plugins.notify_ggus.notifier import GgusNotifier

BEGIN = "<!-- BEGIN GENERATED {name}: python -m gridgate.plugins.notify_ggus.samples -->"
END = "<!-- END GENERATED {name} -->"
START = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC
ENDPOINT = Endpoint(
    "wms_glite", "wms01.example.org", "https://wms01.example.org:7443/glite_wms_wmproxy_server"
)
ARGV = ("glite-wms-job-submit", "-a", "--nomsg", "-e", ENDPOINT.url, "/tmp/gridgate/pilot.jdl")
STDERR = (
    "\nError - Operation failed\nUnable to submit the job to the service: "
    f"{ENDPOINT.url}\nSystem load is too high:\nThreshold for Load Average(15 min): 10 "
    "=> Detected value for Load Average(15 min): 23.51\n\n"
)


def _body(command: CommandResult, heading: str = "") -> str:
    """A body shaped like the historic director's mails (the real one is the director's)."""
    return (
        f"{heading}Command: {command.command_line}\nreturns: {command.describe()}\n\n"
        f"stdout:\n{command.stdout}\nstderr:\n{command.stderr}"
    )


def sample_notifications() -> tuple[Notification, Notification]:
    command = CommandResult(ARGV, 1, "", STDERR, duration=3.2)
    failure = Failure("error", reason="Unable to submit the job to the service")
    error = Notification(
        "error",
        f"{ENDPOINT.name}: error executing Job Submit [error]",
        _body(command),
        START,
        endpoint=ENDPOINT,
        failure=failure,
        command=command,
        episode_start=START,
        failures_in_episode=1,
        key=f"{ENDPOINT.key}:Job Submit",
    )
    later = START + 3 * 3600 + 600
    alarm = Notification(
        "alarm",
        f"{ENDPOINT.name}: error executing Job Submit [error]",
        _body(
            command,
            "Submit GGUS Ticket for this error if not already opened\n"
            "It has been failing at least for 3.1 hours\n\n",
        ),
        later,
        endpoint=ENDPOINT,
        failure=failure,
        command=command,
        episode_start=START,
        failures_in_episode=4,
        key=f"{ENDPOINT.key}:Job Submit",
    )
    return error, alarm


def local_fault_notification() -> Notification:
    """The director's own error for a submit command missing on its host."""
    from gridgate.core.director import compose_local_fault

    command = CommandResult(
        ARGV, None, launch_error="No such file or directory: 'glite-wms-job-submit'"
    )
    failure = Failure(
        "launch",
        transient=False,
        local=True,
        reason="could not start glite-wms-job-submit: No such file or directory",
    )
    return compose_local_fault(
        ENDPOINT,
        failure,
        SubmitResult(ENDPOINT, ok=False, command=command),
        START + 600,
        3600,
        host="director01.example.org",
    )


def _raw_mail(outbox_message: Mapping[str, Any]) -> str:
    """The queued mail's headers as sent, and its body decoded (it travels quoted-printable
    when a line is longer than 78 characters)."""
    raw = outbox_message["payload"]["raw"].replace("\r\n", "\n")
    # The Message-ID is random by design; a fixed one keeps the doc stable.
    raw = re.sub(r"(?m)^Message-ID: .*$", "Message-ID: <sample@example.org>", raw)
    headers = raw.split("\n\n", 1)[0]
    body = message_from_string(raw, policy=policy.default).get_content()  # type: ignore[attr-defined]
    return f"{headers}\n\n{body}"


def generate() -> dict[str, str]:
    """The generated sections, by name."""
    error, alarm = sample_notifications()
    clock = FakeClock(START)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = PluginContext(clock=clock, state_dir=Path(tmp))
        email = EmailNotifier(
            {
                "host": "smtp.example.org",
                "from": "gridgate@example.org",
                "error_address": "lhcb-ops@example.org",
                "alarm_address": "lhcb-alarms@example.org",
                "send_thread": False,
            },
            ctx,
        )
        email.gridgate_notify(notification=error)
        email.gridgate_notify(notification=alarm)
        email.gridgate_notify(notification=local_fault_notification())
        queued = sorted(email.outbox.queue_dir.glob("*.json"))
        mails = [_raw_mail(json.loads(p.read_text(encoding="utf-8"))) for p in queued]
        email.close()
        ggus = GgusNotifier(
            {"vo": "lhcb", "sites": {"wms01.example.org": "CERN-PROD"}, "send_thread": False}, ctx
        )
        ggus.gridgate_notify(notification=alarm)
        (txt,) = ggus.spool_dir.glob("*.txt")
        (js,) = ggus.spool_dir.glob("*.json")
        ticket_txt, ticket_json = txt.read_text(encoding="utf-8"), js.read_text(encoding="utf-8")
        ggus.close()
    fence = "```"
    return {
        "email-config": config_table(EmailNotifier.config_schema),
        "ggus-config": config_table(GgusNotifier.config_schema),
        "samples": "\n".join(
            [
                "### Error mail (`error_address`)",
                "",
                f"{fence}text",
                mails[0].rstrip("\n"),
                fence,
                "",
                "### Alarm mail (`alarm_address`)",
                "",
                f"{fence}text",
                mails[1].rstrip("\n"),
                fence,
                "",
                "### A fault of the director's own machine (`error_address`; never a GGUS ticket)",
                "",
                "The program could not be started at all (here: not installed), so no server is blamed:",
                "one such error per `failing_expiry` while it lasts, composed by the director.",
                "",
                f"{fence}text",
                mails[2].rstrip("\n"),
                fence,
                "",
                f"### GGUS ticket, spool file `{txt.name}`",
                "",
                f"{fence}text",
                ticket_txt.rstrip("\n"),
                fence,
                "",
                f"### The same ticket, `{js.name}` (the body POSTed by `deliver: [rest]`)",
                "",
                f"{fence}json",
                ticket_json.rstrip("\n"),
                fence,
            ]
        ),
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
        if not pattern.search(doc):
            raise ValueError(f"section markers for {name!r} missing from the doc")
        doc = pattern.sub(lambda _m, c=content, b=begin, e=end: f"{b}\n{c}\n{e}", doc)
    return doc


def default_doc() -> Path:
    return Path(__file__).resolve().parents[2] / "docs" / "notifications.md"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    paths = [a for a in args if a != "--check"]
    path = Path(paths[0]) if paths else default_doc()
    current = path.read_text(encoding="utf-8")
    fresh = render(current, generate())
    if check:
        if fresh != current:
            print(
                f"{path} is stale: run python -m gridgate.plugins.notify_ggus.samples",
                file=sys.stderr,
            )
            return 1
        return 0
    if fresh != current:
        path.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
