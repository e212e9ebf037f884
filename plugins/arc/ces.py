"""What both interfaces of the `arc` backend share: the CE of an endpoint and its files under
the state folder, the lock of those files, the pilots to clean off the CEs, the environment
of the commands and the REST calls, and what an interface answers (:class:`ArcInterface`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gridgate.core.model import (
    CancelResult,
    CommandResult,
    Endpoint,
    Failure,
    OutputStream,
    PilotOutput,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import PluginContext
from gridgate.plugins.arc.documents import JOB_ID_RE
from gridgate.plugins.arc.settings import ArcSettings
from gridgate.plugins.arc.stamps import add_stamps, read_stamps, write_stamps

__all__ = ["CE", "ArcInterface", "CeLocks", "CleanList", "environment"]


@dataclass(frozen=True)
class CE:
    """One configured endpoint: the CE's URL, the queue (empty: the CE's default) and where
    its client files live."""

    endpoint: Endpoint
    queue: str
    folder: Path

    @property
    def client_conf(self) -> Path:
        return self.folder / "client.conf"

    @property
    def job_list(self) -> Path:
        return self.folder / "jobs.dat"

    @property
    def pending_clean(self) -> Path:
        return self.folder / "clean-pending.json"

    @property
    def rest_marker(self) -> Path:
        """The REST path's record of the CE's URL (its pilots are followed once it leaves the
        config)."""
        return self.folder / "rest.json"


class CeLocks:
    """One lock per CE, over its files (pilots to clean, pilots to look for)."""

    def __init__(self, names: Sequence[str] = ()) -> None:
        self._guard = threading.Lock()
        self._locks = {name: threading.Lock() for name in names}

    def lock(self, ce: CE) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(ce.endpoint.name, threading.Lock())


class CleanList:
    """The pilots seen in a final state, to clean off their CE once recorded (at the end of the
    iteration), so a crash before the registry wrote them loses no state.

    :param locks: the CEs' file locks.
    :param clock: what ``time()`` is read from (the injected clock).
    :param keep_on_ce: the section's ``keep_on_ce``: nothing is noted.
    """

    def __init__(self, locks: CeLocks, context: PluginContext, *, keep_on_ce: bool) -> None:
        self.locks = locks
        self.context = context
        self.keep_on_ce = keep_on_ce

    def note(self, ce: CE, job_ids: Sequence[str]) -> None:
        """Remember ``job_ids`` of ``ce`` as final."""
        if not job_ids or self.keep_on_ce:
            return
        with self.locks.lock(ce):
            add_stamps(ce.pending_clean, job_ids, self.context.clock.time(), "pilots to clean")

    @staticmethod
    def pending(ce: CE) -> dict[str, float]:
        """Pilot id -> when it was first noted for cleaning (the caller holds the CE's lock)."""
        return read_stamps(ce.pending_clean, JOB_ID_RE)

    @staticmethod
    def write(ce: CE, pending: Mapping[str, float]) -> None:
        write_stamps(ce.pending_clean, pending, "pilots to clean")


def environment(settings: ArcSettings, context: PluginContext) -> dict[str, str]:
    """The director's environment with the section's ``env`` and the managed credential's
    variables (the proxy's, and with ``auth: token`` the token's): what ``Backend.environment``
    gives, always a mapping (:func:`.classify.proxy_problem` reads it). Read per call: a
    managed credential's path is the director's, not fixed at start."""
    env = {**os.environ, **{str(k): str(v) for k, v in settings.env.items()}}
    env.update(context.credential_env("x509"))
    if settings.auth == "token":
        env.update(context.credential_env("token"))
    return env


class ArcInterface(Protocol):
    """One way of talking to the CEs (``interface``): :class:`.cli.CliInterface` or
    :class:`.rest.interface.RestInterface`. The backend has checked the ids (ARC job ids) and
    found the CE."""

    def submit(self, ce: CE, request: SubmitRequest, timeout: float) -> SubmitResult: ...
    def job_status(self, ce: CE, ids: Sequence[str], timeout: float) -> StatusResult: ...
    def cancel(self, ce: CE, ids: Sequence[str], timeout: float) -> CancelResult: ...
    def clean(self, ce: CE, ids: Sequence[str], timeout: float) -> list[str]:
        """Clean ``ids`` (final pilots) off ``ce``: those removed or already gone."""
        ...

    def classify(self, command: CommandResult | None, message: str) -> Failure:
        """What a failed submission means (``command`` None: it made no call)."""
        ...

    def services(self, ces: Sequence[CE]) -> list[str]:
        """The services of ``ces`` that this interface delegates to (their delegations stay)."""
        ...

    def pilot_output(
        self,
        ce: CE,
        job_id: str,
        stream: OutputStream,
        name: str,
        size: int,
        from_end: bool,
        timeout: float,
    ) -> PilotOutput:
        """One stream of a pilot, as the hook ``gridgate_pilot_output`` asks it."""
        ...

    def close(self) -> None: ...
