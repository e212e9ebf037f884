"""``director.pilots.keep_output``: the output of one done pilot in N per endpoint is kept by the
director (at most one per endpoint per iteration, the newest ``keep_output_last`` of each), and
``read_output`` gives the kept copy once the CE no longer holds the pilot."""

from __future__ import annotations

import os
import stat

from support.director import BACKEND, TrackingBackend, config, pilots_by_state

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.engine.output import pilot_folder, read_output
from gridgate.core.model import PilotOutput
from gridgate.core.stores.memory import MemoryState


class Outputs(TrackingBackend):
    """The tracking testbed, answering for the output of the jobs it still holds."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.reads: list[tuple[str, str]] = []

    @hookimpl
    def gridgate_pilot_output(self, endpoint, job_id, stream, name, size, from_end, timeout):
        if endpoint.backend != BACKEND or stream == "file":
            return None
        self.reads.append((job_id, stream))
        if job_id not in self.jobs[endpoint.name]:
            return PilotOutput(job_id, stream, held=False, message=f"no job {job_id} here")
        text = f"{stream} of {job_id}\n" * 3
        return PilotOutput(job_id, stream, where=f"/ce/{job_id}.{stream}", text=text[:size])


def make(tmp_path, backend: Outputs, **pilots) -> Director:
    clock = FakeClock()
    cfg = config(servers=len(backend.endpoints), pilots=4, state_dir=str(tmp_path / "state"))
    cfg.data["director"]["pilots"].update(pilots)
    return Director(cfg, clock=clock, extra_plugins=[backend], state=MemoryState(clock=clock))


def test_one_done_pilot_in_n_is_kept_and_read_after_the_ce_forgot_it(tmp_path) -> None:
    backend = Outputs(servers=1)
    director = make(tmp_path, backend, keep_output=2, keep_output_last=5)
    try:
        director.run_iteration()
        backend.move("s0", "done")
        director.run_iteration()  # four pilots done: the first of each two chosen, one kept now
        done = pilots_by_state(director)["s0/done"]
        assert len(done) == 4
        kept = [p for p in done if pilot_folder(tmp_path / "state", p).is_dir()]
        assert len(kept) == 1
        folder = pilot_folder(tmp_path / "state", kept[0])
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(folder / "stdout").st_mode) == 0o600

        backend.move("s0", "forget")  # the CE cleaned up
        out = read_output(director.runtime, kept[0], "stdout")
        assert out.ok and out.held and out.text == f"stdout of {kept[0].job_id}\n" * 3
        assert "kept by the director" in out.message and f"/ce/{kept[0].job_id}" in out.message
        tail = read_output(director.runtime, kept[0], "stderr", cap=100, tail=1)
        assert tail.text == f"stderr of {kept[0].job_id}\n"
        other = next(p for p in done if p is not kept[0])
        gone = read_output(director.runtime, other, "stdout")
        assert not gone.held and "no job" in gone.message  # not kept: the CE's answer
    finally:
        director.close()


def test_at_most_one_per_iteration_and_the_newest_kept(tmp_path) -> None:
    backend = Outputs(servers=1)
    director = make(tmp_path, backend, keep_output=1, keep_output_last=2)
    try:
        for _ in range(4):
            director.run_iteration()
            backend.move("s0", "done", only="waiting")
        director.run_iteration()
        folders = list((tmp_path / "state" / "pilot-output").glob("*/*/*"))
        assert len(folders) == 2  # one per iteration that saw pilots end, the newest two
        assert len(pilots_by_state(director)["s0/done"]) >= 4
    finally:
        director.close()


def test_off_by_default_reads_nothing(tmp_path) -> None:
    backend = Outputs(servers=1)
    director = make(tmp_path, backend)
    try:
        director.run_iteration()
        backend.move("s0", "done")
        director.run_iteration()
        assert backend.reads == []
        assert not (tmp_path / "state" / "pilot-output").exists()
    finally:
        director.close()
