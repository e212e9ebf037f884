"""Issue 41: a submission's intent is written before it is sent, and the director reconciles by
name what the answer did not settle (a director killed mid-submission, a lost answer, a store
that came back empty), through ``gridgate_find_pilots``. The CE here is the in-process
:class:`~support.director.NamingBackend` (its jobs carry the names core gives); the real
backends are held to the same by their own tests and tests/reliability/test_crash_consistency.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.director import BACKEND, Killed, NamingBackend, config, set_director

from gridgate.core.backend import job_name, submission_of
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import ACCOUNTING, Director
from gridgate.core.engine.epoch import EPOCH_KEY
from gridgate.core.engine.intents import fleet_of
from gridgate.core.model import SubmitRequest
from gridgate.core.state import PilotRegistry
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector


def submitted(summary) -> int:
    return sum(r.pilots for r in summary.records if r.outcome == "submitted")


def waiting(registry: PilotRegistry, endpoint: str | None = None) -> int:
    return sum(
        n
        for (_b, e, s), n in registry.counts().items()
        if s == "waiting" and (endpoint is None or e == endpoint)
    )


def on_ce(backend: NamingBackend, endpoint: str = "s0") -> int:
    return backend.count(endpoint, "waiting")


def make(
    tmp_path: Path,
    clock: FakeClock,
    backend: NamingBackend,
    store: MemoryState,
    *,
    pilots: int = 4,
    max_waiting: int = 4,
    state_dir: str = "state",
    collector: Collector | None = None,
) -> Director:
    cfg = config(servers=1, pilots=pilots, state_dir=str(tmp_path / state_dir))
    cfg.data["director"]["pilots"].update({"max_waiting": max_waiting, "reconcile_for": 120})
    plugins = [backend, collector or Collector()]
    return Director(cfg, clock=clock, extra_plugins=plugins, state=store)


def intents(tmp_path: Path, state_dir: str = "state") -> list[dict]:
    folder = tmp_path / state_dir / "intents"
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except FileNotFoundError:  # settled by another submission thread meanwhile
            pass
    return found


# --- names ------------------------------------------------------------------------------------


def test_job_names_carry_the_submission_and_read_back() -> None:
    request = SubmitRequest(BACKEND, name="3fa2c1-9b8e7d6c5a4f")
    assert job_name("gridgate", request) == "gridgate-3fa2c1-9b8e7d6c5a4f"
    assert job_name("gridgate", request, 2) == "gridgate-3fa2c1-9b8e7d6c5a4f-2"
    assert job_name("gridgate", SubmitRequest(BACKEND)) == "gridgate"
    assert submission_of("gridgate-3fa2c1-9b8e7d6c5a4f-2", "gridgate") == "3fa2c1-9b8e7d6c5a4f"
    assert submission_of("gridgate-3fa2c1-9b8e7d6c5a4f", "gridgate") == "3fa2c1-9b8e7d6c5a4f"
    for other in (
        "gridgate",
        "gridgate-3fa2c1-9b8e7d6c5a4",  # cut short
        "gridgate-3fa2c1-9b8e7d6c5a4fx",
        "gridgate-3fa2c1-9b8e7d6c5a4f-x",
        "atlas-3fa2c1-9b8e7d6c5a4f",  # another base
        "gridgate-3FA2C1-9b8e7d6c5a4f",
    ):
        assert submission_of(other, "gridgate") is None, other


def test_every_director_of_one_redis_shares_a_fleet_and_a_sqlite_file_has_its_own(
    tmp_path,
) -> None:
    redis = {"state": {"driver": "redis", "url": "redis://r:6379/0", "password": "a"}}
    same = {"state": {"driver": "redis", "url": "redis://r:6379/0", "password": "b"}}
    assert fleet_of(redis, "/x") == fleet_of(same, "/y")  # the secret and the folder: no part
    assert fleet_of(redis, "/x") != fleet_of(
        {"state": {"driver": "redis", "url": "redis://q"}}, "/x"
    )
    sqlite = {"state": {"driver": "sqlite"}}
    assert fleet_of(sqlite, "/a") != fleet_of(sqlite, "/b")
    # PostgreSQL is shared like Redis: named by its dsn and schema, whatever the host's folder
    pg = {"state": {"driver": "postgresql", "dsn": "postgresql://gg@db/grid", "schema": "a"}}
    assert fleet_of(pg, "/x") == fleet_of(pg, "/y")
    assert fleet_of(pg, "/x") != fleet_of({"state": {**pg["state"], "schema": "b"}}, "/x")
    assert len(fleet_of(sqlite, "/a")) == 6


# --- intent first -------------------------------------------------------------------------------


def test_an_intent_is_written_before_the_submission_and_settled_by_its_answer(tmp_path) -> None:
    clock = FakeClock()
    backend = NamingBackend(servers=1)
    seen: list[list[dict]] = []
    real = backend.make

    def make_and_look(endpoint: str, name: str, n: int) -> list[str]:
        seen.append(intents(tmp_path))  # what is on disk while the CE makes the jobs
        return real(endpoint, name, n)

    backend.make = make_and_look  # type: ignore[method-assign]
    director = make(tmp_path, clock, backend, MemoryState(clock=clock))
    summary = director.run_iteration()
    assert submitted(summary) == 4
    assert len(seen) == 4 and all(len(s) >= 1 for s in seen)
    written = {i["name"] for s in seen for i in s}
    names = {submission_of(n, NamingBackend.BASE) for n in backend.names.values()}
    assert names == written  # each submission's intent was on disk before its jobs existed
    assert intents(tmp_path) == []  # all settled
    rows = director.state.records(ACCOUNTING)
    assert {r["name"] for r in rows if r["outcome"] == "submitted"} == written
    director.close()


def test_gridgate_find_pilots_adopts_what_a_killed_director_submitted(tmp_path) -> None:
    """A director killed after the CE made the jobs and before it recorded them: the next one
    on the state folder finds them by name before it submits anything, adopts them (group,
    cores and submission time from the intent, an accounting row) and submits no more than
    max_waiting allows."""
    clock = FakeClock()
    backend = NamingBackend(servers=1)
    store = MemoryState(clock=clock)
    first = make(tmp_path, clock, backend, store, pilots=1)
    backend.submit_mode["s0"] = "kill"
    with pytest.raises(Killed):
        first.run_iteration()
    assert on_ce(backend) == 1 and waiting(store.pilot_registry()) == 0
    assert len(intents(tmp_path)) == 1
    backend.submit_mode["s0"] = "ok"
    clock.advance(5)
    second = make(tmp_path, clock, backend, store, pilots=4)
    summary = second.run_iteration()
    registry = store.pilot_registry()
    assert submitted(summary) == 3  # 1 adopted + 3 = max_waiting 4
    assert on_ce(backend) == 4 and waiting(registry) == 4
    adopted = [r for r in store.records(ACCOUNTING) if r.get("failure_kind") == "adopted"]
    assert len(adopted) == 1 and adopted[0]["pilots"] == 1
    (pilot,) = [p for p in registry.query(BACKEND) if p.job_id in adopted[0]["job_ids"]]
    assert pilot.group == "default" and pilot.submitted == clock.time() - 5
    assert intents(tmp_path) == []
    assert backend.find_calls and backend.find_calls[0][2] == ""  # by name, not by fleet
    second.close()


@pytest.mark.parametrize("recorded", ["row", "row and pilot"])
def test_a_director_killed_after_recording_its_answer_leaves_no_second_row(
    tmp_path, recorded
) -> None:
    """Killed after the answer's accounting row (and maybe the pilot) was written, before the
    intent was settled: the next director finds the job by name and neither writes a second
    row for it nor overwrites what the registry tracks (CI's Grid Engine crash runs saw a job
    id in two rows)."""
    from gridgate.core.state import Pilot

    clock = FakeClock()
    backend = NamingBackend(servers=1)
    store = MemoryState(clock=clock)
    first = make(tmp_path, clock, backend, store, pilots=1)
    backend.submit_mode["s0"] = "kill"
    with pytest.raises(Killed):
        first.run_iteration()
    (intent,) = intents(tmp_path)
    (job,) = backend.jobs["s0"]
    # what the killed director had written before it stopped
    store.append_record(
        ACCOUNTING,
        {
            "time": clock.time(),
            "backend": BACKEND,
            "endpoint": "s0",
            "outcome": "submitted",
            "pilots": 1,
            "job_ids": [job],
            "name": intent["name"],
        },
    )
    if recorded == "row and pilot":
        backend.move("s0", "running")
        store.pilot_registry().put(
            [Pilot(job, BACKEND, "s0", submitted=clock.time(), changed=clock.time())]
        )
    backend.submit_mode["s0"] = "ok"
    clock.advance(5)
    second = make(tmp_path, clock, backend, store, pilots=1)
    second.run_iteration()
    rows = [r for r in store.records(ACCOUNTING) if job in (r.get("job_ids") or ())]
    assert len(rows) == 1, rows
    assert intents(tmp_path) == []
    (pilot,) = [p for p in store.pilot_registry().query(BACKEND) if p.job_id == job]
    if recorded == "row and pilot":  # the registry's own record stands (its poll moves it)
        assert pilot.submitted == clock.time() - 5
    second.close()


def test_a_bulk_answer_that_named_half_its_jobs_gets_one_row_per_job(tmp_path) -> None:
    """An ARC bundle whose answer named 2 of its 4 jobs and lost the others: the 2 are tracked
    and accounted at once, the 2 others adopted by name with a row of their own; no job id is
    in two rows and none is tracked twice."""
    clock = FakeClock()
    backend = NamingBackend(servers=1, pilots_per_submission=4)
    store = MemoryState(clock=clock)
    director = make(tmp_path, clock, backend, store)
    backend.submit_mode["s0"] = "partial"
    summary = director.run_iteration()
    assert submitted(summary) == 2 and on_ce(backend) == 4
    backend.submit_mode["s0"] = "ok"
    clock.advance(30)
    assert submitted(director.run_iteration()) == 0  # the 2 others found: max_waiting is full
    assert waiting(store.pilot_registry()) == 4 and intents(tmp_path) == []
    seen: dict[str, int] = {}
    for row in store.records(ACCOUNTING):
        for job in row.get("job_ids") or ():
            seen[job] = seen.get(job, 0) + 1
    assert sorted(seen.values()) == [1, 1, 1, 1], seen
    director.close()


def test_a_lost_answer_is_reconciled_by_name_and_counted_meanwhile(tmp_path) -> None:
    clock = FakeClock()
    backend = NamingBackend(servers=1, pilots_per_submission=4)  # one bulk, its answer lost
    store = MemoryState(clock=clock)
    director = make(tmp_path, clock, backend, store)
    backend.submit_mode["s0"] = "lose"
    backend.find_mode["s0"] = "down"  # and the CE cannot be asked at first
    summary = director.run_iteration()
    assert submitted(summary) == 0 and on_ce(backend) == 4
    backend.submit_mode["s0"] = "ok"
    clock.advance(30)
    # not found yet, not given up: its 4 pilots count against max_waiting
    assert submitted(director.run_iteration()) == 0
    assert on_ce(backend) == 4 and len(intents(tmp_path)) == 1
    backend.find_mode["s0"] = "ok"
    clock.advance(30)
    assert submitted(director.run_iteration()) == 0
    assert waiting(store.pilot_registry()) == 4 and intents(tmp_path) == []
    director.close()


def test_a_job_the_ce_lists_late_is_still_adopted_with_its_siblings(tmp_path, logs) -> None:
    """Seen on A-REX 6.17: of two jobs made by one lost creation, a search just after listed
    one. The submission stays unsettled until every pilot is found (the next search finds
    the other), and is settled with fewer only after reconcile_for."""
    clock = FakeClock()
    backend = NamingBackend(servers=1, pilots_per_submission=2)
    store = MemoryState(clock=clock)
    director = make(tmp_path, clock, backend, store, pilots=2, max_waiting=2)
    backend.submit_mode["s0"] = "lose"
    director.run_iteration()
    backend.submit_mode["s0"] = "ok"
    first, late = sorted(backend.jobs["s0"])
    backend.unlisted = {late}
    clock.advance(30)
    director.run_iteration()
    registry = store.pilot_registry()
    assert [p.job_id for p in registry.query()] == [first] and len(intents(tmp_path)) == 1
    backend.unlisted = set()
    clock.advance(30)
    director.run_iteration()
    assert sorted(p.job_id for p in registry.query()) == [first, late]
    assert intents(tmp_path) == []

    # one the CE never lists: settled with what was found once reconcile_for has passed
    backend.move("s0", "done")  # room for the next bulk, whose answer is lost too
    director.failing.clear(sorted(director.failing.excluded()))  # the loss excluded it
    backend.submit_mode["s0"] = "lose"
    clock.advance(30)
    director.run_iteration()
    backend.submit_mode["s0"] = "ok"
    made = sorted(set(backend.jobs["s0"]) - {first, late})
    assert len(made) == 2
    backend.unlisted = {made[-1]}
    for _ in range(2):  # found 1 of 2 at 40 and 80 s (reconcile_for: 120), still looked for
        clock.advance(40)
        director.run_iteration()
        assert len(intents(tmp_path)) == 1
    assert set(backend.jobs["s0"]) == {first, late, *made}, "nothing sent meanwhile"
    clock.advance(40)
    director.run_iteration()
    assert intents(tmp_path) == []
    assert made[0] in {p.job_id for p in registry.query()}
    assert "settled with 1 of its 2 pilot(s)" in "\n".join(m for _level, m in logs)
    director.close()


def test_a_name_not_found_is_given_up_after_reconcile_for_with_a_log_line(tmp_path, logs) -> None:
    clock = FakeClock()
    backend = NamingBackend(servers=1)
    director = make(tmp_path, clock, backend, MemoryState(clock=clock), pilots=2)
    backend.submit_mode["s0"] = "nothing"
    director.run_iteration()
    # its 2 submissions run in parallel: the second was sent, or skipped once the first's
    # failure had excluded the server (1 or 2 pilots in flight; both fit max_waiting 4 beside
    # the 2 submitted next)
    lost = len(intents(tmp_path))
    assert lost in (1, 2)
    backend.submit_mode["s0"] = "ok"
    director.failing.clear(sorted(director.failing.excluded()))  # its failure excluded it
    clock.advance(60)
    assert submitted(director.run_iteration()) == 2
    assert len(intents(tmp_path)) == lost
    # 121 s after they were sent, but the CE has answered without them for 61 s only (first
    # asked at 60 s): reconcile_for counts from the CE's first answer, as a CE just back from
    # a restart may not list its jobs at once
    clock.advance(61)
    director.run_iteration()
    assert len(intents(tmp_path)) == lost
    clock.advance(60)
    director.run_iteration()
    assert intents(tmp_path) == []
    text = "\n".join(m for _level, m in logs)
    assert "given up after" in text and "the CE has held none of its jobs for 121 s" in text
    director.close()


def test_a_ce_that_cannot_be_asked_past_reconcile_for_keeps_its_submissions(tmp_path, logs) -> None:
    """The CE stopped mid-bulk and slow to come back: its jobs may be there, so the submission
    is not given up while it cannot be asked (its pilots count meanwhile), and is adopted once
    the CE answers, however late; said once, not at every iteration."""
    clock = FakeClock()
    backend = NamingBackend(servers=1, pilots_per_submission=4)
    store = MemoryState(clock=clock)
    director = make(tmp_path, clock, backend, store)
    backend.submit_mode["s0"] = "lose"
    backend.find_mode["s0"] = "down"
    director.run_iteration()
    backend.submit_mode["s0"] = "ok"
    for _ in range(3):  # 3 x 100 s: well past reconcile_for (120 s)
        clock.advance(100)
        director.failing.clear(sorted(director.failing.excluded()))
        assert submitted(director.run_iteration()) == 0
        assert len(intents(tmp_path)) == 1 and on_ce(backend) == 4
    held = [m for _level, m in logs if "not found yet: the CE cannot be asked" in m]
    assert len(held) == 1, held
    assert not any("given up after" in m for _level, m in logs)
    backend.find_mode["s0"] = "ok"
    clock.advance(100)
    assert submitted(director.run_iteration()) == 0
    assert waiting(store.pilot_registry()) == 4 and intents(tmp_path) == []
    director.close()


def test_a_backend_that_cannot_look_up_names_gives_up_saying_so(tmp_path, logs) -> None:
    clock = FakeClock()
    backend = NamingBackend(servers=1)
    backend.find_mode["s0"] = "none"
    director = make(tmp_path, clock, backend, MemoryState(clock=clock), pilots=1)
    backend.submit_mode["s0"] = "lose"
    director.run_iteration()
    clock.advance(121)
    director.run_iteration()
    assert intents(tmp_path) == []
    assert any("cannot look jobs up by name" in m for _level, m in logs)
    director.close()


def test_no_submission_is_sent_when_its_intent_cannot_be_written(tmp_path) -> None:
    clock = FakeClock()
    backend = NamingBackend(servers=1)
    collector = Collector()
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state folder should be")
    director = make(tmp_path, clock, backend, MemoryState(clock=clock), collector=collector)
    summary = director.run_iteration()
    assert submitted(summary) == 0 and backend.calls == []
    assert {r.failure_kind for r in summary.records} <= {"local_io", "local_fault"}
    (note,) = [n for n in collector.notes if "intent" in n.body]
    assert "nothing is submitted while results cannot be recorded" in note.body
    director.close()


# --- a store that came back empty ---------------------------------------------------------------


def _empty(store: MemoryState) -> None:
    """What a Redis without persistence is after a restart: nothing."""
    for key, _value in store.items():
        store.delete(key)
    store._pilot_registry = None


def test_a_store_that_came_back_empty_is_noticed_and_its_pilots_adopted_before_submitting(
    tmp_path,
) -> None:
    clock = FakeClock()
    backend = NamingBackend(servers=1)
    store = MemoryState(clock=clock)
    collector = Collector()
    director = make(tmp_path, clock, backend, store, collector=collector)
    assert submitted(director.run_iteration()) == 4
    epoch = store.get(EPOCH_KEY)
    assert epoch
    backend.make("s0", "someone-else", 2)  # not this fleet's: never adopted
    _empty(store)
    clock.advance(30)
    summary = director.run_iteration()
    assert submitted(summary) == 0  # the 4 found on the CE fill max_waiting
    assert waiting(store.pilot_registry()) == 4 and on_ce(backend) == 6
    assert store.get(EPOCH_KEY) not in (None, epoch)
    told = [n for n in collector.notes if "came back empty" in n.subject]
    assert len(told) == 1
    # a second director of the fleet (its own state folder) learns the new epoch: not told again
    other = make(tmp_path, clock, backend, store, state_dir="other", collector=collector)
    other.run_iteration()
    assert len([n for n in collector.notes if "came back empty" in n.subject]) == 1
    other.close()
    director.close()


def test_an_endpoint_not_searched_yet_gets_no_pilot_even_after_a_restart(tmp_path) -> None:
    clock = FakeClock()
    backend = NamingBackend(servers=1)
    store = MemoryState(clock=clock)
    director = make(tmp_path, clock, backend, store, max_waiting=8)
    assert submitted(director.run_iteration()) == 4
    _empty(store)
    backend.find_mode["s0"] = "down"
    clock.advance(30)
    assert submitted(director.run_iteration()) == 0
    director.close()
    again = make(tmp_path, clock, backend, store, max_waiting=8)  # restarted meanwhile
    clock.advance(30)
    assert submitted(again.run_iteration()) == 0
    backend.find_mode["s0"] = "ok"
    clock.advance(30)
    assert submitted(again.run_iteration()) == 4  # 4 adopted + 4 = 8
    assert waiting(store.pilot_registry()) == 8
    again.close()


def test_intents_left_by_a_live_director_on_the_same_folder_are_its_own(tmp_path) -> None:
    """A file whose owner is a live process of this host is that director's: not reconciled
    from under it."""
    clock = FakeClock()
    backend = NamingBackend(servers=1)
    director = make(tmp_path, clock, backend, MemoryState(clock=clock), pilots=1)
    folder = tmp_path / "state" / "intents"
    folder.mkdir(parents=True)
    record = {
        "name": "abcdef-0123456789ab",
        "backend": BACKEND,
        "endpoint": "s0",
        "group": BACKEND,
        "count": 3,
        "cores": 1,
        "started": clock.time(),
        "owner": "elsewhere:1:x",
        "host": os.uname().nodename,
        "pid": os.getppid(),  # alive
        "why": "",
        "url": "",
    }
    (folder / "abcdef-0123456789ab.json").write_text(json.dumps(record))
    assert submitted(director.run_iteration()) == 1
    assert not any("abcdef-0123456789ab" in names for _e, names, _f in backend.find_calls)
    set_director(director, "pilots", "max_waiting", value=4)
    director.close()
