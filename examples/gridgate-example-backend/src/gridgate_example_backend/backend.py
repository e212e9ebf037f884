"""The ``local`` backend: each submission runs the configured pilot command as a local process
on one of a few named "slots", and reads the job ids the pilot prints (``JOBID <id>``).

It uses only gridgate's public contract: the :class:`~gridgate.core.plugins.Plugin` base class,
the ``@hookimpl`` marker, the values of :mod:`gridgate.core.model` and the deadline-enforcing
runner :func:`gridgate.core.runner.run`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.kinds import failure
from gridgate.core.model import BackendInfo, Endpoint, Failure, SubmitRequest, SubmitResult
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.runner import run

#: Words that may appear in braces inside ``command`` items.
PLACEHOLDERS = ("slot", "group", "count")
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_JOB_ID_PATTERN = r"^JOBID\s+(\S+)\s*$"
#: EX_TEMPFAIL from sysexits.h: "try again later", the polite way to say "this slot is busy".
EX_TEMPFAIL = 75
OPERATION = "Job Submit"


class LocalBackend(Plugin):
    """Runs the pilot command locally, one process per submission, on a chosen slot."""

    name = "local"

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
        for index, item in enumerate(section.get("command") or []):
            for word in _PLACEHOLDER_RE.findall(item):
                if word not in PLACEHOLDERS:
                    problems.append(
                        (
                            ("command", index),
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

    def _mine(self, backend: str) -> bool:
        return backend == self.name

    def argv(self, endpoint: Endpoint, request: SubmitRequest) -> list[str]:
        """The command with its placeholders filled; each value stays one argv item."""
        values = {"slot": endpoint.name, "group": request.group, "count": str(request.count)}
        return [
            _PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), item)
            for item in self.config["command"]
        ]

    def job_ids(self, stdout: str) -> tuple[str, ...]:
        return tuple(match.group(1) for match in self._job_id.finditer(stdout))

    def _env(self, endpoint: Endpoint, request: SubmitRequest) -> dict[str, str]:
        return {
            **os.environ,
            **(self.config.get("env") or {}),
            "GRIDGATE_SLOT": endpoint.name,
            "GRIDGATE_GROUP": request.group,
            "GRIDGATE_PILOTS": str(request.count),
        }

    # --- hooks -----------------------------------------------------------------------------

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        if not self._mine(backend):
            return None
        servers: Sequence[str] = self.config.get("servers") or ["slot1"]
        return BackendInfo(
            backend=self.name,
            endpoints=tuple(Endpoint(self.name, slot) for slot in servers),
            pilots_per_submission=int(self.config.get("pilots_per_submission", 1)),
            command_timeout=self.config.get("command_timeout"),
        )

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if not self._mine(endpoint.backend):
            return None
        limit = float(self.config.get("command_timeout") or timeout)
        argv = self.argv(endpoint, request)
        logger.debug("local: starting {} pilot(s) on {}: {}", request.count, endpoint.name, argv)
        # the site's director.max_output_bytes caps what is kept of each stream
        result = run(
            argv,
            limit,
            env=self._env(endpoint, request),
            cwd=self.config.get("work_dir") or None,
            max_output=self.context.max_output_bytes,
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

    @hookimpl
    def gridgate_classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        if not self._mine(endpoint.backend):
            return None
        command = result.command
        if command is not None and command.returncode in (self.config.get("busy_exit_codes") or ()):
            return failure("busy", f"slot {endpoint.name} busy ({command.describe()})")
        return None  # everything else: the site's rules and the generic kinds decide
