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

import functools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.builtin.documents import Downtime, Feed, FeedError, parse_downtimes
from gridgate.core.builtin.waiting import FetchError, ca_path_problems, http_get, split_http_url
from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.files import InputFileError, read_regular
from gridgate.core.model import AVAILABILITY_STATES, AVAILABLE, Availability, Endpoint
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.settings import Settings
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
    "GocdbSettings",
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


@dataclass(frozen=True)
class GocdbSettings(Settings):
    """The ``availability.gocdb`` section (:data:`GOCDB_SCHEMA`; defaults from there)."""

    section_schema: ClassVar[dict[str, Any]] = GOCDB_SCHEMA

    url: str
    refresh: float
    keep_last: float
    timeout: float
    max_bytes: int
    ca_path: str | None

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        return ca_path_problems(self.url, self.ca_path)


#: An endpoint's states, from fully usable to not used at all (``Availability`` and these
#: live in core/model.py, since they cross the ``gridgate_endpoint_availability`` hook).
STATES = AVAILABILITY_STATES


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

    Built from a ``gocdb`` section's settings (or the section as written:
    :data:`GOCDB_SCHEMA`).
    """

    def __init__(
        self, config: GocdbSettings | Mapping[str, Any], clock: Clock = SYSTEM_CLOCK
    ) -> None:
        settings = config if isinstance(config, GocdbSettings) else GocdbSettings.of(config)
        self.clock = clock
        self.feed = GocdbFeed(
            settings.url,
            refresh=settings.refresh,
            keep_last=settings.keep_last,
            timeout=settings.timeout,
            max_bytes=settings.max_bytes,
            ca_path=settings.ca_path,
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
    settings_class = GocdbSettings
    settings: GocdbSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self.source = GocdbAvailability(self.settings, context.clock)

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
