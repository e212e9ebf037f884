"""The lsf backend keeps the backend contract every backend inherits."""

from __future__ import annotations

from gridgate.core.testing import Answer, BackendContract
from gridgate.plugins.lsf_proxy.director.backend import LsfBackend

#: bjobs' STAT for the live states the contract asks about
STAT = {"waiting": "PEND", "running": "RUN"}


class TestLsfBackendContract(BackendContract):
    backend_class = LsfBackend
    name = "lsf"
    submitted_output = "Job <{call}> is submitted to queue <normal>.\n"
    refused_output = "Request from non-LSF host rejected\n"
    bad_sections = (
        ({"processors": "two"}, ("processors",)),
        ({"queues": ["no queue"]}, ("queues", 0)),
    )

    def section(self, program, tmp_path):
        return {
            "queues": ["normal"],
            "tokens": False,
            "commands": {"bsub": program, "bjobs": program, "bkill": program},
        }

    def status_answer(self, known, unknown):
        # bjobs -a -noheader -o "jobid stat exec_host exit_code exit_reason delimiter='^'"
        return Answer(
            stdout="".join(f"{i}^{STAT[s]}^-^-^-\n" for i, s in known.items()),
            stderr="".join(f"Job <{i}> is not found\n" for i in unknown),
            exit_code=255 if unknown else 0,
        )

    def cancel_answer(self, cancelled, finished, unknown):
        return Answer(
            stdout="".join(f"Job <{i}> is being terminated\n" for i in cancelled),
            stderr="".join(f"Job <{i}>: Job has already finished\n" for i in finished)
            + "".join(f"Job <{i}>: No matching job found\n" for i in unknown),
            exit_code=255 if finished or unknown else 0,
        )

    job_name_base = "gridgate-pilot"

    def found_answer(self, jobs):
        # bjobs -a -q Q -u USER -noheader -o "jobid job_name stat exec_host exit_code ..."
        return Answer(
            stdout="".join(f"{i}^{name}^{STAT[s]}^-^-^-\n" for i, (name, s) in jobs.items())
        )
