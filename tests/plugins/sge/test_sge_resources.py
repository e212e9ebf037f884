"""A pilot's resources in Grid Engine's words: ``-pe <pe> N`` for cores, one ``-l`` with the
memory (per slot) and the walltime; the qsub options they would collide with are refused; on
the private cell ``qstat -j`` shows what was asked."""

from __future__ import annotations

import re

import pytest
from support.sge_site import SgeSite

from gridgate.core.model import Endpoint, Resources, SubmitRequest
from gridgate.core.testing import build_plugin
from gridgate.plugins.sge.backend import SgeBackend

SECTION = {"queues": ["pilots.q"], "script": "/p.sh"}


@pytest.fixture
def sge_site(sge, tmp_path) -> SgeSite:
    return SgeSite(sge, tmp_path.name)


def _argv(asked: Resources | None, **section) -> list[str]:
    backend = build_plugin(SgeBackend, {**SECTION, **section})
    return backend.qsub_argv(Endpoint("sge", "pilots.q"), SubmitRequest("sge", resources=asked))


def test_each_value_has_its_qsub_option_before_the_script() -> None:
    argv = _argv(Resources(cores=8, memory_mb=16000, walltime=172800))
    assert argv[-6:] == ["-pe", "smp", "8", "-l", "h_vmem=2000M,h_rt=172800", "/p.sh"]


def test_memory_per_slot_is_rounded_up_and_a_job_consumable_takes_it_whole() -> None:
    assert "h_vmem=334M" in _argv(Resources(cores=3, memory_mb=1000))  # 1000 / 3, rounded up
    whole = _argv(
        Resources(cores=3, memory_mb=1000),
        resources={"memory": "mem_job", "memory_per_slot": False, "parallel_environment": "mp"},
    )
    assert whole[-6:] == ["-pe", "mp", "3", "-l", "mem_job=1000M", "/p.sh"]


def test_nothing_asked_adds_no_option() -> None:
    assert (
        _argv(None)
        == _argv(Resources())
        == ["qsub", "-terse", "-q", "pilots.q", "-N", "gridgate-pilot", "-w", "e", "/p.sh"]
    )


def test_the_walltime_is_seconds_as_written() -> None:
    assert _argv(Resources(walltime=3601))[-3:] == ["-l", "h_rt=3601", "/p.sh"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["-l", "h_vmem=4G"], "-l h_vmem is written by the backend"),
        (["-l", "arch=lx-amd64,h_rt=600"], "-l h_rt is written by the backend"),
        (["-pe", "smp", "4"], "-pe is written by the backend"),
    ],
)
def test_options_of_the_resources_are_refused_in_qsub_options(options, said) -> None:
    [(path, message)] = SgeBackend.config_errors({**SECTION, "qsub_options": options})
    assert path == ("qsub_options", 0) and message.startswith(said)


def test_a_site_resource_name_moves_the_refusal_with_it() -> None:
    section = {**SECTION, "resources": {"memory": "mem_free"}}
    assert SgeBackend.config_errors({**section, "qsub_options": ["-l", "h_vmem=4G"]}) == []
    [(path, _)] = SgeBackend.config_errors({**section, "qsub_options": ["-l", "mem_free=4G"]})
    assert path == ("qsub_options", 0)


def test_words_near_them_are_still_accepted() -> None:
    options = ["-l", "arch=lx-amd64", "-P", "atlas", "-o", "/dev/null", "-j", "y", "-tc", "5"]
    assert SgeBackend.config_errors({**SECTION, "qsub_options": options}) == []


def test_the_backend_declares_what_it_maps() -> None:
    info = build_plugin(SgeBackend, SECTION).backend_info()
    assert info.resources == ("cores", "memory_mb", "walltime") and info.resource_tags == ()


def test_a_two_core_pilot_is_a_two_slot_job_on_the_real_cell(sge_site) -> None:
    backend = build_plugin(SgeBackend, sge_site.section())
    endpoint = Endpoint("sge", sge_site.queue)
    request = SubmitRequest(
        "sge", group="mc", resources=Resources(cores=2, memory_mb=700, walltime=3601)
    )
    result = backend.gridgate_submit(endpoint=endpoint, request=request, timeout=60)
    assert result is not None and result.ok, result
    [job_id] = result.job_ids
    try:
        detail = sge_site.cell.run(["qstat", "-j", job_id])
        assert detail.ok, detail.stderr
        text = detail.stdout
        assert re.search(r"parallel environment:\s+smp range:\s+2", text), text
        assert re.search(r"hard resource_list:\s+.*h_vmem=350M", text), text
        assert re.search(r"hard resource_list:\s+.*h_rt=3601", text), text
    finally:
        backend.gridgate_cancel(endpoint=endpoint, job_ids=[job_id], timeout=60)
