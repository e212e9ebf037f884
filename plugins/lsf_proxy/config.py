"""The ``proxyd:`` config section: its schema, the LSF ``PROXYD_POLICIES`` parser and limit rules.

The seed's rules for a category: ``max`` defaults to 100, but to ``nominal`` when only nominal
is given and it exceeds 100; ``nominal`` defaults to 50, but to ``max`` when only max is given
and it is below 50; ``nominal > max`` and non-positive values are errors naming the field.
Several daemons split ``max`` and ``nominal`` evenly, the remainder going to the first ones.
"""

from __future__ import annotations

import copy
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridgate.core.secrets import SECRET_SCHEMA
from gridgate.plugins.lsf_proxy.commands import CATEGORIES

#: How the LSF policy string and the status table spell each category.
LSF_NAMES: dict[str, str] = {"query": "QUERY", "submission": "SUBMISSION", "other": "OTHER"}

DEFAULT_MAX = 100
DEFAULT_NOMINAL = 50
DEFAULT_THROTTLE_MS = 1

#: The longest waits and holds a config may give, in seconds: far beyond any use, far below
#: what a socket timeout, ``poll`` or a timer can take (about 9.2e9 s; a bigger value, or
#: ``.inf``, used to validate and then end every waiting gate in ``OverflowError``).
MAX_WAIT = 86400
MAX_HOLD = 7 * 86400
MAX_THROTTLE_MS = 3_600_000
MAX_PERIOD = 10_000_000  # a metrics period: only arithmetic, but not without end

_LIMIT_PROPS: dict[str, Any] = {
    "max": {
        "type": "integer",
        "description": "Most tokens in use for ordinary users (default 100).",
    },
    "nominal": {
        "type": "integer",
        "description": "Below this many tokens in use, grant at once (default 50).",
    },
    "throttle": {
        "type": "integer",
        "maximum": MAX_THROTTLE_MS,
        "description": "Milliseconds between grants from nominal up (default 1).",
    },
    "user_max": {
        "type": "integer",
        "description": "Most tokens one ordinary user may hold at once (default: max, "
        "no cap). Not in LSF: a gridgate extension.",
    },
}
_CATEGORY_LIMITS: dict[str, Any] = {
    "type": "object",
    "properties": _LIMIT_PROPS,
    "additionalProperties": False,
}


_RATE_LIMIT: dict[str, Any] = {
    "type": "object",
    "description": "One category's bucket per user; every key has Slurm's default.",
    "properties": {
        "enable": {
            "type": "boolean",
            "default": True,
            "description": "rl_enable: false keeps the entry but switches it off.",
        },
        "bucket_size": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1_000_000_000,
            "default": 30,
            "description": "rl_bucket_size: requests a user may make in a burst.",
        },
        "refill_rate": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1_000_000_000,
            "default": 2,
            "description": "rl_refill_rate: requests added to the bucket each period.",
        },
        "refill_period": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT,
            "default": 1,
            "description": "rl_refill_period: seconds between refills.",
        },
    },
    "additionalProperties": False,
}


#: What one token covers at the scheduler, per opcode the gate reports (Slurm's RPC names):
#: measured upper bounds on Slurm 22.05 (docs/proxyd.md, "Who went around the gate"):
#: ``squeue -u X -t PD,R`` makes 3 RPCs, ``squeue`` and ``sinfo`` 2, ``scontrol show job``,
#: ``sbatch`` and ``scancel`` 1 each.
BYPASS_COSTS: dict[str, float] = {
    "REQUEST_JOB_INFO": 3,
    "REQUEST_NODE_INFO": 2,
    "REQUEST_SUBMIT_BATCH_JOB": 1,
    "REQUEST_KILL_JOB": 1,
    "REQUEST_UPDATE_JOB": 1,
    "REQUEST_STATS_INFO": 1,
}
#: A duration: seconds, or a number with s, m, h or d.
DURATION_PATTERN = r"^[0-9]+(\.[0-9]+)?[smhd]?$"

