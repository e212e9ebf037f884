"""Built-in demand plugins: a fixed number of pilots per iteration (``static``), or numbers
read each iteration from a file an external system rewrites (``file``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml
from jsonschema import Draft202012Validator
from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.model import DemandRegistry, IterationInfo, SubmitRequest
from gridgate.core.plugins import Plugin

GROUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "group": {
            "type": "string",
            "minLength": 1,
            "description": "Name of the queue or requirements set.",
        },
        "pilots": {"type": "integer", "minimum": 0},
        "requirements": {"type": "string", "default": ""},
        "list_match": {
            "type": ["boolean", "null"],
            "default": None,
            "description": "List-match first (null: the backend's default).",
        },
        "attributes": {"type": "object", "default": {}},
    },
    "required": ["group", "pilots"],
    "additionalProperties": False,
}

#: backend name -> pilots per iteration, or a list of demand groups.
DEMAND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {
        "oneOf": [
            {"type": "integer", "minimum": 0},
            {"type": "array", "items": GROUP_SCHEMA},
        ]
    },
}


def register_demand(spec: Mapping[str, Any], demand: DemandRegistry, user: str = "") -> int:
    """Turn ``{backend: N | [groups]}`` into requests; return the pilots asked for."""
    total = 0
    for backend, value in spec.items():
        groups: list[Mapping[str, Any]] = (
            [{"group": "default", "pilots": value}] if isinstance(value, int) else value
        )
        for group in groups:
            pilots = int(group["pilots"])
            if pilots <= 0:
                continue
            demand.add(
                SubmitRequest(
                    backend=str(backend),
                    group=group["group"],
                    count=pilots,
                    requirements=group.get("requirements", ""),
                    list_match=group.get("list_match"),
                    attributes=group.get("attributes", {}),
                    user=user,
                )
            )
            total += pilots
    return total


class StaticDemand(Plugin):
    """The same pilots every iteration, per backend (and per group): ``{wms_glite: 10}``."""

    config_schema: ClassVar[dict[str, Any]] = DEMAND_SCHEMA

    @hookimpl
    def gridgate_demand(self, iteration: IterationInfo, demand: DemandRegistry) -> None:
        register_demand(self.config, demand)


class FileDemand(Plugin):
    """Pilots read every iteration from a YAML or JSON file with the ``static`` shape.

    A missing or invalid file asks for nothing this iteration and says why in the log, once
    per distinct problem: an external system mid-rewrite must not stop the director.
    """

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "File with {backend: pilots | [groups]}.",
            }
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    _validator = Draft202012Validator(DEMAND_SCHEMA)

    def __init__(self, config: Mapping[str, Any], context: Any) -> None:
        super().__init__(config, context)
        self._last_problem: str | None = None

    def _problem(self, message: str) -> None:
        if message != self._last_problem:
            logger.error(
                "demand file {}: {}; no pilots this iteration", self.config["path"], message
            )
        self._last_problem = message

    @hookimpl
    def gridgate_demand(self, iteration: IterationInfo, demand: DemandRegistry) -> None:
        path = Path(self.config["path"])
        try:
            text = path.read_text(encoding="utf-8")
            spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
            self._problem(f"cannot read: {exc}")
            return
        if path.suffix != ".json" and text.strip() and not text.endswith("\n"):
            # as for the config (core/config.py cut_problem): "pilots: 100" cut after "1" is
            # still valid YAML, so a file without its final newline is taken for cut
            self._problem(
                "the file does not end with a newline: its last line may be cut short "
                "(a file still being written); asked for nothing until it is whole"
            )
            return
        spec = spec or {}
        error = next(iter(self._validator.iter_errors(spec)), None)
        if error is not None:
            where = ".".join(map(str, error.absolute_path)) or "$"
            self._problem(f"{where}: {error.message}")
            return
        self._last_problem = None
        register_demand(spec, demand)
