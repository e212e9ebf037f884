"""Names what went wrong with a gLite WMS command, from its exit code and what it printed.

Site rules from config are tried first, then the built-in gLite patterns. Each answer says
whether to exclude the server, whether people hear about it, whether a retry elsewhere is
worthwhile, and quotes the line that gave it away.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gridgate.core.kinds import KINDS
from gridgate.core.model import CommandResult, Failure
from gridgate.core.patterns import clip
from gridgate.core.settings import settings_from
from gridgate.plugins.wms_glite.parse import client_messages, first_line_matching, last_line
from gridgate.plugins.wms_glite.settings import RULE_SCHEMA, GliteRuleSettings


@dataclass(frozen=True)
class Rule:
    """A site rule: ``pattern`` searched in ``stream`` (and ``returncode`` equal, when set)."""

    kind: str
    pattern: re.Pattern[str]
    stream: str = "any"
    returncode: int | None = None
    exclude: bool = True
    notify: bool = True
    transient: bool = True

    @classmethod
    def from_settings(cls, rule: GliteRuleSettings) -> Rule:
        """The rule of a ``rules`` entry."""
        return cls(
            kind=rule.kind,
            pattern=re.compile(rule.pattern),
            stream=rule.stream,
            returncode=rule.returncode,
            exclude=rule.exclude,
            notify=rule.notify,
            transient=rule.transient,
        )

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> Rule:
        """The rule of a ``rules`` entry as written (:data:`RULE_SCHEMA`'s keys)."""
        return cls.from_settings(
            settings_from(RULE_SCHEMA, entry, GliteRuleSettings, validate=False)
        )


@dataclass(frozen=True)
class _Pattern:
    """A line gLite prints and its catalogued kind (whose flags it takes)."""

    kind: str
    regex: re.Pattern[str]
    label: str


# Order matters: a server that is overloaded or drained may also say it could not submit,
# and an auth failure is often followed by a generic "Unable to ..." line.
BUILTIN_PATTERNS: tuple[_Pattern, ...] = (
    _Pattern("overload", re.compile(r"System load is too high", re.I), "server overloaded"),
    _Pattern(
        "drained", re.compile(r"temporarily drained|Unavailable service", re.I), "server drained"
    ),
    _Pattern(
        "auth",
        re.compile(
            r"Proxy File Not Found|No path to valid proxy|Unable to delegate the credential|"
            r"proxy (?:has )?expired|Proxy certificate|delegation.*(?:failed|not found|expired)|"
            r"credential.*(?:expired|not valid|invalid)|Authentication failed|"
            r"not authori[sz]ed|Authori[sz]ation (?:error|failed)",
            re.I,
        ),
        "credential problem",
    ),
    _Pattern(
        "unreachable",
        re.compile(
            r"Unable to contact any specified en[d]?point|WMProxy unreachable|"
            r"may be down \(or wrong server name\)|Connection refused|Couldn't resolve host|"
            r"Could not resolve host|No route to host|Connection timed out|Network is unreachable|"
            r"couldn't connect|SSL connect error",
            re.I,
        ),
        "server unreachable",
    ),
)


def _quote(line: str) -> str:
    return f'"{clip(line)}"'


def _telling_line(text: str, regex: re.Pattern[str]) -> str | None:
    """The matching line; when it ends in ':' (``System load is too high:``) the detail on
    the next non-blank line is the telling part, so it is joined on."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if regex.search(line):
            telling = line.strip()
            # "Error - <header>" and "...too high:" announce the detail on the next line.
            if telling.endswith(":") or telling.startswith("Error - "):
                for following in lines[index + 1 :]:
                    if following.strip():
                        telling = f"{telling} {following.strip()}"
                        break
            return telling
    return None


def _first_error_line(command: CommandResult, fallback_first: bool = False) -> str:
    for message in client_messages(command.stderr):
        if message.level == "error":
            # "Unable to submit the job to the service: <ep>" says where; the line after it
            # usually says why, so both are quoted.
            return " / ".join(message.lines[:2]) if message.lines else message.header
    if fallback_first:
        # Usage output puts the complaint first and the option list after it.
        for line in command.stderr.splitlines():
            if line.strip():
                return line.strip()
    return last_line(command.stderr) or last_line(command.stdout)


def _streams(command: CommandResult, stream: str) -> str:
    if stream == "stdout":
        return command.stdout
    if stream == "stderr":
        return command.stderr
    return f"{command.stdout}\n{command.stderr}"


def classify(
    command: CommandResult | None,
    rules: Sequence[Rule] = (),
    message: str = "",
    expected: str = "job id",
) -> Failure:
    """Classify a failed gLite command (or a failure that never ran one: ``command`` None).

    Kinds (from :mod:`gridgate.core.kinds`, with their flags): site rule kinds, ``launch``,
    ``timeout``, ``overload``, ``drained``, ``auth``, ``unreachable``, ``usage`` (exit 255),
    ``bad_output`` (exit 0 without the expected answer, named by ``expected``), ``error``
    (anything else), ``config`` (nothing was run: the request or the site's config could not
    be turned into a JDL; the server stays in rotation).
    """
    if command is None:
        # nothing ran, so no server is to blame: it stays in rotation
        return KINDS["config"].failure(
            clip(message or "the request could not be prepared"), exclude=False
        )
    for rule in rules:
        if rule.returncode is not None and command.returncode != rule.returncode:
            continue
        line = first_line_matching(_streams(command, rule.stream), rule.pattern)
        if line is not None:
            return Failure(
                rule.kind,
                exclude=rule.exclude,
                notify=rule.notify,
                transient=rule.transient,
                reason=f"site rule: {_quote(line)}",
            )
    if command.launch_error is not None:
        return KINDS["launch"].failure(
            clip(
                f"could not start {command.argv[0] if command.argv else 'command'}: "
                f"{command.launch_error}"
            )
        )
    if command.timed_out:
        said = last_line(command.stdout) or last_line(command.stderr)
        tail = f"; last output: {_quote(said)}" if said else "; no output"
        return KINDS["timeout"].failure(
            clip(f"timed out after {command.duration:.1f} s and was killed{tail}")
        )
    combined = f"{command.stderr}\n{command.stdout}"
    for pattern in BUILTIN_PATTERNS:
        line = _telling_line(combined, pattern.regex)
        if line is not None:
            return KINDS[pattern.kind].failure(f"{pattern.label}: {_quote(line)}")
    if command.returncode == 255:
        said = _first_error_line(command, fallback_first=True)
        return KINDS["usage"].failure(
            f"usage error (exit 255): {_quote(said)}" if said else "usage error (exit 255)"
        )
    if command.returncode == 0:
        said = last_line(command.stdout)
        detail = f"; last line: {_quote(said)}" if said else "; no output"
        return KINDS["bad_output"].failure(f"exit 0 but no {expected} in the output{detail}")
    said = _first_error_line(command)
    head = f"exit code {command.returncode}"
    return KINDS["error"].failure(f"{head}: {_quote(said)}" if said else head)
