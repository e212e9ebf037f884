"""``gridgate outbox list|retry|purge``: inspect and manage what the notifiers' outboxes hold.

Core's, as the outbox is (:mod:`gridgate.core.outbox`): it serves every configured notifier
whose class has a ``make_outbox(section, state_dir, clock, config)`` class method (the ``email``
and ``ggus`` notifiers, or a third party's), without importing any of them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from gridgate.core import hookimpl
from gridgate.core.cli import echo, load_config_or_exit
from gridgate.core.clock import SYSTEM_CLOCK
from gridgate.core.outbox import Message, Outbox


def state_dir_of(config: Any) -> Path:
    """The config's ``director.state_dir`` (the notifiers keep their outboxes under it)."""
    director = config.get("director") or {}
    return Path(director.get("state_dir") or "./gridgate-state")


def _utc(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def outboxes(config: Any, only: tuple[str, ...] = ()) -> list[tuple[str, Outbox]]:
    """(notifier name, outbox) for every configured notifier that keeps an outbox."""
    found = []
    notifiers = config.get("notifiers") or {}
    for name, section in notifiers.items():
        cls = config.plugin_classes.get(("notifiers", name))
        if cls is None or not hasattr(cls, "make_outbox") or (only and name not in only):
            continue
        found.append(
            (name, cls.make_outbox(section, state_dir_of(config), SYSTEM_CLOCK, config.data))
        )
    if not found:
        wanted = f" among {', '.join(only)}" if only else ""
        raise click.ClickException(f"no notifier with an outbox is configured{wanted}")
    return found


def _describe(message: Message, state: str) -> dict[str, Any]:
    payload = message.payload
    target = payload.get("to") or payload.get("url") or ""
    return {
        "id": message.id,
        "state": state,
        "transport": message.transport,
        "summary": message.summary,
        "to": target,
        "enqueued": message.enqueued,
        "attempts": message.attempts,
        "next_attempt": message.next_attempt,
        "last_error": message.last_error,
        "reply": message.reply,
        "dead_at": message.dead_at,
    }


@click.group("outbox")
def outbox_group() -> None:
    """Messages waiting in, or refused out of, the notifiers' outboxes."""


config_option = click.option(
    "-c",
    "--config",
    "path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The site's config file.",
)
notifier_option = click.option(
    "-n",
    "--notifier",
    "only",
    multiple=True,
    help="Only this notifier's outbox (email, ggus); repeatable.",
)


@outbox_group.command("list")
@config_option
@notifier_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
def list_command(path: str, only: tuple[str, ...], as_json: bool) -> None:
    """List waiting and dead-lettered messages, oldest first."""
    config = load_config_or_exit(path)
    report: dict[str, Any] = {}
    for name, box in outboxes(config, only):
        rows = [_describe(m, "waiting") for m in box.pending()] + [
            _describe(m, "dead") for m in box.dead()
        ]
        report[name] = {"directory": str(box.directory), "messages": rows}
    if as_json:
        echo(json.dumps(report, indent=2))
        return
    for name, entry in report.items():
        rows = entry["messages"]
        waiting = sum(1 for r in rows if r["state"] == "waiting")
        echo(f"{name} outbox {entry['directory']}: {waiting} waiting, {len(rows) - waiting} dead")
        for r in rows:
            to = ", ".join(r["to"]) if isinstance(r["to"], list) else r["to"]
            echo(
                f"  {r['state']:<7} {r['id']}  {r['transport']:<4} queued "
                f"{_utc(r['enqueued'])}  attempts {r['attempts']}  to {to}"
            )
            echo(f"          {r['summary']}")
            if r["state"] == "waiting" and r["attempts"]:
                echo(
                    f"          next attempt {_utc(r['next_attempt'])}; "
                    f"last error: {r['last_error']}"
                )
            if r["state"] == "dead":
                echo(f"          refused {_utc(r['dead_at'])}: {r['reply']}")


@outbox_group.command("retry")
@config_option
@notifier_option
@click.option(
    "--flush", "flush_now", is_flag=True, help="Also try to deliver now from this process."
)
@click.argument("ids", nargs=-1)
def retry_command(path: str, only: tuple[str, ...], flush_now: bool, ids: tuple[str, ...]) -> None:
    """Put dead-lettered messages back in the queue and make waiting ones due now
    (all of them, or only IDS)."""
    config = load_config_or_exit(path)
    for name, box in outboxes(config, only):
        touched = box.retry(list(ids) or None)
        echo(f"{name}: {touched} message(s) due now")
        if flush_now and touched:
            result = box.flush(60)
            echo(
                f"{name}: sent {result.sent}, retry later {result.retried}, "
                f"dead {result.dead}, waiting {result.waiting}"
            )


@outbox_group.command("purge")
@config_option
@notifier_option
@click.option("--dead", is_flag=True, help="Delete every dead-lettered message.")
@click.option("--waiting", is_flag=True, help="Delete every waiting message (never sent).")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.argument("ids", nargs=-1)
def purge_command(
    path: str, only: tuple[str, ...], dead: bool, waiting: bool, yes: bool, ids: tuple[str, ...]
) -> None:
    """Delete messages: IDS, and/or all --dead, and/or all --waiting ones."""
    if not (ids or dead or waiting):
        raise click.UsageError("say what to delete: message IDS, --dead or --waiting")
    config = load_config_or_exit(path)
    boxes = outboxes(config, only)
    if waiting and not yes:
        click.confirm("Delete messages that were never delivered?", abort=True)
    for name, box in boxes:
        removed = box.purge(list(ids) or None, dead=dead, waiting=waiting)
        echo(f"{name}: {removed} message(s) deleted")


class Commands:
    """Adds ``gridgate outbox`` to the command line."""

    @hookimpl
    def gridgate_register_commands(self, cli: click.Group) -> None:
        cli.add_command(outbox_group)
