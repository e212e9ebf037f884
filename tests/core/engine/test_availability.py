"""Endpoint availability end to end through the real director (issue 23): the hook and its
merge, operator bans and drains (sqlite and a real Redis, and the ``gridgate servers``
commands), GOCDB downtimes from a file:// URL and a real local HTTP server, pilot efficiency,
weights in both selectors, and each source's failure."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from support.director import BACKEND, ScriptedBackend, TrackingBackend
from support.redis_server import RedisServer
from support.web import Answers, WebServer

from gridgate.core import hookimpl
from gridgate.core.builtin.bans import OperatorBans
from gridgate.core.clock import FakeClock
from gridgate.core.commands.app import cli
from gridgate.core.config import load_config
from gridgate.core.engine.availability import merge_availability
from gridgate.core.engine.director import Director, summary_json
from gridgate.core.model import Availability, BackendInfo
from gridgate.core.state import StateStore
from gridgate.core.stores.memory import MemoryState
from gridgate.core.stores.redis import RedisState
from gridgate.core.stores.sqlite import SqliteState
from gridgate.core.testing import Collector, make_config

S0, S1, S2 = (f"{BACKEND}/s{i}" for i in range(3))


def doc(pilots: int = 6, **extra: Any) -> dict[str, Any]:
    return {
        "director": {"cycle_seconds": 0.01, "max_threads": 1, "command_timeout": 5},
        "state": {"driver": "memory"},
        "demand": {"static": {BACKEND: pilots}},
        "selectors": {"random": {"seed": 7}},
        **extra,
    }


def director(store: StateStore, *plugins: object, clock: FakeClock, **extra: Any) -> Director:
    return Director(
        make_config(doc(**extra)), clock=clock, extra_plugins=list(plugins), state=store
    )


def per_server(summary: Any) -> Counter[str]:
    return Counter(r.endpoint for r in summary.records if r.outcome == "submitted")


class Says:
    """An availability source that says what the test tells it (``None``: nothing)."""

    def __init__(self, answer: Any = None, boom: bool = False) -> None:
        self.answer, self.boom = answer, boom
        self.asked: list[tuple[int, tuple[str, ...], Any]] = []

    @hookimpl
    def gridgate_endpoint_availability(self, iteration, endpoints, changed):
        self.asked.append((iteration.number, tuple(e.key for e in endpoints), changed))
        if self.boom:
            raise RuntimeError("source bug")
        return self.answer


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    clock = FakeClock()
    if request.param == "sqlite":
        state: StateStore = SqliteState({"path": str(tmp_path / "state.db")}, clock=clock)
    else:
        server = request.getfixturevalue("redis_server")
        state = RedisState({"url": server.url, "prefix": f"av-{tmp_path.name}:"}, clock=clock)
    yield state
    state.close()


# --- the hook ------------------------------------------------------------------------------


def test_gridgate_endpoint_availability_is_asked_once_merged_worst_first_and_a_bug_is_isolated() -> (
    None
):
    clock = FakeClock()
    one = Says({S0: Availability("degraded", "slow", None, "one"), S1: Availability("drained")})
    two = Says({S0: Availability("banned", "down", clock.time() + 60, "two")})
    broken = Says(boom=True)
    backend = TrackingBackend(3)
    d = director(MemoryState(clock=clock), backend, one, two, broken, clock=clock, pilots=6)
    first = d.run_iteration()
    assert [a[0] for a in one.asked] == [1] and one.asked[0][1] == (S0, S1, S2)
    assert one.asked[0][2] is None  # nothing polled before the first iteration
    assert first.unavailable[S0].state == "banned" and first.unavailable[S0].reason == "down"
    assert first.unavailable[S0].source == "two,one"  # every source that said so, worst first
    assert first.unavailable[S1].state == "drained" and first.unavailable[S1].source
    assert set(per_server(first)) == {"s2"}  # banned and drained get no new pilots
    assert json.loads(summary_json(first))["unavailable"][S0]["state"] == "banned"
    backend.move("s2", "done", 2)
    d.run_iteration()  # its polls see s2's pilots end ...
    d.run_iteration()
    assert one.asked[2][2] == frozenset({S2})  # ... and the next asking is told whose changed
    d.close()


def test_merge_keeps_known_endpoints_and_skips_answers_that_are_not_availability() -> None:
    merged = merge_availability(
        [
            ("a:x", {"b/1": Availability("degraded", "r"), "zz/9": Availability("banned")}),
            ("a:y", ["not", "a", "mapping"]),
            ("a:z", {"b/1": "banned"}),
        ],
        {"b/1"},
    )
    assert merged == {"b/1": Availability("degraded", "r", None, "x")}


# --- operator bans and drains ----------------------------------------------------------------


def test_a_banned_endpoint_gets_no_pilots_and_comes_back_after_unban_and_after_until(
    store: StateStore,
) -> None:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    backend, notes = TrackingBackend(2), Collector()
    d = director(store, backend, notes, clock=clock, pilots=4)
    bans = OperatorBans(store)
    bans.ban(S0, who="alice", why="CE upgrade", duration=3600)
    banned = d.run_iteration()
    assert per_server(banned) == {"s1": 4}
    assert [n.level for n in notes.notes] == ["info"] and "banned" in notes.notes[0].subject
    assert bans.unban(S0) is not None
    back = d.run_iteration()
    assert back.unavailable == {} and per_server(back)["s0"] > 0
    assert "available again" in notes.notes[-1].subject and len(notes.notes) == 2
    bans.drain(S0, who="bob", why="draining for the upgrade", duration=60)
    drained = d.run_iteration()
    assert set(per_server(drained)) == {"s1"} and drained.unavailable[S0].state == "drained"
    polled = {p.endpoint for p in drained.pilots.polls}
    assert "s0" in polled  # a drained endpoint's pilots are still tracked
    clock.advance(61)  # the drain's until has passed
    after = d.run_iteration()
    assert after.unavailable == {} and per_server(after)["s0"] > 0
    assert sum("available again" in n.subject for n in notes.notes) == 2
    d.close()


def test_a_downtime_is_told_once_across_restarts_and_directors_on_one_store(
    store: StateStore,
) -> None:
    """Issue 31, item 8: what was told lives in the store, so a restarted director, a second
    director, or `gridgate run --once` from cron tells a downtime once when it starts and once
    when it ends, and a new downtime of the same endpoint again."""
    clock = store.clock
    assert isinstance(clock, FakeClock)
    bans = OperatorBans(store)
    bans.ban(S0, who="alice", why="CE upgrade", duration=3600)
    heard = Collector()

    def one_iteration() -> None:  # a new director each time, as a restart or a cron run is
        d = director(store, TrackingBackend(2), heard, clock=clock, pilots=2)
        d.run_iteration()
        d.close()

    for _ in range(3):
        one_iteration()
        clock.advance(60)
    assert [n.subject.split(" (")[0] for n in heard.notes] == [f"gridgate: {S0} banned"]
    first, second = (
        director(store, TrackingBackend(2), heard, clock=clock, pilots=2) for _ in range(2)
    )
    first.run_iteration(), second.run_iteration()  # two directors sharing the store
    assert len(heard.notes) == 1
    bans.unban(S0)
    first.run_iteration(), second.run_iteration()
    first.close(), second.close()
    one_iteration()
    assert sum("available again" in n.subject for n in heard.notes) == 1
    bans.ban(S0, who="alice", why="again", duration=3600)  # a new downtime is news again
    clock.advance(60)
    one_iteration()
    one_iteration()
    assert sum(f"{S0} banned" in n.subject for n in heard.notes) == 2 and len(heard.notes) == 3


class Unaskable(TrackingBackend):
    """A backend whose servers cannot be asked while banned (``poll_banned`` False)."""

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        if backend != BACKEND:
            return None
        return BackendInfo(BACKEND, self.endpoints, poll_banned=False)


@pytest.mark.parametrize("kind", [TrackingBackend, Unaskable])
def test_a_banned_endpoint_is_polled_unless_its_backend_cannot_ask_it(kind: type) -> None:
    clock = FakeClock()
    backend = kind(2)
    d = director(MemoryState(clock=clock), backend, clock=clock, pilots=4)
    d.run_iteration()  # pilots on both
    OperatorBans(d.state).ban(S0, who="alice", why="down", duration=600)
    backend.status_calls.clear()
    d.run_iteration()
    asked = {name for name, _ids in backend.status_calls}
    assert asked == ({"s1"} if kind is Unaskable else {"s0", "s1"})
    d.close()


def test_the_operator_source_keeps_what_it_read_while_redis_is_down(tmp_path: Path) -> None:
    clock = FakeClock()
    server = RedisServer(tmp_path / "own-redis").start()
    try:
        store = RedisState({"url": server.url, "prefix": "down:", "socket_timeout": 1}, clock=clock)
        backend = TrackingBackend(2)
        d = Director(make_config(doc(pilots=2)), clock=clock, extra_plugins=[backend], state=store)
        OperatorBans(store).ban(S0, who="alice", why="down", duration=600)
        assert d.run_iteration().unavailable[S0].state == "banned"
        server.stop()
        during = d.run_iteration()
        assert during.unavailable[S0].state == "banned"  # the last entries read, kept
        assert set(per_server(during)) <= {"s1"}
        clock.advance(601)  # ... each until its own end, even unread
        assert S0 not in d.run_iteration().unavailable
        d.close()
    finally:
        server.stop()


# --- weights and degraded endpoints ----------------------------------------------------------


def _weighted(selector: dict[str, Any], weights: dict[str, int], pilots: int, answer=None):
    clock = FakeClock()
    backend = ScriptedBackend(3, {f"s{i}": "fake-ok" for i in range(3)})
    d = Director(
        make_config(
            {
                **doc(pilots=pilots),
                "selectors": selector,
                "director": {"max_threads": 1, "pilots": {"track": False}},  # no limits
            }
        ),
        clock=clock,
        extra_plugins=[backend, Says(answer)],
        state=MemoryState(clock=clock),
    )
    # a backend registered in-process has no section of its own: give it one as a site would
    d.config.data["backends"] = {BACKEND: {"weights": weights}}
    summary = d.run_iteration()
    d.close()
    return per_server(summary)


def test_round_robin_honours_weights_exactly() -> None:
    counts = _weighted({"round_robin": {}}, {"s0": 3, "s2": 0}, 8)
    assert counts == {"s0": 6, "s1": 2}  # 3 to 1, and weight 0 means never


def test_random_honours_weights_within_a_statistical_bound() -> None:
    counts = _weighted({"random": {"seed": 11}}, {"s0": 4, "s1": 1, "s2": 0}, 1000)
    assert "s2" not in counts
    assert 740 <= counts["s0"] <= 860, counts  # 800 expected; sd ~12.6, bound ~4.7 sd


@pytest.mark.parametrize("selector", [{"random": {"seed": 3}}, {"round_robin": {}}])
def test_a_degraded_endpoint_gets_about_half(selector: dict[str, Any]) -> None:
    degraded = {S0: Availability("degraded", "efficiency", None, "test")}
    counts = _weighted(selector, {}, 900, degraded)
    # weights 1, 2, 2 (half units): s0 expects 180 of 900; sd ~12, bound over 3.3 sd
    assert 140 <= counts["s0"] <= 220, counts
    assert abs(counts["s1"] - counts["s2"]) <= 90, counts


# --- GOCDB downtimes -------------------------------------------------------------------------


def _feed(*downtimes: tuple[str, str, float, float]) -> bytes:
    items = "".join(
        f'<DOWNTIME ID="{i}" PRIMARY_KEY="{i}G0" CLASSIFICATION="SCHEDULED">'
        f"<PRIMARY_KEY>{i}G0</PRIMARY_KEY><HOSTNAME>{host}</HOSTNAME>"
        f"<SEVERITY>{severity}</SEVERITY><DESCRIPTION>intervention {i}</DESCRIPTION>"
        f"<START_DATE>{int(start)}</START_DATE><END_DATE>{int(end)}</END_DATE></DOWNTIME>"
        for i, (host, severity, start, end) in enumerate(downtimes, start=100)
    )
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<results>{items}</results>'.encode()


@pytest.fixture
def http_feed() -> Iterator[tuple[str, Answers]]:
    """A real HTTP server answering GOCDB's get_downtime with an empty feed until told more."""
    answers = Answers(body=b"<results/>", headers={"Content-Type": "application/xml"})
    with WebServer(answers) as server:
        yield server.url("/gocdbpi/public/?method=get"), answers


