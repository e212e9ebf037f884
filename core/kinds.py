"""The catalogue of failure kinds: what each kind means and what the director does with it.

A classifier answers with a :class:`~gridgate.core.model.Failure`; its ``kind`` is a short
word, and its flags decide what happens:

- ``exclude``: the server is taken out of rotation for the rest of the iteration and put in
  the failing cache (core's, ``core/failing.py``); then the escalation plugin decides who is told;
- ``notify``: people are told (an error on the first failure of an episode; an alarm when it
  fails again within the tickets window);
- ``transient``: the submission is worth sending to another server in the same iteration;
- ``local``: the fault is on the director's machine: no server is blamed, the backend is
  paused for the iteration, and one error per ``failing_expiry`` says what to fix.

The catalogue gives each known kind its meaning and these flags, so that backends and
classifiers agree on them (build a failure with :func:`failure`). A plugin may still answer
with a kind of its own that is not listed here: the director uses that failure's flags as
given (its ``exclude``, ``notify``, ``transient`` and ``local``), ``gridgate plugins --kinds``
does not list it, and it is counted and reported under its own name like any other.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gridgate.core.model import Failure

__all__ = [
    "KINDS",
    "OUTCOME_KINDS",
    "Kind",
    "counts_toward_alarms",
    "failure",
    "kind_table",
    "missing_input",
]


@dataclass(frozen=True)
class Kind:
    """One catalogued failure kind: its name, one line of meaning, and its default flags."""

    name: str
    meaning: str
    exclude: bool = True
    notify: bool = True
    transient: bool = True
    local: bool = False
    #: whether repeated failures may become an alarm (a ticket to the server's operators);
    #: False for what the site must fix itself
    alarms: bool = True

    def failure(self, reason: str = "", **flags: Any) -> Failure:
        """A :class:`Failure` of this kind with the catalogue's flags (``flags`` override)."""
        return replace(
            Failure(
                kind=self.name,
                exclude=self.exclude,
                notify=self.notify,
                transient=self.transient,
                local=self.local,
            ),
            reason=reason,
            **flags,
        )

    @property
    def escalated(self) -> bool:
        """Whether a failure of this kind reaches the escalation plugin (and the caches)."""
        return self.exclude and not self.local

    @property
    def counts_toward_alarms(self) -> bool:
        """Whether repeated failures may become an alarm (a ticket to the server's operators)."""
        return self.escalated and self.notify and self.alarms


_CATALOGUE: tuple[Kind, ...] = (
    Kind("timeout", "the command did not finish before its deadline and was killed"),
    Kind("unreachable", "the server could not be contacted (refused, unresolvable, no route)"),
    Kind("daemon", "the batch system's own daemons are not answering"),
    Kind("error", "the command failed and nothing more specific is known"),
    Kind("bad_output", "the command exited 0 but its output held no usable answer (no job id)"),
    Kind("overload", "the server says it is overloaded: it is protecting itself", notify=False),
    Kind("drained", "the server is drained or temporarily unavailable", notify=False),
    Kind("busy", "the server says it is busy; try another", notify=False),
    Kind("auth", "the credential was refused or has expired", transient=False),
    Kind(
        "usage",
        "the server refused the command line or a resource request as malformed",
        transient=False,
    ),
    Kind(
        "refused",
        "admission control gave no token: the server is fine, try later",
        exclude=False,
        notify=False,
    ),
    Kind(
        "launch",
        "the command could not be started on this machine (missing or unusable program)",
        exclude=False,
        transient=False,
        local=True,
    ),
    Kind(
        "local_io",
        "a file the command needs could not be written or prepared on this machine (a work "
        "folder missing, read-only or full): nothing submitted, no server blamed",
        exclude=False,
        transient=False,
        local=True,
        alarms=False,
    ),
    Kind(
        "missing_input",
        "an input file of the pilot (its script, an input sandbox file the config names) does "
        "not exist or cannot be read on this machine: nothing submitted, no server blamed; "
        "the reason names the file",
        exclude=False,
        transient=False,
        local=True,
        alarms=False,
    ),
    Kind(
        "config",
        "the site's configuration is wrong for this server: a queue, partition, "
        "account or script that does not exist, a value the backend cannot turn into a command",
        transient=False,
        alarms=False,
    ),
    Kind(
        "credential",
        "a credential the backend's commands need (an X.509 proxy, a token) is "
        "missing, unreadable or expired: nothing is submitted with it. When it is managed "
        "(credentials:), checked before the iteration: the backend is not polled either, one "
        "error per episode, an alarm to the site when it lasts ticket_expiry, a notice when it "
        "works again",
        exclude=False,
        transient=False,
        local=True,
        alarms=False,
    ),
)

#: Every catalogued kind by name.
KINDS: dict[str, Kind] = {kind.name: kind for kind in _CATALOGUE}

