"""The arc backend keeps the backend contract every backend inherits (with stand-ins for the
ARC client; the real CE is exercised in test_arc_backend.py)."""

from __future__ import annotations

from gridgate.core.testing import BackendContract
from gridgate.plugins.arc.backend import ArcBackend


class TestArcBackendContract(BackendContract):
    backend_class = ArcBackend
    name = "arc"
    submitted_output = "Job submitted with jobid: https://ce.example.org:443/arex/rest/1.0/jobs/gg{call}\n"
    refused_output = ("ERROR: Failed to establish connection: TCP: GENERIC_ERROR (Failed to connect "
                      "to ce.example.org(IPv4):443)\nERROR: Job submission aborted because no "
                      "resource returned any information\n")
    bad_sections = (
        ({"endpoints": ["https://ce.example.org/arex", "https://ce.example.org/arex"]}, ("endpoints", 1)),
        ({"endpoints": ["http://ce.example.org/arex"]}, ("endpoints", 0)),
        ({"xrsl": {"executable": "/bin/sh"}}, ("xrsl", "executable")),
        ({"xrsl": {"Queue": "long"}}, ("xrsl", "Queue")),
    )

    def section(self, program, tmp_path):
        script = tmp_path / "pilot.sh"
        script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        return {"endpoints": ["https://ce.example.org:443/arex"], "script": str(script),
                "commands": {name: program for name in ("arcsub", "arcstat", "arckill", "arcclean", "arcget")}}
