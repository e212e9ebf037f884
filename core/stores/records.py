"""The state drivers' own records read back, decoded at one boundary (gridgate.core.documents):
a pilot (a row of sqlite's ``pilots`` table, a JSON value of Redis's registry, the pending
pilots' file) and a stream record (an accounting row, a failure, an episode).

A store can hold what no director wrote there: an older gridgate's row, a hand edit, a value
cut by a full disk. One such record is that record's problem: :func:`readable` logs it once
per read and skips it, so a read (and the iteration that asked for it) goes on with the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import msgspec
from loguru import logger

from gridgate.core.documents import DocumentError, convert, decode_json
from gridgate.core.state import Pilot, RecordGroup

T = TypeVar("T")
R = TypeVar("R")

PILOT = "stored pilot"
RECORD = "stored record"

#: the columns of a row of sqlite's ``pilots`` table, in their order (``grp`` is ``group``):
#: :class:`Pilot`'s fields, which a pilot is decoded into (its own checks included)
PILOT_COLUMNS = tuple(f.name for f in dataclasses.fields(Pilot))


class StreamRecord(msgspec.Struct):
    """What every record of a stream holds (``StateStore.append_record``): its clock time."""

    time: float


def pilot_from_json(text: str | bytes) -> Pilot:
    """The pilot of a JSON value (Redis's registry).

    :raises DocumentError: not a pilot.
    """
    pilot: Pilot = decode_json(text, Pilot, kind=PILOT)
    return pilot


def pilot_from_row(row: Sequence[Any]) -> Pilot:
    """The pilot of a row of sqlite's ``pilots`` table (its :data:`PILOT_COLUMNS`).

    :raises DocumentError: not a pilot.
    """
    if len(row) != len(PILOT_COLUMNS):
        raise DocumentError(PILOT, f"a row of {len(row)} columns, not {len(PILOT_COLUMNS)}")
    pilot: Pilot = convert(dict(zip(PILOT_COLUMNS, row, strict=True)), Pilot, kind=PILOT)
    return pilot


def pilot_from_dict(data: Any) -> Pilot:
    """The pilot of an object already parsed (a pilot in the pending pilots' file).

    :raises DocumentError: not a pilot.
    """
    pilot: Pilot = convert(data, Pilot, kind=PILOT)
    return pilot


def stream_record(text: str | bytes) -> dict[str, Any]:
    """A stream's record (a JSON object with a numeric ``time``), as the dict it was appended.

    :raises DocumentError: not such an object.
    """
    record: dict[str, Any] = decode_json(text, dict[str, Any], kind=RECORD)
    convert(record, StreamRecord, kind=RECORD)
    return record


def json_value(text: str | None) -> Any:
    """A field's JSON value as a SQL store wrote it from a stored record (None: SQL NULL, the
    record lacks the field)."""
    return None if text is None else decode_json(text, Any, kind=RECORD)


def group_query(source: str, value: str, slot: str, fields: Sequence[str]) -> str:
    """The statement of :meth:`~gridgate.core.state.StateStore.record_groups` in a SQL store:
    the earliest time, the count and each field's JSON text (``value``, its placeholder taking
    the field) of the rows of ``source`` (a stream's rows since a time), grouped by ``slot``
    (a row's slot) and those values, oldest first. Read its rows with :func:`groups_of`."""
    values = "".join(f", {value}" for _ in fields)
    keys = "".join(f", {i + 3}" for i in range(len(fields)))
    return f"SELECT min(time), count(*){values} FROM {source} GROUP BY {slot}{keys} ORDER BY 1"


def groups_of(rows: Iterable[Sequence[Any]], fields: Sequence[str]) -> list[RecordGroup]:
    """The groups of the rows of a :func:`group_query`."""
    return [
        RecordGroup({**dict(zip(fields, map(json_value, rest), strict=True)), "time": first}, n)
        for first, n, *rest in rows
    ]


def readable(raws: Iterable[T], decode: Callable[[T], R], where: str) -> list[R]:
    """Each of ``raws`` decoded, in order; one that does not decode is logged (what and
    why, the first of a read) and left out."""
    out: list[R] = []
    bad: list[DocumentError] = []
    for raw in raws:
        try:
            out.append(decode(raw))
        except DocumentError as exc:
            bad.append(exc)
    if bad:
        logger.error("{}: {} unreadable record(s) skipped; the first: {}", where, len(bad), bad[0])
    return out