BYPASS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "default": {},
    "description": "Who went around the gate: compare what the scheduler served each user "
    'with the tokens it was given (docs/proxyd.md, "Who went around the gate").',
    "properties": {
        "scheduler": {
            "type": ["string", "null"],
            "minLength": 1,
            "default": None,
            "description": "The gridgate.schedulers plugin to audit (slurm); null: no audit.",
        },
        "scheduler_options": {
            "type": "object",
            "default": {},
            "description": "The scheduler plugin's own settings (commands, env, partitions).",
        },
        "audit": {
            "type": "object",
            "default": {},
            "additionalProperties": False,
            "properties": {
                "interval": {
                    "type": "number",
                    "minimum": 1,
                    "maximum": MAX_WAIT,
                    "default": 10,
                    "description": "Seconds between two reads of the scheduler's counters.",
                },
                "costs": {
                    "type": "object",
                    "default": {},
                    "additionalProperties": {"type": "number", "minimum": 0},
                    "description": "RPCs one token of an opcode (or command) covers, over "
                    "the built-in upper bounds.",
                },
                "default_cost": {
                    "type": "number",
                    "minimum": 0,
                    "default": 3,
                    "description": "RPCs a token of an opcode not in costs covers.",
                },
                "tolerance": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 5,
                    "description": "RPCs per user and window not held against anyone.",
                },
                "timeout": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": MAX_WAIT,
                    "default": 10,
                    "description": "Seconds a read or change of the scheduler may take.",
                },
            },
        },
        "action": {
            "enum": ["report", "block", "deny_partition"],
            "default": "report",
            "description": "report: a warning per user and window and the metric; block: "
            "also on the blocklist of every daemon of the service for `for`; deny_partition: "
            "also out of the "
            "scheduler's partitions for `for`.",
        },
        "for": {
            "type": ["number", "string"],
            "pattern": DURATION_PATTERN,
            "minimum": 1,
            "default": "1h",
            "description": "How long block and deny_partition last (seconds, or 30m, 1h, 1d).",
        },
        "notify_after": {
            "type": "integer",
            "minimum": 1,
            "default": 3,
            "description": "Windows in a row after which a bypasser is told as an error.",
        },
        "exempt": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "default": ["slurm"],
            "description": "Users never audited beside root, the admins and privileged "
            "(the scheduler's own account: SlurmUser).",
        },
    },
    "additionalProperties": False,
}


# Defaults filled all the way down, as the config loader fills them: a daemon's section then
# equals section_defaults() when the file says nothing of bypass (a reload compares the two)
BYPASS_SCHEMA["properties"]["audit"]["default"] = {
    k: v["default"] for k, v in BYPASS_SCHEMA["properties"]["audit"]["properties"].items()
}
BYPASS_SCHEMA["default"] = {k: v["default"] for k, v in BYPASS_SCHEMA["properties"].items()}


#: ``proxyd.adaptive.<category>.source``: what each source reads, through which scheduler
#: plugin (its options are ``proxyd.bypass.scheduler_options``); "" for none: ``tokens`` is the
#: daemon's own measure, how long the category's tokens are held.
TOKENS = "tokens"
ADAPTIVE_SOURCES = {"sdiag": "slurm", TOKENS: ""}
#: keys of an adaptive entry that only a scheduler's statistics can answer
SCHEDULER_ONLY = ("rpc_types", "max_server_threads", "max_agent_queue")

