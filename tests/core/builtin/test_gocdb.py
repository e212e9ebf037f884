"""GOCDB downtimes (core/builtin/gocdb.py): the real get_downtime format (tests/core/fixtures/gocdb/),
a parser that refuses DTDs, endpoint states from ongoing downtimes, what changed between two
looks, and the feed read from a file:// URL and from a real HTTP server with a fake clock."""

from __future__ import annotations

import calendar
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from support.servers import make_cert
from support.web import Answers, WebServer

from gridgate.core.builtin.gocdb import (
    GOCDB_SCHEMA,
    ChangeTracker,
    Downtime,
    DowntimeIndex,
    Feed,
    FeedError,
    GocdbAvailability,
    GocdbFeed,
    endpoint_host,
    parse_downtimes,
)
from gridgate.core.clock import FakeClock
from gridgate.core.model import AVAILABLE, Availability

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gocdb" / "downtimes.xml"
#: the clock time the fixture is written for (FakeClock's default start)
NOW = 1_700_000_000.0
CE = "https://ce1.example.org:443/arex"
WMS = "https://wms.example.org:7443/glite_wms_wmproxy_server"
QUIET = "https://ce2.example.org:443/arex"


def _feed() -> Feed:
    return parse_downtimes(FIXTURE.read_bytes())


def _downtime(ident: str, host: str, severity: str, start: int, end: int) -> str:
    return (
        f'<DOWNTIME ID="{ident}" PRIMARY_KEY="{ident}G0" CLASSIFICATION="SCHEDULED">'
        f"<PRIMARY_KEY>{ident}G0</PRIMARY_KEY><HOSTNAME>{host}</HOSTNAME>"
        f"<SEVERITY>{severity}</SEVERITY><DESCRIPTION>d{ident}</DESCRIPTION>"
        f"<START_DATE>{start}</START_DATE><END_DATE>{end}</END_DATE></DOWNTIME>"
    )


def _doc(*downtimes: str) -> bytes:
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<results>' + "".join(downtimes)).encode() + (
        b"</results>\n"
    )


# --- parsing -------------------------------------------------------------------------------


def test_the_fixture_parses_into_its_host_downtimes() -> None:
    feed = _feed()
    assert feed.problems == ()
    assert [(d.id, d.host, d.severity) for d in feed.downtimes] == [
        ("130001G0", "ce1.example.org", "OUTAGE"),
        ("130002G0", "ce1.example.org", "WARNING"),
        ("130003G0", "ce1.example.org", "OUTAGE"),
        ("130004G0", "wms.example.org", "WARNING"),
    ]  # 130005G0 is a whole site's downtime: no HOSTNAME, no host to match
    first = feed.downtimes[0]
    assert (first.start, first.end) == (1699990000.0, 1700010000.0)
    assert first.description == "Storage and CE upgrade"
    assert first.portal_url == "https://goc.egi.eu/portal/index.php?Page_Type=Downtime&id=30001"
    assert first.service_type == "ARC-CE"


def test_the_fixtures_formatted_dates_are_its_unix_seconds_to_the_minute() -> None:
    text = FIXTURE.read_text()
    starts = [int(s.split("<")[0]) for s in text.split("<START_DATE>")[1:]]
    formatted = [s.split("<")[0] for s in text.split("<FORMATED_START_DATE>")[1:]]
    assert len(starts) == len(formatted) == 5
    for unix, shown in zip(starts, formatted, strict=True):
        assert calendar.timegm(time.strptime(shown, "%Y-%m-%d %H:%M")) == unix - unix % 60


def test_the_formatted_dates_are_used_when_the_unix_seconds_are_missing() -> None:
    doc = (
        b"<results><DOWNTIME PRIMARY_KEY='9G0'><HOSTNAME>h.example</HOSTNAME>"
        b"<SEVERITY>OUTAGE</SEVERITY><FORMATED_START_DATE>2023-11-14 19:26</FORMATED_START_DATE>"
        b"<FORMATED_END_DATE>2023-11-15 01:00</FORMATED_END_DATE></DOWNTIME></results>"
    )
    (downtime,) = parse_downtimes(doc).downtimes
    assert (downtime.start, downtime.end) == (1699989960.0, 1700010000.0)


def test_paging_metadata_and_unknown_elements_are_left_aside() -> None:
    doc = _doc(
        "<meta><count>1</count><link rel='self' href='https://goc.egi.eu/x'/></meta>",
        _downtime("1", "H.Example.ORG.", "OUTAGE", 1, 2),
        "<SOMETHING_NEW/>",
    )
    (downtime,) = parse_downtimes(doc).downtimes
    assert downtime.host == "h.example.org"


