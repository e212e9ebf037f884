"""GOCDB downtimes as endpoint availability: read GOCDB's ``get_downtime`` XML from a URL or a
file every ``refresh`` seconds, and say which endpoints an ongoing downtime bans (``OUTAGE``)
or degrades (``WARNING``), and which downtimes started or ended since the last look.

The feed is the one GOCDB's programmatic interface serves (and DIRAC's ``GOCDBClient`` reads):
``<results>`` holding ``<DOWNTIME ID=.. PRIMARY_KEY=.. CLASSIFICATION=..>`` elements with
``HOSTNAME``, ``SEVERITY``, ``DESCRIPTION``, ``GOCDB_PORTAL_URL``, and the times twice: Unix
seconds in ``START_DATE``/``END_DATE`` and UTC text in ``FORMATED_START_DATE``/
``FORMATED_END_DATE`` (``2016-11-16 10:30``). The Unix seconds are used; the text only when
they are missing. Downtimes of a whole site (``SITENAME``, no ``HOSTNAME``) name no host and
are left out.

:class:`GocdbAvailability` is what a director asks once per iteration; the pieces under it
(:func:`parse_downtimes`, :class:`DowntimeIndex`, :class:`GocdbFeed`, :class:`ChangeTracker`)
are usable alone.
"""

from __future__ import annotations

import calendar
import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit
from xml.parsers import expat

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.builtin.waiting import FetchError, http_get, split_http_url
from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.files import InputFileError, read_regular
from gridgate.core.model import AVAILABILITY_STATES, AVAILABLE, Availability, Endpoint
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.text import safe_url

__all__ = [
    "AVAILABLE",
    "GOCDB_SCHEMA",
    "STATES",
    "Availability",
    "AvailabilityChange",
    "ChangeTracker",
    "Downtime",
    "DowntimeIndex",
    "Feed",
    "FeedError",
    "GocdbAvailability",
    "GocdbFeed",
    "GocdbSource",
    "endpoint_host",
    "parse_downtimes",
]

_DAY = 86400
_MIB = 1024 * 1024

#: Seconds the last good feed stays in force while GOCDB cannot be read. Downtimes are
#: declared ahead of time (a scheduled one at least a day before), so an hour-old feed still
#: holds nearly every ongoing one; an hour also covers GOCDB's own maintenance windows. Past it
#: the feed is taken for unknown, and every endpoint counts as available as far as GOCDB goes:
#: banning everything because GOCDB is down would stop a VO for a reason none of its sites has.
DEFAULT_KEEP_LAST = 3600.0

GOCDB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "GOCDB downtimes: an OUTAGE on an endpoint's host bans it for the downtime, "
    "a WARNING degrades it.",
    "properties": {
        "url": {
            "type": "string",
            "pattern": "^(https?://[^/]|file://)",
            "description": "GOCDB's get_downtime URL (e.g. https://goc.egi.eu/gocdbpi/public/"
            "?method=get_downtime&ongoing_only=yes), or file:///PATH of a local copy.",
        },
        "refresh": {
            "type": "number",
            "minimum": 1,
            "maximum": _DAY,
            "default": 600,
            "description": "Seconds between two reads of the feed.",
        },
        "keep_last": {
            "type": "number",
            "minimum": 0,
            "maximum": _DAY,
            "default": DEFAULT_KEEP_LAST,
            "description": "Seconds the last good feed stays in force while the feed cannot be "
            "read; then no downtime is known.",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": _DAY,
            "default": 60,
            "description": "Seconds for one whole read, connection to last byte.",
        },
        "max_bytes": {
            "type": "integer",
            "minimum": 1024,
            "maximum": 1024 * _MIB,
            "default": 16 * _MIB,
            "description": "A feed longer than this is refused (the last good one stays).",
        },
        "ca_path": {
            "type": "string",
            "x-gridgate-path": True,
            "minLength": 1,
            "description": "Folder of CA certificates for https, e.g. "
            "/etc/grid-security/certificates (GOCDB's host certificate is an IGTF one).",
        },
    },
    "required": ["url"],
    "additionalProperties": False,
}

