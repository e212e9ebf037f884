"""Corners of the backend contract that core enforces, kept apart from the director's loop.

- A demand group may ask ``list_match: true`` only of a backend that list-matches (implements
  ``gridgate_list_match``, or overrides ``Backend.list_match``): in the config file it is a
  config error naming the key; asked at run time (a demand file, a plugin's demand) its
  pilots are skipped with kind ``config`` and the log says why, instead of being submitted
  unmatched.
- A submission reported ``ok`` must carry at least one job id: one per pilot, or one for the
  whole bulk (an array or a collection id). ``ok`` with none is turned into a failure whose
  command evidence the classifiers read (exit 0 without an answer: ``bad_output``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gridgate.core.model import SubmitResult
from gridgate.core.plugins import ConfigPath

PathT = ConfigPath


def list_matches(plugin: object) -> bool:
    """Whether a backend (class or instance) implements ``gridgate_list_match``; a subclass
    of :class:`~gridgate.core.backend.Backend` does when it overrides ``list_match`` (the
    base class answers the hook for every subclass)."""
    from gridgate.core.backend import Backend  # the director imports this module early

    cls = plugin if isinstance(plugin, type) else type(plugin)
    if issubclass(cls, Backend):
        return cls.lists_matches()
    return callable(getattr(plugin, "gridgate_list_match", None))


def no_list_match(backend: str) -> str:
    return (
        f"backend {backend!r} has no list-match (it does not implement gridgate_list_match): "
        "remove list_match or set it to false"
    )


def list_match_problems(
    doc: Mapping[str, Any], classes: Mapping[tuple[str, str], type]
) -> list[tuple[PathT, str]]:
    """``list_match: true`` in the ``static`` demand for a configured backend without list-match."""
    static = ((doc.get("demand") or {}).get("static")) or {}
    problems: list[tuple[PathT, str]] = []
    for backend, groups in static.items() if isinstance(static, Mapping) else ():
        cls = classes.get(("backends", str(backend)))
        if cls is None or list_matches(cls) or not isinstance(groups, list):
            continue
        for index, group in enumerate(groups):
            if isinstance(group, Mapping) and group.get("list_match") is True:
                problems.append(
                    (
                        ("demand", "static", backend, index, "list_match"),
                        no_list_match(str(backend)),
                    )
                )
    return problems


def checked_submit(result: SubmitResult) -> SubmitResult:
    """``result``, or a failure when it says ``ok`` without any job id."""
    if result.ok and not result.job_ids:
        return replace(result, ok=False, message=result.message or "reported ok but gave no job id")
    return result
