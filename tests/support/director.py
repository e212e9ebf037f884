"""Small in-test backends for director tests: they run real commands through the runner,
or answer from a script of outcomes when only the director's logic is under test.

The notifier that keeps what it is given is the public kit's
(``from gridgate.core.testing import Collector``), as a plugin author's tests use it.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gridgate.core import hookimpl
from gridgate.core.config import Config
from gridgate.core.model import (
    BackendInfo,
    CancelResult,
    CommandResult,
    Endpoint,
    JobStatus,
    ListMatchResult,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.runner import run
from gridgate.core.testing import make_config

BACKEND = "testbed"
MISSING_PROGRAM = "/nonexistent/gridgate-test/submit-pilot"


def config(servers: int = 3, pilots: int = 6, **director: Any) -> Config:
    """A validated config with the in-memory state driver and static demand for the testbed."""
    doc = {
        "director": {"cycle_seconds": 0.01, "max_threads": 4, "command_timeout": 5, **director},
        "state": {"driver": "memory"},
        "demand": {"static": {BACKEND: pilots}},
        # a fixed seed: tests that need the failing server to be picked are not left to chance
        "selectors": {"random": {"seed": 7}},
    }
    return make_config(doc)


def pilots_by_state(director_: Any) -> dict[str, list[Any]]:
    """A director's tracked pilots by endpoint and state: ``{"ENDPOINT/STATE": [pilot...]}``."""
    found: dict[str, list[Any]] = {}
    for pilot in director_.state.pilot_registry().query():
        found.setdefault(f"{pilot.endpoint}/{pilot.state}", []).append(pilot)
    return found


def set_director(director_: Any, *path: str, value: Any) -> None:
    """Change the ``director:`` setting at ``path`` of a running director's config, as a new
    config: the director reads its settings once per config, never a change made in place."""
    data = dict(director_.config.data)  # the other sections stay the plugins' own objects
    node = data["director"] = dict(data["director"])
    for name in path[:-1]:
        node[name] = dict(node[name])
        node = node[name]
    node[path[-1]] = value
    director_.config = dataclasses.replace(director_.config, data=data)


class ScriptedBackend:
    """A backend whose servers ``s0..sN`` answer as ``behaviour[name]`` says.

    Behaviours: ``ok`` (a job id), ``fail`` (exit 1 with a message), ``hang`` (killed at the
    deadline) run a real Python child through the runner; ``missing`` asks the runner for a
    program that does not exist (a launch error); ``fake-ok`` / ``fake-fail`` answer without a
    process, for logic-only tests with many submissions.
    """

    def __init__(
        self,
        servers: int = 3,
        behaviour: Mapping[str, str] | None = None,
        pilots_per_submission: int = 1,
        barrier: threading.Barrier | None = None,
    ) -> None:
        self.endpoints = tuple(Endpoint(BACKEND, f"s{i}") for i in range(servers))
        self.behaviour: dict[str, str] = dict(behaviour or {})
        self.pilots_per_submission = pilots_per_submission
        self.barrier = barrier
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.counter = 0

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        if backend != BACKEND:
            return None
        return BackendInfo(BACKEND, self.endpoints, self.pilots_per_submission)

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend != BACKEND:
            return None
        with self.lock:
            self.calls.append(endpoint.name)
            self.counter += 1
            number = self.counter
        if self.barrier is not None:
            self.barrier.wait(timeout=30)
        how = self.behaviour.get(endpoint.name, "ok")
        if how == "fake-ok":
            return SubmitResult(endpoint, ok=True, job_ids=(f"job-{number}",))
        if how == "fake-fail":
            command = CommandResult(
                argv=("submit", endpoint.name), returncode=1, stderr="Operation failed\n"
            )
            return SubmitResult(endpoint, ok=False, command=command)
        if how == "missing":
            result = run([MISSING_PROGRAM, endpoint.name], timeout=timeout)
            return SubmitResult(endpoint, ok=False, command=result)
        script = {
            "ok": f"print('JOBID job-{number}')",
            "fail": "import sys; print('Connecting'); print('Error - Operation failed', file=sys.stderr); sys.exit(1)",
            "hang": "import time; print('started', flush=True); time.sleep(600)",
        }[how]
        result = run([sys.executable, "-c", script], timeout=timeout, kill_grace=0.5)
        if result.ok and "JOBID" in result.stdout:
            return SubmitResult(
                endpoint, ok=True, job_ids=(result.stdout.split()[-1],), command=result
            )
        return SubmitResult(endpoint, ok=False, command=result)


