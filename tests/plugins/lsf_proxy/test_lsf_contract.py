"""The lsf backend keeps the backend contract every backend inherits."""

from __future__ import annotations

from gridgate.core.testing import BackendContract
from gridgate.plugins.lsf_proxy.director.backend import LsfBackend


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
            "commands": {"bsub": program, "bjobs": program},
        }
