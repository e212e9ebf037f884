"""The ARC client's texts, as the real client printed them (shared/reference/arc.md), read by
the backend's parsers and classifier. The same cases are provoked on the real CE in
test_arc_backend.py; these pin each text so that a parser change shows which one broke."""

from __future__ import annotations

import os

import pytest

from gridgate.core.model import CommandResult
from gridgate.plugins.arc.classify import classify, proxy_problem
from gridgate.plugins.arc.documents import arcstat_report as parse_arcstat
from gridgate.plugins.arc.documents import cleaned_counts, killed_counts, submitted_ids
from gridgate.plugins.arc.parse import pilot_state, xrsl

REST = "https://localhost:18443/arex/rest/1.0/jobs/"
A = REST + "jBmLDmxiisAoOSAtDmABFKDmABFKDmABFKDmVoIKDmEBFKDmNmN60n"
B = REST + "zkiMDmziisAoOSAtDmABFKDmABFKDmABFKDmVoIKDmFBFKDmIF7QZm"
C = REST + "AMONDmliisAoOSAtDmABFKDmABFKDmABFKDmVoIKDmCBFKDmreQN1m"


def _cmd(
    stdout: str = "", stderr: str = "", rc: int | None = 1, timed_out: bool = False
) -> CommandResult:
    return CommandResult(
        argv=("arcsub",), returncode=rc, stdout=stdout, stderr=stderr, timed_out=timed_out
    )


def test_submitted_ids_in_input_order_from_a_bulk_call() -> None:
    out = (
        f"Job submitted with jobid: {A}\nJob submitted with jobid: {B}\n\n"
        "Job submission summary:\n-----------------------\n2 of 2 jobs were submitted\n"
    )
    assert submitted_ids(out) == [A, B]


def test_arcstat_blocks_in_any_order_with_exit_codes_and_errors() -> None:
    out = (
        f"Job: {C}\n Name: gg-ok\n State: Finished\n Exit Code: 0\n\n"
        f"Job: {A}\n Name: gg-fail\n State: Failed\n Exit Code: 1\n"
        " Job Error: LRMS error: (1) Job finished with wrong exit code - 1 != 0\n\n"
        f"Job: {B}\n Name: gg-long\n State: Running\n\n"
        "Status of 3 jobs was queried, 3 jobs returned information\n"
    )
    report = parse_arcstat(out)
    assert report.queried == 3 and report.returned == 3
    assert {k: v.state for k, v in report.statuses.items()} == {
        C: "done",
        A: "failed",
        B: "running",
    }
    assert report.statuses[A].exit_code == 1
    assert report.statuses[A].reason.startswith("LRMS error: (1)")


def test_arcstat_404_is_gone_and_a_ce_that_did_not_answer_is_failed() -> None:
    gone = parse_arcstat(
        "Status of 2 jobs was queried, 0 jobs returned information\n",
        f"WARNING: Failed to process job: {A} - 404 Job not found\n",
    )
    assert gone.gone == (A,) and not gone.failed and gone.returned == 0
    down = parse_arcstat(
        "Status of 2 jobs was queried, 0 jobs returned information\n",
        "ERROR: Failed to establish connection: TCP: GENERIC_ERROR (Failed to connect to "
        "localhost(IPv4):18443)\nWARNING: Failed to process jobs - wrong response: 1768759344\n"
        f"WARNING: Failed to process job: {A}\nWARNING: Failed to process job: {B}\n",
    )
    assert set(down.failed) == {A, B} and not down.gone and not down.statuses


def test_ids_not_in_the_job_list_are_gone() -> None:
    report = parse_arcstat(f"Warning: Job not found in job list: {A}\nNo jobs found, try later\n")
    assert report.gone == (A,)


@pytest.mark.parametrize(
    ("native", "code", "state"),
    [
        ("Accepted", None, "waiting"),
        ("Preparing", None, "waiting"),
        ("Submitting", None, "waiting"),
        ("Queuing", None, "waiting"),
        ("Running", None, "running"),
        ("Finishing", None, "running"),
        ("Finished", 0, "done"),
        ("Finished", 3, "failed"),
        ("Failed", 1, "failed"),
        ("Killed", None, "cancelled"),
        ("Deleted", None, "unknown"),
        ("Undefined", None, "unknown"),
        ("Hold", None, "waiting"),
        ("Something new", None, "unknown"),
    ],
)
def test_pilot_state_of_every_arc_state(native: str, code: int | None, state: str) -> None:
    assert pilot_state(native, code) == state


def test_kill_and_clean_summaries() -> None:
    assert killed_counts(
        "Jobs processed: 1, successfully killed: 1, successfully cleaned: 0\n"
    ) == (1, 1)
    assert killed_counts("No jobs\n") is None
    assert cleaned_counts("Jobs processed: 1, deleted: 1\n") == (1, 1)


