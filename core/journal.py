"""A journal of changes to outside state that must be undone (a partition's groups, a user's
block, a controller's debug flags), kept in the state store so that a restart, or another
process on the same store, still undoes them.

The owner of a change writes, in this order: its intent (:meth:`Journal.begin`), for each
target the exact value in force before and the value it sets, *before* setting it
(:meth:`Change.step`), that the step was made, and that every step was made
(:meth:`Change.commit`). Undoing (:meth:`Change.undo`, :meth:`Journal.undo`) walks the steps
back, last first, and puts a target's recorded prior value back only where the value in force
is still the one the change set: a value someone changed since is left alone, or handed to
the kind's :attr:`Restorer.merge`. An undo that fails keeps what is left of the record, so
that :meth:`Journal.undo_pending` (called by a daemon at start and on a timer) runs it again.

Several journals on one store (several daemons, a restarted one) see the same changes: every
record is one key under one prefix, written whole, and whoever undoes a change first takes it
with the store's atomic ``add_if_absent``, so that a change is undone once.

Usage, the owner's side::

    journal = Journal(store, owner="proxyd-pa")
    journal.register("slurm.deny", Restorer(read=allow_groups, write=set_allow_groups))
    change = journal.begin("slurm.deny", {"user": "alice"})
    try:
        for name, before, after in planned:
            change.step(name, before, after, apply=lambda: set_allow_groups(name, after))
    except Exception:
        change.undo()          # what was done, last first
        raise
    change.commit(until=now + 600)
    ...
    journal.undo_pending()     # at start and on a timer: failed undos, abandoned or due changes
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

import msgspec
from loguru import logger

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.documents import decode_json
from gridgate.core.state import StateStore

__all__ = [
    "UNCHANGED",
    "Change",
    "Entry",
    "Journal",
    "Restorer",
    "Step",
    "Undone",
    "decode_entry",
]

#: The record states: being made (steps may follow), made (in force until undone), and an
#: undo that failed half-way (what is left of it is undone again by ``undo_pending``).
MAKING, MADE, FAILED = "making", "made", "failed"
#: Seconds a change being made may go without a write before another journal takes it for
#: abandoned (its owner died between two steps) and undoes it.
DEFAULT_LEASE = 600.0


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


#: What :attr:`Restorer.merge` returns to leave a target as it is.
UNCHANGED: Any = _Unchanged()


@dataclass(frozen=True)
class Step:
    """One target a change set: ``prior`` is the exact value in force before, ``new`` the one
    the change set (both JSON values); ``done`` False means the step was written before its
    change was made and not confirmed after (made or not: the undo compares)."""

    target: str
    prior: Any
    new: Any
    done: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"target": self.target, "prior": self.prior, "new": self.new, "done": self.done}


@dataclass(frozen=True)
class Entry:
    """A change as the journal holds it (decoded from the store by :func:`decode_entry`).

    ``intent`` is what the change is for, as its owner described it (the user denied, until
    when); ``opened`` and ``touched`` are clock times (``touched``: the last write of its
    owner); ``until`` is when a made change is due to be undone (None: when its owner says).
    """

    id: str
    kind: str
    owner: str
    intent: Mapping[str, Any]
    opened: float
    touched: float
    lease: float
    state: str = MAKING
    until: float | None = None
    steps: tuple[Step, ...] = ()
    problem: str = ""

    @property
    def in_force(self) -> bool:
        """Made (every step), or its undo stopped half-way: not being made any more."""
        return self.state != MAKING

    def abandoned(self, now: float) -> bool:
        """Being made, and not written for longer than its lease: its owner is gone."""
        return self.state == MAKING and now > self.touched + self.lease

    def due(self, now: float) -> bool:
        """To be undone now by whoever can: a failed undo, an abandoned change, a made one
        past its ``until``."""
        if self.state == FAILED or self.abandoned(now):
            return True
        return self.state == MADE and self.until is not None and self.until <= now

    def as_json(self) -> dict[str, Any]:
        return {
            "v": 1,
            "kind": self.kind,
            "owner": self.owner,
            "intent": dict(self.intent),
            "opened": self.opened,
            "touched": self.touched,
            "lease": self.lease,
            "state": self.state,
            "until": self.until,
            "steps": [s.as_json() for s in self.steps],
            "problem": self.problem,
        }


#: A finite number (JSON has no NaN; 1e999 would be an infinity).
_Finite = Annotated[float, msgspec.Meta(ge=-1e300, le=1e300)]


class _StepRecord(msgspec.Struct):
    target: Annotated[str, msgspec.Meta(min_length=1)]
    prior: Any
    new: Any
    done: bool


class _Record(msgspec.Struct):
    """A change record as the store holds it (:meth:`Entry.as_json`)."""

    v: Literal[1]
    kind: Annotated[str, msgspec.Meta(min_length=1)]
    intent: dict[str, Any]
    opened: _Finite
    touched: _Finite
    lease: Annotated[float, msgspec.Meta(gt=0, le=1e300)]
    state: Literal["making", "made", "failed"]
    steps: list[_StepRecord]
    owner: str = ""
    until: _Finite | None = None
    problem: str = ""


def decode_entry(id: str, text: str) -> Entry:
    """The change recorded as ``text`` under ``id``.

    :raises DocumentError: not JSON, or not a change record (the message says what is wrong;
        a :class:`ValueError`).
    """
    record: _Record = decode_json(text, _Record, kind="journal record")
    return Entry(
        id=id,
        kind=record.kind,
        owner=record.owner,
        intent=record.intent,
        opened=record.opened,
        touched=record.touched,
        lease=record.lease,
        state=record.state,
        until=record.until,
        steps=tuple(Step(s.target, s.prior, s.new, s.done) for s in record.steps),
        problem=record.problem,
    )


@dataclass(frozen=True)
class Restorer:
    """How the targets of one kind of change are read and set, for its undo.

    :param write: ``write(target, value)`` sets a target; raises when it could not.
    :param read: ``read(target)`` the value in force (raises when it cannot be read); None
        when a target cannot be read: its prior value is then put back unconditionally.
    :param merge: ``merge(step, current, intent)`` for a target whose value changed since the
        change set it (neither its new nor its prior value; ``intent``: the change's): the
        value to set instead, or :data:`UNCHANGED` (the default, with no merge) to leave it
        as it is.
    """

    write: Callable[[str, Any], None]
    read: Callable[[str], Any] | None = None
    merge: Callable[[Step, Any, Mapping[str, Any]], Any] | None = None


@dataclass(frozen=True)
class Undone:
    """What one undo did. ``restored``: the targets set back (by their prior or a merged
    value); ``left``: those changed by someone since and left as they were; ``problem``:
    why the undo stopped (the record is kept, and undone again later); ``elsewhere``: nothing
    was done here, as another journal was undoing it (or, for :meth:`Journal.undo_pending`,
    its owner made it again in force meanwhile)."""

    entry: Entry
    restored: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    problem: str = ""
    elsewhere: bool = False

    @property
    def ok(self) -> bool:
        """The change is undone (by this call, or before it)."""
        return not self.problem and not self.elsewhere


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Journal:
    """The changes recorded under ``prefix`` in ``store``.

    :param store: the state store; one a daemon's peers share lets each undo what another
        began.
    :param clock: its wall time stamps the records and measures leases and ``until``.
    :param prefix: every key of the journal starts with it.
    :param owner: who begins changes here (shown in the records; default host and process).
    """

    def __init__(
        self,
        store: StateStore,
        clock: Clock = SYSTEM_CLOCK,
        prefix: str = "journal:",
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.prefix = prefix
        self.owner = owner or _owner()
        self._restorers: dict[str, Restorer] = {}
        self._told: set[str] = set()

    def _key(self, id: str) -> str:
        return f"{self.prefix}change:{id}"

    def register(self, kind: str, restorer: Restorer) -> None:
        """Say how changes of ``kind`` are undone. Called once, before :meth:`begin` or
        :meth:`undo_pending` meet that kind; a journal leaves the changes of kinds it was
        not told about to the journals that were."""
        self._restorers[kind] = restorer

    def begin(self, kind: str, intent: Mapping[str, Any], lease: float = DEFAULT_LEASE) -> Change:
        """Record the intent of a new change, before any of it is made.

        :param kind: a registered kind (:meth:`register`).
        :param intent: what it is for (JSON values), kept with it for whoever undoes it.
        :param lease: seconds the owner may take between two steps before another journal
            holds the change for abandoned.
        :raises KeyError: ``kind`` is not registered.
        :raises StateError: the store cannot be written (nothing was changed).
        """
        if kind not in self._restorers:
            raise KeyError(f"no restorer registered for changes of kind {kind!r}")
        now = self.clock.time()
        id = f"{int(now * 1e6):017d}-{uuid.uuid4().hex[:12]}"  # keys sort by opening time
        entry = Entry(id, kind, self.owner, dict(intent), now, now, float(lease))
        change = Change(self, entry)
        change.save(entry)
        return change

    def changes(self, kind: str | None = None) -> list[Entry]:
        """Every change recorded (of ``kind``), oldest first. A record that does not decode
        is logged (once) and kept, for a person to look at; it is not in the list."""
        out: list[Entry] = []
        marker = f"{self.prefix}change:"
        for key, text in self.store.items(marker):
            try:
                entry = decode_entry(key[len(marker) :], text)
            except ValueError as exc:
                if key not in self._told:
                    self._told.add(key)
                    logger.error("journal: {} is not a change record, kept: {}", key, exc)
                continue
            if kind is None or entry.kind == kind:
                out.append(entry)
        return out

    def get(self, id: str) -> Entry | None:
        """The change ``id`` as recorded now; None when it is gone (undone) or unreadable."""
        text = self.store.get(self._key(id))
        if text is None:
            return None
        try:
            return decode_entry(id, text)
        except ValueError:
            return None

    def pending(self, kinds: Collection[str] | None = None) -> list[Entry]:
        """The changes of the registered kinds (of ``kinds`` among them) due to be undone now
        (:meth:`Entry.due`), oldest first."""
        now = self.clock.time()
        wanted = set(self._restorers) if kinds is None else set(kinds) & set(self._restorers)
        return [e for e in self.changes() if e.kind in wanted and e.due(now)]

    def undo_pending(self, kinds: Collection[str] | None = None) -> list[Undone]:
        """Undo every :meth:`pending` change (of ``kinds``), the newest first: called by a
        daemon at start and on a timer."""
        return [self._undo(e.id, only_if_due=True) for e in reversed(self.pending(kinds))]

    def undo(self, entry: Entry) -> Undone:
        """Undo ``entry`` now, whatever its state (its owner ends it: ``for`` has passed,
        ``diagnose off``). What :class:`Undone` says: restored, left, or kept for later."""
        return self._undo(entry.id, only_if_due=False, known=entry)

    def _undo(self, id: str, only_if_due: bool, known: Entry | None = None) -> Undone:
        claim = f"{self.prefix}claim:{id}"
        current = known or self.get(id)
        lease = current.lease if current is not None else DEFAULT_LEASE
        if not self.store.add_if_absent(claim, self.owner, ttl=lease):
            return Undone(current or _gone(id), elsewhere=True)
        try:
            entry = self.get(id)  # read again under the claim: another may have undone it
            if entry is None:
                return Undone(current or _gone(id))
            if only_if_due and not entry.due(self.clock.time()):
                return Undone(entry, elsewhere=True)
            return self._walk_back(entry)
        finally:
            self.store.delete(claim)

    def _walk_back(self, entry: Entry) -> Undone:
        restorer = self._restorers.get(entry.kind)
        if restorer is None:
            return Undone(entry, problem=f"no restorer registered for {entry.kind!r}")
        restored: list[str] = []
        left: list[str] = []
        steps = list(entry.steps)
        while steps:
            step = steps[-1]
            try:
                value = _restore_value(restorer, step, entry.intent)
                if value is UNCHANGED:
                    left.append(step.target)
                elif value is not _IN_PLACE:
                    restorer.write(step.target, value)
                    restored.append(step.target)
            except Exception as exc:  # kept: undone again by undo_pending
                problem = f"{step.target}: {exc}"
                kept = replace(entry, state=FAILED, steps=tuple(steps), problem=problem)
                self.store.set(self._key(entry.id), json.dumps(kept.as_json(), sort_keys=True))
                logger.error(
                    "journal: {} {} not undone ({}): kept, tried again later",
                    entry.kind,
                    entry.id,
                    problem,
                )
                return Undone(kept, tuple(restored), tuple(left), problem)
            steps.pop()
        self.store.delete(self._key(entry.id))
        return Undone(entry, tuple(restored), tuple(left))


#: What :func:`_restore_value` returns when the target holds its prior value already.
_IN_PLACE: Any = object()


def _restore_value(restorer: Restorer, step: Step, intent: Mapping[str, Any]) -> Any:
    """The value to set ``step``'s target back to: its prior value where the value in force is
    still the one the change set (or cannot be read), :data:`_IN_PLACE` where the prior value
    is in force already (a step recorded but never made), the merged value or
    :data:`UNCHANGED` where someone changed it since."""
    if restorer.read is None:
        return step.prior
    current = restorer.read(step.target)
    if current == step.prior:
        return _IN_PLACE
    if current == step.new:
        return step.prior
    if restorer.merge is None:
        return UNCHANGED
    merged = restorer.merge(step, current, intent)
    return _IN_PLACE if merged == current else merged


def _gone(id: str) -> Entry:
    return Entry(id, "?", "", {}, 0.0, 0.0, DEFAULT_LEASE)


@dataclass
class Change:
    """A change being made, for its owner: :meth:`step` for each target, then
    :meth:`commit`, or :meth:`undo` when a step failed."""

    journal: Journal
    entry: Entry
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def id(self) -> str:
        return self.entry.id

    def save(self, entry: Entry) -> None:
        entry = replace(entry, touched=self.journal.clock.time())
        self.journal.store.set(
            self.journal._key(entry.id), json.dumps(entry.as_json(), sort_keys=True)
        )
        self.entry = entry

    def step(self, target: str, prior: Any, new: Any, apply: Callable[[], None]) -> None:
        """Set ``target`` from ``prior`` (the exact value in force, as read just before) to
        ``new`` by calling ``apply()``: the step is recorded first, ``apply`` runs, and the
        step is recorded as done.

        :raises Exception: whatever ``apply`` raised (the step stays recorded as not done:
            the undo compares what is in force); :class:`StateError` when the record cannot
            be written (then ``apply`` was not called).
        """
        planned = Step(target, prior, new)
        with self._lock:
            self.save(replace(self.entry, steps=(*self.entry.steps, planned)))
        apply()
        with self._lock:
            steps = (*self.entry.steps[:-1], replace(planned, done=True))
            self.save(replace(self.entry, steps=steps))

    def commit(self, until: float | None = None) -> Entry:
        """Every step is made: the change is in force (until ``until``, a clock time, when
        :meth:`Journal.undo_pending` undoes it; None: until its owner undoes it)."""
        with self._lock:
            self.save(replace(self.entry, state=MADE, until=until))
            return self.entry

    def undo(self) -> Undone:
        """Undo the steps made so far, last first (a step failed, or the change is ended)."""
        return self.journal.undo(self.entry)