#: An endpoint's states, from fully usable to not used at all (``Availability`` and these
#: live in core/model.py, since they cross the ``gridgate_endpoint_availability`` hook).
STATES = AVAILABILITY_STATES


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


def _time(fields: Mapping[str, str], name: str) -> float:
    raw = fields.get(f"{name}_DATE", "")
    if raw:
        if not raw.isdigit():
            raise ValueError(f"{name}_DATE is {raw[:40]!r}, not Unix seconds")
        return float(int(raw))
    text = fields.get(f"FORMATED_{name}_DATE", "")
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
        fields = {c.tag: "".join(c.text).strip() for c in node.children if not c.children}
        ident = (
            node.attrs.get("PRIMARY_KEY")
            or fields.get("PRIMARY_KEY")
            or node.attrs.get("ID")
            or f"#{index + 1}"
        )
        host = fields.get("HOSTNAME", "").strip().lower().rstrip(".")
        if not host:
            continue  # a whole site's downtime: no host to match an endpoint by
        severity = fields.get("SEVERITY", "").upper()
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
                description=fields.get("DESCRIPTION", ""),
                portal_url=fields.get("GOCDB_PORTAL_URL", ""),
                service_type=fields.get("SERVICE_TYPE", ""),
            )
        )
    return Feed(tuple(downtimes), tuple(problems))


# --- from downtimes to states -------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def endpoint_host(endpoint: str) -> str | None:
    """The host of an endpoint given as a URL (``https://ce.example.org:8443/arex``), as
    ``HOST:PORT/PATH`` (``wms.example.org:7443/glite_wms_wmproxy_server``) or as a bare name;
    lower case, without a trailing dot. None when there is none (an empty string). Cached:
    the same endpoints are asked every iteration."""
    text = endpoint.strip()
    if not text:
        return None
    try:
        host = urlsplit(text if "://" in text else f"//{text}").hostname
    except ValueError:
        host = None
    if not host:
        return None
    return host.rstrip(".") or None


def _describe(downtime: Downtime) -> str:
    what = downtime.description or "no description"
    where = f" ({downtime.portal_url})" if downtime.portal_url else ""
    return f"GOCDB downtime {downtime.id} ({downtime.severity}) of {downtime.host}: {what}{where}"


