"""``gridgate lsfproxyd import-lsf``: a site's own ``lsf.conf`` and ``lsb.params`` turned into a
commented ``proxyd:`` section.

Both files are read in LSF's syntax by :func:`gridgate.plugins.lsf_proxy.documents.lsf_params`
(the plugin's one reader of outside documents). Parameters that have no meaning without an mbatchd are named in the
output with the reason, never silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gridgate.plugins.lsf_proxy.config import SECTION_SCHEMA
from gridgate.plugins.lsf_proxy.documents import LsfConfError, Param, lsf_params, positive

__all__ = ["NOT_CARRIED", "LsfConfError", "Param", "parse", "section_text"]

#: The boundary's reader of both files, by the name the command line knows.
parse = lsf_params


#: What cannot be carried over, and why.
NOT_CARRIED = {
    "LSF_PROXYD_BYPASS": "mbatchd's answer to query requests without a token: there is no "
    "mbatchd here. The nearest is proxyd.bypass, which compares a scheduler's own per-user "
    "request counts with the tokens given and reports, blocks or denies who went around the "
    "gate (Slurm's sdiag today; LSF would need badmin perfmon or mbatchd's logs: "
    "docs/proxyd.md, 'Who went around the gate')",
    "LSF_DEBUG_PROXYD": "an LSF log class of lsfproxyd: use `gridgate -v` (or -vv) on "
    "`lsfproxyd serve`, `diagnose on` for every token request, and `diagnose on -c bypass` "
    "for every request a Slurm controller serves",
    "LSB_DEBUG_MBD": "a log class of mbatchd, which gridgate does not run; against Slurm "
    "`diagnose on -c bypass` switches slurmctld's own request log on for a while",
}


def _yaml(value: object) -> str:
    return json.dumps(value)  # JSON scalars and lists are YAML, quoted where needed


def section_text(
    conf: Mapping[str, Param],
    params: Mapping[str, Param],
    key_file: str = "/etc/gridgate/proxyd.key",
) -> str:
    """The commented ``proxyd:`` section (a YAML document) for these parameters."""
    every = {**conf, **params}
    lines = [
        "# proxyd: section imported by `gridgate lsfproxyd import-lsf` from "
        + ", ".join(sorted({p.file for p in every.values()}) or ["(no parameters)"]),
        "proxyd:",
    ]
    notes: list[str] = []

    def put(key: str, value: object, *sources: Param, note: str = "") -> None:
        where = ", ".join(f"{p.name}={' '.join(p.value.split())!r} ({p.where})" for p in sources)
        lines.append(f"  # {where}{': ' + note if note else ''}")
        lines.append(f"  {key}: {_yaml(value)}")

    hosts, port = conf.get("LSF_PROXYD_HOSTS"), conf.get("LSF_PROXYD_PORT")
    if hosts:
        names = hosts.value.split()
        if port:
            number = positive(port)
            put(
                "hosts",
                [{"name": n, "address": f"{n}:{number}"} for n in names],
                hosts,
                port,
                note="every daemon sharing the limits, over signed TCP",
            )
            put("tcp", f"0.0.0.0:{number}", port, note="each daemon listens on the port")
            lines.append(
                "  # the shared key every daemon and TCP client signs with: create "
                "the file (mode 0600), e.g. `head -c 32 /dev/urandom | base64`"
            )
            lines.append(f"  key: {_yaml({'file': key_file})}")
        else:
            notes.append(
                f"LSF_PROXYD_HOSTS={hosts.value!r} ({hosts.where}): without "
                "LSF_PROXYD_PORT there is no address for the daemons; add "
                "proxyd.hosts by hand"
            )
    elif port:
        put("tcp", f"0.0.0.0:{positive(port)}", port)
        lines.append(f"  key: {_yaml({'file': key_file})}  # create it, mode 0600")
    simple = [
        ("LSF_PROXYD_TOKEN_WAIT_TIME", "token_wait_time", conf),
        ("LSF_PROXYD_NOTOKEN_NTRIES", "notoken_ntries", conf),
        ("MAX_CONCURRENT_QUERY", "max_concurrent_query", params),
    ]
    for name, key, source in simple:
        if name in source:
            put(key, positive(source[name]), source[name])
    beat = conf.get("LSF_PROXYD_HEARTBEAT_INTERVAL")
    if beat:
        if "heartbeat_interval" in SECTION_SCHEMA["properties"]:
            put("heartbeat_interval", positive(beat), beat)
        else:
            notes.append(
                f"LSF_PROXYD_HEARTBEAT_INTERVAL={beat.value!r} ({beat.where}): this "
                "gridgate has no heartbeat setting (LSF's heartbeat goes to mbatchd, "
                "which is not run here)"
            )
    addon = conf.get("LSF_ADDON_HOSTS")
    if addon:
        put("addon_hosts", addon.value.split(), addon)
    diagnose = params.get("ENABLE_DIAGNOSE")
    if diagnose:
        if "lsfproxyd" in diagnose.value.lower().split():
            put("diagnose", True, diagnose, note="every request to info.lsfproxydlog.<host>")
        else:
            notes.append(
                f"ENABLE_DIAGNOSE={diagnose.value!r} ({diagnose.where}): names no "
                "lsfproxyd diagnosis (mbatchd's own diagnosis is not run here)"
            )
    policies = params.get("PROXYD_POLICIES")
    if policies:
        put("policies", " ".join(policies.value.split()), policies)
    for name, why in NOT_CARRIED.items():
        param = every.get(name)
        if param:
            notes.append(f"{name}={' '.join(param.value.split())!r} ({param.where}): {why}")
    if len(lines) == 2:
        lines[1] = "proxyd: {}  # nothing in these files to carry over"
    if notes:
        lines += ["", "# Not carried over:"] + [f"#   {note}" for note in notes]
    return "\n".join(lines) + "\n"
