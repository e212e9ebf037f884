"""``gridgate lsfproxyd import-lsf``: a site's own ``lsf.conf`` and ``lsb.params`` turned into a
commented ``proxyd:`` section.

Both files are read in LSF's syntax: ``NAME=value`` lines, ``#`` comments (whole lines, or
after a blank outside quotes), values in double or single quotes, a ``\\`` at the end of a line
continuing it on the next, and in ``lsb.params`` only what stands between ``Begin Parameters``
and ``End Parameters``. Parameters that have no meaning without an mbatchd are named in the
output with the reason, never silently dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gridgate.plugins.lsf_proxy.config import SECTION_SCHEMA


@dataclass(frozen=True)
class Param:
    """One parameter as the file defines it (the last definition wins, as in LSF)."""

    name: str
    value: str
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}"


class LsfConfError(ValueError):
    """A file that cannot be read as LSF configuration (names file and line)."""


_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")

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


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines joined over ``\\`` continuations, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def _value(text: str, file: str, line: int) -> str:
    """The value after ``=``: unquoted, an unquoted trailing comment dropped."""
    text = text.strip()
    if text[:1] in ("'", '"'):
        quote = text[0]
        end = text.find(quote, 1)
        if end < 0:
            raise LsfConfError(f"{file}:{line}: unclosed {quote} quote")
        rest = text[end + 1 :].strip()
        if rest and not rest.startswith("#"):
            raise LsfConfError(f"{file}:{line}: unexpected {rest[:20]!r} after the quoted value")
        return text[1:end]
    comment = re.search(r"\s#", text)
    return (text[: comment.start()] if comment else text).strip()


def parse(text: str, file: str, sectioned: bool = False) -> dict[str, Param]:
    """Parameters of an ``lsf.conf`` (``sectioned=False``) or ``lsb.params`` file.

    :raises LsfConfError: a line that is not ``NAME=value``, an unclosed quote or section.
    """
    params: dict[str, Param] = {}
    inside = not sectioned
    for number, line in _logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if sectioned:
            words = stripped.split()
            if len(words) >= 2 and words[0].lower() in ("begin", "end"):
                opening = words[0].lower() == "begin"
                if words[1].lower() == "parameters":
                    if opening == inside:
                        raise LsfConfError(
                            f"{file}:{number}: {stripped!r} "
                            + ("inside" if inside else "without")
                            + " a Begin Parameters section"
                        )
                    inside = opening
                continue
            if not inside:
                continue
        match = _NAME.fullmatch(stripped)
        if not match:
            raise LsfConfError(f"{file}:{number}: expected NAME=value, not {stripped[:40]!r}")
        name = match.group(1).upper()
        params[name] = Param(name, _value(match.group(2), file, number), file, number)
    if sectioned and inside:
        raise LsfConfError(f"{file}: Begin Parameters without End Parameters")
    return params


def _positive(param: Param) -> int:
    if not re.fullmatch(r"\+?\d+", param.value) or int(param.value) < 1:
        raise LsfConfError(
            f"{param.file}:{param.line}: {param.name}={param.value!r} is not a positive integer"
        )
    return int(param.value)


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
            number = _positive(port)
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
        put("tcp", f"0.0.0.0:{_positive(port)}", port)
        lines.append(f"  key: {_yaml({'file': key_file})}  # create it, mode 0600")
    simple = [
        ("LSF_PROXYD_TOKEN_WAIT_TIME", "token_wait_time", conf),
        ("LSF_PROXYD_NOTOKEN_NTRIES", "notoken_ntries", conf),
        ("MAX_CONCURRENT_QUERY", "max_concurrent_query", params),
    ]
    for name, key, source in simple:
        if name in source:
            put(key, _positive(source[name]), source[name])
    beat = conf.get("LSF_PROXYD_HEARTBEAT_INTERVAL")
    if beat:
        if "heartbeat_interval" in SECTION_SCHEMA["properties"]:
            put("heartbeat_interval", _positive(beat), beat)
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
