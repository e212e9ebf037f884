"""`gridgate servers list|clear`: what the failing and tickets caches hold, read from the
director's state store by another process, and putting a fixed server back in rotation."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.director import BACKEND, ScriptedBackend

from gridgate.core import hookimpl
from gridgate.core.builtin.escalation import TwoCacheEscalation
from gridgate.core.clock import FakeClock
from gridgate.core.commands.servers import operator
from gridgate.core.config import load_config
from gridgate.core.engine.director import Director
from gridgate.core.model import Endpoint, Failure, SubmitResult
from gridgate.core.plugins import PluginContext
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector


def site(tmp_path: Path, driver: str = "sqlite") -> Path:
    doc = {
        "director": {
            "cycle_seconds": 0.01,
            "max_threads": 1,
            "command_timeout": 5,
            "failing_expiry": 600,
            "ticket_expiry": 600,
            "state_dir": str(tmp_path / "state"),
        },
        "state": {
            "driver": driver,
            **({"path": str(tmp_path / "state" / "state.db")} if driver == "sqlite" else {}),
        },
        "demand": {"static": {BACKEND: 3}},
        "selectors": {"round_robin": {}},  # every server is tried each iteration
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def gridgate(exe: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def test_list_shows_the_failing_server_and_clear_puts_it_back(tmp_path, gridgate_exe) -> None:
    config = site(tmp_path)
    backend, notes = ScriptedBackend(3, {"s1": "fake-fail"}), Collector()
    director = Director(load_config(config), extra_plugins=[backend, notes])
    try:
        before = time.time()
        first = director.run_iteration()
        assert first.excluded == (f"{BACKEND}/s1",) and notes.levels() == ["error"]

        listed = gridgate(gridgate_exe, "servers", "list", "-c", str(config), "--json")
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)["servers"]
        assert [(r["server"], r["status"], r["kind"], r["failures"]) for r in rows] == [
            (f"{BACKEND}/s1", "failing", "error", 1)
        ]
        assert before + 590 < rows[0]["failing_until"] < time.time() + 610
        assert before + 1190 < rows[0]["tickets_until"] < time.time() + 1210
        table = gridgate(gridgate_exe, "servers", "list", "-c", str(config))
        assert f"{BACKEND}/s1" in table.stdout and "failing" in table.stdout

        assert all(r.endpoint != "s1" for r in director.run_iteration().records)  # still out
        backend.behaviour["s1"] = "fake-ok"  # the site fixed it
        cleared = gridgate(gridgate_exe, "servers", "clear", "-c", str(config), "s1", "wms99")
        assert cleared.returncode == 0, cleared.stderr
        assert cleared.stdout.splitlines() == [
            f"cleared {BACKEND}/s1",
            "wms99: not in the caches (already in rotation)",
        ]
        empty = gridgate(gridgate_exe, "servers", "list", "-c", str(config))
        assert empty.stdout.strip() == "every server is in rotation; no failure episode is open"

        back = director.run_iteration()
        assert sorted(r.endpoint for r in back.records if r.outcome == "submitted") == [
            "s0",
            "s1",
            "s2",
        ]
        # it answered: people hear it works again, and who put it back (issue 42)
        works = notes.notes[-1]
        assert works.level == "info" and works.subject == "gridgate: s1 works again"
        assert f"cleared by {operator()} with `gridgate servers clear`" in works.body
        backend.behaviour["s1"] = (
            "fake-fail"  # failing again: a new episode, an error, not an alarm
        )
        director.run_iteration()
        assert notes.levels() == ["error", "info", "error"]
    finally:
        director.close()


def test_clear_needs_a_name_and_memory_state_has_nothing_to_show(tmp_path, gridgate_exe) -> None:
    config = site(tmp_path)
    usage = gridgate(gridgate_exe, "servers", "clear", "-c", str(config))
    assert usage.returncode == 2 and "name at least one server, or --all" in usage.stderr
    (tmp_path / "m").mkdir()
    memory = site(tmp_path / "m", driver="memory")
    refused = gridgate(gridgate_exe, "servers", "list", "-c", str(memory))
    assert refused.returncode == 1 and "state.driver is memory" in refused.stderr


def test_cache_view_after_the_failing_entry_expired_and_for_a_local_fault() -> None:
    clock = FakeClock()
    state = MemoryState(clock=clock)
    escalation = TwoCacheEscalation(
        {},
        PluginContext(
            clock=clock,
            state=state,
            config={"director": {"failing_expiry": 100, "ticket_expiry": 100}},
        ),
    )
    endpoint = Endpoint(BACKEND, "s0")
    failing = escalation.context.failing
    assert failing is not None  # built by the context on its state, with the config's expiries
    escalation.gridgate_escalate(
        endpoint=endpoint,
        failure=Failure("timeout"),
        result=SubmitResult(endpoint, ok=False),
        episode=failing.enter(endpoint, "timeout"),
    )
    assert failing.local_fault("lsf", "launch") and not failing.local_fault("lsf", "launch")
    rows = failing.view(clock.time())
    assert [(r["server"], r["status"], r["kind"]) for r in rows] == [
        ("lsf (this machine)", "local_fault", "launch"),
        (f"{BACKEND}/s0", "failing", "timeout"),
    ]
    assert rows[1]["failing_until"] == clock.time() + 100 and rows[1]["failures"] == 1
    clock.advance(150)  # out of the failing cache, still in the tickets window: watched
    rows = failing.view(clock.time())
    assert [(r["server"], r["status"], r["kind"]) for r in rows] == [
        (f"{BACKEND}/s0", "watched", "timeout")
    ]
    assert rows[0]["failing_until"] is None and rows[0]["tickets_until"] == clock.time() + 50
    assert failing.local_fault("lsf", "launch")
    assert failing.clear([], everything=True) == [f"{BACKEND}/s0", "local-fault/lsf/launch"]
    assert failing.view(clock.time()) == []


# --- who a ban is recorded as (issue 31, item 7) -------------------------------------------------


def _ban_site(folder: Path) -> Path:
    config = folder / "site.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "director": {"state_dir": str(folder / "state")},
                "state": {"driver": "sqlite", "path": str(folder / "state.db")},
                "backends": {"slurm": {"partitions": ["debug"], "script": "/bin/true"}},
                "demand": {"static": {"slurm": 1}},
            }
        ),
        encoding="utf-8",
    )
    return config


def _who(argv: list[str], config: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [*argv, "servers", "ban", "-c", str(config), "debug", "--for", "1h", "--reason", "test"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(
        [argv[-1], "servers", "list", "-c", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return str(json.loads(listed.stdout)["bans"][0]["who"])


def test_a_ban_records_the_callers_own_login_whatever_sudo_user_says(gridgate_exe) -> None:
    """``nobody`` with SUDO_USER=root bans "by nobody"; root with SUDO_USER=alice and no sudo
    anywhere bans "by root"; root through a real sudo keeps both names."""
    import os
    import shutil
    import tempfile

    from support.uids import AS_NOBODY

    folder = Path(tempfile.mkdtemp(prefix="ggban-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        shutil.chown(folder, "nobody", "nogroup")
        config = _ban_site(folder)
        env = {"PATH": os.environ["PATH"], "SUDO_USER": "root", "LC_ALL": "C.UTF-8"}
        assert _who([*AS_NOBODY, gridgate_exe], config, env) == "nobody"
        assert _who([gridgate_exe], config, {**env, "SUDO_USER": "alice"}) == "root"
        sudo = shutil.which("sudo", path="/usr/bin:/bin")
        assert sudo, "sudo is not installed (dev.sh installs it)"
        through = [sudo, "env", "SUDO_USER=alice", gridgate_exe]
        assert _who(through, config, env) == "alice (sudo, as root)"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- servers list and show answer "why does this CE get no pilots?" (issue 32, item 1) -----------


def test_servers_list_and_show_name_gocdb_downtimes_bans_and_the_failing_cache(
    tmp_path, gridgate_exe
) -> None:
    """During a GOCDB OUTAGE (a real feed file) that the director obeyed, ``servers list`` said
    "every server is in rotation" and ``--json`` {"servers": []}; now it shows every endpoint
    that is not plainly available, from every source, and ``servers show`` one screen."""
    from support.director import TrackingBackend

    from gridgate.core.builtin.bans import OperatorBans
    from gridgate.core.stores.sqlite import SqliteState

    now = time.time()
    feed = tmp_path / "downtimes.xml"
    feed.write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<results><DOWNTIME ID="1" PRIMARY_KEY="1G0" '
        'CLASSIFICATION="SCHEDULED"><PRIMARY_KEY>1G0</PRIMARY_KEY><HOSTNAME>s0</HOSTNAME>'
        "<SEVERITY>OUTAGE</SEVERITY><DESCRIPTION>storage intervention</DESCRIPTION>"
        f"<START_DATE>{int(now - 60)}</START_DATE><END_DATE>{int(now + 3600)}</END_DATE>"
        "</DOWNTIME></results>",
        encoding="utf-8",
    )
    config = site(tmp_path)
    doc = yaml.safe_load(config.read_text())
    doc["availability"] = {"gocdb": {"url": feed.as_uri(), "refresh": 1}}
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    store = SqliteState({"path": str(tmp_path / "state" / "state.db")})
    OperatorBans(store).ban(f"{BACKEND}/s1", who="alice", why="CE upgrade", duration=3600)
    backend = TrackingBackend(3, {"s2": "fake-fail"})
    director = Director(load_config(config), extra_plugins=[backend, Collector()])
    try:
        director.run_iteration()
    finally:
        director.close()
        store.close()

    listed = gridgate(gridgate_exe, "servers", "list", "-c", str(config), "--json")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    unavailable = {row["endpoint"]: row for row in doc["unavailable"]}
    assert unavailable[f"{BACKEND}/s0"]["state"] == "banned"
    assert unavailable[f"{BACKEND}/s0"]["source"] == "gocdb"
    assert "storage intervention" in unavailable[f"{BACKEND}/s0"]["reason"]
    assert unavailable[f"{BACKEND}/s0"]["until"] == pytest.approx(int(now + 3600))
    assert unavailable[f"{BACKEND}/s1"]["source"].startswith("operator")
    assert [r["server"] for r in doc["servers"]] == [f"{BACKEND}/s2"]  # the failing cache
    text = gridgate(gridgate_exe, "servers", "list", "-c", str(config)).stdout
    assert "every server is in rotation" not in text
    assert f"{BACKEND}/s0" in text and "gocdb" in text and "storage intervention" in text

    shown = gridgate(gridgate_exe, "servers", "show", "-c", str(config), "s0")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout
    assert "availability: banned until" in lines and "says gocdb: " in lines
    assert "failing cache: not in it" in lines
    assert "last poll:" in lines and "pilots:" in lines
    failing = json.loads(
        gridgate(gridgate_exe, "servers", "show", "-c", str(config), "s2", "--json").stdout
    )
    assert (
        failing["failing"]["status"] == "failing"
        and failing["availability"]["state"] == "available"
    )
    assert failing["last_submission"]["outcome"] == "failed"
    unknown = gridgate(gridgate_exe, "servers", "show", "-c", str(config), "nosuch")
    assert unknown.returncode == 2 and "nosuch" in unknown.stderr


def _token_file(path: Path, exp: float) -> Path:
    """A private file holding a JWT that ends at ``exp`` (its signature is nobody's here)."""
    import base64
    import os

    def part(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    token = f"{part({'alg': 'RS256'})}.{part({'sub': 'pilots', 'exp': int(exp)})}.c2ln"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return path


class TokenBackend(ScriptedBackend):
    """The testbed's servers, whose commands need a bearer token."""

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> Any:
        info = super().gridgate_backend_info(backend)
        return None if info is None else dataclasses.replace(info, credentials=("token",))


def test_servers_list_and_show_name_the_credential_an_endpoint_and_a_group_wait_for(
    tmp_path, gridgate_exe
) -> None:
    """Two VOs on one backend, each group with its own named token; lhcb's has ended: the
    operator's view says that lhcb's group waits for lhcb-token on every endpoint, and
    nothing else waits."""
    now = time.time()
    config = site(tmp_path)
    doc = yaml.safe_load(config.read_text())
    doc["credentials"] = {
        "atlas-token": {
            "kind": "bearer_token",
            "path": str(_token_file(tmp_path / "atlas.token", now + 5 * 3600)),
        },
        "lhcb-token": {
            "kind": "bearer_token",
            "path": str(_token_file(tmp_path / "lhcb.token", now - 3600)),
        },
    }
    doc["demand"] = {
        "static": {
            BACKEND: [
                {"group": "atlas", "pilots": 2, "credential": "atlas-token"},
                {"group": "lhcb", "pilots": 2, "credential": "lhcb-token"},
            ]
        }
    }
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    backend = TokenBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})
    director = Director(load_config(config), extra_plugins=[backend, Collector()])
    try:
        summary = director.run_iteration()
    finally:
        director.close()
    assert sorted((r.group, r.outcome) for r in summary.records) == [
        ("atlas", "submitted"),
        ("atlas", "submitted"),
        ("lhcb", "skipped"),
    ]

    listed = gridgate(gridgate_exe, "servers", "list", "-c", str(config), "--json")
    assert listed.returncode == 0, listed.stderr
    waits = json.loads(listed.stdout)["credential_waits"]
    wanted = {"endpoint": [], "groups": {"lhcb": ["lhcb-token"]}}
    assert waits == {f"{BACKEND}/s0": wanted, f"{BACKEND}/s1": wanted}
    text = gridgate(gridgate_exe, "servers", "list", "-c", str(config)).stdout
    assert "waiting for a credential" in text and "group lhcb for lhcb-token" in text
    assert "every server is in rotation" not in text

    shown = gridgate(gridgate_exe, "servers", "show", "-c", str(config), "s0")
    assert shown.returncode == 0, shown.stderr
    assert "waits for a credential: group lhcb for lhcb-token" in shown.stdout
    lines = shown.stdout.splitlines()
    (lhcb,) = [ln for ln in lines if ln.strip().startswith("credential lhcb-token")]
    (atlas,) = [ln for ln in lines if ln.strip().startswith("credential atlas-token")]
    assert "UNUSABLE" in lhcb and ": usable: " in atlas


