"""Real director processes share the demand groups of one real store (issue 43): three
processes of this interpreter on a redis-server and on a PostgreSQL cluster, each with the
stand-in backend of gridgate.core.devkit.directors, which notes every submission (director,
group, endpoint, start and end on the store's clock).

From those notes and the store: the groups are split fairly and each is filled only by the
holder of its lease; no two directors ever submit to one group at the same time, not while
they join, not when one is SIGKILLed and the others take its groups over, not when one stops
cleanly (and hands its leases back at once); the servers with a max_waiting never get more
than it, though every director fills them.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.polling import until
from support.proctable import no_child_left

from gridgate.core.devkit.directors import (
    BACKEND,
    DirectorSpec,
    Submission,
    overlaps,
    pilots_per_endpoint,
    spawn,
    submissions,
)
from gridgate.core.engine.sharing import DIRECTORS, GROUPS, LEASE
from gridgate.core.state import StateStore, open_state

GROUP_NAMES = {f"g{i:02d}" for i in range(6)}
#: the servers with a limit of their own; ce2 and ce3 have none, so filling goes on there
LIMITED = {"ce0": 8, "ce1": 8}
CYCLE = 0.5
#: the director killed with SIGKILL: its groups are taken over within two of these
SHORT_LEASE = 3.0
#: the others: a lease of theirs that is gone at once after their clean stop was handed
#: back, it could not have lapsed (DEADLINE is well below it)
LONG_LEASE = 120.0
#: the longest wait for what the directors reach by themselves; only a hung run reaches it
DEADLINE = 60.0


class Fleet:
    """Director processes on one store, and the test's own view of that store."""

    def __init__(self, folder: Path, section: dict[str, Any]) -> None:
        self.folder = folder
        self.section = section
        self.store: StateStore = open_state({"state": section})
        self.clock = self.store.clock  # the clock the directors note and lease on
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, lease: float) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        spec = DirectorSpec(
            state=self.section,
            out=str(self.folder / f"d{n}.jsonl"),
            state_dir=str(self.folder / f"state{n}"),
            groups=len(GROUP_NAMES),
            pilots=2,
            endpoints=4,
            threads=2,
            cycle=CYCLE,
            lease=lease,
            limited=LIMITED,
        )
        with open(self.folder / f"d{n}.log", "wb") as log:
            proc = spawn(spec, stdout=log, stderr=log, env={**os.environ, "PATH": "/usr/bin:/bin"})
        self.procs.append(proc)
        return proc

    def instances(self) -> dict[int, str]:
        """pid -> instance of the live directors, from their heartbeats."""
        beats = self.store.items(DIRECTORS)
        return {json.loads(v)["pid"]: k.removeprefix(DIRECTORS) for k, v in beats}

    def leases(self) -> dict[str, str]:
        """Group -> the director holding its lease."""
        prefix = f"{LEASE}{BACKEND}/"
        return {k.removeprefix(prefix): v for k, v in self.store.items(prefix)}

    def noted(self) -> list[Submission]:
        return submissions(sorted(self.folder.glob("d*.jsonl")))

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.folder.glob("d*.log"))
        )

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """A clean stop (SIGTERM): the director finishes its iteration and exits 0."""
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE) == 0, self.logs()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=DEADLINE)
        self.store.close()


