"""Sources of waiting work for demand sized from real queues: how many jobs wait for pilots in
a Redis list, stream or sorted set, in a JSON object served over HTTP, or printed by a command,
and how many pilots that asks for.

A demand plugin keeps one :class:`WaitingGauge` per demand group (or one :class:`WaitingGauges`
for all of them, which reads the Redis keys of one server in a single round trip) and asks it
once per iteration. A source that fails keeps the group's last good figure for ``keep_last``
seconds of the injected clock, then answers 0; it logs one error per failure episode and one
notice when the source answers again, and a failure never makes a figure larger than the last
good one. :func:`pilots_for` turns a figure into pilots.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol
from urllib.parse import SplitResult, urlsplit

from loguru import logger

from gridgate.core.builtin.documents import (
    MAX_WAITING,
    RequirementCount,
    parse_count,
    parse_waiting,
    requirement_of_label,
    waiting_count,
)
from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.cutoff import cut_after
from gridgate.core.http import HttpClient, HttpError
from gridgate.core.runner import run
from gridgate.core.secrets import SECRET_SCHEMA, SecretError, read_secret
from gridgate.core.settings import Settings
from gridgate.core.text import safe_url, url_secret

__all__ = [
    "COMMAND_SOURCE_SCHEMA",
    "DEFAULT_KEEP_LAST",
    "GROUP_PROPERTIES",
    "HTTP_SOURCE_SCHEMA",
    "MAX_WAITING",
    "REDIS_SOURCE_SCHEMA",
    "Reading",
    "SOURCE_SCHEMA",
    "CommandSource",
    "FetchError",
    "HttpSource",
    "RedisSource",
    "SourceError",
    "WaitingFigure",
    "WaitingGauge",
    "WaitingGauges",
    "WaitingSource",
    "http_get",
    "make_source",
    "split_http_url",
    "parse_count",
    "pilots_for",
    "total_jobs",
]

#: What a source reads: a count of waiting jobs, or the jobs waiting per requirement.
Reading = int | tuple[RequirementCount, ...]


def total_jobs(reading: Reading) -> int:
    """The jobs a reading counts, whatever their requirements."""
    return reading if isinstance(reading, int) else sum(r.count for r in reading)


#: Seconds a failing source's last good figure is still used. Ten default cycles (60 s each):
#: long enough to ride through a restart of the Redis or web service behind a task queue
#: (minutes), short enough that a queue that drained while unreadable is not fed for long. Holding
#: costs little anyway, since the figure is less the pilots already waiting: once those are
#: submitted, the same figure asks for nothing more.
DEFAULT_KEEP_LAST = 600.0

_DAY = 86400
_MIB = 1024 * 1024


def _seconds(default: float, description: str) -> dict[str, Any]:
    return {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": _DAY,
        "default": default,
        "description": description,
    }


def _max_bytes(default: int) -> dict[str, Any]:
    return {
        "type": "integer",
        "minimum": 2,
        "maximum": 64 * _MIB,
        "default": default,
        "description": "The answer may be at most this many bytes; a longer one is an error.",
    }


_FIELD: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "description": "The key of the JSON object whose value is this group's count, or its "
    'list of requirements and their counts ([{"count": 120, "cores": 8, "memory_mb": 16000, '
    '"walltime": 86400, "tags": {...}}, ...]).',
}

REDIS_SOURCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Waiting jobs in a Redis key: LLEN of a list, XLEN of a stream, ZCARD of a "
    "sorted set; or per requirement, a hash whose fields are requirements "
    "(cores=8,memory_mb=16000,walltime=86400,tags.NAME=VALUE) and values their counts. A "
    "missing key is 0, a key of another type is an error.",
    "properties": {
        "url": {
            "type": "string",
            "pattern": "^(redis|rediss|unix)://",
            "description": "redis://HOST:PORT/DB (rediss:// for TLS); no password in it.",
        },
        "key": {"type": "string", "minLength": 1, "description": "The key to count."},
        "password": SECRET_SCHEMA,
        "timeout": _seconds(5, "Seconds to connect and to wait for each reply."),
    },
    "required": ["url", "key"],
    "additionalProperties": False,
}

HTTP_SOURCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Waiting jobs from a GET answering a JSON object of counts.",
    "properties": {
        "url": {"type": "string", "pattern": "^https?://[^/]", "description": "http(s) URL."},
        "field": _FIELD,
        "timeout": _seconds(10, "Seconds for the whole request, connection to last byte."),
        "max_bytes": _max_bytes(_MIB),
        "ca_path": {
            "type": "string",
            "x-gridgate-path": True,
            "minLength": 1,
            "description": "Folder of CA certificates for https (default: the system's).",
        },
    },
    "required": ["url", "field"],
    "additionalProperties": False,
}

COMMAND_SOURCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Waiting jobs printed by a command (an argv, no shell) as a JSON object.",
    "properties": {
        "argv": {
            "type": "array",
            "minItems": 1,
            "x-gridgate-path": "argv",
            "items": {"type": "string", "minLength": 1},
            "description": "The program and its arguments, one item each.",
        },
        "field": _FIELD,
        "timeout": _seconds(30, "Seconds before the command is killed (with its group)."),
        "max_bytes": _max_bytes(_MIB),
    },
    "required": ["argv", "field"],
    "additionalProperties": False,
}

#: ``source:`` of a demand group: exactly one of the three kinds.
SOURCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Where the group's waiting jobs are counted: redis, http or command.",
    "properties": {
        "redis": REDIS_SOURCE_SCHEMA,
        "http": HTTP_SOURCE_SCHEMA,
        "command": COMMAND_SOURCE_SCHEMA,
    },
    "minProperties": 1,
    "maxProperties": 1,
    "additionalProperties": False,
}

#: Properties a demand group sized from waiting work adds to its schema.
GROUP_PROPERTIES: dict[str, Any] = {
    "source": SOURCE_SCHEMA,
    "jobs_per_pilot": {
        "type": "integer",
        "minimum": 1,
        "maximum": 1_000_000,
        "default": 1,
        "description": "Jobs one pilot runs: W waiting jobs ask for ceil(W / jobs_per_pilot) "
        "pilots, less the group's pilots already waiting.",
    },
    "keep_last": {
        "type": "number",
        "minimum": 0,
        "maximum": _DAY,
        "default": DEFAULT_KEEP_LAST,
        "description": "Seconds a failing source's last good figure is still used; then the "
        "group asks for nothing until the source answers again.",
    },
}


def ca_path_problems(url: str, ca_path: str | None) -> list[tuple[tuple[str | int, ...], str]]:
    """A ``ca_path`` beside a ``url`` that is not https (it validated and was never asked)."""
    if ca_path is not None and not url.startswith("https://"):
        return [(("ca_path",), "ca_path is set but url is not https: no CA is ever asked")]
    return []


@dataclass(frozen=True)
class RedisSourceSettings(Settings):
    """``source.redis`` (:data:`REDIS_SOURCE_SCHEMA`)."""

    section_schema: ClassVar[dict[str, Any]] = REDIS_SOURCE_SCHEMA

    url: str
    key: str
    password: Mapping[str, str] | None
    timeout: float


@dataclass(frozen=True)
class HttpSourceSettings(Settings):
    """``source.http`` (:data:`HTTP_SOURCE_SCHEMA`)."""

    section_schema: ClassVar[dict[str, Any]] = HTTP_SOURCE_SCHEMA

    url: str
    field: str
    timeout: float
    max_bytes: int
    ca_path: str | None

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        return ca_path_problems(self.url, self.ca_path)


@dataclass(frozen=True)
class CommandSourceSettings(Settings):
    """``source.command`` (:data:`COMMAND_SOURCE_SCHEMA`)."""

    section_schema: ClassVar[dict[str, Any]] = COMMAND_SOURCE_SCHEMA

    argv: tuple[str, ...]
    field: str
    timeout: float
    max_bytes: int


@dataclass(frozen=True)
class SourceSettings(Settings):
    """``source:`` of a demand group (:data:`SOURCE_SCHEMA`): exactly one kind is set."""

    section_schema: ClassVar[dict[str, Any]] = SOURCE_SCHEMA

    redis: RedisSourceSettings | None
    http: HttpSourceSettings | None
    command: CommandSourceSettings | None


class SourceError(Exception):
    """A source could not give a count; the message names the source and what was wrong."""


class FetchError(Exception):
    """A source's answer could not be had: an HTTP GET without a complete answer (status,
    timeout, size, connection), a command that did not end well."""


# --- counts -----------------------------------------------------------------------------


def http_get(
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    ca_path: str | None = None,
    accept: str = "application/json",
    client: HttpClient | None = None,
) -> bytes:
    """The body of a GET of ``url`` answered 200, read whole within ``timeout`` seconds, through
    gridgate's one HTTP client (:mod:`gridgate.core.http`: the deadline covers the whole
    exchange, so a server that hangs or trickles is cut at it). Redirects are not followed.

    :param client: the client to reuse (its connections kept alive); None: a new one.
    :raises FetchError: for any status but 200, a body past ``max_bytes``, the deadline, or a
        connection or TLS error; the message says which.
    :raises ValueError: for a URL that is not http(s).
    """
    split_http_url(url)
    own = client is None
    http = client if client is not None else HttpClient(ca_path=ca_path, max_bytes=max_bytes)
    try:
        answer = http.request(
            "GET",
            url,
            timeout=timeout,
            headers={"Accept": accept},
            max_bytes=max_bytes,
            expect=(200,),
        )
    except HttpError as exc:
        raise FetchError(_fetch_problem(exc, timeout, max_bytes)) from None
    finally:
        if own:
            http.close()
    return answer.body


def _fetch_problem(exc: HttpError, timeout: float, max_bytes: int) -> str:
    """What a failed GET tells the people who read the source's error."""
    if exc.phase == "timeout":
        return f"no complete answer within {timeout:g} s ({exc.detail})"
    if exc.phase == "too_large":
        return exc.detail.replace(f"the cap of {max_bytes} bytes", f"max_bytes ({max_bytes} bytes)")
    if exc.phase == "status" and exc.status is not None:
        where = exc.headers.get("location")
        extra = f" (to {where}; redirects are not followed)" if where else ""
        return f"HTTP {exc.status} {exc.reason}{extra}"
    return exc.detail