@pytest.mark.parametrize("where", ["file", "http"])
def test_a_gocdb_outage_bans_its_host_and_a_failure_in_a_downtime_is_not_mailed(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    clock = FakeClock()
    now = clock.time()
    body = _feed(("s0", "OUTAGE", now - 60, now + 3600), ("s1", "WARNING", now - 60, now + 600))
    if where == "file":
        path = tmp_path / "downtimes.xml"
        path.write_bytes(body)
        url = path.as_uri()
    else:
        url, served = request.getfixturevalue("http_feed")
        served.body = body
    backend = TrackingBackend(3, {"s1": "fake-fail"})
    notes = Collector()
    d = director(
        MemoryState(clock=clock),
        backend,
        notes,
        clock=clock,
        pilots=6,
        availability={"gocdb": {"url": url, "refresh": 1}},
    )
    first = d.run_iteration()
    assert first.unavailable[S0].state == "banned" and first.unavailable[S0].source == "gocdb"
    assert first.unavailable[S1].state == "degraded"
    assert "s0" not in per_server(first)
    # s1 failed while in its WARNING downtime: counted and excluded, but no mail
    assert [f.endpoint for f in first.failures] == ["s1"] and S1 in first.excluded
    assert sorted(n.level for n in notes.notes) == ["info", "info"]  # two downtimes started
    d.run_iteration()
    assert len(notes.notes) == 2  # said once, not at every iteration
    clock.advance(3601)  # both downtimes are over
    ended = d.run_iteration()
    assert ended.unavailable == {}
    assert sum("available again" in n.subject for n in notes.notes) == 2
    assert all(n.level == "info" for n in notes.notes)
    d.close()


def test_a_gocdb_feed_that_cannot_be_read_bans_nothing_and_a_good_one_is_kept(
    tmp_path: Path, http_feed: tuple[str, Answers]
) -> None:
    clock = FakeClock()
    now = clock.time()
    url, served = http_feed
    served.body = _feed(("s0", "OUTAGE", now - 60, now + 86400))
    gocdb = {"url": url, "refresh": 1, "keep_last": 300}
    d = director(
        MemoryState(clock=clock),
        TrackingBackend(2),
        clock=clock,
        pilots=2,
        availability={"gocdb": gocdb},
    )
    assert d.run_iteration().unavailable[S0].state == "banned"
    served.status = 500
    clock.advance(2)
    assert d.run_iteration().unavailable[S0].state == "banned"  # the last good feed, kept
    clock.advance(300)
    assert d.run_iteration().unavailable == {}  # past keep_last: no downtime is known
    d.close()
    missing = director(
        MemoryState(clock=clock),
        TrackingBackend(2),
        clock=clock,
        pilots=2,
        availability={"gocdb": {"url": (tmp_path / "nowhere.xml").as_uri()}},
    )
    summary = missing.run_iteration()
    assert summary.unavailable == {} and len(per_server(summary)) == 2
    missing.close()


# --- pilot efficiency ------------------------------------------------------------------------


def test_pilot_efficiency_degrades_an_endpoint_with_one_notice_and_no_mail() -> None:
    clock = FakeClock()
    backend, notes = TrackingBackend(2), Collector()
    d = director(
        MemoryState(clock=clock),
        backend,
        notes,
        clock=clock,
        pilots=40,
        availability={"efficiency": {"min_finished": 10}},
    )
    d.run_iteration()
    d.config.data["demand"]["static"][BACKEND] = 0
    backend.move("s0", "failed", 6)  # 6 of 20 (30 %): degraded, under abort_threshold 0.5
    backend.move("s0", "done", only="waiting")
    backend.move("s1", "done")
    clock.advance(1)
    assert d.run_iteration().unavailable == {}  # its polls see the pilots end ...
    clock.advance(1)
    first = d.run_iteration()  # ... and the next asking judges them
    assert first.unavailable[S0].state == "degraded"
    assert first.unavailable[S0].source == "pilot efficiency" and S1 not in first.unavailable
    assert [n.level for n in notes.notes] == ["info"] and S0 in notes.notes[0].subject
    clock.advance(1)
    d.run_iteration()
    assert len(notes.notes) == 1  # the reason's counts move, the notice is not repeated
    d.close()


def test_pilot_efficiency_keeps_its_verdicts_while_the_registry_is_down(tmp_path: Path) -> None:
    clock = FakeClock()
    server = RedisServer(tmp_path / "own-redis").start()
    try:
        store = RedisState({"url": server.url, "prefix": "eff:", "socket_timeout": 1}, clock=clock)
        backend = TrackingBackend(2)
        d = Director(
            make_config(doc(pilots=40, availability={"efficiency": {}})),
            clock=clock,
            extra_plugins=[backend],
            state=store,
        )
        d.run_iteration()
        d.config.data["demand"]["static"][BACKEND] = 0
        backend.move("s0", "failed", 6)
        backend.move("s0", "done", only="waiting")
        clock.advance(1)
        d.run_iteration()  # polled: the verdict is the next iteration's
        clock.advance(1)
        assert d.run_iteration().unavailable[S0].state == "degraded"
        server.stop()
        clock.advance(1)
        assert d.run_iteration().unavailable[S0].state == "degraded"  # the last verdict
        d.close()
    finally:
        server.stop()


# --- the operator commands -------------------------------------------------------------------


def site(tmp_path: Path) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "director": {"state_dir": str(tmp_path / "state")},
                "state": {"driver": "sqlite", "path": str(tmp_path / "state.db")},
                "backends": {
                    "slurm": {"partitions": ["debug", "long"], "script": "/bin/true"},
                },
                "demand": {"static": {"slurm": 1}},
            }
        ),
        encoding="utf-8",
    )
    return path


