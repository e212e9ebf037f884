"""Reading a pilot's output through ``gridgate_pilot_output`` (core/engine/output.py): under a
query grant released after the call, capped, trimmed to the last lines, file names refused."""

from __future__ import annotations

import pytest
from support.director import BACKEND, TrackingBackend, config

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.engine.director import Director
from gridgate.core.engine.output import file_name_problem, last_lines, read_output
from gridgate.core.model import Grant, PilotOutput, Refusal
from gridgate.core.stores.memory import MemoryState

TEXT = "".join(f"line {i}\n" for i in range(1, 1001))  # 9,893 bytes


class Outputs(TrackingBackend):
    """The testbed backend, answering for its pilots' stdout from :data:`TEXT`."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.output_calls: list[dict] = []
        self.events: list[str] = []

    @hookimpl
    def gridgate_admit(self, request):
        self.events.append(f"admit {request.category} {request.opcode}")
        return Grant(issuer="outputs", category=request.category)

    @hookimpl
    def gridgate_release(self, grant):
        self.events.append("release")

    @hookimpl
    def gridgate_pilot_output(self, endpoint, job_id, stream, name, size, from_end, timeout):
        if endpoint.backend != BACKEND or stream == "stderr":
            return None
        self.events.append("pilot_output")
        self.output_calls.append({"job_id": job_id, "stream": stream, "size": size})
        if stream == "file":
            return PilotOutput(job_id, stream, held=False, name=name, message="no such file")
        data = TEXT.encode()
        part = data[-size:] if from_end else data[:size]
        return PilotOutput(
            job_id,
            stream,
            where=f"/out/{job_id}",
            text=part.decode(),
            cut=len(data) > size,
            size=len(data),
            from_end=from_end,
        )


@pytest.fixture
def director():
    backend = Outputs(1)
    clock = FakeClock()
    director = Director(
        config(servers=1, pilots=1),
        clock=clock,
        extra_plugins=[backend],
        state=MemoryState(clock=clock),
    )
    director.run_iteration()
    yield director, backend, director.state.pilot_registry().query()[0]
    director.close()


def test_gridgate_pilot_output_under_a_query_grant_released_after_the_call(director) -> None:
    director, backend, pilot = director
    backend.events.clear()
    out = read_output(director.runtime, pilot, "stdout")
    assert backend.events == ["admit query JOB_OUTPUT", "pilot_output", "release"]
    assert out.ok and out.held and not out.cut and out.text == TEXT
    assert out.where == f"/out/{pilot.job_id}" and out.size == len(TEXT)


def test_the_cap_cuts_the_start_and_a_tail_keeps_the_last_lines_of_the_end(director) -> None:
    director, backend, pilot = director
    head = read_output(director.runtime, pilot, "stdout", cap=20)
    assert head.cut and head.text == TEXT[:20] and not head.from_end
    tail = read_output(director.runtime, pilot, "stdout", cap=100, tail=3)
    assert tail.cut and tail.from_end and tail.text == "line 998\nline 999\nline 1000\n"
    assert backend.output_calls[-1]["size"] == 100
    # a tail longer than the cap holds: what the cap let through, whole lines kept
    many = read_output(director.runtime, pilot, "stdout", cap=30, tail=50)
    assert many.text == "line 998\nline 999\nline 1000\n"


def test_a_backend_that_reads_more_than_asked_is_cut_at_the_cap(director) -> None:
    director, backend, pilot = director

    class Greedy:
        @hookimpl(tryfirst=True)
        def gridgate_pilot_output(self, endpoint, job_id, stream, name, size, from_end, timeout):
            return PilotOutput(job_id, stream, text=TEXT)

    director.runtime.pm.register(Greedy())
    out = read_output(director.runtime, pilot, "stdout", cap=10)
    assert out.cut and out.text == TEXT[:10]


def test_a_stream_no_backend_reads_and_a_refusal_say_so(director) -> None:
    director, backend, pilot = director
    out = read_output(director.runtime, pilot, "stderr")
    assert not out.ok and f"backend {BACKEND} cannot read a pilot's stderr" in out.message

    class Refuse:
        @hookimpl(tryfirst=True)
        def gridgate_admit(self, request):
            return Refusal(issuer="test", reason="busy")

    director.runtime.pm.register(Refuse())
    refused = read_output(director.runtime, pilot, "stdout")
    assert not refused.ok and refused.message == "refused by admission control: busy"
    assert "pilot_output" not in backend.events[-1:]


def test_a_file_name_with_a_slash_or_dots_is_refused_before_any_call(director) -> None:
    director, backend, pilot = director
    for bad in ("../etc/passwd", "a/b", "..", ".", "x..y", "", "a\x1bb"):
        assert file_name_problem(bad) is not None, bad
        with pytest.raises(ValueError):
            read_output(director.runtime, pilot, "file", name=bad)
    assert backend.output_calls == []
    assert file_name_problem("pilot.log") is None
    gone = read_output(director.runtime, pilot, "file", name="pilot.log")
    assert not gone.held and gone.name == "pilot.log"


def test_last_lines_keeps_the_final_newline() -> None:
    assert last_lines("a\nb\nc\n", 2) == "b\nc\n"
    assert last_lines("a\nb\nc", 2) == "b\nc"
    assert last_lines("a\n", 5) == "a\n"