ADAPTIVE_ENTRY: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "Lower the category's max while the controller is slow, raise it again "
    "as it recovers (AIMD; docs/proxyd.md, 'Limits that follow the scheduler').",
    "properties": {
        "source": {
            "enum": sorted(ADAPTIVE_SOURCES),
            "default": "sdiag",
            "description": "Where the latency is read. sdiag: Slurm's own average time "
            "per RPC type of the category (the controller's latency). tokens: the median time "
            "the category's tokens were held (what a gated command takes, the controller's "
            "service in it), measured by the daemon for any scheduler.",
        },
        "target_ms": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT * 1000,
            "default": 50,
            "description": "The latency (sdiag: the controller's average time for the "
            "category's RPC types; tokens: the median hold time) above which the max is "
            "lowered.",
        },
        "min": {"type": "integer", "minimum": 1, "default": 1, "description": "Lowest max."},
        "max": {
            "type": "integer",
            "minimum": 1,
            "default": 32,
            "description": "Highest max (never above the category's max in policies).",
        },
        "interval": {
            "type": "number",
            "minimum": 1,
            "maximum": MAX_WAIT,
            "default": 5,
            "description": "Seconds between two decisions.",
        },
        "rpc_types": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "default": [],
            "description": "The RPC types whose time counts (default: those the category's "
            "commands make).",
        },
        "min_requests": {
            "type": "integer",
            "minimum": 1,
            "default": 5,
            "description": "Fewer of those RPCs (tokens returned, for source tokens) in "
            "an interval is no signal: the max stays.",
        },
        "backoff": {
            "type": "number",
            "exclusiveMinimum": 0,
            "exclusiveMaximum": 1,
            "default": 0.75,
            "description": "The max is multiplied by this when the controller is slow, or "
            "by target / latency when that is lower (far over the target, a steeper cut).",
        },
        "grow_after": {
            "type": "integer",
            "minimum": 1,
            "default": 1,
            "description": "Intervals in a row within the target before the max grows by "
            "one (1: every interval, classic AIMD; more: probes for room less often, each "
            "probe costing the users a slow interval).",
        },
        "reserve": {
            "type": "integer",
            "minimum": 0,
            "default": 1,
            "description": "Tokens of the adaptive max that no one ordinary user may take: "
            "one user holds at most max - reserve (and never more than its user_max), so a "
            "user who arrives while another floods finds a token free. 0: no reserve.",
        },
        "light_window": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "default": None,
            "description": "source tokens: also watch what light users get. The median "
            "hold of the tokens of users who were not busy (busy_after) returned in the last "
            "light_window seconds (3 or more of them) is a latency beside the interval's: "
            "the max is cut when either is over the target. A flood's own commands, niced, "
            "may come back within the target while a light user's are slower (measured: "
            "docs/performance.md). null: the interval's median only.",
        },
        "max_server_threads": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "Also slow when sdiag's server thread count is above this.",
        },
        "max_agent_queue": {
            "type": ["integer", "null"],
            "minimum": 0,
            "default": None,
            "description": "Also slow when sdiag's agent queue is longer than this.",
        },
    },
}
ADAPTIVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "default": {},
    "additionalProperties": False,
    "description": "Limits that follow the scheduler: per category, a max the daemon "
    "lowers and raises from the controller's own latency.",
    "properties": {c: ADAPTIVE_ENTRY for c in CATEGORIES},
}


def duration(value: float | str) -> float:
    """Seconds of a ``for`` value (checked by the schema's pattern): 90, "90s", "30m", "1h"."""
    if isinstance(value, int | float):
        return float(value)
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(value[-1:], 1)
    return float(value.rstrip("smhd")) * unit


def _address_schema(description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "description": description}


SECTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The lsfproxyd-style token daemon (gridgate lsfproxyd ...).",
    "properties": {
        "socket": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "",
            "description": "Unix socket path; empty: $XDG_RUNTIME_DIR/gridgate/proxyd.sock "
            "(/run/gridgate/proxyd.sock for root).",
        },
        "socket_mode": {
            "type": "string",
            "pattern": "^0?[0-7]{3}$",
            "default": "0666",
            "description": "Permissions of the Unix socket (octal).",
        },
        "policies": {
            "description": "PROXYD_POLICIES string verbatim, or a mapping per category.",
            "default": "",
            "oneOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "properties": {c: _CATEGORY_LIMITS for c in CATEGORIES},
                    "additionalProperties": False,
                },
            ],
        },
        "max_concurrent_query": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "mbatchd's MAX_CONCURRENT_QUERY (lsb.params), "
            "when the site states it: the QUERY max may "
            "not exceed it, and defaults to it when it is "
            "below 100.",
        },
        "token_wait_time": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT,
            "default": 15,
            "description": "Seconds a request may wait before it is denied.",
        },
        "queue_limit_per_user": {
            "type": "integer",
            "minimum": 1,
            "default": 1000,
            "description": "Waiting requests per user and category; more are refused at once.",
        },
        "lease_time": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_HOLD,
            "default": 300,
            "description": "Seconds a token may be held; an expired lease is "
            "taken back and counted as an error.",
        },
        "hold_limits": {
            "type": "object",
            "default": {},
            "additionalProperties": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_HOLD},
            "description": "Seconds a token may be held, below lease_time: per "
            "category (query, submission, other: every token of "
            "it, whatever command it was taken for) or per "
            "command (opcode); the lowest that applies wins. "
            "The command is the client's word: set the category "
            "for a limit nobody dodges. E.g. {query: 120, squeue: 30}.",
        },
        "busy_after": {
            "type": ["integer", "null"],
            "minimum": 2,
            "default": 4,
            "description": "A user with this many requests of a category in flight "
            "(held and waiting, this one included) is busy: the "
            "gate runs that user's granted commands at busy_nice. "
            "null: never.",
        },
        "busy_nice": {
            "type": "integer",
            "minimum": 1,
            "maximum": 19,
            "default": 10,
            "description": "Gate: the niceness a busy user's gated command runs at "
            "(never lowered; root, admins and add-on hosts: never).",
        },
        "nice_caller": {
            "type": "boolean",
            "default": False,
            "description": "Gate: when a grant names a niceness, also give it to the "
            "process that ran the gated command (the user's loop or script, when it is the "
            "user's own), so that its next commands, their interpreters included, start "
            "niced. Never raises a priority; never as root.",
        },
        "start_only": {
            "type": "object",
            "default": {},
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
            "description": "Gate: commands that take a token to start, not to run, "
            "with the arguments that make them so ([]: always); "
            "added to the built-in srun, salloc, squeue -i, ...",
        },
        "start_hold": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT,
            "default": 2,
            "description": "Gate: seconds a start_only command keeps its token.",
        },
        "sample_period": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_PERIOD,
            "default": 60,
            "description": "Seconds per metrics sample period.",
        },
        "admins": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "default": ["root"],
            "description": "Users allowed admin commands (status, block, heartbeats "
            "between daemons...); also privileged for tokens unless "
            "privileged is given.",
        },
        "privileged": {
            "type": ["array", "null"],
            "items": {"type": "string", "minLength": 1},
            "default": None,
            "description": "Users always served (never paced, but counted), apart "
            "from admin rights: root always; null: root and the "
            "admins (the seed's rule). [root] keeps a service "
            "account that is an admin (for heartbeats) paced, so "
            "that a director in mode: remote is limited.",
        },
        "addon_hosts": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "default": [],
            "description": "Requests from these hosts are privileged (but blockable).",
        },
        "hosts": {
            "type": "array",
            "default": [],
            "description": "Every daemon sharing the limits, this one included, in a fixed order.",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "address": _address_schema("Unix socket path, or host:port for TCP."),
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            },
        },
        "heartbeat_interval": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT,
            "default": 30,
            "description": "Seconds between heartbeats to the other daemons "
            "of hosts (LSF_PROXYD_HEARTBEAT_INTERVAL); a "
            "daemon not heard for 3 intervals, or refusing "
            "connections, is left out of the split.",
        },
        "heartbeat_via": {
            "enum": ["daemons", "state"],
            "default": "daemons",
            "description": "daemons: heartbeats over the daemons' own sockets; "
            "state: a key with a TTL in the site's state store "
            "(the state: section, e.g. the directors' Redis).",
        },
        "rate_limit": {
            "type": "object",
            "default": {},
            "description": "Per-user token buckets per category (as Slurm's rl_*): a user's "
            "requests beyond the rate wait, within token_wait_time, then are "
            "denied. Categories not listed have no rate limit.",
            "properties": {c: _RATE_LIMIT for c in CATEGORIES},
            "additionalProperties": False,
        },
        "name": {
            "type": "string",
            "default": "",
            "description": "This daemon's name in hosts (default: the host name).",
        },
        "tcp": {
            "type": ["string", "null"],
            "default": None,
            "description": "Also listen on host:port; every request must be signed with key.",
        },
        "key": {
            **SECRET_SCHEMA,
            "description": "Shared HMAC key for TCP: {env: ..} or {file: ..}.",
        },
        "max_clock_skew": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT,
            "default": 30,
            "description": "Seconds a signed request's timestamp may be off.",
        },
        "diagnose": {
            "type": "boolean",
            "default": False,
            "description": "Log every request to the diagnostic log.",
        },
        "diagnose_file": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "",
            "description": "Diagnostic log path; empty: info.lsfproxydlog.<host> "
            "next to the socket. Reopened on SIGHUP (log rotation).",
        },
        "persist_blocklist": {
            "type": "boolean",
            "default": False,
            "description": "Keep the blocklist across restarts (LSF does not).",
        },
        "blocklist_file": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "",
            "description": "Where a persisted blocklist lives; empty: next to the socket.",
        },
        "max_line_bytes": {
            "type": "integer",
            "minimum": 256,
            "maximum": 1048576,
            "default": 16384,
            "description": "Longest protocol line accepted.",
        },
        "line_timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT,
            "default": 30,
            "description": "Seconds a started line may take to complete; then "
            "the connection is closed.",
        },
        "max_connections": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "Unix-socket and authenticated TCP connections; "
            "beyond, new ones are closed at once (root and "
            "admins may use admin_reserve more). null: what "
            "RLIMIT_NOFILE leaves after the daemon's own files "
            "and the other pools.",
        },
        "admin_reserve": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "Connections kept for root, the admins and the "
            "daemon's owner beyond max_connections; null: "
            "RLIMIT_NOFILE/16, at most 64.",
        },
        "tcp_max_unauthenticated": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "TCP connections that have not yet sent "
            "a validly signed request; they never "
            "count toward max_connections. null: "
            "RLIMIT_NOFILE/8, at most 256.",
        },
        "tcp_max_per_peer": {
            "type": "integer",
            "minimum": 1,
            "default": 32,
            "description": "Unauthenticated TCP connections from one address.",
        },
        "tcp_auth_timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT,
            "default": 5,
            "description": "Seconds a TCP connection has to send a validly "
            "signed request; then it is closed.",
        },
        "max_connections_per_user": {
            "type": "integer",
            "minimum": 1,
            "default": 1024,
            "description": "Unix-socket connections one ordinary "
            "user may hold (root and admins: no limit).",
        },
        "categories": {
            "type": "object",
            "default": {},
            "description": "Extra command/opcode names per category (added to the defaults).",
            "properties": {c: {"type": "array", "items": {"type": "string"}} for c in CATEGORIES},
            "additionalProperties": False,
        },
        "metrics_port": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": 65535,
            "default": None,
            "description": "Serve Prometheus metrics on this port (0: any free "
            "port; null: off). Needs gridgate[metrics].",
        },
        "metrics_address": {
            "type": "string",
            "minLength": 1,
            "default": "127.0.0.1",
            "description": "Address the metrics port listens on.",
        },
        "notoken_ntries": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "Client retries when refused; null: unlimited.",
        },
        "when_unavailable": {
            "enum": ["proceed", "fail"],
            "default": "proceed",
            "description": "Client behaviour when no daemon answers.",
        },
        "client_timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT,
            "default": 5,
            "description": "Seconds a client waits to connect to a daemon.",
        },
        "bypass": BYPASS_SCHEMA,
        "adaptive": ADAPTIVE_SCHEMA,
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Limits:
    """One category's token limits; ``throttle`` is in seconds."""

    max: int = DEFAULT_MAX
    nominal: int = DEFAULT_NOMINAL
    throttle: float = DEFAULT_THROTTLE_MS / 1000.0
    #: most tokens one ordinary user may hold at once; None: ``max`` (no cap of its own)
    user_max: int | None = None

    @property
    def per_user(self) -> int:
        return self.max if self.user_max is None else self.user_max


