"""The ``local`` backend keeps the contract every gridgate backend inherits: a few lines."""

from __future__ import annotations

from gridgate_example_backend import LocalBackend

from gridgate.core.testing import Answer, BackendContract


class TestLocalBackendContract(BackendContract):
    backend_class = LocalBackend
    name = "local"
    submitted_output = "JOBID pilot-{call}\n"
    bad_sections = (({"command": ["pilot", "{slott}"]}, ("command", 1)),)

    job_name_base = "gridgate-pilot"

    def section(self, program, tmp_path):
        return {"command": [program, "{slot}"], "list_command": [program, "--list", "{slot}"]}

    def found_answer(self, jobs):
        # the list command: one "<job id> <job name> <state>" line per job the slot holds
        return Answer(stdout="".join(f"{i} {name} {s}\n" for i, (name, s) in jobs.items()))