def test_servers_ban_drain_unban_and_list_show_who_why_and_until(tmp_path: Path) -> None:
    import os
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name  # SUDO_USER proves nothing without a real sudo
    config = str(site(tmp_path))
    runner = CliRunner()
    banned = runner.invoke(
        cli,
        ["servers", "ban", "-c", config, "debug", "--for", "2h", "--reason", "CE upgrade"],
        env={"SUDO_USER": "alice"},
    )
    assert banned.exit_code == 0, banned.output
    assert "slurm/debug: banned until" in banned.output and f"by {me}" in banned.output
    drained = runner.invoke(
        cli,
        ["servers", "drain", "-c", config, "slurm/long", "--for", "30m", "--reason", "drain"],
        env={"SUDO_USER": "bob"},
    )
    assert drained.exit_code == 0, drained.output
    listed = runner.invoke(cli, ["servers", "list", "-c", config, "--json"])
    entries = {e["endpoint"]: e for e in json.loads(listed.output)["bans"]}
    assert entries["slurm/debug"]["who"] == me and entries["slurm/debug"]["why"] == ("CE upgrade")
    assert entries["slurm/long"]["state"] == "drained"
    assert entries["slurm/debug"]["until"] - entries["slurm/debug"]["since"] == 7200
    text = runner.invoke(cli, ["servers", "list", "-c", config]).output
    assert "slurm/debug" in text and me in text and "CE upgrade" in text
    assert "no failure episode is open" in text  # the failing cache's line, as before
    assert "every server is in rotation" not in text  # a ban is not "in rotation"
    lifted = runner.invoke(cli, ["servers", "unban", "-c", config, "debug"])
    assert lifted.exit_code == 0 and "lifted" in lifted.output
    again = runner.invoke(cli, ["servers", "unban", "-c", config, "debug"])
    assert "not banned or drained" in again.output
    state = load_config(config)
    from gridgate.core.state import open_state

    store = open_state(state)
    assert [e.endpoint for e in OperatorBans(store).entries()] == ["slurm/long"]
    store.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nowhere", "--for", "2h", "--reason", "x"], "no configured backend has it"),
        (["debug", "--for", "2 hours", "--reason", "x"], "2 hours"),
        (["debug", "--for", "0s", "--reason", "x"], "0s"),
        (["debug", "--for", "2h", "--reason", ""], "reason"),
        (["debug", "--for", "2h"], "--reason"),
    ],
)
def test_servers_ban_refuses_bad_input_with_a_usage_error(
    tmp_path: Path, args: list[str], says: str
) -> None:
    result = CliRunner().invoke(cli, ["servers", "ban", "-c", str(site(tmp_path)), *args])
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_a_ban_from_the_command_line_reaches_a_running_director(
    tmp_path: Path, gridgate_exe: str
) -> None:
    import subprocess

    config = site(tmp_path)
    data = yaml.safe_load(config.read_text())
    del data["backends"]  # the testbed backend is registered in-process
    data["demand"] = {"static": {BACKEND: 4}}
    data["selectors"] = {"round_robin": {}}
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    backend = TrackingBackend(2)
    d = Director(load_config(config), extra_plugins=[backend])
    try:
        assert set(per_server(d.run_iteration())) == {"s0", "s1"}
        # known from the pilot registry: the endpoints the directors have pilots on
        done = subprocess.run(
            [gridgate_exe, "servers", "ban", "-c", str(config), "s0", "--for", "1h"]
            + ["--reason", "site asked"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert set(per_server(d.run_iteration())) == {"s1"}
    finally:
        d.close()


# --- the throughput selector and the config checks -------------------------------------------


def _throughput(store: StateStore, clock: FakeClock, pilots: int) -> Counter[str]:
    backend = ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})
    d = Director(
        make_config(
            {
                **doc(pilots=pilots),
                "selectors": {"throughput": {"seed": 5}},
                "director": {"max_threads": 1, "pilots": {"track": False}},
            }
        ),
        clock=clock,
        extra_plugins=[backend],
        state=store,
    )
    counts = per_server(d.run_iteration())
    d.close()
    return counts


