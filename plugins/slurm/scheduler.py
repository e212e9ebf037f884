"""Slurm's controller as the token daemon sees it: ``sdiag``'s counts of the RPCs it served (per
user and per request type, with their times, and its own thread count and agent queue), and a
user taken out of the partitions' ``AllowGroups`` and put back (the only refusal slurmctld 22.05
enforces itself, for submissions).

The ``gridgate.schedulers`` entry point ``slurm``; the daemon loads it for ``proxyd.bypass`` and
``proxyd.adaptive`` (docs/proxyd.md, "Who went around the gate"). ``sdiag`` is readable by any
user; changing a partition needs Slurm's operator rights (root or SlurmUser).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import grp
import os
import pwd
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import msgspec
from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.backend import commands_schema, env_schema
from gridgate.core.documents import DocumentError
from gridgate.core.files import InputFileError, atomic_write, file_problem, read_regular
from gridgate.core.journal import Journal, Restorer, Step
from gridgate.core.model import CommandResult
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.runner import run
from gridgate.core.scheduler import SchedulerChange, SchedulerRequests, SchedulerRPCs
from gridgate.core.settings import Settings
from gridgate.core.state import StateError, StateStore, open_state
from gridgate.plugins.slurm.classify import clip
from gridgate.plugins.slurm.documents import (
    OldDenial,
    SlurmConfig,
    TraceCursor,
    old_denials,
    parse_protocol_lines,
    parse_sdiag,
    partition_groups,
    slurm_config,
    trace_cursor,
)

__all__ = ["SlurmScheduler", "parse_protocol_lines", "parse_sdiag"]

#: The most of slurmctld's log read at one call (the rest is read at the next).
TRACE_READ_BYTES = 8 << 20


def _groups_of(user: str) -> list[str]:
    entry = pwd.getpwnam(user)
    names = []
    for gid in os.getgrouplist(user, entry.pw_gid):
        try:
            names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return names


def _sharing(user: str, groups: Sequence[str]) -> list[str]:
    """The other users who are in one of ``groups`` (as members or by their primary group)."""
    gids = {grp.getgrnam(g).gr_gid: g for g in groups}
    others = {p.pw_name for p in pwd.getpwall() if p.pw_gid in gids}
    for name in groups:
        others.update(grp.getgrnam(name).gr_mem)
    others.discard(user)
    return sorted(others)


@dataclass(frozen=True)
class SlurmCommands(Settings):
    """The Slurm commands the scheduler plugin runs (names on PATH or paths)."""

    sdiag: str
    scontrol: str


@dataclass(frozen=True)
class SlurmSchedulerSettings(Settings):
    """The scheduler plugin's section (``proxyd.bypass.scheduler_options``)."""

    commands: SlurmCommands
    env: Mapping[str, str]
    partitions: tuple[str, ...]
    allow_shared_groups: bool


