"""The backend contract suite catches what it promises to catch: run against backends that
break one rule each, the matching check fails (and only checks, not the suite, decide)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

pytest_plugins = ["pytester"]

BACKEND = """
import re
from gridgate.core import hookimpl
from gridgate.core.model import (
    BackendInfo, CancelResult, Endpoint, Failure, JobStatus, StatusResult, SubmitResult,
)
from gridgate.core.plugins import Plugin
from gridgate.core.runner import run
from gridgate.core.testing import Answer, BackendContract

STATES = ("waiting", "running", "done", "failed")


def parse_status(job_ids, stdout):
    found = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in job_ids and parts[1] in STATES:
            found[parts[0]] = JobStatus(parts[0], parts[1])
    return found


def status_result(endpoint, job_ids, result):
    if not result.ok or result.stdout_truncated:
        return StatusResult(endpoint, ok=False, command=result)
    return StatusResult(endpoint, ok=True, statuses=parse_status(job_ids, result.stdout),
                        command=result)


def cancel_result(endpoint, job_ids, result):
    lines = result.stdout.splitlines()
    done = tuple(j for j in job_ids if f"cancelled {j}" in lines)
    answered = not result.timed_out and result.launch_error is None
    return CancelResult(endpoint, ok=answered, cancelled=done if answered else (),
                        command=result)


class Good(Plugin):
    config_schema = {"type": "object", "additionalProperties": False, "required": ["program"],
                     "properties": {"program": {"type": "string"}}}
    name = "good"

    @hookimpl
    def gridgate_backend_info(self, backend):
        if backend != self.name:
            return None
        return BackendInfo(self.name, (Endpoint(self.name, "e1"),))

    @hookimpl
    def gridgate_submit(self, endpoint, request, timeout):
        if endpoint.backend != self.name:
            return None
        result = run([self.config["program"]], timeout, max_output=self.context.max_output_bytes)
        ids = tuple(re.findall(r"ID (\\S+)", result.stdout))
        ok = result.ok and bool(ids)
        return SubmitResult(endpoint, ok=ok, job_ids=ids if ok else (), command=result)

    @hookimpl
    def gridgate_job_status(self, endpoint, job_ids, timeout):
        if endpoint.backend != self.name:
            return None
        if not job_ids:
            return StatusResult(endpoint, ok=True, commands=0)
        argv = [self.config["program"], "status", *job_ids]
        result = run(argv, timeout, max_output=self.context.max_output_bytes)
        return status_result(endpoint, job_ids, result)

    @hookimpl
    def gridgate_cancel(self, endpoint, job_ids, timeout):
        if endpoint.backend != self.name:
            return None
        if not job_ids:
            return CancelResult(endpoint, ok=True)
        argv = [self.config["program"], "cancel", *job_ids]
        result = run(argv, timeout, max_output=self.context.max_output_bytes)
        return cancel_result(endpoint, job_ids, result)
{extra}

class TestContract(BackendContract):
    backend_class = {cls}
    name = "good"
    submitted_output = "ID job-{call}\\n"
    deadline = 1.0
    deadline_grace = 4.0

    def section(self, program, tmp_path):
        return {"program": program}

    def status_answer(self, known, unknown):
        return Answer(stdout="".join(f"{i} {s}\\n" for i, s in known.items()), when=("status",))

    def cancel_answer(self, cancelled, finished, unknown):
        return Answer(
            stdout="".join(f"cancelled {i}\\n" for i in cancelled)
            + "".join(f"finished {i}\\n" for i in finished),
            stderr="".join(f"no such job {i}\\n" for i in unknown),
            exit_code=1 if unknown else 0,
            when=("cancel",),
        )
"""

BROKEN = {
    "Greedy": """
class Greedy(Good):
    @hookimpl
    def gridgate_submit(self, endpoint, request, timeout):  # answers for every backend
        return SubmitResult(endpoint, ok=False, message="mine")
""",
    "Uncapped": """
class Uncapped(Good):
    @hookimpl
    def gridgate_submit(self, endpoint, request, timeout):
        if endpoint.backend != self.name:
            return None
        result = run([self.config["program"]], timeout)  # the site's cap not passed
        return SubmitResult(endpoint, ok=False, command=result)
""",
    "Unmarked": """
class Unmarked(Good):
    def gridgate_submit(self, endpoint, request, timeout):  # no @hookimpl: pluggy ignores it
        return Good.gridgate_submit(self, endpoint, request, timeout)
""",
    "Inventive": """
class Inventive(Good):
    @hookimpl
    def gridgate_classify_failure(self, endpoint, result):
        return Failure("mystery") if endpoint.backend == self.name else None
""",
    "StatusWithoutDeadline": """
class StatusWithoutDeadline(Good):
    @hookimpl
    def gridgate_job_status(self, endpoint, job_ids, timeout):
        if endpoint.backend != self.name or not job_ids:
            return Good.gridgate_job_status(self, endpoint, job_ids, timeout)
        result = run([self.config["program"], "status", *job_ids], 86400,
                     max_output=self.context.max_output_bytes)  # a day, not the deadline
        return status_result(endpoint, job_ids, result)
