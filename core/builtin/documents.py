"""The boundary of the built-in plugins' outside documents: each kind is decoded here, by one
function, into typed values, and every way it can be wrong is one
:class:`~gridgate.core.documents.DocumentError` whose ``problem`` says it in a few words.
Past these functions nothing checks a shape again."""

from __future__ import annotations

import base64
import binascii
import calendar
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any
from xml.parsers import expat

import msgspec

from gridgate.core.documents import DocumentError, convert, decode_json
from gridgate.core.fitting import MAX_CORES, MAX_MEMORY_MB, MAX_WALLTIME
from gridgate.core.model import Resources
from gridgate.core.text import parse_json, parse_yaml

#: What a JWT is, for its DocumentError.
JWT_KIND = "JWT"
#: The NumericDates a token may carry: those a date can be written for (years 1 to 9999).
EARLIEST_DATE = -62135596800.0
LATEST_DATE = 253402300799.0


@dataclass(frozen=True)
class JwtTimes:
    """When a token is valid, from its claims (unverified): ``exp`` (None: the token has
    none) and ``nbf`` (None: valid from the start), epoch seconds within
    :data:`EARLIEST_DATE` .. :data:`LATEST_DATE`."""

    exp: float | None
    nbf: float | None


def _part(part: bytes) -> Any:
    try:
        raw = base64.urlsafe_b64decode(part + b"=" * (-len(part) % 4))
        return decode_json(raw, Any, kind=JWT_KIND)
    except DocumentError as exc:
        if "out of range" in exc.problem:  # JSON, with a number no float holds (1e400)
            raise DocumentError(
                JWT_KIND, f"holds a JWT with a number out of range ({exc.problem})"
            ) from None
    except (binascii.Error, ValueError):
        pass
    raise DocumentError(
        JWT_KIND, "holds a JWT whose header or payload is not base64url-encoded JSON"
    )


