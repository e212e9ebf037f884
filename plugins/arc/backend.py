"""The ARC CE backend: pilots to ARC CEs over A-REX's REST interface (``interface: rest``,
the default: :class:`.rest.interface.RestInterface`) or with the ARC client (``interface:
cli``: :class:`.cli.CliInterface`). The backend holds one of the two and answers the hooks
through it; everything else in the section means the same in both. It is written only against
gridgate's public plugin API (docs/plugins.md), as the Slurm backend is.

The proxy comes from the director's managed credential (``credentials.x509_proxy``) when one
is configured: the backend says it needs an ``x509`` credential (``token`` with ``auth:
token``, REST only), so the director submits nothing here while that credential is expired or
missing, and no CE is blamed for it. With ``auth: token``, ``payload: {credential: NAME}``
gives the pilots a credential for their payload (:mod:`.rest.payload`), and the director holds
the backend while that one is unusable too.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.backend import Backend
from gridgate.core.credential_names import credentials_in_force
from gridgate.core.credentials import CredentialPlugin
from gridgate.core.endpoint_state import EndpointState
from gridgate.core.kinds import failure
from gridgate.core.model import (
    BackendInfo,
    CancelResult,
    Endpoint,
    Failure,
    FoundPilots,
    IterationInfo,
    IterationSummary,
    JobStatus,
    OutputStream,
    PilotOutput,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import PluginContext
from gridgate.plugins.arc.arcinfo import ArcinfoStates
from gridgate.plugins.arc.ces import CE, ArcInterface, CeLocks, CleanList, environment
from gridgate.plugins.arc.cli import CliInterface
from gridgate.plugins.arc.describe import Descriptions, resource_attributes
from gridgate.plugins.arc.documents import JOB_ID_RE
from gridgate.plugins.arc.rest.interface import SCRIPT_WHAT, RestInterface
from gridgate.plugins.arc.rest.shares import ShareStates
from gridgate.plugins.arc.settings import (
    ARC_SCHEMA,
    OWNED_ATTRIBUTES,
    ArcSettings,
    endpoint_entry,
    owned_attribute,
)

__all__ = [
    "CE",
    "CLEAN_GIVE_UP",
    "OWNED_ATTRIBUTES",
    "ArcBackend",
    "owned_attribute",
    "resource_attributes",
]

#: Seconds a final pilot that arcclean would not delete is tried again (a cancelled job is
#: deleted once the CE has killed it, ~30 s on fork).
CLEAN_GIVE_UP = 86400.0


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


class ArcBackend(Backend):
    """Submits pilots to ARC CEs over A-REX's REST interface or with the ARC client; polls,
    cancels and cleans them."""

    name = "arc"
    endpoints_key = "endpoints"

    @classmethod
    def endpoint_names(cls, section: Mapping[str, Any]) -> list[str]:
        """The endpoints' names (the CE's host, ``host:port``, ``-queue``, or the item's
        ``name``), not the URLs: what ``weights`` and ``gridgate servers`` name."""
        items = section.get("endpoints") or []  # not config: the raw section, checked here
        return [
            endpoint_entry(e).name
            for e in items
            if isinstance(e, str) or (isinstance(e, Mapping) and isinstance(e.get("url"), str))
        ]

    credentials = ("x509",)
    expresses = ("cores", "memory_mb", "walltime")
    config_schema: ClassVar[dict[str, Any]] = ARC_SCHEMA
    settings_class = ArcSettings
    settings: ArcSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        settings = self.settings
        self._root = Path(context.state_dir) / "arc"
        self._ces = {
            e.name: CE(Endpoint(self.name, e.name, e.url), e.queue, self._root / _safe(e.name))
            for e in settings.entries
        }
        self._locks = CeLocks(list(self._ces))
        #: endpoints no longer configured whose pilots are still here (see _ce)
        self._retired: dict[str, CE] = {}
        self._retired_lock = threading.Lock()
        self._finals = CleanList(self._locks, context, keep_on_ce=settings.keep_on_ce)
        self._descriptions = Descriptions(settings, context.config_path)
        #: the REST interface also deletes the delegations an earlier REST configuration left
        self._rest = RestInterface(settings, context, self._descriptions, self._finals, self._locks)
        self.interface: ArcInterface = (
            self._rest
            if settings.interface == "rest"
            else CliInterface(settings, context, self._descriptions, self._finals)
        )
        interval = settings.queue_state_interval
        #: what each CE's shares say of their queues: one GET info (REST) or one arcinfo -l
        #: (the client) a CE an interval
        self._shares: ShareStates | ArcinfoStates | None = None
        if interval is not None:
            self._shares = (
                ShareStates(self._rest, interval)
                if isinstance(self.interface, RestInterface)
                else ArcinfoStates(self.interface, interval)
            )

    def backend_info(self) -> BackendInfo:
        info = super().backend_info()
        if self.settings.auth == "token":
            return dataclasses.replace(info, credentials=("token",))
        return info

    def environment(self) -> dict[str, str]:
        """The director's environment with the section's ``env`` and the managed credential's
        variables (the proxy's, or with ``auth: token`` the token's), always a mapping."""
        return environment(self.settings, self.context)

    def description(
        self, ce: CE, request: SubmitRequest, *, name: str = "", delegation: str = ""
    ) -> str:
        """The xRSL of one pilot (:meth:`.describe.Descriptions.description`)."""
        return self._descriptions.description(ce, request, name=name, delegation=delegation)

    # --- helpers ----------------------------------------------------------------------------

    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(ce.endpoint for ce in self._ces.values())

    def _ce(self, endpoint: Endpoint) -> CE | None:
        """The endpoint's CE; for an endpoint removed from the config whose job list (CLI) or
        REST marker (``rest.json``: its URL) is still here, a CE without URL: its pilots can
        still be polled, cancelled and cleaned (their ids are URLs, so the client needs no
        -C). None for an endpoint of neither kind (the base class calls this backend for its
        own endpoints only)."""
        ce = self._ces.get(endpoint.name)
        if ce is None:
            folder = self._root / _safe(endpoint.name)
            if (folder / "jobs.dat").exists() or (folder / "rest.json").exists():
                with self._retired_lock:
                    ce = self._retired.setdefault(endpoint.name, CE(endpoint, "", folder))
        return ce

    # --- hooks ------------------------------------------------------------------------------

    def submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        ce = self._ce(endpoint)
        return None if ce is None else self.interface.submit(ce, request, timeout)

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        if self._ce(endpoint) is None:
            return None
        if result.local_fault.startswith(SCRIPT_WHAT):
            return failure("missing_input", result.local_fault)
        if result.local_fault:
            return None  # core's default says local_io for a file this machine could not write
        return self.interface.classify(result.command, result.message)

    def job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        ce = self._ce(endpoint)
        if ce is None:
            return None
        ids, bad = _checked_ids(job_ids)
        odd = {j: JobStatus(job_id=j, state="unknown", reason=ODD_ID) for j in bad}
        if not ids:
            return StatusResult(endpoint, ok=True, statuses=odd, commands=0)
        result = self.interface.job_status(ce, ids, timeout)
        if odd and result.ok:
            result = dataclasses.replace(result, statuses={**result.statuses, **odd})
        return result

    def endpoint_state(self, endpoint: Endpoint, timeout: float) -> EndpointState | None:
        ce = self._ces.get(endpoint.name)  # a configured CE: a retired one gets no pilot
        if ce is None or self._shares is None:
            return None
        return self._shares.share(ce, timeout)

    def find_pilots(
        self, endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
    ) -> FoundPilots | None:
        """Over REST, the CE's jobs of those submissions in every state (the ARC client has
        no cheap listing of its jobs with their names: ``interface: cli`` cannot say)."""
        ce = self._ce(endpoint)
        if ce is None or self.interface is not self._rest:
            return None
        return self._rest.find_pilots(ce, names, fleet, timeout)

    def cancel(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> CancelResult | None:
        ce = self._ce(endpoint)
        if ce is None:
            return None
        ids, bad = _checked_ids(job_ids)
        if not ids:
            return CancelResult(endpoint, ok=True, message=f"{ODD_ID}: {bad[:5]}" if bad else "")
        result = self.interface.cancel(ce, ids, timeout)
        if bad:
            told = "; ".join(m for m in (result.message, f"{ODD_ID}: {bad[:5]}") if m)
            result = dataclasses.replace(result, message=told)
        return result

    def pilot_output(
        self,
        endpoint: Endpoint,
        job_id: str,
        stream: OutputStream,
        name: str,
        size: int,
        from_end: bool,
        timeout: float,
    ) -> PilotOutput | None:
        """A file of the job's session folder (the pilot's ``pilot.out``, ``pilot.err`` or
        another): over REST ``GET jobs/ID/session/FILE``, with the ARC client ``arccat``."""
        ce = self._ce(endpoint)
        if ce is None:
            return None
        if not JOB_ID_RE.match(job_id):
            return PilotOutput(job_id, stream, ok=False, message=ODD_ID)
        return self.interface.pilot_output(ce, job_id, stream, name, size, from_end, timeout)

    # --- cleaning ---------------------------------------------------------------------------

    def _pending(self, ce: CE) -> dict[str, float]:
        """Pilot id -> when it was first noted for cleaning."""
        return self._finals.pending(ce)

    def clean(self, ce: CE, timeout: float) -> list[str]:
        """Clean the pilots recorded final off the CE; returns those removed (or already gone).

        A pilot the CE would not remove yet (still being killed there) stays to be cleaned at
        a later iteration, for at most ``CLEAN_GIVE_UP`` seconds."""
        with self._locks.lock(ce):
            pending = self._finals.pending(ce)
            if not pending:
                return []
            done = self.interface.clean(ce, list(pending), timeout)
            now = self.context.clock.time()
            left = {i: t for i, t in pending.items() if i not in set(done)}
            stale = [i for i, t in left.items() if now - t > CLEAN_GIVE_UP]
            if stale:
                logger.warning(
                    "{}: {} pilot(s) could not be cleaned off the CE for {:.0f} h; given up: {}",
                    ce.endpoint.key,
                    len(stale),
                    CLEAN_GIVE_UP / 3600,
                    " ".join(stale[:5]),
                )
            self._finals.write(ce, {i: t for i, t in left.items() if i not in set(stale)})
            return done

    def _timeout(self) -> float:
        director = self.context.config.get("director") or {}
        return float(self.settings.command_timeout or director.get("command_timeout") or 120)

    @hookimpl
    def gridgate_iteration_started(self, iteration: IterationInfo) -> None:
        self._rest.delegations.new_iteration()
        self._rest.payload_delegations.new_iteration()

    @hookimpl
    def gridgate_iteration_finished(self, summary: IterationSummary) -> None:
        timeout = self._timeout()
        if not self.settings.keep_on_ce:
            for ce in [*self._ces.values(), *self._retired.values()]:
                if ce.pending_clean.exists():
                    cleaned = self.clean(ce, timeout)
                    if cleaned:
                        logger.debug(
                            "{}: cleaned {} finished pilot(s) off the CE",
                            ce.endpoint.key,
                            len(cleaned),
                        )
        delegations = (
            self._rest.delegations
            if self.settings.auth != "token"
            else self._rest.payload_delegations
        )
        if delegations.has_work():
            # delegations of CEs no endpoint here reaches over REST any more (removed from the
            # config, or interface: cli now), once no director has used them for a while; under
            # auth: token each token's own (only their maker may delete them), one sweep each
            services = self.interface.services(list(self._ces.values()))
            for names in self._sweepers():
                with credentials_in_force(names):
                    self._rest.sweep(services, timeout)

    def _sweepers(self) -> list[dict[str, str]]:
        """The credentials a sweep runs under, one sweep each: under ``auth: token`` every
        configured token credential (a VO's payload delegations are its token's to delete),
        else the one in force."""
        if self.settings.auth != "token" or self.context.plugin_manager is None:
            return [{}]
        names = [
            plugin.name
            for plugin in self.context.plugin_manager.get_plugins()
            if isinstance(plugin, CredentialPlugin) and plugin.kind == "token"
        ]
        return [{"token": name} for name in dict.fromkeys(names)] or [{}]

    def close(self) -> None:
        """Close the REST interface's kept-alive connections."""
        self._rest.close()


#: Why a tracked pilot id of no ARC job id's form is not asked about (its status: unknown).
ODD_ID = "not an ARC job id: the CE is not asked about it"


def _checked_ids(job_ids: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ids of an ARC job id's form, and the others: an id reaches an argv or a URL, so only
    the form arcsub printed is passed on, and an odd one is that pilot's problem alone, never
    the whole CE's poll (issue 40 item 4: A-REX echoes an id back, and an answer naming one it
    would refuse was refused whole at every poll)."""
    ids = [str(j) for j in job_ids]
    return [j for j in ids if JOB_ID_RE.match(j)], [j for j in ids if not JOB_ID_RE.match(j)]
