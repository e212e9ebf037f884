"""Every number of seconds in the config has a maximum (issue 21, item 17's class beyond the
token daemon's section): a huge value used to validate and then overflow where it became a
timeout (``OverflowError: timeout value is too large``), or mean "never" by accident."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from gridgate.core.config import compose_schema

#: keys that hold seconds (counts such as max_waiting or transient_notify_after do not)
SECONDS = re.compile(
    r"(seconds|timeout|expiry|interval|_time$|lost_after|^keep_|lifetime|lease|period|ttl"
    r"|refresh|window|walltime)"
)
ALL = {
    "backends": {"arc": {}, "slurm": {}, "wms_glite": {}, "lsf": {}},
    "notifiers": {"email": {}, "ggus": {}, "files": {}, "log": {}},
    "credentials": {"x509_proxy": {"path": "p"}},
    "admission": {"lsf_proxy": {}},
    "demand": {"static": {}, "file": {}, "queue": {}},
    "availability": {"gocdb": {"url": "file:///x"}, "efficiency": {}, "operator": {}},
    "selectors": {"random": {}, "round_robin": {}, "throughput": {}},
}


def _unbounded(node: Any, path: list[str], found: list[str]) -> None:
    if not isinstance(node, dict):
        return
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    if (
        ({"number", "integer"} & set(types))
        and path
        and SECONDS.search(path[-1])
        and "maximum" not in node
    ):
        found.append(".".join(path))
    for key, value in node.items():
        if key == "properties":
            for name, sub in value.items():
                _unbounded(sub, [*path, name], found)
        elif key in ("items", "additionalProperties"):
            _unbounded(value, [*path, "*"], found)
        elif key in ("oneOf", "anyOf", "allOf"):
            for sub in value:
                _unbounded(sub, path, found)


def test_every_number_of_seconds_in_every_section_has_a_maximum() -> None:
    schema, _classes, _problems = compose_schema(ALL)
    found: list[str] = []
    _unbounded(schema, [], found)
    assert found == [], f"numbers of seconds without a maximum: {found}"


def test_a_huge_number_of_seconds_is_a_config_error_naming_file_line_and_key(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        "director:\n  cycle_seconds: 1.0e+10\n  command_timeout: .inf\n", encoding="utf-8"
    )
    out = subprocess.run(
        [str(Path(sys.executable).parent / "gridgate"), "config", "validate", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert (
        f"{site}:2: director.cycle_seconds" in text
        and f"{site}:3: director.command_timeout" in text
    ), text
