"""Each notifier is called on its own: one that raises is logged and counted, the others are
still told, and the director never stops for a notifier (issue 21, item 4)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.director import ScriptedBackend, config

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.model import Notification
from gridgate.core.testing import Collector

STALL = "stall/"


def _site(tmp_path: Path) -> Path:
    """A director whose only server cannot be started (nothing is ever submitted, so the
    stall error comes at the third iteration) and whose ``files`` folder is a plain file."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    path = tmp_path / "gridgate.yaml"
    path.write_text(f"""\
director:
  cycle_seconds: 0.01
  command_timeout: 5
  state_dir: {tmp_path / "state"}
state:
  driver: memory
backends:
  wms_glite:
    servers: [wms01.example.org]
    commands: {{submit: /nonexistent/gridgate-test/glite-wms-job-submit}}
    list_match: false
demand:
  static:
    wms_glite: 2
notifiers:
  log: {{}}
  files: {{folder: {blocker / "sub"}}}
""")
    return path


@pytest.mark.timeout(60)
def test_a_failing_notifier_stops_neither_the_others_nor_gridgate_run(
    tmp_path: Path, gridgate_exe: str
) -> None:
    path = _site(tmp_path)
    proc = subprocess.run(
        [gridgate_exe, "run", "-c", str(path), "--iterations", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("Traceback") == 1  # the failing notifier's, logged once
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 4
    # the log notifier was told of the local fault and of the stall, after the files one failed
    assert (
        "[error] gridgate: cannot run /nonexistent/gridgate-test/glite-wms-job-submit"
        in proc.stderr
    )
    assert "has submitted no pilot for 3 iterations" in proc.stderr
    assert "notifier files failed (2 times so far), the others were still told" in proc.stderr
    assert "NotADirectoryError" in proc.stderr


class Broken:
    """A notifier that always raises."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        self.calls += 1
        raise OSError("the notifier's disk is gone")


def test_each_notifier_is_called_once_and_a_failing_one_is_counted() -> None:
    clock = FakeClock(1_000_000.0)
    collector, broken = Collector(), Broken()
    # the broken one registered last is called first by pluggy (LIFO): it must not hide the collector
    director = Director(
        config(servers=1, pilots=2, stall_iterations=1),
        clock=clock,
        extra_plugins=[ScriptedBackend(1, {"s0": "missing"}), collector, broken],
    )
    for _ in range(3):
        director.run_iteration()
    assert collector.notes, "the other notifier was told nothing"
    assert any(n.key.startswith(STALL) for n in collector.notes)
    # every note reached the broken one too, but the one telling of it (said once)
    told = [n for n in collector.notes if n.key.startswith("notifier/")]
    assert len(told) == 1 and "Broken cannot deliver" in told[0].subject, collector.notes
    assert broken.calls == len(collector.notes) - 1
    assert list(director.notify_failures.values()) == [broken.calls]
