"""The backend base class: "is this mine?" answered once, BackendInfo from the section, the
deadline and the output cap on every command; and a backend of raw hooks still works beside it.

Everything runs for real: stand-in commands started by the runner, a real pluggy manager, a
real director iteration.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

from gridgate.core import hookimpl
from gridgate.core.backend import Backend, Deadline, command_timeout_schema, env_schema
from gridgate.core.config import ConfigError
from gridgate.core.engine.contract import list_match_problems, list_matches
from gridgate.core.model import (
    BackendInfo,
    CancelResult,
    Endpoint,
    Failure,
    ListMatchResult,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import Plugin
from gridgate.core.testing import (
    Collector,
    build_plugin,
    director_for,
    plugin_manager_with,
    section_for,
    stand_in_command,
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "queues": {"type": "array", "items": {"type": "string"}, "default": ["q1"]},
        "pilots_per_job": {"type": "integer", "minimum": 1, "default": 1},
        "command_timeout": {"type": ["number", "null"], "default": None},
        "list_match": {"type": "boolean", "default": True},
        "env": {"type": "object", "additionalProperties": {"type": "string"}, "default": {}},
    },
    "required": ["command"],
    "additionalProperties": False,
}


class Toy(Backend):
    """Submits by running ``command``; counts the calls of its typed methods."""

    name = "toy"
    endpoints_key = "queues"
    pilots_key = "pilots_per_job"
    config_schema: ClassVar[dict[str, Any]] = SCHEMA

    def __init__(self, config: Mapping[str, Any], context: Any) -> None:
        super().__init__(config, context)
        self.called: list[str] = []

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        self.called.append("submit")
        outcome = self.run(self.config["command"], self.deadline(timeout))
        ids = tuple(outcome.stdout.split())
        return SubmitResult(endpoint, ok=outcome.ok and bool(ids), job_ids=ids, command=outcome)

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        self.called.append("classify_failure")
        return None

    def job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        self.called.append("job_status")
        return StatusResult(endpoint, ok=True)

    def cancel(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> CancelResult | None:
        self.called.append("cancel")
        return CancelResult(endpoint, ok=True, cancelled=tuple(job_ids))


class MatchingToy(Toy):
    name = "matching"
    credentials = ("x509",)

    def list_match(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> ListMatchResult | None:
        self.called.append("list_match")
        return ListMatchResult(endpoint, ok=True, resources=("ce1",))


class RawQueue(Plugin):
    """A third-party backend of raw hooks, on the plain Plugin base: its own "is this mine?"."""

    name = "raw"
    config_schema: ClassVar[dict[str, Any]] = SCHEMA

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        if backend != self.name:
            return None
        return BackendInfo(self.name, tuple(Endpoint(self.name, q) for q in self.config["queues"]))

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend != self.name:
            return None
        from gridgate.core.runner import run

        outcome = run(self.config["command"], timeout, max_output=self.context.max_output_bytes)
        ids = tuple(outcome.stdout.split())
        return SubmitResult(endpoint, ok=outcome.ok and bool(ids), job_ids=ids, command=outcome)


def toy(tmp_path: Any, cls: type = Toy, **section: Any) -> Any:
    program = stand_in_command(tmp_path / "bin", f"{cls.__name__}-submit", stdout="id{call}\n")
    section.setdefault("command", [str(program)])
    return build_plugin(cls, section, state_dir=tmp_path / "state", **section.pop("_build", {}))


# --- is this mine? --------------------------------------------------------------------------


def test_hooks_for_another_backend_answer_none_and_call_nothing(tmp_path: Any) -> None:
    backend = toy(tmp_path)
    other = Endpoint("other", "q1")
    request = SubmitRequest("other")
    with plugin_manager_with(backend) as pm:
        assert pm.hook.gridgate_backend_info(backend="other") is None
        assert pm.hook.gridgate_submit(endpoint=other, request=request, timeout=5) is None
        assert pm.hook.gridgate_job_status(endpoint=other, job_ids=["1"], timeout=5) is None
        assert pm.hook.gridgate_cancel(endpoint=other, job_ids=["1"], timeout=5) is None
        failed = SubmitResult(other, ok=False)
        assert pm.hook.gridgate_classify_failure(endpoint=other, result=failed) is None
        assert pm.hook.gridgate_list_match(endpoint=other, request=request, timeout=5) is None
    assert backend.called == []


def test_hooks_for_its_own_endpoints_call_its_methods(tmp_path: Any) -> None:
    backend = toy(tmp_path)
    mine = Endpoint("toy", "q1")
    with plugin_manager_with(backend) as pm:
        result = pm.hook.gridgate_submit(endpoint=mine, request=SubmitRequest("toy"), timeout=30)
        assert result.ok and result.job_ids == ("id1",)
        assert pm.hook.gridgate_classify_failure(endpoint=mine, result=result) is None
        assert pm.hook.gridgate_job_status(endpoint=mine, job_ids=["id1"], timeout=5).ok
        assert pm.hook.gridgate_cancel(endpoint=mine, job_ids=["id1"], timeout=5).cancelled == (
            "id1",
        )
    assert backend.called == ["submit", "classify_failure", "job_status", "cancel"]


def test_a_backend_that_writes_no_submit_says_so() -> None:
    class Empty(Backend):
        name = "empty"

    backend = build_plugin(Empty, {})
    with pytest.raises(NotImplementedError, match="Empty does not say how to submit"):
        backend.gridgate_submit(
            endpoint=Endpoint("empty", "q"), request=SubmitRequest("empty"), timeout=1
        )


# --- BackendInfo from the section -----------------------------------------------------------


def test_backend_info_is_built_from_the_section(tmp_path: Any) -> None:
    backend = toy(tmp_path, queues=["a", "b"], pilots_per_job=7, command_timeout=12.5)
    info = backend.gridgate_backend_info(backend="toy")
    assert info == BackendInfo(
        backend="toy",
        endpoints=(Endpoint("toy", "a"), Endpoint("toy", "b")),
        pilots_per_submission=7,
        command_timeout=12.5,
        list_match=False,  # Toy writes no list_match: the section's default does not count
        credentials=(),
    )


def test_only_a_backend_that_writes_list_match_list_matches(tmp_path: Any) -> None:
    matching = toy(tmp_path, MatchingToy)
    info = matching.gridgate_backend_info(backend="matching")
    assert info.list_match is True and info.credentials == ("x509",)
    assert toy(tmp_path, MatchingToy, list_match=False).backend_info().list_match is False
    assert list_matches(MatchingToy) and list_matches(matching)
    # the base class implements gridgate_list_match for every subclass: that is not enough
    assert callable(Toy.gridgate_list_match) and not list_matches(Toy)
    assert not list_matches(RawQueue)
    doc = {"demand": {"static": {"toy": [{"pilots": 1, "list_match": True}]}}}
    problems = list_match_problems(doc, {("backends", "toy"): Toy})
    assert [path for path, _ in problems] == [("demand", "static", "toy", 0, "list_match")]
    assert list_match_problems(doc, {("backends", "toy"): MatchingToy}) == []


# --- the deadline and the output cap ------------------------------------------------------


def test_command_timeout_replaces_the_directors_and_kills_the_command(tmp_path: Any) -> None:
    program = stand_in_command(tmp_path / "bin", "hang", stdout="started\n", sleep=600)
    backend = toy(tmp_path, command=[str(program)], command_timeout=0.5)
    result = backend.gridgate_submit(
        endpoint=Endpoint("toy", "q1"), request=SubmitRequest("toy"), timeout=3600
    )
    assert not result.ok and result.command.timed_out
    assert result.command.stdout == "started\n"


def test_a_passed_deadline_kills_the_next_command_of_the_call_at_once(tmp_path: Any) -> None:
    backend = toy(tmp_path)
    spent = Deadline(time.monotonic() - 1)  # what an earlier command of the call used up
    assert spent.passed() and spent.left() == 0.001
    program = stand_in_command(tmp_path / "bin", "slow", sleep=600)
    outcome = backend.run([str(program)], spent)
    assert outcome.timed_out
    assert not backend.deadline(3600).passed()


def test_every_command_is_capped_at_the_sites_max_output_bytes(tmp_path: Any) -> None:
    backend = toy(tmp_path, _build={"config": {"director": {"max_output_bytes": 1024}}})
    argv = [sys.executable, "-c", "print('x' * 100_000)"]
    outcome = backend.run(argv, backend.deadline(30))
    assert outcome.stdout_truncated and len(outcome.stdout.encode()) <= 1024


def test_the_schema_fragments_are_what_the_base_class_reads(tmp_path: Any) -> None:
    class Plain(Toy):
        config_schema: ClassVar[dict[str, Any]] = {
            **SCHEMA,
            "properties": {
                **SCHEMA["properties"],
                "command_timeout": command_timeout_schema(),
                "env": env_schema(),
            },
        }

    backend = toy(tmp_path, Plain)
    assert backend.config["command_timeout"] is None and backend.config["env"] == {}
    with pytest.raises(ConfigError) as caught:
        section_for(Plain, {"command": ["x"], "command_timeout": 0})
    assert [p.path for p in caught.value.problems] == [("command_timeout",)]
    with pytest.raises(ConfigError):
        section_for(Plain, {"command": ["x"], "env": {"A": 1}})


def test_the_sections_env_reaches_the_command(tmp_path: Any) -> None:
    backend = toy(tmp_path, env={"GRIDGATE_TOY": "seen"})
    argv = [
        sys.executable,
        "-c",
        "import os; print(os.environ['GRIDGATE_TOY'], os.environ['PATH'])",
    ]
    outcome = backend.run(argv, backend.deadline(30))
    assert outcome.ok and outcome.stdout.split()[0] == "seen"
    assert outcome.stdout.split()[1], "the director's own environment is kept under it"
    assert toy(tmp_path).environment() is None, "nothing to add: the director's, unchanged"


# --- beside a backend of raw hooks, in a real iteration -------------------------------------


def test_the_director_runs_a_raw_hook_backend_beside_a_base_class_one(tmp_path: Any) -> None:
    raw_submit = stand_in_command(tmp_path / "bin", "raw-submit", stdout="raw{call}\n")
    toy_submit = stand_in_command(tmp_path / "bin", "toy-submit", stdout="toy{call}\n")
    raw = build_plugin(RawQueue, {"command": [str(raw_submit)]})
    base = build_plugin(Toy, {"command": [str(toy_submit)], "queues": ["t1", "t2"]})
    collector = Collector()
    doc = {
        "director": {"state_dir": str(tmp_path / "state")},
        "demand": {"static": {"raw": 2, "toy": 3}},
    }
    with contextlib.closing(director_for(doc, raw, base, collector)) as director:
        summary = director.run_iteration()
    outcomes = sorted((r.backend, r.outcome) for r in summary.records)
    assert outcomes == [("raw", "submitted")] * 2 + [("toy", "submitted")] * 3
    assert {r.endpoint for r in summary.records if r.backend == "toy"} <= {"t1", "t2"}
    assert len(raw_submit.calls()) == 2 and len(toy_submit.calls()) == 3
    assert base.called.count("submit") == 3
    assert collector.notes == []


def test_an_outage_found_by_one_endpoint_stops_the_others_until_cleared() -> None:
    from gridgate.core.backend import NOT_TRIED, Outages, not_tried
    from gridgate.core.model import CommandResult, Endpoint, Failure

    outages = Outages()
    debug, batch = Endpoint("slurm", "debug"), Endpoint("slurm", "batch")
    first = CommandResult(("sbatch",), 1, stderr="Unable to contact slurm controller")
    later = CommandResult(("sbatch",), 1, stderr="another")
    assert outages.found() is None
    outages.note(debug, first)
    outages.note(batch, later)  # the first finder and its evidence are kept
    assert outages.found() == ("debug", first)
    assert outages.found("other-cluster") is None
    outages.clear()
    assert outages.found() is None

    # a result not tried is excluded whatever its kind does alone, and keeps its other flags
    alone = Failure("timeout", exclude=False, notify=True, transient=True, reason="timed out")
    message = f"{NOT_TRIED}partition debug of the same cluster could not contact the controller"
    excluded = not_tried(alone, message)
    assert excluded.exclude and excluded.kind == "timeout" and excluded.transient
    assert excluded.reason == f"timed out ({message})"
