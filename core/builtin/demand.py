"""Built-in demand plugins: a fixed number of pilots per iteration (``static``), numbers read
each iteration from a file an external system rewrites (``file``), or pilots for the jobs
waiting in a task queue (``queue``), less the pilots already waiting for them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from jsonschema import Draft202012Validator
from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.builtin.documents import RequirementCount, demand_file, demand_groups
from gridgate.core.builtin.waiting import (
    GROUP_PROPERTIES,
    SourceSettings,
    WaitingGauges,
    pilots_for,
)
from gridgate.core.credential_names import credential_reference_schema
from gridgate.core.files import read_regular
from gridgate.core.fitting import MAX_CORES, MAX_MEMORY_MB, MAX_WALLTIME, requirement_label
from gridgate.core.model import (
    DemandFigure,
    DemandRegistry,
    IterationInfo,
    Resources,
    SubmitRequest,
)
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.settings import Settings
from gridgate.core.state import StateError

#: ``resources:`` of a demand group: what each of its pilots asks of its slot
#: (:class:`gridgate.core.model.Resources`).
RESOURCES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "default": {},
    "description": "What each pilot of the group asks of its slot; a backend that cannot "
    "express a value refuses it.",
    "properties": {
        "cores": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_CORES,
            "default": 1,
            "description": "CPUs of one pilot.",
        },
        "memory_mb": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_MEMORY_MB,
            "description": "Memory of the whole pilot in MB (not per core); unset: the batch "
            "system's default.",
        },
        "walltime": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_WALLTIME,
            "description": "The pilot's time limit in seconds (at most 30 days); unset: the "
            "batch system's default.",
        },
        "tags": {
            "type": "object",
            "maxProperties": 32,
            "propertyNames": {"minLength": 1, "maxLength": 64},
            "additionalProperties": {"type": "string", "maxLength": 256},
            "description": "Free-form words a backend may map (a node feature, a GPU type).",
        },
    },
    "additionalProperties": False,
}

#: a demand group's ``credential``: the nearest level, so it wins over the endpoint's and the
#: backend's (several VOs on one CE: one group per VO, each with its credential)
GROUP_CREDENTIAL = credential_reference_schema(
    "The credential this group's pilots are submitted with (a key of `credentials`); "
    "unset: the endpoint's, else the backend's, else the first of the kind the backend needs."
)

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
        "resources": RESOURCES_SCHEMA,
        "credential": GROUP_CREDENTIAL,
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
    """Turn ``{backend: N | [groups]}`` into requests; return the pilots asked for.

    :raises gridgate.core.documents.DocumentError: ``spec`` is not of that shape.
    """
    total = 0
    for backend, groups in demand_groups(spec).items():
        for group in groups:
            if group.pilots <= 0:
                continue
            demand.add(
                SubmitRequest(
                    backend=backend,
                    group=group.group,
                    count=group.pilots,
                    requirements=group.requirements,
                    list_match=group.list_match,
                    attributes=group.attributes,
                    user=user,
                    resources=None if group.resources is None else group.resources.resources(),
                    credential=group.credential,
                )
            )
            total += group.pilots
    return total


class StaticDemand(Plugin):
    """The same pilots every iteration, per backend (and per group): ``{wms_glite: 10}``."""

    config_schema: ClassVar[dict[str, Any]] = DEMAND_SCHEMA

    @hookimpl
    def gridgate_demand(self, iteration: IterationInfo, demand: DemandRegistry) -> None:
        register_demand(self.config, demand)


#: A demand file larger than this is refused (it names a few numbers).
DEMAND_FILE_BYTES = 1024 * 1024


FILE_DEMAND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "minLength": 1,
            "x-gridgate-path": True,
            "description": "File with {backend: pilots | [groups]}.",
        }
    },
    "required": ["path"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class FileDemandSettings(Settings):
    """The ``file`` demand's section."""

    section_schema: ClassVar[dict[str, Any]] = FILE_DEMAND_SCHEMA

    path: str


class FileDemand(Plugin):
    """Pilots read every iteration from a YAML or JSON file with the ``static`` shape.

    A missing or invalid file asks for nothing this iteration and says why in the log, once
    per distinct problem: an external system mid-rewrite must not stop the director.
    """

    config_schema: ClassVar[dict[str, Any]] = FILE_DEMAND_SCHEMA
    settings_class = FileDemandSettings
    settings: FileDemandSettings

    _validator = Draft202012Validator(DEMAND_SCHEMA)

    def __init__(self, config: Mapping[str, Any], context: Any) -> None:
        super().__init__(config, context)
        self._last_problem: str | None = None

    def _problem(self, message: str) -> None:
        if message != self._last_problem:
            logger.error(
                "demand file {}: {}; no pilots this iteration", self.settings.path, message
            )
        self._last_problem = message

    @hookimpl
    def gridgate_demand(self, iteration: IterationInfo, demand: DemandRegistry) -> None:
        path = Path(self.settings.path)
        try:
            # a FIFO or a device put in its place would hang or flood the director
            text = read_regular(path, max_bytes=DEMAND_FILE_BYTES).decode("utf-8")
            spec = demand_file(text, json_file=path.suffix == ".json")
        except Exception as exc:  # whatever the file holds costs this source, not the iteration
            self._problem(f"cannot read: {type(exc).__name__}: {exc}")
            return
        if path.suffix != ".json" and text.strip() and not text.endswith("\n"):
            # as for the config (core/config.py cut_problem): "pilots: 100" cut after "1" is
            # still valid YAML, so a file without its final newline is taken for cut
            self._problem(
                "the file does not end with a newline: its last line may be cut short "
                "(a file still being written); asked for nothing until it is whole"
            )
            return
        error = next(iter(self._validator.iter_errors(spec)), None)
        if error is not None:
            where = ".".join(map(str, error.absolute_path)) or "$"
            self._problem(f"{where}: {error.message}")
            return
        self._last_problem = None
        register_demand(spec, demand)


