"""The slurm backend keeps the backend contract every backend inherits (with stand-ins for
sbatch; the real cluster is exercised in test_slurm_backend.py)."""

from __future__ import annotations

from gridgate.core.testing import BackendContract
from gridgate.plugins.slurm.backend import SlurmBackend


class TestSlurmBackendContract(BackendContract):
    backend_class = SlurmBackend
    name = "slurm"
    submitted_output = "{call}\n"  # sbatch --parsable
    refused_output = "sbatch: error: Batch job submission failed: Required partition not available (inactive or drain)\n"
    bad_sections = (({"partitions": ["debug", "debug"]}, ("partitions", 1)),)

    def section(self, program, tmp_path):
        script = tmp_path / "pilot.sh"
        script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        return {"partitions": ["debug"], "script": str(script),
                "commands": {"sbatch": program, "squeue": program, "scancel": program}}
