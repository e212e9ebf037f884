"""The corners of the backend contract core enforces: list_match of a backend without
list-match, ok without job ids, and what a classifier gets for a failed list-match."""

from __future__ import annotations

import pytest
from support.director import BACKEND, MatchingBackend, ScriptedBackend, config

from gridgate.core import hookimpl
from gridgate.core.clock import FakeClock
from gridgate.core.config import ConfigError
from gridgate.core.engine.director import Director
from gridgate.core.model import SubmitResult
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import make_config


def test_list_match_true_for_a_backend_without_list_match_is_a_config_error() -> None:
    doc = {
        "state": {"driver": "memory"},
        "backends": {"lsf": {"queues": ["normal"]}},
        "demand": {
            "static": {
                "lsf": [
                    {"group": "g", "pilots": 1, "list_match": True},
                    {"group": "h", "pilots": 1, "list_match": False},
                ]
            }
        },
    }
    with pytest.raises(ConfigError) as caught:
        make_config(doc)
    [problem] = caught.value.problems
    assert problem.path == ("demand", "static", "lsf", 0, "list_match")
    assert "backend 'lsf' has no list-match" in problem.message
    doc["demand"]["static"]["lsf"][0]["list_match"] = None  # the backend's default: fine
    make_config(doc)


def test_list_match_asked_at_run_time_of_a_backend_without_it_skips_as_config(tmp_path) -> None:
    demand = tmp_path / "demand.yaml"
    demand.write_text("lsf:\n  - {group: g, pilots: 2, list_match: true}\n", encoding="utf-8")
    doc = {
        "state": {"driver": "memory"},
        "backends": {"lsf": {"queues": ["normal"]}},
        "demand": {"file": {"path": str(demand)}},
        "director": {"state_dir": str(tmp_path)},
    }
    director = Director(make_config(doc), clock=FakeClock())
    summary = director.run_iteration()
    assert [(r.outcome, r.failure_kind, r.pilots) for r in summary.records] == [
        ("skipped", "config", 2)
    ]
    director.close()


class NoIds(ScriptedBackend):
    @hookimpl
    def gridgate_submit(self, endpoint, request, timeout):
        super().gridgate_submit(endpoint, request, timeout)
        return SubmitResult(endpoint, ok=True, job_ids=())


def test_ok_without_a_job_id_is_a_failure_not_a_submission() -> None:
    clock = FakeClock()
    director = Director(
        config(servers=1, pilots=1),
        clock=clock,
        state=MemoryState(clock=clock),
        extra_plugins=[NoIds(1)],
    )
    summary = director.run_iteration()
    assert [r.outcome for r in summary.records] == ["failed"]
    assert summary.failures[0].kind == "error"  # no command evidence at all
    director.close()


def test_a_classifier_gets_a_list_match_operation_for_a_failed_list_match() -> None:
    seen = []

    class Watch:
        @hookimpl
        def gridgate_classify_failure(self, endpoint, result):
            seen.append(result)

    clock = FakeClock()
    backend = MatchingBackend(1, broken={"s0"})
    cfg = config(servers=1, pilots=1, retries_per_pilot=0)
    director = Director(
        cfg, clock=clock, state=MemoryState(clock=clock), extra_plugins=[backend, Watch()]
    )
    director.config.data["demand"]["static"][BACKEND] = [
        {"group": "g", "pilots": 1, "list_match": True, "requirements": "", "attributes": {}}
    ]
    director.run_iteration()
    [result] = seen
    assert (result.ok, result.operation, result.job_ids) == (False, "List Match", ())
    assert result.command.argv == ("list-match", "s0")
    director.close()