class PolicyError(ValueError):
    """A policy string or mapping is wrong; ``path`` names the field inside ``policies``."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        self.path = path
        super().__init__(message)


_BLOCK = re.compile(r"\s*([A-Za-z_]+)\s*\[([^\[\]]*)\]\s*")
_ATTR = re.compile(r"([A-Za-z_]+)=(\S+)")


def parse_policies(text: str) -> dict[str, dict[str, int]]:
    """Parse ``QUERY[max=100 nominal=50 throttle=1] SUBMISSION[...] OTHER[...]``.

    :return: given attributes per category (missing categories and keys are absent).
    :raises PolicyError: naming the category or attribute that is wrong.
    """
    result: dict[str, dict[str, int]] = {}
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    if text.startswith("PROXYD_POLICIES="):
        return parse_policies(text[len("PROXYD_POLICIES=") :])
    pos = 0
    while pos < len(text):
        match = _BLOCK.match(text, pos)
        if not match:
            rest = text[pos:].strip()
            raise PolicyError((), f"cannot parse {rest[:40]!r}: expected CATEGORY[key=value ...]")
        pos = match.end()
        name, body = match.group(1).upper(), match.group(2)
        category = next((c for c, n in LSF_NAMES.items() if n == name), None)
        if category is None:
            raise PolicyError((), f"unknown category {match.group(1)!r} (QUERY, SUBMISSION, OTHER)")
        if category in result:
            raise PolicyError((category,), f"{name} is given twice")
        attrs: dict[str, int] = {}
        for word in body.split():
            kv = _ATTR.fullmatch(word)
            if not kv:
                raise PolicyError((category,), f"{name}: cannot parse {word!r}: expected key=value")
            key, value = kv.group(1).lower(), kv.group(2)
            if key not in _LIMIT_PROPS:
                raise PolicyError(
                    (category,),
                    f"{name}: unknown attribute {key!r} (max, nominal, throttle, user_max)",
                )
            if not re.fullmatch(r"[+-]?\d+", value):
                raise PolicyError((category, key), f"{name}: {key}={value} is not an integer")
            attrs[key] = int(value)
        result[category] = attrs
    return result


def resolve_category(given: Mapping[str, Any], where: tuple[str | int, ...] = ()) -> Limits:
    """Apply the seed's defaults and checks to one category's given attributes."""
    for key in ("max", "nominal", "throttle", "user_max"):
        value = given.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value <= 0
        ):
            raise PolicyError((*where, key), f"{key} must be a positive integer, not {value!r}")
    mx, nominal = given.get("max"), given.get("nominal")
    if mx is None:
        mx = nominal if nominal is not None and nominal > DEFAULT_MAX else DEFAULT_MAX
    if nominal is None:
        nominal = mx if mx < DEFAULT_NOMINAL else DEFAULT_NOMINAL
    if nominal > mx:
        raise PolicyError((*where, "nominal"), f"nominal ({nominal}) must not exceed max ({mx})")
    throttle = given.get("throttle") or DEFAULT_THROTTLE_MS
    if throttle > MAX_THROTTLE_MS:
        raise PolicyError(
            (*where, "throttle"), f"throttle ({throttle} ms) must not exceed {MAX_THROTTLE_MS} ms"
        )
    user_max = given.get("user_max")
    if user_max is not None and user_max > mx:
        raise PolicyError((*where, "user_max"), f"user_max ({user_max}) must not exceed max ({mx})")
    return Limits(max=mx, nominal=nominal, throttle=throttle / 1000.0, user_max=user_max)


def resolve_policies(
    policies: str | Mapping[str, Any] | None, max_concurrent_query: int | None = None
) -> dict[str, Limits]:
    """The limits of every category from the config's ``policies`` value.

    :param max_concurrent_query: mbatchd's ``MAX_CONCURRENT_QUERY`` when the site states it:
        the QUERY max may not exceed it (the seed), and an unset QUERY max defaults to it
        when it is below 100.
    :raises PolicyError: with the path of the faulty field inside ``policies``.
    """
    if not policies:
        given: Mapping[str, Any] = {}
    elif isinstance(policies, str):
        given = parse_policies(policies)
    else:
        given = policies
    limits = {c: resolve_category(given.get(c) or {}, (c,)) for c in CATEGORIES}
    if max_concurrent_query is not None:
        query = dict(given.get("query") or {})
        if query.get("max") is None and limits["query"].max > max_concurrent_query:
            query["max"] = max_concurrent_query
            limits["query"] = resolve_category(query, ("query",))
        if limits["query"].max > max_concurrent_query:
            raise PolicyError(
                ("query", "max"),
                f"QUERY max ({limits['query'].max}) must not "
                f"exceed max_concurrent_query "
                f"({max_concurrent_query}, MAX_CONCURRENT_QUERY)",
            )
    return limits


def split_limits(limits: Mapping[str, Limits], index: int, count: int) -> dict[str, Limits]:
    """Daemon ``index``'s share when ``count`` daemons split the limits.

    Each takes ``max // count`` and ``nominal // count``; the first ``max % count`` daemons
    take one more (likewise nominal), so the shares sum exactly to the configured limits and
    every share keeps ``nominal <= max``. A ``user_max`` is split the same way, but never
    below one token (a daemon with a share of max serves every user) nor above the share of max.
    """
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"daemon index {index} out of range for {count} daemons")

    def share(total: int) -> int:
        return total // count + (1 if index < total % count else 0)

    def user_share(v: Limits) -> int | None:
        if v.user_max is None:
            return None
        return min(share(v.max), max(1, share(v.user_max)))

    return {
        c: Limits(
            max=share(v.max), nominal=share(v.nominal), throttle=v.throttle, user_max=user_share(v)
        )
        for c, v in limits.items()
    }


def default_socket_path() -> str:
    """The socket when nothing names one: under the runtime directory, /run for root."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if os.geteuid() == 0 or not runtime:
        return "/run/gridgate/proxyd.sock"
    return str(Path(runtime) / "gridgate" / "proxyd.sock")


