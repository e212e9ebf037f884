"""The boundary of the records ``gridgate report`` reads back from the state store: the
accounting, failures and episodes tables' rows, each decoded by one function into a typed
row. Past these functions the report reads attributes, never a row's keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from gridgate.core.documents import convert


class AccountingRow(msgspec.Struct):
    """One submission attempt (the accounting table): ``outcome`` submitted, failed or
    skipped; ``pilots`` asked for; ``failure_kind`` why it failed or was skipped."""

    time: float
    outcome: str
    endpoint: str | None = None
    pilots: int | None = None
    failure_kind: str | None = None


class FailureRow(msgspec.Struct):
    """A failed status poll or cancel, or an ``aborted`` verdict (the failures table)."""

    time: float
    endpoint: str | None = None
    kind: str | None = None


class EpisodeRow(msgspec.Struct):
    """A change of an endpoint's availability or a credential's usability (the episodes
    table)."""

    time: float = 0.0
    what: str = ""
    subject: str = ""
    state: str = ""
    source: str | None = None
    reason: str | None = None


def accounting_rows(rows: Iterable[Mapping[str, Any]]) -> list[AccountingRow]:
    """The accounting table's rows, typed.

    :raises gridgate.core.documents.DocumentError: a row that is not one.
    """
    return [convert(row, AccountingRow, kind="accounting row") for row in rows]


def failure_rows(rows: Iterable[Mapping[str, Any]]) -> list[FailureRow]:
    """The failures table's rows, typed.

    :raises gridgate.core.documents.DocumentError: a row that is not one.
    """
    return [convert(row, FailureRow, kind="failures row") for row in rows]


def episode_rows(rows: Iterable[Mapping[str, Any]]) -> list[EpisodeRow]:
    """The episodes table's rows, typed.

    :raises gridgate.core.documents.DocumentError: a row that is not one.
    """
    return [convert(row, EpisodeRow, kind="episodes row") for row in rows]
