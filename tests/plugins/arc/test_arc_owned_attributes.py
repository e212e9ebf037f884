"""xRSL attributes the backend writes cannot come back through ``xrsl:`` under another
spelling: xRSL compares names without case, and RSL parsers drop underscores from them
(``job_name``, ``Std_Out``); ``join`` would fold the backend's stderr into stdout (issue 21,
item 12)."""

from __future__ import annotations

import pytest

from gridgate.plugins.arc.backend import ArcBackend

BASE = {"endpoints": ["https://ce.example.org/arex"], "script": "/p.sh"}


@pytest.mark.parametrize(
    "name",
    ["JobName", "job_name", "Std_Out", "std_err", "in_put_files", "Ex_ecutable", "join", "Join"],
)
def test_owned_attributes_are_refused_however_spelt(name: str) -> None:
    problems = ArcBackend.config_errors({**BASE, "xrsl": {name: "x"}})
    assert [where for where, _ in problems] == [("xrsl", name)]
    assert "is written by the backend" in problems[0][1]


@pytest.mark.parametrize("name", ["cputime", "cpu_time", "runTimeEnvironment", "disk", "rerun"])
def test_the_sites_attributes_are_accepted(name: str) -> None:
    assert ArcBackend.config_errors({**BASE, "xrsl": {name: "1"}}) == []