""",
    "StatusWithoutCap": """
class StatusWithoutCap(Good):
    @hookimpl
    def gridgate_job_status(self, endpoint, job_ids, timeout):
        if endpoint.backend != self.name or not job_ids:
            return Good.gridgate_job_status(self, endpoint, job_ids, timeout)
        result = run([self.config["program"], "status", *job_ids], timeout)  # no cap
        return status_result(endpoint, job_ids, result)
""",
    "CancelWithoutDeadline": """
class CancelWithoutDeadline(Good):
    @hookimpl
    def gridgate_cancel(self, endpoint, job_ids, timeout):
        if endpoint.backend != self.name or not job_ids:
            return Good.gridgate_cancel(self, endpoint, job_ids, timeout)
        result = run([self.config["program"], "cancel", *job_ids], 86400,
                     max_output=self.context.max_output_bytes)  # a day, not the deadline
        return cancel_result(endpoint, job_ids, result)
""",
    "CancelWithoutCap": """
class CancelWithoutCap(Good):
    @hookimpl
    def gridgate_cancel(self, endpoint, job_ids, timeout):
        if endpoint.backend != self.name or not job_ids:
            return Good.gridgate_cancel(self, endpoint, job_ids, timeout)
        result = run([self.config["program"], "cancel", *job_ids], timeout)  # no cap
        return cancel_result(endpoint, job_ids, result)
""",
    "GoneMeansDone": """
class GoneMeansDone(Good):
    @hookimpl
    def gridgate_job_status(self, endpoint, job_ids, timeout):
        answer = Good.gridgate_job_status(self, endpoint, job_ids, timeout)
        if answer is None or not answer.ok:
            return answer
        # an id the output does not mention is taken for finished: a partial answer kills it
        states = {j: answer.statuses.get(j) or JobStatus(j, "done") for j in job_ids}
        return StatusResult(endpoint, ok=True, statuses=states, command=answer.command)
""",
    "NotFoundIsAFailure": """
class NotFoundIsAFailure(Good):
    @hookimpl
    def gridgate_job_status(self, endpoint, job_ids, timeout):
        answer = Good.gridgate_job_status(self, endpoint, job_ids, timeout)
        if answer is None or not answer.ok or answer.statuses or not job_ids:
            return answer
        return StatusResult(endpoint, ok=False, command=answer.command, message="no such jobs")
""",
    "CancelClaimsAll": """
class CancelClaimsAll(Good):
    @hookimpl
    def gridgate_cancel(self, endpoint, job_ids, timeout):
        answer = Good.gridgate_cancel(self, endpoint, job_ids, timeout)
        if answer is None or not answer.ok:
            return answer
        # every id given counts as cancelled, finished and unknown ones too
        return CancelResult(endpoint, ok=True, cancelled=tuple(job_ids), command=answer.command)
""",
    "RunsForNoIds": """
class RunsForNoIds(Good):
    @hookimpl
    def gridgate_job_status(self, endpoint, job_ids, timeout):
        if endpoint.backend != self.name:
            return None
        argv = [self.config["program"], "status", *job_ids]  # no ids: lists everything
        result = run(argv, timeout, max_output=self.context.max_output_bytes)
        return status_result(endpoint, job_ids, result)
""",
}


def _module(cls: str, extra: str) -> str:
    return BACKEND.replace("{extra}", textwrap.dedent(extra)).replace("{cls}", cls)


def outcomes(pytester, cls: str, extra: str = "") -> dict[str, str]:
    pytester.makepyfile(test_backend=_module(cls, extra))
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist", "-q")
    reports = result.reprec.getreports("pytest_runtest_logreport")
    return {r.nodeid.rsplit("::", 1)[-1]: r.outcome for r in reports if r.when == "call"}


def outcomes_of(pytester, classes: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each broken backend's check outcomes, from one contract run with a module per backend.

    Most of a run is spent waiting for deadlines (three hanging commands per backend, and
    the grace a backend that does not kill one is given): the modules run side by side, in
    a worker each (xdist), instead of one after the other."""
    pytester.makepyfile(**{f"test_{cls}": _module(cls, BROKEN[cls]) for cls in classes})
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:randomly", "-n", str(len(classes)), "-q"
    )
    reports = result.reprec.getreports("pytest_runtest_logreport")
    found: dict[str, dict[str, str]] = {cls: {} for cls in classes}
    for report in reports:
        if report.when == "call":
            module = report.nodeid.split("::", 1)[0].removesuffix(".py").removeprefix("test_")
            found[module][report.nodeid.rsplit("::", 1)[-1]] = report.outcome
    for cls, checks in found.items():
        assert len(checks) == CHECKS, (cls, checks, result.outlines[-20:])
    return found


