"""Named credentials: the ``credentials:`` keys that backends, endpoints and demand groups refer
to with ``credential: NAME``, and which named credential a submission to an endpoint uses.

A ``credentials:`` entry is ``NAME: {kind: PLUGIN, ...}`` (``PLUGIN`` an entry point of group
``gridgate.credentials``: ``x509_proxy``, ``bearer_token``); an entry without ``kind`` is named
after its kind (``x509_proxy: {...}``, the form of one credential per kind). A key whose schema
carries :data:`CREDENTIAL_KEYWORD` names a credential; a name that no entry has is a config
error at that key. Where several levels name one, the nearest wins: the demand group's, then
the endpoint's (``endpoint_credentials``), then the backend's; for each kind a backend needs
(``BackendInfo.credentials``) that none of them names, the first configured credential of that
kind is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "CREDENTIAL_KEYWORD",
    "PAYLOAD",
    "CredentialChoice",
    "credential_kind",
    "credential_reference_schema",
    "credentials_in_force",
    "in_force",
]

#: The key, in :meth:`CredentialChoice.names`, of the credential a backend's pilots get for their
#: payload (``payload: {credential: NAME}`` in its section): not a kind, so a command's
#: ``credential_env(kind)`` never answers with it, but its being unusable holds the backend.
PAYLOAD = "payload"

#: The schema keyword of a key whose value names a ``credentials:`` entry.
CREDENTIAL_KEYWORD = "x-gridgate-credential"

#: A credential's name: also the name of its token file (``credentials/<name>``) and a metric
#: label, so no separator, no leading dot, nothing a shell or a path would read twice.
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

CREDENTIALS_PROPERTY_NAMES: dict[str, Any] = {
    "pattern": NAME_PATTERN,
    "description": "A credential's name: letters, digits, '_', '.', '-' (64 at most).",
}


def credential_reference_schema(description: str) -> dict[str, Any]:
    """The schema of a key naming a credential (``credential: atlas-token``).

    :param description: what the credential is used for there, for the configuration reference.
    """
    return {
        "type": "string",
        "pattern": NAME_PATTERN,
        CREDENTIAL_KEYWORD: True,
        "description": description,
    }


def credential_kind(name: str, entry: Any) -> str:
    """The plugin (entry-point name) of a ``credentials:`` entry: its ``kind``, or its name
    when it has none (``x509_proxy: {path: ...}``).

    :param name: the entry's key.
    :param entry: the entry as written (a mapping; anything else has no ``kind``).
    """
    if isinstance(entry, Mapping) and isinstance(entry.get("kind"), str):
        return str(entry["kind"])
    return name


def kind_schema(kind: str) -> dict[str, Any]:
    """The ``kind`` key a credential's composed schema takes beside its plugin's own keys.

    :param kind: the entry's plugin, the one value the key may have.
    """
    return {
        "const": kind,
        "description": "The credential's plugin (group gridgate.credentials); default: the "
        "entry's name.",
    }


def add_credential_keys(section: dict[str, Any]) -> None:
    """Every backend's section takes ``credential: NAME`` and ``endpoint_credentials:
    {ENDPOINT: NAME}`` (core's, whatever the backend declares), unless it defines them.

    :param section: a backend's section schema, changed in place.
    """
    properties = section.setdefault("properties", {})
    if not isinstance(properties, dict):
        return
    properties.setdefault(
        "credential",
        credential_reference_schema(
            "The credential this backend's commands use (unless an endpoint or a demand group "
            "names its own): a key of `credentials`."
        ),
    )
    properties.setdefault(
        "endpoint_credentials",
        {
            "type": "object",
            "propertyNames": {"minLength": 1},
            "additionalProperties": credential_reference_schema("A key of `credentials`."),
            "description": "The credential of an endpoint, by the endpoint's name (as "
            "`weights` names it); a demand group's own `credential` still wins.",
        },
    )


def _references(
    instance: Any, schema: Any, path: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(path, name) of every value of ``instance`` whose schema carries
    :data:`CREDENTIAL_KEYWORD` (through properties, additionalProperties, items, anyOf/oneOf)."""
    if not isinstance(schema, Mapping):
        return
    if schema.get(CREDENTIAL_KEYWORD) and isinstance(instance, str):
        yield path, instance
        return
    for keyword in ("allOf", "anyOf", "oneOf"):
        for branch in schema.get(keyword, ()):
            yield from _references(instance, branch, path)
    if isinstance(instance, Mapping):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            sub = props.get(key, extra)
            yield from _references(value, sub, (*path, key))
    elif isinstance(instance, list):
        items = schema.get("items")
        for index, value in enumerate(instance):
            yield from _references(value, items, (*path, index))


def credential_reference_problems(
    doc: Mapping[str, Any], schema: Mapping[str, Any]
) -> list[tuple[tuple[str | int, ...], str]]:
    """A key naming a credential that ``credentials:`` has not, as (path, message).

    :param doc: the whole document, each section valid on its own.
    :param schema: the composed schema (keys naming a credential carry
        :data:`CREDENTIAL_KEYWORD`).
    """
    defined = doc.get("credentials")
    names = sorted(str(n) for n in defined) if isinstance(defined, Mapping) else []
    problems: list[tuple[tuple[str | int, ...], str]] = []
    seen: set[tuple[str | int, ...]] = set()
    for path, name in _references(doc, schema, ()):
        if name in names or path in seen:
            continue
        seen.add(path)
        known = ", ".join(names) or "none"
        problems.append((path, f"no credential is named {name!r} (credentials: {known})"))
    return problems


@dataclass(frozen=True)
class CredentialChoice:
    """Which named credential each submission and poll uses, from a validated config: the
    ``credentials:`` entries' kinds (:attr:`kinds`, name -> the credential kind its plugin
    hands out, ``x509`` or ``token``) and the names the backends, their endpoints and the demand
    groups give.

    Built by the director from the config and the credential plugins; asked with
    :meth:`names` for a (backend, endpoint, group)."""

    #: credential name -> its kind (``x509``, ``token``), in config order
    kinds: Mapping[str, str] = field(default_factory=dict)
    #: backend -> the name its section gives (``credential:``)
    backends: Mapping[str, str] = field(default_factory=dict)
    #: (backend, endpoint name) -> the name ``endpoint_credentials`` gives
    endpoints: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: backend -> the credential its pilots get for their payload (``payload.credential``)
    payloads: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], kinds: Mapping[str, str]) -> CredentialChoice:
        """The choice a validated ``config`` makes.

        :param kinds: each credential's kind, by name (the plugins' ``kind``), in config order.
        """
        backends: dict[str, str] = {}
        endpoints: dict[tuple[str, str], str] = {}
        payloads: dict[str, str] = {}
        for backend, section in (config.get("backends") or {}).items():
            if not isinstance(section, Mapping):
                continue
            if isinstance(section.get("credential"), str):
                backends[str(backend)] = section["credential"]
            payload = section.get("payload")
            if isinstance(payload, Mapping) and isinstance(payload.get("credential"), str):
                payloads[str(backend)] = payload["credential"]
            for endpoint, name in (section.get("endpoint_credentials") or {}).items():
                endpoints[(str(backend), str(endpoint))] = str(name)
        return cls(kinds=dict(kinds), backends=backends, endpoints=endpoints, payloads=payloads)

    def default(self, kind: str) -> str | None:
        """The first configured credential of ``kind``; None when none is."""
        return next((n for n, k in self.kinds.items() if k == kind), None)

    def names(
        self,
        backend: str,
        needs: Iterable[str],
        endpoint: str | None = None,
        group_credential: str = "",
    ) -> dict[str, str]:
        """kind -> credential name for each kind in ``needs`` that a credential is configured
        for: the nearest level naming one of that kind (the group's ``credential``, the
        endpoint's, the backend's), else the first of that kind.

        :param backend: the backend's name.
        :param needs: the kinds the backend's commands need (``BackendInfo.credentials``).
        :param endpoint: the endpoint's name; None for what the whole backend uses.
        :param group_credential: the demand group's ``credential`` ('' when it names none).
        """
        levels = [
            group_credential,
            self.endpoints.get((backend, endpoint), "") if endpoint is not None else "",
            self.backends.get(backend, ""),
        ]
        chosen: dict[str, str] = {}
        for kind in needs:
            named = next((n for n in levels if n and self.kinds.get(n) == kind), None)
            name = named or self.default(kind)
            if name is not None:
                chosen[kind] = name
        payload = self.payloads.get(backend)
        if payload and needs:
            chosen[PAYLOAD] = payload
        return chosen