def test_servers_show_says_what_the_queue_last_said_of_itself(tmp_path, gridgate_exe) -> None:
    """The answer of ``gridgate_endpoint_state`` a director got is kept for ``servers show``:
    the serving state, everybody's waiting and running jobs, free slots, the limits, who said
    it and when; outside words escaped; an endpoint never asked says so."""
    from support.director import TrackingBackend

    from gridgate.core.endpoint_state import EndpointState

    class Queues:
        @hookimpl
        def gridgate_endpoint_state(self, endpoint: Endpoint, timeout: float):
            if endpoint.name != "s0":
                return None
            return EndpointState(
                serving="draining",
                waiting=12,
                running=40,
                free_slots=0,
                max_walltime=172800,
                source="slurm scontrol/sinfo/squeue",
                reason="State=DRAIN \x1b[31mupgrade",
            )

    config = site(tmp_path)
    director = Director(load_config(config), extra_plugins=[TrackingBackend(3), Queues()])
    try:
        director.run_iteration()
    finally:
        director.close()
    shown = gridgate(gridgate_exe, "servers", "show", "-c", str(config), "s0")
    assert shown.returncode == 0, shown.stderr
    line = next(ln for ln in shown.stdout.splitlines() if ln.startswith("  queue:"))
    assert line.startswith(
        "  queue: draining, 12 waiting, 40 running, 0 free slots, reason: State=DRAIN "
        "\\x1b[31mupgrade; max walltime 172800 s, says slurm scontrol/sinfo/squeue (asked "
    ), line
    assert "\x1b" not in shown.stdout
    other = gridgate(gridgate_exe, "servers", "show", "-c", str(config), "s1").stdout
    assert "  queue: nothing said" in other
    as_json = json.loads(
        gridgate(gridgate_exe, "servers", "show", "-c", str(config), "s0", "--json").stdout
    )
    assert as_json["queue"]["waiting"] == 12 and as_json["queue"]["serving"] == "draining"
