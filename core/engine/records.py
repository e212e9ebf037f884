"""The engine's own records read back from the state store and its state folder, each kind
decoded by one function here (gridgate.core.documents) into a typed value.

A record can be what no director wrote (a hand edit, an older release's value, a value cut
short): it is that record's problem, never the iteration's. :func:`read_record` says it in the log
and reads it as absent (the episode or claim it held starts again); :func:`clock_time` raises
the one :class:`~gridgate.core.documents.DocumentError` (a ``ValueError``) its callers
already take as "no shared view".
"""

from __future__ import annotations

import math
from typing import Annotated, Any, TypeVar

import msgspec
from loguru import logger

from gridgate.core.documents import DocumentError, decode_json

T = TypeVar("T")

#: attempts and pilots of one reason a submission was not made
_Pair = Annotated[
    list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(min_length=2, max_length=2)
]


class DemandSourceEpisode(msgspec.Struct):
    """A demand source's open episode of failing past ``keep_last`` (``demand-source/episode/``)."""

    since: float
    problem: str = ""


class CredentialEpisode(msgspec.Struct):
    """A credential's open episode of being unusable (``credential/episode/``)."""

    since: float
    backends: list[str] = []


class ToldAvailability(msgspec.Struct):
    """What the directors last told of an endpoint's availability (``availability/told/``)."""

    state: str
    since: float = 0.0
    reason: str = ""
    until: float | None = None
    source: str = ""


class StallLast(msgspec.Struct):
    """The last iteration of a stall episode: its number, and why nothing was submitted."""

    number: int
    reasons: dict[str, _Pair]


class StallEpisode(msgspec.Struct):
    """A director's open stall episode (``stall/``)."""

    since: float
    iterations: Annotated[int, msgspec.Meta(ge=0)]
    pilots: Annotated[int, msgspec.Meta(ge=0)]
    reasons: dict[str, _Pair]
    error_sent: bool
    alarm_at: float | None = None
    last: StallLast | None = None


class PendingFile(msgspec.Struct):
    """The pilot tracker's file in the state folder (``pending-pilots.json``): the registry's
    last counts, and the pilots submitted while the store could not take them (each decoded
    on its own: gridgate.core.stores.records.pilot_from_dict)."""

    known: list[tuple[str, str, str, Annotated[int, msgspec.Meta(ge=0)]]] = []
    known_cores: dict[str, Annotated[int, msgspec.Meta(ge=0)]] = {}
    unrecorded: list[Any] = []


class KeptOutputMeta(msgspec.Struct):
    """What ``director.pilots.keep_output`` wrote beside a pilot's kept streams
    (``STATE_DIR/pilot-output/.../meta.json``): whose they are, when they were kept, and per
    stream where the CE had it and whether the copy was cut at the cap."""

    job_id: str
    kept: float
    where: dict[str, str] = {}
    cut: dict[str, bool] = {}


class IntentRecord(msgspec.Struct):
    """A submission's intent, written before it is sent (``<state_dir>/intents/<name>.json``):
    where it goes and what for, who sends it, and why it is not settled yet (``why``: "" while
    its director sends it)."""

    name: str
    backend: str
    endpoint: str
    group: str
    count: Annotated[int, msgspec.Meta(ge=1)]
    cores: Annotated[int, msgspec.Meta(ge=1)]
    started: float
    owner: str
    host: str
    pid: int
    why: str = ""
    url: str = ""


class EpochFile(msgspec.Struct):
    """What a director last knew of its state store's identity (``<state_dir>/store-epoch.json``):
    the epoch the store held, and the endpoints still to be searched for the fleet's pilots since
    the store came back empty."""

    epoch: str
    unsearched: list[str] = []


class PendingRecord(msgspec.Struct):
    """One accounting row a director held in memory when it stopped with its store down."""

    stream: str
    record: dict[str, Any]


class PendingRecords(msgspec.Struct):
    """The rows held in memory at a stop the store did not take
    (``<state_dir>/records-pending.json``), appended at the next start's first success."""

    rows: list[PendingRecord] = []


def read_record(raw: str | bytes | None, type_: type[T], where: str) -> T | None:
    """The record ``raw`` read from ``where`` as a ``type_`` (None when absent); one that is
    no ``type_`` is said in the log and read as absent."""
    if raw is None:
        return None
    try:
        value: T = decode_json(raw, type_, kind=where)
    except DocumentError as exc:
        logger.warning("{}; read as absent", exc)
        return None
    return value


def clock_time(raw: str | None, where: str) -> float | None:
    """A clock time the engine keeps as text (``repr(now)``: a poll claim, a verdict, when
    availability was merged); None when absent.

    :raises DocumentError: not a finite number.
    """
    if raw is None:
        return None
    value: float = decode_json(raw, float, kind=where)
    if not math.isfinite(value):
        raise DocumentError(where, f"{value} is no clock time")
    return value
