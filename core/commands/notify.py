"""``gridgate notify test``: send one test notification through every configured notifier and
say, per notifier, what really became of it: from the outbox's delivery attempt (the SMTP
server's or helpdesk's reply) and the files written, not from a count of a later flush."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gridgate.core.model import Notification
from gridgate.core.outbox import Delivery, Message, Outbox
from gridgate.core.text import safe_url

__all__ = ["test_notification", "try_notifier"]


def test_notification(level: str) -> Notification:
    """The notification ``gridgate notify test`` sends at ``level``."""
    now = time.time()
    return Notification(
        level=level,  # type: ignore[arg-type]
        subject=f"gridgate test {level} notification",
        body=f"This is a test sent by `gridgate notify test` at {time.ctime(now)}.\n",
        created=now,
        key=f"test/{now:.0f}",
    )


def _target(payload: Any) -> str:
    if isinstance(payload, dict):
        if payload.get("to"):
            return ", ".join(str(a) for a in payload["to"])
        if payload.get("url"):
            return safe_url(str(payload["url"]))
    return "its transport"


def _said(message: Message, delivery: Delivery | None, outbox: Outbox) -> tuple[str, bool]:
    """One line on ``message`` and whether it is a failure."""
    what = repr(message.summary or message.transport)
    where = f"it waits in the outbox {outbox.directory} (gridgate outbox list)"
    if delivery is None:
        return f"{what} to {_target(message.payload)}: no answer yet; {where}", True
    if delivery.status == "sent":
        line = f"delivered {what} to {_target(message.payload)} ({delivery.reply or 'accepted'})"
        failed = False
        if delivery.dead_payload is not None:
            line += f"; refused for good for {_target(delivery.dead_payload)}"
            failed = True
        if delivery.retry_payload is not None:
            line += f"; not yet for {_target(delivery.retry_payload)}, {where}"
            failed = True
        return line, failed
    if delivery.status == "retry":
        return (
            f"NOT delivered {what} to {_target(message.payload)}: {delivery.reply}; {where} "
            "and is retried",
            True,
        )
    return (
        f"REFUSED for good {what} to {_target(message.payload)}: {delivery.reply}; kept in "
        f"{outbox.dead_dir}",
        True,
    )


def try_notifier(plugin: Any, note: Notification, wait: float) -> tuple[list[str], bool]:
    """Hand ``note`` to the notifier ``plugin`` and wait up to ``wait`` seconds for what it
    queued to have a delivery attempt. Returns the lines to print and whether any failed."""
    outbox = getattr(plugin, "outbox", None)
    written = getattr(plugin, "written", None)
    if written is not None:
        written.clear()
    lines: list[str] = []
    failed = False
    if isinstance(outbox, Outbox):
        with outbox.watch() as watch:
            plugin.gridgate_notify(notification=note)
            watch.wait(wait)
            messages = list(watch.messages)
            outcomes = dict(watch.outcomes)
        for message in messages:
            line, bad = _said(message, outcomes.get(message.id), outbox)
            lines.append(line)
            failed = failed or bad
    else:
        plugin.gridgate_notify(notification=note)
        messages = []
    files: Iterable[Path] = list(written) if written is not None else []
    lines.extend(f"written to {path}" for path in files)
    if not lines:
        if written is None and outbox is None:
            lines.append("handed over (this notifier reports nothing more)")
        else:
            lines.append(
                f"nothing sent: not configured for {note.level} notifications, or it "
                "sent the same one a moment ago (see its log line)"
            )
    return lines, failed
