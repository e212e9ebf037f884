"""The backend contract suite catches what it promises to catch: run against backends that
break one rule each, the matching check fails (and only checks, not the suite, decide)."""

from __future__ import annotations

import textwrap

pytest_plugins = ["pytester"]

BACKEND = """
import re
from gridgate.core import hookimpl
from gridgate.core.model import BackendInfo, Endpoint, Failure, SubmitResult
from gridgate.core.plugins import Plugin
from gridgate.core.runner import run
from gridgate.core.testing import BackendContract


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
{extra}

class TestContract(BackendContract):
    backend_class = {cls}
    name = "good"
    submitted_output = "ID job-{call}\\n"

    def section(self, program, tmp_path):
        return {"program": program}
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
}


def outcomes(pytester, cls: str, extra: str = "") -> dict[str, str]:
    pytester.makepyfile(
        test_backend=BACKEND.replace("{extra}", textwrap.dedent(extra)).replace("{cls}", cls)
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist", "-q")
    reports = result.reprec.getreports("pytest_runtest_logreport")
    return {r.nodeid.rsplit("::", 1)[-1]: r.outcome for r in reports if r.when == "call"}


CHECKS = 9

#: The same backend on core's base class: it writes only submit.
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
"""


def test_a_backend_that_keeps_the_contract_passes_every_check(pytester) -> None:
    found = outcomes(pytester, "Good")
    assert len(found) == CHECKS and set(found.values()) == {"passed"}, found


def test_a_backend_on_the_base_class_passes_every_check(pytester) -> None:
    found = outcomes(pytester, "OnBase", ON_THE_BASE_CLASS)
    assert len(found) == CHECKS and set(found.values()) == {"passed"}, found


def test_each_broken_rule_fails_its_check(pytester) -> None:
    expected = {
        "Greedy": "test_contract_returns_none_for_what_is_not_its_own",
        "Uncapped": "test_contract_output_is_capped_at_the_sites_max_output_bytes",
        "Inventive": "test_contract_every_failure_is_classified_to_a_catalogued_kind",
        "Unmarked": "test_contract_every_hook_method_is_a_hook_implementation",
    }
    for cls, check in expected.items():
        found = outcomes(pytester, cls, BROKEN[cls])
        assert found[check] == "failed", (cls, found)
