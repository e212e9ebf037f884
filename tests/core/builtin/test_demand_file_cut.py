"""The demand file is re-read every iteration like the config: one whose last line has no
newline may be cut inside a value (``pilots: 100`` read as ``pilots: 1``), so it asks for
nothing until it is whole (issue 21, item 10: the same hole as the config's reload)."""

from __future__ import annotations

from pathlib import Path

from support.director import BACKEND, ScriptedBackend

from gridgate.core.clock import FakeClock
from gridgate.core.config import validate_document
from gridgate.core.engine.director import Director


def test_a_cut_demand_file_asks_for_nothing_until_it_is_whole(tmp_path: Path) -> None:
    demand = tmp_path / "demand.yaml"
    demand.write_text(f"{BACKEND}: 3\n")
    doc = {
        "director": {"cycle_seconds": 0.01, "max_threads": 4, "command_timeout": 5},
        "state": {"driver": "memory"},
        "demand": {"file": {"path": str(demand)}},
    }
    director = Director(
        validate_document(doc),
        clock=FakeClock(1_000_000.0),
        extra_plugins=[ScriptedBackend(2, {"s0": "fake-ok", "s1": "fake-ok"})],
    )
    assert sum(r.pilots for r in director.run_iteration().records) == 3
    demand.write_text(f"{BACKEND}: 3")  # "30\n" cut after its first digit: YAML cannot tell
    assert director.run_iteration().records == ()
    demand.write_text(f"{BACKEND}: 30\n")
    assert sum(r.pilots for r in director.run_iteration().records) == 30
    director.close()
