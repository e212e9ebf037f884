"""Text of the admin commands, following the seed's ``badmin lsfproxyd`` output."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gridgate.core.documents import DocumentError
from gridgate.core.text import printable
from gridgate.plugins.lsf_proxy.client.client import HostReply
from gridgate.plugins.lsf_proxy.config import CATEGORIES, LSF_NAMES
from gridgate.plugins.lsf_proxy.documents import bypass_status, envelope

_METRIC_LABELS = {"query": "Query", "submission": "Submission", "other": "Other"}
_RULE = "-" * 78


#: a name printed as it is; any other (``-``, ``nobody?``, ``a(b)``, empty) is quoted, so that
#: no name reads as the texts that stand for none (``-``, ``(no one)``) or as punctuation
_BARE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@$-]*")

#: what ``bypassing:`` says when no one went around the gate: no name prints like it
NO_ONE = "(no one)"


def name_text(name: str) -> str:
    """A user, host or command name as the admin commands print it: bare when it is a plain
    name, else JSON-quoted (and escaped), so that it cannot be read as a sentinel."""
    return name if _BARE_NAME.fullmatch(name) else json.dumps(name)


def names_text(names: Sequence[str], none: str = "-") -> str:
    """``names`` separated by blanks, each as :func:`name_text`, or ``none`` when empty."""
    return " ".join(map(name_text, names)) or none


def _date(epoch: float | None) -> str:
    return time.strftime("%a %b %d %H:%M:%S", time.localtime(epoch)) if epoch else "-"


def service_status(service: Mapping[str, bool], spaced: bool) -> list[str]:
    """``lsfproxyd service status:`` and one line per category (``QUERY: ENABLED``)."""
    sep = ": " if spaced else ":"
    return ["lsfproxyd service status:"] + [
        f"  {LSF_NAMES[c]}{sep}{'ENABLED' if service.get(c) else 'DISABLED'}" for c in CATEGORIES
    ]


def _unreachable(reply: HostReply) -> str:
    return f"Unable to contact <{reply.daemon.name}>"


def _failure(reply: HostReply) -> str:
    if reply.reply is None:
        if reply.busy:
            # it is there (it answered busy, or took the connection and not the command)
            return f"lsfproxyd host <{reply.daemon.name}> is busy: {reply.error}"
        return _unreachable(reply)
    try:
        error = envelope(reply.reply).error
    except DocumentError as exc:
        return f"lsfproxyd host <{reply.daemon.name}>: {exc}"
    return f"lsfproxyd host <{reply.daemon.name}>: {error.message if error else 'error'}"


def status_text(replies: Sequence[HostReply]) -> list[str]:
    """The seed's status for each daemon in turn: its service state, then its host status
    (each daemon has its own service state; a daemon that rejoins takes it from a peer)."""
    lines: list[str] = []
    for reply in replies:
        if reply.reply is None or not reply.reply.get("ok"):
            lines += [
                "",
                "lsfproxyd host status:",
                f"  HOSTNAME: {reply.daemon.name}",
                f"  STATUS: {_failure(reply)}",
            ]
            continue
        status = reply.reply["status"]
        service = {c: v["enabled"] for c, v in status["categories"].items()}
        lines += [
            "",
            *service_status(service, spaced=True),
            "",
            "lsfproxyd host status:",
            f"  HOSTNAME: {status['name']}",
            "  STATUS: CONNECTED",
            f"  PID: {status['pid']}",
        ]
        peers = status.get("peers")
        if peers:
            lines.append(
                f"  LIVE DAEMONS: {' '.join(peers['live'])} "
                f"(heartbeat every {peers['interval']:g} s)"
            )
        lines.append(
            f"  {'':<11}{'TOKEN_LIMIT':<13}{'TOKENS_IN_USE_TOTAL':<21}TOKENS_IN_USE_PRIVILEGED"
        )
        for cat in CATEGORIES:
            row = status["categories"][cat]
            lines.append(
                f"  {LSF_NAMES[cat]:<11}{row['token_limit']:<13}{row['in_use']:<21}"
                f"{row['in_use_privileged']}"
            )
        capped = [
            f"{LSF_NAMES[c]}={status['categories'][c]['user_max']}"
            for c in CATEGORIES
            if status["categories"][c].get("user_max") is not None
        ]
        if capped:  # not in the seed's table: a line of its own, only when a cap is set
            lines.append(f"  TOKEN_LIMIT_PER_USER: {' '.join(capped)}")
        lines += adaptive_text(status.get("adaptive") or {})
        lines += bypass_text(status.get("bypass"))
        lines += metrics_text(status)
        lines += held_text(status.get("longest_held") or [])
    return lines


def adaptive_text(adaptive: Mapping[str, Any]) -> list[str]:
    """A line per category whose max follows the scheduler (``proxyd.adaptive``): the max in
    force, its bounds and target, and why it last moved or stayed (not in the seed)."""
    lines = []
    for cat in CATEGORIES:
        state = adaptive.get(cat)
        if not state:
            continue
        last = state.get("last") or {}
        lines.append(
            f"  ADAPTIVE_LIMIT: {LSF_NAMES[cat]}={state['limit']} ({state['source']}, "
            f"{state['min']}-{state['max']}, target {state['target_ms']:g} ms): "
            f"{printable(str(last.get('reason') or 'no decision yet'), newlines=False)}"
        )
    return lines


def bypass_text(block: object) -> list[str]:
    """One line for ``proxyd.bypass`` (not in the seed): the audit's scheduler, action and
    interval, the windows judged, who went around the gate in the last one (the RPCs beyond
    their tokens) and whom the action holds now, until when."""
    try:
        bypass = bypass_status(block)
    except DocumentError as exc:
        return [f"  BYPASS_AUDIT: {printable(str(exc), newlines=False)}"]
    if bypass is None:
        return []
    who = (
        ", ".join(
            f"{name_text(user)}={excess:g}" for user, excess in sorted(bypass.bypassing.items())
        )
        or NO_ONE
    )
    held = ", ".join(
        f"{name_text(user)} ({entry.action} until "
        f"{time.strftime('%H:%M:%S', time.localtime(entry.until))})"
        for user, entry in sorted(bypass.acting.items())
    )
    line = (
        f"  BYPASS_AUDIT: {bypass.scheduler} every {bypass.interval:g} s, "
        f"action {bypass.action}, {bypass.windows} windows; "
        f"bypassing: {who}"
    )
    if held:
        line += f"; acting on: {held}"
    if bypass.problem:
        line += f"; problem: {printable(bypass.problem, newlines=False)}"
    return [line]


def held_text(held: Sequence[Mapping[str, Any]]) -> list[str]:
    """The longest-held tokens (``status`` lists a few), with the time left to their limit."""
    if not held:
        return []
    lines = [
        "",
        f"  {'LONGEST_HELD':<13} {'USER@HOST':<23} {'COMMAND':<19} {'CATEGORY':<11} RETURNED_IN",
    ]
    for t in held:
        who = f"{name_text(t['user'])}@{name_text(t['host'])}"
        lines.append(
            f"  {t['held']:<13.1f} {who:<23} {names_text([t['opcode']] if t['opcode'] else []):<19} "
            f"{LSF_NAMES.get(t['category'], t['category']):<11} "
            f"{max(0.0, t['left']):.0f} s"
        )
    return lines


def metrics_text(status: Mapping[str, Any]) -> list[str]:
    rows = status["metrics"]

    def row(label: str, name: str) -> str:
        r = rows[name]
        return f"{label:<42}{r['last']:>12}{r['max']:>12}{r['avg']:>12}"

    period = status["sample_period"]
    period_text = f"{period:g}"
    lines = [
        "",
        f"{'lsfproxyd started:':<32}{_date(status['started'])}",
        f"{'End time of last sample period:':<32}{_date(status.get('period_end'))}",
        f"{'Sample period:':<32}{period_text} Seconds",
        _RULE,
        f"{'Metrics':<42}{'Last':>12}{'Max':>12}{'Avg':>12}",
        _RULE,
        "Requests",
        *(row(f"     {_METRIC_LABELS[c]}", f"requests.{c}") for c in CATEGORIES),
        "Rejected",
        *(row(f"     {_METRIC_LABELS[c]}", f"rejected.{c}") for c in CATEGORIES),
        row("Blocked", "blocked"),
        row("Error", "error"),
    ]
    limited = [c for c in CATEGORIES if c in (status.get("rate_limits") or {})]
    if limited:
        # not in the seed: only where proxyd.rate_limit sets a rate
        lines += [
            "Rate limited",
            *(row(f"     {_METRIC_LABELS[c]}", f"ratelimited.{c}") for c in limited),
        ]
    return lines


def block_text(op: str, replies: Sequence[HostReply]) -> list[str]:
    """``<user1@hostA> added to the blocklist on lsfproxyd host <h1>``, one line per host."""
    lines = []
    for reply in replies:
        if reply.reply is None or not reply.reply.get("ok"):
            lines.append(_failure(reply))
            continue
        r, name = reply.reply, reply.daemon.name
        # each element is a rule: say which were changed and which were not (an older daemon
        # answers only text and changed)
        done, kept = (
            (r["done"], r["kept"])
            if "done" in r
            else ((r["text"], "") if r["changed"] else ("", r["text"]))
        )
        if done:
            verb = "added to" if op == "block" else "removed from"
            lines.append(f"{done} {verb} the blocklist on lsfproxyd host <{name}>")
        if kept:
            verb = "is already in" if op == "block" else "is not a rule of"
            lines.append(f"{kept} {verb} the blocklist on lsfproxyd host <{name}>")
    return lines


def blocklist_text(replies: Sequence[HostReply]) -> list[str]:
    lines: list[str] = []
    for reply in replies:
        if lines:
            lines.append("")
        lines.append(f"lsfproxyd host - {reply.daemon.name}")
        if reply.reply is None or not reply.reply.get("ok"):
            lines.append(f"  {_failure(reply)}")
            continue
        summary = reply.reply["blocklist"]
        lines += [
            f"  {'Blocked all:':<23}{'Yes' if summary['all'] else 'No'}",
            f"  {'Blocked users:':<23}{names_text(summary['users'])}",
            f"  {'Blocked hosts:':<23}{names_text(summary['hosts'])}",
            f"  {'Blocked users@hosts:':<23}{names_text(summary['pairs'])}",
        ]
    return lines


def enable_text(replies: Sequence[HostReply]) -> list[str]:
    """The seed's ``lsfproxyd service status:`` block; with several daemons one block per
    daemon, each naming the host that confirmed it."""
    lines: list[str] = []
    for reply in replies:
        if reply.reply is None or not reply.reply.get("ok"):
            lines.append(_failure(reply))
            continue
        block = service_status(reply.reply["service"], spaced=False)
        if len(replies) > 1:
            block[0] = f"lsfproxyd service status on lsfproxyd host <{reply.daemon.name}>:"
        lines += block
    return lines


def simple_text(replies: Sequence[HostReply], describe: Any) -> list[str]:
    return [
        describe(r) if r.reply is not None and r.reply.get("ok") else _failure(r) for r in replies
    ]
