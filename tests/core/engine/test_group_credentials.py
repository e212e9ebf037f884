"""Two VOs on one endpoint, each demand group with a credential of its own: each group's pilots
are created, polled and cancelled with its own credential, as a CE that answers only the
identity that created a job requires; after a restart too, and for a group with no demand now."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.director import BACKEND, TrackingBackend
from support.tokens import jwt

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.credential_names import in_force
from gridgate.core.engine.director import Director
from gridgate.core.engine.output import read_output
from gridgate.core.model import (
    BackendInfo,
    CancelResult,
    Endpoint,
    PilotOutput,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector, make_config


class OwnedJobs(TrackingBackend):
    """A CE of one endpoint that needs a token: each job belongs to the token it was created
    with, and a status or a cancel sees only the jobs of the token in force."""

    def __init__(self) -> None:
        super().__init__(servers=1)
        self.owner: dict[str, str] = {}
        self.asked: list[tuple[str, str, tuple[str, ...]]] = []

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        if backend != BACKEND:
            return None
        return BackendInfo(BACKEND, self.endpoints, credentials=("token",))

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        result = super().gridgate_submit(endpoint, request, timeout)
        if result is not None:
            token = in_force().get("token", "")
            with self.lock:
                self.owner.update(dict.fromkeys(result.job_ids, token))
        return result

    def _mine(self, job_ids: Sequence[str], what: str) -> list[str]:
        token = in_force().get("token", "")
        with self.lock:
            self.asked.append((what, token, tuple(job_ids)))
            return [j for j in job_ids if self.owner.get(j) == token]

    @hookimpl
    def gridgate_job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        return super().gridgate_job_status(endpoint, self._mine(job_ids, "status"), timeout)

    @hookimpl
    def gridgate_cancel(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> CancelResult | None:
        return super().gridgate_cancel(endpoint, self._mine(job_ids, "cancel"), timeout)

    @hookimpl
    def gridgate_pilot_output(self, endpoint, job_id, stream, name, size, from_end, timeout):
        if endpoint.backend != BACKEND:
            return None
        if not self._mine([job_id], "output"):
            return PilotOutput(job_id, stream, held=False, message="not this token's job")
        return PilotOutput(job_id, stream, text=f"{job_id} by {self.owner[job_id]}\n")


def _token(path: Path, now: float) -> str:
    path.write_text(jwt(exp=int(now + 7 * 86400), nbf=int(now - 60)), encoding="utf-8")
    path.chmod(0o600)
    return str(path)


def _director(tmp_path: Path, state: MemoryState, clock: FakeClock, groups: Any) -> Director:
    now = time.time()
    doc = {
        "director": {
            "cycle_seconds": 0.01,
            "max_threads": 2,
            "command_timeout": 5,
            "pilots": {"max_wait_time": 3600, "max_waiting": 10},
        },
        "state": {"driver": "memory"},
        "credentials": {
            "atlas-token": {"kind": "bearer_token", "path": _token(tmp_path / "atlas", now)},
            "lhcb-token": {"kind": "bearer_token", "path": _token(tmp_path / "lhcb", now)},
        },
        "demand": {"static": {BACKEND: groups}},
    }
    return Director(make_config(doc), clock=clock, extra_plugins=[Collector()], state=state)


ATLAS = {"group": "atlas", "pilots": 2}  # the first token: what the endpoint itself uses
LHCB = {"group": "lhcb", "pilots": 2, "credential": "lhcb-token"}


def _states(state: MemoryState) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for pilot in state.pilot_registry().query():
        out[(pilot.group, pilot.state)] = out.get((pilot.group, pilot.state), 0) + 1
    return out


def test_each_groups_pilots_are_polled_and_cancelled_with_its_own_credential(
    tmp_path: Path,
) -> None:
    clock = FakeClock(time.time())
    state = MemoryState(clock=clock)
    backend = OwnedJobs()
    director = _director(tmp_path, state, clock, [ATLAS, LHCB])
    director.pm.register(backend)
    try:
        director.run_iteration()
        assert sorted(backend.owner.values()) == ["atlas-token"] * 2 + ["lhcb-token"] * 2
        director.config.data["demand"]["static"][BACKEND] = 0  # no demand: polls alone
        backend.move("s0", "running")
        clock.advance(60)
        director.run_iteration()
        # one status call per credential, each asking about that credential's jobs only
        polls = [(t, ids) for what, t, ids in backend.asked if what == "status"]
        assert sorted(t for t, _ids in polls) == ["atlas-token", "lhcb-token"]
        assert all(backend.owner[j] == t for t, ids in polls for j in ids)
        assert _states(state) == {("atlas", "running"): 2, ("lhcb", "running"): 2}
    finally:
        director.close()

    # a new director (a restart) with no demand: the pilots are still asked with lhcb's
    # credential (kept in the store), and cancelled with it when they wait too long
    backend.asked.clear()
    backend.move("s0", "waiting")
    director = _director(tmp_path, state, clock, 0)
    director.pm.register(backend)
    try:
        clock.advance(60)
        director.run_iteration()
        assert _states(state) == {("atlas", "waiting"): 2, ("lhcb", "waiting"): 2}, backend.asked
        clock.advance(7200)
        director.run_iteration()
        cancels = [(t, ids) for what, t, ids in backend.asked if what == "cancel"]
        assert sorted(t for t, _ids in cancels) == ["atlas-token", "lhcb-token"]
        assert all(backend.owner[j] == t for t, ids in cancels for j in ids)
        assert _states(state) == {("atlas", "cancelled"): 2, ("lhcb", "cancelled"): 2}
    finally:
        director.close()


def test_a_pilots_output_is_read_with_its_groups_credential(tmp_path: Path) -> None:
    clock = FakeClock(time.time())
    state = MemoryState(clock=clock)
    backend = OwnedJobs()
    director = _director(tmp_path, state, clock, [ATLAS, LHCB])
    director.pm.register(backend)
    try:
        director.run_iteration()
    finally:
        director.close()
    # as gridgate pilots output does: another director, no demand, the group's credential
    # read back from the store
    director = _director(tmp_path, state, clock, 0)
    director.pm.register(backend)
    try:
        for pilot in state.pilot_registry().query():
            out = read_output(director.runtime, pilot, "stdout")
            assert out.held, (pilot.group, out.message)
            token = "lhcb-token" if pilot.group == "lhcb" else "atlas-token"
            assert out.text == f"{pilot.job_id} by {token}\n"
    finally:
        director.close()
    assert sorted(t for what, t, _ids in backend.asked if what == "output") == (
        ["atlas-token"] * 2 + ["lhcb-token"] * 2
    )