def resolve_socket(option: str | None, section: Mapping[str, Any] | None = None) -> str:
    """The socket to use: ``--socket``, then ``$GRIDGATE_PROXYD_SOCKET``, then the config.

    A relative path (``--socket proxyd.sock``) is made absolute against the current directory.
    """
    if option:
        return absolute_address(option)
    env = os.environ.get("GRIDGATE_PROXYD_SOCKET")
    if env:
        return absolute_address(env)
    if section and section.get("socket"):
        return str(section["socket"])
    return default_socket_path()


def absolute_address(path: str) -> str:
    """``path`` made absolute against the current directory, unless it is host:port (an
    address is told from host:port by its leading "/", :func:`parse_address`)."""
    return path if path.startswith("/") or parse_tcp(path) else os.path.abspath(path)


def host_name() -> str:
    """This host's short name, as the status and block rules show it."""
    return socket.gethostname().split(".")[0]


def section_defaults() -> dict[str, Any]:
    """A full section from the schema defaults: the seed's defaults (``serve`` with no -c).

    Read straight from the schema's top-level ``default`` values (an empty section has nothing
    deeper to fill), so that the gate's shims need no JSON Schema machinery; a test checks the
    result equals what the config loader's default filling gives."""
    return {
        key: copy.deepcopy(spec["default"])
        for key, spec in SECTION_SCHEMA["properties"].items()
        if "default" in spec
    }


def parse_tcp(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """``("unix", path)`` or ``("tcp", (host, port))``.

    :raises ValueError: for an address that is neither.
    """
    if address.startswith("/") or address.startswith("."):
        return "unix", address
    tcp = parse_tcp(address)
    if tcp is None:
        raise ValueError(f"{address!r} is neither a socket path nor host:port")
    return "tcp", tcp
