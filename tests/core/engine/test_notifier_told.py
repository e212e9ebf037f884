"""A notifier that cannot deliver (its folder on a full disk, its outbox unwritable) is told to
the other notifiers once per episode, never to itself; its recovery is logged, and a later
failure is a new episode (issue 41: the "state store unavailable" mail never reached a files
notifier on the full disk, and nobody was told that it had not)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.director import ScriptedBackend, config

from gridgate.core import hookimpl
from gridgate.core.builtin.notifiers import FileNotifier
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.model import Notification
from gridgate.core.testing import Collector, build_plugin

UNDELIVERING = "cannot deliver notifications"


class Flaky:
    """A notifier that raises while ``failing``, and keeps what it took otherwise."""

    def __init__(self) -> None:
        self.failing = True
        self.took: list[Notification] = []

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        if self.failing:
            raise OSError(28, "No space left on device")
        self.took.append(notification)


def _note(clock: FakeClock, n: int) -> Notification:
    return Notification(level="error", subject=f"note {n}", body="", created=clock.time())


def _director(*notifiers: object) -> tuple[Director, FakeClock]:
    clock = FakeClock(1_000_000.0)
    director = Director(
        config(servers=1, pilots=1), clock=clock, extra_plugins=[ScriptedBackend(1), *notifiers]
    )
    return director, clock


def test_the_others_are_told_once_per_episode_and_the_recovery_is_logged(logs) -> None:
    collector, flaky = Collector(), Flaky()
    director, clock = _director(collector, flaky)
    try:
        director.notify(_note(clock, 1))
        director.notify(_note(clock, 2))
        told = [n for n in collector.notes if UNDELIVERING in n.subject]
        assert [n.subject for n in collector.notes if n not in told] == ["note 1", "note 2"]
        assert len(told) == 1 and told[0].level == "error", collector.notes
        assert "note 1" in told[0].body and "No space left on device" in told[0].body
        assert flaky.took == []  # never told of itself

        flaky.failing = False
        director.notify(_note(clock, 3))
        assert [n.subject for n in flaky.took] == ["note 3"]
        assert any("delivers again" in m for level, m in logs if level == "INFO"), logs

        flaky.failing = True  # a new episode: said again
        director.notify(_note(clock, 4))
        assert len([n for n in collector.notes if UNDELIVERING in n.subject]) == 2
    finally:
        director.close()


@pytest.fixture
def full_disk(tmp_path: Path):
    """A 1 MiB tmpfs filled to the last block."""
    folder = tmp_path / "full"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=True)
    try:
        (folder / "notes").mkdir()
        with open(folder / "filler", "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\0" * 65536)
            except OSError:
                pass  # ENOSPC, as wanted
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_files_notifier_on_a_full_disk_is_told_through_the_other(full_disk, tmp_path) -> None:
    files = build_plugin(FileNotifier, {"folder": str(full_disk / "notes")}, state_dir=tmp_path)
    collector = Collector()
    director, clock = _director(collector, files)
    try:
        director.notify(_note(clock, 1))
        [told] = [n for n in collector.notes if UNDELIVERING in n.subject]
        assert "notifier files" in told.subject or "FileNotifier" in told.subject, told.subject
        assert "No space left on device" in told.body, told.body
        assert list((full_disk / "notes").iterdir()) == []  # nothing half-written
    finally:
        director.close()
