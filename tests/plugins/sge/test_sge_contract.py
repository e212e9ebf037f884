"""The sge backend keeps the backend contract every backend inherits, submission, tracking and
cancel alike, with one stand-in program playing qsub, qstat, qacct and qdel in the real
commands' formats (tests/plugins/sge/outputs/; the real cell is exercised in
test_sge_backend.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gridgate.core.devkit.backend_contract import Answer
from gridgate.core.testing import BackendContract, build_plugin, stand_in_command
from gridgate.plugins.sge.backend import SgeBackend

HEADER = (
    "job-ID  prior   name       user         state submit/start at     queue"
    "                          slots ja-task-ID \n" + "-" * 113 + "\n"
)


def qstat_line(job_id: str, state: str) -> str:
    """A ``qstat -g d`` line as SGE 8.1.9 prints it (outputs/qstat-g-d.txt)."""
    number, _, task = job_id.partition(".")
    if state == "running":
        return (
            f"{number:>7} 0.50000 gridgate-p nobody       r     12/02/2026 04:43:12 "
            f"pilots.q@vm                        1 {task}\n"
        )
    return (
        f"{number:>7} 0.50000 gridgate-p nobody       qw    12/02/2026 04:43:12 "
        f"                                   1 {task}\n"
    )


class TestSgeBackendContract(BackendContract):
    backend_class = SgeBackend
    name = "sge"
    submitted_output = "{call}\n"  # qsub -terse
    refused_output = (
        'Unable to run job: Job was rejected because job requests unknown queue "pilots.q"\n'
        "Exiting.\n"
    )
    bad_sections = (
        ({"queues": ["pilots.q", "pilots.q"]}, ("queues", 1)),
        ({"qsub_options": ["-q", "other.q"]}, ("qsub_options", 0)),
        ({"job_name": "bad/name"}, ("job_name",)),
    )

    def section(self, program, tmp_path):
        script = tmp_path / "pilot.sh"
        script.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        return {
            "queues": ["pilots.q"],
            "script": str(script),
            "commands": {name: program for name in ("qsub", "qstat", "qacct", "qdel")},
        }

    def status_answer(self, known: Mapping[str, str], unknown: Sequence[str]) -> Sequence[Answer]:
        listing = HEADER + "".join(qstat_line(j, s) for j, s in known.items()) if known else ""
        return (
            Answer(stdout=listing, when=("-g", "d")),
            # qacct -j N for a job it has no record of (exit 1), as for 999 on the cell
            Answer(stderr="error: job id {call} not found\n", exit_code=1, when=("-j",)),
        )

    job_name_base = "gridgate-pilot"  # the schema's default job_name

    def found_answer(self, jobs: Mapping[str, tuple[str, str]]) -> Answer:
        # qstat -u $user -s a -g d -r: each job line, then its full name and the queue it asked
        # for (test_sge_find.py holds the real cell's form)
        blocks = "".join(
            qstat_line(i, s)
            + f"       Full jobname:     {name}\n"
            + "       Hard requested queues: pilots.q\n"
            for i, (name, s) in jobs.items()
        )
        return Answer(stdout=HEADER + blocks, when=("-r",))

    def cancel_answer(
        self, cancelled: Sequence[str], finished: Sequence[str], unknown: Sequence[str]
    ) -> Answer:
        # qdel answers every id on stdout; a job that has ended is one it does not know
        lines = [f"nobody has registered the job {j} for deletion\n" for j in cancelled]
        lines += [f'denied: job "{j}" does not exist\n' for j in (*finished, *unknown)]
        return Answer(stdout="".join(lines), exit_code=1 if finished or unknown else 0)


def test_a_qstat_output_cut_by_gridgates_cap_is_a_failed_poll_carrying_the_cut_command(
    tmp_path,
) -> None:
    """Core names a cut output as gridgate's cap (kind output_cap) only when it sees the cut
    command: a cut qstat is never read as 'the jobs past the cut have left', nor blamed on the
    qmaster, and no qacct runs for them."""
    qstat = stand_in_command(
        tmp_path / "bin", "qstat", stdout=HEADER + qstat_line("12", "running") * 20_000
    )
    backend = build_plugin(
        SgeBackend,
        {"queues": ["pilots.q"], "script": "/p.sh", "commands": {"qstat": str(qstat)}},
        state_dir=tmp_path / "state",
        name="sge",
        config={"director": {"max_output_bytes": 1024}},
    )
    (endpoint,) = backend.gridgate_backend_info(backend="sge").endpoints
    result = backend.gridgate_job_status(endpoint=endpoint, job_ids=["12", "13"], timeout=10)
    assert not result.ok and result.command is not None and result.command.stdout_truncated
    assert result.commands == 1 and len(qstat.calls()) == 1
    assert backend._known_unreachable() is None, "the qmaster is not blamed for our cap"


def test_jobs_in_error_state_that_left_before_qstat_j_keep_their_state(tmp_path) -> None:
    """qstat -j of jobs that all left since the listing exits 1 (``Following jobs do not
    exist:``): an answer, not a failed poll."""
    listing = HEADER + qstat_line("5", "waiting").replace(" qw   ", " Eqw  ")
    program = tmp_path / "bin" / "sge"
    program.parent.mkdir()
    program.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -j ]; then printf "Following jobs do not exist: \\n5\\n" >&2; exit 1; fi\n'
        f"cat <<'EOF'\n{listing}EOF\n",
        encoding="utf-8",
    )
    program.chmod(0o755)
    backend = build_plugin(
        SgeBackend,
        {"queues": ["pilots.q"], "script": "/p.sh", "commands": {"qstat": str(program)}},
        name="sge",
    )
    (endpoint,) = backend.gridgate_backend_info(backend="sge").endpoints
    result = backend.gridgate_job_status(endpoint=endpoint, job_ids=["5"], timeout=10)
    assert result.ok and result.commands == 2, result
    assert (result.statuses["5"].state, result.statuses["5"].native) == ("failed", "Eqw")


def test_a_qsub_that_answers_a_huge_array_range_is_a_failed_submission_not_billions_of_ids(
    tmp_path,
) -> None:
    """A broken or hostile qsub answering ``41.1-4000000000:1`` to ``-t 1-3`` was expanded into
    four billion pilot ids (issue 31, item 9): now it is a failed submission saying why."""
    from gridgate.core.model import SubmitRequest

    qsub = stand_in_command(tmp_path / "bin", "qsub", stdout="41.1-4000000000:1\n")
    backend = build_plugin(
        SgeBackend,
        {"queues": ["pilots.q"], "script": "/p.sh", "commands": {"qsub": str(qsub)}},
        state_dir=tmp_path / "state",
        name="sge",
    )
    (endpoint,) = backend.gridgate_backend_info(backend="sge").endpoints
    result = backend.gridgate_submit(
        endpoint=endpoint, request=SubmitRequest("sge", count=3), timeout=10
    )
    assert not result.ok and result.job_ids == (), result
    assert "array of 4000000000 tasks" in result.message and "3 asked for" in result.message
    argv = qsub.calls()[0]["argv"]
    assert argv[argv.index("-t") + 1] == "1-3"
