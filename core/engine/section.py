"""The director's own config section (``director:``) and the checks across a file's sections.

Core's config module composes every file's schema from sections it does not know: this one is
found like any other, through the ``gridgate.sections`` entry point ``director``, and its
:meth:`DirectorSection.document_errors` runs the checks that need the whole file (the demand
naming configured backends, list-match only where a backend matches, weights naming real
endpoints; :mod:`.config_checks`, :mod:`.contract`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gridgate.core.config import PathT
from gridgate.core.engine.config_checks import availability_problems, reference_problems
from gridgate.core.engine.contract import list_match_problems
from gridgate.core.engine.limits import PILOTS_SCHEMA, PilotSettings
from gridgate.core.plugins import Plugin
from gridgate.core.settings import Settings, settings_from

DIRECTOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "default": {},
    "description": "The submission director's loop.",
    "properties": {
        "cycle_seconds": {
            "maximum": 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 60,
            "description": "Pause between iterations, in seconds.",
        },
        "max_threads": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1024,
            "default": 8,
            "description": "Submissions run in parallel on this many threads.",
        },
        "command_timeout": {
            "maximum": 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 120,
            "description": "Hard limit in seconds for every backend command.",
        },
        "failing_expiry": {
            "maximum": 365 * 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 3600,
            "description": "Seconds a failing server stays in the failing cache.",
        },
        "ticket_expiry": {
            "maximum": 365 * 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 3600,
            "description": "The tickets cache lives failing_expiry + ticket_expiry.",
        },
        "paused": {
            "type": "boolean",
            "default": False,
            "description": "Submit nothing, on purpose: the director runs, re-reads its "
            "config and asks no demand. Without it a config that would "
            "submit nothing (no demand, no backend) is refused.",
        },
        "keep_accounting": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 10 * 365 * 86400,
            "default": 90 * 86400,
            "description": "Seconds an accounting row (one per submission, what "
            "`gridgate report` reads) is kept; older rows are "
            "pruned, so a Redis store does not grow for ever.",
        },
        "stall_iterations": {
            "type": "integer",
            "minimum": 1,
            "default": 3,
            "description": "Demand asked for pilots and none was submitted "
            "this many iterations in a row: an error saying why "
            "(an alarm once it lasts ticket_expiry).",
        },
        "notify_kinds": {
            "type": "object",
            "description": "Per failure kind, whether people are told (overrides the classifier).",
            "additionalProperties": {"type": "boolean"},
            "default": {},
        },
        "retries_per_pilot": {
            "type": "integer",
            "minimum": 0,
            "maximum": 10,
            "default": 2,
            "description": "A failed submission whose failure is worth retrying "
            "elsewhere is sent to another usable server at most "
            "this many times in the same iteration (0: never).",
        },
        "retry_within_seconds": {
            "maximum": 86400,
            "type": "number",
            "minimum": 0,
            "default": 300,
            "description": "The iteration's deadline for retries: a retry starts "
            "only if its command's deadline falls within this "
            "many seconds of the iteration's start.",
        },
        "max_output_bytes": {
            "type": "integer",
            "minimum": 1024,
            "default": 4 * 1024 * 1024,
            "description": "Per stream; output past it is dropped and flagged.",
        },
        "state_dir": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "./gridgate-state",
            "description": "Where plugins keep files (outbox, spool, work files). Not "
            "written and state.path written: state.path's folder.",
        },
        "demand_lock": {
            "type": "boolean",
            "default": False,
            "description": "Several directors on one shared state store (Redis): the demand "
            "groups are split among the live ones, each group filled by one of them, the "
            "holder of its lease (docs/deploying.md, 'Several directors').",
        },
        "lease_seconds": {
            "maximum": 86400,
            "minimum": 1,
            "type": ["number", "null"],
            "default": None,
            "description": "With demand_lock: how long a director's heartbeat and its groups' "
            "leases last unless renewed (every third of it, by a timer); a group of a director "
            "that died is taken over within two of them (null: cycle_seconds).",
        },
        "fleet": {
            "type": "string",
            "pattern": "^([0-9a-f]{6})?$",
            "default": "",
            "description": "Six hex digits in the names of this director's pilots, the same "
            "for every director of one state store (empty: derived from the state section). "
            "Set it when directors reach one Redis by different addresses (docs/pilots.md).",
        },
        "state_retry_seconds": {
            "maximum": 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 30,
            "description": "While the state store fails, try it again this often.",
        },
        "user": {
            "type": "string",
            "default": "",
            "description": "Name the director gives admission control (default: its uid's).",
        },
        "stop_timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 86400,
            "default": 270,
            "description": "After SIGTERM or SIGINT, seconds gridgate run waits for the "
            "iteration in flight (its commands each end at command_timeout) before it exits "
            "anyway, naming what it was still doing. Keep it below the unit's TimeoutStopSec "
            "(300 s in deploy/systemd).",
        },
        "metrics_port": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": 65535,
            "default": None,
            "description": "Serve Prometheus metrics here.",
        },
        "pilots": PILOTS_SCHEMA,
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class DirectorSettings(Settings):
    """The ``director`` section, typed (:data:`DIRECTOR_SCHEMA`): built once per loaded config
    (:meth:`gridgate.core.engine.runtime.Runtime.settings`) and read by every part of the loop."""

    section_schema: ClassVar[Mapping[str, Any]] = DIRECTOR_SCHEMA

    cycle_seconds: float
    max_threads: int
    command_timeout: float
    failing_expiry: float
    ticket_expiry: float
    paused: bool
    keep_accounting: float
    stall_iterations: int
    notify_kinds: Mapping[str, bool]
    retries_per_pilot: int
    retry_within_seconds: float
    max_output_bytes: int
    state_dir: str
    demand_lock: bool
    lease_seconds: float | None
    fleet: str
    state_retry_seconds: float
    user: str
    stop_timeout: float
    metrics_port: int | None
    pilots: PilotSettings

    @classmethod
    def of_config(cls, config: Mapping[str, Any]) -> DirectorSettings:
        """The settings of ``config``'s ``director`` section (a loaded config: validated)."""
        return settings_from(DIRECTOR_SCHEMA, config["director"], cls, validate=False)


class DirectorSection(Plugin):
    """The ``director`` section: the loop's settings (:data:`DIRECTOR_SCHEMA`), and the file's
    checks across sections."""

    config_schema: ClassVar[dict[str, Any]] = DIRECTOR_SCHEMA
    settings_class: ClassVar[type[Settings] | None] = DirectorSettings

    @classmethod
    def document_errors(
        cls, document: Mapping[str, Any], classes: Mapping[tuple[str, str], type]
    ) -> list[tuple[PathT, str]]:
        return (
            list_match_problems(document, classes)
            + reference_problems(document, classes)
            + availability_problems(document, classes)
        )