def test_the_throughput_selector_follows_done_pilots_and_falls_back_to_weights(
    tmp_path: Path,
) -> None:
    from gridgate.core.state import Pilot

    clock = FakeClock()
    now = clock.time()
    store = SqliteState({"path": str(tmp_path / "state.db")}, clock=clock)
    store.pilot_registry().put(
        Pilot(f"j{i}", BACKEND, "s0", submitted=now - 7200, state="done", changed=now - 600)
        for i in range(90)
    )  # s0: 90 done in 6 h = 15 an hour; s1: none, counted as the floor of 1
    counts = _throughput(store, clock, 400)
    assert 350 <= counts["s0"] <= 395, counts  # 15/16 of 400 = 375 expected; sd ~4.8
    store.close()
    server = RedisServer(tmp_path / "own-redis").start()
    down = RedisState({"url": server.url, "prefix": "tp:", "socket_timeout": 1}, clock=clock)
    server.stop()  # the registry cannot be read: the weights alone (equal) decide
    counts = _throughput(down, clock, 200)
    assert 70 <= counts["s0"] <= 130, counts
    down.close()


def test_weights_for_an_unknown_endpoint_and_a_degrade_threshold_above_abort_are_config_errors(
    tmp_path: Path,
) -> None:
    from gridgate.core.config import ConfigError

    path = site(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["backends"]["slurm"]["weights"] = {"debug": 3, "nowhere": 1}
    data["availability"] = {"efficiency": {"degrade_threshold": 0.6}}
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    text = str(raised.value)
    assert "weights.nowhere: no such endpoint" in text and "debug, long" in text
    assert "degrade_threshold (0.6) must be below pilots.abort_threshold (0.5)" in text
    data["backends"]["slurm"]["weights"] = {"debug": 3}
    del data["availability"]
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_config(path).data["backends"]["slurm"]["weights"] == {"debug": 3}