@pytest.fixture(params=["redis", "postgresql"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet on a key prefix of the session's Redis or a schema of its PostgreSQL."""
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        prefix = f"procs-{uuid.uuid4().hex[:8]}:"
        section: dict[str, Any] = {"driver": "redis", "url": server.url, "prefix": prefix}
    else:
        cluster = request.getfixturevalue("postgres_server")
        request.getfixturevalue("monkeypatch").setenv("GG_TEST_PG_PW", cluster.password)
        section = {
            "driver": "postgresql",
            "dsn": cluster.dsn,
            "password": {"env": "GG_TEST_PG_PW"},
            "schema": f"procs_{uuid.uuid4().hex[:8]}",
        }
    # the server is up (a session's), so only what this test starts counts as its own
    with no_child_left():
        fleet = Fleet(tmp_path, section)
        try:
            yield fleet
        finally:
            fleet.close()


def _named(fleet: Fleet, procs: list[subprocess.Popen[bytes]]) -> list[str]:
    """The instances of ``procs`` (each names itself in its heartbeat)."""
    found = until(
        lambda: fleet.instances() if {p.pid for p in procs} <= set(fleet.instances()) else None,
        DEADLINE,
    )
    assert found, f"not every director came up:\n{fleet.logs()}"
    return [found[p.pid] for p in procs]


def _steady(fleet: Fleet, directors: list[str]) -> tuple[float, float, dict[str, str]]:
    """A window (start and end on the store's clock) through which the lease table stayed one
    in which ``directors`` hold every group, each at most its fair share, and in which every
    group was served; and that table."""
    cap = math.ceil(len(GROUP_NAMES) / len(directors))

    def fair() -> dict[str, str] | None:
        table = fleet.leases()
        held = Counter(table.values())
        if set(table) == GROUP_NAMES and set(held) == set(directors) and max(held.values()) <= cap:
            return table
        return None

    def window() -> tuple[float, float, dict[str, str]] | None:
        table = until(fair, DEADLINE)
        assert table, f"never split fairly among {directors}: {fleet.leases()}\n{fleet.logs()}"
        start = fleet.clock.time()
        served = until(
            lambda: GROUP_NAMES <= {s.group for s in fleet.noted() if s.start >= start}, DEADLINE
        )
        assert served, f"groups not served: {fleet.noted()[-10:]}\n{fleet.logs()}"
        end = fleet.clock.time()
        # a lease that moved meanwhile (a renewal late on a loaded machine): look again
        return (start, end, table) if fleet.leases() == table else None

    found = until(window, DEADLINE)
    assert found, f"the lease table kept moving: {fleet.leases()}"
    return found


def _assert_shared(fleet: Fleet, directors: list[str]) -> None:
    """Through a steady window each director filled between one group and its fair share,
    and each group only its lease holder filled."""
    start, end, table = _steady(fleet, directors)
    inside = [s for s in fleet.noted() if start <= s.start and s.end <= end]
    assert [s for s in inside if s.director != table[s.group]] == []
    groups = {d: {s.group for s in inside if s.director == d} for d in directors}
    cap = math.ceil(len(GROUP_NAMES) / len(directors))
    assert all(1 <= len(g) <= cap for g in groups.values()), groups


def test_director_processes_share_the_groups_and_take_over_a_dead_ones(fleet: Fleet) -> None:
    victim, clean, last = (
        fleet.start(SHORT_LEASE),
        fleet.start(LONG_LEASE),
        fleet.start(LONG_LEASE),
    )
    names = _named(fleet, [victim, clean, last])

    # three directors: two groups each, and the servers with a limit filled to it, not past
    _assert_shared(fleet, names)
    filled = until(
        lambda: all(pilots_per_endpoint(fleet.noted()).get(e, 0) >= n for e, n in LIMITED.items()),
        DEADLINE,
    )
    assert filled, pilots_per_endpoint(fleet.noted())

    # SIGKILL: the dead director's groups are served again, by the two left, fairly
    orphaned = {g for g, d in fleet.leases().items() if d == names[0]}
    killed_at = fleet.clock.time()
    victim.kill()
    victim.wait(timeout=DEADLINE)
    taken = until(
        lambda: (
            orphaned
            <= {s.group for s in fleet.noted() if s.start > killed_at and s.director != names[0]}
        ),
        DEADLINE,
    )
    assert orphaned and taken, f"{orphaned} not taken over:\n{fleet.logs()}"
    _assert_shared(fleet, names[1:])

    # a clean stop hands the leases back at once (they would last LONG_LEASE): the last
    # director takes every group
    fleet.stop(clean)
    left = [k for k, v in fleet.store.items(LEASE) if v == names[1]]
    left += [k for k, _ in fleet.store.items(GROUPS) if k.endswith(f"/{names[1]}")]
    assert left == [] and fleet.store.get(DIRECTORS + names[1]) is None, left
    _assert_shared(fleet, names[2:])
    fleet.stop(last)
    assert fleet.store.items(LEASE) == [] and fleet.store.items(DIRECTORS) == []

    noted = fleet.noted()
    assert {s.director for s in noted} == set(names)
    assert overlaps(noted) == []
    per_endpoint = pilots_per_endpoint(noted)
    assert {e: per_endpoint[e] for e in LIMITED} == LIMITED
    waiting: Counter[str] = Counter()
    for (_backend, endpoint, state), n in fleet.store.pilot_registry().counts().items():
        if state == "waiting":
            waiting[endpoint] += n
    assert all(waiting[e] <= n for e, n in LIMITED.items()), waiting
