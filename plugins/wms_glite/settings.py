"""The ``wms_glite`` backend's section: its schema (declared once, defaults there alone) and
the typed settings the backend, the JDL writer and the classifier read."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gridgate.core.backend import command_timeout_schema, env_schema
from gridgate.core.settings import Settings, settings_from

#: A JDL attribute name (``extra_attributes``' keys); used with fullmatch.
ATTRIBUTE_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_STRING_LIST = {"type": "array", "items": {"type": "string"}}
_SCALAR = {"type": ["string", "number", "boolean"]}

RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A site rule: a regex on the command's output decides the failure kind.",
    "properties": {
        "kind": {"type": "string", "minLength": 1, "description": "Failure kind to report."},
        "pattern": {
            "type": "string",
            "minLength": 1,
            "description": "Python regex searched line by line.",
        },
        "stream": {
            "enum": ["stdout", "stderr", "any"],
            "default": "any",
            "description": "Which output the pattern is searched in.",
        },
        "returncode": {
            "type": ["integer", "null"],
            "default": None,
            "description": "Match only this exit code (null: any).",
        },
        "exclude": {
            "type": "boolean",
            "default": True,
            "description": "Take the server out of rotation.",
        },
        "notify": {
            "type": "boolean",
            "default": True,
            "description": "Tell people (error/alarm mails).",
        },
        "transient": {
            "type": "boolean",
            "default": True,
            "description": "A retry on another server is worthwhile.",
        },
    },
    "required": ["kind", "pattern"],
    "additionalProperties": False,
}


GLITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "gLite WMS backend: servers, commands, JDL, list-match and failure rules.",
    "properties": {
        "servers": {
            **_STRING_LIST,
            "default": [],
            "description": "WMS servers: host names (the endpoint becomes "
            "https://HOST:7443/glite_wms_wmproxy_server) or full URLs.",
        },
        "commands": {
            "type": "object",
            "description": "Names (looked up on PATH) or paths of the gLite commands.",
            "properties": {
                "submit": {
                    "type": "string",
                    "x-gridgate-path": "command",
                    "minLength": 1,
                    "default": "glite-wms-job-submit",
                    "description": "The submit command.",
                },
                "list_match": {
                    "type": "string",
                    "x-gridgate-path": "command",
                    "minLength": 1,
                    "default": "glite-wms-job-list-match",
                    "description": "The list-match command.",
                },
                "status": {
                    "type": ["string", "null"],
                    "x-gridgate-path": "command",
                    "minLength": 1,
                    "default": None,
                    "description": "The status command (pilot tracking); null: "
                    "glite-wms-job-status beside the submit "
                    "command when that is a path, else on PATH.",
                },
                "cancel": {
                    "type": ["string", "null"],
                    "x-gridgate-path": "command",
                    "minLength": 1,
                    "default": None,
                    "description": "The cancel command; null: "
                    "glite-wms-job-cancel, found like status.",
                },
                "output": {
                    "type": ["string", "null"],
                    "x-gridgate-path": "command",
                    "minLength": 1,
                    "default": None,
                    "description": "The output command (gridgate pilots output); null: "
                    "glite-wms-job-output, found like status.",
                },
            },
            "default": {},
            "additionalProperties": False,
        },
        "delegation": {
            "type": "string",
            "minLength": 1,
            "default": "auto",
            "description": "'auto' delegates at every call (-a); any other "
            "value is a delegation id passed as -d ID.",
        },
        "config_file": {
            "type": ["string", "null"],
            "x-gridgate-path": True,
            "default": None,
            "description": "Client config file passed as -c FILE.",
        },
        "output_format": {
            "enum": ["text", "nomsg", "json"],
            "default": "text",
            "description": "Submit output to ask for: the default text, "
            "--nomsg (id only) or --json.",
        },
        "env": env_schema(),
        "command_timeout": command_timeout_schema(
            "Seconds; replaces the director's limit for this backend's commands when set."
        ),
        "work_dir": {
            "type": ["string", "null"],
            "x-gridgate-path": True,
            "default": None,
            "description": "Where the private JDL files are written; it must "
            "exist (default: wms_glite-jdl under director."
            "state_dir, created 0700). Files a killed director "
            "left there are removed at start.",
        },
        "pilots_per_jdl": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1000,
            "default": 1,
            "description": "Pilots per submission; > 1 makes a parametric JDL.",
        },
        "list_match": {
            "type": "boolean",
            "default": True,
            "description": "Default for demand groups: list-match before "
            "submitting (off for test jobs).",
        },
        "list_match_cache": {
            "type": "number",
            "minimum": 0,
            "default": 900,
            "description": "Seconds a list-match answer is reused per "
            "(server, requirements); 0 disables.",
        },
        "executable": {
            "type": "string",
            "minLength": 1,
            "default": "pilot.sh",
            "description": "JDL Executable.",
        },
        "arguments": {"type": "string", "default": "", "description": "JDL Arguments."},
        "input_sandbox": {
            **_STRING_LIST,
            "default": [],
            "description": "JDL InputSandbox files.",
        },
        "output_sandbox": {
            **_STRING_LIST,
            "default": ["std.out", "std.err"],
            "description": "JDL OutputSandbox files.",
        },
        "std_output": {"type": "string", "default": "std.out", "description": "JDL StdOutput."},
        "std_error": {"type": "string", "default": "std.err", "description": "JDL StdError."},
        "requirements": {
            "type": "string",
            "default": 'other.GlueCEStateStatus == "Production"',
            "description": "JDL Requirements (a ClassAd expression); a "
            "request's own requirements replace it.",
        },
        "rank": {
            "type": "string",
            "default": "-other.GlueCEStateEstimatedResponseTime",
            "description": "JDL Rank (a ClassAd expression); empty for none.",
        },
        "vo": {
            "type": "string",
            "default": "",
            "description": "JDL VirtualOrganisation; empty for none.",
        },
        "extra_attributes": {
            "type": "object",
            "description": "More JDL attributes: name -> string, number, bool or list. "
            "Those gridgate writes are refused (the pilot's own keys; CpuNumber, "
            "SMPGranularity, HostNumber and WholeNodes come from a demand group's "
            "resources).",
            "propertyNames": {"pattern": f"^{ATTRIBUTE_NAME_RE.pattern}$"},
            "additionalProperties": {"anyOf": [_SCALAR, {"type": "array", "items": _SCALAR}]},
            "default": {},
        },
        "retry_count": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "JDL RetryCount (0: the director retries, not WMS).",
        },
        "shallow_retry_count": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "JDL ShallowRetryCount.",
        },
        "rules": {
            "type": "array",
            "items": RULE_SCHEMA,
            "default": [],
            "description": "Site failure rules, tried before the built-in ones.",
        },
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class GliteRuleSettings(Settings):
    """One site rule (:data:`RULE_SCHEMA`)."""

    section_schema: ClassVar[dict[str, Any]] = RULE_SCHEMA

    kind: str
    pattern: str
    stream: str
    returncode: int | None
    exclude: bool
    notify: bool
    transient: bool

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        """A pattern that is no regular expression."""
        try:
            re.compile(self.pattern)
        except re.error as exc:
            return [(("pattern",), f"invalid regex: {exc}")]
        return []


@dataclass(frozen=True)
class GliteSettings(Settings):
    """The ``wms_glite`` backend's section (:data:`GLITE_SCHEMA`)."""

    section_schema: ClassVar[dict[str, Any]] = GLITE_SCHEMA

    servers: tuple[str, ...]
    commands: Mapping[str, str]
    delegation: str
    config_file: str | None
    output_format: str
    env: Mapping[str, str]
    command_timeout: float | None
    work_dir: str | None
    pilots_per_jdl: int
    list_match: bool
    list_match_cache: float
    executable: str
    arguments: str
    input_sandbox: tuple[str, ...]
    output_sandbox: tuple[str, ...]
    std_output: str
    std_error: str
    requirements: str
    rank: str
    vo: str
    extra_attributes: Mapping[str, Any]
    retry_count: int
    shallow_retry_count: int
    rules: tuple[GliteRuleSettings, ...]


def glite_settings(section: GliteSettings | Mapping[str, Any]) -> GliteSettings:
    """``section`` typed: as given when it is, else with the schema's defaults filled (not
    validated again: the JDL writer checks every value it writes)."""
    if isinstance(section, GliteSettings):
        return section
    return settings_from(GLITE_SCHEMA, section, GliteSettings, validate=False)
