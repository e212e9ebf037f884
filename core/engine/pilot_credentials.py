"""Which named credential a tracked pilot is asked about and cancelled with: its demand group's.

A CE answers for a job only to the identity that created it (A-REX lists, states and kills the
jobs of the DN or token subject that asks), so the pilots of two groups with two credentials on
one endpoint must each be polled and cancelled with their own group's credential, not the
endpoint's: asked with the other VO's, they would look gone and end as ``lost``, still running.

A group's ``credential`` reaches core in its demand requests (``SubmitRequest.credential``);
:class:`GroupCredentials` remembers it and keeps it in the state store, so that the pilots of a
group with no demand now, or of a director that restarted, are still asked with theirs. Only
a backend some group of which names a credential pays for it: its live pilots' rows are read to
learn their groups (a poll otherwise reads states alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from loguru import logger

from gridgate.core.credential_names import CredentialChoice
from gridgate.core.engine.runtime import Iteration, Runtime
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.state import LiveStates, Pilot, PilotRegistry, StateError

#: ``pilots-group-credential/<backend>/<group>`` -> the credential the group names, kept as
#: long as finished pilots are (renewed while its group has demand).
GROUP_CREDENTIAL = "pilots-group-credential/"

#: kind -> credential name, as ``CredentialChoice.names`` gives them
Names = Mapping[str, str]


class GroupCredentials:
    """The credential each demand group names, per backend, learnt from its requests."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        #: (backend, group) -> the credential it names, as last learnt or read
        self.known: dict[tuple[str, str], str] = {}
        #: backends whose groups were read from the store this iteration
        self._read: set[str] = set()

    def learn(self, requests: Iterable[SubmitRequest], keep: float) -> None:
        """Note the credential each request's group names, kept ``keep`` seconds in the store
        (a new iteration begins: the store is read again when asked)."""
        self._read.clear()
        for request in requests:
            key = (request.backend, request.group)
            if not request.credential:
                self.known.pop(key, None)
                continue
            if self.known.get(key) == request.credential:
                continue
            self.known[key] = request.credential
            try:
                self.runtime.state.set(
                    f"{GROUP_CREDENTIAL}{request.backend}/{request.group}",
                    request.credential,
                    ttl=keep,
                )
            except StateError as exc:  # this director still knows; another may not yet
                logger.debug("the credential of group {} not kept: {}", request.group, exc)

    def of_backend(self, backend: str) -> dict[str, str]:
        """group -> the credential it names, for ``backend``'s groups that name one."""
        if backend not in self._read:
            self._read.add(backend)
            prefix = f"{GROUP_CREDENTIAL}{backend}/"
            try:
                kept = self.runtime.state.items(prefix)
            except StateError as exc:
                logger.debug("group credentials of {} unreadable: {}", backend, exc)
                kept = []
            for key, name in kept:
                self.known.setdefault((backend, key[len(prefix) :]), name)
        return {g: n for (b, g), n in self.known.items() if b == backend}


def configured_kinds(runtime: Runtime) -> dict[str, str]:
    """Each configured credential's kind (``x509``, ``token``) by name, in config order, as
    its plugin says."""
    kinds: dict[str, str] = {}
    for name in runtime.config.get("credentials") or {}:
        plugin = runtime.pm.get_plugin(f"credentials:{name}")
        kind = getattr(plugin, "kind", None)
        if isinstance(kind, str) and kind:
            kinds[str(name)] = kind
    return kinds


def names_for(
    choice: CredentialChoice, endpoint: Endpoint, needs: Iterable[str], groups: Mapping[str, str]
) -> Callable[[str], Names]:
    """group -> kind -> credential name its pilots on ``endpoint`` are asked with (``needs``:
    the kinds the backend's commands need; ``groups``: the credential each group names)."""
    kinds = tuple(needs)
    known: dict[str, Names] = {}

    def of(group: str) -> Names:
        if group not in known:
            known[group] = choice.names(
                endpoint.backend, kinds, endpoint.name, groups.get(group, "")
            )
        return known[group]

    return of


def split_live(
    registry: PilotRegistry,
    endpoint: Endpoint,
    live: LiveStates,
    it: Iteration,
    groups: Mapping[str, str],
) -> list[tuple[Names, LiveStates]]:
    """``live`` cut by the credentials its pilots are asked with: one part (the endpoint's
    credential, no row read) unless a group of the backend names a credential."""
    if not groups:
        return [(it.credentials_of(endpoint), live)]
    info = it.infos.get(endpoint.backend)
    names = names_for(it.choice, endpoint, info.credentials if info else (), groups)
    rows = registry.get_many(endpoint.backend, endpoint.name, list(live.states))
    group_of = {p.job_id: p.group for p in rows}
    parts: dict[tuple[tuple[str, str], ...], tuple[Names, LiveStates]] = {}
    for job, state in live.states.items():
        chosen = names(group_of.get(job, ""))
        _names, part = parts.setdefault(tuple(sorted(chosen.items())), (chosen, LiveStates()))
        part.states[job] = state
        part.submitted[job] = live.submitted[job]
    return list(parts.values())


def split_pilots(
    pilots: Sequence[Pilot], names: Callable[[str], Names]
) -> list[tuple[Names, list[Pilot]]]:
    """``pilots`` cut by the credentials they are cancelled with (``names`` of their group)."""
    parts: dict[tuple[tuple[str, str], ...], tuple[Names, list[Pilot]]] = {}
    for pilot in pilots:
        chosen = names(pilot.group)
        parts.setdefault(tuple(sorted(chosen.items())), (chosen, []))[1].append(pilot)
    return list(parts.values())
