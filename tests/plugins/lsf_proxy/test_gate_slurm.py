"""The gate in front of real Slurm commands: categories, and shims that gate real squeue and
sbatch for an ordinary user against the private cluster and a real token daemon."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from support.lsfproxyd import install_shims
from support.uids import AS_NOBODY

from gridgate.plugins.lsf_proxy.gate.gate import SHIM_COMMANDS, find_real, infer_category

SLURM = (
    "sbatch",
    "srun",
    "salloc",
    "squeue",
    "sinfo",
    "sacct",
    "sstat",
    "sprio",
    "sshare",
    "sdiag",
    "scancel",
    "scontrol",
)


@pytest.mark.parametrize(
    ("argv", "category"),
    [
        (["sbatch", "job.sh"], "submission"),
        (["srun", "hostname"], "submission"),
        (["salloc", "-N1"], "submission"),
        (["squeue"], "query"),
        (["sinfo"], "query"),
        (["sacct", "-j", "1"], "query"),
        (["sstat", "-j", "1"], "query"),
        (["sprio"], "query"),
        (["sshare"], "query"),
        (["sdiag"], "query"),
        (["scancel", "12"], "other"),
        (["scontrol", "show", "job", "12"], "query"),
        (["/usr/bin/scontrol", "-o", "show", "nodes"], "query"),
        (["scontrol", "update", "PartitionName=b", "State=DOWN"], "other"),
        (["scontrol", "hold", "12"], "other"),
        (["scontrol"], "other"),
    ],
)
def test_slurm_commands_have_the_seed_categories(argv, category) -> None:
    assert infer_category(argv[0], None, argv[1:]) == category


def test_the_config_wins_over_the_arguments() -> None:
    section = {"categories": {"other": ["scontrol"]}}
    assert infer_category("scontrol", section, ["show", "job"]) == "other"


def test_every_slurm_command_gets_a_shim_when_on_path() -> None:
    assert set(SLURM) <= set(SHIM_COMMANDS)


@pytest.mark.parametrize("kind", ["python", "compiled"])
def test_shims_gate_real_squeue_and_sbatch_for_nobody(
    slurm, start_daemon, sockdir, cli, gridgate_exe, kind
) -> None:
    log = sockdir / "diag.log"
    daemon = start_daemon({"diagnose": True, "diagnose_file": str(log)})
    # Only the shims and links to the real Slurm commands (and setpriv): whatever else the
    # machine has in /usr/bin gets no shim and is not found
    installed = (c for c in SLURM if shutil.which(c, path="/usr/bin:/bin"))
    path, printed, real = install_shims(gridgate_exe, sockdir, daemon, *installed, kind=kind)
    env = {"PATH": path, **slurm.env}
    assert find_real("squeue", sockdir / "shims", path) == f"{real}/squeue"
    for name in ("squeue", "sbatch", "sinfo", "scontrol", "scancel"):
        assert f"{name} -> {real}/{name} ({kind})" in printed, printed
    compiled = not (sockdir / "shims" / "squeue").read_bytes().startswith(b"#!")
    assert compiled == (kind == "compiled")
    assert {line.split(" -> ")[0].rsplit("/", 1)[-1] for line in printed.splitlines()} <= set(SLURM)

    def as_nobody(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*AS_NOBODY, *argv], capture_output=True, text=True, timeout=120, env=env, cwd="/"
        )

    submitted = as_nobody(
        "sbatch",
        "--parsable",
        "-p",
        "batch",
        f"--output={slurm.jobs_dir}/%j",
        "--wrap",
        "sleep 300",
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.isdigit()
    # every state: under load the job has once left the pending/running list before squeue
    # ran (CI, 2026-12-03); what is checked is that the gated squeue reads it as nobody's
    seen = as_nobody("squeue", "-h", "-t", "all", "-o", "%i %u %T", f"--jobs={job_id}")
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split()[:2] == [job_id, "nobody"], seen.stdout
    shown = as_nobody("scontrol", "show", "job", job_id)
    assert shown.returncode == 0 and f"JobId={job_id}" in shown.stdout
    # each went through the daemon under its own category, as nobody
    lines = log.read_text().splitlines()

    def taken(category: str, opcode: str) -> list[str]:
        return [ln for ln in lines if f" {category},{opcode},nobody," in ln]

    # logged under Slurm's RPC names: squeue and `scontrol show` are both a job-info query
    assert len(taken("SUBMISSION_REQ", "REQUEST_SUBMIT_BATCH_JOB")) == 1, lines
    assert len(taken("QUERY_REQ", "REQUEST_JOB_INFO")) == 2, lines
    # nobody blocked: the real sbatch and squeue do not run at all
    assert cli("block", "-u", "nobody", "--socket", daemon.socket).returncode == 0
    before = slurm.job_ids()
    refused = as_nobody("sbatch", "--parsable", "-p", "batch", "--wrap", "sleep 300")
    assert refused.returncode == 75, refused.stderr
    assert "no submission token, not run" in refused.stderr
    assert slurm.job_ids() == before
    assert as_nobody("squeue").returncode == 75
