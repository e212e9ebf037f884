"""Parsers of glite-wms-job-status / glite-wms-job-cancel output: real captures of formats.md
(grid-control's test.GliteWMS.status1/status2/cancel1, 2010), both spellings, parametric
nodes, unknown ids, and the exit codes 0 / 255 / 1."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gridgate.core.model import CommandResult, Endpoint
from gridgate.plugins.wms_glite.status import (
    cancel_result,
    normalise,
    parse_cancel,
    parse_status,
    status_result,
)

EP = Endpoint(
    "wms_glite", "wms01.example.org", "https://wms01.example.org:7443/glite_wms_wmproxy_server"
)
HEADER = "======================= glite-wms-job-status Success ====================="
RULE = "=" * 74

# grid-control testsuite/backend/test.GliteWMS.status1 (real output, 2010)
STATUS1 = (
    "\n\n" + HEADER + "\nBOOKKEEPING INFORMATION:\n\n"
    "Status info for the Job : https://lb-3-fzk.gridka.de:9000/GgeNd6MD5REG2KsbN5dmEg\n"
    "Current Status:     Scheduled \n"
    "Status Reason:      Job successfully submitted to Globus\n"
    "Destination:        ce-2-fzk.gridka.de:2119/jobmanager-pbspro-cmsXS\n"
    "Submitted:          Sun Nov 14 20:33:58 2010 CET\n" + RULE + "\n\n"
)
# grid-control testsuite/backend/test.GliteWMS.status2 (real output, 2010), with the log notice
DONE_ID = "https://grid-lb0.desy.de:9000/gI6QdIJdvkCj3V2nqRQInw"
RUNNING_ID = "https://lb-3-fzk.gridka.de:9000/h261HCD0QRxIn1gr-8Q8VA"
STATUS2 = (
    "\n" + HEADER + "\nBOOKKEEPING INFORMATION:\n\n"
    f"Status info for the Job : {DONE_ID}\n"
    "Current Status:     Done (Success)\n"
    "Logged Reason(s):\n    - job completed\n    - Job Terminated Successfully\n"
    "Exit code:          0\n"
    "Status Reason:      Job Terminated Successfully\n"
    "Destination:        cream02.athena.hellasgrid.gr:8443/cream-pbs-cms\n"
    "Submitted:          Sun Nov 14 22:05:22 2010 CET\n"
    + RULE
    + "\n\n\n"
    + HEADER
    + "\nBOOKKEEPING INFORMATION:\n\n"
    f"Status info for the Job : {RUNNING_ID}\n"
    "Current Status:     Running \n"
    "Status Reason:      Job successfully submitted to Globus\n"
    "Destination:        ce126.cern.ch:2119/jobmanager-lcglsf-grid_2nh_cms\n"
    "Submitted:          Sun Nov 14 22:05:34 2010 CET\n" + RULE + "\n\n\n"
    "                           *** Log file created ***\n"
    "Possible Errors and Debug messages have been printed in the following file:\n"
    "/tmp/glite-wms-job-status_12043_6301_1289764503.log\n\n"
)
# EMI spelling (2014, PL-Grid): no space before the parenthesis, no trailing spaces
EMI_ID = "https://lb.plgrid.example:9000/AbCdEfGhIjKlMnOpQrStUv"
EMI_EXIT = (
    "\n" + HEADER + "\nBOOKKEEPING INFORMATION:\n\n"
    f"Status info for the Job : {EMI_ID}\n"
    "Current Status:     Done(Exit Code !=0)\n"
    "Exit code:          127\n"
    "Status Reason:      Job Terminated Successfully\n"
    "Destination:        ce.plgrid.example:8443/cream-pbs-plgrid\n"
    "Submitted:          Wed Mar  2 19:07:36 2016 SAST\n" + RULE + "\n\n"
)
PARENT = "https://lb01.example.org:9000/PaRenTPaRenTPaRenTPaRe1"
CHILD0 = "https://lb01.example.org:9000/ChIlD0ChIlD0ChIlD0ChIl0"
CHILD1 = "https://lb01.example.org:9000/ChIlD1ChIlD1ChIlD1ChIl1"
PARAMETRIC = (
    "\n" + HEADER + "\nBOOKKEEPING INFORMATION:\n\n"
    f"Status info for the Job : {PARENT}\n"
    "Current Status:     Running \n"
    "Submitted:          Tue Dec  1 09:00:00 2026 UTC\n" + RULE + "\n\n"
    "- Nodes information for: \n"
    f"    Status info for the Job : {CHILD0}\n"
    "    Current Status:     Running \n"
    "    Status Reason:      unavailable\n"
    "    Destination:        ce01.example.org:8443/cream-pbs-long\n"
    "    Submitted:          Tue Dec  1 09:00:00 2026 UTC\n" + RULE + "\n\n"
    f"    Status info for the Job : {CHILD1}\n"
    "    Current Status:     Aborted \n"
    "    Status Reason:      Cannot plan: BrokerHelper: no compatible resources\n"
    "    Submitted:          Tue Dec  1 09:00:00 2026 UTC\n" + RULE + "\n\n"
)
GONE_ID = "https://lb01.example.org:9000/GoNeGoNeGoNeGoNeGoNeGo"
GLITE_UNKNOWN_STDERR = (
    "\n**** Warning: API_NATIVE_ERROR ****  \n"
    'Error while calling the "Job:getStatus" native api \n'
    f"Unable to retrieve the status for: {GONE_ID}\n"
    "edg_wll_JobStatus: No such file or directory: no matching jobs found\n\n"
)
EMI_UNKNOWN_STDOUT = (
    f"*** Warning: Unable to retrieve the status for: {GONE_ID}\n"
    "No such file or directory - no matching jobs found\n"
)
LB_DOWN_STDERR = (
    "\n**** Error: API_NATIVE_ERROR ****  \n"
    'Error while calling the "Job:getStatus" native api \n'
    f"Unable to retrieve the status for: {GONE_ID}\n"
    "edg_wll_JobStatus: Connection refused: edg_wll_ssl_connect()\n\n"
)
# grid-control testsuite/backend/test.GliteWMS.cancel1 (real output)
CANCEL1 = (
    "\nConnecting to the service https://wms-4-fzk.gridka.de:7443/glite_wms_wmproxy_server\n\n\n"
    "============================= glite-wms-job-cancel Success =============================\n\n"
    "The cancellation request has been successfully submitted for the following job(s):\n\n"
    "- https://lb-3-fzk.gridka.de:9000/GgeNd6MD5REG2KsbN5dmEg\n\n" + "=" * 88 + "\n\n\n"
)


def cmd(stdout: str = "", stderr: str = "", code: int | None = 0, **kw: object) -> CommandResult:
    return CommandResult(("glite-wms-job-status",), code, stdout, stderr, **kw)  # type: ignore[arg-type]


def test_real_capture_scheduled_keeps_native_state_without_its_trailing_space() -> None:
    parsed = parse_status(STATUS1)
    block = parsed.blocks["https://lb-3-fzk.gridka.de:9000/GgeNd6MD5REG2KsbN5dmEg"]
    assert block.native == "Scheduled"
    assert block.reason == "Job successfully submitted to Globus"
    assert block.destination == "ce-2-fzk.gridka.de:2119/jobmanager-pbspro-cmsXS"
    assert block.submitted == "Sun Nov 14 20:33:58 2010 CET"
    assert block.exit_code is None and block.parent is None


def test_real_capture_done_and_running_stop_at_the_log_file_notice() -> None:
    result = status_result(EP, [DONE_ID, RUNNING_ID], cmd(STATUS2))
    assert result.ok
    done, running = result.statuses[DONE_ID], result.statuses[RUNNING_ID]
    assert (done.state, done.native, done.exit_code) == ("done", "Done (Success)", 0)
    assert done.reason == "Job Terminated Successfully"
    assert parse_status(STATUS2).blocks[DONE_ID].logged_reasons == (
        "job completed",
        "Job Terminated Successfully",
    )
    assert (running.state, running.native) == ("running", "Running")
    assert set(result.statuses) == {DONE_ID, RUNNING_ID}


def test_emi_spelling_exit_code_not_zero_is_failed_even_when_the_reason_says_success() -> None:
    status = status_result(EP, [EMI_ID], cmd(EMI_EXIT)).statuses[EMI_ID]
    assert (status.state, status.native, status.exit_code) == ("failed", "Done(Exit Code !=0)", 127)
    assert status.reason == "Job Terminated Successfully"


def test_both_done_spellings_and_every_state_normalise_as_formats_md_says() -> None:
    expected = {
        "Done (Success)": "done",
        "Done(Success)": "done",
        "Done (Success) ": "done",
        "Done (Exit Code !=0)": "failed",
        "Done(Exit Code !=0)": "failed",
        "Done (Failed)": "failed",
        "Done(Failed)": "failed",
        "Done (Cancelled)": "failed",
        "Done (Unexpected done code: 7 )": "failed",
        "Submitted ": "waiting",
        "Waiting ": "waiting",
        "Ready ": "waiting",
        "Scheduled": "waiting",
        "Running ": "running",
        "Cleared ": "done",
        "Aborted ": "failed",
        "Cancelled": "cancelled",
        "Unknown ": "unknown",
        "Purged ": None,
        "Something new": "unknown",
    }
    assert {text: normalise(text) for text in expected} == expected
    assert normalise("Done", 0) == "done" and normalise("Done", 3) == "failed"


def test_parametric_parent_then_indented_children() -> None:
    parsed = parse_status(PARAMETRIC)
    assert parsed.children == {PARENT: (CHILD0, CHILD1)}
    assert parsed.blocks[PARENT].parent is None
    assert parsed.blocks[CHILD0].parent == PARENT
    assert parsed.blocks[CHILD1].reason == "Cannot plan: BrokerHelper: no compatible resources"
    result = status_result(EP, [PARENT], cmd(PARAMETRIC))
    assert result.ok
    assert {j: s.state for j, s in result.statuses.items()} == {
        PARENT: "running",
        CHILD0: "running",
        CHILD1: "failed",
    }


def test_a_top_level_job_after_a_parametric_one_is_nobodys_child() -> None:
    parsed = parse_status(PARAMETRIC + STATUS1)
    assert parsed.blocks["https://lb-3-fzk.gridka.de:9000/GgeNd6MD5REG2KsbN5dmEg"].parent is None


def test_exit_255_some_known_some_gone_is_an_answer_without_the_gone_ones() -> None:
    for stdout, stderr in ((STATUS1, GLITE_UNKNOWN_STDERR), (EMI_UNKNOWN_STDOUT + STATUS1, "")):
        known = "https://lb-3-fzk.gridka.de:9000/GgeNd6MD5REG2KsbN5dmEg"
        result = status_result(EP, [known, GONE_ID], cmd(stdout, stderr, 255))
        assert result.ok
        assert set(result.statuses) == {known}
        assert (
            parse_status(stdout, stderr).unretrievable[GONE_ID].endswith("no matching jobs found")
        )


def test_exit_1_every_id_gone_is_an_answer_that_knows_none() -> None:
    result = status_result(EP, [GONE_ID], cmd("", GLITE_UNKNOWN_STDERR, 1))
    assert result.ok and dict(result.statuses) == {}
    purged = GLITE_UNKNOWN_STDERR.replace(
        "No such file or directory: no matching jobs found",
        "Identifier removed: matching job already purged",
    )
    assert status_result(EP, [GONE_ID], cmd("", purged, 1)).ok


def test_exit_1_with_the_bookkeeping_server_down_is_a_failed_query() -> None:
    result = status_result(EP, [GONE_ID], cmd("", LB_DOWN_STDERR, 1))
    assert not result.ok
    assert "Connection refused" in result.message


def test_timeouts_launch_errors_other_codes_and_junk_are_failed_queries() -> None:
    assert not status_result(EP, [DONE_ID], cmd(STATUS2[:40], code=None, timed_out=True)).ok
    assert not status_result(EP, [DONE_ID], cmd(code=None, launch_error="No such file")).ok
    assert not status_result(EP, [DONE_ID], cmd(STATUS2, code=2)).ok
    assert not status_result(EP, [DONE_ID], cmd("garbage\n", code=0)).ok
    assert not status_result(EP, [DONE_ID], cmd("", "bad option", 1)).ok


def test_output_cut_at_the_size_limit_is_no_answer() -> None:
    # the ids past the cut would otherwise look unknown to the server, then lost
    result = status_result(EP, [DONE_ID, RUNNING_ID], cmd(STATUS2[:700], stdout_truncated=True))
    assert not result.ok and "max_output_bytes" in result.message


def test_a_block_cut_short_before_its_state_is_not_reported() -> None:
    cut = STATUS1.split("Current Status")[0]
    assert parse_status(cut).blocks == {}


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text())
def test_parsers_never_raise(stdout: str, stderr: str) -> None:
    parse_status(stdout, stderr)
    parse_cancel(stdout, stderr, ["x"])
    status_result(EP, ["x"], cmd(stdout, stderr, 255))


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=len(STATUS2)))
def test_truncated_real_output_never_raises_nor_invents_ids(cut: int) -> None:
    parsed = parse_status(STATUS2[:cut])
    assert set(parsed.blocks) <= {DONE_ID, RUNNING_ID}


def test_cancel_real_capture() -> None:
    job = "https://lb-3-fzk.gridka.de:9000/GgeNd6MD5REG2KsbN5dmEg"
    result = cancel_result(EP, [job], cmd(CANCEL1))
    assert result.ok and result.cancelled == (job,)


def test_cancel_of_a_finished_single_job_is_an_answer_but_no_cancel() -> None:
    job = "https://lb-3-fzk.gridka.de:9000/GgeNd6MD5REG2KsbN5dmEg"
    stderr = "\nError - Cancel not allowed\nCurrent Job Status is Done\n\n"
    result = cancel_result(EP, [job], cmd("", stderr, 1))
    assert result.ok and result.cancelled == () and "already finished" in result.message
    failed_done = "\nError - Cancel not allowed\nCurrent Job Status is Done(Failed)\n\n"
    assert parse_cancel("", failed_done, [job]).finished == ()


def test_cancel_fault_is_not_ok() -> None:
    stderr = (
        "\nError - Operation Failed\n"
        "The Operation is not allowed: Cancel has already been requested\n\nMethod: jobCancel\n"
    )
    result = cancel_result(EP, ["https://lb01.example.org:9000/x"], cmd("", stderr, 1))
    assert not result.ok and result.cancelled == ()
    assert result.message.startswith("exit code 1")