#: kind -> credential name, for the hook call running in this thread (set by the director around
#: each submission, list-match, poll and cancel): ``PluginContext.credential_env(kind)`` answers
#: with that credential, so a backend hands each call the credential of its group and endpoint
#: without knowing names. Empty outside such a call: the first credential of each kind.
_IN_FORCE: ContextVar[Mapping[str, str] | None] = ContextVar(
    "gridgate_credentials_in_force", default=None
)


@contextmanager
def credentials_in_force(names: Mapping[str, str]) -> Iterator[None]:
    """Within the block, ``context.credential_env(kind)`` answers with ``names[kind]``.

    :param names: kind -> credential name (:meth:`CredentialChoice.names`).
    """
    token = _IN_FORCE.set(dict(names))
    try:
        yield
    finally:
        _IN_FORCE.reset(token)


def in_force() -> Mapping[str, str]:
    """The credentials in force for this thread's hook call, kind -> name (empty: none)."""
    return _IN_FORCE.get() or {}


def running_with(names: Mapping[str, str], call: Callable[..., T]) -> Callable[..., T]:
    """``call`` made to run with ``names`` in force (for a call handed to another thread,
    which does not inherit the caller's)."""

    def run(*args: Any, **kwargs: Any) -> T:
        with credentials_in_force(names):
            return call(*args, **kwargs)

    return run
