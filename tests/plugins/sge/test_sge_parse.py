"""Reading Grid Engine's outputs: every text here was printed by SGE 8.1.9's real commands on a
private cell (tests/plugins/sge/outputs/, captured as an ordinary user), never written by hand;
the failure texts were printed by the real qsub, qstat and qdel (test_sge_backend.py makes each
happen on the cell the tests start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridgate.core.model import CommandResult
from gridgate.plugins.sge.classify import cell_wide, classify
from gridgate.plugins.sge.parse import (
    parse_qacct,
    parse_qdel,
    parse_qstat,
    parse_qstat_errors,
    parse_terse,
    state_of,
)

OUTPUTS = Path(__file__).parent / "outputs"


def _output(name: str) -> str:
    return (OUTPUTS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("stdout", "parsed"),
    [
        ("1\n", ("1", [])),
        ("2.1-3:1\n", ("2", [1, 2, 3])),
        ("10.1-8:1\n", ("10", list(range(1, 9)))),
        ('Your job 41 ("pilot.sh") has been submitted\n', None),
        ("", None),
    ],
)
def test_parse_terse_reads_a_job_or_an_array(stdout, parsed) -> None:
    assert parse_terse(stdout) == parsed


def test_an_array_range_past_what_was_asked_is_refused_without_being_expanded() -> None:
    """``41.1-4000000000:1`` was expanded into four billion ids (issue 31, item 9): now the
    range is counted, and one larger than the submission asked for is a bad answer."""
    with pytest.raises(ValueError, match="array of 4000000000 tasks"):
        parse_terse("41.1-4000000000:1\n", max_tasks=5)
    with pytest.raises(ValueError, match="more than the 5 asked for"):
        parse_terse("41.1-6:1\n", max_tasks=5)
    assert parse_terse("41.1-9:2\n", max_tasks=5) == ("41", [1, 3, 5, 7, 9])
    with pytest.raises(ValueError):
        parse_terse("41.1-20000:1\n")  # past the schema's largest pilots_per_submission


def test_parse_qstat_gives_one_status_per_job_and_array_task() -> None:
    statuses = parse_qstat(_output("qstat-g-d.txt"))
    assert sorted(statuses, key=lambda j: tuple(map(int, j.split(".")))) == [
        "5",
        "6.1",
        "6.2",
        "7",
        "8.1",
        "8.2",
        "8.3",
        "9",
        *(f"10.{t}" for t in range(1, 9)),
    ]
    assert (statuses["9"].state, statuses["9"].native) == ("running", "r")
    assert statuses["9"].reason == "in pilots.q@vm"
    assert (statuses["8.2"].state, statuses["10.7"].state) == ("running", "waiting")
    assert (statuses["5"].state, statuses["6.2"].native) == ("failed", "Eqw")
    assert (statuses["7"].state, statuses["7"].native) == ("waiting", "hqw")


def test_parse_qstat_of_no_job_is_empty() -> None:
    # qstat prints nothing at all (not even its header) when the user has no job
    assert parse_qstat("") == {}


@pytest.mark.parametrize(
    ("native", "state"),
    [
        ("qw", "waiting"),
        ("hqw", "waiting"),
        ("hRwq", "waiting"),
        ("r", "running"),
        ("t", "running"),
        ("Rr", "running"),
        ("s", "running"),
        ("S", "running"),
        ("T", "running"),
        ("Eqw", "failed"),
        ("Ehqw", "failed"),
        ("dr", "cancelled"),
        ("dt", "cancelled"),
        ("z", "done"),
        ("", "unknown"),
    ],
)
def test_states_follow_sge_status(native, state) -> None:
    assert state_of(native) == state


def test_parse_qstat_errors_gives_each_task_its_reason() -> None:
    reasons = parse_qstat_errors(_output("qstat-j-error.txt"))
    why = "error: can't chdir to /tmp/h24b/no-such-dir: No such file or directory"
    assert reasons == {"5": why, "6.1": why, "6.2": why}


def test_parse_qacct_of_an_array_gives_each_task() -> None:
    statuses = parse_qacct(_output("qacct-j-array.txt"))
    assert set(statuses) == {"2.1", "2.2", "2.3"}
    assert {statuses["2.1"].state, statuses["2.3"].state} == {"done"}
    killed = statuses["2.2"]  # deleted by qdel while it ran: SGE records no deleted_by
    assert (killed.state, killed.exit_code) == ("failed", 137)
    assert killed.reason == "failed 100 : assumedly after job"
    assert killed.native == "failed 100 : assumedly after job, exit_status 137 (Killed)"


def test_parse_qacct_of_a_job_gives_its_exit_status() -> None:
    [(job_id, status)] = parse_qacct(_output("qacct-j-exit3.txt")).items()
    assert (job_id, status.state, status.exit_code) == ("4", "failed", 3)
    assert status.reason == "exit status 3"
    [(job_id, status)] = parse_qacct(_output("qacct-j-killed.txt")).items()
    assert (job_id, status.state, status.exit_code) == ("1", "failed", 137)


def test_parse_qdel_tells_the_deleted_from_the_gone() -> None:
    answer = parse_qdel(_output("qdel.txt"))
    assert answer.deleted == ("3.6", "3.4", "2.2", "1")
    assert answer.absent == ("999", "2.2")  # the second 2.2: asked again once it had ended


def _failed(stderr: str, stdout: str = "", exit_code: int = 1) -> CommandResult:
    return CommandResult(
        argv=("qsub",), returncode=exit_code, stdout=stdout, stderr=stderr, duration=0.01
    )


#: (what qsub printed on stderr, exit code, kind, local, the whole cell)
REAL_FAILURES = [
    (
        "error: commlib error: got select error (Connection refused)\n"
        'Unable to run job: unable to send message to qmaster using port 48077 on host "vm": '
        "got send error\nExiting.\n",
        1,
        "unreachable",
        False,
        True,
    ),
    (
        'Unable to run job: Job was rejected because job requests unknown queue "nope.q"\n'
        "Exiting.\n",
        1,
        "config",
        False,
        False,
    ),
    ('qsub: invalid option argument "-bogus"\n', 2, "usage", False, False),
    ('Unable to run job: unknown resource "bogus"\nExiting.\n', 1, "usage", False, False),
    (
        'Unable to run job: job rejected: the requested parallel environment "nope" does not '
        "exist\nExiting.\n",
        1,
        "config",
        False,
        False,
    ),
    ("Unable to run job: error: no suitable queues\nExiting.\n", 1, "usage", False, False),
    (
        "Unable to read script file because of error: error opening /tmp/h24b/nonexistent.sh: "
        "No such file or directory\n",
        14,
        "missing_input",
        True,
        False,
    ),
    (
        "Unable to run job: job rejected: your user id 0 is lower than minimum user id 100 of "
        "cluster configuration\nExiting.\n",
        1,
        "auth",
        True,
        True,
    ),
    (
        "Unable to run job: job rejected: cloudsdk@vm is not allowed to submit jobs\nExiting.\n",
        1,
        "auth",
        False,
        True,
    ),
    (
        "Unable to run job: job rejected: only 2 jobs are allowed per user (current job count: "
        "10)\nExiting.\n",
        25,
        "overload",
        False,
        True,
    ),
    (
        "Unable to run job: job rejected: you tried to submit a job with more than 75000 "
        "tasks\nExiting.\n",
        1,
        "usage",
        False,
        False,
    ),
    # the next two from helper A's captures on the same cell (qsub -l h_rt=bogus, -t 0-3)
    (
        'Unable to run job: attribute "h_rt" is not a time value\nExiting.\n',
        1,
        "usage",
        False,
        False,
    ),
    (
        "Unable to run job: job rejected: 0 is an invalid task id\nExiting.\n",
        1,
        "usage",
        False,
        False,
    ),
    (
        'qsub: can\'t read path aliasing file "/nonexistent/.sge_aliases": Permission denied\n',
        14,
        "config",
        True,
        True,
    ),
]


@pytest.mark.parametrize(("stderr", "code", "kind", "local", "whole_cell"), REAL_FAILURES)
def test_each_real_failure_has_its_kind(stderr, code, kind, local, whole_cell) -> None:
    command = _failed(stderr, exit_code=code)
    failure = classify(command)
    assert (failure.kind, failure.local) == (kind, local), failure
    assert cell_wide(command) is whole_cell
    # the reason quotes the line that gave it away
    assert any(repr(line.strip())[:30] in failure.reason for line in stderr.splitlines())


def test_qdel_with_the_qmaster_stopped_says_it_on_stdout_and_is_unreachable() -> None:
    command = _failed(
        "error: commlib error: got select error (Connection refused)\n",
        stdout='unable to send message to qmaster using port 48077 on host "vm": got send error\n',
    )
    assert classify(command).kind == "unreachable" and cell_wide(command)
