"""The slurm backend keeps the backend contract every backend inherits (with stand-ins for
sbatch; the real cluster is exercised in test_slurm_backend.py)."""

from __future__ import annotations

from gridgate.core.testing import Answer, BackendContract
from gridgate.plugins.slurm.backend import SlurmBackend

#: squeue's %T for the live states the contract asks about
SQUEUE_STATES = {"waiting": "PENDING Priority", "running": "RUNNING None"}


class TestSlurmBackendContract(BackendContract):
    backend_class = SlurmBackend
    name = "slurm"
    submitted_output = "{call}\n"  # sbatch --parsable
    refused_output = "sbatch: error: Batch job submission failed: Required partition not available (inactive or drain)\n"
    bad_sections = (({"partitions": ["debug", "debug"]}, ("partitions", 1)),)

    def section(self, program, tmp_path):
        script = tmp_path / "pilot.sh"
        script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        return {
            "partitions": ["debug"],
            "script": str(script),
            "commands": {"sbatch": program, "squeue": program, "scancel": program},
        }

    def status_answer(self, known, unknown):
        if not known:  # squeue: none of the ids is in the controller's memory
            return Answer(stderr="slurm_load_jobs error: Invalid job id specified\n", exit_code=1)
        return Answer(stdout="".join(f"{i} {SQUEUE_STATES[s]}\n" for i, s in known.items()))

    job_name_base = "gridgate-pilot"  # the schema's default job_name

    def found_answer(self, jobs):
        # squeue -h -r --me -t all --partition=P -o "%i\t%T\t%r\t%j" (documents.FIND_FORMAT)
        return Answer(
            stdout="".join(
                "\t".join((i, *SQUEUE_STATES[s].split(), name)) + "\n"
                for i, (name, s) in jobs.items()
            )
        )

    def cancel_answer(self, cancelled, finished, unknown):
        # scancel --verbose: one line per id, an error line for those it did not cancel, exit 0
        why = {
            **dict.fromkeys(finished, "Job/step already completing or completed"),
            **dict.fromkeys(unknown, "Invalid job id specified"),
        }
        return Answer(
            stderr="".join(f"scancel: Terminating job {i}\n" for i in (*cancelled, *why))
            + "".join(
                f"scancel: error: Kill job error on job id {i}: {w}\n" for i, w in why.items()
            )
        )


def test_a_squeue_output_cut_by_gridgates_cap_is_a_failed_poll_carrying_the_cut_command(
    tmp_path,
) -> None:
    """Core names a cut output as gridgate's cap (kind output_cap) only when it sees the cut
    command: a cut squeue is never read as 'the ids past the cut are gone', nor blamed on the
    controller."""
    from gridgate.core.testing import build_plugin, stand_in_command

    squeue = stand_in_command(
        tmp_path / "bin", "squeue", stdout="12 RUNNING None\n" + "13 PENDING x\n" * 20_000
    )
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    backend = build_plugin(
        SlurmBackend,
        {"partitions": ["debug"], "script": str(script), "commands": {"squeue": str(squeue)}},
        state_dir=tmp_path / "state",
        name="slurm",
        config={"director": {"max_output_bytes": 1024}},
    )
    (endpoint,) = backend.gridgate_backend_info(backend="slurm").endpoints
    result = backend.gridgate_job_status(endpoint=endpoint, job_ids=["12", "13"], timeout=10)
    assert not result.ok and result.command is not None and result.command.stdout_truncated
    assert backend._known_unreachable(endpoint) is None, "the controller is not blamed for our cap"