def split_http_url(url: str) -> SplitResult:
    """``url`` split, once it is known to be an http(s) URL with a host and a valid port.

    :raises ValueError: otherwise.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    try:
        parts.port  # noqa: B018 - the property checks the port
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from None
    return parts


# --- the sources ------------------------------------------------------------------------


class WaitingSource(Protocol):
    """Where a group's waiting jobs are counted."""

    @property
    def name(self) -> str:
        """How messages name the source: its kind and where it reads."""
        ...

    def read(self) -> Reading:
        """The number of jobs waiting now (or per requirement).

        :raises SourceError: when the source cannot give one; the message names the source.
        """
        ...


class _RedisServer:
    """One client of one Redis server, shared by every source on it."""

    def __init__(self, url: str, password: str | None, timeout: float) -> None:
        import redis  # a dependency of the 'redis' extra only: imported where it is used

        self.url, self.timeout = url, timeout
        self._errors: tuple[type[Exception], ...] = (redis.exceptions.RedisError,)
        #: each key's type when last read: the counting command to send with its TYPE
        self._kinds: dict[str, str] = {}
        try:
            self.client = redis.Redis.from_url(
                url,
                password=password,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
            )
        except ValueError as exc:
            raise ValueError(f"redis source: bad url {safe_url(url)}: {exc}") from None

    def counts(self, keys: Sequence[str]) -> list[Reading | str]:
        """For each key its count, or the text of what was wrong; one round trip for all.

        Each key gets TYPE and the counting command of the type it had last time (LLEN the
        first time), pipelined; only a key whose type differs from that guess needs a second
        round trip. Read-only commands only: a user with ``+@read`` is enough, no Lua script
        and no MULTI.
        """
        guesses = [self._kinds.get(key, "list") for key in keys]
        try:
            replies = self._send([(k, g) for k, g in zip(keys, guesses, strict=True)])
        except self._errors as exc:
            return [f"{type(exc).__name__}: {exc}"] * len(keys)
        out: list[Reading | str] = []
        again: list[tuple[int, str]] = []
        for index, key in enumerate(keys):
            kind_reply, reply = replies[2 * index], replies[2 * index + 1]
            if isinstance(kind_reply, Exception):
                out.append(f"TYPE {key}: {kind_reply}")
                continue
            kind = kind_reply.decode() if isinstance(kind_reply, bytes) else str(kind_reply)
            if kind == "none":
                out.append(0)
                continue
            if kind not in _COUNTED:
                out.append(
                    f"the key {key!r} holds a {kind}, not a list, stream, sorted set or hash"
                )
                continue
            self._kinds[key] = kind
            if kind != guesses[index]:
                again.append((index, kind))
                out.append(0)  # replaced below
                continue
            out.append(self._count(key, kind, reply))
        if again:
            try:
                second = self._send([(keys[i], kind) for i, kind in again])
            except self._errors as exc:
                for i, _kind in again:
                    out[i] = f"{type(exc).__name__}: {exc}"
                return out
            for n, (i, kind) in enumerate(again):
                if isinstance(second[2 * n], Exception):
                    out[i] = f"TYPE {keys[i]}: {second[2 * n]}"
                    continue
                out[i] = self._count(keys[i], kind, second[2 * n + 1])
        return out

    def _send(self, commands: Sequence[tuple[str, str]]) -> list[Any]:
        # the timeout bounds each read; a server that answers a byte at a time is cut when the
        # whole round trip (with its connection) has had twice the timeout
        caught: tuple[type[BaseException], ...] = (*self._errors, OSError, ValueError)
        with cut_after(2 * self.timeout, self.client.connection_pool.disconnect) as cut:
            try:
                return self._pipelined(commands)
            except caught as exc:
                # a cut pool may also surface as "I/O operation on closed file"
                if cut.fired:
                    raise self._errors[0](
                        f"no complete answer within {2 * self.timeout:g} s: cut"
                    ) from exc
                raise

    def _pipelined(self, commands: Sequence[tuple[str, str]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        try:
            for key, kind in commands:
                pipe.type(key)
                if kind == "list":
                    pipe.llen(key)
                elif kind == "stream":
                    pipe.xlen(key)
                elif kind == "hash":
                    pipe.hgetall(key)
                else:
                    pipe.zcard(key)
            return list(pipe.execute(raise_on_error=False))
        finally:
            pipe.reset()

    @staticmethod
    def _count(key: str, kind: str, reply: object) -> Reading | str:
        if isinstance(reply, Exception):  # the key changed type between the two commands
            return f"counting the {kind} {key!r}: {reply}"
        try:
            if kind == "hash":
                return _hash_counts(key, reply)
            return waiting_count(reply, f"the {kind} {key!r}'s length")
        except ValueError as exc:
            return str(exc)

    def close(self) -> None:
        self.client.close()


_COUNTED = ("list", "stream", "zset", "hash")
#: The most fields a requirements hash may have.
MAX_HASH_FIELDS = 1000


def _hash_counts(key: str, reply: object) -> tuple[RequirementCount, ...]:
    """A requirements hash (HGETALL): each field a requirement's label, each value its count.

    :raises ValueError: a field that is no requirement, a value that is no count, two fields
        of one requirement, more than :data:`MAX_HASH_FIELDS` fields.
    """
    if not isinstance(reply, dict):
        raise ValueError(f"the hash {key!r} answered {type(reply).__name__}, not its fields")
    if len(reply) > MAX_HASH_FIELDS:
        raise ValueError(f"the hash {key!r} has {len(reply)} fields, more than {MAX_HASH_FIELDS}")
    out: dict[tuple[object, ...], RequirementCount] = {}
    for raw_field, raw_value in reply.items():
        field_text = _text(raw_field, f"a field of the hash {key!r}")
        what = f"the hash {key!r} field {field_text[:80]!r}"
        value_text = _text(raw_value, what)
        if not value_text.isascii() or not value_text.isdigit() or len(value_text) > 12:
            raise ValueError(f"{what} is {value_text[:40]!r}, not a count of jobs")
        label = requirement_of_label(field_text, what)
        counted = RequirementCount(
            count=waiting_count(int(value_text), what),
            cores=label.cores,
            memory_mb=label.memory_mb,
            walltime=label.walltime,
            tags=label.tags,
        )
        same = (label.cores, label.memory_mb, label.walltime, tuple(sorted(label.tags.items())))
        if same in out:
            raise ValueError(f"{what} names a requirement another field names too")
        out[same] = counted
    return tuple(out.values())


def _text(raw: object, what: str) -> str:
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} is not UTF-8") from None
    return str(raw)


class RedisSource:
    """Waiting jobs = the length of a Redis list, stream or sorted set (0 when it is absent)."""

    def __init__(self, server: _RedisServer, key: str) -> None:
        self.server = server
        self.key = key

    @property
    def name(self) -> str:
        return f"redis {safe_url(self.server.url)} key {self.key}"

    def read(self) -> Reading:
        (answer,) = self.server.counts([self.key])
        if isinstance(answer, str):
            raise SourceError(f"{self.name}: {answer}")
        return answer


class HttpSource:
    """Waiting jobs = one field of the JSON object a GET answers."""

    def __init__(
        self,
        url: str,
        field: str,
        *,
        timeout: float = 10.0,
        max_bytes: int = _MIB,
        ca_path: str | None = None,
    ) -> None:
        if split_http_url(url).password is not None:
            raise ValueError(
                f"http source {field}: do not write a password into the url ({safe_url(url)})"
            )
        self.url, self.field = url, field
        self.timeout, self.max_bytes, self.ca_path = timeout, max_bytes, ca_path

    @property
    def name(self) -> str:
        return f"http {safe_url(self.url)} field {self.field}"

    @property
    def answer_key(self) -> tuple[object, ...]:
        """Sources with the same key get the same answer: one GET serves them all."""
        return ("http", self.url, self.timeout, self.max_bytes, self.ca_path)

    def fetch(self) -> bytes:
        """The answer, not yet parsed.

        :raises FetchError: when there is none (the message does not name the source).
        """
        return http_get(
            self.url, timeout=self.timeout, max_bytes=self.max_bytes, ca_path=self.ca_path
        )

    def read(self) -> Reading:
        try:
            return parse_waiting(self.fetch(), self.field)
        except (FetchError, ValueError) as exc:
            raise SourceError(f"{self.name}: {exc}") from None


class CommandSource:
    """Waiting jobs = one field of the JSON object a command prints (argv, no shell)."""

    def __init__(
        self,
        argv: Sequence[str],
        field: str,
        *,
        timeout: float = 30.0,
        max_bytes: int = _MIB,
    ) -> None:
        if isinstance(argv, str) or not argv:
            raise ValueError("command source: argv is a non-empty list, never a shell string")
        self.argv = tuple(argv)
        self.field, self.timeout, self.max_bytes = field, timeout, max_bytes

    @property
    def name(self) -> str:
        return f"command {list(self.argv)} field {self.field}"

    @property
    def answer_key(self) -> tuple[object, ...]:
        """Sources with the same key get the same answer: one run serves them all."""
        return ("command", self.argv, self.timeout, self.max_bytes)

    def fetch(self) -> str:
        """What the command printed, not yet parsed.

        :raises FetchError: when it did not end well (the message does not name the source).
        """
        result = run(self.argv, self.timeout, max_output=self.max_bytes)
        if result.launch_error is not None:
            raise FetchError(f"cannot start: {result.launch_error}")
        if result.timed_out:
            raise FetchError(f"killed after {self.timeout:g} s without an answer")
        if result.returncode != 0:
            tail = result.stderr.strip()[-200:]
            raise FetchError(f"exit code {result.returncode}: {tail!r}")
        if result.stdout_truncated:
            raise FetchError(f"printed more than max_bytes ({self.max_bytes})")
        return result.stdout

    def read(self) -> Reading:
        try:
            return parse_waiting(self.fetch(), self.field)
        except (FetchError, ValueError) as exc:
            raise SourceError(f"{self.name}: {exc}") from None


def _redis_server(
    spec: RedisSourceSettings, servers: dict[tuple[str, str | None, float], _RedisServer]
) -> _RedisServer:
    url = spec.url
    if secret := url_secret(url):  # user:password@ or redis-py's ?password=
        raise ValueError(
            f"redis source key {spec.key}: do not write the password into the url (it "
            f"carries {secret}); give it as password: {{env: VARIABLE}} or password: "
            "{file: PATH}"
        )
    try:
        password = read_secret(spec.password)
    except SecretError as exc:
        raise ValueError(f"redis source {safe_url(url)}: cannot read the password: {exc}") from None
    timeout = spec.timeout
    ident = (url, password, timeout)
    if ident not in servers:
        servers[ident] = _RedisServer(url, password, timeout)
    return servers[ident]


def make_source(
    spec: SourceSettings | Mapping[str, Any],
    _servers: dict[tuple[str, str | None, float], _RedisServer] | None = None,
) -> WaitingSource:
    """The source a ``source:`` section (typed, or as written: :data:`SOURCE_SCHEMA`)
    describes.

    :raises ValueError: for a section that names no known kind, a password in a Redis url, or
        a password file that cannot be read.
    """
    if not isinstance(spec, SourceSettings):
        if not any(kind in spec for kind in ("redis", "http", "command")):
            raise ValueError(f"a source is one of redis, http, command; got {sorted(spec)}")
        spec = SourceSettings.of(spec)
    if spec.redis is not None:
        servers = {} if _servers is None else _servers
        return RedisSource(_redis_server(spec.redis, servers), spec.redis.key)
    if spec.http is not None:
        http = spec.http
        return HttpSource(
            http.url,
            http.field,
            timeout=http.timeout,
            max_bytes=http.max_bytes,
            ca_path=http.ca_path,
        )
    if spec.command is not None:
        command = spec.command
        return CommandSource(
            list(command.argv), command.field, timeout=command.timeout, max_bytes=command.max_bytes
        )
    raise ValueError("a source is one of redis, http, command; got none")


# --- a group's figure over time ------------------------------------------------------------


@dataclass(frozen=True)
class WaitingFigure:
    """What a group's source gives this iteration.

    ``jobs`` is the figure to size with: the fresh count, the last good one while it is at most
    ``keep_last`` seconds old, else 0. ``problem`` says why the source failed this iteration
    (None when it answered); ``started_failing`` and ``recovered`` are true on the one
    iteration where an episode of failures begins or ends, for a caller that tells people;
    ``failing_for`` is how long the source has failed (None while it answers), ``stale`` that
    the last good figure is older than ``keep_last`` (or there is none): ``jobs`` is 0.
    ``by_requirement`` is the figure per requirement when the source counts so (``jobs`` is
    then their sum), else None.
    """

    group: str
    jobs: int
    fresh: bool
    age: float | None = None
    problem: str | None = None
    started_failing: bool = False
    recovered: bool = False
    failing_for: float | None = None
    stale: bool = False
    by_requirement: tuple[RequirementCount, ...] | None = None


class WaitingGauge:
    """One demand group's waiting jobs, asked once per iteration with :meth:`waiting`."""

    def __init__(
        self,
        group: str,
        source: WaitingSource,
        *,
        keep_last: float = DEFAULT_KEEP_LAST,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not (math.isfinite(keep_last) and 0 <= keep_last <= _DAY):
            raise ValueError(f"keep_last must be 0 to {_DAY} seconds, got {keep_last!r}")
        self.group, self.source, self.keep_last, self.clock = group, source, keep_last, clock
        self._last: Reading | None = None
        self._last_at = 0.0
        self._failing_since: float | None = None
        self._dropped = False

    def waiting(self) -> WaitingFigure:
        """Read the source once and give the figure to size with (never raises)."""
        try:
            jobs = self.source.read()
        except SourceError as exc:
            return self.failed(str(exc))
        return self.answered(jobs)

    def answered(self, reading: Reading) -> WaitingFigure:
        """Record a good reading (for callers that read sources in batches)."""
        now = self.clock.monotonic()
        jobs = total_jobs(reading)
        recovered = self._failing_since is not None
        if recovered:
            logger.info(
                "waiting work of group {}: {} answers again ({} jobs) after {:.0f} s",
                self.group,
                self.source.name,
                jobs,
                now - (self._failing_since or now),
            )
        self._last, self._last_at = reading, now
        self._failing_since, self._dropped = None, False
        return WaitingFigure(
            self.group,
            jobs,
            fresh=True,
            age=0.0,
            recovered=recovered,
            by_requirement=None if isinstance(reading, int) else reading,
        )

    def failed(self, problem: str) -> WaitingFigure:
        """Record a failed reading and give what the group may still use."""
        now = self.clock.monotonic()
        started = self._failing_since is None
        age = None if self._last is None else now - self._last_at
        held = self._last is not None and age is not None and age <= self.keep_last
        if started:
            self._failing_since = now
            if held and self._last is not None:
                effect = (
                    f"keeping the last figure, {total_jobs(self._last)} jobs read {age:.0f} s "
                    f"ago, for up to {self.keep_last:g} s"
                )
            elif self._last is not None:
                effect = (
                    f"its last figure is older than keep_last ({self.keep_last:g} s): asking "
                    "for no pilots until it answers"
                )
            else:
                effect = "no figure to keep: asking for no pilots until it answers"
            logger.error(
                "waiting work of group {}: cannot read {}; {}", self.group, problem, effect
            )
        elif not held and not self._dropped and self._last is not None:
            logger.warning(
                "waiting work of group {}: {} still fails; its last figure is older than "
                "keep_last ({:g} s): asking for no pilots until it answers",
                self.group,
                self.source.name,
                self.keep_last,
            )
        if not held:
            self._dropped = True
        kept = self._last if held else None
        return WaitingFigure(
            self.group,
            0 if kept is None else total_jobs(kept),
            fresh=False,
            age=age,
            problem=problem,
            started_failing=started,
            failing_for=now - (self._failing_since or now),
            stale=not held,
            by_requirement=None if kept is None or isinstance(kept, int) else kept,
        )


class WaitingGauges:
    """Every group's gauge, built from ``{group: source section}``; :meth:`waiting_all` reads
    them once per iteration, the Redis keys of one server in one pipelined round trip."""

    def __init__(
        self,
        sources: Mapping[str, SourceSettings | Mapping[str, Any]],
        *,
        keep_last: Mapping[str, float] | float = DEFAULT_KEEP_LAST,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._servers: dict[tuple[str, str | None, float], _RedisServer] = {}
        self.gauges: dict[str, WaitingGauge] = {}
        for group, spec in sources.items():
            keep = (
                keep_last
                if isinstance(keep_last, (int, float))
                else keep_last.get(group, DEFAULT_KEEP_LAST)
            )
            source = make_source(spec, self._servers)
            self.gauges[group] = WaitingGauge(group, source, keep_last=float(keep), clock=clock)

    def waiting_all(self) -> dict[str, WaitingFigure]:
        """Every group's figure this iteration (never raises).

        Sources that share an answer share one read: the Redis keys of one server go in one
        pipelined round trip, groups reading fields of one URL (or of one command's output)
        get one GET (one run) between them.
        """
        figures: dict[str, WaitingFigure] = {}
        by_server: dict[int, list[WaitingGauge]] = {}
        answers: dict[tuple[object, ...], bytes | str | FetchError] = {}
        for group, gauge in self.gauges.items():
            source = gauge.source
            if isinstance(source, RedisSource):
                by_server.setdefault(id(source.server), []).append(gauge)
                continue
            if not isinstance(source, (HttpSource, CommandSource)):
                figures[group] = gauge.waiting()
                continue
            if source.answer_key not in answers:
                try:
                    answers[source.answer_key] = source.fetch()
                except FetchError as exc:
                    answers[source.answer_key] = exc
            answer = answers[source.answer_key]
            try:
                if isinstance(answer, FetchError):
                    raise answer
                figures[group] = gauge.answered(parse_waiting(answer, source.field))
            except (FetchError, ValueError) as exc:
                figures[group] = gauge.failed(f"{source.name}: {exc}")
        for gauges in by_server.values():
            sources = [g.source for g in gauges if isinstance(g.source, RedisSource)]
            counts = sources[0].server.counts([s.key for s in sources])
            for gauge, redis_source, count in zip(gauges, sources, counts, strict=True):
                figures[gauge.group] = (
                    gauge.failed(f"{redis_source.name}: {count}")
                    if isinstance(count, str)
                    else gauge.answered(count)
                )
        return {group: figures[group] for group in self.gauges}

    def close(self) -> None:
        """Close the Redis connections."""
        for server in self._servers.values():
            server.close()


# --- sizing -----------------------------------------------------------------------------


def pilots_for(
    waiting_jobs: int,
    jobs_per_pilot: int,
    waiting_pilots: int,
    max_per_iteration: int | None = None,
) -> int:
    """Pilots to submit for a group: ``ceil(waiting_jobs / jobs_per_pilot)`` less the group's
    pilots already waiting, never below zero, at most ``max_per_iteration``.

    Rounded up: a remainder of jobs smaller than ``jobs_per_pilot`` still gets a pilot, else
    three jobs in a group of four per pilot would wait for ever. Rounding happens before the
    waiting pilots are taken off, in whole pilots, so the pilots waiting after a submission are
    exactly ``ceil(W/k)`` when fewer waited, and never more than were already waiting otherwise
    (surplus pilots are not cancelled here: they run down by themselves). The director's limits
    (``max_waiting`` and the others) trim the answer further.

    :raises ValueError: for a negative figure, a ``jobs_per_pilot`` below 1, or a bool.
    """
    for name, value in (
        ("waiting_jobs", waiting_jobs),
        ("jobs_per_pilot", jobs_per_pilot),
        ("waiting_pilots", waiting_pilots),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if jobs_per_pilot < 1:
        raise ValueError(f"jobs_per_pilot must be at least 1, got {jobs_per_pilot}")
    wanted = -(-waiting_jobs // jobs_per_pilot)  # ceil in integers: exact for any size
    pilots = max(0, wanted - waiting_pilots)
    if max_per_iteration is not None:
        if isinstance(max_per_iteration, bool) or max_per_iteration < 0:
            raise ValueError(f"max_per_iteration must be >= 0, got {max_per_iteration!r}")
        pilots = min(pilots, max_per_iteration)
    return pilots
