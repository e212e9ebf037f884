"""The built-in ``rules`` classifier: the site's rules from config, then the generic kinds
(launch, timeout, missing input, bad output, error), so that every failure gets a kind."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gridgate.core import hookimpl
from gridgate.core.defaults import local_io_failure
from gridgate.core.kinds import KINDS, missing_input
from gridgate.core.model import (
    CommandResult,
    Endpoint,
    Failure,
    SubmitResult,
)
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.settings import Settings

RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
        "pattern": {"type": "string", "description": "Regular expression searched in the output."},
        "stream": {"enum": ["stdout", "stderr", "any"], "default": "any"},
        "returncode": {"type": "integer"},
        "backend": {"type": "string", "description": "Only for this backend (default: all)."},
        "exclude": {"type": "boolean", "default": True},
        "notify": {"type": "boolean", "default": True},
        "transient": {"type": "boolean", "default": True},
    },
    "required": ["kind"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class RuleSettings(Settings):
    """One site rule (:data:`RULE_SCHEMA`; defaults from there)."""

    section_schema: ClassVar[dict[str, Any]] = RULE_SCHEMA

    kind: str
    pattern: str | None
    stream: str
    returncode: int | None
    backend: str | None
    exclude: bool
    notify: bool
    transient: bool

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        """A pattern that is no regular expression; a ``stream`` with no pattern to search in
        it."""
        if self.pattern is None:
            if self.stream != "any":
                return [(("stream",), "stream is set but pattern is not: no stream is searched")]
            return []
        try:
            re.compile(self.pattern)
        except re.error as exc:
            return [(("pattern",), f"invalid regular expression: {exc}")]
        return []


@dataclass(frozen=True)
class RulesSettings(Settings):
    """The ``rules`` classifier's section."""

    section_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "rules": {
                "type": "array",
                "items": RULE_SCHEMA,
                "default": [],
                "description": "Checked in order; the first match gives the kind.",
            },
        },
        "additionalProperties": False,
    }

    rules: tuple[RuleSettings, ...]


def compile_rules(
    rules: Sequence[RuleSettings | Mapping[str, Any]],
) -> list[tuple[re.Pattern[str] | None, RuleSettings]]:
    """Each rule with its pattern compiled (None: a rule without one); a rule may be given as
    written (a mapping of :data:`RULE_SCHEMA`'s keys)."""
    typed = [r if isinstance(r, RuleSettings) else RuleSettings.of(r) for r in rules]
    return [(re.compile(r.pattern, re.MULTILINE) if r.pattern else None, r) for r in typed]


def match_rules(
    compiled: Sequence[tuple[re.Pattern[str] | None, RuleSettings]], result: SubmitResult
) -> Failure | None:
    """The first site rule that matches ``result``'s command evidence, as a Failure."""
    command = result.command
    for pattern, rule in compiled:
        if rule.backend and rule.backend != result.endpoint.backend:
            continue
        if rule.returncode is not None and (
            command is None or command.returncode != rule.returncode
        ):
            continue
        if pattern is not None:
            stream = rule.stream
            texts = []
            if command is not None:
                if stream in ("stdout", "any"):
                    texts.append(command.stdout)
                if stream in ("stderr", "any"):
                    texts.append(command.stderr)
            found = next((m for t in texts if (m := pattern.search(t))), None)
            if found is None:
                continue
            reason = found.group(0).strip()[:200]
        else:
            reason = f"matched site rule {rule.kind!r}"
        return Failure(
            kind=rule.kind,
            exclude=rule.exclude,
            notify=rule.notify,
            transient=rule.transient,
            reason=reason,
        )
    return None


def missing_input_in(command: CommandResult) -> str:
    """Why a failed ``command`` failed for want of an input file of this machine, or ``""``.

    The evidence: an absolute path in its argv (whole, or after ``--option=``) that its output
    names, and that is not a file this process can read (``kinds.missing_input``). So
    ``qsub /srv/pilot.sh`` printing ``error opening /srv/pilot.sh: No such file or directory``
    is the pilot's missing script, not a failing server, whichever batch system printed it; a
    path merely in the argv (an output file yet to be written) is not."""
    if command.launch_error is not None or command.timed_out or command.returncode == 0:
        return ""
    output = f"{command.stdout}\n{command.stderr}"
    for item in command.argv[1:]:
        path = item.split("=", 1)[1] if item.startswith("-") and "=" in item else item
        if not path.startswith("/") or path not in output:
            continue
        why = missing_input({"the input file": path})
        if why:
            said = next(line.strip() for line in output.splitlines() if path in line)
            return f"{why}; {command.argv[0]} said: {said[:200]}"
    return ""


def generic_failure(result: SubmitResult) -> Failure:
    """What any failed command is when nothing more specific is known."""
    command = result.command
    if result.local_fault:
        return local_io_failure(result.local_fault)
    if command is None:
        return KINDS["error"].failure(result.message or "backend gave no command evidence")
    if command.launch_error is not None:
        return KINDS["launch"].failure(command.launch_error)
    if command.timed_out:
        return KINDS["timeout"].failure(command.describe())
    missing = missing_input_in(command)
    if missing:
        return KINDS["missing_input"].failure(missing)
    if command.returncode == 0:
        return KINDS["bad_output"].failure(result.message or "exit code 0 but no usable answer")
    last = next(
        (
            line.strip()
            for line in reversed((command.stderr or command.stdout).splitlines())
            if line.strip()
        ),
        "",
    )
    return KINDS["error"].failure(f"{command.describe()}: {last}"[:300])


class RuleClassifier(Plugin):
    """Site rules from config, then the generic kinds (launch, timeout, bad_output, error).

    Answers last: a backend that knows its tool's messages classifies first; this catches
    everything else so that every failure gets a kind.
    """

    config_schema: ClassVar[dict[str, Any]] = dict(RulesSettings.section_schema)
    settings_class = RulesSettings
    settings: RulesSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._rules = compile_rules(self.settings.rules)

    @hookimpl(trylast=True)
    def gridgate_classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure:
        return match_rules(self._rules, result) or generic_failure(result)
