"""The xRSL of a pilot, as both interfaces send it: the pilot script, the names of its output
files, the endpoint's queue, the demand group's resources and the section's ``xrsl``."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gridgate.core.model import SubmitRequest
from gridgate.plugins.arc.ces import CE
from gridgate.plugins.arc.parse import GMLOG, STDERR, STDOUT, xrsl
from gridgate.plugins.arc.settings import ArcSettings

__all__ = ["Descriptions", "resource_attributes"]


def resource_attributes(request: SubmitRequest) -> list[tuple[str, Any]]:
    """The xRSL of ``request.resources``: ``count`` and ``countpernode`` (all cores on one
    node, as a pilot runs), ``memory`` in MB **per core** (xRSL's meaning: the whole pilot's
    memory divided by its cores, rounded up) and ``walltime`` in seconds with xRSL's unit
    (``3601 seconds``, exact: no rounding); none for what is not asked."""
    resources = request.resources
    if resources is None:
        return []
    attributes: list[tuple[str, Any]] = []
    if resources.cores != 1:
        attributes += [("count", str(resources.cores)), ("countpernode", str(resources.cores))]
    if resources.memory_mb is not None:
        attributes.append(("memory", str(math.ceil(resources.memory_mb / resources.cores))))
    if resources.walltime is not None:
        attributes.append(("walltime", f"{resources.walltime} seconds"))
    return attributes


class Descriptions:
    """Writes pilots' job descriptions.

    :param settings: the section (``script``, ``job_name``, ``xrsl``).
    :param config_path: the config file (a relative ``script`` is its folder's), or None.
    """

    def __init__(self, settings: ArcSettings, config_path: str | os.PathLike[str] | None) -> None:
        self.settings = settings
        self.config_path = config_path

    def script_path(self) -> Path:
        """The pilot script's absolute path (a relative ``script`` is the config file's
        folder's)."""
        script = Path(self.settings.script)
        if not script.is_absolute() and self.config_path is not None:
            script = Path(self.config_path).parent / script
        # absolute: arcsub runs in the endpoint's folder, where a relative path means nothing
        return Path(os.path.abspath(script))

    def description(
        self,
        ce: CE,
        request: SubmitRequest,
        *,
        name: str = "",
        delegation: str = "",
        uploads: Sequence[str] = (),
        environment: Sequence[tuple[str, str]] = (),
    ) -> str:
        """The xRSL of one pilot: for arcsub, which uploads the script from its path; with a
        ``name`` (REST), for a job whose script is uploaded into its session afterwards,
        named ``name``, naming the ``delegation``, and whose output files are declared (A-REX
        keeps only declared outputs: arcsub declares them itself).

        :param uploads: more files (REST) uploaded into the session with the script (the
            payload's token): declared as inputs, so the job waits for them too.
        :param environment: (variable, value) pairs the job's environment gets, after any the
            section's ``xrsl`` gives."""
        script = self.script_path()
        site = {str(k): v for k, v in self.settings.xrsl.items()}
        attributes: list[tuple[str, Any]] = [("executable", script.name)]
        if name:
            outputs: list[list[Any]] = [[STDOUT, ""], [STDERR, ""], [f"{GMLOG}/", ""]]
            for key in [k for k in site if k.lower().replace("_", "") == "outputfiles"]:
                value = site.pop(key)
                outputs.insert(0, list(value) if isinstance(value, list) else [value, ""])
            inputs = [[script.name, ""], *([u, ""] for u in uploads)]
            attributes += [("inputfiles", inputs), ("outputfiles", outputs)]
        else:
            attributes.append(("inputfiles", [[script.name, str(script)]]))
        attributes += [
            ("jobname", name or self.settings.job_name),
            ("stdout", STDOUT),
            ("stderr", STDERR),
            ("gmlog", GMLOG),
        ]
        if ce.queue:
            attributes.append(("queue", ce.queue))
        attributes += resource_attributes(request)
        if environment:
            pairs: list[list[Any]] = []
            for key in [k for k in site if k.lower() == "environment"]:
                value = site.pop(key)
                pairs += _pairs(value)
            attributes.append(("environment", [*pairs, *([k, v] for k, v in environment)]))
        attributes += list(site.items())
        if delegation:
            attributes.append(("delegationid", delegation))
        return xrsl(attributes)


def _pairs(value: Any) -> list[list[Any]]:
    """The (variable, value) pairs of a section's ``environment``: one pair as a list of two
    strings, or a list of such pairs."""
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return [list(v) for v in value]
    return [list(value)] if isinstance(value, list) else [[value]]
