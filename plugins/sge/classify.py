"""What a failed Grid Engine client command means, from the texts SGE 8.1.9 prints.

The lines quoted in the comments were printed by the real commands on the private cell the
tests start (docs/sge.md lists them with their timings). The kinds carry the catalogue's
meanings (gridgate.core.kinds): ``unreachable`` the qmaster cannot be contacted; ``config``
the site's configuration names a queue, parallel environment or script that does not exist;
``usage`` the job asks for something the cell refuses (an unknown resource, a bad option);
``overload`` the user or the cell is at its job limit; ``auth`` this user, or this host, may
not submit.
"""

from __future__ import annotations

import re

from gridgate.core.model import CommandResult, Failure
from gridgate.core.patterns import Pattern, PatternTable, clip

__all__ = ["CELL", "PATTERNS", "TABLE", "cell_wide", "classify", "clip", "match"]

#: The tag of a pattern that affects the whole cell (every queue of it), not only the queue
#: that met it: one qmaster serves every queue.
CELL = frozenset({"cell"})

#: Order matters: the first pattern found in the output decides. The quotes are what the real
#: commands printed on the private cell (exit code, time); [src] marks texts taken from SGE's
#: own message strings (``strings /usr/lib/gridengine/sge_qmaster``) that were not produced here.
PATTERNS: tuple[Pattern, ...] = (
    # qsub, qstat, qdel with the qmaster stopped (exit 1, 0.01 s):
    #   error: commlib error: got select error (Connection refused)
    #   Unable to run job: unable to send message to qmaster using port 48077 on host "vm": ...
    Pattern(
        "unreachable",
        re.compile(
            r"unable to (?:contact|send message to) qmaster|"
            r"commlib error: (?:got select error|can't connect)"
        ),
        "the Grid Engine qmaster cannot be contacted",
        tags=CELL,
    ),
    # [src] can't open "%s" for reading qmaster hostname   (SGE_ROOT/SGE_CELL of no cell)
    Pattern(
        "config",
        re.compile(r"for reading qmaster hostname|can't read qmaster hostname"),
        "this machine's SGE_ROOT / SGE_CELL do not lead to a cell (act_qmaster)",
        transient=False,
        local=True,
        tags=CELL,
    ),
    # qsub: can't read path aliasing file "/nonexistent/.sge_aliases": Permission denied  (14)
    # (the submitting user's home exists but it may not read it)
    Pattern(
        "config",
        re.compile(r"can't read path aliasing file"),
        "qsub cannot read the submitting user's ~/.sge_aliases (its home folder)",
        transient=False,
        local=True,
        tags=CELL,
    ),
    # Unable to run job: job rejected: your user id 0 is lower than minimum user id 100 of
    # cluster configuration   (exit 1: root submitting, min_uid)
    Pattern(
        "auth",
        re.compile(r"your (?:user|group) id \d+ is lower than minimum (?:user|group) id"),
        "the cell refuses this user (min_uid / min_gid): run the director as an ordinary account",
        transient=False,
        local=True,
        tags=CELL,
    ),
    # Unable to run job: job rejected: cloudsdk@vm is not allowed to submit jobs   (exit 1:
    # the global user_lists / xuser_lists); [src] denied: host "%s" is not a submit host
    Pattern(
        "auth",
        re.compile(r"is not allowed to submit jobs|is not a submit host"),
        "this user or host may not submit to the cell (user_lists, xuser_lists, submit hosts)",
        transient=False,
        tags=CELL,
    ),
    # [src] job rejected: the user "%s" does not exist / no access to project "%s" for user
    Pattern(
        "auth",
        re.compile(r'job rejected: the user "[^"]*" does not exist|no access to project'),
        "Grid Engine refused this user (unknown to the qmaster, or not in the project)",
        transient=False,
    ),
    # Unable to run job: job rejected: only 2 jobs are allowed per user (current job count:
    # 10)   (exit 25: max_u_jobs); [src] only %u jobs are allowed per cluster (max_jobs)
    Pattern(
        "overload",
        re.compile(r"jobs are allowed per (?:user|cluster)"),
        "this user (max_u_jobs) or the cell (max_jobs) is at its job limit",
        notify=False,
        tags=CELL,
    ),
    # Unable to run job: Job was rejected because job requests unknown queue "nope.q"  (exit 1)
    Pattern(
        "config",
        re.compile(r"job requests unknown queue"),
        "the queue does not exist",
        transient=False,
    ),
    # Unable to run job: job rejected: the requested parallel environment "nope" does not exist
    Pattern(
        "config",
        re.compile(r"the requested parallel environment .* does not exist"),
        "the parallel environment (resources.parallel_environment) does not exist",
        transient=False,
    ),
    # Unable to run job: error: no suitable queues   (qsub -w e: no queue instance may ever run
    # it: the queue's access list, more slots than it has, a resource limit)
    Pattern(
        "usage",
        re.compile(r"no suitable queues"),
        "no instance of the queue can ever run this job (access lists, slots, limits)",
        transient=False,
    ),
    # Unable to run job: attribute "h_rt" is not a time value   (-l h_rt=bogus)
    # Unable to run job: job rejected: 0 is an invalid task id   (-t 0-3)
    Pattern(
        "usage",
        re.compile(r'attribute "[^"]*" is not an? \w+ value|is an invalid task id'),
        "the command line gives a value Grid Engine cannot read",
        transient=False,
    ),
    # Unable to run job: unknown resource "bogus"
    # Unable to run job: job rejected: you tried to submit a job with more than 75000 tasks
    Pattern(
        "usage",
        re.compile(r'unknown resource "|you tried to submit a job with more than \d+ tasks'),
        "the job asks for resources the cell does not have",
        transient=False,
    ),
    # Unable to read script file because of error: error opening /x.sh: No such file or
    # directory   (exit 14)
    Pattern(
        "missing_input",
        re.compile(r"Unable to read script file"),
        "the pilot script cannot be read on this machine",
        transient=False,
        local=True,
    ),
    # qsub: invalid option argument "-bogus"   (exit 2)
    # qsub: argument to -N option must not contain /   (exit 2)
    Pattern(
        "usage",
        re.compile(r"invalid option argument|argument to -\w+ option must|ERROR! "),
        "the command line is wrong",
        transient=False,
    ),
)


TABLE = PatternTable(PATTERNS)


def match(command: CommandResult) -> tuple[Pattern, str] | None:
    """The first known pattern in what ``command`` printed, with the line that matched."""
    return TABLE.match_output(command)


def classify(command: CommandResult | None, message: str = "") -> Failure:
    """What a failed Grid Engine command means (``command`` None: nothing was run)."""
    return TABLE.classify(command, message)


def cell_wide(command: CommandResult | None) -> bool:
    """True when the failure says the whole cell is out of reach, not one queue."""
    if command is None or command.launch_error is not None:
        return False
    found = match(command)
    return found is not None and found[0].tags >= CELL