class DowntimeIndex:
    """A feed's downtimes by host, to answer many endpoints per iteration cheaply."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self._by_host: dict[str, list[Downtime]] = {}
        for downtime in feed.downtimes:
            self._by_host.setdefault(downtime.host, []).append(downtime)

    def state(self, endpoint: str, now: float) -> Availability:
        """The endpoint's state at ``now``: banned by an ongoing OUTAGE until its end, else
        degraded by an ongoing WARNING, else available. Of several ongoing downtimes of one
        severity, the one ending last gives the end and the reason; downtimes still to come
        or already ended do nothing."""
        host = endpoint_host(endpoint)
        if host is None:
            return AVAILABLE
        found = self._by_host.get(host)
        if not found:
            return AVAILABLE
        for severity, state in (("OUTAGE", "banned"), ("WARNING", "degraded")):
            ongoing = [d for d in found if d.severity == severity and d.ongoing(now)]
            if ongoing:
                last = max(ongoing, key=lambda d: (d.end, d.id))
                return Availability(state, _describe(last), last.end, "gocdb")
        return AVAILABLE


@dataclass(frozen=True)
class AvailabilityChange:
    """An endpoint whose state or reason changed since the last look."""

    endpoint: str
    before: Availability
    after: Availability
    #: what the reader should know beyond the states (why a downtime seems to end early)
    note: str = ""

    @property
    def kind(self) -> str:
        """``started`` (it was available), ``ended`` (it is available again) or ``changed``."""
        if self.before.state == "available":
            return "started"
        if self.after.state == "available":
            return "ended"
        return "changed"

    def describe(self) -> str:
        """One line for a notice."""
        note = f" ({self.note})" if self.note else ""
        if self.kind == "ended":
            if self.note:
                return f"{self.endpoint}: counted as available again{note}"
            return f"{self.endpoint}: available again ({self.before.reason} is over)"
        until = (
            ""
            if self.after.until is None
            else time.strftime(" until %Y-%m-%d %H:%M UTC", time.gmtime(self.after.until))
        )
        return f"{self.endpoint}: {self.after.state}{until}: {self.after.reason}{note}"


class ChangeTracker:
    """What changed between one look at the endpoints and the next.

    The first look compares with "all available": a director that starts during a downtime
    says once that it is on. An endpoint that leaves the list is forgotten without a change.
    """

    def __init__(self) -> None:
        self._last: dict[str, Availability] = {}

    def update(
        self, states: Mapping[str, Availability], note: str = ""
    ) -> list[AvailabilityChange]:
        """Record ``states`` and give the endpoints whose state or reason changed, each with
        ``note``."""
        changes = []
        for endpoint, after in states.items():
            before = self._last.get(endpoint, AVAILABLE)
            if (before.state, before.reason) != (after.state, after.reason):
                changes.append(AvailabilityChange(endpoint, before, after, note))
        self._last = dict(states)
        return changes


# --- reading the feed ---------------------------------------------------------------------


def _read_file(url: str, max_bytes: int) -> bytes:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise FeedError(f"a file:// URL names a local file, not one on {parts.netloc}")
    path = unquote(parts.path)
    try:
        # non-blocking, a regular file only: a FIFO in the feed's place cannot hang the director
        return read_regular(path, max_bytes=max_bytes)
    except InputFileError as exc:
        if exc.too_large:
            raise FeedError(f"the file is longer than max_bytes ({max_bytes} bytes)") from None
        raise FeedError(f"cannot read {exc}") from None


class GocdbFeed:
    """The GOCDB feed in force: read every ``refresh`` seconds of the injected clock; while it
    cannot be read, the last good one for ``keep_last`` seconds after it was read, then none.

    One error when an episode of failures starts, one warning when the last good feed runs out,
    one notice when the feed is read again; entries of a feed that had to be left out are
    logged once per distinct list.
    """

    def __init__(
        self,
        url: str,
        *,
        refresh: float = 600.0,
        keep_last: float = DEFAULT_KEEP_LAST,
        timeout: float = 60.0,
        max_bytes: int = 16 * _MIB,
        ca_path: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        scheme = urlsplit(url).scheme
        if scheme not in ("http", "https", "file"):
            raise ValueError(f"GOCDB feed: {safe_url(url)!r} is not an http(s):// or file:// URL")
        if scheme != "file":
            split_http_url(url)
        for name, value, low in (("refresh", refresh, 1), ("keep_last", keep_last, 0)):
            if not (math.isfinite(value) and low <= value <= _DAY):
                raise ValueError(f"GOCDB feed: {name} must be {low} to {_DAY} s, got {value!r}")
        self.url, self.refresh, self.keep_last = url, refresh, keep_last
        self.shown = safe_url(url)  # as messages name it: no token a query may carry
        self.timeout, self.max_bytes, self.ca_path = timeout, max_bytes, ca_path
        self.clock = clock
        self._feed: Feed | None = None
        self._read_at: float | None = None
        self._tried_at: float | None = None
        self._failing_since: float | None = None
        self._ran_out = False
        self._problems: tuple[str, ...] = ()
        #: what went wrong at the last read (None: it worked)
        self.problem: str | None = None

    def _fetch(self) -> bytes:
        if urlsplit(self.url).scheme == "file":
            return _read_file(self.url, self.max_bytes)
        try:
            return http_get(
                self.url,
                timeout=self.timeout,
                max_bytes=self.max_bytes,
                ca_path=self.ca_path,
                accept="application/xml, text/xml",
            )
        except FetchError as exc:
            raise FeedError(str(exc)) from None

    def current(self) -> Feed | None:
        """The feed in force now, reading it first when ``refresh`` seconds have passed since
        the last attempt; None when none is known (never read, or the last good one is older
        than ``keep_last``). Never raises."""
        now = self.clock.monotonic()
        if self._tried_at is None or now - self._tried_at >= self.refresh:
            self._tried_at = now
            try:
                feed = parse_downtimes(self._fetch())
            except FeedError as exc:
                self._failed(str(exc), now)
            else:
                self._succeeded(feed, now)
        if self._feed is None or self._read_at is None:
            return None
        if now - self._read_at > self.keep_last:
            if not self._ran_out:
                self._ran_out = True
                logger.warning(
                    "GOCDB feed {}: still not readable and the last good feed is older than "
                    "keep_last ({:g} s): no downtime is known, endpoints count as available",
                    self.shown,
                    self.keep_last,
                )
            return None
        return self._feed

    def _failed(self, problem: str, now: float) -> None:
        self.problem = problem
        if self._failing_since is not None:
            return
        self._failing_since = now
        if self._read_at is not None and now - self._read_at <= self.keep_last:
            effect = (
                f"keeping the feed read {now - self._read_at:.0f} s ago for up to "
                f"{self.keep_last:g} s"
            )
        else:
            effect = "no earlier feed: no downtime is known"
        logger.error("GOCDB feed {}: cannot read: {}; {}", self.shown, problem, effect)

    def _succeeded(self, feed: Feed, now: float) -> None:
        if self._failing_since is not None:
            logger.info(
                "GOCDB feed {}: read again after {:.0f} s ({} downtimes)",
                self.shown,
                now - self._failing_since,
                len(feed.downtimes),
            )
        if feed.problems and feed.problems != self._problems:
            logger.warning(
                "GOCDB feed {}: {} entries left out: {}",
                self.shown,
                len(feed.problems),
                "; ".join(feed.problems[:5]),
            )
        self._problems = feed.problems
        self._feed, self._read_at = feed, now
        self._failing_since, self._ran_out, self.problem = None, False, None


class GocdbAvailability:
    """What GOCDB says of each endpoint, asked once per iteration with :meth:`evaluate`.

    Built from a validated ``gocdb`` section (:data:`GOCDB_SCHEMA`).
    """

    def __init__(self, config: Mapping[str, Any], clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.feed = GocdbFeed(
            str(config["url"]),
            refresh=float(config.get("refresh", 600)),
            keep_last=float(config.get("keep_last", DEFAULT_KEEP_LAST)),
            timeout=float(config.get("timeout", 60)),
            max_bytes=int(config.get("max_bytes", 16 * _MIB)),
            ca_path=config.get("ca_path"),
            clock=clock,
        )
        self.tracker = ChangeTracker()
        self._index: DowntimeIndex | None = None

    def evaluate(
        self, endpoints: Iterable[str]
    ) -> tuple[dict[str, Availability], list[AvailabilityChange]]:
        """Every endpoint's state now (by its host), and the downtimes that started or ended
        since the last call, one change per endpoint, for one notice each. Never raises."""
        feed = self.feed.current()
        if feed is None:
            self._index = None
        elif self._index is None or self._index.feed is not feed:
            self._index = DowntimeIndex(feed)
        now = self.clock.time()
        index = self._index
        states = {e: (AVAILABLE if index is None else index.state(e, now)) for e in endpoints}
        note = (
            ""
            if index is not None or self.feed.problem is None
            else f"GOCDB feed unreadable for over {self.feed.keep_last:g} s: downtimes unknown"
        )
        return states, self.tracker.update(states, note)


class GocdbSource(Plugin):
    """The ``gocdb`` availability source: ``availability: {gocdb: {url: ..., refresh: 600}}``.
    An ongoing OUTAGE on an endpoint's host (of its ``url``, else its name) bans it until the
    downtime ends, a WARNING degrades it; the director mails no failure of an endpoint in a
    downtime. The feed is read at most every ``refresh`` seconds (:class:`GocdbFeed`)."""

    config_schema: ClassVar[dict[str, Any]] = GOCDB_SCHEMA

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self.source = GocdbAvailability(config, context.clock)

    @hookimpl
    def gridgate_endpoint_availability(
        self, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, Availability] | None:
        where = {e.key: (e.url or e.name) for e in endpoints}
        states, _changes = self.source.evaluate(dict.fromkeys(where.values()))
        return {
            key: states[address]
            for key, address in where.items()
            if states[address].state != "available"
        }
