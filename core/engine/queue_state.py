"""What each endpoint's queue says of itself (``gridgate_endpoint_state``), asked once per
iteration for the endpoints that may get pilots, and what the director makes of it: a queue not
in production is drained this iteration (an availability answer of source ``queue``, merged with
the others), and the jobs it reports waiting (everybody's) count against the endpoint's
``max_waiting`` (the pilot room takes the larger of that and gridgate's own count); a demand
group whose pilots ask more than the queue's limits (walltime, cores, memory) sends none there,
told once as a config problem of that endpoint."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from loguru import logger

from gridgate.core.credential_names import credentials_in_force
from gridgate.core.endpoint_state import EndpointState
from gridgate.core.engine.failure import FailurePath
from gridgate.core.engine.runtime import Iteration, Runtime
from gridgate.core.model import (
    AdmissionRequest,
    Availability,
    Endpoint,
    Notification,
    Refusal,
    SubmitRequest,
)
from gridgate.core.state import StateError
from gridgate.core.text import printable

#: The availability source a queue's own serving state is merged as.
SOURCE = "queue"
#: The admission opcode of the question.
OPCODE = "QUEUE_STATE"
#: Where the last answers of each backend's endpoints are kept (``queue-state/BACKEND``:
#: ``{endpoint key: answer}``), for ``gridgate servers show``.
KEPT = "queue-state/"
#: Seconds an answer is kept.
KEEP = 86400.0


class QueueStates:
    """Asks ``gridgate_endpoint_state`` of the endpoints that may get pilots this iteration, in
    parallel (at most ``director.max_threads`` at once), each under a ``query`` admission
    grant; keeps the answers in the iteration (``it.queues``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def ask(self, it: Iteration, endpoints: Sequence[Endpoint]) -> dict[str, EndpointState]:
        """The answers, by endpoint key, of ``endpoints`` (those without one left out). Only
        endpoints some plugin may answer for are asked (no admission grant is taken for a
        backend that cannot say)."""
        hook = self.runtime.pm.hook
        answering = [i.plugin for i in hook.gridgate_endpoint_state.get_hookimpls()]
        backends = answered_backends(answering)
        if backends is not None:
            endpoints = [e for e in endpoints if e.backend in backends]
        if not endpoints:
            return {}
        threads = max(1, min(self.runtime.settings.max_threads, len(endpoints)))
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="queue") as pool:
            answers = list(pool.map(lambda e: self._one(it, e), endpoints))
        states = {e.key: s for e, s in zip(endpoints, answers, strict=True) if s is not None}
        it.queues = states
        self._keep(states)
        return states

    def _keep(self, states: Mapping[str, EndpointState]) -> None:
        """The answers kept in the store for ``gridgate servers show``, one entry per backend
        (one write an iteration, however many endpoints), for a day at most."""
        now = self.runtime.clock.time()
        by_backend: dict[str, dict[str, object]] = {}
        for key, state in states.items():
            entry = {**dataclasses.asdict(state), "asked": now}
            by_backend.setdefault(key.split("/", 1)[0], {})[key] = entry
        for backend, entries in by_backend.items():
            try:
                self.runtime.state.set(KEPT + backend, json.dumps(entries), ttl=KEEP)
            except StateError as exc:
                logger.debug("queue states of {} not kept: {}", backend, exc)
                return

    def _one(self, it: Iteration, endpoint: Endpoint) -> EndpointState | None:
        runtime = self.runtime
        hook = runtime.pm.hook
        info = it.infos.get(endpoint.backend)
        timeout = runtime.timeout(info) if info is not None else runtime.settings.command_timeout
        try:
            grant = hook.gridgate_admit(
                request=AdmissionRequest(
                    category="query",
                    opcode=OPCODE,
                    size=1,
                    endpoint=endpoint,
                    user=runtime.user,
                )
            )
        except Exception as exc:  # a plugin bug must not stop the iteration
            logger.opt(exception=exc).error("admission of {}'s queue state crashed", endpoint.key)
            return None
        if isinstance(grant, Refusal):
            logger.info(
                "queue state of {} not asked: refused by admission control: {}",
                endpoint.key,
                grant.reason,
            )
            return None
        try:
            # the endpoint's own credentials, as its polls have them
            with credentials_in_force(it.credentials_of(endpoint)):
                answer = hook.gridgate_endpoint_state(endpoint=endpoint, timeout=float(timeout))
        except Exception as exc:
            logger.opt(exception=exc).error("queue state of {} crashed in a plugin", endpoint.key)
            return None
        finally:
            if grant is not None:
                hook.gridgate_release(grant=grant)
        if answer is not None and not isinstance(answer, EndpointState):
            logger.error(
                "queue state of {}: the plugin answered {}, not an EndpointState: ignored",
                endpoint.key,
                type(answer).__name__,
            )
            return None
        return answer


