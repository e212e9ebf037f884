"""Every broadcast hook the director calls is called per plugin: one that raises in a lifecycle,
demand or accounting hook neither silences the others nor ends the iteration (issue 21, the
class of item 4: the notify path was fixed first; these three went through pluggy's one loop)."""

from __future__ import annotations

from gridgate.core import hookimpl
from gridgate.core.config import validate_document
from gridgate.core.engine.director import Director
from gridgate.core.model import SubmitRequest, SubmitResult


class Broken:
    @hookimpl(tryfirst=True)
    def gridgate_iteration_started(self, iteration):
        raise RuntimeError("started")

    @hookimpl(tryfirst=True)
    def gridgate_demand(self, iteration, demand):
        raise RuntimeError("demand")

    @hookimpl(tryfirst=True)
    def gridgate_submission_finished(self, record):
        raise RuntimeError("accounting")

    @hookimpl(tryfirst=True)
    def gridgate_iteration_finished(self, summary):
        raise RuntimeError("finished")


class Backend:
    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def gridgate_backend_info(self, backend):
        from gridgate.core.model import BackendInfo, Endpoint

        return (
            BackendInfo(backend="t", endpoints=(Endpoint("t", "e1"),)) if backend == "t" else None
        )

    @hookimpl
    def gridgate_submit(self, endpoint, request, timeout):
        return SubmitResult(endpoint, ok=True, job_ids=("1",))

    @hookimpl
    def gridgate_iteration_started(self, iteration):
        self.seen.append("started")

    @hookimpl
    def gridgate_demand(self, iteration, demand):
        demand.add(SubmitRequest(backend="t"), times=2)

    @hookimpl
    def gridgate_submission_finished(self, record):
        self.seen.append("accounted")

    @hookimpl
    def gridgate_iteration_finished(self, summary):
        self.seen.append("finished")


def test_a_raising_lifecycle_demand_or_accounting_plugin_stops_neither_the_others_nor_the_iteration(
    tmp_path,
) -> None:
    backend = Backend()
    doc = {
        "director": {"state_dir": str(tmp_path / "s"), "pilots": {"track": False}},
        "state": {"driver": "memory"},
    }
    director = Director(validate_document(doc), extra_plugins=[backend, Broken()])
    try:
        summary = director.run_iteration()
    finally:
        director.close()
    assert sum(r.pilots for r in summary.records if r.outcome == "submitted") == 2
    assert backend.seen == ["started", "accounted", "accounted", "finished"]
    assert sum(director.notify_failures.values()) == 5