def test_an_empty_results_document_is_a_feed_without_downtimes() -> None:
    assert parse_downtimes(b"<results/>") == Feed(())


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        (
            b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;'
            b'&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>'
            b"<results>&c;</results>",
            "a DOCTYPE",
        ),
        (
            b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            b"<results>&x;</results>",
            "a DOCTYPE",
        ),
        (b"<!DOCTYPE results SYSTEM 'http://127.0.0.1:9/x.dtd'><results/>", "a DOCTYPE"),
        (b"<results>&undeclared;</results>", "not well-formed"),
        (b"<html><body>GOCDB is in maintenance</body></html>", "root element is <html>"),
        (b"<ROOT><DOWNTIME/></ROOT>", "root element is <ROOT>"),
        (b"<results><DOWNTIME>", "not well-formed"),
        (b"", "not well-formed"),
        (b'{"downtimes": []}', "not well-formed"),
        (b"<results>" + b"<a>" * 40 + b"</a>" * 40 + b"</results>", "nested deeper"),
    ],
)
def test_what_is_not_a_gocdb_results_document_is_refused_clearly(doc: bytes, said: str) -> None:
    with pytest.raises(FeedError, match=None) as caught:
        parse_downtimes(doc)
    assert said in str(caught.value)


def test_an_unusable_entry_is_left_out_and_named_and_the_rest_stands() -> None:
    doc = _doc(
        _downtime("1", "a.example", "AT_RISK", 1, 2),
        _downtime("2", "b.example", "OUTAGE", 5, 3),
        _downtime("3", "c.example", "OUTAGE", 1, 2).replace("<START_DATE>1", "<START_DATE>x1"),
        _downtime("4", "d.example", "OUTAGE", 1, 2).replace("<END_DATE>2</END_DATE>", ""),
        _downtime("5", "e.example", "warning", 1, 2),
    )
    feed = parse_downtimes(doc)
    assert [(d.host, d.severity) for d in feed.downtimes] == [("e.example", "WARNING")]
    assert feed.problems == (
        "downtime 1G0 of a.example: SEVERITY is 'AT_RISK', not OUTAGE or WARNING",
        "downtime 2G0 of b.example: it ends before it starts",
        "downtime 3G0 of c.example: START_DATE is 'x1', not Unix seconds",
        "downtime 4G0 of d.example: no END_DATE",
    )


# --- states --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "host"),
    [
        ("https://CE1.Example.org:443/arex", "ce1.example.org"),
        ("ce1.example.org", "ce1.example.org"),
        ("ce1.example.org.", "ce1.example.org"),
        ("wms.example.org:7443/glite_wms_wmproxy_server", "wms.example.org"),
        ("gsiftp://se.example.org:2811/dpm", "se.example.org"),
        ("https://[2001:db8::1]:8443/arex", "2001:db8::1"),
        ("", None),
        ("   ", None),
        ("https:///nohost", None),
    ],
)
def test_an_endpoints_host_comes_from_its_url_or_name(endpoint: str, host: str | None) -> None:
    assert endpoint_host(endpoint) == host


def test_an_ongoing_outage_bans_a_warning_degrades_others_are_available() -> None:
    index = DowntimeIndex(_feed())
    banned = index.state(CE, NOW)
    assert (banned.state, banned.until, banned.source) == ("banned", 1700010000.0, "gocdb")
    assert "130001G0 (OUTAGE)" in banned.reason and "Storage and CE upgrade" in banned.reason
    assert "Page_Type=Downtime&id=30001" in banned.reason
    degraded = index.state(WMS, NOW)
    assert (degraded.state, degraded.until) == ("degraded", 1700005000.0)
    assert "Database at risk" in degraded.reason
    assert index.state(QUIET, NOW) == AVAILABLE
    assert index.state("EXAMPLE-LCG2", NOW) == AVAILABLE  # the site downtime names no host


def test_future_and_ended_downtimes_do_nothing_and_the_bounds_are_start_in_end_out() -> None:
    index = DowntimeIndex(_feed())
    assert index.state(CE, 1700010000.0) == AVAILABLE  # the outage's end: over
    assert index.state(CE, 1699990000.0).state == "banned"  # its start: on
    assert index.state(CE, 1700099999.0) == AVAILABLE  # the warning is still to come
    assert index.state(CE, 1700100000.0).state == "degraded"
    assert index.state(CE, 1699850000.0).state == "banned"  # the ended outage, when it was on
    assert index.state(CE, 1699950000.0) == AVAILABLE  # between the two outages