CHECKS = 19

#: The same backend on core's base class: it writes submit, job_status and cancel.
ON_THE_BASE_CLASS = """
from gridgate.core.backend import Backend


class OnBase(Backend):
    config_schema = Good.config_schema
    name = "good"

    def endpoints(self):
        return (Endpoint(self.name, "e1"),)

    def submit(self, endpoint, request, timeout):
        result = self.run([self.config["program"]], self.deadline(timeout))
        ids = tuple(re.findall(r"ID (\\S+)", result.stdout))
        ok = result.ok and bool(ids)
        return SubmitResult(endpoint, ok=ok, job_ids=ids if ok else (), command=result)

    def job_status(self, endpoint, job_ids, timeout):
        if not job_ids:
            return StatusResult(endpoint, ok=True, commands=0)
        argv = [self.config["program"], "status", *job_ids]
        return status_result(endpoint, job_ids, self.run(argv, self.deadline(timeout)))

    def cancel(self, endpoint, job_ids, timeout):
        if not job_ids:
            return CancelResult(endpoint, ok=True)
        argv = [self.config["program"], "cancel", *job_ids]
        return cancel_result(endpoint, job_ids, self.run(argv, self.deadline(timeout)))
"""

#: A backend on the base class that neither tracks nor cancels: the tracking checks hold it
#: to answering None and running nothing.
SUBMIT_ONLY = """
from gridgate.core.backend import Backend


class SubmitOnly(Backend):
    config_schema = Good.config_schema
    name = "good"

    def endpoints(self):
        return (Endpoint(self.name, "e1"),)

    def submit(self, endpoint, request, timeout):
        return Good.gridgate_submit(self, endpoint, request, timeout)
"""


def test_a_backend_that_keeps_the_contract_passes_every_check(pytester) -> None:
    found = outcomes(pytester, "Good")
    assert len(found) == CHECKS and set(found.values()) == {"passed"}, found


def test_a_backend_on_the_base_class_passes_every_check(pytester) -> None:
    found = outcomes(pytester, "OnBase", ON_THE_BASE_CLASS)
    assert len(found) == CHECKS and set(found.values()) == {"passed"}, found


def test_a_backend_that_does_not_track_passes_by_answering_none(pytester) -> None:
    found = outcomes(pytester, "SubmitOnly", SUBMIT_ONLY)
    assert len(found) == CHECKS and set(found.values()) == {"passed"}, found


def test_each_broken_rule_fails_its_check(pytester) -> None:
    expected = {
        "Greedy": {"test_contract_returns_none_for_what_is_not_its_own"},
        "Uncapped": {"test_contract_output_is_capped_at_the_sites_max_output_bytes"},
        "Inventive": {"test_contract_every_failure_is_classified_to_a_catalogued_kind"},
        "Unmarked": {"test_contract_every_hook_method_is_a_hook_implementation"},
    }
    every = outcomes_of(pytester, list(expected))
    for cls, checks in expected.items():
        found = every[cls]
        assert {c for c, o in found.items() if o == "failed"} >= checks, (cls, found)


def test_tracking_without_a_deadline_or_a_cap_fails_the_suite(pytester) -> None:
    """The status and cancel commands are held to the call's deadline and the site's cap: a
    backend that runs them without either fails exactly the check that says so, and the
    hanging command it left unkilled is killed by the contract (the run returns)."""
    expected = {
        "StatusWithoutDeadline": "test_contract_the_deadline_kills_a_hanging_status_command",
        "StatusWithoutCap": "test_contract_status_output_is_capped_at_the_sites_max_output_bytes",
        "CancelWithoutDeadline": "test_contract_the_deadline_kills_a_hanging_cancel_command",
        "CancelWithoutCap": "test_contract_cancel_output_is_capped_at_the_sites_max_output_bytes",
    }
    every = outcomes_of(pytester, list(expected))
    for cls, check in expected.items():
        found = every[cls]
        failed = {c for c, o in found.items() if o == "failed"}
        assert failed == {check}, (cls, found)


def test_tracking_answers_read_wrongly_fail_their_checks(pytester) -> None:
    expected = {
        # an id left out of the answer taken for finished: both "nobody knows it" and "the
        # answer did not mention it" catch that
        "GoneMeansDone": {
            "test_contract_a_partial_answer_keeps_the_pilots_it_does_not_mention",
            "test_contract_ids_nobody_knows_are_reported_unknown",
        },
        "NotFoundIsAFailure": {"test_contract_ids_nobody_knows_are_reported_unknown"},
        "CancelClaimsAll": {"test_contract_cancel_reports_only_the_jobs_it_cancelled"},
        "RunsForNoIds": {"test_contract_no_ids_run_no_command"},
    }
    every = outcomes_of(pytester, list(expected))
    for cls, checks in expected.items():
        found = every[cls]
        failed = {c for c, o in found.items() if o == "failed"}
        assert failed == checks, (cls, found)
