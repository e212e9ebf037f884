"""A secret a URL carries is refused where a secret file can hold it, and masked wherever the
URL is printed (issue 31, item 5): redis-py's ``?password=`` in a Redis URL was accepted and
printed in every error of the source; a token in an HTTP query was printed in every failure."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.ports import free_port
from support.web import WebServer

from gridgate.core.builtin.gocdb import GocdbFeed
from gridgate.core.builtin.waiting import SourceError, make_source
from gridgate.core.clock import FakeClock
from gridgate.core.config import ConfigError, load_config
from gridgate.core.text import safe_url, url_secret

SECRET = "s3cr3t-Value"


@pytest.mark.parametrize(
    ("url", "shown", "carries"),
    [
        (
            f"redis://127.0.0.1:6379/0?password={SECRET}",
            "redis://127.0.0.1:6379/0?password=***",
            "query",
        ),
        (f"redis://:{SECRET}@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0", "user info"),
        (
            f"unix:///run/redis.sock?db=1&password={SECRET}",
            "unix:///run/redis.sock?db=1&password=***",
            "query",
        ),
        (
            f"https://queue.example/count?vo=lhcb&access_token={SECRET}#x",
            "https://queue.example/count?vo=lhcb&access_token=***#x",
            "query",
        ),
        (
            f"https://h.example/a?API_KEY={SECRET}&b=2",
            "https://h.example/a?API_KEY=***&b=2",
            "query",
        ),
        (
            "https://goc.egi.eu/gocdbpi/public/?method=get_downtime&ongoing_only=yes",
            "https://goc.egi.eu/gocdbpi/public/?method=get_downtime&ongoing_only=yes",
            "",
        ),
        ("redis://pilots@127.0.0.1:6379/0", "redis://pilots@127.0.0.1:6379/0", ""),
    ],
)
def test_safe_url_masks_passwords_and_secret_query_values(
    url: str, shown: str, carries: str
) -> None:
    assert safe_url(url) == shown
    assert (carries in url_secret(url)) if carries else url_secret(url) == ""


def test_a_redis_demand_url_with_a_query_password_is_refused_without_printing_it() -> None:
    with pytest.raises(ValueError) as caught:
        make_source(
            {"redis": {"url": f"redis://127.0.0.1:{free_port()}/0?password={SECRET}", "key": "tq"}}
        )
    assert "do not write the password into the url" in str(caught.value)
    assert "password=..." in str(caught.value) and SECRET not in str(caught.value)


def test_a_redis_state_url_with_a_query_password_is_a_config_error_naming_the_key(
    tmp_path: Path,
) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(
        yaml.safe_dump(
            {"state": {"driver": "redis", "url": f"redis://127.0.0.1:6379/0?password={SECRET}"}}
        )
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert "url" in text and "password: {file: PATH}" in text and SECRET not in text, text


def test_a_token_in_an_http_sources_query_is_masked_in_its_errors() -> None:
    with WebServer() as server:
        server.answers.status, server.answers.body = 500, b"oops"
        source = make_source(
            {"http": {"url": server.url(f"/count?access_token={SECRET}"), "field": "mc"}}
        )
        assert SECRET not in source.name and "access_token=***" in source.name
        with pytest.raises(SourceError) as caught:
            source.read()
    assert "HTTP 500" in str(caught.value) and SECRET not in str(caught.value), caught.value
    # nothing listens: the connection error of the whole exchange is masked too
    gone = make_source(
        {"http": {"url": f"http://127.0.0.1:{free_port()}/c?token={SECRET}", "field": "mc"}}
    )
    with pytest.raises(SourceError) as caught:
        gone.read()
    assert SECRET not in str(caught.value) and "token=***" in str(caught.value)


def test_a_gocdb_feed_url_with_a_token_is_masked_in_its_log_lines(logs) -> None:
    feed = GocdbFeed(f"http://127.0.0.1:{free_port()}/gocdb?key={SECRET}", clock=FakeClock())
    assert feed.current() is None
    said = [m for _level, m in logs if "GOCDB feed" in m]
    assert said and all(SECRET not in m and "key=***" in m for m in said), said