def _date(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DocumentError(
            JWT_KIND, f"holds a JWT whose {name} claim is not a number: {value!r:.40}"
        )
    # compared before any float(): a 400-digit integer overflows one
    if not EARLIEST_DATE <= value <= LATEST_DATE:
        raise DocumentError(
            JWT_KIND, f"holds a JWT whose {name} claim is not a date (out of range): {value!r:.40}"
        )
    return float(value)


def jwt_times(token: bytes) -> JwtTimes:
    """The ``exp`` and ``nbf`` claims of a JWT in compact form (``header.payload.signature``,
    each base64url JSON), unverified: the signature is the services' to check.

    :raises DocumentError: not three parts, a header or payload that is not a base64url JSON
        object, or an ``exp``/``nbf`` that is not a number of seconds a date can have.
    """
    parts = token.strip().split(b".")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise DocumentError(
            JWT_KIND,
            "holds no JWT (a token is three base64url parts joined by dots: header.payload."
            f"signature; this has {len(parts)} part{'s' if len(parts) != 1 else ''})",
        )
    header, payload = _part(parts[0]), _part(parts[1])
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise DocumentError(JWT_KIND, "holds a JWT whose header or payload is not a JSON object")
    return JwtTimes(exp=_date(payload, "exp"), nbf=_date(payload, "nbf"))


# --- an OAuth2 issuer's answers (the bearer_token credential's issuer) ------------------------


class OpenIdConfiguration(msgspec.Struct, frozen=True):
    """What an issuer's ``/.well-known/openid-configuration`` says that a client-credentials
    client needs: its ``issuer`` and its ``token_endpoint`` (an https URL)."""

    issuer: str
    token_endpoint: Annotated[str, msgspec.Meta(pattern=r"^https://[^/\s]+\S*$")]


class TokenAnswer(msgspec.Struct, frozen=True):
    """A token endpoint's success answer (RFC 6749 5.1): the access token, its type
    (``Bearer``, any case), and the seconds it lives, when the issuer says."""

    access_token: Annotated[str, msgspec.Meta(min_length=1)]
    token_type: str
    expires_in: Annotated[int, msgspec.Meta(ge=0)] | None = None
    scope: str | None = None


class OAuthError(msgspec.Struct, frozen=True):
    """A token endpoint's refusal (RFC 6749 5.2): the error code and its description."""

    error: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    error_description: str | None = None


def openid_configuration(data: bytes) -> OpenIdConfiguration:
    """An issuer's OpenID configuration (metadata) document.

    :raises DocumentError: not JSON, or without an issuer and an https token endpoint.
    """
    return decode_json(data, OpenIdConfiguration, kind="openid-configuration")


def token_answer(data: bytes) -> TokenAnswer:
    """A token endpoint's answer to a granted request.

    :raises DocumentError: not JSON, or no access_token and token_type.
    """
    return decode_json(data, TokenAnswer, kind="token endpoint answer")


def oauth_error(data: bytes) -> OAuthError | None:
    """A token endpoint's refusal, or None when the body is not one (an HTML error page)."""
    try:
        return decode_json(data, OAuthError, kind="token endpoint error")
    except DocumentError:
        return None


class SharedTokenEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A token another director published in the state store (:mod:`.token_share`): the
    format's version, its end (epoch seconds), who fetched it, and the sealed token with its
    nonce (base64)."""

    v: Annotated[int, msgspec.Meta(ge=1)]
    expires: float
    by: Annotated[str, msgspec.Meta(max_length=300)]
    nonce: bytes
    sealed: Annotated[bytes, msgspec.Meta(max_length=64 * 1024)]


def shared_token_entry(data: str) -> SharedTokenEntry:
    """A shared token's entry in the state store.

    :raises DocumentError: not JSON, or not an entry of this shape.
    """
    return decode_json(data, SharedTokenEntry, kind="shared token entry", max_bytes=128 * 1024)


# --- GOCDB's get_downtime XML ------------------------------------------------------------

#: What a GOCDB feed is, for its DocumentError.
GOCDB_KIND = "GOCDB downtime feed"


class FeedError(Exception):
    """A feed that could not be read, or is not a GOCDB downtime document."""


@dataclass(frozen=True)
class Downtime:
    """One GOCDB downtime of one service endpoint (``host`` is lower case)."""

    id: str
    host: str
    severity: str
    start: float
    end: float
    description: str = ""
    portal_url: str = ""
    service_type: str = ""

    def ongoing(self, now: float) -> bool:
        """Whether ``now`` falls within the downtime (start included, end excluded)."""
        return self.start <= now < self.end


@dataclass(frozen=True)
class Feed:
    """A parsed feed: its downtimes, and the entries left out, each saying which and why."""

    downtimes: tuple[Downtime, ...]
    problems: tuple[str, ...] = ()


# --- parsing ----------------------------------------------------------------------------

_MAX_DEPTH = 16


@dataclass
class _Node:
    tag: str
    attrs: dict[str, str]
    children: list[_Node] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


def _refuse(what: str) -> Callable[..., None]:
    def handler(*_args: object) -> None:
        raise FeedError(
            f"the document has {what}: a GOCDB feed has none, and refusing it is what keeps "
            "entity expansion (billion laughs) and external entities out"
        )

    return handler


def _refuse_external(*_args: object) -> int:
    _refuse("an external entity")()
    return 0  # not reached: a handler's exception stops the parse


def _parse_xml(data: bytes) -> _Node:
    """The document as a small tree, by expat with every DTD feature refused.

    No DOCTYPE means no entity can be declared, so only the five predefined entities and
    character references exist: nothing expands, nothing is fetched. defusedxml would do the
    same, as another dependency; these three handlers are all it takes.
    """
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse("a DOCTYPE")
    parser.EntityDeclHandler = _refuse("an entity declaration")
    parser.ExternalEntityRefHandler = _refuse_external
    root: list[_Node] = []
    stack: list[_Node] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        if len(stack) >= _MAX_DEPTH:
            raise FeedError(f"elements nested deeper than {_MAX_DEPTH}: not a GOCDB feed")
        node = _Node(tag, attrs)
        if stack:
            stack[-1].children.append(node)
        else:
            root.append(node)
        stack.append(node)

    def end(_tag: str) -> None:
        stack.pop()

    def chars(text: str) -> None:
        if stack:
            stack[-1].text.append(text)

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    try:
        parser.Parse(data, True)
    except expat.ExpatError as exc:
        raise FeedError(f"not well-formed XML: {exc}") from None
    return root[0]


_SEVERITIES = ("OUTAGE", "WARNING")


class _DowntimeFields(msgspec.Struct):
    """The text children of a ``<DOWNTIME>`` that are read (others are ignored)."""

    PRIMARY_KEY: str = ""
    HOSTNAME: str = ""
    SEVERITY: str = ""
    DESCRIPTION: str = ""
    GOCDB_PORTAL_URL: str = ""
    SERVICE_TYPE: str = ""
    START_DATE: str = ""
    END_DATE: str = ""
    FORMATED_START_DATE: str = ""
    FORMATED_END_DATE: str = ""


def _time(fields: _DowntimeFields, name: str) -> float:
    raw = str(getattr(fields, f"{name}_DATE"))
    if raw:
        if not raw.isdigit():
            raise ValueError(f"{name}_DATE is {raw[:40]!r}, not Unix seconds")
        return float(int(raw))
    text = str(getattr(fields, f"FORMATED_{name}_DATE"))
    if not text:
        raise ValueError(f"no {name}_DATE")
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M")))
    except ValueError:
        raise ValueError(f"FORMATED_{name}_DATE is {text[:40]!r}, not YYYY-MM-DD HH:MM") from None


def parse_downtimes(data: bytes | str) -> Feed:
    """The downtimes of a GOCDB ``get_downtime`` document.

    An entry that cannot be used (unknown severity, a date that is not one, an end before its
    start) is left out and listed in ``problems``; the rest of the feed stands.

    :raises FeedError: for text that is not well-formed XML, any DTD (DOCTYPE, entities), or a
        document whose root is not GOCDB's ``<results>``.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    root = _parse_xml(raw)
    if root.tag != "results":
        raise FeedError(
            f"not a GOCDB results document: the root element is <{root.tag[:40]}>, not <results>"
        )
    downtimes: list[Downtime] = []
    problems: list[str] = []
    for index, node in enumerate(root.children):
        if node.tag != "DOWNTIME":
            continue  # <meta> (paging links) and whatever GOCDB adds later
        fields: _DowntimeFields = convert(
            {c.tag: "".join(c.text).strip() for c in node.children if not c.children},
            _DowntimeFields,
            kind=GOCDB_KIND,
        )
        ident = (
            node.attrs.get("PRIMARY_KEY")
            or fields.PRIMARY_KEY
            or node.attrs.get("ID")
            or f"#{index + 1}"
        )
        host = fields.HOSTNAME.strip().lower().rstrip(".")
        if not host:
            continue  # a whole site's downtime: no host to match an endpoint by
        severity = fields.SEVERITY.upper()
        try:
            if severity not in _SEVERITIES:
                raise ValueError(f"SEVERITY is {severity[:20]!r}, not OUTAGE or WARNING")
            start, end = _time(fields, "START"), _time(fields, "END")
            if end < start:
                raise ValueError("it ends before it starts")
        except ValueError as exc:
            problems.append(f"downtime {ident} of {host}: {exc}")
            continue
        downtimes.append(
            Downtime(
                id=ident,
                host=host,
                severity=severity,
                start=start,
                end=end,
                description=fields.DESCRIPTION,
                portal_url=fields.GOCDB_PORTAL_URL,
                service_type=fields.SERVICE_TYPE,
            )
        )
    return Feed(tuple(downtimes), tuple(problems))


# --- a demand file: {backend: pilots | [groups]} -------------------------------------------

#: What a demand file (or the static demand's section) is, for its DocumentError.
DEMAND_KIND = "demand"


class DemandResources(msgspec.Struct, forbid_unknown_fields=True):
    """``resources:`` of a demand group (an empty one asks for nothing)."""

    cores: int | None = None
    memory_mb: int | None = None
    walltime: int | None = None
    tags: dict[str, str] = {}

    def resources(self) -> Resources | None:
        """What each pilot asks of its slot; None for ``resources: {}``."""
        if self.cores is None and self.memory_mb is None and self.walltime is None:
            if not self.tags:
                return None
        return Resources(
            cores=1 if self.cores is None else self.cores,
            memory_mb=self.memory_mb,
            walltime=self.walltime,
            tags=self.tags,
        )


class DemandGroup(msgspec.Struct, forbid_unknown_fields=True):
    """One demand group of a demand file."""

    group: str
    pilots: int
    requirements: str = ""
    list_match: bool | None = None
    attributes: dict[str, Any] = {}
    resources: DemandResources | None = None
    credential: str = ""


def demand_file(text: str, *, json_file: bool) -> Any:
    """A demand file's text as the document it holds (JSON, or else YAML); an empty file is
    ``{}``. The schema check of what it holds is the demand source's.

    :raises ValueError: not JSON or YAML (nested past the recursion limit included).
    """
    return (parse_json(text) if json_file else parse_yaml(text)) or {}


def demand_groups(spec: Any) -> dict[str, list[DemandGroup]]:
    """``{backend: N | [groups]}`` (a parsed demand file, or the static demand's section) as
    each backend's groups; a bare ``N`` is the group ``default``.

    :raises DocumentError: not of that shape.
    """
    parsed: dict[str, int | list[DemandGroup]] = convert(
        spec, dict[str, int | list[DemandGroup]], kind=DEMAND_KIND
    )
    return {
        backend: [DemandGroup("default", value)] if isinstance(value, int) else value
        for backend, value in parsed.items()
    }


# --- the waiting-work sources' answers ----------------------------------------------------

#: The largest count a source may give. Real task queues hold millions of jobs at most; a figure
#: past a billion is a broken source (or a counter of something else), not demand.
MAX_WAITING = 1_000_000_000


def waiting_count(value: object, what: str) -> int:
    """``value`` (a Redis reply, a JSON answer's field) as a count of waiting jobs.

    :raises ValueError: not a whole number from 0 to :data:`MAX_WAITING`.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float):
            raise ValueError(f"{what} is {value!r}, not a whole number of jobs")
        raise ValueError(f"{what} is {json.dumps(value)[:60]}, not a count of jobs")
    if value < 0:
        raise ValueError(f"{what} is {value}, a negative count")
    if value > MAX_WAITING:
        raise ValueError(f"{what} is {value}, above the largest count accepted ({MAX_WAITING})")
    return value


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice")
        seen[key] = value
    return seen


def parse_count(data: bytes | str, field: str) -> int:
    """The count under ``field`` in the JSON object ``data``.

    :raises ValueError: for text that is not JSON (NaN and Infinity included), a value that is
        not an object, an object with a key twice, a missing field, or a value that is not a
        whole non-negative number of at most :data:`MAX_WAITING` (``true``, ``2.5``, ``-1``,
        ``"3"`` are all refused). The message says which.
    """
    parsed = _json_object(data)
    if field not in parsed:
        known = ", ".join(sorted(parsed)[:10]) or "none"
        raise ValueError(f"the answer has no field {field!r} (its fields: {known})")
    return waiting_count(parsed[field], f"field {field!r}")


#: The most requirements one answer may count (DIRAC's task queues per VO number in the tens to
#: hundreds): more is a broken source.
MAX_REQUIREMENTS = 1000
#: What a waiting-work answer that counts per requirement is, for its DocumentError.
REQUIREMENTS_KIND = "requirement counts"


class RequirementCount(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One requirement of a waiting-work answer and the jobs waiting with it: what each of those
    jobs needs of a slot (as a demand group's ``resources``) and how many wait."""

    count: Annotated[int, msgspec.Meta(ge=0, le=MAX_WAITING)]
    cores: Annotated[int, msgspec.Meta(ge=1, le=MAX_CORES)] = 1
    memory_mb: Annotated[int, msgspec.Meta(ge=1, le=MAX_MEMORY_MB)] | None = None
    walltime: Annotated[int, msgspec.Meta(ge=1, le=MAX_WALLTIME)] | None = None
    tags: Annotated[
        dict[
            Annotated[str, msgspec.Meta(min_length=1, max_length=64)],
            Annotated[str, msgspec.Meta(max_length=256)],
        ],
        msgspec.Meta(max_length=32),
    ] = {}

    def resources(self) -> Resources:
        """What each of these jobs asks of its slot."""
        return Resources(
            cores=self.cores, memory_mb=self.memory_mb, walltime=self.walltime, tags=self.tags
        )


def requirement_counts(value: object, what: str) -> tuple[RequirementCount, ...]:
    """``value`` (a JSON answer's field) as a list of requirements and their counts:
    ``[{"count": 120, "cores": 8, "memory_mb": 16000}, {"count": 900}]``.

    :raises ValueError: not a list of such objects (an unknown key, a count or a figure out
        of range), more than :data:`MAX_REQUIREMENTS`, or one requirement twice.
    """
    if isinstance(value, list) and len(value) > MAX_REQUIREMENTS:
        raise ValueError(f"{what} counts {len(value)} requirements, more than {MAX_REQUIREMENTS}")
    try:
        counts: list[RequirementCount] = convert(
            value, list[RequirementCount], kind=REQUIREMENTS_KIND
        )
    except DocumentError as exc:
        raise ValueError(f"{what}: {exc.problem}") from None
    seen: set[tuple[object, ...]] = set()
    for item in counts:
        key = (item.cores, item.memory_mb, item.walltime, tuple(sorted(item.tags.items())))
        if key in seen:
            raise ValueError(f"{what} counts one requirement twice: {key}")
        seen.add(key)
    return tuple(counts)


def requirement_of_label(label: str, what: str) -> RequirementCount:
    """A requirement written as ``cores=8,memory_mb=16000,walltime=86400,tags.gpu=a100`` (a
    Redis hash's field), with a count of 0.

    :raises ValueError: an unknown word, a figure that is not a whole number in range, or one
        given twice.
    """
    values: dict[str, Any] = {}
    tags: dict[str, str] = {}
    for part in label.split(","):
        name, eq, text = part.strip().partition("=")
        if not eq or not name:
            raise ValueError(f"{what}: {part.strip()[:60]!r} is not NAME=VALUE")
        if name.startswith("tags."):
            tag = name[len("tags.") :]
            if not tag or tag in tags:
                raise ValueError(f"{what}: the tag {name[:70]!r} is empty or given twice")
            tags[tag] = text
            continue
        if name not in ("cores", "memory_mb", "walltime") or name in values:
            raise ValueError(
                f"{what}: {name[:40]!r} is unknown or given twice (cores, memory_mb, walltime, "
                "tags.NAME)"
            )
        if not text.isascii() or not text.isdigit() or len(text) > 12:
            raise ValueError(f"{what}: {name}={text[:40]!r} is not a whole number")
        values[name] = int(text)
    try:
        return convert({"count": 0, **values, "tags": tags}, RequirementCount, kind=what)
    except DocumentError as exc:
        raise ValueError(f"{what}: {exc.problem}") from None


def parse_waiting(data: bytes | str, field: str) -> int | tuple[RequirementCount, ...]:
    """The waiting jobs under ``field`` in the JSON object ``data``: a count, or a list of
    requirements and their counts (:func:`requirement_counts`).

    :raises ValueError: as :func:`parse_count` does, and for a list that is not one of
        requirements.
    """
    parsed = _json_object(data)
    if field not in parsed:
        known = ", ".join(sorted(parsed)[:10]) or "none"
        raise ValueError(f"the answer has no field {field!r} (its fields: {known})")
    if isinstance(parsed[field], list):
        return requirement_counts(parsed[field], f"field {field!r}")
    return waiting_count(parsed[field], f"field {field!r}")


def _json_object(data: bytes | str) -> dict[str, Any]:
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        parsed = parse_json(text, parse_constant=_no_constant, object_pairs_hook=_unique_pairs)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"the answer is not JSON ({exc}): {_excerpt(data)}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"the answer is not a JSON object of counts: {_excerpt(data)}")
    return parsed


def _excerpt(data: bytes | str, size: int = 80) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return repr(text[:size]) + ("..." if len(text) > size else "")


# --- HTTP -------------------------------------------------------------------------------