def test_xrsl_quotes_values_and_refuses_bad_names() -> None:
    text = xrsl(
        [
            ("executable", "pilot.sh"),
            ("inputfiles", [["pilot.sh", "/opt/p/pilot.sh"]]),
            ("arguments", ["-c", 'say "hi"']),
            ("count", 8),
        ]
    )
    assert '(executable="pilot.sh")' in text
    assert '(inputfiles=("pilot.sh" "/opt/p/pilot.sh"))' in text
    assert '(arguments="-c" "say ""hi""")' in text
    assert '(count="8")' in text
    with pytest.raises(ValueError):
        xrsl([("bad name)(executable", "x")])


@pytest.mark.parametrize(
    ("stdout", "stderr", "kind", "local"),
    [
        (
            "",
            "ERROR: Failed to establish connection: TCP: GENERIC_ERROR (Failed to connect to "
            "localhost(IPv4):18499)\nERROR: Job submission aborted because no resource returned any "
            "information\n",
            "unreachable",
            False,
        ),
        ("", "Proxy expired. Job submission aborted. Please run 'arcproxy'!\n", "credential", True),
        (
            "",
            "Cannot find any proxy. This application currently cannot run without a proxy.\n",
            "credential",
            True,
        ),
        (
            "",
            "ERROR: Failed to establish connection: TLS: GENERIC_ERROR (self-signed certificate in "
            "certificate chain)\nERROR: Job submission aborted because no resource returned any "
            "information\n",
            "config",
            False,
        ),
        (
            "",
            'ERROR: Failed to establish connection: TLS: GENERIC_ERROR (SSL error, "wrong version '
            'number", at "SSL routines" library, with "unknown" alert)\n',
            "config",
            False,
        ),
        (
            "",
            "VERBOSE: Unexpected response code from delegation endpoint - 403\nERROR: One or "
            "multiple job descriptions was not submitted.\n",
            "auth",
            False,
        ),
        (
            "",
            "VERBOSE: Failed to communicate to delegation endpoint.\nINFO: Unable to submit jobs. "
            "Failed to delegate credentials.\n",
            "auth",
            False,
        ),
        (
            "",
            "VERBOSE: ComputingShare (fork) does not match selected queue (nosuchqueue)\nERROR: One or "
            "multiple job descriptions was not submitted.\n",
            "config",
            False,
        ),
        (
            "",
            'ERROR: Invalid JobDescription:\n&(executable="/bin/sh"(arguments="-c" "oops")\n\nNo '
            "job description parser was able to interpret job description\n",
            "config",
            True,
        ),
        (
            "",
            "ERROR: Cannot find local input file 'WORK/does-not-exist.sh' (run.sh)\n",
            "config",
            True,
        ),
        (
            "",
            "ERROR: Job submission aborted because no resource returned any information\n",
            "error",
            False,
        ),
    ],
)
def test_classify_the_real_failure_texts(stdout: str, stderr: str, kind: str, local: bool) -> None:
    failure = classify(_cmd(stdout, stderr))
    assert (failure.kind, failure.local) == (kind, local), failure.reason
    assert failure.reason


def test_classify_a_killed_arcsub_is_a_timeout() -> None:
    assert classify(_cmd(rc=None, timed_out=True)).kind == "timeout"


# --- the proxy the client would use (issue 31, items 1 and 4) ---------------------------------


def test_the_default_proxy_path_is_taken_only_as_a_private_regular_file_of_this_user(
    tmp_path,
) -> None:
    """/tmp/x509up_u<uid> is a name any user can create first: a FIFO there must not hang the
    poll that looks at it, and a file of another user or open to others is not this user's
    proxy; each is ``credential`` in the client's words."""
    proxy = tmp_path / "x509up"
    env = {"X509_USER_PROXY": str(proxy)}
    assert proxy_problem(env, 0) == f"Cannot find any proxy: {proxy} does not exist"
    os.mkfifo(proxy)
    problem = proxy_problem(env, 0)
    assert problem == f"Cannot find any proxy: {proxy} is a FIFO, not a regular file"
    proxy.unlink()
    proxy.write_text("not a proxy")
    proxy.chmod(0o644)
    assert "has mode 0644" in proxy_problem(env, 0)
    proxy.chmod(0o600)
    os.chown(proxy, 65534, -1)
    assert "is owned by uid 65534" in proxy_problem(env, 0)
    # as the poll hands it on: arcstat's useless answer, the proxy's problem as the message
    said = _cmd(stdout="", stderr="ERROR: wrong response: <garbage>")
    assert classify(said, proxy_problem(env, 0)).kind == "credential"
