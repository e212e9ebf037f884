"""A pilot's resources in xRSL (issue 23): ``count``/``countpernode``, ``memory`` per core as
ARC means it, ``walltime`` in seconds; the xRSL attributes they would collide with are
refused; the real arcsub of the private CE accepts such a description."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridgate.core.model import Endpoint, Resources, SubmitRequest
from gridgate.core.testing import build_plugin
from gridgate.plugins.arc.backend import CE, ArcBackend, resource_attributes

BASE = {"endpoints": ["https://ce.example.org/arex"], "script": "/p.sh"}


def _attributes(**asked) -> dict[str, str]:
    return dict(resource_attributes(SubmitRequest("arc", resources=Resources(**asked))))


def test_each_value_has_its_xrsl_attribute() -> None:
    assert _attributes(cores=8, memory_mb=16000, walltime=172800) == {
        "count": "8",
        "countpernode": "8",
        "memory": "2000",
        "walltime": "172800 seconds",
    }


@pytest.mark.parametrize(
    ("cores", "memory_mb", "per_core"), [(1, 1000, "1000"), (3, 1000, "334"), (4, 1001, "251")]
)
def test_memory_is_per_core_rounded_up(cores: int, memory_mb: int, per_core: str) -> None:
    assert _attributes(cores=cores, memory_mb=memory_mb)["memory"] == per_core


def test_nothing_asked_writes_nothing() -> None:
    assert resource_attributes(SubmitRequest("arc")) == []
    assert _attributes() == {}
    assert _attributes(walltime=61) == {"walltime": "61 seconds"}  # exact: no rounding


def test_the_description_carries_them_before_the_sites_attributes(tmp_path: Path) -> None:
    backend = build_plugin(ArcBackend, {**BASE, "xrsl": {"cputime": "10"}})
    ce = CE(Endpoint("arc", "ce.example.org"), "", tmp_path)
    text = backend.description(
        ce, SubmitRequest("arc", resources=Resources(cores=2, memory_mb=3000, walltime=600))
    )
    assert '(count="2")\n (countpernode="2")\n (memory="1500")\n (walltime="600 seconds")' in text
    assert text.index("walltime") < text.index("cputime")


@pytest.mark.parametrize("name", ["count", "Count", "count_per_node", "memory", "WallTime"])
def test_the_attributes_of_the_resources_are_refused_in_xrsl(name: str) -> None:
    [(path, message)] = ArcBackend.config_errors({**BASE, "xrsl": {name: "1"}})
    assert path == ("xrsl", name)
    assert "is written by the backend (resources." in message


def test_the_backend_declares_what_it_maps() -> None:
    info = build_plugin(ArcBackend, BASE).backend_info()
    assert info.resources == ("cores", "memory_mb", "walltime") and info.resource_tags == ()


@pytest.mark.xdist_group("arc")
def test_the_real_arcsub_accepts_count_memory_and_walltime(arc, arc_client, tmp_path) -> None:
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\necho two cores\n", encoding="utf-8")
    backend = build_plugin(ArcBackend, {"endpoints": [arc.url], "script": str(script)})
    ce = CE(Endpoint("arc", "ce"), "", tmp_path)
    text = backend.description(
        ce, SubmitRequest("arc", resources=Resources(cores=2, memory_mb=1000, walltime=3601))
    )
    client = arc_client(arc)
    [job] = client.submit(text)
    try:
        info = client.run("arcstat", "-l", job)
        assert info.ok, info.stderr
        # what the A-REX made of it (its ADL record of the job): 2 slots on one host, memory
        # per slot in bytes (1000 MB / 2 cores), the walltime to the second
        adl = (arc.folder / "control" / f"job.{job.rsplit('/', 1)[-1]}.description").read_text(
            encoding="utf-8", errors="replace"
        )
        assert "<adl:NumberOfSlots>2</adl:NumberOfSlots>" in adl
        assert "<adl:SlotsPerHost>2</adl:SlotsPerHost>" in adl
        assert f"<adl:IndividualPhysicalMemory>{500 * 1024 * 1024}<" in adl
        assert "<adl:WallTime>3601</adl:WallTime>" in adl
    finally:
        client.run("arckill", job)
