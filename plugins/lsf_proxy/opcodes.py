"""The request a gated command makes of its scheduler, as the diagnostic log names it: a batch
opcode (LSF's ``BATCH_JOB_QUERY`` for ``bjobs``..., Slurm's RPC for ``squeue``...) and a size.

Clients keep naming the command (hold limits and ``status`` are by command); the daemon logs
its opcode. The daemon never sees the scheduler request itself, so the size the clients send
is that of what the command carries into it: its arguments, in bytes, as the C ``argv``
strings (each with its NUL). docs/proxyd.md has the table.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # on the gate's run-time path: collections.abc costs ~1 ms to import
if TYPE_CHECKING:
    from collections.abc import Sequence

#: command -> the request it sends. LSF names as in the seed's log where it shows them
#: (BATCH_JOB_QUERY, BATCH_HOST_INFO, BATCH_JOB_SUB, BATCH_REMOVE_RSV), the others after
#: lsbatch.h; Slurm's after slurm_protocol_defs.h (sacct asks slurmdbd).
COMMAND_OPCODES: dict[str, str] = {
    # LSF queries
    "bjobs": "BATCH_JOB_QUERY",
    "bhosts": "BATCH_HOST_INFO",
    "bqueues": "BATCH_QUE_INFO",
    "busers": "BATCH_USER_INFO",
    "bugroup": "BATCH_GRP_INFO",
    "bmgroup": "BATCH_GRP_INFO",
    "bparams": "BATCH_PARAM_INFO",
    "bpeek": "BATCH_JOB_PEEK",
    "bresources": "BATCH_RESOURCE_INFO",
    "brsvs": "BATCH_RSV_INFO",
    "bapp": "BATCH_APP_INFO",
    "bsla": "BATCH_SLA_INFO",
    "blimits": "BATCH_LIMIT_INFO",
    "bjgroup": "BATCH_JGRP_INFO",
    "bhist": "BATCH_JOB_QUERY",
    "bread": "BATCH_JOB_MSG_INFO",
    # LSF submission
    "bsub": "BATCH_JOB_SUB",
    "brestart": "BATCH_JOB_RESTART",
    "bmod": "BATCH_JOB_MODIFY",
    "bswitch": "BATCH_JOB_SWITCH",
    # LSF other
    "bkill": "BATCH_JOB_SIG",
    "bstop": "BATCH_JOB_SIG",
    "bresume": "BATCH_JOB_SIG",
    "brequeue": "BATCH_JOB_REQUEUE",
    "bmig": "BATCH_JOB_MIG",
    "btop": "BATCH_JOB_MOVE",
    "bbot": "BATCH_JOB_MOVE",
    "brun": "BATCH_JOB_FORCE",
    "bpost": "BATCH_JOB_MSG_POST",
    "brsvadd": "BATCH_RSV_ADD",
    "brsvdel": "BATCH_REMOVE_RSV",
    "brsvmod": "BATCH_RSV_MOD",
    # Slurm
    "squeue": "REQUEST_JOB_INFO",
    "sinfo": "REQUEST_NODE_INFO",
    "sacct": "DBD_GET_JOBS_COND",
    "sstat": "REQUEST_JOB_STEP_STAT",
    "sprio": "REQUEST_PRIORITY_FACTORS",
    "sshare": "REQUEST_SHARE_INFO",
    "sdiag": "REQUEST_STATS_INFO",
    "sbatch": "REQUEST_SUBMIT_BATCH_JOB",
    "salloc": "REQUEST_RESOURCE_ALLOCATION",
    "srun": "REQUEST_RESOURCE_ALLOCATION",
    "scancel": "REQUEST_KILL_JOB",
    "scontrol": "REQUEST_UPDATE_JOB",
    # ARC: the A-REX REST request each client command makes (arc.md section 3)
    "arcsub": "ARC_JOB_NEW",
    "arcresub": "ARC_JOB_NEW",
    "arcstat": "ARC_JOB_INFO",
    "arcinfo": "ARC_INFO",
    "arckill": "ARC_JOB_KILL",
    "arcclean": "ARC_JOB_CLEAN",
    "arcget": "ARC_JOB_GET",
    "arcsync": "ARC_JOB_LIST",
    "arcrenew": "ARC_DELEGATION_RENEW",
}


def opcode_of(name: str, query: bool = False) -> str:
    """The batch opcode of command ``name`` (a path is fine), for the diagnostic log; the name
    itself when it is not in the table (so an opcode stays itself). ``query``: the request
    came as a query (``scontrol show ...``, which the gate counts as one)."""
    base = os.path.basename(name)
    if base == "scontrol" and query:
        return "REQUEST_JOB_INFO"
    return COMMAND_OPCODES.get(base, base)


def request_size(argv: Sequence[str]) -> int:
    """The size of a token request made for ``argv``: its arguments in bytes, each with its
    NUL, as the C ``argv`` strings the command carries into its scheduler request."""
    return sum(len(arg.encode("utf-8", "surrogateescape")) + 1 for arg in argv)