#: Words the director writes in the accounting table's ``failure_kind`` for attempts that
#: never reached a server (they are not failures a classifier gives).
OUTCOME_KINDS: dict[str, str] = {
    "no_backend": "the demand names a backend that is not configured",
    "claimed_elsewhere": "another director holds this demand group's lock",
    "local_fault": "skipped: the backend is paused after a fault of this machine this iteration "
    "(launch, local_io, missing_input, credential, or a local config fault)",
    "no_endpoint": "skipped: every server is excluded or in the failing cache",
    "no_fit": "skipped: no endpoint can run what the group's pilots ask (its "
    "endpoint_resources, or what the backend can express); said once until one can",
    "admission": "refused by admission control before any command ran",
    "plugin_error": "a plugin raised instead of returning a result",
}


def failure(kind: str, reason: str = "", **flags: Any) -> Failure:
    """A failure of the catalogued ``kind`` with its flags.

    :param kind: a name in :data:`KINDS`.
    :param reason: one human line: what the command said, quoted.
    :param flags: ``exclude``, ``notify``, ``transient`` or ``local`` to differ from the
        catalogue (a transient kind told only when it persists, say).
    :raises KeyError: for a kind not in the catalogue (build ``Failure(...)`` yourself for a
        kind of your own).
    """
    return KINDS[kind].failure(reason, **flags)


def missing_input(files: Mapping[str, str | os.PathLike[str] | None]) -> str:
    """Why a pilot cannot be submitted for want of one of its input ``files`` here, or ``""``
    when each is a file this process can read.

    Call it in ``submit`` before running anything, with the files your section names (the
    pilot script, an input sandbox): when it answers, submit nothing and return
    ``SubmitResult(endpoint, ok=False, local_fault=why, message=why)``, and classify that
    result ``failure("missing_input", result.local_fault)``: a fault of this machine, told once
    per ``failing_expiry``, no server blamed (without your classification core's default says
    ``local_io``). Mark the keys naming the files ``"x-gridgate-path": True`` in your schema,
    so that a relative path in a config file is its folder's; a path still relative here is
    named as the absolute path tried (from the working directory).

    :param files: what each file is, for people (``"the pilot script (backends.mybatch.script)"``)
        -> its path; an empty or None path (a key left unset) is skipped.
    :return: one line naming the file and why it cannot be used: ``"the pilot script
        (backends.mybatch.script) /srv/pilot.sh does not exist"``.
    """
    for what, path in files.items():
        if not path:
            continue
        where = os.path.abspath(os.fspath(path))
        try:
            # non-blocking: a FIFO named by mistake must not hang the submission thread
            fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return f"{what} {where} does not exist"
        except PermissionError:
            return f"{what} {where} cannot be read by this user (permission denied)"
        except OSError as exc:
            return f"{what} {where} cannot be read: {exc.strerror or exc}"
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                return f"{what} {where} is a folder, not a file"
        finally:
            os.close(fd)
    return ""


def counts_toward_alarms(kind: str) -> bool:
    """Whether failures of ``kind`` may become an alarm; a kind not in the catalogue may."""
    entry = KINDS.get(kind)
    return entry is None or entry.alarms


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def kind_table() -> list[dict[str, str]]:
    """The catalogue as rows for people (``gridgate plugins --kinds``, docs)."""
    return [
        {
            "kind": k.name,
            "excluded": _yes(k.escalated),
            "notified": _yes(k.notify),
            "alarms": _yes(k.counts_toward_alarms),
            "retried elsewhere": _yes(k.transient and not k.local),
            "local": _yes(k.local),
            "meaning": k.meaning,
        }
        for k in _CATALOGUE
    ]


_COLUMNS = ("kind", "excluded", "notified", "alarms", "retried elsewhere", "local", "meaning")


def markdown_table() -> list[str]:
    """The catalogue as a Markdown table (docs/kinds.md)."""
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for row in kind_table():
        lines.append(
            "| " + " | ".join(f"`{row[c]}`" if c == "kind" else row[c] for c in _COLUMNS) + " |"
        )
    return lines


def print_kinds(echo: Callable[[str], Any], as_json: bool = False) -> None:
    """``gridgate plugins --kinds``: the catalogue, then the accounting-only words."""
    if as_json:
        echo(json.dumps({"kinds": kind_table(), "accounting_only": OUTCOME_KINDS}, indent=2))
        return
    echo(
        f"{'kind':<13} {'excluded':<9}{'notified':<9}{'alarms':<7}{'retried':<8}{'local':<6} meaning"
    )
    for row in kind_table():
        echo(
            f"{row['kind']:<13} {row['excluded']:<9}{row['notified']:<9}{row['alarms']:<7}"
            f"{row['retried elsewhere']:<8}{row['local']:<6} {row['meaning']}"
        )
    echo("")
    echo("Written in the accounting table for attempts that reached no server:")
    for word, meaning in OUTCOME_KINDS.items():
        echo(f"  {word:<18} {meaning}")
    echo("")
    echo("A plugin may answer with a kind of its own: its Failure's flags are used as given.")
