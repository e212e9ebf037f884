"""What a Grid Engine cluster queue says of itself (``gridgate_endpoint_state``, issue 45),
against the private cell: every user's pending jobs, its slots, a disabled queue; one read of
the cell for all its queues; the decoder's refusals."""

from __future__ import annotations

import pytest
from support.sge_site import SgeSite
from support.uids import as_user, real_user

from gridgate.core import runner
from gridgate.core.documents import DocumentError
from gridgate.core.model import Endpoint
from gridgate.core.testing import build_plugin
from gridgate.plugins.sge.backend import SgeBackend
from gridgate.plugins.sge.parse import parse_cluster_queues, parse_queue_limits


@pytest.fixture
def sge_site(sge, tmp_path) -> SgeSite:
    return SgeSite(sge, tmp_path.name)


def _held_jobs(cell, user: str, queue: str, n: int) -> None:
    """``n`` held jobs of the real ``user`` asking for ``queue``: they stay pending."""
    for _ in range(n):
        out = cell.run(
            [*as_user(user), "qsub", "-h", "-b", "y", "-o", "/dev/null", "-j", "y"]
            + ["-q", queue, "/bin/sleep", "600"],
            as_user=False,
        )
        assert out.ok, out.stderr


def test_a_queue_reports_the_pending_jobs_of_another_user(sge_site) -> None:
    cell = sge_site.cell
    first, second = cell.queues[:2]
    with real_user("ggq") as user:
        _held_jobs(cell, user, first, 3)
        backend = build_plugin(SgeBackend, sge_site.section())
        said = backend.gridgate_endpoint_state(endpoint=Endpoint("sge", first), timeout=60)
        other = backend.gridgate_endpoint_state(endpoint=Endpoint("sge", second), timeout=60)
        cell.cancel_all()
    assert said is not None and other is not None
    assert (said.serving, said.waiting, said.running) == ("production", 3, 0)
    assert said.free_slots is not None and said.free_slots > 0
    assert other.waiting == 0  # they asked for the first queue
    nosuch = backend.gridgate_endpoint_state(endpoint=Endpoint("sge", "nosuch.q"), timeout=60)
    assert nosuch is None


def test_a_disabled_queue_is_draining_and_gets_no_pilot(sge_site) -> None:
    cell = sge_site.cell
    first, second = cell.queues[:2]
    cell.disable_queue(first)
    backend = build_plugin(SgeBackend, sge_site.section())
    said = backend.gridgate_endpoint_state(endpoint=Endpoint("sge", first), timeout=60)
    assert said is not None and said.serving == "draining" and said.free_slots == 0
    summary = sge_site.run_once(sge_site.doc(pilots=2))
    assert {s["endpoint"] for s in summary["submitted"]} == {second}
    shown = summary["unavailable"][f"sge/{first}"]
    assert (shown["state"], shown["source"]) == ("drained", "queue")


def test_another_users_pending_jobs_fill_max_waiting(sge_site) -> None:
    cell = sge_site.cell
    first, second = cell.queues[:2]
    with real_user("ggq") as user:
        _held_jobs(cell, user, first, 2)
        doc = sge_site.doc(pilots=4)
        doc["director"]["pilots"] = {"max_waiting": 2}
        try:
            summary = sge_site.run_once(doc)
        finally:
            cell.cancel_all()
    assert {s["endpoint"] for s in summary["submitted"]} == {second}
    assert summary["pilots_submitted"] == 2 and summary["failures"] == []


def test_one_read_of_the_cell_answers_for_all_its_queues(sge_site, monkeypatch) -> None:
    ran: list[list[str]] = []
    real = runner.run

    def counted(argv, *args, **kwargs):
        ran.append(list(argv))
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(runner, "run", counted)
    backend = build_plugin(SgeBackend, sge_site.section())
    for _ in range(3):
        for queue in [*sge_site.cell.queues, "nosuch.q"]:
            backend.gridgate_endpoint_state(endpoint=Endpoint("sge", queue), timeout=60)
    queues = ",".join(sge_site.cell.queues)
    assert [argv[1:] for argv in ran] == [
        ["-g", "c"],
        ["-u", "*", "-s", "p", "-g", "d", "-r"],
        ["-sq", queues],
    ]


