"""Sources of waiting work (core/builtin/waiting.py) against a real redis-server, a real HTTP server on
127.0.0.1 and real commands: every way each can fail, the last good figure kept for a bounded
time, and the sizing of pilots from a figure."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from support.ports import free_port
from support.redis_server import RedisServer
from support.web import Answers, WebServer

from gridgate.core.builtin.waiting import (
    COMMAND_SOURCE_SCHEMA,
    DEFAULT_KEEP_LAST,
    GROUP_PROPERTIES,
    HTTP_SOURCE_SCHEMA,
    MAX_WAITING,
    REDIS_SOURCE_SCHEMA,
    SOURCE_SCHEMA,
    CommandSource,
    FetchError,
    HttpSource,
    SourceError,
    WaitingGauge,
    WaitingGauges,
    http_get,
    make_source,
    parse_count,
    pilots_for,
)
from gridgate.core.clock import FakeClock

# --- a real HTTP server ---------------------------------------------------------------------


@pytest.fixture
def web() -> Iterator[tuple[str, Answers]]:
    """A real HTTP server on 127.0.0.1 (port 0) and the answers it gives."""
    with WebServer(Answers(body=b'{"mc": 7, "analysis": 12}')) as server:
        yield server.url("/waiting"), server.answers


def _key() -> str:
    return f"tq:{uuid.uuid4().hex}"


# --- counts --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"mc": 0}', 0),
        ('{"mc": 41, "other": "x"}', 41),
        (f'{{"mc": {MAX_WAITING}}}', MAX_WAITING),
    ],
)
def test_a_count_is_a_whole_non_negative_number_under_its_field(text: str, expected: int) -> None:
    assert parse_count(text, "mc") == expected


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"mc": true}', "not a count"),
        ('{"mc": 2.5}', "not a whole number"),
        ('{"mc": 3.0}', "not a whole number"),
        ('{"mc": -1}', "negative"),
        (f'{{"mc": {MAX_WAITING + 1}}}', "above the largest count"),
        ('{"mc": "3"}', "not a count"),
        ('{"mc": null}', "not a count"),
        ('{"other": 3}', "no field 'mc' (its fields: other)"),
        ("[1, 2]", "not a JSON object"),
        ("12", "not a JSON object"),
        ("mc: 3", "not JSON"),
        ('{"mc": NaN}', "not JSON"),
        ('{"mc": Infinity}', "not JSON"),
        ('{"mc": 1, "mc": 2}', "appears twice"),
        ("", "not JSON"),
        ("9" * 5000, "not JSON"),
    ],
)
def test_anything_but_a_count_is_an_error_saying_what_was_wrong(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        parse_count(text, "mc")
    assert said in str(caught.value)


def test_bytes_that_are_not_utf8_are_an_error() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        parse_count(b'{"mc": \xff}', "mc")


# --- redis ---------------------------------------------------------------------------------


def _redis(url: str, key: str, **extra: Any) -> Any:
    return make_source({"redis": {"url": url, "key": key, **extra}})


def test_redis_counts_a_list_a_stream_and_a_sorted_set_and_a_missing_key_is_zero(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    lst, stream, zset, missing = _key(), _key(), _key(), _key()
    client.rpush(lst, *range(5))
    for n in range(3):
        client.xadd(stream, {"job": n})
    client.zadd(zset, {f"job{n}": n for n in range(7)})
    assert _redis(redis_server.url, lst).read() == 5
    assert _redis(redis_server.url, stream).read() == 3
    assert _redis(redis_server.url, zset).read() == 7
    assert _redis(redis_server.url, missing).read() == 0


def test_a_redis_key_that_changes_type_is_counted_as_what_it_is_now(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    key = _key()
    source = _redis(redis_server.url, key)
    client.zadd(key, {"a": 1, "b": 2, "c": 3})
    assert source.read() == 3  # guessed a list: counted in a second round trip
    assert source.read() == 3  # guessed a sorted set now: one round trip
    client.delete(key)
    client.rpush(key, "x")
    assert source.read() == 1
    client.delete(key)
    client.xadd(key, {"job": 1})
    client.xadd(key, {"job": 2})
    assert source.read() == 2


@pytest.mark.parametrize("kind", ["string", "set"])
def test_a_redis_key_of_another_type_is_an_error_naming_the_key_and_its_type(
    redis_server: RedisServer, kind: str
) -> None:
    client = redis_server.client()
    key = _key()
    if kind == "string":
        client.set(key, "12")
    else:
        client.sadd(key, "a")
    source = _redis(redis_server.url, key)
    with pytest.raises(SourceError) as caught:
        source.read()
    text = str(caught.value)
    assert f"redis {redis_server.url} key {key}" in text
    assert f"holds a {kind}, not a list, stream, sorted set or hash" in text


def test_a_redis_hash_is_read_as_counts_per_requirement(redis_server: RedisServer) -> None:
    """A hash is a task queue counted per requirement (docs/pilots.md, "Requirements"); a
    field that is not a requirement names the hash and the field."""
    client = redis_server.client()
    key = _key()
    client.hset(key, mapping={"cores=8,memory_mb=16000": 3, "cores=1": 5})
    reading = _redis(redis_server.url, key).read()
    assert not isinstance(reading, int)
    assert sorted((r.cores, r.memory_mb, r.count) for r in reading) == [
        (1, None, 5),
        (8, 16000, 3),
    ]
    client.hset(key, "a", "1")
    with pytest.raises(SourceError) as caught:
        _redis(redis_server.url, key).read()
    assert f"the hash {key!r} field 'a': 'a' is not NAME=VALUE" in str(caught.value)


def test_redis_down_is_an_error_naming_the_source() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    source = _redis(url, "tq:mc", timeout=2)
    with pytest.raises(SourceError) as caught:
        source.read()
    assert f"redis {url} key tq:mc" in str(caught.value)
    assert "ConnectionError" in str(caught.value)


def test_a_password_in_the_redis_url_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="do not write the password into the url"):
        _redis("redis://user:secret@127.0.0.1:6379/0", "tq:mc")


def test_a_redis_password_is_read_from_its_secret_and_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RedisServer(tmp_path / "redis", password="s3cret") as server:
        key = _key()
        server.client().rpush(key, "a", "b")
        monkeypatch.setenv("H5_TQ_PASSWORD", "s3cret")
        assert _redis(server.url, key, password={"env": "H5_TQ_PASSWORD"}).read() == 2
        with pytest.raises(SourceError, match="(?i)auth"):
            _redis(server.url, key).read()
        monkeypatch.delenv("H5_TQ_PASSWORD")
        with pytest.raises(ValueError, match="H5_TQ_PASSWORD is not set"):
            _redis(server.url, key, password={"env": "H5_TQ_PASSWORD"})


def test_a_redis_user_allowed_only_the_four_counting_commands_is_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RedisServer(tmp_path / "redis") as server:
        admin = server.client()
        admin.acl_setuser(
            "tq",
            enabled=True,
            passwords=["+pw"],
            keys=["tq:*"],
            commands=["-@all", "+type", "+llen", "+xlen", "+zcard"],
        )
        admin.rpush("tq:mc", 1, 2)
        admin.xadd("tq:sim", {"job": 1})
        monkeypatch.setenv("H5_TQ_PASSWORD", "pw")
        url = f"redis://tq@127.0.0.1:{server.port}/0"
        secret = {"env": "H5_TQ_PASSWORD"}
        assert _redis(url, "tq:mc", password=secret).read() == 2
        assert _redis(url, "tq:sim", password=secret).read() == 1
        with pytest.raises(SourceError, match="key other:mc: TYPE other:mc: .*no permissions"):
            _redis(url, "other:mc", password=secret).read()


def test_redis_sources_of_one_server_are_read_together_each_with_its_own_answer(
    redis_server: RedisServer, web: tuple[str, Answers]
) -> None:
    url, _answers = web
    client = redis_server.client()
    mc, sim, wrong = _key(), _key(), _key()
    client.rpush(mc, *range(4))
    client.zadd(sim, {"a": 1, "b": 2})
    client.set(wrong, "x")
    gauges = WaitingGauges(
        {
            "mc": {"redis": {"url": redis_server.url, "key": mc}},
            "sim": {"redis": {"url": redis_server.url, "key": sim}},
            "broken": {"redis": {"url": redis_server.url, "key": wrong}},
            "analysis": {"http": {"url": url, "field": "analysis"}},
        },
        clock=FakeClock(),
    )
    try:
        # one client for the three groups on one server
        assert len(gauges._servers) == 1
        figures = gauges.waiting_all()
    finally:
        gauges.close()
    assert list(figures) == ["mc", "sim", "broken", "analysis"]
    assert (figures["mc"].jobs, figures["sim"].jobs, figures["analysis"].jobs) == (4, 2, 12)
    assert figures["broken"].jobs == 0 and figures["broken"].problem is not None
    assert f"key {wrong}" in figures["broken"].problem and "holds a string" in (
        figures["broken"].problem
    )


def test_groups_reading_one_url_or_one_command_share_one_read_per_iteration(
    web: tuple[str, Answers], tmp_path: Path
) -> None:
    url, answers = web
    runs = tmp_path / "runs"
    code = f"open({str(runs)!r}, 'a').write('x'); print('{{\"mc\": 3, \"sim\": 4}}')"
    argv = [sys.executable, "-c", code]
    gauges = WaitingGauges(
        {
            "mc": {"http": {"url": url, "field": "mc"}},
            "analysis": {"http": {"url": url, "field": "analysis"}},
            "other": {"http": {"url": url, "field": "missing"}},
            "cmd_mc": {"command": {"argv": argv, "field": "mc"}},
            "cmd_sim": {"command": {"argv": argv, "field": "sim"}},
        },
        clock=FakeClock(),
    )
    figures = gauges.waiting_all()
    assert {g: f.jobs for g, f in figures.items()} == {
        "mc": 7,
        "analysis": 12,
        "other": 0,
        "cmd_mc": 3,
        "cmd_sim": 4,
    }
    assert figures["other"].problem is not None
    assert f"http {url} field missing: the answer has no field" in figures["other"].problem
    assert answers.requests == 1 and runs.read_text() == "x"
    answers.status = 500
    figures = gauges.waiting_all()
    assert answers.requests == 2
    for group in ("mc", "analysis"):
        problem = figures[group].problem
        assert problem is not None and problem.startswith(f"http {url} field ") and "500" in problem


def test_every_redis_group_on_a_server_that_is_down_fails_under_its_own_name() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    gauges = WaitingGauges(
        {
            "mc": {"redis": {"url": url, "key": "tq:mc", "timeout": 2}},
            "sim": {"redis": {"url": url, "key": "tq:sim", "timeout": 2}},
        },
        clock=FakeClock(),
    )
    figures = gauges.waiting_all()
    gauges.close()
    assert figures["mc"].problem is not None and "key tq:mc" in figures["mc"].problem
    assert figures["sim"].problem is not None and "key tq:sim" in figures["sim"].problem
    assert figures["mc"].jobs == figures["sim"].jobs == 0


# --- http ----------------------------------------------------------------------------------


def _http(url: str, **extra: Any) -> Any:
    return make_source({"http": {"url": url, "field": "mc", **extra}})


def test_http_reads_one_field_of_the_json_object(web: tuple[str, Answers]) -> None:
    url, answers = web
    assert _http(url).read() == 7
    answers.length = False  # HTTP/1.0 without Content-Length: the body ends with the connection
    assert _http(url).read() == 7


def test_http_500_is_an_error_naming_the_source_and_the_status(web: tuple[str, Answers]) -> None:
    url, answers = web
    answers.status, answers.body = 500, b"database down"
    with pytest.raises(SourceError) as caught:
        _http(url).read()
    assert str(caught.value).startswith(f"http {url} field mc: HTTP 500")


def test_a_redirect_is_not_followed_and_the_error_says_where_it_pointed(
    web: tuple[str, Answers],
) -> None:
    url, answers = web
    answers.status, answers.headers = 302, {"Location": "http://elsewhere.example/"}
    with pytest.raises(SourceError, match="HTTP 302.*elsewhere.example.*not followed"):
        _http(url).read()


def test_a_server_that_hangs_is_cut_at_the_deadline(web: tuple[str, Answers]) -> None:
    url, answers = web
    answers.mode = "hang"
    with pytest.raises(SourceError, match=r"no complete answer within 0.5 s"):
        _http(url, timeout=0.5).read()
    # the server was still hanging when the read gave up: the deadline ended it, not the server
    assert answers.stuck == 1


def test_a_server_that_trickles_forever_is_cut_at_the_whole_requests_deadline(
    web: tuple[str, Answers],
) -> None:
    url, answers = web
    answers.mode = "trickle"
    with pytest.raises(FetchError, match=r"no complete answer within 0.5 s"):
        http_get(url, timeout=0.5, max_bytes=10_000_000)
    assert answers.stuck == 1  # still sending: only the deadline can have stopped the read


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>maintenance</html>", "not JSON"),
        (b'["mc", 7]', "not a JSON object"),
        (b'{"mc": -4}', "negative"),
        (b'{"mc": 1.5}', "not a whole number"),
        (b'{"analysis": 3}', "no field 'mc'"),
    ],
)
def test_http_answers_that_are_not_a_count_are_errors(
    web: tuple[str, Answers], body: bytes, said: str
) -> None:
    url, answers = web
    answers.body = body
    with pytest.raises(SourceError) as caught:
        _http(url).read()
    assert str(caught.value).startswith(f"http {url} field mc: ") and said in str(caught.value)


@pytest.mark.parametrize("length", [True, False])
def test_an_oversized_http_answer_is_refused(web: tuple[str, Answers], length: bool) -> None:
    url, answers = web
    answers.body = json.dumps({"mc": 1, "pad": "x" * 5000}).encode()
    answers.length = length
    with pytest.raises(SourceError, match=r"max_bytes \(1000"):
        _http(url, max_bytes=1000).read()


def test_an_http_server_that_is_down_is_an_error_naming_the_source() -> None:
    url = f"http://127.0.0.1:{free_port()}/waiting"
    with pytest.raises(SourceError, match=f"http {url} field mc: Connection refused"):
        _http(url, timeout=2).read()


def test_a_malformed_http_url_is_refused_when_the_source_is_made() -> None:
    for url in ("http://127.0.0.1:99999/x", "http:///x", "ftp://h/x"):
        with pytest.raises(ValueError, match="(?i)port|not an http"):
            HttpSource(url, "mc")


def test_a_url_that_http_cannot_send_is_a_fetch_error(web: tuple[str, Answers]) -> None:
    url, _answers = web
    with pytest.raises(FetchError, match="URL can't contain control characters"):
        http_get(url + "/a b", timeout=5, max_bytes=1000)


def test_a_password_in_the_http_url_is_refused() -> None:
    with pytest.raises(ValueError, match="password"):
        HttpSource("http://u:p@127.0.0.1/x", "mc")


def test_https_against_a_plain_http_server_is_a_tls_error(web: tuple[str, Answers]) -> None:
    url, _answers = web
    with pytest.raises(SourceError, match="TLS|SSL"):
        _http(url.replace("http://", "https://"), timeout=5).read()


# --- command -------------------------------------------------------------------------------


def _command(code: str, **extra: Any) -> Any:
    return make_source({"command": {"argv": [sys.executable, "-c", code], "field": "mc", **extra}})


def test_a_command_prints_the_json_object() -> None:
    assert _command('print(\'{"mc": 9, "sim": 1}\')').read() == 9


def test_a_command_that_hangs_is_killed_at_its_deadline() -> None:
    source = _command("import time; print('{\"mc\": 1', flush=True); time.sleep(60)", timeout=0.5)
    with pytest.raises(SourceError, match=r"killed after 0.5 s without an answer"):
        source.read()


def test_a_command_that_prints_garbage_is_an_error() -> None:
    with pytest.raises(SourceError, match=r"field mc: the answer is not JSON"):
        _command("print('mc=9')").read()


def test_a_command_that_fails_is_an_error_with_its_exit_code_and_stderr() -> None:
    code = "import sys; sys.stderr.write('no task queue\\n'); sys.exit(3)"
    with pytest.raises(SourceError, match=r"exit code 3: 'no task queue'"):
        _command(code).read()


def test_an_oversized_command_answer_is_refused() -> None:
    code = "print('{\"mc\": 1, \"pad\": \"' + 'x' * 5000 + '\"}')"
    with pytest.raises(SourceError, match=r"printed more than max_bytes \(1000\)"):
        _command(code, max_bytes=1000).read()


def test_a_command_that_cannot_start_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-counter")
    source = make_source({"command": {"argv": [missing], "field": "mc"}})
    with pytest.raises(SourceError, match=f"cannot start: .*{missing}"):
        source.read()


def test_a_command_is_an_argv_never_a_shell_string() -> None:
    with pytest.raises(ValueError, match="never a shell string"):
        CommandSource("tq-count --json", "mc")
    # a shell would have expanded this; one argv item stays one argument
    source = _command("import sys, json; print(json.dumps({'mc': len(sys.argv[1])}))")
    source.argv = (*source.argv, "$(echo hi) *")
    assert source.read() == len("$(echo hi) *")


# --- a group's figure over time --------------------------------------------------------------


class Scripted:
    """A source answering from a list (an int, or an error text): drives the gauge's own logic,
    whose real sources are tested above."""

    name = "scripted"

    def __init__(self, answers: list[int | str]) -> None:
        self.answers = list(answers)

    def read(self) -> int:
        answer = self.answers.pop(0)
        if isinstance(answer, str):
            raise SourceError(f"scripted: {answer}")
        return answer


def test_a_failing_source_keeps_the_last_figure_for_keep_last_then_asks_for_nothing(
    logs: list[tuple[str, str]],
) -> None:
    clock = FakeClock()
    gauge = WaitingGauge(
        "mc", Scripted([40, "down", "down", "down", "down", 12]), keep_last=300, clock=clock
    )
    assert gauge.waiting().jobs == 40
    clock.advance(60)
    first = gauge.waiting()
    assert (first.jobs, first.fresh, first.started_failing, first.age) == (40, False, True, 60)
    clock.advance(240)  # 300 s after the good read: still kept
    assert gauge.waiting().jobs == 40
    clock.advance(1)
    assert gauge.waiting().jobs == 0
    clock.advance(1000)
    assert gauge.waiting().jobs == 0
    back = gauge.waiting()
    assert (back.jobs, back.fresh, back.recovered) == (12, True, True)
    errors = [m for level, m in logs if level == "ERROR"]
    warnings = [m for level, m in logs if level == "WARNING"]
    notices = [m for level, m in logs if level == "INFO"]
    assert len(errors) == 1 and "group mc: cannot read scripted: down" in errors[0]
    assert "keeping the last figure, 40 jobs" in errors[0]
    assert len(warnings) == 1 and "older than keep_last (300 s)" in warnings[0]
    assert len(notices) == 1 and "scripted answers again (12 jobs) after 1241 s" in notices[0]


def test_a_source_failing_from_the_start_asks_for_nothing() -> None:
    gauge = WaitingGauge("mc", Scripted(["down"]), clock=FakeClock())
    figure = gauge.waiting()
    assert (figure.jobs, figure.age, figure.started_failing) == (0, None, True)


def test_with_keep_last_zero_a_failure_asks_for_nothing_at_once_and_says_so_once(
    logs: list[tuple[str, str]],
) -> None:
    clock = FakeClock()
    gauge = WaitingGauge("mc", Scripted([40, "down", "down"]), keep_last=0, clock=clock)
    assert gauge.waiting().jobs == 40
    clock.advance(1)
    assert gauge.waiting().jobs == 0
    assert gauge.waiting().jobs == 0
    assert [level for level, _m in logs] == ["ERROR"]
    assert "older than keep_last (0 s)" in logs[0][1]


def test_keep_last_may_differ_per_group() -> None:
    gauges = WaitingGauges(
        {
            "a": {"command": {"argv": ["true"], "field": "a"}},
            "b": {"command": {"argv": ["true"], "field": "b"}},
        },
        keep_last={"a": 30},
    )
    assert (gauges.gauges["a"].keep_last, gauges.gauges["b"].keep_last) == (30, DEFAULT_KEEP_LAST)


def test_a_real_http_source_failing_and_coming_back(
    web: tuple[str, Answers], logs: list[tuple[str, str]]
) -> None:
    url, answers = web
    clock = FakeClock()
    gauge = WaitingGauge("mc", _http(url), keep_last=DEFAULT_KEEP_LAST, clock=clock)
    assert gauge.waiting().jobs == 7
    answers.status = 503
    for _ in range(3):
        clock.advance(60)
        figure = gauge.waiting()
        assert figure.jobs == 7 and figure.problem is not None and "HTTP 503" in figure.problem
    answers.status, answers.body = 200, b'{"mc": 2}'
    assert gauge.waiting().jobs == 2
    assert [level for level, _m in logs] == ["ERROR", "INFO"]


def test_redis_going_down_keeps_the_figure_then_drops_it(tmp_path: Path) -> None:
    clock = FakeClock()
    with RedisServer(tmp_path / "redis") as server:
        key = _key()
        server.client().rpush(key, *range(6))
        gauge = WaitingGauge("mc", _redis(server.url, key, timeout=2), keep_last=120, clock=clock)
        assert gauge.waiting().jobs == 6
    clock.advance(60)
    down = gauge.waiting()
    assert down.jobs == 6 and down.problem is not None and "ConnectionError" in down.problem
    clock.advance(61)
    assert gauge.waiting().jobs == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.integers(0, 10_000), st.just("down")),
            st.floats(0, 2000, allow_nan=False),
        ),
        max_size=30,
    ),
    st.floats(0, 1000, allow_nan=False),
)
def test_a_failure_never_raises_the_figure(
    steps: list[tuple[int | str, float]], keep_last: float
) -> None:
    clock = FakeClock()
    gauge = WaitingGauge("g", Scripted([a for a, _ in steps]), keep_last=keep_last, clock=clock)
    last_good: int | None = None
    last_at = 0.0
    for answer, pause in steps:
        clock.advance(pause)
        figure = gauge.waiting()
        if isinstance(answer, int):
            assert figure.jobs == answer and figure.fresh
            last_good, last_at = answer, clock.monotonic()
        else:
            kept = last_good is not None and clock.monotonic() - last_at <= keep_last
            assert figure.jobs == (last_good if kept else 0)
            assert figure.jobs <= (last_good or 0)


def test_keep_last_is_bounded() -> None:
    for bad in (-1.0, float("inf"), float("nan"), 86401.0):
        with pytest.raises(ValueError, match="keep_last"):
            WaitingGauge("g", Scripted([]), keep_last=bad)


# --- sizing --------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(
    st.integers(0, 10**12),
    st.integers(1, 10**6),
    st.integers(0, 10**7),
    st.one_of(st.none(), st.integers(0, 10**4)),
)
def test_pilots_for_never_negative_never_past_ceil_w_over_k_zero_without_work(
    waiting_jobs: int, per_pilot: int, waiting_pilots: int, cap: int | None
) -> None:
    pilots = pilots_for(waiting_jobs, per_pilot, waiting_pilots, cap)
    wanted = -(-waiting_jobs // per_pilot)
    assert pilots >= 0
    assert waiting_pilots + pilots <= max(waiting_pilots, wanted)
    if cap is None:
        assert pilots == max(0, wanted - waiting_pilots)
    else:
        assert pilots <= cap
    if waiting_jobs == 0:
        assert pilots == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 100), st.integers(0, 50), st.integers(1, 10))
def test_iterations_settle_at_ceil_w_over_k_and_stop_when_the_queue_drains(
    waiting_jobs: int, per_pilot: int, cap: int, rounds: int
) -> None:
    waiting = 0
    for _ in range(rounds + waiting_jobs // max(cap, 1) + 1):
        waiting += pilots_for(waiting_jobs, per_pilot, waiting, cap)
        assert waiting <= -(-waiting_jobs // per_pilot)
    if cap > 0:
        assert waiting == -(-waiting_jobs // per_pilot)
    assert pilots_for(0, per_pilot, waiting, cap) == 0


@pytest.mark.parametrize(
    ("w", "k", "p", "expected"),
    [(0, 1, 0, 0), (1, 4, 0, 1), (3, 4, 0, 1), (4, 4, 0, 1), (5, 4, 0, 2), (9, 4, 1, 2)],
)
def test_a_remainder_of_jobs_gets_a_pilot(w: int, k: int, p: int, expected: int) -> None:
    assert pilots_for(w, k, p) == expected


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((-1, 1, 0), "waiting_jobs"),
        ((1, 0, 0), "jobs_per_pilot must be at least 1"),
        ((1, 1, -2), "waiting_pilots"),
        ((True, 1, 0), "waiting_jobs"),
        ((1.5, 1, 0), "waiting_jobs"),
    ],
)
def test_pilots_for_refuses_what_is_not_a_count(args: tuple[Any, ...], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        pilots_for(*args)


# --- schemas -------------------------------------------------------------------------------


def _numbers_without_maximum(node: Any, path: str, found: list[str]) -> None:
    if isinstance(node, dict):
        kinds: list[Any] = (
            node["type"] if isinstance(node.get("type"), list) else [node.get("type")]
        )
        if {"number", "integer"} & set(kinds) and "maximum" not in node:
            found.append(path)
        for key, value in node.items():
            _numbers_without_maximum(value, f"{path}.{key}", found)


def test_every_number_in_the_source_schemas_has_a_maximum() -> None:
    found: list[str] = []
    _numbers_without_maximum(GROUP_PROPERTIES, "group", found)
    assert found == []
    for schema in (SOURCE_SCHEMA, REDIS_SOURCE_SCHEMA, HTTP_SOURCE_SCHEMA, COMMAND_SOURCE_SCHEMA):
        Draft202012Validator.check_schema(schema)
    for seconds in ("timeout",):
        for schema in (REDIS_SOURCE_SCHEMA, HTTP_SOURCE_SCHEMA, COMMAND_SOURCE_SCHEMA):
            assert schema["properties"][seconds]["maximum"] == 86400
    assert GROUP_PROPERTIES["keep_last"]["maximum"] == 86400


def test_the_pinned_source_shapes_validate_and_mistakes_do_not() -> None:
    validator = Draft202012Validator(SOURCE_SCHEMA)
    good = [
        {"redis": {"url": "redis://127.0.0.1:6379/0", "key": "tq:mc"}},
        {"http": {"url": "http://tq.example.org/waiting", "field": "analysis"}},
        {"command": {"argv": ["tq-count", "--json"], "field": "mc"}},
    ]
    for spec in good:
        assert list(validator.iter_errors(spec)) == [], spec
    bad = [
        {},
        {"redis": {"url": "redis://h/0"}},
        {"redis": {"url": "http://h/0", "key": "k"}},
        {"redis": {"url": "redis://h/0", "key": "k"}, "http": {"url": "http://h", "field": "f"}},
        {"http": {"url": "ftp://h/x", "field": "f"}},
        {"http": {"url": "http://h/x", "field": "f", "timeout": 1e10}},
        {"command": {"argv": "tq-count --json", "field": "mc"}},
        {"command": {"argv": [], "field": "mc"}},
        {"command": {"argv": ["x"], "field": "mc", "shell": True}},
        {"kafka": {}},
    ]
    for spec in bad:
        assert list(validator.iter_errors(spec)), spec


def test_an_http_source_ca_path_without_https_is_a_config_error_naming_both_keys() -> None:
    # ca_path is asked only by an https GET: beside an http:// url it validated and did nothing
    from gridgate.core.builtin.demand import QueueDemand

    def section(url: str) -> dict[str, Any]:
        http = {"url": url, "field": "atlas", "ca_path": "/etc/grid-security/certificates"}
        return {"groups": {"atlas": {"backend": "slurm", "source": {"http": http}}}}

    assert QueueDemand.config_errors(section("http://queue.example.org/counts")) == [
        (
            ("groups", "atlas", "source", "http", "ca_path"),
            "ca_path is set but url is not https: no CA is ever asked",
        )
    ]
    assert QueueDemand.config_errors(section("https://queue.example.org/counts")) == []
