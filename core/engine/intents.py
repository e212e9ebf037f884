"""Submissions written before they are sent: nothing lost, nothing twice.

Before a submission is sent, its **intent** (the endpoint, the demand group, how many pilots, the
submission's unique name, who sends it) is written durably to ``<state_dir>/intents/<name>.json``;
the answer settles it. A backend names the jobs it creates after the submission
(:func:`gridgate.core.backend.job_name`), so a submission whose answer never came can be looked
for by name (``gridgate_find_pilots``):

- its director was killed while it was sent (the file stays; the next director on this state
  folder finds it at its first iteration);
- its answer was lost (``SubmitResult.uncertain``) or its command killed at the deadline;
- the store refused its pilots (they are then held by :mod:`.pending` as well).

Such a submission is **unsettled**: its pilots count against ``max_waiting`` / ``max_total``
(as waiting) until it is reconciled, at the start of each iteration, before the limits are
applied: the jobs the CE holds under its name are adopted into the registry, in whatever state
the CE has them, and a submission none of whose jobs the CE has shown while answering for
``director.pilots.reconcile_for`` is given up with a log line (a CE that cannot be asked keeps
it, for at most :data:`UNANSWERED_GIVE_UP`). A backend that cannot look jobs up
by name (gLite WMS) leaves the hook unanswered; its unsettled submissions are given up the same
way, saying so.

The same search, with a **fleet** instead of names, finds every pilot of the directors of one
state store on a CE: what :mod:`.epoch` does when the store came back empty. The fleet is six
hex digits derived from the state store's address (``director.fleet`` sets it): every director
of one store names its pilots alike.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import msgspec
from loguru import logger

from gridgate.core.engine.limits import cores_of
from gridgate.core.engine.records import IntentRecord, read_record
from gridgate.core.engine.runtime import ACCOUNTING, Runtime
from gridgate.core.files import atomic_write
from gridgate.core.model import (
    AccountingRecord,
    AdmissionRequest,
    BackendInfo,
    Endpoint,
    FoundPilots,
    JobStatus,
    Refusal,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.state import Counts, Pilot, PilotRegistry, StateError

#: The folder of the intents, under ``director.state_dir``.
INTENTS_FOLDER = "intents"
#: The group of a pilot adopted by a fleet search (its demand group was in the lost store).
ADOPTED_GROUP = "adopted"
#: Why an intent is unsettled, as the log lines say it.
CRASHED = "its director stopped while it was sent"
UNRECORDED = "the state store did not take its pilots"
#: How long an unsettled submission whose CE cannot be asked is kept (past ``reconcile_for``,
#: which counts only while the CE answers): a CE down for longer is given up on.
UNANSWERED_GIVE_UP = 86400.0
#: The keys of a ``state:`` section that name the store (the fleet's hash reads only these).
_IDENTITY_KEYS = ("driver", "url", "prefix", "path", "dsn", "schema")
#: The drivers whose store is a server that directors on several hosts share.
_SHARED_DRIVERS = ("redis", "postgresql")


def fleet_of(config: Mapping[str, object], state_dir: str) -> str:
    """The six hex digits every director of one state store puts in its pilots' names: a hash
    of what names the store (its driver, and the ``url`` and ``prefix`` of a Redis, the ``dsn``
    and ``schema`` of a PostgreSQL, the ``path`` of a sqlite file; neither secrets nor tuning),
    with this host and the state folder for a store that is this host's own (sqlite, memory)."""
    section = dict(config.get("state") or {"driver": "sqlite"})  # type: ignore[call-overload]
    kept = {k: section.get(k) for k in _IDENTITY_KEYS if section.get(k) is not None}
    text = json.dumps(kept, sort_keys=True, default=str)
    if section.get("driver") not in _SHARED_DRIVERS:
        text += f"|{socket.gethostname()}|{os.path.abspath(state_dir)}"
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def unrecordable(folder: Path, exc: OSError) -> str:
    """What is said when no intent can be written in ``folder``."""
    return (
        f"cannot write the submission's intent in {folder}: {exc.strerror or exc}; "
        "nothing is submitted while results cannot be recorded"
    )


