"""The ``local`` backend: each submission runs the configured pilot command as a local process
on one of a few named "slots", and reads the job ids the pilot prints (``JOBID <id>``).

Each submission's jobs are named for it (``{name}``, ``$GRIDGATE_JOB_NAME``: see
:func:`gridgate.core.backend.job_name`); with a ``list_command`` that prints the jobs the slot
holds (``<job id> <job name> <state>`` per line), the backend answers
``gridgate_find_pilots``, and the director reconciles a submission whose answer was lost (a
crash, a timeout) by those names: the one hook a backend answers to get it.

It uses only gridgate's public contract: the :class:`~gridgate.core.backend.Backend` base
class (which answers the hooks for this backend's own endpoints only, builds ``BackendInfo``
from the section and runs commands with the call's deadline and the site's output cap) and the
values of :mod:`gridgate.core.model`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, cast

from loguru import logger

from gridgate.core.backend import Backend, found_pilots, job_name
from gridgate.core.kinds import failure
from gridgate.core.model import (
    PILOT_STATES,
    Endpoint,
    Failure,
    FoundPilots,
    JobStatus,
    PilotState,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import PluginContext

#: Words that may appear in braces inside ``command`` items.
PLACEHOLDERS = ("slot", "group", "count", "name")
DEFAULT_JOB_NAME = "gridgate-pilot"
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_JOB_ID_PATTERN = r"^JOBID\s+(\S+)\s*$"
#: EX_TEMPFAIL from sysexits.h: "try again later", the polite way to say "this slot is busy".
EX_TEMPFAIL = 75
OPERATION = "Job Submit"


class LocalBackend(Backend):
    """Runs the pilot command locally, one process per submission, on a chosen slot."""

    name = "local"
    #: the slots are the endpoints
    endpoints_key = "servers"

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "description": "Example third-party backend: runs the pilot command as a local process.",
        "properties": {
            "command": {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "minItems": 1,
                "description": "The pilot command as an argv list (never a shell string); "
                "{slot}, {group} and {count} inside an item are replaced.",
            },
            "servers": {
                "type": "array",
                "minItems": 1,
                "uniqueItems": True,
                "items": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$"},
                "default": ["slot1"],
                "description": "Names of the local slots; each is an endpoint the director "
                "picks from and excludes when it fails.",
            },
            "job_id_pattern": {
                "type": "string",
                "minLength": 1,
                "default": DEFAULT_JOB_ID_PATTERN,
                "description": "Regex with one group, searched in every stdout line; each "
                "match is a job id.",
            },
            "pilots_per_submission": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1000,
                "default": 1,
                "description": "Pilots one command starts ({count} is at most this).",
            },
            "job_name": {
                "type": "string",
                "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$",
                "default": DEFAULT_JOB_NAME,
                "description": "Names the jobs of a submission: this, then the submission's "
                "name ({name} in command items, $GRIDGATE_JOB_NAME).",
            },
            "list_command": {
                "type": ["array", "null"],
                "items": {"type": "string", "minLength": 1},
                "minItems": 1,
                "default": None,
                "description": "Lists the jobs a slot holds, one '<job id> <job name> "
                "<state>' line each ({slot} is replaced); null: jobs are not found by name.",
            },
            "command_timeout": {
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "default": None,
                "description": "Seconds; replaces the director's limit for this backend.",
            },
            "env": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "default": {},
                "description": "Extra environment variables for the command.",
            },
            "work_dir": {
                "type": ["string", "null"],
                "default": None,
                "description": "Working directory of the command (default: the director's).",
            },
            "busy_exit_codes": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": 255},
                "uniqueItems": True,
                "default": [EX_TEMPFAIL],
                "description": "Exit codes meaning 'this slot is busy': the slot is left "
                "alone for a while and nobody is told.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        try:
            pattern = re.compile(section.get("job_id_pattern", DEFAULT_JOB_ID_PATTERN))
        except re.error as exc:
            problems.append((("job_id_pattern",), f"invalid regular expression: {exc}"))
        else:
            if pattern.groups != 1:
                problems.append(
                    (
                        ("job_id_pattern",),
                        f"needs exactly one (group) around the id, has {pattern.groups}",
                    )
                )
        for key, item, index in [
            *(("command", item, i) for i, item in enumerate(section.get("command") or [])),
            *(
                ("list_command", item, i)
                for i, item in enumerate(section.get("list_command") or [])
            ),
        ]:
            for word in _PLACEHOLDER_RE.findall(item):
                if word not in PLACEHOLDERS:
                    problems.append(
                        (
                            (key, index),
                            f"unknown placeholder {{{word}}} "
                            f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})",
                        )
                    )
        return problems

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._job_id = re.compile(
            config.get("job_id_pattern", DEFAULT_JOB_ID_PATTERN), re.MULTILINE
        )

    # --- helpers ---------------------------------------------------------------------------

    def job_name(self, request: SubmitRequest) -> str:
        """The name of ``request``'s jobs: ``job_name``, then the submission's name."""
        return job_name(self.config.get("job_name", DEFAULT_JOB_NAME), request)

    def argv(self, endpoint: Endpoint, request: SubmitRequest) -> list[str]:
        """The command with its placeholders filled; each value stays one argv item."""
        values = {
            "slot": endpoint.name,
            "group": request.group,
            "count": str(request.count),
            "name": self.job_name(request),
        }
        return _filled(self.config["command"], values)

    def job_ids(self, stdout: str) -> tuple[str, ...]:
        return tuple(match.group(1) for match in self._job_id.finditer(stdout))

    def _env(self, endpoint: Endpoint, request: SubmitRequest) -> dict[str, str]:
        """The command's environment: the slot, group and count on top of the section's."""
        return {
            **os.environ,
            **(self.config.get("env") or {}),
            "GRIDGATE_SLOT": endpoint.name,
            "GRIDGATE_GROUP": request.group,
            "GRIDGATE_PILOTS": str(request.count),
            "GRIDGATE_JOB_NAME": self.job_name(request),
        }

    # --- what the director asks (the base class calls these for this backend's own slots) ---

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        argv = self.argv(endpoint, request)
        logger.debug("local: starting {} pilot(s) on {}: {}", request.count, endpoint.name, argv)
        # killed at the deadline (command_timeout replaces the director's when set); the
        # site's director.max_output_bytes caps what is kept of each stream
        result = self.run(
            argv,
            self.deadline(timeout),
            env=self._env(endpoint, request),
            cwd=self.config.get("work_dir") or None,
        )
        if not result.ok:
            # failures are results: the classifier reads the evidence kept in `command`
            return SubmitResult(endpoint, ok=False, command=result, operation=OPERATION)
        ids = self.job_ids(result.stdout)
        if not ids:
            return SubmitResult(
                endpoint,
                ok=False,
                command=result,
                operation=OPERATION,
                message="exit code 0 but no job id line in the output",
            )
        if len(ids) != request.count:
            logger.warning(
                "local: asked {} pilot(s) on {}, the command reported {} job id(s)",
                request.count,
                endpoint.name,
                len(ids),
            )
        return SubmitResult(endpoint, ok=True, job_ids=ids, command=result, operation=OPERATION)

    def find_pilots(
        self, endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
    ) -> FoundPilots | None:
        listing = self.config.get("list_command")
        if not listing:
            return None  # the director gives an unsettled submission up after reconcile_for
        argv = _filled(listing, {"slot": endpoint.name})
        result = self.run(argv, self.deadline(timeout), env={**os.environ, **self._extra_env()})
        if not result.ok or result.stdout_truncated:
            # no answer (a failed, killed or cut listing): nothing is concluded, asked again
            return FoundPilots(endpoint, ok=False, command=result, message=result.describe())
        jobs = []
        for line in result.stdout.splitlines():
            words = line.split()
            if len(words) == 3 and words[2] in PILOT_STATES:
                state = cast(PilotState, words[2])
                jobs.append((words[1], JobStatus(words[0], state, native=words[2])))
        base = self.config.get("job_name", DEFAULT_JOB_NAME)
        return found_pilots(endpoint, base, names, fleet, jobs, result)

    def _extra_env(self) -> dict[str, str]:
        return dict(self.config.get("env") or {})

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        command = result.command
        if command is not None and command.returncode in (self.config.get("busy_exit_codes") or ()):
            return failure("busy", f"slot {endpoint.name} busy ({command.describe()})")
        return None  # everything else: the site's rules and the generic kinds decide


def _filled(items: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """``items`` with their placeholders filled; each value stays one argv item."""
    return [_PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), i) for i in items]
