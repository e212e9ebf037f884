"""Fault row: the director SIGKILLed mid-iteration with commands in flight, then restarted.

A real `gridgate run` process drives the stand-in gLite commands; two servers hang (one of them
with a grandchild holding the pipes) so commands are in flight when the director is killed.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from relkit import (
    HOSTS,
    Site,
    alive,
    gridgate,
    json_lines,
    proc_table,
    processes_with,
    wait_for,
)
from support.servers import SmtpServer, free_port

from gridgate.core.engine.runtime import ACCOUNTING
from gridgate.core.failing import FailingCache
from gridgate.core.model import Endpoint
from gridgate.core.state import open_state
from gridgate.plugins.wms_glite.sim import read_calls

HANG, GRANDCHILD, BROKEN, HEALTHY = HOSTS[:4]


def _kill_leftovers(marker: str, groups: set[int]) -> None:
    """Whatever survived a failed run must not outlive the test."""
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(150)
def test_sigkill_mid_iteration_then_restart(
    tmp_path: Path, gridgate_exe: str, director_procs: list, figures
) -> None:
    site = Site(tmp_path / "site")
    smtp_port = free_port()  # SMTP is down for the whole run: mail waits in the outbox
    doc = site.doc(command_timeout=60, max_threads=12)
    doc["demand"] = {"static": {"wms_glite": 24}}
    # in turn, not at random: every server is picked in each iteration (BROKEN in the first,
    # both hanging servers in the killed one), which random picks would miss now and then
    doc["selectors"] = {"round_robin": {}}
    doc["notifiers"]["email"] = {
        "host": "127.0.0.1",
        "port": smtp_port,
        "from": "gridgate@example.org",
        "error_address": "ops@example.org",
        "alarm_address": "alarms@example.org",
        "poll_interval": 0.05,
        "timeout": 2,
        "retry_initial": 0.1,
    }
    config = site.write(doc)
    marker = str(site.bin)

    # 1. One iteration: BROKEN fails, enters the failing cache, one error mail is queued.
    site.scenario(hosts={BROKEN: {"behaviour": "error"}})
    first = gridgate(gridgate_exe, "run", "-c", str(config), "--once", "--json")
    assert first.returncode == 0, first.stderr
    t_first = time.time()
    [it1] = json_lines(first.stdout)
    assert [(n["level"], n["endpoint"]) for n in it1["notifications"]] == [("error", BROKEN)]
    outbox = site.state_dir / "outbox"
    queued = sorted(p.name for p in outbox.rglob("*") if p.is_file())
    assert queued, "the error mail should be waiting in the outbox"

    # 2. HANG and GRANDCHILD now hang: start a long run and kill it while they are in flight.
    site.scenario(
        hosts={
            BROKEN: {"behaviour": "error"},
            HANG: {"behaviour": "print_then_hang", "hang": 600},
            GRANDCHILD: {"behaviour": "grandchild", "parent_hangs": True, "hang": 600},
        }
    )
    before = len(read_calls(site.calls_log))
    log = (tmp_path / "run.out").open("w")
    proc = subprocess.Popen(
        [gridgate_exe, "run", "-c", str(config), "--iterations", "100", "--json"],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    director_procs.append(proc)
    try:

        def in_flight() -> list:
            return [
                c
                for c in read_calls(site.calls_log)[before:]
                if c.end is None and c.host in (HANG, GRANDCHILD)
            ]

        hanging = wait_for(
            lambda: len({c.host for c in in_flight()}) == 2 and in_flight(),
            60,
            "both hanging servers to have a command in flight",
        )
        grandchildren = wait_for(
            lambda: [c.grandchild for c in read_calls(site.calls_log)[before:] if c.grandchild],
            30,
            "a grandchild to be started",
        )
        stand_ins = set(processes_with(marker))
        assert {c.pid for c in hanging} <= stand_ins
        table = proc_table()  # one snapshot: a pid may exit between two reads of /proc
        groups = {table[pid][1] for pid in stand_ins | set(grandchildren) if pid in table}
        assert all(alive(pid) for pid in grandchildren)
        in_flight_groups = len(groups)
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

        # 3. Nothing the dead director started may live on: not the commands, not a grandchild.
        def survivors() -> list[int]:
            return [
                pid for pid, (_pp, pgid, st) in proc_table().items() if pgid in groups and st != "Z"
            ]

        wait_for(lambda: not survivors(), 10, "the commands to die with their director")
        gone_after = time.monotonic() - killed_at
    finally:
        log.close()
        _kill_leftovers(marker, groups if "groups" in locals() else set())

    # 4. Restart: the failing cache and tickets survived, so BROKEN raises nothing new.
    site.scenario(hosts={BROKEN: {"behaviour": "error"}})
    t_last = time.time()
    again = gridgate(gridgate_exe, "run", "-c", str(config), "--once", "--json")
    assert again.returncode == 0, again.stderr
    [it3] = json_lines(again.stdout)
    assert it3["notifications"] == []
    assert all(s["endpoint"] != BROKEN for s in it3["submitted"])
    # the whole demand, less what max_waiting trimmed: how many of the killed run's pilots
    # still wait on the healthy servers depends on how far the stand-in moved them
    trimmed = sum(it3["pilots"]["trimmed"].get("wms_glite", {}).values())
    assert len(it3["submitted"]) + trimmed == 24

    state = open_state(doc)
    try:
        failing = FailingCache(state)
        assert failing.contains(Endpoint("wms_glite", BROKEN))
        assert failing.watched(Endpoint("wms_glite", BROKEN))
        rows = state.records(ACCOUNTING)
    finally:
        state.close()
    # Accounting: both complete iterations fully recorded (8 pilots each); from the killed
    # one only what finished before the kill: never a row for a command still in flight.
    first_rows = [r for r in rows if r["time"] <= t_first]
    last_rows = [r for r in rows if r["time"] >= t_last]
    middle = [r for r in rows if t_first < r["time"] < t_last]
    # (first attempts: a submission retried on another server has a row per attempt)
    assert sum(r["pilots"] for r in first_rows if r.get("attempt", 1) == 1) == 24
    assert sum(r["pilots"] for r in last_rows if r.get("attempt", 1) == 1) == 24
    assert {(r["endpoint"], r["outcome"]) for r in middle} <= {(HEALTHY, "submitted")}
    job_ids = [j for r in rows for j in r["job_ids"]]
    assert len(job_ids) == len(set(job_ids)), "a submission recorded twice"
    with sqlite3.connect(site.state_dir / "state.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    # 5. The outbox kept the mail across the kill; SMTP returns and it is delivered once.
    smtp = SmtpServer(port=smtp_port).start()
    try:
        flushed = gridgate(gridgate_exe, "outbox", "retry", "--flush", "-c", str(config))
        assert flushed.returncode == 0, flushed.stderr
        subjects = smtp.handler.subjects()
    finally:
        smtp.stop()
    assert len(subjects) == 1 and BROKEN in subjects[0], subjects
    figures(
        groups_in_flight=in_flight_groups,
        processes=len(stand_ins | set(grandchildren)),
        gone_after_s=round(gone_after, 2),
        accounting_rows=len(rows),
        restart_notifications=len(it3["notifications"]),
        mails_delivered=len(subjects),
    )