def answered_backends(plugins: Iterable[object]) -> set[str] | None:
    """The backends whose endpoints ``plugins`` (those implementing ``gridgate_endpoint_state``)
    may answer for: a subclass of :class:`~gridgate.core.backend.Backend` only for its own, and
    only when it overrides ``endpoint_state`` (the base class answers the hook for every
    subclass, with None); None when another kind of plugin may answer for any."""
    from gridgate.core.backend import Backend  # the director imports this module early

    names: set[str] = set()
    for plugin in plugins:
        if not isinstance(plugin, Backend):
            return None
        if type(plugin).endpoint_state is not Backend.endpoint_state:
            names.add(plugin.name)
    return names


def asked_endpoints(it: Iteration, backends: Iterable[str]) -> list[Endpoint]:
    """The endpoints of ``backends`` (those with demand) that may get pilots this iteration:
    in rotation, neither drained nor banned, their credential usable."""
    endpoints: list[Endpoint] = []
    for backend in backends:
        info = it.infos.get(backend)
        if info is None:
            continue
        endpoints += [e for e in it.submittable(info.endpoints) if not it.credential_block(info, e)]
    return endpoints


def closed_queues(states: Mapping[str, EndpointState]) -> dict[str, Availability]:
    """The availability answer of the queues that said they do not run new jobs now: each
    ``drained`` with what its queue said (outside text, escaped)."""
    return {
        key: Availability(
            state="drained",
            reason=printable(
                f"its queue is {state.serving}"
                + (f" ({state.reason})" if state.reason else "")
                + (f", says {state.source}" if state.source else ""),
                newlines=False,
            ),
            source=SOURCE,
        )
        for key, state in states.items()
        if not state.accepts
    }


def reported_waiting(states: Mapping[str, EndpointState]) -> dict[str, int]:
    """Endpoint key -> the jobs its queue reports waiting (everybody's), where it said."""
    return {key: s.waiting for key, s in states.items() if s.waiting is not None}


def beyond_limits(request: SubmitRequest, state: EndpointState | None) -> str:
    """What ``request``'s pilots ask beyond the limits ``state`` says its queue has, in words
    ('' when they fit, or nothing is known): such pilots are not sent there."""
    resources = request.resources
    if state is None or resources is None:
        return ""
    over = []
    if (
        resources.walltime is not None
        and state.max_walltime is not None
        and resources.walltime > state.max_walltime
    ):
        over.append(f"a walltime of {resources.walltime} s (the queue allows {state.max_walltime})")
    if state.max_cores is not None and resources.cores > state.max_cores:
        over.append(f"{resources.cores} cores (the queue allows {state.max_cores})")
    if (
        resources.memory_mb is not None
        and state.max_memory_mb is not None
        and resources.memory_mb > state.max_memory_mb
    ):
        over.append(f"{resources.memory_mb} MB (the queue allows {state.max_memory_mb})")
    return ", ".join(over)


class LimitProblems:
    """Tells once (a log line and an error notice) that a demand group's pilots ask more than
    an endpoint's queue allows, a config problem of that endpoint; told again only after the
    group's pilots fitted there in between."""

    def __init__(self, runtime: Runtime, failures: FailurePath) -> None:
        self.runtime = runtime
        self.failures = failures
        self._lock = threading.Lock()
        self._told: set[tuple[str, str, str]] = set()

    def fitting(
        self, it: Iteration, request: SubmitRequest, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        """``endpoints`` whose queue can run ``request``'s pilots, as far as it said."""
        kept: list[Endpoint] = []
        for endpoint in endpoints:
            over = beyond_limits(request, it.queues.get(endpoint.key))
            where = (endpoint.key, request.group)
            if not over:
                with self._lock:
                    self._told = {t for t in self._told if t[:2] != where}
                kept.append(endpoint)
                continue
            with self._lock:
                if (*where, over) in self._told:
                    continue
                self._told.add((*where, over))
            self._tell(it, endpoint, request, over)
        return kept

    def _tell(self, it: Iteration, endpoint: Endpoint, request: SubmitRequest, over: str) -> None:
        said = it.queues[endpoint.key]
        logger.error(
            "demand group {}/{}: its pilots ask {}, more than {}'s queue allows: none are sent "
            "there (say less in the group's resources, or leave {} out)",
            request.backend,
            request.group,
            over,
            endpoint.key,
            endpoint.name,
        )
        self.failures.tell(
            it,
            Notification(
                level="error",
                subject=f"gridgate: {endpoint.key} cannot run group {request.group}'s pilots",
                body=(
                    f"Demand group {request.backend}/{request.group} asks {over}.\n"
                    f"{endpoint.key}'s queue says so of itself"
                    + (f" ({printable(said.source, newlines=False)})" if said.source else "")
                    + ": none of the group's pilots are sent there while it does.\n"
                    "This is a config problem: ask less in the group's resources, or leave "
                    "this endpoint out of the backend's list. Told once.\n"
                ),
                created=self.runtime.clock.time(),
                endpoint=endpoint,
                key=f"queue-limits/{endpoint.key}/{request.group}",
                logged=True,
            ),
        )
