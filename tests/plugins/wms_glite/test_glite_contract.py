"""The wms_glite backend keeps the backend contract every backend inherits."""

from __future__ import annotations

from gridgate.core.testing import BackendContract
from gridgate.plugins.wms_glite.backend import GliteBackend


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
            "commands": {"submit": program, "list_match": program},
        }