# --- demand from waiting work ---------------------------------------------------------------

QUEUE_GROUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "backend": {
            "type": "string",
            "minLength": 1,
            "description": "The backend (entry-point name) the group's pilots go to.",
        },
        **GROUP_PROPERTIES,
        "resources": RESOURCES_SCHEMA,
        "max_per_iteration": {
            "type": "integer",
            "minimum": 0,
            "maximum": 1_000_000,
            "description": "At most this many pilots of the group per iteration (unset: as "
            "many as the waiting work asks, within the limits).",
        },
        "requirements": {"type": "string", "default": ""},
        "list_match": {
            "type": ["boolean", "null"],
            "default": None,
            "description": "List-match first (null: the backend's default).",
        },
        "attributes": {"type": "object", "default": {}},
        "credential": GROUP_CREDENTIAL,
    },
    "required": ["backend", "source"],
    "additionalProperties": False,
}

QUEUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "groups": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"minLength": 1, "maxLength": 200},
            "additionalProperties": QUEUE_GROUP_SCHEMA,
            "description": "Demand groups by name: each sized from its source of waiting work.",
        }
    },
    "required": ["groups"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class ResourcesSettings(Settings):
    """``resources:`` of a demand group (:data:`RESOURCES_SCHEMA`)."""

    section_schema: ClassVar[dict[str, Any]] = RESOURCES_SCHEMA

    cores: int
    memory_mb: int | None
    walltime: int | None
    tags: Mapping[str, str] | None

    def resources(self) -> Resources:
        """What each pilot of the group asks of its slot."""
        return Resources(
            cores=self.cores,
            memory_mb=self.memory_mb,
            walltime=self.walltime,
            **({} if self.tags is None else {"tags": dict(self.tags)}),
        )


@dataclass(frozen=True)
class QueueGroupSettings(Settings):
    """One group of the ``queue`` demand (:data:`QUEUE_GROUP_SCHEMA`)."""

    section_schema: ClassVar[dict[str, Any]] = QUEUE_GROUP_SCHEMA

    backend: str
    source: SourceSettings
    jobs_per_pilot: int
    keep_last: float
    resources: ResourcesSettings
    max_per_iteration: int | None
    requirements: str
    list_match: bool | None
    attributes: Mapping[str, Any]
    credential: str | None


@dataclass(frozen=True)
class QueueSettings(Settings):
    """The ``queue`` demand's section (:data:`QUEUE_SCHEMA`)."""

    section_schema: ClassVar[dict[str, Any]] = QUEUE_SCHEMA

    groups: Mapping[str, QueueGroupSettings]


@dataclass(frozen=True)
class GroupDemand:
    """What the queue demand decided for one group in one iteration: ``jobs`` the figure it
    sized with (see :class:`gridgate.core.builtin.waiting.WaitingFigure`), ``waiting_pilots`` the
    group's pilots already waiting, ``pilots`` what it asked for (before the limits)."""

    group: str
    backend: str
    jobs: int
    fresh: bool
    waiting_pilots: int
    pilots: int


class QueueDemand(Plugin):
    """Pilots for the jobs waiting in a task queue, per demand group: each iteration,
    ``ceil(waiting jobs / jobs_per_pilot)`` less the group's pilots already ``waiting`` in the
    pilot registry, at most ``max_per_iteration``, then trimmed by the limits as any demand.

    A source that fails keeps its group's last good figure for ``keep_last`` seconds, then
    asks for nothing (gridgate.core.builtin.waiting). A registry that cannot be read asks for nothing
    for any group, with one error per episode: without the waiting pilots the figure would
    only grow. Needs the pilots tracked (``director.pilots.track``), a config error otherwise.
    """

    config_schema: ClassVar[dict[str, Any]] = QUEUE_SCHEMA
    settings_class = QueueSettings
    settings: QueueSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        groups = self.settings.groups
        self._groups = groups
        self._gauges = WaitingGauges(
            {name: spec.source for name, spec in groups.items()},
            keep_last={name: spec.keep_last for name, spec in groups.items()},
            clock=context.clock,
        )
        self._resources = {name: spec.resources.resources() for name, spec in groups.items()}
        self._registry_failing = False
        #: the last iteration's decision per group (for the summary's readers and the tests)
        self.last: dict[str, GroupDemand] = {}

    def _waiting_pilots(self) -> dict[tuple[str, str], int] | None:
        state = self.context.state
        try:
            if state is None:
                raise StateError("no state store")
            if getattr(state, "degraded", False):
                raise StateError("the state store is unavailable")
            by_group: dict[tuple[str, str], int] = {}
            for (backend, _endpoint, group), (n, _cores) in (
                state.pilot_registry().waiting().items()
            ):
                by_group[(backend, group)] = by_group.get((backend, group), 0) + n
        except StateError as exc:
            if not self._registry_failing:
                logger.error(
                    "queue demand: cannot count the pilots already waiting ({}); asking for no "
                    "pilots until the pilot registry answers",
                    exc,
                )
            self._registry_failing = True
            return None
        if self._registry_failing:
            # the store's own line says it answers again (core/engine/resilient.py)
            logger.debug("queue demand: the pilot registry answers again")
        self._registry_failing = False
        return by_group

    @hookimpl
    def gridgate_demand(self, iteration: IterationInfo, demand: DemandRegistry) -> None:
        figures = self._gauges.waiting_all()  # every source read, so each keeps its figure
        waiting = self._waiting_pilots()
        if waiting is None:
            self.last = {}
            return
        decided: dict[str, GroupDemand] = {}
        for name, spec in self._groups.items():
            figure = figures[name]
            backend = spec.backend
            already = waiting.get((backend, name), 0)
            pilots = pilots_for(figure.jobs, spec.jobs_per_pilot, already, spec.max_per_iteration)
            decided[name] = GroupDemand(name, backend, figure.jobs, figure.fresh, already, pilots)
            demand.figure(
                DemandFigure(
                    backend,
                    name,
                    jobs=figure.jobs,
                    fresh=figure.fresh,
                    source="queue",
                    problem=figure.problem or "",
                    failing_for=figure.failing_for,
                    stale=figure.stale,
                )
            )
            if figure.by_requirement is not None:
                # the figure per requirement: each its own group of pilots, asking what its
                # jobs need, sent only where that fits (core/fitting.py)
                decided[name] = self._per_requirement(
                    demand, name, spec, figure.by_requirement, waiting, figure.fresh
                )
                continue
            if pilots > 0:
                demand.add(self._request(spec, name, pilots, self._resources[name]))
        self.last = decided
        logger.debug(
            "queue demand: {}",
            ", ".join(
                f"{d.group} {d.jobs} jobs{'' if d.fresh else ' (held)'} - {d.waiting_pilots} "
                f"waiting -> {d.pilots}"
                for d in decided.values()
            ),
        )

    def _request(
        self,
        spec: QueueGroupSettings,
        group: str,
        pilots: int,
        resources: Resources | None,
    ) -> SubmitRequest:
        return SubmitRequest(
            backend=spec.backend,
            group=group,
            count=pilots,
            requirements=spec.requirements,
            list_match=spec.list_match,
            attributes=dict(spec.attributes),
            resources=resources,
            credential=spec.credential or "",
        )

    def _per_requirement(
        self,
        demand: DemandRegistry,
        name: str,
        spec: QueueGroupSettings,
        counts: tuple[RequirementCount, ...],
        waiting: Mapping[tuple[str, str], int],
        fresh: bool,
    ) -> GroupDemand:
        """One request per requirement of a group whose source counts per requirement: the
        group ``NAME[LABEL]`` (its waiting pilots counted apart), asking the requirement's
        values over the group's ``resources``; ``max_per_iteration`` shared among them in the
        order the source gave."""
        base = self._resources[name]
        left = spec.max_per_iteration
        total = already_all = asked = 0
        for requirement in counts:
            resources = _over(base, requirement)
            group = f"{name}[{requirement_label(resources)}]"
            already = waiting.get((spec.backend, group), 0)
            pilots = pilots_for(requirement.count, spec.jobs_per_pilot, already, left)
            total, already_all, asked = (
                total + requirement.count,
                already_all + already,
                asked + pilots,
            )
            if left is not None:
                left -= pilots
            if pilots > 0:
                demand.add(self._request(spec, group, pilots, resources))
        return GroupDemand(name, spec.backend, total, fresh, already_all, asked)

    def close(self) -> None:
        self._gauges.close()


def _over(base: Resources, requirement: RequirementCount) -> Resources:
    """A requirement's values over a group's ``resources``: what the requirement leaves unset
    (memory, walltime, a tag) the group's value fills."""
    return Resources(
        cores=requirement.cores,
        memory_mb=base.memory_mb if requirement.memory_mb is None else requirement.memory_mb,
        walltime=base.walltime if requirement.walltime is None else requirement.walltime,
        tags={**base.tags, **requirement.tags},
    )
