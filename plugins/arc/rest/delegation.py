"""The life of a delegation: one per CE and credential, shared by every pilot sent there.

A delegation is the CE's copy of the client's proxy (``shared/reference/arc.md``, REST
interface): the CE makes a key and a request, the client signs it (:mod:`.signing`), and every
job that names the delegation's id in its description gets that proxy. arcsub makes a new one
per job (an RSA key made on the CE: 0.3-1.7 s); the REST path makes one per CE and proxy
identity and keeps it:

- its record (id, the CE, the identity, the proxy it was signed with, its end, its last use)
  is kept in the state store (``context.state``) under ``arc/delegation/``, so several
  directors on one Redis share one delegation per CE;
- it is kept per CE and **credential**: the DN and what the proxy carries beyond it (VOMS
  attributes, a restriction: :attr:`.signing.Proxy.credential`), so a proxy of another role
  never stands in for one of this role; and per **owner**, the identity it was made under on
  the CE when that is not the proxy's own: a payload proxy delegated under ``auth: token``
  belongs there to the token's ``ISS/SUB``, and A-REX gives a delegation to its owner only
  (another token's jobs naming it run without a proxy, trap 8), so two VOs delegating one
  payload proxy to one CE each make and keep their own;
- it is **renewed** when the proxy at hand is another one, newer than the one it holds
  (:meth:`.signing.Proxy.newer`: made later, or at the same time and ending later; a proxy
  replaced by one with a new key that ends sooner reaches the CE at once, and a director still
  holding the older proxy never signs it back in). Every renewal of the proxy is one (the
  managed proxy is renewed ``min_lifetime`` before its end), and the next poll or submission
  renews the delegation, so pilots already running get the new proxy: A-REX rewrites their
  proxy files on the PUT;
- before pilots are sent with it, once per iteration, the CE is asked whether it still has it
  (``action=get``): renewal does not tell (A-REX renews an unknown id as if it knew it, trap 9),
  and a job naming a delegation the CE does not have is still accepted and runs without a
  proxy (trap 8). A lost one is made again under the **same id** (a renewal: the pilots
  already naming it get the proxy back), or under a new one if that fails;
- one that no configured endpoint uses is **deleted** on the CE once nobody has used it for
  :data:`UNUSED_GRACE` seconds (another director on the same store may still use it).

Making one is a change to the CE that must be undone, so it goes through the journal
(:mod:`gridgate.core.journal`, in the same store): the intent (the CE, the identity) is written
before ``action=new``, the step (the delegation, absent before) before its signed proxy is put,
and the change is committed once it is; a failed PUT undoes it at once (the half-made
delegation is deleted), and one whose director died half-way is undone by the next sweep of a
director with the same identity once its lease has passed. Deleting an unused one is that
change's undo.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from loguru import logger
from msgspec.structs import replace

from gridgate.core.backend import Deadline
from gridgate.core.clock import Clock
from gridgate.core.documents import DocumentError
from gridgate.core.journal import Change, Journal, Restorer
from gridgate.core.model import CommandResult
from gridgate.core.state import StateError, StateStore, open_state
from gridgate.plugins.arc.documents import DelegationRecord as Record
from gridgate.plugins.arc.documents import delegation_record
from gridgate.plugins.arc.rest.client import ArexClient, ArexError
from gridgate.plugins.arc.rest.signing import (
    CsrError,
    Proxy,
    identity_key,
    load_arc_csr,
    sign_request,
)

__all__ = [
    "KIND",
    "PREFIX",
    "UNUSED_GRACE",
    "Delegations",
    "Record",
    "kind_of",
    "owned",
    "target_of",
]

#: State-store prefix of the records.
PREFIX = "arc/delegation/"
#: Seconds a delegation no endpoint here uses is kept (for other directors) before deletion.
UNUSED_GRACE = 3600.0
#: Seconds one director holds the right to create a CE's delegation (others wait for it).
CREATE_LOCK = 60.0
#: Seconds a director waits for another one's creation before making its own.
CREATE_WAIT = 15.0
#: The journal's kind of a delegation made on a CE (one kind per identity: :func:`kind_of`).
KIND = "arc.delegation"
#: Seconds an undo's delete of a delegation may take when no hook call's deadline applies.
UNDO_TIMEOUT = 30.0


def kind_of(identity: str, owner: str = "") -> str:
    """The journal's kind of the delegations of ``identity`` made by ``owner`` (see
    :class:`Delegations`): a director undoes only those its own credential can delete."""
    who = f"{identity}\nowner {owner}" if owner else identity
    return f"{KIND}:{hashlib.sha256(who.encode()).hexdigest()[:16]}"


def owned(proxy_credential: str, owner: str) -> str:
    """What a record's key is made of besides the CE: the proxy's credential, and its owner."""
    return f"{proxy_credential}\nowner {owner}" if owner else proxy_credential


def target_of(service: str, identifier: str) -> str:
    """The journal's target of delegation ``identifier`` on ``service``."""
    return f"{service.rstrip('/')}/delegations/{identifier}"


