"""The wms_glite backend keeps the backend contract every backend inherits."""

from __future__ import annotations

from gridgate.core.testing import Answer, BackendContract
from gridgate.plugins.wms_glite.backend import GliteBackend

STATUS_HEADER = "======================= glite-wms-job-status Success ====================="
CANCEL_HEADER = (
    "============================= glite-wms-job-cancel Success ============================="
)
#: Current Status: for the live states the contract asks about
GLITE_STATES = {"waiting": "Scheduled", "running": "Running"}


class TestGliteBackendContract(BackendContract):
    backend_class = GliteBackend
    name = "wms_glite"
    submitted_output = (
        "Connecting to the service https://wms01.example.org:7443/glite_wms_wmproxy_server\n"
        "Your job identifier is:\n\nhttps://lb01.example.org:9000/Contract{call}AbCdEf\n"
    )
    refused_output = "Error - Operation failed\nSystem load is too high:\n"
    bad_sections = (({"output_format": "xml"}, ("output_format",)),)

    def section(self, program, tmp_path):
        return {
            "servers": ["wms01.example.org"],
            "work_dir": str(tmp_path),
            "commands": {
                "submit": program,
                "list_match": program,
                "status": program,
                "cancel": program,
            },
        }

    def status_answer(self, known, unknown):
        blocks = "".join(
            f"\n{STATUS_HEADER}\nBOOKKEEPING INFORMATION:\n\nStatus info for the Job : {i}\n"
            f"Current Status:     {GLITE_STATES[s]}\n{'=' * 74}\n\n"
            for i, s in known.items()
        )
        gone = "".join(
            f"*** Warning: Unable to retrieve the status for: {i}\n"
            "No such file or directory - no matching jobs found\n"
            for i in unknown
        )
        # exit 0: every id answered; 255: some were not; 1: none was
        return Answer(stdout=blocks + gone, exit_code=(255 if known else 1) if unknown else 0)

    def cancel_answer(self, cancelled, finished, unknown):
        # several ids: the client warns for each it did not cancel (formats.md)
        warnings = "".join(
            f"\nWarning - Cancel not allowed: {i}\nCurrent Job Status is Done\n" for i in finished
        ) + "".join(
            f"\nWarning - Operation Failed: {i}\nUnable to retrieve the status for: {i}\n"
            for i in unknown
        )
        if not cancelled:
            return Answer(
                stderr=warnings + "\nError - Operation Failed\nUnable to cancel any job\n\n",
                exit_code=1,
            )
        return Answer(
            stdout=f"\n\n{CANCEL_HEADER}\n\nThe cancellation request has been successfully "
            "submitted for the following job(s):\n\n"
            + "".join(f"- {i}\n" for i in cancelled)
            + "\n"
            + "=" * 88
            + "\n\n\n",
            stderr=warnings,
        )