def test_an_outage_wins_over_a_warning_and_the_latest_end_gives_until() -> None:
    index = DowntimeIndex(
        parse_downtimes(
            _doc(
                _downtime("1", "h.example", "WARNING", 0, 900),
                _downtime("2", "h.example", "OUTAGE", 0, 200),
                _downtime("3", "h.example", "OUTAGE", 50, 300),
            )
        )
    )
    now = index.state("h.example", 100)
    assert (now.state, now.until) == ("banned", 300.0) and "3G0" in now.reason
    later = index.state("h.example", 400)
    assert (later.state, later.until) == ("degraded", 900.0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a.example", "b.example"]),
            st.sampled_from(["OUTAGE", "WARNING"]),
            st.integers(0, 100),
            st.integers(0, 100),
        ),
        max_size=12,
    ),
    st.integers(-10, 210),
)
def test_a_hosts_state_is_its_worst_ongoing_downtime_until_the_latest_end_of_that_kind(
    rows: list[tuple[str, str, int, int]], now: int
) -> None:
    downtimes = tuple(
        Downtime(f"{n}G0", host, severity, float(start), float(start + length))
        for n, (host, severity, start, length) in enumerate(rows)
    )
    index = DowntimeIndex(Feed(downtimes))
    for host in ("a.example", "b.example"):
        state = index.state(f"https://{host}:443/x", now)
        on = [d for d in downtimes if d.host == host and d.start <= now < d.end]
        outages = [d.end for d in on if d.severity == "OUTAGE"]
        warnings = [d.end for d in on if d.severity == "WARNING"]
        if outages:
            assert (state.state, state.until) == ("banned", max(outages))
        elif warnings:
            assert (state.state, state.until) == ("degraded", max(warnings))
        else:
            assert state == AVAILABLE
        assert state.until is None or state.until > now


def test_an_availability_has_one_of_the_four_states() -> None:
    for state in ("available", "degraded", "drained", "banned"):
        assert Availability(state).state == state
    with pytest.raises(ValueError, match="not one of"):
        Availability("offline")


def test_changes_say_when_a_downtime_starts_and_ends_once_each() -> None:
    tracker = ChangeTracker()
    ban = Availability("banned", "GOCDB downtime 1G0 (OUTAGE) of h: x", 300.0, "gocdb")
    warn = Availability("degraded", "GOCDB downtime 2G0 (WARNING) of h: y", 900.0, "gocdb")
    (started,) = tracker.update({"h": ban, "g": AVAILABLE})
    assert (started.endpoint, started.kind) == ("h", "started")
    assert "h: banned until 1970-01-01 00:05 UTC: GOCDB downtime 1G0" in started.describe()
    assert tracker.update({"h": ban, "g": AVAILABLE}) == []
    (changed,) = tracker.update({"h": warn, "g": AVAILABLE})
    assert changed.kind == "changed"
    (ended,) = tracker.update({"h": AVAILABLE, "g": AVAILABLE})
    assert ended.kind == "ended" and "available again (GOCDB downtime 2G0" in ended.describe()
    tracker.update({"h": ban})
    assert tracker.update({}) == []  # an endpoint taken out of the config: no notice


# --- the feed ------------------------------------------------------------------------------


def test_a_file_feed_is_read_every_refresh_kept_while_unreadable_then_dropped(
    tmp_path: Path, logs: list[tuple[str, str]]
) -> None:
    path = tmp_path / "downtimes.xml"
    path.write_bytes(FIXTURE.read_bytes())
    clock = FakeClock()
    feed = GocdbFeed(path.as_uri(), refresh=600, keep_last=1800, clock=clock)
    first = feed.current()
    assert first is not None and len(first.downtimes) == 4
    path.write_bytes(_doc())
    clock.advance(599)
    assert feed.current() is first  # not re-read before refresh
    clock.advance(1)
    fresh = feed.current()
    assert fresh is not None and fresh.downtimes == ()
    path.unlink()
    for _ in range(3):  # read at 1200, 1800, 2400 s: kept, the last good read was at 600 s
        clock.advance(600)
        assert feed.current() is fresh
        assert feed.problem is not None and "No such file" in feed.problem
    clock.advance(1)  # 1801 s after the last good read
    assert feed.current() is None
    clock.advance(600)
    assert feed.current() is None
    path.write_bytes(FIXTURE.read_bytes())
    clock.advance(600)
    back = feed.current()
    assert back is not None and len(back.downtimes) == 4 and feed.problem is None
    levels = [level for level, _m in logs]
    assert levels == ["ERROR", "WARNING", "INFO"], logs
    assert "keeping the feed read 600 s ago for up to 1800 s" in logs[0][1]
    assert "no downtime is known, endpoints count as available" in logs[1][1]
    assert "read again after 2401 s (4 downtimes)" in logs[2][1]


