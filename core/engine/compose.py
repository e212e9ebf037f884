"""The messages of the failure path: a server's error or alarm, a fault of this machine, a
credential episode. The director sends them; docs/notifications.md shows them as these
functions compose them (``gridgate docs``)."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime

from gridgate.core.kinds import KINDS
from gridgate.core.model import (
    CommandResult,
    CredentialStatus,
    DemandFigure,
    Endpoint,
    Escalation,
    Failure,
    Notification,
    SubmitResult,
    elapsed_text,
)
from gridgate.core.text import printable

ALARM_HEADER = "Submit GGUS Ticket for this error if not already opened"

#: The director's credential episodes in the state store, shared by the directors on one store:
#: ``credential/episode/<scope>`` (its start), ``credential/bad/<scope>/<host>`` (a host that
#: found it unusable, expiring after failing_expiry), ``credential/note/...`` (a message claimed
#: by one director) and ``credential/warning/...`` (an at-risk warning, once per end time);
#: ``<scope>`` is ``<plugin name>:<file>``.
CREDENTIAL = "credential/"


def printable_note(note: Notification) -> Notification:
    """``note`` with its subject (one line), body, the command output and failure reason it
    carries escaped by :func:`gridgate.core.text.printable`: a pilot's stderr, a CE's or
    GGUS's answer, a feed's description reach mail, tickets and files as the escapes they
    hold, never as a cleared screen or reversed text. The same object when nothing needs it."""
    subject = printable(note.subject, newlines=False)
    body = printable(note.body)
    command = note.command
    if command is not None:
        stdout, stderr = printable(command.stdout), printable(command.stderr)
        if (stdout, stderr) != (command.stdout, command.stderr):
            command = replace(command, stdout=stdout, stderr=stderr)
    failure = note.failure
    if failure is not None:
        reason = printable(failure.reason)
        if reason != failure.reason:
            failure = replace(failure, reason=reason)
    if (subject, body, command, failure) == (note.subject, note.body, note.command, note.failure):
        return note
    return replace(note, subject=subject, body=body, command=command, failure=failure)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def compose_failure(
    endpoint: Endpoint,
    failure: Failure,
    escalation: Escalation,
    result: SubmitResult,
    now: float,
) -> Notification:
    """The seed's error or alarm message for one failure (level from ``escalation``)."""
    command = result.command
    timed_out = bool(command and command.timed_out)
    # a kind that says timeout is one, killed by us or not (a "Connection timed out" rule)
    what = "timeout" if timed_out or failure.kind == "timeout" else "error"
    subject = f"{endpoint.name}: {what} executing {result.operation} [{failure.kind}]"
    lines: list[str] = []
    level = escalation.level or "error"
    if level == "alarm":
        # the mail of an alarm must not read as the error mail that came before it
        subject = (
            f"ALARM {subject}: failing at least for {escalation.failing_for(now)}, "
            "submit a GGUS ticket"
        )
    if level == "alarm":
        lines += [
            ALARM_HEADER,
            f"It has been failing at least for {escalation.failing_for(now)}",
            "",
        ]
    lines.append(
        f"Server: {endpoint.name} ({endpoint.backend})"
        + (f" {endpoint.url}" if endpoint.url else "")
    )
    if command is not None:
        lines.append(f"Command: {command.command_line}")
        if command.launch_error is not None:
            lines.append(f"returns: could not start ({command.launch_error})")
        elif timed_out:
            lines.append(f"returns: timeout (killed after {command.duration:.1f} s)")
        else:
            lines.append(f"returns: {command.returncode}")
    lines.append(f"Failure: {failure.kind}" + (f" - {failure.reason}" if failure.reason else ""))
    if command is None and result.message:  # no command to show: the message is the evidence
        lines.append(result.message)
    lines.append(
        f"Episode: first failure {_iso(escalation.episode_start)}, "
        f"{escalation.failures} failure(s) since"
    )
    if command is not None:
        lines += ["", "stdout:", command.stdout.rstrip("\n")]
        if command.stdout_truncated:
            lines.append("[stdout truncated at the output cap]")
        lines += ["", "stderr:", command.stderr.rstrip("\n")]
        if command.stderr_truncated:
            lines.append("[stderr truncated at the output cap]")
    return Notification(
        level=level,
        subject=subject,
        body="\n".join(lines) + "\n",
        created=now,
        endpoint=endpoint,
        failure=failure,
        command=command,
        episode_start=escalation.episode_start,
        failures_in_episode=escalation.failures,
        key=f"{level}/{endpoint.key}/{escalation.episode_start:.0f}/{escalation.failures}",
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def compose_local_fault(
    endpoint: Endpoint,
    failure: Failure,
    result: SubmitResult,
    now: float,
    repeat_every: float,
    host: str | None = None,
) -> Notification:
    """The error for a fault of this machine (``host``, default this one's name): no server
    was blamed, and the subject says what the body shows.

    Four cases, each with its own subject and first line: a program that could not start
    (``cannot run qsub``); an input file of the pilot that is missing or unreadable
    (kind ``missing_input``: the subject names the file); a command that could not be
    prepared, nothing started (``cannot write its files``); a command that ran and failed for
    a fault of this machine (``qsub failed ... for a fault of this machine``), whose output is
    shown. A subject never names a server as failing: that is :func:`compose_failure`'s."""
    command = result.command
    program = command.argv[0] if command is not None and command.argv else "?"
    host = host or socket.gethostname()
    backend = endpoint.backend
    launch_failed = command is not None and command.launch_error is not None
    if launch_failed:
        subject = f"gridgate: cannot run {program} on {host} (backend {backend}) [{failure.kind}]"
        first = (
            f"gridgate could not start {program} on {host}, so backend {backend} submits nothing."
        )
    elif failure.kind == "missing_input":
        what = _clip(failure.reason.split(";", 1)[0], 160) or "an input file is missing"
        subject = f"gridgate: backend {backend} on {host}: {what} [{failure.kind}]"
        first = (
            f"gridgate on {host} lacks an input file of backend {backend}'s pilots (missing or "
            f"unreadable), so backend {backend} submits nothing."
        )
    elif command is None:  # nothing was started: the command's own files could not be written
        subject = f"gridgate: backend {backend} cannot write its files on {host} [{failure.kind}]"
        first = (
            f"gridgate could not prepare a {result.operation} command of backend "
            f"{backend} on {host}, so it submits nothing."
        )
    else:
        subject = (
            f"gridgate: {program} failed on {host} for a fault of this machine "
            f"(backend {backend}) [{failure.kind}]"
        )
        first = (
            f"{program} ran on {host} but failed for a fault of this machine, so backend "
            f"{backend} submits nothing."
        )
    lines = [
        first,
        "",
        f"Failure: {failure.kind}" + (f" - {failure.reason}" if failure.reason else ""),
    ]
    if launch_failed and command is not None:
        lines += [
            f"Command: {command.command_line}",
            f"returns: could not start ({command.launch_error})",
        ]
    else:
        lines += _command_lines(command, "Command")  # what it ran and printed, if it ran
    lines += [
        "",
        "This is a fault of this machine (a missing or unusable program, a missing or "
        "unreadable input file, a work folder that is missing, read-only or full, a wrong path "
        "in the config), not of any server:",
        "- no server is put in the failing cache, and no GGUS ticket is asked for;",
        f"- backend {backend} is paused for the rest of each iteration in which this "
        "happens and tried again at the next, so submission resumes by itself once it is fixed;",
        f"- this message is repeated every {repeat_every:.0f} s while the fault lasts.",
    ]
    return Notification(
        level="error",
        subject=subject,
        body="\n".join(lines) + "\n",
        created=now,
        failure=failure,
        command=command,
        key=f"local-fault/{backend}/{failure.kind}/{now:.0f}",
    )


def _command_lines(command: CommandResult | None, what: str) -> list[str]:
    """A command's argv, how it ended and what it printed, for a message body."""
    if command is None:
        return []
    lines = [
        f"{what}: {command.command_line}",
        f"returns: {command.describe()}",
        "",
        "stdout:",
        command.stdout.rstrip("\n"),
    ]
    if command.stdout_truncated:
        lines.append("[stdout truncated at the output cap]")
    lines += ["", "stderr:", command.stderr.rstrip("\n")]
    if command.stderr_truncated:
        lines.append("[stderr truncated at the output cap]")
    return lines


def compose_credential(
    status: CredentialStatus,
    level: str,
    since: float,
    now: float,
    backends: Iterable[str],
    ticket_expiry: float,
    repeat_every: float,
    host: str | None = None,
) -> Notification:
    """The message for a credential episode (``host``, default this one's name): ``error`` when
    it becomes unusable, ``alarm`` when that has lasted ``ticket_expiry`` (again every
    ``repeat_every``), ``warning`` (sent as an error) when a failed renewal leaves a credential
    that ends before the next could succeed, ``info`` when it is usable again. Each names the
    file, its end time and the renewal's output; the error and the alarm say that no server
    was blamed."""
    host = host or socket.gethostname()
    names = ", ".join(sorted(backends)) or "none of those configured now"
    ends = (
        _iso(status.expires)
        if status.expires is not None
        else "unknown (no credential could be read)"
    )
    subject_what = f"{status.name} credential {status.path} on {host}"
    failure = KINDS["credential"].failure(status.message)
    lines: list[str] = []
    if level == "info":
        subject = f"gridgate: {subject_what} works again"
        lines += [
            f"The {status.kind} credential of {status.name} on {host} is usable again, after "
            f"{elapsed_text(now - since)} (unusable since {_iso(since)}); the backends that need "
            f"it ({names}) submit again.",
            "",
            f"File: {status.path}",
            f"Ends: {ends}",
            f"State: {status.message}",
        ]
    elif level == "warning":
        subject = f"gridgate: {subject_what} expires soon and its renewal failed [credential]"
        lines += [
            f"The {status.kind} credential of {status.name} on {host} could not be renewed and "
            f"ends at {ends}, before the next iteration's renewal could finish. Backends that "
            f"need it ({names}) still submit until then; fix the renewal now.",
            "",
            f"File: {status.path}",
            f"Ends: {ends}",
            f"State: {status.message}",
        ]
    else:
        verb = "submits" if len(set(backends)) == 1 else "submit"
        subject = f"gridgate: {subject_what} unusable: {names} {verb} nothing [credential]"
        if level == "alarm":
            subject = f"ALARM {subject}: unusable at least for {elapsed_text(now - since)}"
        if level == "alarm":
            lines += [
                f"The credential has been unusable at least for {elapsed_text(now - since)}.",
                "",
            ]
        lines += [
            f"gridgate on {host} cannot use the {status.kind} credential of {status.name}, so the "
            f"backends that need it submit nothing and their pilots are not polled: {names}.",
            "",
            f"File: {status.path}",
            f"Ends: {ends}",
            f"Problem: {status.message}",
            f"Episode: unusable since {_iso(since)}",
        ]
    lines += ["", *_command_lines(status.command, "Renewal")] if status.command is not None else []
    if level in ("error", "alarm"):
        lines += [
            "",
            "This is a fault of this machine (its credential), not of any server:",
            "- no server is put in the failing cache, and no ticket is asked of a server's operators;",
            "- every iteration checks and renews it again, so submission resumes by itself once it "
            "is fixed, and a notice says so;",
            f"- this is the one error of this episode; an alarm follows when it lasts "
            f"{elapsed_text(ticket_expiry)}."
            if level == "error"
            else f"- this alarm is repeated every {elapsed_text(repeat_every)} while it lasts.",
        ]
    return Notification(
        level="error" if level == "warning" else level,  # type: ignore[arg-type]
        subject=subject,
        body="\n".join(lines) + "\n",
        created=now,
        failure=failure,
        command=status.command,
        episode_start=None if level == "warning" else since,
        key=f"{CREDENTIAL}{level}/{status.name}:{status.path}/{since:.0f}/{now:.0f}",
    )


def compose_demand_source(
    figure: DemandFigure, level: str, since: float, now: float, host: str
) -> Notification:
    """The error (``level`` ``error``) when ``figure``'s source has failed past ``keep_last``,
    or the notice (``info``) when it answers again after ``since``."""
    what = f"waiting work of demand group {figure.group} ({figure.backend}, {figure.source})"
    if level == "info":
        subject = f"gridgate: {what} is read again on {host}"
        body = (
            f"The source of the waiting work of demand group {figure.group} answers again on "
            f"{host} after {elapsed_text(now - since)}: {figure.jobs} jobs waiting; the group "
            f"asks for pilots of {figure.backend} again.\n"
        )
    else:
        subject = f"gridgate: {what} cannot be read: no pilots for it [demand source]"
        body = (
            f"gridgate on {host} cannot read the waiting work of demand group {figure.group} "
            f"(backend {figure.backend}, demand plugin {figure.source}) and its last good figure "
            "is older than the group's keep_last, so the group asks for no pilots until the "
            "source answers. Other groups are not affected. No server is blamed.\n\n"
            f"Problem: {figure.problem}\n"
            f"Failing for: {elapsed_text(figure.failing_for or 0.0)}\n\n"
            "Check the source (the queue's Redis, the HTTP service, the command) from the "
            "director's host; one notice follows when it answers again.\n"
        )
    return Notification(
        level,  # type: ignore[arg-type]
        subject,
        body,
        now,
        episode_start=since,
        key=f"demand-source/{figure.source}/{figure.group}/{since:.0f}/{level}",
    )


def compose_recovered(
    endpoint: Endpoint,
    start: float,
    failures: int,
    cleared_by: str,
    now: float,
    host: str | None = None,
) -> Notification:
    """The notice that a server whose failures were told works again: it answered a
    submission or a status poll (or an operator cleared it by hand, ``cleared_by``), after an
    episode that began at ``start`` with ``failures`` failures. Once per episode."""
    host = host or socket.gethostname()
    how = f"cleared by {cleared_by} with `gridgate servers clear`" if cleared_by else "by itself"
    lines = [
        f"{endpoint.key} works again: it answered the director on {host}, after {failures} "
        f"failure(s) over {elapsed_text(now - start)} (since {_iso(start)}). It came back {how}, "
        "and is in rotation.",
    ]
    if endpoint.url:
        lines += ["", f"URL: {endpoint.url}"]
    return Notification(
        level="info",
        subject=f"gridgate: {endpoint.name} works again",
        body="\n".join(lines),
        created=now,
        key=f"recovered/{endpoint.key}/{start:.0f}",
    )