class MatchingBackend(ScriptedBackend):
    """Also list-matches: servers in ``empty`` match nothing, those in ``broken`` fail."""

    def __init__(
        self, *args: Any, empty: set[str] = frozenset(), broken: set[str] = frozenset(), **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.empty, self.broken = set(empty), set(broken)
        self.matches = 0

    @hookimpl
    def gridgate_list_match(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> ListMatchResult | None:
        if endpoint.backend != BACKEND:
            return None
        with self.lock:
            self.matches += 1
        if endpoint.name in self.broken:
            command = CommandResult(
                argv=("list-match", endpoint.name),
                returncode=1,
                stderr="Unable to perform the operation\n",
            )
            return ListMatchResult(endpoint, ok=False, command=command)
        if endpoint.name in self.empty:
            return ListMatchResult(endpoint, ok=True, resources=())
        return ListMatchResult(
            endpoint, ok=True, resources=("ce01.example.org:8443/cream-pbs-long",)
        )


class TrackingBackend(ScriptedBackend):
    """A scripted backend whose jobs have states the test moves (``move``), answering bulk
    status queries and cancels from them; ``status_mode[name]`` is ``fail`` for a status
    command that fails (exit 1), ``command`` to run a real status command
    (``status_command``: an argv prefix, the ids appended) through the runner."""

    NATIVE = {
        "waiting": "PENDING",
        "running": "RUNNING",
        "done": "COMPLETED",
        "failed": "FAILED",
        "cancelled": "CANCELLED",
        "unknown": "UNKNOWN",
    }

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.jobs: dict[str, dict[str, tuple[str, str]]] = {e.name: {} for e in self.endpoints}
        self.status_mode: dict[str, str] = {}
        self.status_command: list[str] = []
        self.status_calls: list[tuple[str, tuple[str, ...]]] = []
        self.cancel_calls: list[tuple[str, tuple[str, ...]]] = []

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend != BACKEND:
            return None
        if self.behaviour.get(endpoint.name, "fake-ok") != "fake-ok":
            return super().gridgate_submit(endpoint, request, timeout)
        with self.lock:
            self.calls.append(endpoint.name)
            ids = []
            for _ in range(request.count):
                self.counter += 1
                ids.append(f"{endpoint.name}.{self.counter}")
                self.jobs[endpoint.name][ids[-1]] = ("waiting", "")
        return SubmitResult(endpoint, ok=True, job_ids=tuple(ids))

    def move(
        self,
        endpoint: str,
        state: str,
        n: int | None = None,
        *,
        reason: str = "",
        only: str | None = None,
    ) -> list[str]:
        """Put ``n`` (default: all) jobs of ``endpoint`` (those in state ``only``, if given)
        in ``state``; ``state=None``-like ``"forget"`` drops them as a purged job would be."""
        with self.lock:
            jobs = self.jobs[endpoint]
            chosen = [j for j, (s, _r) in jobs.items() if only is None or s == only][:n]
            for job in chosen:
                if state == "forget":
                    del jobs[job]
                else:
                    jobs[job] = (state, reason)
        return chosen

    def count(self, endpoint: str, state: str) -> int:
        with self.lock:
            return sum(1 for s, _r in self.jobs[endpoint].values() if s == state)

    @hookimpl
    def gridgate_job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        if endpoint.backend != BACKEND:
            return None
        with self.lock:
            self.status_calls.append((endpoint.name, tuple(job_ids)))
        mode = self.status_mode.get(endpoint.name, "ok")
        if mode == "fail":
            command = CommandResult(
                argv=("status", endpoint.name),
                returncode=1,
                stderr="Error - Unable to connect to the server\n",
            )
            return StatusResult(endpoint, ok=False, command=command)
        if mode == "command":
            result = run([*self.status_command, *job_ids], timeout=timeout, kill_grace=0.5)
            if not result.ok:
                return StatusResult(endpoint, ok=False, command=result)
            statuses = {}
            for line in result.stdout.splitlines():
                job, _, state = line.partition(" ")
                if job in job_ids:
                    statuses[job] = JobStatus(job, state, native=state.upper())
            return StatusResult(endpoint, ok=True, statuses=statuses, command=result)
        with self.lock:
            known = self.jobs[endpoint.name]
            statuses = {
                j: JobStatus(j, known[j][0], native=self.NATIVE[known[j][0]], reason=known[j][1])
                for j in job_ids
                if j in known
            }
        return StatusResult(endpoint, ok=True, statuses=statuses)

    @hookimpl
    def gridgate_cancel(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> CancelResult | None:
        if endpoint.backend != BACKEND:
            return None
        with self.lock:
            self.cancel_calls.append((endpoint.name, tuple(job_ids)))
            known = self.jobs[endpoint.name]
            done = [j for j in job_ids if j in known]
            for job in done:
                known[job] = ("cancelled", "cancelled by user")
        return CancelResult(endpoint, ok=True, cancelled=tuple(done))


class Killed(BaseException):
    """What a director killed in the middle of a submission leaves: nothing after this point
    runs (not an ``Exception``, so no ``except Exception`` of the engine catches it)."""


class NamingBackend(TrackingBackend):
    """A tracking backend whose jobs carry the names core gives each submission, as a real CE's
    do (``job_name("pilot", request)``), and that answers ``gridgate_find_pilots`` from them.

    ``submit_mode[server]``: ``ok``; ``lose`` (the jobs are made, the answer is lost:
    ``uncertain``); ``kill`` (the jobs are made, then the director dies: :class:`Killed`);
    ``nothing`` (the answer is lost and nothing was made); ``partial`` (all are made, the answer
    names the first half and is ``uncertain`` of the rest). ``find_mode[server]``: ``ok``;
    ``down`` (the CE cannot be asked); ``none`` (the backend cannot look jobs up by name).
    ``unlisted``: job ids a search leaves out for now."""

    BASE = "pilot"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.names: dict[str, str] = {}  # job id -> job name
        self.submit_mode: dict[str, str] = {}
        self.find_mode: dict[str, str] = {}
        self.find_calls: list[tuple[str, tuple[str, ...], str]] = []
        #: jobs a search does not list yet (a CE listing a just-made job late)
        self.unlisted: set[str] = set()

    def make(self, endpoint: str, name: str, n: int) -> list[str]:
        """Put ``n`` jobs named ``name`` on ``endpoint``, as another director of the fleet
        would have."""
        with self.lock:
            ids = []
            for _ in range(n):
                self.counter += 1
                ids.append(f"{endpoint}.{self.counter}")
                self.jobs[endpoint][ids[-1]] = ("waiting", "")
                self.names[ids[-1]] = name
        return ids

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend != BACKEND:
            return None
        from gridgate.core.backend import job_name

        mode = self.submit_mode.get(endpoint.name, "ok")
        with self.lock:
            self.calls.append(endpoint.name)
        if mode == "nothing":
            return SubmitResult(endpoint, ok=False, message="connection reset", uncertain=True)
        ids = tuple(self.make(endpoint.name, job_name(self.BASE, request), request.count))
        if mode == "kill":
            raise Killed(endpoint.name)
        if mode == "lose":
            return SubmitResult(endpoint, ok=False, message="connection reset", uncertain=True)
        if mode == "partial":  # a bulk answer that names its first half and loses the rest
            return SubmitResult(endpoint, ok=True, job_ids=ids[: len(ids) // 2], uncertain=True)
        return SubmitResult(endpoint, ok=True, job_ids=ids)

    @hookimpl
    def gridgate_find_pilots(
        self, endpoint: Endpoint, names: Sequence[str], fleet: str, timeout: float
    ) -> Any:
        if endpoint.backend != BACKEND:
            return None
        from gridgate.core.backend import found_pilots
        from gridgate.core.model import FoundPilots

        with self.lock:
            self.find_calls.append((endpoint.name, tuple(names), fleet))
        mode = self.find_mode.get(endpoint.name, "ok")
        if mode == "none":
            return None
        if mode == "down":
            return FoundPilots(endpoint, ok=False, message="connection refused")
        with self.lock:
            jobs = [
                (self.names.get(j, ""), JobStatus(j, s, native=self.NATIVE[s]))
                for j, (s, _r) in self.jobs[endpoint.name].items()
                if j not in self.unlisted
            ]
        return found_pilots(endpoint, self.BASE, names, fleet, jobs)
