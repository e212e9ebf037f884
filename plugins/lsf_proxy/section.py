"""The top-level ``proxyd:`` section of a site config, as a ``gridgate.sections`` entry point.

Apart from :mod:`gridgate.plugins.lsf_proxy.config` so that the gate's shims, which read that
module's defaults, do not load the plugin machinery."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from gridgate.core.plugins import ConfigProblems, Plugin
from gridgate.plugins.lsf_proxy.config import (
    ADAPTIVE_ENTRY,
    ADAPTIVE_SOURCES,
    SCHEDULER_ONLY,
    SECTION_SCHEMA,
    PolicyError,
    filled,
    parse_tcp,
    resolve_policies,
)
from gridgate.plugins.lsf_proxy.schedulers import config_problems


class ProxydSection(Plugin):
    """The top-level ``proxyd:`` section of a site config (entry point ``gridgate.sections``).

    Only its schema and cross-field checks are used: the section configures the daemon and
    its clients, it implements no hook."""

    config_schema: ClassVar[dict[str, Any]] = SECTION_SCHEMA

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> ConfigProblems:
        """Cross-field checks: the policy rules, host names, the TCP key."""
        problems: ConfigProblems = []
        try:
            resolve_policies(section.get("policies"), section.get("max_concurrent_query"))
        except PolicyError as exc:
            problems.append((("policies", *exc.path), str(exc)))
        hosts = section.get("hosts") or []
        names = [h.get("name") for h in hosts]
        for index, name in enumerate(names):
            if names.index(name) != index:
                problems.append((("hosts", index, "name"), f"host name {name!r} is listed twice"))
        has_key = bool(section.get("key"))
        for index, host in enumerate(hosts):
            address = host.get("address", "")
            if address.startswith("/"):
                continue
            if not parse_tcp(address):
                problems.append(
                    (
                        ("hosts", index, "address"),
                        f"{address!r} is neither an absolute socket path nor host:port",
                    )
                )
            elif not has_key:
                problems.append(
                    (
                        ("hosts", index, "address"),
                        "a TCP address needs the shared key: key: {env: NAME} or {file: PATH}",
                    )
                )
        problems += config_problems(section.get("bypass") or {})
        for category, entry in (section.get("adaptive") or {}).items():
            given = filled(ADAPTIVE_ENTRY, entry)
            if given["min"] > given["max"]:
                problems.append(
                    (
                        ("adaptive", category, "min"),
                        f"min ({given['min']}) must not exceed max ({given['max']})",
                    )
                )
            if not ADAPTIVE_SOURCES[given["source"]]:  # read by the daemon, not a scheduler
                for key in SCHEDULER_ONLY:
                    if entry.get(key) not in (None, []):
                        problems.append(
                            (
                                ("adaptive", category, key),
                                f"{key} is read from the scheduler; source {given['source']} "
                                "measures the tokens' hold times (use source: sdiag)",
                            )
                        )
        if section.get("tcp"):
            if not parse_tcp(section["tcp"]):
                problems.append((("tcp",), f"{section['tcp']!r} is not host:port"))
            elif not has_key:
                problems.append(
                    (("tcp",), "TCP needs a shared key: key: {env: NAME} or {file: PATH}")
                )
        return problems
