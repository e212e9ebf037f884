"""A pilot's resources in bsub's words (issue 23): ``-n``, ``-R span[hosts=1]``,
``-R rusage[mem=MB]`` (each one argv item, no shell), ``-W [hour:]minute``; the options they
would collide with are refused in extra_options; the bsub stand-in takes them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gridgate.core.model import Endpoint, Resources, SubmitRequest
from gridgate.core.plugins import PluginContext
from gridgate.core.testing import section_for
from gridgate.plugins.lsf_proxy.director.backend import LsfBackend, lsf_run_limit
from gridgate.plugins.lsf_proxy.sim import install_commands, write_scenario

NORMAL = Endpoint("lsf", "normal")


def _backend(tmp_path: Path, **section) -> LsfBackend:
    bin_dir = install_commands(tmp_path / "bin")
    scenario = tmp_path / "scenario.json"
    write_scenario(scenario, {"state_dir": str(tmp_path / "lsf")})
    section = {
        "queues": ["normal"],
        "tokens": False,
        "commands": {"bsub": str(bin_dir / "bsub"), "bjobs": str(bin_dir / "bjobs")},
        "env": {"GRIDGATE_LSF_SCENARIO": str(scenario)},
        **section,
    }
    return LsfBackend(section_for(LsfBackend, section), PluginContext())


def _options(tmp_path: Path, asked: Resources | None, **section) -> list[str]:
    argv = _backend(tmp_path, **section).bsub_argv(NORMAL, SubmitRequest("lsf", resources=asked))
    return argv[5:-1]  # after bsub -q normal -J name, before the command


def test_each_value_has_its_bsub_option_each_its_own_argv_item(tmp_path: Path) -> None:
    assert _options(tmp_path, Resources(cores=8, memory_mb=16000, walltime=172800)) == [
        "-n",
        "8",
        "-R",
        "span[hosts=1]",
        "-R",
        "rusage[mem=16000]",
        "-W",
        "48:00",
    ]


def test_the_sites_resources_stay_and_cores_replace_processors(tmp_path: Path) -> None:
    options = _options(
        tmp_path, Resources(cores=4, memory_mb=100), resources="select[type==X86_64]", processors=2
    )
    assert options == [
        "-R",
        "select[type==X86_64]",
        "-n",
        "4",
        "-R",
        "span[hosts=1]",
        "-R",
        "rusage[mem=100]",
    ]
    # without resources asked, processors is -n as before
    assert _options(tmp_path, None, processors=2) == ["-n", "2"]
    assert _options(tmp_path, Resources(), processors=2) == ["-n", "2"]
    assert _options(tmp_path, Resources()) == []


@pytest.mark.parametrize(
    ("seconds", "limit"),
    [
        (1, "1"),
        (60, "1"),
        (61, "2"),
        (3540, "59"),
        (3599, "1:00"),
        (3601, "1:01"),
        (90000, "25:00"),
    ],
)
def test_walltime_is_hour_minute_rounded_up(seconds: int, limit: str) -> None:
    assert lsf_run_limit(seconds) == limit
    hours, minutes = limit.split(":") if ":" in limit else ("0", limit)
    assert int(hours) * 60 + int(minutes) == math.ceil(seconds / 60)


@pytest.mark.parametrize(
    ("word", "owned"),
    [("-n", "-n"), ("-n4", "-n"), ("-n2,4", "-n"), ("-W", "-W"), ("-W90", "-W"), ("-W1:30", "-W")],
)
def test_the_options_of_the_resources_are_refused_in_extra_options(word: str, owned: str) -> None:
    problems = LsfBackend.config_errors({"queues": ["normal"], "extra_options": [word]})
    assert [where for where, _ in problems] == [("extra_options", 0)]
    assert problems[0][1].startswith(f"{owned} is written by the backend")


def test_options_that_only_begin_like_them_are_accepted() -> None:
    words = [
        "-We",
        "60",
        "-Wa",
        "URG",
        "-Wt",
        "5",
        "-network",
        "type=sn_all",
        "-notify",
        "-M",
        "2000",
    ]
    assert LsfBackend.config_errors({"queues": ["normal"], "extra_options": words}) == []


def test_the_backend_declares_what_it_maps(tmp_path: Path) -> None:
    info = _backend(tmp_path).backend_info()
    assert info.resources == ("cores", "memory_mb", "walltime") and info.resource_tags == ()


def test_the_bsub_stand_in_takes_them(tmp_path: Path) -> None:
    backend = _backend(tmp_path, resources="select[mem>1]")
    request = SubmitRequest("lsf", resources=Resources(cores=2, memory_mb=3000, walltime=5400))
    result = backend.gridgate_submit(endpoint=NORMAL, request=request, timeout=20)
    assert result.ok and len(result.job_ids) == 1, result
    [job] = [
        json.loads(line) for line in (tmp_path / "lsf" / "jobs.jsonl").read_text().splitlines()
    ]
    assert job["processors"] == 2 and job["run_limit"] == "1:30"
    assert job["resreq"] == ["select[mem>1]", "span[hosts=1]", "rusage[mem=3000]"]