def test_a_feed_never_read_gives_none_and_says_so_once(
    tmp_path: Path, logs: list[tuple[str, str]]
) -> None:
    clock = FakeClock()
    feed = GocdbFeed((tmp_path / "missing.xml").as_uri(), refresh=60, clock=clock)
    for _ in range(3):
        assert feed.current() is None
        clock.advance(60)
    assert len(logs) == 1 and "no earlier feed: no downtime is known" in logs[0][1]


def test_an_oversized_file_feed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.xml"
    path.write_bytes(FIXTURE.read_bytes())
    feed = GocdbFeed(path.as_uri(), max_bytes=1024, clock=FakeClock())
    assert feed.current() is None
    assert feed.problem == "the file is longer than max_bytes (1024 bytes)"


def test_a_file_url_naming_another_host_is_refused() -> None:
    feed = GocdbFeed("file://goc.egi.eu/downtimes.xml", clock=FakeClock())
    assert feed.current() is None
    assert feed.problem is not None and "not one on goc.egi.eu" in feed.problem


def test_entries_left_out_are_logged_once_per_distinct_list(
    tmp_path: Path, logs: list[tuple[str, str]]
) -> None:
    path = tmp_path / "d.xml"
    path.write_bytes(_doc(_downtime("1", "a.example", "AT_RISK", 1, 2)))
    clock = FakeClock()
    feed = GocdbFeed(path.as_uri(), refresh=60, clock=clock)
    for _ in range(3):
        feed.current()
        clock.advance(60)
    assert [level for level, _m in logs] == ["WARNING"]
    assert "1 entries left out: downtime 1G0 of a.example" in logs[0][1]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="not an http"):
        GocdbFeed("ftp://goc.egi.eu/x")
    with pytest.raises(ValueError, match="refresh"):
        GocdbFeed("file:///x", refresh=float("inf"))
    with pytest.raises(ValueError, match="keep_last"):
        GocdbFeed("file:///x", keep_last=-1)


@pytest.fixture
def gocdb() -> Iterator[tuple[str, Answers]]:
    """A real HTTP server on 127.0.0.1 serving a get_downtime answer."""
    answers = Answers(body=FIXTURE.read_bytes(), headers={"Content-Type": "text/xml"})
    with WebServer(answers) as server:
        yield server.url("/gocdbpi/public/?method=get_downtime"), answers


def test_an_http_feed_that_fails_in_any_way_keeps_the_last_good_one(
    gocdb: tuple[str, Answers],
) -> None:
    url, served = gocdb
    clock = FakeClock()
    feed = GocdbFeed(url, refresh=60, keep_last=3600, timeout=0.5, max_bytes=100_000, clock=clock)
    good = feed.current()
    assert good is not None and len(good.downtimes) == 4
    failures: list[tuple[dict[str, Any], str]] = [
        ({"status": 500}, "HTTP 500"),
        ({"body": b"<html>GOCDB maintenance</html>"}, "root element is <html>"),
        ({"body": b"x" * 200_000}, "more than max_bytes (100000 bytes)"),
        ({"mode": "hang"}, "no complete answer within 0.5 s"),
    ]
    for change, said in failures:
        for name, value in change.items():
            setattr(served, name, value)
        clock.advance(60)
        assert feed.current() is good, said
        assert feed.problem is not None and said in feed.problem
        served.status, served.body, served.mode = 200, FIXTURE.read_bytes(), "ok"
    assert served.stuck == 1  # the hanging request was cut by the client, not ended by the server
    clock.advance(60)
    again = feed.current()
    assert again is not None and again is not good and feed.problem is None


def test_an_https_feed_is_trusted_through_ca_path_and_refused_without_it(
    tmp_path: Path,
) -> None:
    cert, key = make_cert(tmp_path)
    cas = tmp_path / "certificates"  # laid out as /etc/grid-security/certificates is
    cas.mkdir()
    digest = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(cert)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    (cas / f"{digest}.0").write_bytes(cert.read_bytes())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    answers = Answers(body=FIXTURE.read_bytes(), headers={"Content-Type": "text/xml"})
    with WebServer(answers, tls=context) as server:
        url = server.url("/gocdbpi/public/?method=get_downtime")
        trusted = GocdbFeed(url, ca_path=str(cas), timeout=10, clock=FakeClock())
        feed = trusted.current()
        assert feed is not None and len(feed.downtimes) == 4
        untrusted = GocdbFeed(url, timeout=10, clock=FakeClock())
        assert untrusted.current() is None
        assert untrusted.problem is not None and "certificate verify failed" in untrusted.problem


