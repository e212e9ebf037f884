"""Every batch command gridgate knows, once: its token category, the batch opcode it sends its
scheduler, and whether ``gridgate gate --install-shims`` wraps it; and what a token request
made for a command carries: that opcode and a size.

One table for every reader, so that a command is counted alike wherever it is gated: the daemon
maps a request that names no category by it (each opcode falls in its command's category), the
gate and its shims infer a command's category from it, and the LSF backend takes its tokens by
it. Clients keep naming the command (hold limits and ``status`` are by command); the daemon
logs its opcode. The daemon never sees the scheduler request itself, so the size the clients
send is that of what the command carries into it: its arguments, in bytes, as the C ``argv``
strings (each with its NUL). docs/proxyd.md shows the table. It is on the gate's run-time
path, so it imports nothing but ``os``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # on the gate's run-time path: collections.abc costs ~1 ms to import
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

QUERY, SUBMISSION, OTHER = "query", "submission", "other"
CATEGORIES: tuple[str, ...] = (QUERY, SUBMISSION, OTHER)
#: How a request or an admin command may spell a category (``disable sub``), as badmin does.
CATEGORY_WORDS: dict[str, str] = {
    "all": "all",
    QUERY: QUERY,
    "sub": SUBMISSION,
    SUBMISSION: SUBMISSION,
    OTHER: OTHER,
}


class Command:
    """One row of :data:`COMMANDS`: the command's category, the opcode of the request it sends
    (``""``: none named here) and whether ``--install-shims`` wraps it when it is on PATH."""

    __slots__ = ("category", "opcode", "shim")

    def __init__(self, category: str, opcode: str = "", shim: bool = False) -> None:
        self.category = category
        self.opcode = opcode
        self.shim = shim


#: command -> its row; a command not listed is ``other``. The shims are written in this order.
#: LSF opcodes as in the seed's log where it shows them (BATCH_JOB_QUERY, BATCH_HOST_INFO,
#: BATCH_JOB_SUB, BATCH_REMOVE_RSV), the others after lsbatch.h; Slurm's after
#: slurm_protocol_defs.h (sacct asks slurmdbd); ARC's the A-REX REST request each client
#: command makes (arc.md section 3).
COMMANDS: dict[str, Command] = {
    # LSF queries
    "bjobs": Command(QUERY, "BATCH_JOB_QUERY", shim=True),
    "bhosts": Command(QUERY, "BATCH_HOST_INFO", shim=True),
    "bqueues": Command(QUERY, "BATCH_QUE_INFO", shim=True),
    "bhist": Command(QUERY, "BATCH_JOB_QUERY", shim=True),
    "busers": Command(QUERY, "BATCH_USER_INFO", shim=True),
    "bugroup": Command(QUERY, "BATCH_GRP_INFO"),
    "bmgroup": Command(QUERY, "BATCH_GRP_INFO"),
    "bparams": Command(QUERY, "BATCH_PARAM_INFO"),
    "bpeek": Command(QUERY, "BATCH_JOB_PEEK"),
    "bresources": Command(QUERY, "BATCH_RESOURCE_INFO"),
    "brsvs": Command(QUERY, "BATCH_RSV_INFO"),
    "bapp": Command(QUERY, "BATCH_APP_INFO"),
    "bsla": Command(QUERY, "BATCH_SLA_INFO"),
    "blimits": Command(QUERY, "BATCH_LIMIT_INFO"),
    "bjgroup": Command(QUERY, "BATCH_JGRP_INFO"),
    "bread": Command(QUERY, "BATCH_JOB_MSG_INFO"),
    # LSF submission
    "bsub": Command(SUBMISSION, "BATCH_JOB_SUB", shim=True),
    "bmod": Command(SUBMISSION, "BATCH_JOB_MODIFY", shim=True),
    "bswitch": Command(SUBMISSION, "BATCH_JOB_SWITCH", shim=True),
    "brestart": Command(SUBMISSION, "BATCH_JOB_RESTART", shim=True),
    # LSF other
    "bkill": Command(OTHER, "BATCH_JOB_SIG"),
    "bstop": Command(OTHER, "BATCH_JOB_SIG"),
    "bresume": Command(OTHER, "BATCH_JOB_SIG"),
    "brequeue": Command(OTHER, "BATCH_JOB_REQUEUE"),
    "bmig": Command(OTHER, "BATCH_JOB_MIG"),
    "btop": Command(OTHER, "BATCH_JOB_MOVE"),
    "bbot": Command(OTHER, "BATCH_JOB_MOVE"),
    "brun": Command(OTHER, "BATCH_JOB_FORCE"),
    "bpost": Command(OTHER, "BATCH_JOB_MSG_POST"),
    "brsvadd": Command(OTHER, "BATCH_RSV_ADD"),
    "brsvdel": Command(OTHER, "BATCH_REMOVE_RSV"),
    "brsvmod": Command(OTHER, "BATCH_RSV_MOD"),
    # Slurm
    "squeue": Command(QUERY, "REQUEST_JOB_INFO", shim=True),
    "sinfo": Command(QUERY, "REQUEST_NODE_INFO", shim=True),
    "sacct": Command(QUERY, "DBD_GET_JOBS_COND", shim=True),
    "sstat": Command(QUERY, "REQUEST_JOB_STEP_STAT", shim=True),
    "sprio": Command(QUERY, "REQUEST_PRIORITY_FACTORS", shim=True),
    "sshare": Command(QUERY, "REQUEST_SHARE_INFO", shim=True),
    "sdiag": Command(QUERY, "REQUEST_STATS_INFO", shim=True),
    "sbatch": Command(SUBMISSION, "REQUEST_SUBMIT_BATCH_JOB", shim=True),
    "srun": Command(SUBMISSION, "REQUEST_RESOURCE_ALLOCATION", shim=True),
    "salloc": Command(SUBMISSION, "REQUEST_RESOURCE_ALLOCATION", shim=True),
    "scancel": Command(OTHER, "REQUEST_KILL_JOB", shim=True),
    "scontrol": Command(OTHER, "REQUEST_UPDATE_JOB", shim=True),
    # HTCondor
    "condor_q": Command(QUERY, shim=True),
    "condor_status": Command(QUERY, shim=True),
    "condor_submit": Command(SUBMISSION, shim=True),
    "condor_history": Command(QUERY),
    # Grid Engine
    "qstat": Command(QUERY, shim=True),
    "qsub": Command(SUBMISSION, shim=True),
    # ARC's client: each command is a round trip to the CE's A-REX (arc.md section 7)
    "arcsub": Command(SUBMISSION, "ARC_JOB_NEW", shim=True),
    "arcresub": Command(SUBMISSION, "ARC_JOB_NEW", shim=True),
    "arcstat": Command(QUERY, "ARC_JOB_INFO", shim=True),
    "arcinfo": Command(QUERY, "ARC_INFO", shim=True),
    "arckill": Command(OTHER, "ARC_JOB_KILL", shim=True),
    "arcclean": Command(OTHER, "ARC_JOB_CLEAN", shim=True),
    "arcget": Command(OTHER, "ARC_JOB_GET", shim=True),
    "arcsync": Command(OTHER, "ARC_JOB_LIST", shim=True),
    "arcrenew": Command(OTHER, "ARC_DELEGATION_RENEW", shim=True),
}
#: Commands whose row depends on their first word that is not an option: ``scontrol show
#: job 12`` only reads (and asks for job info), ``scontrol update ...`` changes the cluster.
BY_FIRST_WORD: dict[str, dict[str, Command]] = {
    "scontrol": {"show": Command(QUERY, "REQUEST_JOB_INFO")},
}

#: command -> the request it sends, for the diagnostic log.
COMMAND_OPCODES: dict[str, str] = {name: row.opcode for name, row in COMMANDS.items() if row.opcode}
#: Commands ``--install-shims`` writes a wrapper for when they are on PATH.
SHIM_COMMANDS: tuple[str, ...] = tuple(name for name, row in COMMANDS.items() if row.shim)
#: Commands that copy the environment into the jobs they create: the submission commands.
SUBMITTING = frozenset(name for name, row in COMMANDS.items() if row.category == SUBMISSION)


def category_map(extra: Mapping[str, Sequence[str]] | None = None) -> dict[str, str]:
    """Command or opcode name -> category: the table, each opcode in its command's category,
    then ``extra`` (the config's ``categories``), which wins."""
    mapping = {name: row.category for name, row in COMMANDS.items()}
    for row in COMMANDS.values():
        if row.opcode:
            mapping.setdefault(row.opcode, row.category)
    for category, names in (extra or {}).items():
        for name in names:
            mapping[name] = category
    return mapping


def category_of(name: str, mapping: Mapping[str, str] | None = None) -> str:
    """The category of a command (``bjobs``, ``/usr/bin/bsub``) or opcode; default ``other``."""
    mapping = mapping if mapping is not None else category_map()
    base = os.path.basename(name)
    return mapping.get(base) or mapping.get(name) or OTHER


def by_first_word(name: str, args: Sequence[str]) -> Command | None:
    """The row of ``name args`` in :data:`BY_FIRST_WORD`, if its first word picks one."""
    rows = BY_FIRST_WORD.get(name)
    if not rows:
        return None
    return rows.get(next((a for a in args if not a.startswith("-")), ""))


def opcode_of(name: str, query: bool = False) -> str:
    """The batch opcode of command ``name`` (a path is fine), for the diagnostic log; the name
    itself when it is not in the table (so an opcode stays itself). ``query``: the request
    came as a query (``scontrol show ...``, which the gate counts as one)."""
    base = os.path.basename(name)
    if query:  # the word that made it a query named its request too
        for row in BY_FIRST_WORD.get(base, {}).values():
            if row.category == QUERY:
                return row.opcode
    return COMMAND_OPCODES.get(base, base)


def request_size(argv: Sequence[str]) -> int:
    """The size of a token request made for ``argv``: its arguments in bytes, each with its
    NUL, as the C ``argv`` strings the command carries into its scheduler request."""
    return sum(len(arg.encode("utf-8", "surrogateescape")) + 1 for arg in argv)
