"""What each endpoint can run, and which pilots fit it.

A site declares the largest pilot each endpoint runs in its backend's section,
``endpoint_resources: {ENDPOINT: {cores, memory_mb, walltime, tags}}`` (the endpoint's name, or
``backend/name`` as ``gridgate servers list`` shows it). A request's
:class:`~gridgate.core.model.Resources` fit an endpoint when each value asked is at most what the
endpoint declares, each tag asked is declared with the same value, and the backend can express
every value asked (:func:`gridgate.core.backend.resource_gaps`; checked for a backend whose
:class:`~gridgate.core.model.BackendInfo` says what it maps, as every
:class:`~gridgate.core.backend.Backend` does). An endpoint that declares
nothing runs whatever its backend can express: a site that never writes ``endpoint_resources``
sees no change. A demand group (or one requirement of a task queue) that fits no endpoint is
skipped with the outcome ``no_fit``, said in the journal once until it fits again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gridgate.core.backend import resource_gaps
from gridgate.core.model import BackendInfo, Endpoint, Resources

__all__ = [
    "ENDPOINT_RESOURCES_SCHEMA",
    "MAX_CORES",
    "MAX_MEMORY_MB",
    "MAX_WALLTIME",
    "Capacity",
    "capacities",
    "capacity_errors",
    "fits",
    "requirement_label",
    "unfit_reason",
]

#: The most cores one pilot may ask for (or an endpoint declare): the largest nodes sold today
#: have a few hundred.
MAX_CORES = 1024
#: The most memory one pilot may ask for, in MB: 16 TB, beyond any node.
MAX_MEMORY_MB = 16 * 1024 * 1024
#: The longest walltime a pilot may ask for: 30 days (a batch system's longest queues allow a
#: week or two; a longer figure is a typo in seconds).
MAX_WALLTIME = 30 * 86400

#: ``endpoint_resources:`` of every backend's section: the largest pilot each endpoint runs.
ENDPOINT_RESOURCES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "default": {},
    "description": "The largest pilot each endpoint runs (its name as in the backend's "
    "servers, or backend/name): cores, memory_mb (the whole pilot), walltime (seconds), and "
    "the tags it offers. A demand group or a task-queue requirement asking more, or a tag it "
    "does not offer, is not sent there. An endpoint left out runs whatever its backend can "
    "express.",
    "propertyNames": {"minLength": 1, "maxLength": 512},
    "additionalProperties": {
        "type": "object",
        "properties": {
            "cores": {"type": "integer", "minimum": 1, "maximum": MAX_CORES},
            "memory_mb": {"type": "integer", "minimum": 1, "maximum": MAX_MEMORY_MB},
            "walltime": {"type": "integer", "minimum": 1, "maximum": MAX_WALLTIME},
            "tags": {
                "type": "object",
                "maxProperties": 32,
                "propertyNames": {"minLength": 1, "maxLength": 64},
                "additionalProperties": {"type": "string", "maxLength": 256},
            },
        },
        "additionalProperties": False,
    },
}


@dataclass(frozen=True)
class Capacity:
    """The largest pilot one endpoint runs: None for a value it does not bound."""

    cores: int | None = None
    memory_mb: int | None = None
    walltime: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)


def capacities(
    section: Mapping[str, Any] | None, endpoints: Sequence[Endpoint]
) -> dict[str, Capacity]:
    """``{Endpoint.key: Capacity}`` for the endpoints a backend's section declares (by key or by
    name; the key wins); the others are left out.

    :param section: the backend's config section (its ``endpoint_resources``).
    :param endpoints: the backend's endpoints (``BackendInfo.endpoints``).
    """
    declared = (section or {}).get("endpoint_resources") or {}
    if not isinstance(declared, Mapping):
        return {}
    out: dict[str, Capacity] = {}
    for endpoint in endpoints:
        entry = declared.get(endpoint.key, declared.get(endpoint.name))
        if isinstance(entry, Mapping):
            out[endpoint.key] = Capacity(
                cores=entry.get("cores"),
                memory_mb=entry.get("memory_mb"),
                walltime=entry.get("walltime"),
                tags=dict(entry.get("tags") or {}),
            )
    return out


def capacity_errors(
    section: Mapping[str, Any] | None, endpoints: Sequence[Endpoint]
) -> list[tuple[str, str]]:
    """What is wrong with a backend's ``endpoint_resources`` for its ``endpoints``: (the name
    given, the problem) for a name none of them has. Empty when all is well.

    :param section: the backend's config section.
    :param endpoints: the backend's endpoints.
    """
    declared = (section or {}).get("endpoint_resources") or {}
    names = {e.name for e in endpoints} | {e.key for e in endpoints}
    known = ", ".join(e.name for e in endpoints) or "none"
    return [
        (name, f"no endpoint is named {name!r} (it has {known})")
        for name in declared
        if name not in names
    ]


def unfit_reason(
    resources: Resources | None, capacity: Capacity | None, info: BackendInfo | None = None
) -> str:
    """Why pilots asking ``resources`` do not fit an endpoint of ``capacity`` (None: it
    declares nothing) of the backend ``info`` describes: ``"cores=8 > 4"``, ``"tags.gpu=a100
    not offered"``, ``"memory_mb=16000 cannot be expressed by the backend"``; "" when they fit.

    :param resources: what each pilot asks (None: nothing, which fits anywhere).
    :param capacity: the endpoint's declared capacity (:func:`capacities`), None when none.
    :param info: the backend, for what it can express (None: not checked).
    """
    if resources is None:
        return ""
    if info is not None and (info.resources or info.resource_tags):
        # a backend that says what it maps (every Backend subclass does): what it cannot say
        # would be refused at submission as a local fault pausing the backend
        gaps = resource_gaps(resources, info.resources, info.resource_tags)
        if gaps:
            return f"{', '.join(gaps)} cannot be expressed by backend {info.backend}"
    if capacity is None:
        return ""
    over = [
        f"{name}={asked} > {limit}"
        for name, asked, limit in (
            ("cores", resources.cores, capacity.cores),
            ("memory_mb", resources.memory_mb, capacity.memory_mb),
            ("walltime", resources.walltime, capacity.walltime),
        )
        if asked is not None and limit is not None and asked > limit
    ]
    over += [
        f"tags.{k}={v} not offered" for k, v in resources.tags.items() if capacity.tags.get(k) != v
    ]
    return ", ".join(over)


def fits(
    resources: Resources | None, capacity: Capacity | None, info: BackendInfo | None = None
) -> bool:
    """Whether pilots asking ``resources`` fit an endpoint of ``capacity``.

    :param resources: what each pilot asks.
    :param capacity: the endpoint's declared capacity, None when none.
    :param info: the backend, for what it can express (None: not checked).
    """
    return not unfit_reason(resources, capacity, info)


def requirement_label(resources: Resources) -> str:
    """A requirement written as a short stable word: ``cores=8,memory_mb=16000,tags.gpu=a100``
    (the values asked, in a fixed order; ``cores=1`` when nothing else is asked). The queue
    demand names a requirement's pilots ``GROUP[LABEL]``.

    :param resources: what the requirement's pilots ask.
    """
    parts = [f"cores={resources.cores}"]
    if resources.memory_mb is not None:
        parts.append(f"memory_mb={resources.memory_mb}")
    if resources.walltime is not None:
        parts.append(f"walltime={resources.walltime}")
    parts += [f"tags.{k}={v}" for k, v in sorted(resources.tags.items())]
    return ",".join(parts)