HEADER = (
    "CLUSTER QUEUE                   CQLOAD   USED    RES  AVAIL  TOTAL aoACDS  cdsuE  \n"
    "--------------------------------------------------------------------------------\n"
)


def test_the_qstat_g_c_decoder_reads_sge_8_and_refuses_other_text() -> None:
    rows = "pilots.q   2.71  1  0  3  4  0  0\nshort.q   -NA-  0  0  0  4  0  4\n"
    queues = parse_cluster_queues(HEADER + rows)
    assert (queues["pilots.q"].used, queues["pilots.q"].available) == (1, 3)
    assert (queues["short.q"].total, queues["short.q"].unusable) == (4, 4)
    assert parse_cluster_queues("") == {}
    with pytest.raises(DocumentError, match="is not qstat -g c's"):
        parse_cluster_queues("error: commlib error\n")
    with pytest.raises(DocumentError, match="line 3: 'pilots.q 2.71 1 0 3' is not a cluster"):
        parse_cluster_queues(HEADER + "pilots.q 2.71 1 0 3\n")
    with pytest.raises(DocumentError, match="line 3: AVAIL: 'x'"):
        parse_cluster_queues(HEADER + "pilots.q 2.71 1 0 x 4 0 0\n")


def test_a_queues_h_rt_and_slots_are_its_limits(sge_site) -> None:
    cell = sge_site.cell
    first, second = cell.queues[:2]
    host_set = cell.run(["qconf", "-mattr", "queue", "h_rt", "00:30:00", first], as_user=False)
    assert host_set.ok, host_set.stderr
    try:
        backend = build_plugin(SgeBackend, sge_site.section())
        said = backend.gridgate_endpoint_state(endpoint=Endpoint("sge", first), timeout=60)
        other = backend.gridgate_endpoint_state(endpoint=Endpoint("sge", second), timeout=60)
        # a pilot asking an hour is not sent to the first queue: the second gets them all
        doc = sge_site.doc(pilots=2)
        doc["demand"] = {
            "static": {"sge": [{"group": "long", "pilots": 2, "resources": {"walltime": 3600}}]}
        }
        summary = sge_site.run_once(doc)
    finally:
        cell.run(["qconf", "-mattr", "queue", "h_rt", "INFINITY", first], as_user=False)
    assert said is not None and other is not None
    assert (said.max_walltime, other.max_walltime) == (1800, None)
    assert said.max_cores == cell.slots and other.max_cores == cell.slots
    assert {s["endpoint"] for s in summary["submitted"]} == {second}
    [note] = summary["notifications"]
    assert note["subject"] == f"gridgate: sge/{first} cannot run group long's pilots"


def test_the_qconf_sq_decoder_takes_the_largest_value_and_refuses_other_text() -> None:
    text = (
        "qname                 a.q\nhostlist              vm\nslots                 2,[vm=8], \\\n"
        "                      [other=4]\nh_rt                  1:00:00,[vm=90]\n"
        "qname                 b.q\nslots                 4\nh_rt                  INFINITY,[vm=60]\n"
    )
    limits = parse_queue_limits(text)
    assert (limits["a.q"].slots, limits["a.q"].walltime) == (8, 3600)
    assert (limits["b.q"].slots, limits["b.q"].walltime) == (4, None)
    with pytest.raises(DocumentError, match="queue a.q: h_rt.*'soon' is not an SGE time"):
        parse_queue_limits("qname a.q\nh_rt soon\n")
    with pytest.raises(DocumentError, match="names no queue"):
        parse_queue_limits("hostlist vm\n")
