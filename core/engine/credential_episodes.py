"""Credential episodes: before anything is polled or submitted, every credential plugin checks
(and renews) its credential; the backends that need one that is unusable are paused for the
iteration, and people hear of each episode once of all the directors on one store: an error
when it becomes unusable, an alarm once it lasts ``ticket_expiry`` (again every
``failing_expiry``), a notice when it works again, a warning once per end time when at risk.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from loguru import logger

from gridgate.core.credential_names import CredentialChoice
from gridgate.core.engine.compose import CREDENTIAL, compose_credential
from gridgate.core.engine.failure import FailurePath
from gridgate.core.engine.pilot_credentials import configured_kinds
from gridgate.core.engine.records import CredentialEpisode, read_record
from gridgate.core.engine.runtime import EPISODES, Iteration, Runtime
from gridgate.core.model import (
    BackendInfo,
    CredentialRegistry,
    CredentialStatus,
    DemandRegistry,
    Notification,
)
from gridgate.core.state import StateError

__all__ = ["CredentialEpisodes"]


#: The last status of each credential (by name): ``gridgate servers show`` reads it.
STATUS = f"{CREDENTIAL}status/"
#: Which endpoints and groups wait for which credential, as the last check found:
#: ``{"time": T, "waits": {ENDPOINT_KEY: {"endpoint": [NAME], "groups": {GROUP: [NAME]}}}}``.
WAITS = f"{CREDENTIAL}waits"


class CredentialEpisodes:
    """The credential check of each iteration, given the director's runtime and failure path."""

    def __init__(self, runtime: Runtime, failures: FailurePath) -> None:
        self.runtime = runtime
        self.failures = failures
        #: what was last written under WAITS, and when
        self._waits_kept: tuple[str, float] = ("", float("-inf"))

    def check(self, it: Iteration, demand: DemandRegistry) -> None:
        """Ask every credential plugin to check (and renew) its credential, pause the backends
        that need one that is unusable, and tell people about the episodes."""
        registry = CredentialRegistry()
        try:
            self.runtime.pm.hook.gridgate_check_credentials(
                iteration=it.info,
                timeout=self.runtime.settings.command_timeout,
                credentials=registry,
            )
        except Exception as exc:  # a plugin bug: no credential is vouched for
            logger.opt(exception=exc).error(
                "the credential check crashed in a plugin: backends that "
                "need a credential submit nothing this iteration"
            )
            it.credential_crash = f"{type(exc).__name__}: {exc}"
        it.credentials = registry.statuses
        named: dict[str, CredentialStatus] = {}
        for status in it.credentials:  # each credential on its own, by its name
            named.setdefault(status.name, status)
        it.unusable = {name: status for name, status in named.items() if not status.usable}
        it.choice = CredentialChoice.from_config(self.runtime.config, self._kinds(named))
        infos: dict[str, BackendInfo] = {}
        if it.unusable or it.credential_crash or any(s.at_risk for s in it.credentials):
            infos = self._known_backends(demand)
        users = {name: _users(infos, it.choice, demand, name) for name in named}
        it.credential_users = {name: tuple(users[name]) for name in it.unusable}
        for name, status in it.unusable.items():
            logger.error(
                "{}: the backends, endpoints and groups that use {} submit nothing this iteration ({})",
                status.message,
                name,
                ", ".join(users[name]) or "nothing configured uses it",
            )
        for status in it.credentials:  # the one line of each credential's news, whoever checked
            if status.usable and status.renewed:
                logger.info("{}", status.message)
            elif status.usable and status.renewal_due:
                logger.warning("{}", status.message)
        self._keep_statuses(named.values())
        self._keep_waits(it, infos, demand)
        for name, status in named.items():
            try:
                self._credential_episode(status, it, users[name])
            except StateError as exc:
                logger.error(
                    "credential episode of {} not recorded, state store failed: {}",
                    status.name,
                    exc,
                )

    def _kinds(self, named: Mapping[str, CredentialStatus]) -> dict[str, str]:
        """Each credential's kind by name, in config order (the first of a kind is the one
        used where nothing names one), then those reported by plugins the config does not
        name (an embedding program's)."""
        kinds = configured_kinds(self.runtime)
        for name, status in named.items():
            kinds.setdefault(name, status.kind)
        return kinds

    def _keep_statuses(self, statuses: Iterable[CredentialStatus]) -> None:
        """What each credential (by name) was at this check, for ``gridgate servers show`` (read
        from another process): kept while the failing and tickets caches would be."""
        director = self.runtime.settings
        ttl = director.failing_expiry + director.ticket_expiry
        now = self.runtime.clock.time()
        for status in statuses:
            record = {
                "name": status.name,
                "kind": status.kind,
                "usable": status.usable,
                "path": status.path,
                "expires": status.expires,
                "message": status.message,
                "time": now,
            }
            try:
                self.runtime.state.set(f"{STATUS}{status.name}", json.dumps(record), ttl=ttl)
            except StateError as exc:
                logger.error("credential status of {} not kept: {}", status.name, exc)
                return

    def _keep_waits(
        self, it: Iteration, infos: Mapping[str, BackendInfo], demand: DemandRegistry
    ) -> None:
        """Which endpoints (and which of their demand groups) wait for which unusable
        credential this iteration, for ``gridgate servers list/show`` (read from another
        process, which cannot ask an in-process backend what it needs): one record, written
        at every check (an empty one when nothing waits)."""
        waits: dict[str, dict[str, Any]] = {}
        for backend, info in infos.items():
            # a group naming no credential of its own waits as its endpoint does: said once
            groups = {
                (r.group, r.credential)
                for r in demand.requests
                if r.backend == backend and r.credential
            }
            for endpoint in info.endpoints:
                own = it.waits_for(info, endpoint)
                by_group = {
                    group: names
                    for group, credential in sorted(groups)
                    if (names := it.waits_for(info, endpoint, credential))
                }
                if own or by_group:
                    waits[endpoint.key] = {"endpoint": own, "groups": by_group}
        director, now = self.runtime.settings, self.runtime.clock.time()
        ttl = director.failing_expiry + director.ticket_expiry
        said = json.dumps(waits, sort_keys=True)
        last, when = self._waits_kept
        if said == last and now - when < ttl / 2:
            return  # a write per change (and before the record would expire), not per iteration
        try:
            self.runtime.state.set(WAITS, json.dumps({"time": now, "waits": waits}), ttl=ttl)
        except StateError as exc:
            logger.error("which endpoints wait for a credential not kept: {}", exc)
            return
        self._waits_kept = (said, now)

    def _episode(self, status: CredentialStatus, state: str, now: float) -> None:
        """A row of the episodes table for `gridgate report` (once per episode's start and
        end, of all the directors: the callers hold the episode's claim)."""
        self.runtime.state.append_record(
            EPISODES,
            {
                "time": now,
                "what": "credential",
                "subject": f"{status.kind} {status.path}",
                "state": state,
                "source": status.name,
                "reason": status.message,
            },
        )

    def _known_backends(self, demand: DemandRegistry) -> dict[str, BackendInfo]:
        """The configured backends and those the demand asks for, with what they say of themselves."""
        names = dict.fromkeys(
            [*(self.runtime.config.get("backends") or {}), *(r.backend for r in demand.requests)]
        )
        infos = {name: self.runtime.pm.hook.gridgate_backend_info(backend=name) for name in names}
        return {name: info for name, info in infos.items() if info is not None}

    def _credential_episode(
        self, status: CredentialStatus, it: Iteration, backends: list[str]
    ) -> None:
        """One error when a credential becomes unusable (of all the directors on this store), an
        alarm once the episode lasts ``ticket_expiry`` (again every ``failing_expiry``), one
        notice when it works again; an at-risk warning once per credential end time."""
        state, now = self.runtime.state, self.runtime.clock.time()
        failing_expiry = self.runtime.settings.failing_expiry
        ticket_expiry = self.runtime.settings.ticket_expiry
        window = failing_expiry + ticket_expiry
        scope = f"{status.name}:{status.path}"
        episode_key = f"{CREDENTIAL}episode/{scope}"
        host = socket.gethostname()
        notes: list[Notification] = []
        if not status.usable:
            episode = json.dumps({"since": now, "backends": backends})
            opened = state.add_if_absent(episode_key, episode, ttl=window)
            since = now
            if not opened:
                episode = state.get(episode_key) or episode
                held = read_record(episode, CredentialEpisode, f"credential episode {scope}")
                since = now if held is None else held.since
                state.set(episode_key, episode, ttl=window)
            # while any host finds it unusable the episode stays open (expires if that host stops)
            state.set(f"{CREDENTIAL}bad/{scope}/{host}", f"{now:.3f}", ttl=failing_expiry)
            if opened:
                self._episode(status, "unusable", now)
                notes.append(
                    compose_credential(
                        status, "error", since, now, backends, ticket_expiry, failing_expiry, host
                    )
                )
            lasted = now - since
            if lasted >= ticket_expiry:
                repeat = int((lasted - ticket_expiry) // failing_expiry)
                if state.add_if_absent(
                    f"{CREDENTIAL}note/{scope}/{since:.3f}/alarm/{repeat}", "1", ttl=window
                ):
                    notes.append(
                        compose_credential(
                            status,
                            "alarm",
                            since,
                            now,
                            backends,
                            ticket_expiry,
                            failing_expiry,
                            host,
                        )
                    )
        else:
            state.delete(f"{CREDENTIAL}bad/{scope}/{host}")
            raw = state.get(episode_key)
            if raw is not None and not state.items(f"{CREDENTIAL}bad/{scope}/"):
                held = read_record(raw, CredentialEpisode, f"credential episode {scope}")
                since = now if held is None else held.since
                if state.add_if_absent(
                    f"{CREDENTIAL}note/{scope}/{since:.3f}/resolved", "1", ttl=window
                ):
                    state.delete(episode_key)
                    self._episode(status, "usable", now)
                    paused = [] if held is None else held.backends
                    notes.append(
                        compose_credential(
                            status,
                            "info",
                            since,
                            now,
                            backends or paused,
                            ticket_expiry,
                            failing_expiry,
                            host,
                        )
                    )
            if status.at_risk and status.expires is not None:
                key = f"{CREDENTIAL}warning/{scope}/{status.expires:.0f}"
                if state.add_if_absent(
                    key, f"{now:.3f}", ttl=max(0.0, status.expires - now) + window
                ):
                    notes.append(
                        compose_credential(
                            status,
                            "warning",
                            now,
                            now,
                            backends,
                            ticket_expiry,
                            failing_expiry,
                            host,
                        )
                    )
        for note in notes:
            self.failures.tell(it, self._logged(note, status))

    @staticmethod
    def _logged(note: Notification, status: CredentialStatus) -> Notification:
        """``note`` marked as logged when :meth:`check` wrote its event in this iteration's
        line: the error (unusable), the warning (renewal due), the notice after a renewal. An
        alarm is news of its own, and a credential that works again without a renewal (a file
        put back by hand) has no other line."""
        logged = {
            "error": True,
            "warning": status.renewal_due,
            "info": status.renewed,
        }.get(note.level, False)
        return replace(note, logged=logged)


def _users(
    infos: Mapping[str, BackendInfo],
    choice: CredentialChoice,
    demand: DemandRegistry,
    name: str,
) -> list[str]:
    """What uses the credential ``name``: a backend (``arc``) when it does wherever no endpoint
    or group names another, else its endpoints (``arc/ce1``) and groups (``arc group atlas``)
    that do."""
    found: list[str] = []
    for backend, info in sorted(infos.items()):
        if name in choice.names(backend, info.credentials).values():
            found.append(backend)
            continue
        found.extend(
            e.key
            for e in info.endpoints
            if name in choice.names(backend, info.credentials, e.name).values()
        )
        groups = {(r.group, r.credential) for r in demand.requests if r.backend == backend}
        for group, credential in sorted(groups):
            if (
                credential
                and name in choice.names(backend, info.credentials, None, credential).values()
            ):
                found.append(f"{backend} group {group}")
    return found
