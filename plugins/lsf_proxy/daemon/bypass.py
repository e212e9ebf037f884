"""Who went around the gate (``proxyd.bypass``): the scheduler's own count of the requests it
served each user, against the tokens this daemon gave that user in the same window.

The seed's lsfproxyd has ``LSF_PROXYD_BYPASS``: mbatchd knows which requests came without a
token. Slurm's controller does not, but ``sdiag`` counts every user's RPCs, readable by any
user (the ``gridgate_scheduler_rpcs`` hook; :mod:`gridgate.plugins.slurm.scheduler`). Every
``audit.interval`` the daemon reads those counters and judges each user's window:

    excess = RPCs served - (cost x tokens granted in the window + credit) - tolerance

``cost`` is what one token of the opcode may cost the controller at most (``audit.costs``,
measured upper bounds), and ``credit`` the part of the previous window's allowance its RPCs
did not use: a token granted at the end of one window whose command ran in the next is not
counted against anyone. A user with excess > 0 went around the gate. A drop in the counters
(a restart of the controller, ``sdiag --reset``) or a new ``Data since`` starts a new baseline,
and a window in which a category was disabled (its commands then run without tokens) is not
judged. root, the admins, ``privileged`` users, the daemon's own user and ``exempt`` (the
scheduler's account) are not audited.

:class:`BypassAudit` is the pure part, on readings and grants handed to it; :class:`BypassWatch`
runs it in the daemon: reads the hook in a thread, reports, blocks or denies, and undoes the
block or denial after ``for`` (kept in a file, so a restarted daemon still undoes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from gridgate.core.files import InputFileError, read_regular
from gridgate.core.journal import UNCHANGED, Entry, Journal, Restorer, Step
from gridgate.core.model import Notification
from gridgate.core.patterns import clip
from gridgate.core.scheduler import SchedulerChange, SchedulerRPCs
from gridgate.core.state import StateError, open_state
from gridgate.core.text import printable
from gridgate.plugins.lsf_proxy.daemon import documents
from gridgate.plugins.lsf_proxy.daemon.bypass_trace import RequestTrace
from gridgate.plugins.lsf_proxy.daemon.diagnose import log_field, stamp
from gridgate.plugins.lsf_proxy.daemon.documents import OldAction
from gridgate.plugins.lsf_proxy.daemon.notify import DaemonNotifiers
from gridgate.plugins.lsf_proxy.daemon.policy import BlockRule, Token
from gridgate.plugins.lsf_proxy.schedulers import ask, load_scheduler
from gridgate.plugins.lsf_proxy.settings import BypassSettings


@dataclass(frozen=True)
class Finding:
    """One user's window with RPCs beyond the tokens' cover."""

    user: str
    rpcs: int
    covered: float
    excess: float
    #: windows in a row with an excess, this one included
    windows: int
    start: float
    end: float

    def describe(self, interval: float) -> str:
        return (
            f"{self.user} made {self.rpcs} scheduler RPCs in {self.end - self.start:.0f} s with "
            f"tokens covering {self.covered:g}: {self.excess:g} beyond them "
            f"({self.windows} window(s) in a row of {interval:g} s)"
        )


def bypass_line(finding: Finding) -> str:
    """The diagnostic log's line for a bypasser, in the columns of the request lines:
    ``Dec 3 13:40:02 2026 BYPASS,-,user1,-,RPCS,0,HHMMSS,HHMMSS`` (the RPCs beyond cover in
    the size column, 0 for "held no token", the window's start and end)."""
    fields = [
        "BYPASS",
        "-",
        log_field(finding.user),
        "-",
        f"{finding.excess:g}",
        "0",
        time.strftime("%H%M%S", time.localtime(finding.start)),
        time.strftime("%H%M%S", time.localtime(finding.end)),
    ]
    return f"{stamp(finding.end)} {','.join(fields)}"


class BypassAudit:
    """The audit's arithmetic on readings (:class:`SchedulerRPCs`) and grants handed to it.

    ``exempt(user)`` says who is never audited. Not thread-safe: the daemon calls it from its
    event loop (grants) and hands it readings taken in a thread.
    """

    def __init__(self, settings: BypassSettings, exempt: Callable[[str], bool]) -> None:
        self.settings = settings
        self.exempt = exempt
        self._covered: dict[str, float] = {}  # cumulative cover of tokens granted, per user
        self._base: SchedulerRPCs | None = None
        self._base_covered: dict[str, float] = {}
        self._base_peers: dict[str, dict[str, float]] = {}
        self._pending: list[tuple[SchedulerRPCs, dict[str, float]]] = []
        self._credit: dict[str, float] = {}
        self._streak: dict[str, int] = {}
        self._disturbed = False
        #: the last window's findings (user -> excess), the metric's value
        self.last: dict[str, float] = {}
        self.windows = 0
        self.baselines = 0
        self.problem = ""
        self.skipped = ""

    def granted(self, token: Token) -> None:
        """Count one token granted (the policy's ``on_grant``)."""
        self._covered[token.user] = self._covered.get(token.user, 0.0) + self.settings.cost(
            token.opcode
        )

    def disturb(self) -> None:
        """Commands ran without tokens (a category disabled): do not judge this window."""
        self._disturbed = True

    def _rebase(
        self, reading: SchedulerRPCs, why: str, peers: Mapping[str, Mapping[str, Any]]
    ) -> None:
        self._base = reading
        self._base_covered = dict(self._covered)
        self._base_peers = {name: dict(p.get("covered") or {}) for name, p in peers.items()}
        self._pending = []
        self._credit = {}
        self.skipped = why
        self._disturbed = False

    def observe(
        self, reading: SchedulerRPCs, peers: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[Finding]:
        """Judge the window that ends with ``reading``; the users who went around the gate.

        ``peers`` are the other live daemons' grants, as their heartbeats brought them
        (name -> ``{"at": wall time, "covered": {user: cover}}``, cumulative since each
        started): a window is judged only up to the last reading that every peer's grants
        reach past (``at`` >= the reading's time), so a heartbeat's delay is never taken
        for a bypass; until then the window grows."""
        peers = peers or {}
        if not reading.ok:
            self.problem = reading.message or "the scheduler's counters could not be read"
            return []
        self.problem = ""
        base = self._base
        if base is None:
            self.baselines += 1
            self._rebase(reading, "first reading: the baseline", peers)
            return []
        dropped = [u for u, n in base.by_user.items() if reading.by_user.get(u, 0) < n]
        if reading.since != base.since or dropped:
            self.baselines += 1
            self._rebase(
                reading,
                "the scheduler's counters started again (restart or reset): a new baseline",
                peers,
            )
            self.last = {}
            return []
        if self._disturbed:
            self._rebase(reading, "a category was disabled in the window: not judged", peers)
            self.last = {}
            return []
        self._pending.append((reading, dict(self._covered)))
        index = len(self._pending) - 1
        if peers:
            reached = min(float(p["at"]) for p in peers.values())  # peer_grants gives it
            ready = [i for i, (r, _) in enumerate(self._pending) if r.taken <= reached]
            if not ready:
                self.skipped = "waiting for the peers' grants (their next heartbeat)"
                return []
            index = ready[-1]
        reading, own = self._pending[index]
        del self._pending[: index + 1]
        self.skipped = ""
        self.windows += 1
        findings: list[Finding] = []
        credit: dict[str, float] = {}
        users = set(reading.by_user) | set(own)
        for p in peers.values():
            users |= set(p.get("covered") or {})
        for user in sorted(users):
            rpcs = reading.by_user.get(user, 0) - base.by_user.get(user, 0)
            granted = own.get(user, 0.0) - self._base_covered.get(user, 0.0)
            for name, p in peers.items():
                now = float((p.get("covered") or {}).get(user, 0.0))
                then = self._base_peers.get(name, {}).get(user, 0.0)
                granted += now - then if now >= then else now  # lower: that peer restarted
            allowance = granted + self._credit.get(user, 0.0)
            unused = allowance - rpcs
            if unused > 0:  # carried one window only: no cover can be saved up
                credit[user] = min(unused, granted)
            if self.exempt(user):
                continue
            excess = rpcs - allowance - self.settings.tolerance
            if excess > 0:
                streak = self._streak[user] = self._streak.get(user, 0) + 1
                findings.append(
                    Finding(user, rpcs, allowance, excess, streak, base.taken, reading.taken)
                )
            else:
                self._streak.pop(user, None)
        self._base = reading
        self._base_covered = own
        self._base_peers = {name: dict(p.get("covered") or {}) for name, p in peers.items()}
        self._credit = credit
        self.last = {f.user: f.excess for f in findings}
        return findings

    def follow(self, reading: SchedulerRPCs, why: str) -> None:
        """Keep a baseline without judging (another daemon of the service audits)."""
        if reading.ok:
            self._rebase(reading, why, {})
            self.last = {}

    def covered(self) -> dict[str, Any]:
        """What this daemon's heartbeats tell the others: its cumulative cover per user."""
        return {"at": time.time(), "covered": dict(self._covered)}

    def status(self) -> dict[str, Any]:
        return {
            "windows": self.windows,
            "baselines": self.baselines,
            "since": self._base.since if self._base else None,
            "last_reading": self._base.taken if self._base else None,
            "problem": self.problem,
            "skipped": self.skipped,
            "bypassing": dict(self.last),
        }


def old_acting(path: Path) -> dict[str, OldAction]:
    """What versions before the journal kept in ``path`` for the audit to undo: {} when there
    is none, or when what is there is not one (a link, a FIFO, another owner's file, too
    large, not JSON: told here)."""
    try:
        return documents.old_acting(
            read_regular(path, max_bytes=1 << 20, owners={0, os.geteuid()}, follow_links=False)
        )
    except InputFileError as exc:
        if exc.errno != errno.ENOENT:
            logger.error("proxyd.bypass: {} not read: {}", path, exc)
        return {}
    except ValueError as exc:  # cut short or not ours: nothing to undo from it
        logger.error("proxyd.bypass: {} is not a record: {}", path, exc)
        return {}


def _made() -> None:
    """A step moved from an older record: made already."""


def _older_block(step: Step, holder: Any, intent: Mapping[str, Any]) -> Any:
    """The undo of a block recorded before blocks had holders (``False -> True``): lifted
    whoever holds it now, as then; a block of this version held by another is left."""
    return None if step.new is True else UNCHANGED


class _Refused(Exception):
    """The scheduler did not deny (its :class:`SchedulerChange` says why)."""


class Acting:
    """What the audit did to users and must undo after ``for``: one journaled change per
    user (:mod:`gridgate.core.journal`), in ``journal``'s store, so that a restarted daemon
    (or, on a store the service shares, another daemon) still undoes it.

    A block is this daemon's own (the kind ``bypass.block:NAME``: each daemon blocks on its
    own blocklist, a peer's audit's block adopted as its own); a denial is the service's
    (``bypass.deny_partition``: the scheduler is one for all).
    """

    DENY = "bypass.deny_partition"

    def __init__(self, journal: Journal, daemon: str) -> None:
        self.journal = journal
        self.block_kind = f"bypass.block:{daemon}"

    def _entries(self) -> list[tuple[str, Entry]]:
        kinds = (self.block_kind, self.DENY)
        return [
            (e.intent["user"], e)
            for e in self.journal.changes()
            if e.kind in kinds and isinstance(e.intent.get("user"), str)
        ]

    def users(self) -> set[str]:
        """Whom an action is journaled for: in force, being made, or its undo to try again."""
        return {user for user, _ in self._entries()}

    @property
    def held(self) -> dict[str, dict[str, Any]]:
        """user -> ``{"action", "until"[, "from"]}``, for whom an action is in force (made,
        or its undo to be tried again)."""
        out: dict[str, dict[str, Any]] = {}
        for user, entry in self._entries():
            if not entry.in_force:
                continue
            held: dict[str, Any] = {
                "action": "block" if entry.kind == self.block_kind else "deny_partition",
                "until": entry.until if entry.until is not None else entry.intent.get("until"),
            }
            if entry.intent.get("from"):
                held["from"] = entry.intent["from"]
            out[user] = held
        return out

    def adopt(self, path: Path) -> None:
        """Move what an older version kept in ``path`` into the journal (read once)."""
        for user, held in old_acting(path).items():
            block = held.action == "block"
            intent: dict[str, Any] = {"user": user, "until": held.until}
            if block and held.from_:
                intent["from"] = held.from_
            change = self.journal.begin(self.block_kind if block else self.DENY, intent)
            change.step(user, False, True, apply=_made)
            change.commit(until=held.until)
            logger.info(
                "proxyd.bypass: {}'s {} moved from {} into the journal", user, held.action, path
            )
        if path.is_file():
            path.unlink()


class BypassWatch:
    """The audit inside the daemon: every interval a reading (in a thread), the findings
    reported and acted on, and the actions past their ``for`` undone.

    ``daemon`` is the :class:`~gridgate.plugins.lsf_proxy.daemon.daemon.ProxyDaemon` (its
    policy, token desk, blocklist file, metrics and owner).
    """

    def __init__(
        self,
        daemon: Any,
        settings: BypassSettings,
        folder: Path,
        notifiers: DaemonNotifiers | None = None,
        manager: Any = None,
    ) -> None:
        self.daemon = daemon
        #: who is told after ``notify_after`` windows in a row (the config's notifiers)
        self.notifiers = notifiers
        self.settings = settings
        config = getattr(daemon, "config_path", None)
        #: the scheduler plugin (the adaptive limits' when they read the same one)
        self.manager = manager or load_scheduler(
            settings.plugin,
            settings.options,
            folder,
            config.parent if config else None,
            state=getattr(daemon.peers, "store", None),
        )
        self.audit = BypassAudit(settings, self.exempt)
        try:
            self.acting = self._acting(daemon, folder)
        except StateError as exc:
            raise ValueError(f"proxyd.bypass: the journal of its actions: {exc}") from None
        self.trace = RequestTrace(self)
        daemon.policy.on_grant = self._granted
        daemon.policy.on_release = self.trace.ledger.released
        daemon.peers.extra = self.heartbeat  # the others' audits add this daemon's grants
        daemon.tokens.audit_block = self.audit_block  # what a user it blocked is told

    def _acting(self, daemon: Any, folder: Path) -> Acting:
        """The journal of the audit's actions: in the store the peers share, else in
        ``journal.db`` in ``folder``; what an older version kept there moved into it."""
        store = getattr(daemon.peers, "store", None) or open_state(
            {"state": {"driver": "sqlite", "path": str(folder / "journal.db")}}
        )
        journal = Journal(store, prefix="journal:", owner=daemon.name)
        journal.register(
            f"bypass.block:{daemon.name}",
            Restorer(write=self._set_block, read=self._blocked, merge=_older_block),
        )
        journal.register(Acting.DENY, Restorer(write=self._set_denied))
        acting = Acting(journal, daemon.name)
        acting.adopt(folder / f"bypass.{daemon.name}.json")
        return acting

    def heartbeat(self) -> dict[str, Any]:
        """What this daemon's heartbeats carry: its grants (:meth:`BypassAudit.covered`) and
        the users its own audit blocked, until when (wall time), so that every daemon of the
        service refuses them: a bypasser must not take its tokens from a peer instead."""
        blocked = {
            user: float(held["until"])
            for user, held in self.acting.held.items()
            if held["action"] == "block" and not held.get("from")
        }
        return {**self.audit.covered(), "blocked": blocked}

    def audit_block(self, user: str) -> dict[str, Any] | None:
        """The audit's block of ``user`` in force (``until``, ``from`` a peer whose audit
        made it), None when there is none or the journal cannot be read."""
        try:
            held = self.acting.held.get(user)
        except StateError:
            return None
        return held if held and held["action"] == "block" else None

    def adopt_blocks(self, now: float | None = None) -> None:
        """Block here the users a peer's audit blocked (its heartbeat's ``blocked``) until
        the same time; :meth:`undo_due` lifts them then, as it lifts this daemon's own."""
        now = time.time() if now is None else now
        held = self.acting.users()
        for peer, grants in sorted(self.daemon.peers.peer_grants.items()):
            for user, until in sorted((grants.get("blocked") or {}).items()):
                if until <= now or user in held or self.exempt(user):
                    continue
                if not self.block(user, until, peer):
                    continue
                held.add(user)
                logger.warning(
                    "proxyd.bypass: {} blocked for {:g} s, as {}'s audit blocked it "
                    "(bypass.action block)",
                    user,
                    until - now,
                    peer,
                )

    # --- the actions' targets, as the journal sets them and reads them back

    def _blocked(self, user: str) -> str | None:
        """Who holds ``user``'s block: the id of the change that made it, "" for an operator
        (who also takes over a block by blocking the user again), None when not blocked."""
        return self.daemon.policy.blocklist.holder(BlockRule.make(users=[user]))

    def _set_block(self, user: str, by: Any) -> None:
        """Block ``user`` for the change ``by`` (True: a record of a version before blocks
        had holders), or lift the block (``by`` None or False)."""
        rule = BlockRule.make(users=[user])
        on = by is not None and by is not False
        if on:
            _added, decisions = self.daemon.policy.block(rule, by="" if by is True else str(by))
            for decision in decisions:
                self.daemon.tokens.deliver(decision)
        else:
            self.daemon.policy.unblock(rule)
        self.daemon.save_blocklist()
        if not on:
            logger.info("proxyd.bypass: {} unblocked, its `for` has passed", user)

    def _set_denied(self, user: str, on: Any) -> None:
        """Deny ``user`` through the scheduler, or admit it again (blocking: in a thread).

        :raises _Refused: the scheduler did not.
        """
        change = self.change(user, bool(on))
        if not change.ok:
            raise _Refused(change.message)
        if not on and change.changed:
            logger.info("proxyd.bypass: {}", change.message)

    def block(self, user: str, until: float, peer: str | None = None) -> bool:
        """Put ``user`` on this daemon's blocklist until ``until`` (wall time), journaled
        first; False when it is blocked already (an operator's block: theirs to lift)."""
        if self._blocked(user) is not None:
            return False
        intent: dict[str, Any] = {"user": user, "until": until}
        if peer:
            intent["from"] = peer
        change = self.acting.journal.begin(self.acting.block_kind, intent)
        # the block is held by this change: its undo lifts it only while it still holds it
        change.step(user, None, change.id, apply=lambda: self._set_block(user, change.id))
        change.commit(until=until)
        return True

    def deny(self, user: str, until: float) -> SchedulerChange:
        """Have the scheduler refuse ``user`` until ``until``, journaled first (blocking: in
        a thread). A denial refused half-way is undone at once (the scheduler puts back what
        it changed), or, when that fails too, at the next audit."""
        change = self.acting.journal.begin(Acting.DENY, {"user": user, "until": until})
        answers: list[SchedulerChange] = []

        def apply() -> None:
            answers.append(self.change(user, True))
            if not answers[-1].ok:
                raise _Refused(answers[-1].message)

        try:
            change.step(user, False, True, apply=apply)
        except _Refused:
            undone = change.undo()
            if not undone.ok:
                logger.error(
                    "proxyd.bypass: what the refused denial of {} changed is not put back yet: "
                    "{} (tried again at the next audit)",
                    user,
                    clip(undone.problem),
                )
            return answers[-1]
        change.commit(until=until)
        return answers[-1]

    def _granted(self, token: Token) -> None:
        self.audit.granted(token)
        self.trace.ledger.granted(token)

    def exempt(self, user: str) -> bool:
        """Never audited: the exempt, the daemon's own user, root, admins and privileged."""
        policy = self.daemon.policy
        return (
            user in self.settings.exempt
            or user == self.daemon.owner
            or policy.is_root_or_admin(user)
            or policy.is_privileged(user, "")
        )

    def reconfigure(self, settings: BypassSettings) -> None:
        """New interval, costs, tolerance, action (the scheduler plugin stays as loaded)."""
        self.settings = self.audit.settings = settings

    def read(self) -> SchedulerRPCs:
        """One reading through the hook (blocking: called in a thread)."""
        name = self.settings.plugin
        return ask(
            self.manager,
            "gridgate_scheduler_rpcs",
            lambda why: SchedulerRPCs(name, ok=False, message=why),
            scheduler=name,
            timeout=self.settings.timeout,
        )

    def change(self, user: str, deny: bool) -> SchedulerChange:
        name = self.settings.plugin
        return ask(
            self.manager,
            "gridgate_scheduler_deny",
            lambda why: SchedulerChange(name, ok=False, message=why),
            scheduler=name,
            user=user,
            deny=deny,
            timeout=self.settings.timeout,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Audit until ``stop`` is set."""
        logger.info(
            "proxyd.bypass: auditing {} every {:g} s (action {})",
            self.settings.scheduler,
            self.settings.interval,
            self.settings.action,
        )
        await self.trace.clean_start()
        told = ""
        while not stop.is_set():
            started = time.monotonic()
            self.adopt_blocks()
            await self.undo_due()
            reading = await asyncio.to_thread(self.read)
            if any(not cat.enabled for cat in self.daemon.policy.categories.values()):
                self.audit.disturb()
            findings = self.judge(reading)
            if self.audit.problem and self.audit.problem != told:
                logger.error(
                    "proxyd.bypass: cannot read {}'s counters: {}",
                    self.settings.scheduler,
                    clip(self.audit.problem),
                )
            told = self.audit.problem
            for finding in findings:
                await self.act(finding)
            left = self.settings.interval - (time.monotonic() - started)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(left, 0.05))
        await self.trace.finish(2 * self.settings.timeout + 5)

    def judge(self, reading: SchedulerRPCs) -> list[Finding]:
        """The audit of one reading, for the service: with ``proxyd.hosts`` only the first
        live daemon (by name) judges, adding the grants the others' heartbeats brought; the
        others keep a baseline, to take over when it stops."""
        peers = self.daemon.peers
        if not peers.active:
            return self.audit.observe(reading)
        live = peers.view.live()
        leader = min(live) if live else self.daemon.name
        if leader != self.daemon.name:
            self.audit.follow(reading, f"audited by {leader}, the first live daemon")
            return []
        others = [n for n in live if n != self.daemon.name]
        missing = [n for n in others if n not in peers.peer_grants]
        if missing:
            self.audit.follow(reading, f"waiting for the first grants of {', '.join(missing)}")
            return []
        return self.audit.observe(reading, {n: peers.peer_grants[n] for n in others})

    async def act(self, finding: Finding) -> None:
        line = finding.describe(self.settings.interval)
        diagnostics = self.daemon.diagnostics
        if diagnostics.on:
            diagnostics.write(bypass_line(finding))
        if finding.windows == self.settings.notify_after:
            logger.error("proxyd.bypass: {}: going around the gate", line)
            if self.notifiers is not None:
                await self.notifiers.notify(self.notification(finding))
        else:
            logger.warning("proxyd.bypass: {}", line)
        action = self.settings.action
        if action == "report" or finding.user in self.acting.users():
            return
        until = time.time() + self.settings.hold
        try:
            if action == "block":
                if not self.block(finding.user, until):
                    logger.debug("proxyd.bypass: {} is on the blocklist already", finding.user)
                    return
                logger.warning(
                    "proxyd.bypass: {} blocked for {:g} s (bypass.action block)",
                    finding.user,
                    self.settings.hold,
                )
                return
            change = await asyncio.to_thread(self.deny, finding.user, until)
        except StateError as exc:
            logger.error("proxyd.bypass: {} not acted on: the journal: {}", finding.user, exc)
            return
        if not change.ok:
            logger.error(
                "proxyd.bypass: {} could not be denied by {}: {}",
                finding.user,
                self.settings.scheduler,
                clip(change.message),
            )
            return
        logger.warning(
            "proxyd.bypass: {} for {:g} s (bypass.action deny_partition)",
            change.message,
            self.settings.hold,
        )

    def notification(self, finding: Finding) -> Notification:
        """The error people get when ``finding``'s user went around the gate for
        ``notify_after`` windows in a row."""
        action = {
            "report": "It is reported only (proxyd.bypass.action: report).",
            "block": f"It is put on the blocklist of every daemon of the service for "
            f"{self.settings.hold:g} s.",
            "deny_partition": f"It is taken out of the {self.settings.scheduler} partitions for "
            f"{self.settings.hold:g} s (new jobs refused).",
        }[self.settings.action]
        user = printable(finding.user, newlines=False)
        body = (
            f"{printable(finding.describe(self.settings.interval))}.\n\n"
            f"{action}\n\nThe scheduler's counters ({self.settings.scheduler}) are compared "
            f"every {self.settings.interval:g} s with the tokens lsfproxyd {self.daemon.name} "
            "gave the user; `gridgate lsfproxyd status --json` shows the audit (bypass), and "
            "`gridgate lsfproxyd diagnose on -c bypass` logs each request for a while."
        )
        return Notification(
            level="error",
            subject=f"lsfproxyd {self.daemon.name}: {user} goes around the gate",
            body=body,
            created=time.time(),
            key=f"proxyd.bypass:{self.daemon.name}:{finding.user}",
        )

    async def undo_due(self) -> None:
        """Undo the blocks and denials whose ``for`` has passed, those whose undo failed
        before, and those a killed daemon left half-made (once their lease passed)."""
        journal = self.acting.journal
        try:
            undone = journal.undo_pending(kinds={self.acting.block_kind})
            undone += await asyncio.to_thread(journal.undo_pending, {Acting.DENY})
        except StateError as exc:
            logger.error("proxyd.bypass: the journal cannot be read: {}", exc)
            return
        await self.trace.retry_off()
        for done in undone:
            if done.problem:
                logger.error(
                    "proxyd.bypass: {} could not be admitted again: {} (tried again at the "
                    "next audit)",
                    done.entry.intent.get("user"),
                    clip(done.problem),
                )

    def status(self) -> dict[str, Any]:
        return {
            "scheduler": self.settings.scheduler,
            "action": self.settings.action,
            "interval": self.settings.interval,
            **self.audit.status(),
            "acting": {u: dict(v) for u, v in self.acting.held.items()},
            "trace": self.trace.status(),
        }