def test_gocdb_availability_over_the_fixtures_downtimes(tmp_path: Path) -> None:
    path = tmp_path / "downtimes.xml"
    path.write_bytes(FIXTURE.read_bytes())
    clock = FakeClock(NOW)
    watch = GocdbAvailability({"url": path.as_uri(), "refresh": 600}, clock=clock)
    states, changes = watch.evaluate([CE, WMS, QUIET])
    assert [states[e].state for e in (CE, WMS, QUIET)] == ["banned", "degraded", "available"]
    assert [(c.endpoint, c.kind) for c in changes] == [(CE, "started"), (WMS, "started")]
    assert watch.evaluate([CE, WMS, QUIET])[1] == []
    clock.advance(5000)  # 1700005000: the warning is over
    states, changes = watch.evaluate([CE, WMS, QUIET])
    assert [(c.endpoint, c.kind) for c in changes] == [(WMS, "ended")]
    clock.advance(5000)  # 1700010000: so is the outage
    states, changes = watch.evaluate([CE, WMS, QUIET])
    assert [(c.endpoint, c.kind) for c in changes] == [(CE, "ended")]
    clock.advance(90_000)  # 1700100000: the next downtime of ce1, a warning, starts
    states, changes = watch.evaluate([CE, WMS, QUIET])
    assert [(c.endpoint, c.kind, c.after.state) for c in changes] == [(CE, "started", "degraded")]


def test_a_feed_gone_for_longer_than_keep_last_makes_every_endpoint_available(
    tmp_path: Path,
) -> None:
    path = tmp_path / "downtimes.xml"
    path.write_bytes(FIXTURE.read_bytes())
    clock = FakeClock(NOW)
    watch = GocdbAvailability({"url": path.as_uri(), "refresh": 60, "keep_last": 120}, clock=clock)
    assert watch.evaluate([CE])[0][CE].state == "banned"
    path.unlink()
    clock.advance(60)
    assert watch.evaluate([CE])[0][CE].state == "banned"  # kept
    clock.advance(61)
    states, changes = watch.evaluate([CE])
    assert states[CE] == AVAILABLE and [c.kind for c in changes] == ["ended"]
    assert changes[0].describe() == (
        f"{CE}: counted as available again "
        "(GOCDB feed unreadable for over 120 s: downtimes unknown)"
    )


# --- schema --------------------------------------------------------------------------------


def test_the_pinned_gocdb_section_validates_and_every_number_has_a_maximum() -> None:
    Draft202012Validator.check_schema(GOCDB_SCHEMA)
    validator = Draft202012Validator(GOCDB_SCHEMA)
    pinned = {
        "url": "https://goc.egi.eu/gocdbpi/public/?method=get_downtime&ongoing_only=yes",
        "refresh": 600,
    }
    assert list(validator.iter_errors(pinned)) == []
    assert list(validator.iter_errors({"url": "file:///var/lib/gridgate/downtimes.xml"})) == []
    for bad in (
        {},
        {"url": "ftp://goc.egi.eu/"},
        {**pinned, "refresh": 1e10},
        {**pinned, "keep_last": float("inf")},
        {**pinned, "timeout": 0},
        {**pinned, "colour": "red"},
    ):
        assert list(validator.iter_errors(bad)), bad
    for name, spec in GOCDB_SCHEMA["properties"].items():
        if spec.get("type") in ("number", "integer"):
            assert "maximum" in spec, name


def test_a_ca_path_for_a_feed_not_read_over_https_is_a_config_error(tmp_path: Path) -> None:
    # ca_path is asked only by an https read: beside a file:// url it validated and did nothing
    from gridgate.core.config import ConfigError
    from gridgate.core.testing import make_config

    section = {"url": (tmp_path / "feed.xml").as_uri(), "ca_path": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"availability\.gocdb\.ca_path: ca_path is set but url"):
        make_config({"state": {"driver": "memory"}, "availability": {"gocdb": section}})
    section["url"] = "https://goc.example.org/gocdbpi/public/?method=get_downtime"
    make_config({"state": {"driver": "memory"}, "availability": {"gocdb": section}})
