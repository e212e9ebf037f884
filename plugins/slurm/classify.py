"""What a failed Slurm client command means, from the texts Slurm 22.05 prints.

The lines quoted in the comments were printed by the real commands on the private cluster the
tests start (docs/slurm.md lists them with their timings); the few marked [src] come from
Slurm's own error strings (formats.md) and were not produced here. The kinds carry the
meanings of the catalogue (gridgate.core.kinds): ``config`` the site's configuration names a
partition, account or script that does not exist; ``usage`` the job asks for something the
cluster will never accept; ``drained`` the partition does not take jobs now;
``unreachable`` the controller cannot be contacted; ``overload`` the controller is busy or the
user is at a limit; ``timeout`` no answer in time; ``auth`` not allowed.
"""

from __future__ import annotations

import re

from gridgate.core.model import CommandResult, Failure
from gridgate.core.patterns import Pattern, PatternTable, clip

__all__ = ["CLUSTER", "PATTERNS", "TABLE", "classify", "clip", "cluster_wide", "match"]

#: The tag of a pattern that affects the whole cluster (every partition of it), not only
#: the partition that met it.
CLUSTER = frozenset({"cluster"})

#: Order matters: the first pattern found in the output decides.
PATTERNS: tuple[Pattern, ...] = (
    # sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)
    # slurm_load_jobs error: Unable to contact slurm controller (connect failure)   (~9 s)
    Pattern(
        "unreachable",
        re.compile(r"Unable to contact slurm controller"),
        "the Slurm controller cannot be contacted",
        tags=CLUSTER,
    ),
    # sbatch: error: 'c1' can't be reached now, or it is an invalid entry for --cluster. ...
    Pattern(
        "unreachable",
        re.compile(
            r"can't be reached now, or it is an invalid entry for "
            r"--cluster|Problem talking to (?:the )?database"
        ),
        "the cluster named with --clusters cannot be reached (slurmdbd)",
        tags=CLUSTER,
    ),
    # sbatch: error: Batch job submission failed: Socket timed out on send/recv operation  (~10 s)
    # The controller took the connection but did not answer within MessageTimeout; the job
    # may have been queued anyway (formats.md), so the next submission must not assume not.
    Pattern(
        "timeout",
        re.compile(r"Socket timed out on send/recv operation"),
        "the Slurm controller did not answer in time (the job may have been queued anyway)",
    ),
    # sbatch: error: Batch job submission failed: Required partition not available (inactive or drain)
    Pattern(
        "drained",
        re.compile(r"Required partition not available"),
        "the partition is INACTIVE or DRAIN",
        notify=False,
    ),
    # sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying  (MaxJobCount
    # reached; sbatch retries until killed). [src] Slurm job queue full, sleeping and retrying
    Pattern(
        "overload",
        re.compile(
            r"Slurm job queue full|temporarily unable to accept job|"
            r"Job creation temporarily disabled"
        ),
        "the Slurm controller does not take jobs now",
        notify=False,
    ),
    # [src] Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)
    Pattern(
        "overload",
        re.compile(
            r"Job violates accounting/QOS policy|"
            r"MaxSubmitJob|QOSMax\w*Limit|AssocMax\w*Limit"
        ),
        "this user is at a submission limit",
        notify=False,
    ),
    # sbatch: error: invalid partition specified: nope
    # sbatch: error: Batch job submission failed: Invalid partition name specified
    Pattern(
        "config",
        re.compile(r"Invalid partition name specified|invalid partition specified"),
        "the partition does not exist",
        transient=False,
    ),
    # Requested time limit is invalid (missing or exceeds some limit) / Node count specification
    # invalid / More processors requested than permitted / Requested node configuration is not
    # available (after "Memory specification can not be satisfied")
    Pattern(
        "usage",
        re.compile(
            r"Requested time limit is invalid|Node count specification invalid|"
            r"More processors requested than permitted|Requested node configuration is not available|"
            r"Memory specification can not be satisfied"
        ),
        "the job asks for more than the partition allows",
        transient=False,
    ),
    # [src]
    Pattern(
        "config",
        re.compile(r"Invalid account|Invalid qos specification"),
        "the configured account or QOS does not exist",
        transient=False,
    ),
    # [src]
    Pattern(
        "auth",
        re.compile(
            r"Access/permission denied|Invalid user id|"
            r"Protocol authentication error"
        ),
        "Slurm refused this user or could not authenticate it (munge)",
        transient=False,
    ),
    # sbatch: error: Unable to open file /path/pilot.sh
    Pattern(
        "missing_input",
        re.compile(r"Unable to open file"),
        "the pilot script cannot be read on this machine",
        transient=False,
        local=True,
    ),  # this machine's file
    # sbatch: error: This does not look like a batch script.  The first
    Pattern(
        "config",
        re.compile(r"This does not look like a batch script"),
        "the pilot script is no batch script (its first line is no #! line)",
        transient=False,
        local=True,
    ),  # this machine's file
    # sbatch: unrecognized option '--bogus'   (exit 255)
    Pattern(
        "usage",
        re.compile(
            r"unrecognized option|invalid option|"
            r"Try \"\w+ --help\" for more information"
        ),
        "the command line is wrong",
        transient=False,
    ),
)


TABLE = PatternTable(PATTERNS)


def match(command: CommandResult) -> tuple[Pattern, str] | None:
    """The first known pattern in what ``command`` printed, with the line that matched."""
    return TABLE.match_output(command)


def classify(command: CommandResult | None, message: str = "") -> Failure:
    """What a failed Slurm command means (``command`` None: nothing was run)."""
    return TABLE.classify(command, message)


def cluster_wide(command: CommandResult | None) -> bool:
    """True when the failure says the whole cluster is out of reach, not one partition."""
    if command is None or command.launch_error is not None:
        return False
    found = match(command)
    return found is not None and found[0].tags >= CLUSTER
