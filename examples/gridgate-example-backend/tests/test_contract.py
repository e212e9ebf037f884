"""The ``local`` backend keeps the contract every gridgate backend inherits: a few lines."""

from __future__ import annotations

from gridgate_example_backend import LocalBackend

from gridgate.core.testing import BackendContract


class TestLocalBackendContract(BackendContract):
    backend_class = LocalBackend
    name = "local"
    submitted_output = "JOBID pilot-{call}\n"
    bad_sections = (({"command": ["pilot", "{slott}"]}, ("command", 1)),)

    def section(self, program, tmp_path):
        return {"command": [program, "{slot}"]}