class SlurmScheduler(Plugin):
    """sdiag's RPC counters, and ``AllowGroups`` changes, for one Slurm cluster."""

    name = "slurm"
    settings_class = SlurmSchedulerSettings
    settings: SlurmSchedulerSettings
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "description": "The Slurm controller the token daemon audits and paces.",
        "properties": {
            "commands": commands_schema(
                "Names (looked up on PATH) or paths of the Slurm commands.",
                (("sdiag", "statistics"), ("scontrol", "partition")),
            ),
            "env": env_schema("Extra environment variables for the commands (SLURM_CONF)."),
            "partitions": {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "default": [],
                "description": "deny_partition: the partitions a bypasser is taken out of "
                "(default: every partition).",
            },
            "allow_shared_groups": {
                "type": "boolean",
                "default": False,
                "description": "deny_partition works on groups: refuse a user whose groups "
                "other users share (they would be refused too) unless this is true.",
            },
        },
        "additionalProperties": False,
    }

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        commands = self.settings.commands
        self._commands = {"sdiag": commands.sdiag, "scontrol": commands.scontrol}
        self._env = {**os.environ, **self.settings.env}
        self._journal: Journal | None = None
        self._trace_journal: Journal | None = None

    @property
    def trace_file(self) -> Path:
        """Where the request trace in force reads slurmctld's log from: the log, its inode and
        how far it was read (whether DebugFlags had Protocol before is in the journal)."""
        return Path(self.context.state_dir) / f"trace.{self.name}.json"

    @property
    def denied_file(self) -> Path:
        """Where versions before the journal kept what deny changed: read once, into it."""
        return Path(self.context.state_dir) / f"denied.{self.name}.json"

    @property
    def deny_kind(self) -> str:
        """The journal's kind of a denial: partition -> its AllowGroups, exactly as shown."""
        return f"{self.name}.allow_groups"

    @property
    def trace_kind(self) -> str:
        """The journal's kind of a request trace: ``DebugFlags`` -> whether it has Protocol."""
        return f"{self.name}.debug_flags"

    def journal(self, timeout: float) -> Journal:
        """The journal of the denials this plugin made: in the context's state store (the one
        the token daemons of a service share, so that the daemon that undoes a denial need not
        be the one that made it), else in ``journal.db`` in the state folder; the restorers'
        commands are killed at ``timeout``. Made at the first use, when the record files of
        versions before it are moved into it, and every use first undoes what is due (a failed
        undo, a change whose daemon was killed half-way)."""
        if self._journal is None:
            self._journal = self._open_journal(self.context.state, timeout)
            self._migrate_denials(self._journal)
        return self._pending_undone(self._journal, timeout)

    def trace_journal(self, timeout: float) -> Journal:
        """The journal of the request trace this daemon switched on: always in ``journal.db``
        in the state folder, never shared: a daemon that starts ends the trace a killed
        predecessor left on, which on a shared journal would end a live peer's window."""
        if self._trace_journal is None:
            self._trace_journal = self._open_journal(None, timeout)
            self._migrate_trace(self._trace_journal)
        return self._pending_undone(self._trace_journal, timeout)

    def _open_journal(self, store: StateStore | None, timeout: float) -> Journal:
        if store is None:
            path = Path(self.context.state_dir) / "journal.db"
            store = open_state({"state": {"driver": "sqlite", "path": str(path)}})
        journal = Journal(store)
        self._register(journal, timeout)
        return journal

    def _pending_undone(self, journal: Journal, timeout: float) -> Journal:
        self._register(journal, timeout)
        for undone in journal.undo_pending():
            if undone.ok:
                logger.warning(
                    "slurm scheduler: {} {} undone (its undo had failed, or its daemon was "
                    "killed while making it)",
                    undone.entry.kind,
                    undone.entry.id,
                )
        return journal

    def _register(self, journal: Journal, timeout: float) -> None:
        journal.register(
            self.deny_kind,
            Restorer(
                write=lambda partition, groups: self._apply(partition, str(groups), timeout),
                read=lambda partition: self._allowed(partition, timeout),
                merge=_add_back,
            ),
        )
        journal.register(
            self.trace_kind,
            Restorer(
                write=lambda _flags, on: self._apply_flag("+" if on else "-", timeout),
                read=lambda _flags: self._has_protocol(timeout),
            ),
        )

    def _run(self, which: str, args: Sequence[str], timeout: float) -> CommandResult:
        argv = [self._commands.get(which) or which, *args]
        return run(argv, timeout, env=self._env, max_output=self.context.max_output_bytes)

    @hookimpl
    def gridgate_scheduler_rpcs(self, scheduler: str, timeout: float) -> SchedulerRPCs | None:
        if scheduler != self.name:
            return None
        result = self._run("sdiag", [], timeout)
        if not result.ok:
            detail = clip(result.stderr.strip() or result.stdout.strip())
            return SchedulerRPCs(
                self.name, ok=False, message=f"sdiag {result.describe()}: {detail}", command=result
            )
        return replace(parse_sdiag(result.stdout), command=result)

    # --- deny_partition ---------------------------------------------------------------------

    def _partitions(self, timeout: float) -> dict[str, str] | str:
        """Partition -> its AllowGroups, or what went wrong."""
        shown = self._run("scontrol", ["-o", "show", "partition"], timeout)
        if not shown.ok:
            return f"scontrol show partition {shown.describe()}: {clip(shown.stderr.strip())}"
        found = partition_groups(shown.stdout)
        chosen = self.settings.partitions or list(found)
        missing = [p for p in chosen if p not in found]
        if missing:
            return f"no such partition: {', '.join(missing)}"
        return {p: found[p] for p in chosen}

    def _allowed(self, partition: str, timeout: float) -> str | None:
        """The AllowGroups of ``partition`` now, None when it is gone.

        :raises OSError: scontrol failed otherwise.
        """
        shown = self._run("scontrol", ["-o", "show", "partition", partition], timeout)
        if not shown.ok:
            if "not found" in shown.stderr.lower():
                return None
            raise OSError(
                f"scontrol show partition {partition} {shown.describe()}: {clip(shown.stderr.strip())}"
            )
        return partition_groups(shown.stdout).get(partition)

    def _apply(self, partition: str, groups: str, timeout: float) -> None:
        """Set the AllowGroups of ``partition``. :raises OSError: scontrol refused."""
        done = self._run(
            "scontrol", ["update", f"PartitionName={partition}", f"AllowGroups={groups}"], timeout
        )
        if not done.ok:
            raise OSError(
                f"scontrol update {partition} {done.describe()}: {clip(done.stderr.strip())}"
            )

    @hookimpl
    def gridgate_scheduler_deny(
        self, scheduler: str, user: str, deny: bool, timeout: float
    ) -> SchedulerChange | None:
        if scheduler != self.name:
            return None
        try:
            return self._deny(user, timeout) if deny else self._admit(user, timeout)
        except (KeyError, OSError, ValueError, StateError) as exc:
            return SchedulerChange(self.name, ok=False, message=f"{user}: {exc}")

    def _deny(self, user: str, timeout: float) -> SchedulerChange:
        groups = _groups_of(user)
        shared = _sharing(user, groups)
        if shared and not self.settings.allow_shared_groups:
            return SchedulerChange(
                self.name,
                ok=False,
                message=f"{user}'s groups ({', '.join(groups)}) are shared with "
                f"{', '.join(shared)}, who would be refused too "
                "(bypass.scheduler_options.allow_shared_groups)",
            )
        journal = self.journal(timeout)
        partitions = self._partitions(timeout)
        if isinstance(partitions, str):
            return SchedulerChange(self.name, ok=False, message=partitions)
        # a partition open to ALL is left as it is: narrowing it would write out every group
        # (getgrall(): remote groups missing on a site without enumeration, later ones refused)
        unlisted = [p for p, allowed in partitions.items() if allowed.upper() == "ALL"]
        listed = {p: a for p, a in partitions.items() if p not in unlisted}
        if not listed:
            return SchedulerChange(
                self.name,
                ok=False,
                message=f"{user}: {', '.join(unlisted)} allow ALL groups: a denial takes groups "
                "out of an AllowGroups list, and writing every group out is not one "
                "(docs/proxyd-limits.md, 'What Slurm enforces')",
            )
        change = journal.begin(self.deny_kind, {"user": user, "groups": groups})
        changed: list[str] = []
        try:
            for partition, allowed in listed.items():
                before = allowed.split(",")
                after = [g for g in before if g not in groups]
                if after == before:
                    continue
                if not after:
                    raise OSError(f"{partition}: {user}'s groups are all it allows")
                narrowed = ",".join(after)
                change.step(
                    partition,
                    allowed,
                    narrowed,
                    apply=functools.partial(self._apply, partition, narrowed, timeout),
                )
                changed.append(partition)
        except OSError as exc:
            return self._failed(change.undo().problem, str(exc), changed)
        if not changed:
            change.undo()  # nothing to keep
        else:
            change.commit()
        note = f" (also refused: {', '.join(shared)})" if shared else ""
        if unlisted:
            note += f" ({', '.join(unlisted)}: ALL groups, left as they are)"
        return SchedulerChange(
            self.name,
            ok=True,
            message=f"{user} taken out of AllowGroups of {', '.join(changed) or 'no partition'}"
            + note,
            changed=tuple(changed),
        )

    def _failed(self, undo_problem: str, problem: str, changed: list[str]) -> SchedulerChange:
        """A denial that failed half-way: what was changed is put back (or kept in the journal
        to be put back at the next call, when that failed too)."""
        if not changed:
            return SchedulerChange(self.name, ok=False, message=problem)
        if not undo_problem:
            return SchedulerChange(
                self.name,
                ok=False,
                message=f"{problem} (AllowGroups of {', '.join(changed)} put back)",
            )
        return SchedulerChange(
            self.name,
            ok=False,
            message=f"{problem}; putting back {', '.join(changed)} failed: {undo_problem} "
            "(tried again at the next call)",
            changed=tuple(changed),
        )

    def _admit(self, user: str, timeout: float) -> SchedulerChange:
        journal = self.journal(timeout)
        mine = [e for e in journal.changes(self.deny_kind) if e.intent.get("user") == user]
        if not mine:
            return SchedulerChange(self.name, ok=True, message=f"{user} was not denied here")
        changed: list[str] = []
        for entry in reversed(mine):  # the latest denial first: each restores what it found
            undone = journal.undo(entry)
            changed.extend(undone.restored)
            if not undone.ok:
                why = undone.problem or "another daemon is putting it back"
                return SchedulerChange(self.name, ok=False, message=why, changed=tuple(changed))
        return SchedulerChange(
            self.name,
            ok=True,
            message=f"{user} put back in AllowGroups of {', '.join(changed) or 'no partition'}",
            changed=tuple(changed),
        )

    def _migrate_denials(self, journal: Journal) -> None:
        """Move the denials file of versions before the journal into it, once: a denial in
        force during the upgrade is put back as it would have been."""
        for user, partitions in self._old_denials().items():
            removed = {g for r in partitions.values() for g in r.removed}
            change = journal.begin(self.deny_kind, {"user": user, "groups": sorted(removed)})
            for partition, record in partitions.items():
                change.step(partition, record.before, record.set, apply=_made)
            change.commit()
            logger.info(
                "slurm scheduler: {}'s denial moved from {} into the journal",
                user,
                self.denied_file,
            )
        if self.denied_file.is_file():  # a FIFO or a folder there is not this plugin's
            self.denied_file.unlink()

    def _migrate_trace(self, journal: Journal) -> None:
        """Move the trace in force that versions before the journal recorded into it."""
        trace = self._trace_record()
        if trace is not None and trace.had_protocol is not None:
            change = journal.begin(self.trace_kind, {"log": trace.log})
            if not trace.had_protocol:
                change.step("DebugFlags", False, True, apply=_made)
            change.commit()
            moved = msgspec.structs.replace(trace, had_protocol=None)
            atomic_write(self.trace_file, msgspec.json.encode(moved))
            logger.info(
                "slurm scheduler: the trace in force moved from {} into the journal",
                self.trace_file,
            )

    def _old_denials(self) -> dict[str, dict[str, OldDenial]]:
        text = _record(self.denied_file)
        try:
            return old_denials(text) if text is not None else {}
        except DocumentError as exc:
            logger.error("slurm scheduler: {} is not a record: {}", self.denied_file, exc)
            return {}

    # --- the request trace (diagnose -c bypass) ---------------------------------------------

    def _config(self, timeout: float) -> SlurmConfig | str:
        shown = self._run("scontrol", ["show", "config"], timeout)
        if not shown.ok:
            return f"scontrol show config {shown.describe()}: {clip(shown.stderr.strip())}"
        return slurm_config(shown.stdout)

    def _trace_record(self) -> TraceCursor | None:
        text = _record(self.trace_file)
        try:
            return trace_cursor(text) if text is not None else None
        except DocumentError as exc:
            logger.error("slurm scheduler: {} is not a record: {}", self.trace_file, exc)
            return None

    @hookimpl
    def gridgate_scheduler_trace(
        self, scheduler: str, on: bool, timeout: float
    ) -> SchedulerChange | None:
        if scheduler != self.name:
            return None
        try:
            return self._trace_on(timeout) if on else self._trace_off(timeout)
        except (OSError, StateError) as exc:
            return SchedulerChange(self.name, ok=False, message=f"trace: {exc}")

    def _protocol_flag(self, sign: str, timeout: float) -> str:
        """``scontrol setdebugflags +protocol`` (or ``-``); what went wrong, "" when done."""
        done = self._run("scontrol", ["setdebugflags", f"{sign}protocol"], timeout)
        if done.ok:
            return ""
        return (
            f"scontrol setdebugflags {sign}protocol {done.describe()}: {clip(done.stderr.strip())}"
        )

    def _apply_flag(self, sign: str, timeout: float) -> None:
        """:meth:`_protocol_flag`. :raises OSError: scontrol refused."""
        problem = self._protocol_flag(sign, timeout)
        if problem:
            raise OSError(problem)

    def _has_protocol(self, timeout: float) -> bool:
        """Whether slurmctld's DebugFlags have Protocol now. :raises OSError: not read."""
        config = self._config(timeout)
        if isinstance(config, str):
            raise OSError(config)
        return "protocol" in config.debug_flags

    def _trace_on(self, timeout: float) -> SchedulerChange:
        config = self._config(timeout)
        if isinstance(config, str):
            return SchedulerChange(self.name, ok=False, message=config)
        log = config.log_file
        if not log:
            return SchedulerChange(
                self.name,
                ok=False,
                message="SlurmctldLogFile is not set (slurmctld logs to syslog): the "
                "request trace is read from that file",
            )
        journal = self.trace_journal(timeout)
        flagged = "protocol" in config.debug_flags
        on = journal.changes(self.trace_kind)
        if on:
            had_protocol = not any(e.steps for e in on)
            if not flagged:  # lost meanwhile (slurmctld restarted): on again
                problem = self._protocol_flag("+", timeout)
                if problem:
                    return SchedulerChange(self.name, ok=False, message=problem)
        else:
            try:
                info = os.stat(log)
            except OSError as exc:
                return SchedulerChange(self.name, ok=False, message=f"{log}: {exc.strerror}")
            change = journal.begin(self.trace_kind, {"log": log})
            had_protocol = flagged
            if not flagged:
                try:
                    change.step(
                        "DebugFlags", False, True, apply=lambda: self._apply_flag("+", timeout)
                    )
                except OSError as exc:
                    change.undo()
                    return SchedulerChange(self.name, ok=False, message=str(exc))
            change.commit()
            cursor = TraceCursor(log, info.st_ino, info.st_size)
            self.trace_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.trace_file, msgspec.json.encode(cursor))
        return SchedulerChange(
            self.name,
            ok=True,
            message=f"slurmctld logs every request to {log}"
            + (" (DebugFlags had Protocol already)" if had_protocol else ""),
            changed=() if had_protocol else ("DebugFlags",),
        )

    def _trace_off(self, timeout: float) -> SchedulerChange:
        journal = self.trace_journal(timeout)
        on = journal.changes(self.trace_kind)
        if not on:
            self.trace_file.unlink(missing_ok=True)
            return SchedulerChange(self.name, ok=True, message="no request trace was on")
        had_protocol = not any(e.steps for e in on)
        for entry in reversed(on):
            undone = journal.undo(entry)
            if not undone.ok:
                why = undone.problem or "another daemon is switching it off"
                return SchedulerChange(self.name, ok=False, message=why)
        self.trace_file.unlink(missing_ok=True)
        return SchedulerChange(
            self.name,
            ok=True,
            message="slurmctld's request log is off again"
            if not had_protocol
            else "DebugFlags keep Protocol, as before the trace",
            changed=() if had_protocol else ("DebugFlags",),
        )

    @hookimpl
    def gridgate_scheduler_requests(
        self, scheduler: str, timeout: float
    ) -> SchedulerRequests | None:
        if scheduler != self.name:
            return None
        record = self._trace_record()
        if record is None:
            return SchedulerRequests(self.name, ok=False, message="no request trace is on")
        try:
            text, record = _read_on(record)
        except OSError as exc:
            return SchedulerRequests(self.name, ok=False, message=f"{record.log}: {exc}")
        atomic_write(self.trace_file, msgspec.json.encode(record))
        return SchedulerRequests(self.name, ok=True, requests=tuple(parse_protocol_lines(text)))


