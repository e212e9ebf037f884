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
from dataclasses import dataclass

from gridgate.core.kinds import KINDS
from gridgate.core.model import CommandResult, Failure

_MAX_QUOTE = 200


@dataclass(frozen=True)
class Pattern:
    """A line Slurm prints and what it means."""

    kind: str
    regex: re.Pattern[str]
    label: str
    exclude: bool = True
    notify: bool = True
    transient: bool = True
    #: the whole cluster (every partition of it) is affected, not only this partition
    cluster_wide: bool = False
    local: bool = False


#: Order matters: the first pattern found in the output decides.
PATTERNS: tuple[Pattern, ...] = (
    # sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)
    # slurm_load_jobs error: Unable to contact slurm controller (connect failure)   (~9 s)
    Pattern(
        "unreachable",
        re.compile(r"Unable to contact slurm controller"),
        "the Slurm controller cannot be contacted",
        cluster_wide=True,
    ),
    # sbatch: error: 'c1' can't be reached now, or it is an invalid entry for --cluster. ...
    Pattern(
        "unreachable",
        re.compile(
            r"can't be reached now, or it is an invalid entry for "
            r"--cluster|Problem talking to (?:the )?database"
        ),
        "the cluster named with --clusters cannot be reached (slurmdbd)",
        cluster_wide=True,
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
    # sbatch: error: This does not look like a batch script.  The first
    Pattern(
        "config",
        re.compile(r"Unable to open file|This does not look like a batch script"),
        "the pilot script cannot be read on this machine",
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


def clip(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= _MAX_QUOTE else line[: _MAX_QUOTE - 3] + "..."


def match(command: CommandResult) -> tuple[Pattern, str] | None:
    """The first known pattern in what ``command`` printed, with the line that matched."""
    text = f"{command.stderr}\n{command.stdout}"
    for pattern in PATTERNS:
        for line in text.splitlines():
            if pattern.regex.search(line):
                return pattern, line.strip()
    return None


def classify(command: CommandResult | None, message: str = "") -> Failure:
    """What a failed Slurm command means (``command`` None: nothing was run)."""
    if command is None:
        # nothing ran, so no partition is to blame: it stays in rotation
        return KINDS["config"].failure(clip(message or "nothing was run"), exclude=False)
    if command.launch_error is not None:
        return KINDS["launch"].failure(
            clip(f"could not start {command.argv[0]}: {command.launch_error}")
        )
    found = match(command)
    if found is not None:
        pattern, line = found
        return KINDS[pattern.kind].failure(
            clip(f"{pattern.label}: {line!r}"),
            exclude=pattern.exclude,
            notify=pattern.notify,
            transient=pattern.transient,
            local=pattern.local,
        )
    if command.timed_out:
        return KINDS["timeout"].failure(f"timed out after {command.duration:.1f} s and was killed")
    if command.returncode == 0:
        return KINDS["bad_output"].failure("exit 0 but no job id in the output")
    said = next(
        (ln.strip() for ln in f"{command.stderr}\n{command.stdout}".splitlines() if ln.strip()),
        "no output",
    )
    return KINDS["error"].failure(clip(f"exit code {command.returncode}: {said!r}"))


def cluster_wide(command: CommandResult | None) -> bool:
    """True when the failure says the whole cluster is out of reach, not one partition."""
    if command is None or command.launch_error is not None:
        return False
    found = match(command)
    return found is not None and found[0].cluster_wide
