"""Finding LSF pilots by name (gridgate_find_pilots) through the stand-in bsub/bjobs/bkill as
real processes: jobs named for their submission, arrays element by element, finished jobs
that LSF still keeps, under a query token of the real lsfproxyd."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridgate.core.clock import write_file_time
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.plugins import PluginContext
from gridgate.core.testing import section_for
from gridgate.plugins.lsf_proxy.commands import opcode_of
from gridgate.plugins.lsf_proxy.director.backend import LsfBackend
from gridgate.plugins.lsf_proxy.documents import named_rows
from gridgate.plugins.lsf_proxy.sim import install_commands, write_scenario

NORMAL, SHORT = Endpoint("lsf", "normal"), Endpoint("lsf", "short")
T0 = 1_800_000_000.0
FLEET, OTHER_FLEET = "3fa2c1", "77aa00"
ONE, ARRAY, GONE = (f"{FLEET}-{n:012x}" for n in (1, 2, 3))
STRANGER = f"{OTHER_FLEET}-{4:012x}"


@pytest.fixture
def site(tmp_path: Path):
    bin_dir = install_commands(tmp_path / "bin")
    path = tmp_path / "scenario.json"
    clock = tmp_path / "clock"
    write_file_time(clock, T0)

    def scenario(**data) -> None:
        write_scenario(path, {"state_dir": str(tmp_path / "lsf"), "clock_file": str(clock), **data})

    def backend(**section) -> LsfBackend:
        section = {
            "queues": ["normal", "short"],
            "tokens": False,
            "commands": {n: str(bin_dir / n) for n in ("bsub", "bjobs")},
            "env": {"GRIDGATE_LSF_SCENARIO": str(path)},
            **section,
        }
        return LsfBackend(section_for(LsfBackend, section), PluginContext())

    scenario()
    return backend, scenario


def submit(backend: LsfBackend, endpoint: Endpoint, name: str = "", count: int = 1) -> str:
    request = SubmitRequest("lsf", count=count, name=name)
    result = backend.gridgate_submit(endpoint=endpoint, request=request, timeout=20)
    assert result.ok, result
    return result.job_ids[0]


def find(backend: LsfBackend, names=(), fleet: str = "", endpoint: Endpoint = NORMAL):
    answer = backend.gridgate_find_pilots(
        endpoint=endpoint, names=tuple(names), fleet=fleet, timeout=20
    )
    assert answer is not None
    return answer


def test_jobs_are_named_for_their_submission_and_an_array_keeps_its_syntax(site) -> None:
    make, _ = site
    backend = make(job_name="pilot")
    one = backend.bsub_argv(NORMAL, SubmitRequest("lsf", name=ONE))
    array = backend.bsub_argv(NORMAL, SubmitRequest("lsf", count=3, name=ARRAY))
    bare = backend.bsub_argv(NORMAL, SubmitRequest("lsf"))
    assert one[one.index("-J") + 1] == f"pilot-{ONE}"
    assert array[array.index("-J") + 1] == f"pilot-{ARRAY}[1-3]"
    assert bare[bare.index("-J") + 1] == "pilot"


def test_named_rows_read_array_elements_from_the_job_name() -> None:
    rows = named_rows(
        f"12^gridgate-pilot-{ARRAY}[3]^PEND^-^-^-\n13^gridgate-pilot-{ONE}^RUN^hostA^-^-\n"
        "14^someone-else^EXIT^hostB^1^TERM_OWNER: job killed by owner ^ twice\nno row\n"
    )
    assert [(r.name, r.row.job_id, r.row.stat) for r in rows] == [
        (f"gridgate-pilot-{ARRAY}", "12[3]", "PEND"),
        (f"gridgate-pilot-{ONE}", "13", "RUN"),
        ("someone-else", "14", "EXIT"),
    ]
    assert rows[2].row.reason == "TERM_OWNER: job killed by owner ^ twice"
    table = named_rows(
        "JOBID     USER    STAT  QUEUE      FROM_HOST   EXEC_HOST   JOB_NAME   SUBMIT_TIME\n"
        "103506916 stober  PEND  8nm        lxplus235      -        GC81e0208d.0[2] Nov  4 20:07\n"
        "103606918 stober  RUN   8nm        lxplus235   lxbsu0606   GC81e0208d.7 Nov  4 20:07\n",
        table=True,
    )
    assert [(r.name, r.row.job_id, r.row.exec_host) for r in table] == [
        ("GC81e0208d.0", "103506916[2]", ""),
        ("GC81e0208d.7", "103606918", "lxbsu0606"),
    ]


@pytest.mark.parametrize("status_format", ["custom", "table"])
def test_found_by_name_and_by_fleet_in_every_state_with_ids_job_status_takes(
    site, status_format
) -> None:
    make, _ = site
    backend = make(status_format=status_format)
    one = submit(backend, NORMAL, ONE)
    array = submit(backend, NORMAL, ARRAY, count=3)
    gone = submit(backend, NORMAL, GONE)
    submit(backend, NORMAL, STRANGER)
    submit(backend, NORMAL)  # made outside the director: no submission name
    submit(backend, SHORT, f"{FLEET}-{9:012x}")  # another queue is another endpoint
    killed = backend.gridgate_cancel(endpoint=NORMAL, job_ids=[gone], timeout=20)
    assert killed.cancelled == (gone,)

    by_name = find(backend, [ONE, ARRAY, GONE, f"{FLEET}-{99:012x}"])
    assert by_name.ok, by_name
    ids = {n: sorted(s.job_id for s in found) for n, found in by_name.found.items()}
    assert ids == {
        ONE: [one],
        ARRAY: [f"{array}[1]", f"{array}[2]", f"{array}[3]"],
        GONE: [gone],  # finished, and still kept by LSF: bjobs -a lists it
    }
    assert [s.native for s in by_name.found[GONE]] == ["EXIT"]
    assert {s.state for s in by_name.found[ARRAY]} == {"waiting"}

    by_fleet = find(backend, fleet=FLEET)
    assert by_fleet.ok and set(by_fleet.found) == {ONE, ARRAY, GONE}
    assert set(find(backend, fleet=OTHER_FLEET).found) == {STRANGER}
    assert find(backend, [ONE]).found.keys() == {ONE}

    found = [s.job_id for statuses in by_name.found.values() for s in statuses]
    polled = backend.gridgate_job_status(endpoint=NORMAL, job_ids=found, timeout=20)
    assert polled.ok and set(polled.statuses) == set(found), polled
    expected = {s.job_id: s.native for v in by_name.found.values() for s in v}
    assert {j: s.native for j, s in polled.statuses.items()} == expected


def test_an_array_element_is_polled_and_cancelled_on_its_own(site) -> None:
    make, _ = site
    backend = make()
    array = submit(backend, NORMAL, ARRAY, count=2)
    first, second = f"{array}[1]", f"{array}[2]"
    assert backend.gridgate_cancel(endpoint=NORMAL, job_ids=[first], timeout=20).cancelled == (
        first,
    )
    polled = backend.gridgate_job_status(
        endpoint=NORMAL, job_ids=[first, second, array], timeout=20
    )
    assert polled.ok, polled
    native = {j: s.native for j, s in polled.statuses.items()}
    # the whole array's id keeps its liveliest element, as before
    assert native == {first: "EXIT", second: "PEND", array: "PEND"}


def test_nothing_held_is_an_answer_and_daemon_trouble_is_not(site) -> None:
    make, scenario = site
    backend = make()
    empty = find(backend, [ONE], fleet=FLEET)
    assert empty.ok and not empty.found, empty
    assert empty.command is not None and "No job found" in empty.command.stderr
    scenario(bjobs={"behaviour": "lim_down"})
    down = find(backend, [ONE])
    assert not down.ok and down.command is not None and "LIM is down" in down.command.stderr
    assert (
        backend.gridgate_find_pilots(
            endpoint=Endpoint("slurm", "normal"), names=(ONE,), fleet="", timeout=5
        )
        is None
    )


def test_find_takes_a_query_token_of_the_real_daemon(site, start_daemon, sockdir) -> None:
    make, _ = site
    log = sockdir / "diag.log"
    daemon = start_daemon({"diagnose": True, "diagnose_file": str(log)})
    plain = make()
    submit(plain, NORMAL, ONE)
    backend = make(tokens=True, socket=daemon.socket)
    try:
        answer = find(backend, [ONE])
    finally:
        backend.close()
    assert answer.ok and set(answer.found) == {ONE}
    lines = log.read_text().splitlines()
    assert any(f"QUERY_REQ,{opcode_of('bjobs')}," in ln for ln in lines), lines