#: The largest record file this plugin keeps (what deny changed, the trace in force).
RECORD_BYTES = 1 << 20


def _record(path: Path) -> bytes | None:
    """A record file this plugin wrote: None when there is none, or when what is there is not
    one (a link, a FIFO, another owner's file, too large: told once here)."""
    try:
        return read_regular(
            path, max_bytes=RECORD_BYTES, owners={0, os.geteuid()}, follow_links=False
        )
    except InputFileError as exc:
        if exc.errno != errno.ENOENT:
            logger.error("slurm scheduler: {} not read: {}", path, exc)
        return None


def _read_on(record: TraceCursor) -> tuple[str, TraceCursor]:
    """The whole lines appended to the log since ``record``'s offset (from its start when it
    was rotated: another inode, or shorter), and the record moved past them.

    :raises OSError: the log cannot be opened, or is not a regular file.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(record.log, flags)
    try:
        info = os.fstat(fd)
        problem = file_problem(info)
        if problem is not None:
            raise OSError(f"the log {problem}")
        offset = record.offset
        if info.st_ino != record.inode or info.st_size < offset:
            offset = 0  # rotated: the new file from its start
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, TRACE_READ_BYTES)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    whole = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
    moved = msgspec.structs.replace(record, inode=info.st_ino, offset=offset + len(whole))
    return whole.decode("utf-8", "replace"), moved


def _made() -> None:
    """A step moved from an older record: made already."""


def _add_back(step: Step, now: Any, intent: Mapping[str, Any]) -> Any:
    """The AllowGroups to put back where a partition was changed since the denial (by an
    operator, another denial): the groups it took out added back to what is there now, or
    left as it is when it is gone or allows every group."""
    if not isinstance(now, str) or now.upper() == "ALL":
        return now
    current = now.split(",")
    removed = [str(g) for g in intent.get("groups") or []]
    return ",".join(current + [g for g in removed if g not in current])
