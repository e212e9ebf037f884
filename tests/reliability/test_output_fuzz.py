"""Bad input row: generated command output fed through the wms_glite and lsf backends' own
result handling (parsers, then classifiers): no exception escapes, every outcome is either a
success whose ids really are in the output, or a failure with a known kind and a one-line reason.

The backends are real plugin instances; only the process they would run is replaced by the
generated CommandResult (the runner itself is covered by tests/core/test_runner.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gridgate.core.kinds import KINDS
from gridgate.core.model import CommandResult, Endpoint, Failure, SubmitRequest, SubmitResult
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import build_plugin
from gridgate.plugins.lsf_proxy.director.backend import LsfBackend, parse_bjobs
from gridgate.plugins.wms_glite.backend import OPERATION_LIST_MATCH, GliteBackend
from gridgate.plugins.wms_glite.parse import banner

EXAMPLES = 1000

# every built-in classification is a catalogued kind (site_rule: the tests' own site rule)
GLITE_KINDS = set(KINDS) | {"site_rule"}
LSF_KINDS = set(KINDS)

FRAGMENTS = [
    banner("glite-wms-job-submit", "Success"),
    banner("glite-wms-job-list-match", "Success"),
    "Connecting to the service https://wms01.example.org:7443/glite_wms_wmproxy_server",
    "Your job identifier is:\n\nhttps://lb01.example.org:9000/AbCdEf0123456789",
    "https://lb01.example.org:9000/",
    "https://wms01.example.org:7443/glite_wms_wmproxy_server",
    '{"result": "success", "jobid": "https://lb01.example.org:9000/xyz"}',
    '{"result": ',
    '{"jobid": ["https://lb01.example.org:9000/a", 7, null]}',
    "###Submitted Job Ids###",
    "- ce01.example.org:8443/cream-pbs-lhcb",
    "- ce02.example.org:2119/jobmanager-lcgpbs-long",
    "No Computing Element matching your job requirements has been found!",
    "Error - Operation failed\nSystem load is too high:",
    "Unavailable service (the server is temporarily drained)",
    "Warning - WMProxy unreachable",
    "Proxy File Not Found",
    "unrecognized option '--noint'",
    "Job <12345> is submitted to queue <short>.",
    "Job <> is submitted to queue <>.",
    "12345^RUN^node01",
    "12^PEND^-",
    "99^NOSTATE^x",
    "Job <77> is not found",
    "No such queue",
    "LIM is down; try later",
    "Request from non-LSF host rejected",
    "Bad resource requirement syntax",
    "\x00\x1b[31m",
    "\ufffd\ufffd",
    "a" * 5000,
    "\n" * 50,
    "$(touch /tmp/pwned); `id`",
    "Error - \n\n",
    "Job <",
    "^",
    "{",
    "]",
]

text = st.lists(
    st.one_of(
        st.sampled_from(FRAGMENTS),
        st.text(max_size=200),
        st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")),
    ),
    max_size=8,
).map("\n".join)


@st.composite
def command_results(draw: st.DrawFn) -> CommandResult:
    launch = draw(
        st.one_of(
            st.none(), st.sampled_from(["No such file or directory: x", "Permission denied", ""])
        )
    )
    timed_out = draw(st.booleans()) if launch is None else False
    code = (
        None
        if (launch is not None or timed_out)
        else draw(st.one_of(st.sampled_from([0, 0, 0, 1, 255, -9]), st.integers(-64, 255)))
    )
    return CommandResult(
        argv=("cmd", "--noint"),
        returncode=code,
        stdout=draw(text),
        stderr=draw(text),
        timed_out=timed_out,
        launch_error=launch,
        duration=draw(st.floats(0, 200)),
        stdout_truncated=draw(st.booleans()),
    )


def _check_failure(failure: object, kinds: set[str]) -> None:
    assert isinstance(failure, Failure)
    assert failure.kind in kinds, failure
    assert "\n" not in failure.reason and failure.reason.strip(), failure


@pytest.fixture(scope="module")
def glite(tmp_path_factory: pytest.TempPathFactory) -> GliteBackend:
    folder: Path = tmp_path_factory.mktemp("glite")
    return build_plugin(
        GliteBackend,
        {
            "servers": ["wms01.example.org"],
            "list_match_cache": 900,
            "rules": [{"kind": "site_rule", "pattern": "site says no"}],
        },
        state=MemoryState(),
        state_dir=folder,
        name="wms_glite",
    )


@pytest.fixture(scope="module")
def lsf(tmp_path_factory: pytest.TempPathFactory) -> LsfBackend:
    folder: Path = tmp_path_factory.mktemp("lsf")
    return build_plugin(
        LsfBackend, {"queues": ["short"]}, state=MemoryState(), state_dir=folder, name="lsf"
    )


@pytest.mark.timeout(120)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(outcome=command_results(), requirements=st.sampled_from(["", "other.X == 1"]))
def test_glite_submit_and_list_match_outputs_are_always_classified(
    glite: GliteBackend, outcome: CommandResult, requirements: str
) -> None:
    glite._run_with_jdl = lambda operation, endpoint, request, timeout: outcome  # type: ignore[method-assign]
    endpoint = glite.endpoints()[0]
    request = SubmitRequest(backend="wms_glite", requirements=requirements)

    result = glite.gridgate_submit(endpoint=endpoint, request=request, timeout=10)
    assert isinstance(result, SubmitResult)
    if result.ok:
        assert outcome.ok and result.job_ids
        assert all(":9000/" in j and j in outcome.stdout for j in result.job_ids)
    else:
        _check_failure(
            glite.gridgate_classify_failure(endpoint=endpoint, result=result), GLITE_KINDS
        )

    glite._cache_set = lambda key, value: None  # type: ignore[method-assign] # every example parses
    match = glite.gridgate_list_match(endpoint=endpoint, request=request, timeout=10)
    assert match is not None
    if match.ok:
        assert all(ce in outcome.stdout for ce in match.resources)
    else:
        failed = SubmitResult(
            endpoint, ok=False, command=match.command, operation=OPERATION_LIST_MATCH
        )
        _check_failure(
            glite.gridgate_classify_failure(endpoint=endpoint, result=failed), GLITE_KINDS
        )


@pytest.mark.timeout(120)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(outcome=command_results())
def test_lsf_bsub_and_bjobs_outputs_are_always_classified(
    lsf: LsfBackend, outcome: CommandResult
) -> None:
    lsf.run_with_token = lambda argv, category, deadline: outcome  # type: ignore[method-assign]
    endpoint = Endpoint("lsf", "short")
    result = lsf.gridgate_submit(
        endpoint=endpoint, request=SubmitRequest(backend="lsf"), timeout=10
    )
    assert isinstance(result, SubmitResult)
    if result.ok:
        assert outcome.ok and len(result.job_ids) == 1 and result.job_ids[0].isdigit()
        assert f"Job <{result.job_ids[0]}>" in outcome.stdout + outcome.stderr
    else:
        _check_failure(lsf.gridgate_classify_failure(endpoint=endpoint, result=result), LSF_KINDS)

    states = lsf.query(["12345", "77"], timeout=10)
    assert states.ok in (True, False)
    assert all(k.isdigit() for k in states.states)
    parsed, missing = parse_bjobs(outcome.stdout, outcome.stderr)
    assert set(parsed) == set(states.states) and tuple(missing) == tuple(states.missing)
