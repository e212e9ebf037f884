"""A pilot's resources in gLite's JDL (issue 23): ``CpuNumber`` and ``SMPGranularity`` (all
cores on one node), the node's memory and the CE's wall-clock limit in the Requirements, as
gLite's JDL guide writes them; the attributes they would collide with are refused; the WMS
stand-in takes such a JDL."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gridgate.core.config import apply_defaults
from gridgate.core.model import Endpoint, Resources, SubmitRequest
from gridgate.plugins.wms_glite.backend import GliteBackend, build_jdl
from gridgate.plugins.wms_glite.jdl import JdlError, resource_jdl
from gridgate.plugins.wms_glite.sim import read_calls

H1 = "wms01.example.org"


def _config(**overrides: Any) -> dict[str, Any]:
    section: dict[str, Any] = {"executable": "pilot.sh", **overrides}
    apply_defaults(section, GliteBackend.config_schema)
    return section


def _jdl(resources: Resources | None, requirements: str = "", **config: Any) -> str:
    # requirements="" with the section's own empty: no Requirements but the resources' terms
    request = SubmitRequest("wms_glite", requirements=requirements, resources=resources)
    return build_jdl(_config(**{"requirements": "", **config}), request)


def test_each_value_has_its_jdl_words() -> None:
    jdl = _jdl(Resources(cores=8, memory_mb=16000, walltime=172800), requirements="")
    assert "  CpuNumber = 8;\n  SMPGranularity = 8;\n" in jdl
    assert (
        "  Requirements = other.GlueHostMainMemoryRAMSize >= 16000 && "
        "other.GlueCEPolicyMaxWallClockTime >= 2880;\n"
    ) in jdl


def test_the_terms_are_added_to_the_sites_requirements_in_parentheses() -> None:
    site = 'other.GlueCEStateStatus == "Production" || other.GlueCEInfoHostName == "a"'
    jdl = _jdl(Resources(walltime=3600), requirements=site)
    assert f"  Requirements = ({site}) && other.GlueCEPolicyMaxWallClockTime >= 60;\n" in jdl
    # without resources the Requirements are written as before
    assert f"  Requirements = {site};\n" in _jdl(None, requirements=site)
    assert f"  Requirements = {site};\n" in _jdl(Resources(), requirements=site)


@pytest.mark.parametrize("seconds", [1, 59, 60, 61, 3599, 3600, 3601, 172800])
def test_walltime_is_minutes_rounded_up(seconds: int) -> None:
    _attributes, [term] = resource_jdl(SubmitRequest("x", resources=Resources(walltime=seconds)))
    assert term == f"other.GlueCEPolicyMaxWallClockTime >= {math.ceil(seconds / 60)}"


def test_one_core_and_nothing_asked_add_nothing() -> None:
    assert resource_jdl(SubmitRequest("x")) == ([], [])
    assert resource_jdl(SubmitRequest("x", resources=Resources(cores=1))) == ([], [])
    assert "CpuNumber" not in _jdl(Resources(memory_mb=100))
    assert "Requirements" not in _jdl(Resources(cores=2))


@pytest.mark.parametrize(
    "name", ["CpuNumber", "cpunumber", "SMPGranularity", "WholeNodes", "HostNumber"]
)
def test_the_attributes_of_the_resources_are_refused(name: str) -> None:
    problems = GliteBackend.config_errors(_config(extra_attributes={name: 2}))
    assert [path for path, _ in problems] == [("extra_attributes", name)]
    assert "is written by gridgate itself" in problems[0][1]
    with pytest.raises(JdlError, match="set by gridgate itself"):
        build_jdl(_config(), SubmitRequest("wms_glite", attributes={name: 2}))


def test_the_backend_declares_what_it_maps() -> None:
    assert GliteBackend.expresses == ("cores", "memory_mb", "walltime")
    assert GliteBackend.expresses_tags == ()


def test_the_stand_in_takes_the_jdl_and_gets_the_resources(
    make_backend: Any, calls_log: Path
) -> None:
    pm, _ = make_backend(hosts={H1: {}}, requirements='other.GlueCEStateStatus == "Production"')
    endpoint = Endpoint("wms_glite", H1, f"https://{H1}:7443/glite_wms_wmproxy_server")
    request = SubmitRequest(
        "wms_glite", resources=Resources(cores=4, memory_mb=8000, walltime=7200)
    )
    result = pm.hook.gridgate_submit(endpoint=endpoint, request=request, timeout=10)
    assert result.ok and len(result.job_ids) == 1, result
    (call,) = read_calls(calls_log)
    assert "CpuNumber = 4;" in call.jdl and "SMPGranularity = 4;" in call.jdl
    assert (
        'Requirements = (other.GlueCEStateStatus == "Production") && '
        "other.GlueHostMainMemoryRAMSize >= 8000 && other.GlueCEPolicyMaxWallClockTime >= 120;"
    ) in call.jdl