def default_instance() -> str:
    """A director's name in shared state when none is given: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


class Intents:
    """The intents of one director (one per director; safe for the submission threads).

    :param runtime: the director's runtime (settings, store, hooks, clock).
    :param instance: the director's name in shared state (unique per process).
    """

    def __init__(self, runtime: Runtime, instance: str) -> None:
        self.runtime = runtime
        self.instance = instance
        self.host = socket.gethostname()
        self._lock = threading.Lock()
        #: being sent by this process now
        self._open: dict[str, IntentRecord] = {}
        #: to be reconciled (this process's and those a stopped director left)
        self._unsettled: dict[str, IntentRecord] = {}
        #: files that could not be read or removed, said once each
        self._said: set[str] = set()
        #: submissions past reconcile_for kept because their CE could not be asked, said once
        self._told_held: set[str] = set()
        #: submission -> since when its CE has answered without showing its jobs
        self._answering: dict[str, float] = {}

    # --- where they are kept ---------------------------------------------------------------

    @property
    def folder(self) -> Path:
        return Path(self.runtime.settings.state_dir) / INTENTS_FOLDER

    @property
    def fleet(self) -> str:
        """This director's fleet (``director.fleet``, else derived from the state store)."""
        settings = self.runtime.settings
        return settings.fleet or fleet_of(self.runtime.config, settings.state_dir)

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def _write(self, record: IntentRecord) -> None:
        folder = self.folder
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(self._path(record.name), msgspec.json.encode(record), durable=True)

    def _remove(self, name: str) -> None:
        try:
            self._path(name).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            if name not in self._said:
                self._said.add(name)
                logger.error(
                    "cannot remove the settled intent {}: {} (the next director looks for its "
                    "pilots again, and finds them recorded)",
                    self._path(name),
                    exc,
                )

    def unwritable(self) -> str:
        """Why no intent can be written now ("" when one can): a durable probe file written
        and removed in the intents folder."""
        probe = self.folder / f".probe-{os.getpid()}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write(probe, b"probe", durable=True)
            probe.unlink()
        except OSError as exc:
            return unrecordable(self.folder, exc)
        return ""

    # --- a submission's life ---------------------------------------------------------------

    def begin(self, endpoint: Endpoint, request: SubmitRequest) -> SubmitRequest:
        """Write the intent of sending ``request`` to ``endpoint``; the request named after it.

        :raises OSError: the intent could not be written durably: nothing may be sent (its
            result could be recorded nowhere that survives this process)."""
        name = f"{self.fleet}-{secrets.token_hex(6)}"
        named = replace(request, name=name)
        if not self.runtime.settings.pilots.track:
            return named  # no registry to reconcile with
        record = IntentRecord(
            name=name,
            backend=endpoint.backend,
            endpoint=endpoint.name,
            group=request.group,
            count=request.count,
            cores=cores_of(request),
            started=self.runtime.clock.time(),
            owner=self.instance,
            host=self.host,
            pid=os.getpid(),
            url=endpoint.url,
        )
        self._write(record)
        with self._lock:
            self._open[name] = record
        return named

    def settle(self, name: str) -> None:
        """The answer came and says everything: the intent is done."""
        with self._lock:
            known = self._open.pop(name, None) or self._unsettled.pop(name, None)
            self._answering.pop(name, None)
            self._told_held.discard(name)
        if known is not None:
            self._remove(name)

    def unsettle(self, name: str, why: str) -> None:
        """No answer says which of the submission's pilots exist (``why``): it is looked for
        by name from the next iteration on."""
        with self._lock:
            record = self._open.pop(name, None)
            if record is None:
                return
            record = msgspec.structs.replace(record, why=why)
            self._unsettled[name] = record
        try:
            self._write(record)
        except OSError as exc:  # the first write holds: only the reason is not kept
            logger.debug("intent {}: reason not kept: {}", name, exc)

    def finish(self, name: str, result: SubmitResult | None) -> None:
        """Settle or keep the intent of ``name`` after its submission's ``result`` was
        accounted (None: nothing was sent, or nothing matched)."""
        if not name:
            return
        if result is not None and (result.uncertain or _timed_out(result)):
            why = (
                "its command was killed at the deadline"
                if _timed_out(result)
                else "its answer was lost"
            )
            self.unsettle(name, why)
            return
        with self._lock:
            unrecorded = name in self._unsettled
        if not unrecorded:
            self.settle(name)

    def unrecorded(self, name: str) -> None:
        """The store did not take the pilots of ``name`` (:mod:`.pending` holds them): the
        intent stays until the store answers and they are found recorded."""
        if name:
            self.unsettle(name, UNRECORDED)

    def written_back(self) -> None:
        """Every pilot this process held for the store is in it now: its submissions whose
        pilots the store had refused are settled."""
        with self._lock:
            names = [
                n
                for n, r in self._unsettled.items()
                if r.why == UNRECORDED and r.owner == self.instance
            ]
        for name in names:
            self.settle(name)

    # --- what the limits count ---------------------------------------------------------------

    def in_flight(self) -> tuple[Counts, dict[str, int]]:
        """The pilots of unsettled submissions, as waiting counts (backend, endpoint,
        ``waiting``) and waiting cores per endpoint key; those the store did not take are left
        out (:mod:`.pending` counts them)."""
        self.load()
        counts: dict[tuple[str, str, str], int] = {}
        cores: dict[str, int] = {}
        with self._lock:
            records = [r for r in self._unsettled.values() if r.why != UNRECORDED]
        for record in records:
            where = (record.backend, record.endpoint, "waiting")
            counts[where] = counts.get(where, 0) + record.count
            key = f"{record.backend}/{record.endpoint}"
            cores[key] = cores.get(key, 0) + record.count * record.cores
        return counts, cores

    @property
    def unsettled(self) -> list[IntentRecord]:
        with self._lock:
            return list(self._unsettled.values())

    # --- what a stopped director left ------------------------------------------------------

    def load(self) -> None:
        """Take up the intents a stopped director left in the state folder (read at every
        iteration: a director that shared the folder may stop at any time)."""
        try:
            paths = sorted(self.folder.glob("*.json"))
        except OSError:
            return
        for path in paths:
            name = path.stem
            with self._lock:
                if name in self._open or name in self._unsettled:
                    continue
            try:
                raw = path.read_bytes()
            except OSError as exc:
                if name not in self._said:
                    self._said.add(name)
                    logger.error("intent {} unreadable: {}", path, exc)
                continue
            record = read_record(raw, IntentRecord, str(path))
            if record is None or record.name != name:
                if name not in self._said:
                    self._said.add(name)
                    logger.error("{} is no intent this director can read; left alone", path)
                continue
            if not self._orphaned(record):
                continue
            why = record.why or CRASHED
            with self._lock:
                self._unsettled[name] = msgspec.structs.replace(record, why=why)
            logger.warning(
                "submission {} of {} pilot(s) to {}/{} was not settled ({}): its pilots are "
                "looked for on the CE by name",
                name,
                record.count,
                record.backend,
                record.endpoint,
                why,
            )

    def _orphaned(self, record: IntentRecord) -> bool:
        """Whether no live director will settle ``record``."""
        if record.owner == self.instance:
            return False  # this process's own: in memory already (or settled meanwhile)
        if record.host == self.host:
            return record.pid == os.getpid() or not _alive(record.pid)
        # another host's director on a shared folder: its deadline has long passed
        limit = 2 * float(self.runtime.settings.command_timeout) + 60.0
        return self.runtime.clock.time() - record.started > limit

    # --- reconciling -------------------------------------------------------------------------

    def reconcile(self, registry: PilotRegistry) -> int:
        """Look for the pilots of every unsettled submission on its CE, by name; adopt those
        found, give up those not found within ``reconcile_for``. The pilots adopted.

        :raises StateError: the registry refused the pilots found (they are looked for again)."""
        self.load()
        by_endpoint: dict[tuple[str, str], list[IntentRecord]] = {}
        for record in self.unsettled:
            by_endpoint.setdefault((record.backend, record.endpoint), []).append(record)
        adopted = 0
        infos: dict[str, BackendInfo | None] = {}
        for (backend, name), records in sorted(by_endpoint.items()):
            if backend not in infos:
                infos[backend] = self.runtime.pm.hook.gridgate_backend_info(backend=backend)
            endpoint = _endpoint(infos[backend], backend, name, records[0].url)
            answer = self._find(endpoint, infos[backend], [r.name for r in records], "")
            adopted += self._settle_found(registry, endpoint, records, answer)
        return adopted

    def search_fleet(self, registry: PilotRegistry, endpoint: Endpoint) -> bool | None:
        """Adopt every pilot of this fleet that ``endpoint`` holds (the store lost them).
        True when the CE answered, False when it could not be asked, None when its backend
        cannot look jobs up by name.

        :raises StateError: the registry refused them."""
        info = self.runtime.pm.hook.gridgate_backend_info(backend=endpoint.backend)
        answer = self._find(endpoint, info, [], self.fleet)
        if answer is None:
            return None
        if not answer.ok:
            return False
        now = self.runtime.clock.time()
        pilots = [
            _pilot(status, endpoint, ADOPTED_GROUP, now, 1)
            for statuses in answer.found.values()
            for status in statuses
        ]
        known = {p.job_id for p in registry.active(endpoint.backend, endpoint.name)}
        fresh = [p for p in pilots if p.job_id not in known]
        if fresh:
            registry.put(fresh)
            logger.warning(
                "{}: {} pilot(s) of this fleet ({}) found on the CE by name and adopted "
                "(group {!r}: the store that knew their groups lost them)",
                endpoint.key,
                len(fresh),
                self.fleet,
                ADOPTED_GROUP,
            )
        return True

    def _find(
        self,
        endpoint: Endpoint,
        info: BackendInfo | None,
        names: Sequence[str],
        fleet: str,
    ) -> FoundPilots | None:
        """The backend's answer (None: it cannot look jobs up by name), under a ``query``
        grant; a refusal or a crash is an answer that could not be had (``ok`` False)."""
        hook = self.runtime.pm.hook
        timeout = self.runtime.timeout(info) if info is not None else 60.0
        grant = hook.gridgate_admit(
            request=AdmissionRequest(
                category="query",
                opcode="JOB_FIND",
                size=max(1, len(names)),
                endpoint=endpoint,
                user=self.runtime.user,
            )
        )
        if isinstance(grant, Refusal):
            return FoundPilots(endpoint, ok=False, message=f"refused: {grant.reason}")
        try:
            answer: FoundPilots | None = hook.gridgate_find_pilots(
                endpoint=endpoint, names=tuple(names), fleet=fleet, timeout=timeout
            )
        except Exception as exc:  # a plugin bug must not stop the iteration
            logger.opt(exception=exc).error("looking for pilots on {} crashed", endpoint.key)
            return FoundPilots(endpoint, ok=False, message=f"crashed: {exc}")
        finally:
            if grant is not None:
                hook.gridgate_release(grant=grant)
        return answer

    def _settle_found(
        self,
        registry: PilotRegistry,
        endpoint: Endpoint,
        records: Sequence[IntentRecord],
        answer: FoundPilots | None,
    ) -> int:
        now = self.runtime.clock.time()
        give_up_after = self.runtime.settings.pilots.reconcile_for
        adopted = 0
        for record in records:
            statuses = answer.found.get(record.name, ()) if answer and answer.ok else ()
            if statuses:
                adopted += self._adopt(registry, endpoint, record, statuses, now)
                continue
            if answer is None or not answer.ok:
                # a CE that stops answering may be restarting: its clock starts anew
                self._answering.pop(record.name, None)
            if answer is None:
                if now - record.started < give_up_after:
                    continue
                why = f"backend {endpoint.backend!r} cannot look jobs up by name"
            elif not answer.ok:
                # The CE may hold its jobs and cannot say so yet (it is down, or restarting
                # after the stop that lost the answer): giving up now would leave them untracked
                # and send their like again beside them. The pilots go on counting against the
                # limits of this endpoint, which takes nothing while it cannot be asked anyway.
                if now - record.started < max(give_up_after, UNANSWERED_GIVE_UP):
                    if now - record.started >= give_up_after:
                        self._tell_held(endpoint, record, answer)
                    continue
                why = f"the CE could not be asked for {UNANSWERED_GIVE_UP / 3600:.0f} h " + (
                    f"({answer.message or 'no answer'})"
                )
            else:
                # reconcile_for counts from the CE's first answer that lacks them (one just
                # back from a restart may not list its jobs at once)
                since = self._answering.setdefault(record.name, now)
                if now - max(record.started, since) < give_up_after:
                    continue
                why = f"the CE has held none of its jobs for {now - since:.0f} s"
            logger.warning(
                "{}: submission {} of {} pilot(s) ({}) given up after {:.0f} s: {}; "
                "if the CE made them, they run untracked",
                endpoint.key,
                record.name,
                record.count,
                record.why,
                now - record.started,
                why,
            )
            self.settle(record.name)
        return adopted

    def _tell_held(self, endpoint: Endpoint, record: IntentRecord, answer: FoundPilots) -> None:
        """Say once per submission that it is past ``reconcile_for`` and kept because its CE
        cannot be asked."""
        if record.name in self._told_held:
            return
        self._told_held.add(record.name)
        logger.warning(
            "{}: submission {} of {} pilot(s) ({}) not found yet: the CE cannot be asked ({}); "
            "it is looked for again at each iteration and counts against the limits meanwhile",
            endpoint.key,
            record.name,
            record.count,
            record.why,
            answer.message or "no answer",
        )

    def _adopt(
        self,
        registry: PilotRegistry,
        endpoint: Endpoint,
        record: IntentRecord,
        statuses: Iterable[JobStatus],
        now: float,
    ) -> int:
        found = [
            replace(_pilot(s, endpoint, record.group, now, record.cores), submitted=record.started)
            for s in statuses
        ]
        # its director may have recorded some before it stopped (the answer came, the intent
        # was not yet settled): those keep their rows and their tracked state
        pilots = [p for p in found if registry.get(p.backend, p.endpoint, p.job_id) is None]
        registry.put(pilots)
        # and some may have their row (a bulk answer that named some of its jobs and lost the
        # others): a job id is in one row
        accounted = self._accounted(record)
        unrowed = [p for p in found if p.job_id not in accounted]
        if unrowed and record.why != UNRECORDED:
            row = AccountingRecord(
                time=now,
                backend=endpoint.backend,
                endpoint=endpoint.name,
                outcome="submitted",
                group=record.group,
                pilots=len(unrowed),
                job_ids=tuple(p.job_id for p in unrowed),
                name=record.name,
                failure_kind="adopted",
            )
            try:
                self.runtime.state.append_record(ACCOUNTING, row.as_dict())
            except StateError as exc:
                logger.error("accounting row of adopted pilots lost: {}", exc)
        if pilots:
            logger.warning(
                "{}: {} pilot(s) of submission {} ({}) found on the CE by name and adopted{}",
                endpoint.key,
                len(pilots),
                record.name,
                record.why,
                f" ({len(found) - len(pilots)} tracked already)"
                if len(found) > len(pilots)
                else "",
            )
        if len(found) < record.count:
            # A CE may list a job a moment after its siblings of one creation (seen on A-REX
            # 6.17: one of two): settled now, the other would run untracked. Looked for
            # again until reconcile_for has passed since it was sent; then settled with what
            # was found (a creation the CE did only in part).
            if now - record.started < self.runtime.settings.pilots.reconcile_for:
                return len(pilots)
            logger.warning(
                "{}: submission {} settled with {} of its {} pilot(s) found on the CE; "
                "if the CE made the others, they run untracked",
                endpoint.key,
                record.name,
                len(found),
                record.count,
            )
        self.settle(record.name)
        return len(pilots)

    def _accounted(self, record: IntentRecord) -> set[str]:
        """The job ids the submission's own accounting rows hold already (its director stopped
        after the answer came and before the intent was settled, or its answer named some of
        its jobs): those get no second row. A store that cannot be read says none: a second
        row beats a missing one."""
        try:
            rows = self.runtime.state.records(ACCOUNTING, since=record.started - 1)
        except StateError:
            return set()
        return {
            str(job)
            for row in rows
            if row.get("name") == record.name  # not config: an accounting row
            for job in row.get("job_ids") or ()  # not config: the same
        }


def _timed_out(result: SubmitResult) -> bool:
    return bool(result.command is not None and result.command.timed_out)


def _endpoint(info: BackendInfo | None, backend: str, name: str, url: str) -> Endpoint:
    for endpoint in info.endpoints if info is not None else ():
        if endpoint.name == name:
            return endpoint
    return Endpoint(backend, name, url)


def _pilot(status: JobStatus, endpoint: Endpoint, group: str, now: float, cores: int) -> Pilot:
    return Pilot(
        job_id=status.job_id,
        backend=endpoint.backend,
        endpoint=endpoint.name,
        group=group,
        submitted=now,
        state=status.state,
        changed=now,
        native=status.native,
        reason=status.reason,
        cores=cores,
    )