def _replaces(proxy: Proxy, record: Record) -> bool:
    """Whether ``proxy`` is to be signed into ``record``'s delegation: another proxy of its
    credential, newer than the one it holds (:meth:`.signing.Proxy.newer`): a replaced proxy
    reaches the CE even when it ends sooner, and an older one never replaces it."""
    return proxy.newer(record.fingerprint, record.starts, record.ends)


def _signed(record: Record, proxy: Proxy) -> Record:
    """``record`` once its delegation holds ``proxy``."""
    return replace(
        record, fingerprint=proxy.fingerprint, ends=proxy.not_after, starts=proxy.not_before
    )


def _load(text: str | None) -> Record | None:
    """A record as stored; None for none, or one that cannot be read (then it is made again)."""
    if not text:
        return None
    try:
        return delegation_record(text)
    except DocumentError:
        return None


class DelegationError(ArexError):
    """The CE's delegation request could not be signed (its CSR is unreadable or forged)."""


class Delegations:
    """The delegations of one backend: made, checked, renewed and deleted as the module says.

    :param state: the shared state store (None: this process only).
    :param clock: the injected clock (records' times).

    Each call that makes, uses or deletes one names its ``owner``: who makes it on the CE
    when that is not the proxy itself ('' : the proxy, ``auth: x509``; ``token ISS/SUB`` for a
    payload proxy delegated under ``auth: token``, whose delegation belongs to the token's
    identity there). Records, journal kinds and sweeps are kept apart by owner.
    """

    def __init__(self, state: StateStore | None, clock: Clock) -> None:
        self.state = state
        self.clock = clock
        #: what was made on the CEs, to undo (this process's memory without a state store)
        self.journal = Journal(
            state if state is not None else open_state({"state": {"driver": "memory"}}, clock),
            clock,
        )
        self._memory: dict[str, str] = {}
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        #: keys whose delegation was found on its CE since the iteration started
        self._checked: set[str] = set()

    @staticmethod
    def _key(service: str, proxy: Proxy, owner: str) -> str:
        return identity_key(service, owned(proxy.credential, owner))

    def new_iteration(self) -> None:
        """Ask the CEs again, at the next use, whether they still have their delegations."""
        with self._lock:
            self._checked.clear()

    # --- the store --------------------------------------------------------------------------

    def _get(self, key: str) -> Record | None:
        if self.state is not None:
            try:
                return _load(self.state.get(PREFIX + key))
            except StateError as exc:
                logger.warning("delegation records unreadable ({}); using this process's", exc)
        return _load(self._memory.get(key))

    def _put(self, key: str, record: Record) -> None:
        self._memory[key] = record.dump()
        if self.state is not None:
            try:
                self.state.set(PREFIX + key, record.dump())
            except StateError as exc:
                logger.warning("cannot record delegation {} ({}): kept here only", record.id, exc)

    def _drop(self, key: str) -> None:
        self._memory.pop(key, None)
        if self.state is not None:
            try:
                self.state.delete(PREFIX + key)
            except StateError as exc:
                logger.warning("cannot forget delegation record {}: {}", key, exc)

    def records(self) -> list[tuple[str, Record]]:
        """Every delegation recorded (by any director sharing the store)."""
        found: dict[str, Record] = {}
        for key, text in self._memory.items():
            record = _load(text)
            if record is not None:
                found[key] = record
        if self.state is not None:
            try:
                for full, text in self.state.items(PREFIX):
                    record = _load(text)
                    if record is not None and "/" not in full[len(PREFIX) :]:
                        found[full[len(PREFIX) :]] = record
            except StateError as exc:
                logger.warning("delegation records unreadable: {}", exc)
        return sorted(found.items())

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(key, threading.Lock())

    # --- signing ---------------------------------------------------------------------------

    @staticmethod
    def _sign(
        client: ArexClient, identifier: str, request: bytes, proxy: Proxy, deadline: Deadline
    ) -> None:
        try:
            pem = sign_request(load_arc_csr(request), proxy)
        except CsrError as exc:
            line = f"delegation {identifier}: {exc}"
            raise DelegationError(
                line,
                CommandResult(
                    argv=("PUT", f"{client.service}/delegations/{identifier}"),
                    returncode=1,
                    stderr=line,
                ),
            ) from None
        client.delegation_put(identifier, pem, deadline)

    def _create(self, client: ArexClient, proxy: Proxy, owner: str, deadline: Deadline) -> str:
        """A new delegation on ``client``'s CE, journaled: the intent before ``action=new``,
        the step before the signed proxy is put, committed once it is; a failure on the way
        undoes what was made (the half-made delegation, which would stay on the CE unused)."""
        change = self._begin(client, proxy, owner, deadline)
        try:
            identifier, request = client.delegation_new(deadline)
        except ArexError:
            if change is not None:
                self._undo(change)  # nothing known was made: the record goes
            raise
        try:
            if change is None:
                self._sign(client, identifier, request, proxy, deadline)
            else:
                change.step(
                    target_of(client.service, identifier),
                    None,
                    proxy.fingerprint,
                    apply=lambda: self._sign(client, identifier, request, proxy, deadline),
                )
        except ArexError:
            if change is not None:
                self._undo(change)
            else:
                self._delete_half_made(client, identifier, deadline)
            raise
        if change is not None:
            try:
                change.commit()
            except StateError as exc:
                logger.warning("delegation {} made, its journal not updated: {}", identifier, exc)
        logger.info(
            "{}: delegation {} made for {}{}",
            client.service,
            identifier,
            proxy.identity,
            f" by {owner}" if owner else "",
        )
        return identifier

    def _begin(
        self, client: ArexClient, proxy: Proxy, owner: str, deadline: Deadline
    ) -> Change | None:
        """The journaled change of a new delegation; None when the store cannot be written
        (then it is made as before the journal, and a half-made one is deleted at once)."""
        kind = self._register(proxy.identity, owner, lambda service: client, deadline)
        intent = {"service": client.service, "identity": proxy.identity}
        if owner:
            intent["owner"] = owner
        try:
            return self.journal.begin(kind, intent)
        except StateError as exc:
            logger.warning("delegation journal unwritable ({}); making it unjournaled", exc)
            return None

    @staticmethod
    def _delete_half_made(client: ArexClient, identifier: str, deadline: Deadline) -> None:
        try:
            client.delegation_delete(identifier, deadline)
        except ArexError as exc:
            logger.info(
                "{}: half-made delegation {} not deleted: {}", client.service, identifier, exc
            )

    def _undo(self, change: Change) -> None:
        undone = change.undo()
        if undone.problem:
            logger.info(
                "half-made delegation not deleted ({}): the journal keeps it, deleted later",
                undone.problem,
            )

    def _register(
        self,
        identity: str,
        owner: str,
        client_for: Callable[[str], ArexClient | None],
        deadline: Deadline | None = None,
    ) -> str:
        """Say how this identity's delegations are undone (deleted on their CE, through
        ``client_for(service)``); its journal kind."""

        def delete(target: str, _prior: Any) -> None:
            service, _, identifier = target.rpartition("/delegations/")
            client = client_for(service)
            if client is None:
                raise ArexError(
                    f"no client for {service} now",
                    CommandResult(argv=("POST", target), returncode=1, stderr="no client"),
                )
            client.delegation_delete(identifier, deadline or Deadline.after(UNDO_TIMEOUT))

        kind = kind_of(identity, owner)
        self.journal.register(kind, Restorer(write=delete))
        return kind

    def _forget(self, record: Record) -> bool:
        """Undo the journaled change that made ``record``'s delegation (the delegation is
        deleted on its CE): whether it is gone; False also when no change made it (a
        delegation made before the journal: the caller deletes it itself)."""
        target = target_of(record.service, record.id)
        for entry in self.journal.changes(kind_of(record.identity, record.owner)):
            if any(step.target == target for step in entry.steps):
                undone = self.journal.undo(entry)
                if undone.problem:
                    raise ArexError(
                        undone.problem,
                        CommandResult(argv=("POST", target), returncode=1, stderr=undone.problem),
                    )
                return True
        return False

    def _renew(self, client: ArexClient, identifier: str, proxy: Proxy, deadline: Deadline) -> None:
        self._sign(
            client, identifier, client.delegation_renew(identifier, deadline), proxy, deadline
        )

    # --- what the backend calls --------------------------------------------------------------

    def ensure(self, client: ArexClient, proxy: Proxy, deadline: Deadline, owner: str = "") -> str:
        """The id of the delegation pilots sent to ``client``'s CE must name: made when there is
        none, checked once per iteration, renewed when ``proxy`` replaces the one it holds.
        ``owner``: who makes it there when not the proxy (the class says).

        :raises ArexError: when the CE refuses or fails (the caller's failure to classify)."""
        key = self._key(client.service, proxy, owner)
        with self._key_lock(key):
            record = self._get(key)
            now = self.clock.time()
            if record is None:
                record = self._first(key, client, proxy, owner, deadline)
            elif key not in self._checked and not client.delegation_exists(record.id, deadline):
                logger.warning(
                    "{}: the CE lost delegation {}; making it again", client.service, record.id
                )
                record = self._again(client, record, proxy, owner, deadline)
            elif _replaces(proxy, record):
                self._renew(client, record.id, proxy, deadline)
                logger.info(
                    "{}: delegation {} renewed with the proxy ending {}",
                    client.service,
                    record.id,
                    time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(proxy.not_after)),
                )
                record = _signed(record, proxy)
            if key not in self._checked or record.used < now - 60:
                self._put(key, replace(record, used=now))
            with self._lock:
                self._checked.add(key)
            return record.id

    def refresh(
        self, client: ArexClient, proxy: Proxy, deadline: Deadline, owner: str = ""
    ) -> None:
        """Renew ``client``'s CE's delegation (of ``owner``) if ``proxy`` replaces the one it
        holds (a poll's part: pilots running there get the renewed proxy even while nothing is
        submitted). Makes none; a failure is logged, the poll goes on."""
        key = self._key(client.service, proxy, owner)
        record = self._get(key)
        if record is None or not _replaces(proxy, record):
            return
        with self._key_lock(key):
            record = self._get(key)
            if record is None or not _replaces(proxy, record):
                return
            try:
                self._renew(client, record.id, proxy, deadline)
            except ArexError as exc:
                logger.warning("{}: delegation {} not renewed: {}", client.service, record.id, exc)
                return
            self._put(key, replace(_signed(record, proxy), used=self.clock.time()))
            logger.info(
                "{}: delegation {} renewed after the proxy's renewal", client.service, record.id
            )

    def touch(self, service: str, identity: str, owner: str = "") -> None:
        """Note a poll of pilots on ``service`` as a use of the delegations of ``identity`` made
        by ``owner`` there (every credential of the DN: a pilot names the one it was sent with), so that
        no director's :meth:`sweep` deletes one while pilots tracked here run on it (issue 40
        item 9: use was counted by submissions only). Written at most once a minute."""
        now = self.clock.time()
        service = service.rstrip("/")
        for key, record in self.records():
            if record.service != service or (record.identity, record.owner) != (identity, owner):
                continue
            if record.used < now - 60:
                with self._key_lock(key):
                    current = self._get(key)
                    if current is not None and current.used < now - 60:
                        self._put(key, replace(current, used=now))

    def _first(
        self, key: str, client: ArexClient, proxy: Proxy, owner: str, deadline: Deadline
    ) -> Record:
        """A new delegation for ``key``; with a shared store only one director makes it, the
        others wait for its record (up to :data:`CREATE_WAIT` s, then make their own)."""
        lock = f"{PREFIX}{key}/lock"
        token = secrets.token_hex(8)
        held = True
        if self.state is not None:
            try:
                held = self.state.add_if_absent(lock, token, ttl=CREATE_LOCK)
            except StateError:
                held = True
            if not held:
                until = time.monotonic() + min(CREATE_WAIT, max(deadline.left() - 5, 0))
                while time.monotonic() < until:
                    record = self._get(key)
                    if record is not None:
                        return record
                    time.sleep(0.2)
        try:
            identifier = self._create(client, proxy, owner, deadline)
            record = Record(
                id=identifier,
                service=client.service,
                identity=proxy.identity,
                fingerprint=proxy.fingerprint,
                ends=proxy.not_after,
                used=self.clock.time(),
                starts=proxy.not_before,
                attributes=proxy.attributes,
                owner=owner,
            )
            self._put(key, record)
            return record
        finally:
            if held and self.state is not None:
                try:
                    if self.state.get(lock) == token:
                        self.state.delete(lock)
                except StateError:
                    pass

    def _again(
        self, client: ArexClient, record: Record, proxy: Proxy, owner: str, deadline: Deadline
    ) -> Record:
        """``record``'s delegation made again after the CE lost it: renewed under the same id
        when the CE allows it (its pilots name that id), else made anew."""
        try:
            self._renew(client, record.id, proxy, deadline)
            if client.delegation_exists(record.id, deadline):
                return _signed(record, proxy)
        except DelegationError:
            raise
        except ArexError as exc:
            logger.info(
                "{}: delegation {} cannot be renewed ({}); a new one",
                client.service,
                record.id,
                exc,
            )
        identifier = self._create(client, proxy, owner, deadline)
        try:
            self._forget(record)  # the CE lost it: its delete answers 404, the record goes
        except (ArexError, StateError) as exc:
            logger.info("{}: lost delegation {} not forgotten: {}", client.service, record.id, exc)
        return replace(_signed(record, proxy), id=identifier)

    def sweep(
        self,
        in_use: Iterable[str],
        identity: str,
        client_for: Callable[[str], ArexClient | None],
        deadline: Deadline,
        attributes: str | None = None,
        owner: str = "",
    ) -> list[str]:
        """Delete the delegations of ``identity`` made by ``owner`` (only they may delete them)
        on CEs none of ``in_use`` (services) names,
        and, given the ``attributes`` of the credential in force, those on such CEs made for
        another credential of the DN (a VOMS role or restriction no longer in use here),
        unused for :data:`UNUSED_GRACE` s (a submission or a poll of pilots there by any
        director sharing the store is a use: :meth:`touch`); returns the ids deleted.
        ``client_for(service)`` gives a client for a CE (None: it cannot be asked now)."""
        services = set(in_use)
        now = self.clock.time()
        self._undo_abandoned(self._register(identity, owner, client_for, deadline))
        deleted: list[str] = []
        for key, record in self.records():
            if (
                (record.identity, record.owner) != (identity, owner)
                or (
                    record.service in services
                    and (attributes is None or record.attributes == attributes)
                )
                or now - record.used < UNUSED_GRACE
                or deadline.passed()
            ):
                continue
            client = client_for(record.service)
            if client is None:
                continue
            try:
                # deleted here first: A-REX refuses to delete one its jobs still use, and that
                # refusal must not leave the journal to retry it once it is in use again
                client.delegation_delete(record.id, deadline)
            except ArexError as exc:
                logger.info(
                    "{}: unused delegation {} not deleted yet: {}", record.service, record.id, exc
                )
                continue
            try:
                self._forget(record)  # its change, undone: the delete answers 404
            except (ArexError, StateError) as exc:
                logger.info(
                    "{}: delegation {} deleted, its journal not: {}", record.service, record.id, exc
                )
            self._drop(key)
            deleted.append(record.id)
            logger.info(
                "{}: deleted delegation {}, which no endpoint uses", record.service, record.id
            )
        return deleted

    def _undo_abandoned(self, kind: str) -> None:
        """Undo this identity's delegation changes that are due: one whose director stopped
        half-way (its lease passed), one whose undo had failed."""
        try:
            undone = self.journal.undo_pending([kind])
        except StateError as exc:
            logger.warning("delegation journal unreadable: {}", exc)
            return
        for one in undone:
            if one.ok:
                logger.warning(
                    "delegation change {} undone ({}): its director stopped half-way, or its "
                    "undo had failed",
                    one.entry.id,
                    ", ".join(one.restored) or "nothing was made",
                )

    def has_work(self) -> bool:
        """Whether a sweep has anything to look at: a delegation recorded, or a change of one
        in the journal (a director that stopped half-way leaves no record)."""
        if self.records():
            return True
        try:
            return any(e.kind.startswith(f"{KIND}:") for e in self.journal.changes())
        except StateError:
            return False
