"""What an ARC CE's queue says of itself over REST (``gridgate_endpoint_state``, issue 45): the
GLUE2 document of the private CE read with ``GET /rest/1.0/info``, one read per CE and
interval, and the decoder's refusals."""

from __future__ import annotations

import json
import time

import pytest

from gridgate.core.documents import DocumentError
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.plugins.arc.documents import glue_shares

pytestmark = pytest.mark.xdist_group("arc")


def _share(witness) -> dict:
    """The CE's own share, as its GLUE2 document says (read with http.client)."""
    status, reason, body = witness.call("GET", "info")
    assert status == 200, (status, reason)
    service = json.loads(body)["Domains"]["AdminDomain"]["Services"]["ComputingService"]
    share = service["ComputingShare"]
    assert isinstance(share, dict), "the private CE has one share"
    return share


def test_a_ces_share_reports_what_its_glue2_document_says(arc, rest_site, witness) -> None:
    site = rest_site(arc)
    backend = site.backend(queue_state_interval=0)  # read at every call
    (endpoint,) = backend.backend_info().endpoints
    # the document changes at each info-provider run (10 s): compare a read between two
    # equal ones of the witness
    for _ in range(5):
        share = _share(witness(arc))
        said = backend.gridgate_endpoint_state(endpoint=endpoint, timeout=60)
        if _share(witness(arc)) == share:
            break
    assert said is not None and said.serving == share["ServingState"] == "production"
    assert said.free_slots == int(share["FreeSlots"])
    assert said.waiting == int(share["WaitingJobs"]) + int(share["PreLRMSWaitingJobs"])
    assert said.running == int(share["RunningJobs"])
    assert said.max_walltime is None and "MaxWallTime" not in share  # the fork share has none
    assert said.source == "A-REX GLUE2 ComputingShare" and said.read_at > 0
    # the queue named: its share; a queue the CE does not have: nothing
    named = rest_site(arc, "named").backend(endpoints=[{"url": arc.url, "queue": "fork"}])
    (fork,) = named.backend_info().endpoints
    by_queue = named.gridgate_endpoint_state(endpoint=fork, timeout=60)
    assert by_queue is not None and by_queue.serving == "production"
    assert by_queue.free_slots is not None and by_queue.source == said.source
    other = rest_site(arc, "other").backend(endpoints=[{"url": arc.url, "queue": "nosuch"}])
    (nosuch,) = other.backend_info().endpoints
    assert other.gridgate_endpoint_state(endpoint=nosuch, timeout=60) is None
    assert backend.gridgate_endpoint_state(endpoint=Endpoint("slurm", "x"), timeout=60) is None


def test_a_job_submitted_outside_gridgate_is_counted(arc, rest_site, witness) -> None:
    # a job of the same CE, sent by another backend instance (its own state): it runs (fork)
    outside = rest_site(arc, "outside", pilot="#!/bin/sh\nsleep 120\n").backend()
    (endpoint,) = outside.backend_info().endpoints
    result = outside.gridgate_submit(endpoint=endpoint, request=SubmitRequest("arc"), timeout=60)
    assert result is not None and result.ok, result
    try:
        fresh = rest_site(arc).backend(queue_state_interval=0)  # read at every call
        deadline = time.monotonic() + 90  # the info provider runs every 10 s
        said = fresh.gridgate_endpoint_state(endpoint=endpoint, timeout=60)
        while said is not None and (said.waiting or 0) + (said.running or 0) < 1:
            assert time.monotonic() < deadline, f"the job never showed in GLUE2: {said}"
            time.sleep(2)
            said = fresh.gridgate_endpoint_state(endpoint=endpoint, timeout=60)
        assert said is not None
    finally:
        witness(arc).jobs("kill", list(result.job_ids))
        witness(arc).jobs("clean", list(result.job_ids))


def test_one_get_info_answers_for_every_queue_of_a_ce(arc, rest_site, monkeypatch) -> None:
    from gridgate.plugins.arc.rest.client import ArexClient

    asked: list[str] = []
    real = ArexClient.info

    def counted(self, deadline):
        asked.append(self.service)
        return real(self, deadline)

    monkeypatch.setattr(ArexClient, "info", counted)
    entries = [arc.url, {"url": arc.url, "queue": "fork"}, {"url": arc.url, "queue": "x"}]
    backend = rest_site(arc).backend(endpoints=entries)
    for _ in range(3):
        for endpoint in backend.backend_info().endpoints:
            backend.gridgate_endpoint_state(endpoint=endpoint, timeout=60)
    assert asked == [arc.url]
    asked.clear()
    quiet = rest_site(arc, "quiet").backend(queue_state_interval=None)
    (endpoint,) = quiet.backend_info().endpoints
    assert quiet.gridgate_endpoint_state(endpoint=endpoint, timeout=60) is None and asked == []


def test_a_ce_that_does_not_answer_says_nothing(arc, rest_site) -> None:
    backend = rest_site(arc).backend(url="https://localhost:1/arex", command_timeout=5)
    (endpoint,) = backend.backend_info().endpoints
    assert backend.gridgate_endpoint_state(endpoint=endpoint, timeout=5) is None


# --- the decoder --------------------------------------------------------------------------------


def _document(share: dict, endpoints: list[dict] | None = None) -> bytes:
    service = {"ComputingShare": share, "ComputingEndpoint": endpoints or []}
    return json.dumps(
        {"Domains": {"AdminDomain": {"Services": {"ComputingService": service}}}}
    ).encode()


SHARE = {
    "ID": "urn:s:batch",
    "Name": "batch",
    "MappingQueue": "batch",
    "ServingState": "production",
}


def test_the_glue2_decoder_reads_shares_and_the_drain_of_their_rest_endpoint() -> None:
    figures = {"WaitingJobs": "4", "PreLRMSWaitingJobs": "2", "RunningJobs": 7}
    limits = {"FreeSlots": "0", "MaxWallTime": "3600", "MaxMainMemory": "2000"}
    rest = {
        "InterfaceName": "org.nordugrid.arcrest",
        "ServingState": "draining",
        "Associations": {"ComputingShareID": ["urn:s:batch"]},
    }
    emies = {
        **rest,
        "InterfaceName": "org.ogf.glue.emies.activitycreation",
        "ServingState": "closed",
    }
    other = {**SHARE, "ID": "urn:s:long", "Name": "long", "MappingQueue": ""}
    [batch, long] = glue_shares(_document([{**SHARE, **figures, **limits}, other], [rest, emies]))
    assert (batch.serving, batch.waiting, batch.running, batch.free_slots) == ("draining", 6, 7, 0)
    assert (batch.max_walltime, batch.max_memory_mb, batch.max_slots) == (3600, 2000, None)
    # the other share: its own state, its name its queue, nothing published
    assert (long.queue, long.serving, long.waiting) == ("long", "production", None)


@pytest.mark.parametrize(
    ("document", "says"),
    [
        (_document({**SHARE, "ServingState": "open"}), "ServingState"),
        (_document({**SHARE, "WaitingJobs": "many"}), "WaitingJobs"),
        (_document({**SHARE, "FreeSlots": -1}), "FreeSlots"),
        (b'{"Domains": {}}', "AdminDomain"),
        (b"<xml/>", "A-REX GLUE2 info"),
    ],
)
def test_the_glue2_decoder_refuses_what_a_rex_does_not_write(document, says) -> None:
    with pytest.raises(DocumentError, match="A-REX GLUE2 info") as caught:
        glue_shares(document)
    assert says in str(caught.value)


@pytest.fixture
def draining_ce():
    """A CE of its own whose session folder is marked ``drain``: A-REX publishes its REST
    endpoint draining (its share stays in production: A-REX 6.17 publishes no other)."""
    from gridgate.plugins.arc.ce import ArcCE, CEError

    ce = ArcCE(drain_sessions=True, tokens=False)
    try:
        ce.start()
    except CEError as exc:
        ce.stop()
        pytest.fail(str(exc), pytrace=False)
    try:
        yield ce
    finally:
        ce.stop()


def test_a_draining_ce_gets_no_pilot_and_shows_so(draining_ce, rest_site, tmp_path) -> None:
    from gridgate.core.clock import SYSTEM_CLOCK
    from gridgate.core.testing import director_for

    site = rest_site(draining_ce)
    (endpoint,) = site.backend().backend_info().endpoints
    said = site.backend().gridgate_endpoint_state(endpoint=endpoint, timeout=60)
    assert said is not None and (said.serving, said.reason) == ("draining", "ServingState draining")
    doc = {
        "director": {"state_dir": str(tmp_path / "state"), "command_timeout": 60},
        "state": {"driver": "sqlite", "path": str(tmp_path / "state.db")},
        "backends": {"arc": site.section()},
        "demand": {"static": {"arc": 2}},
    }
    made = director_for(doc, clock=SYSTEM_CLOCK)
    try:
        summary = made.run_iteration()
    finally:
        made.close()
    assert summary.failures == () and not [r for r in summary.records if r.outcome == "submitted"]
    assert {r.failure_kind for r in summary.records} == {"unavailable"}
    shown = summary.unavailable[endpoint.key]
    assert (shown.state, shown.source) == ("drained", "queue")
    assert "its queue is draining (ServingState draining)" in shown.reason


def test_pilots_asking_more_walltime_than_the_share_allows_are_not_sent(
    rest_site, tmp_path, witness
) -> None:
    from gridgate.core.clock import SYSTEM_CLOCK
    from gridgate.core.testing import director_for
    from gridgate.plugins.arc.ce import ArcCE, CEError

    ce = ArcCE(max_walltime=1800, tokens=False)  # the share publishes MaxWallTime 1800
    try:
        ce.start()
    except CEError as exc:
        ce.stop()
        pytest.fail(str(exc), pytrace=False)
    try:
        site = rest_site(ce)
        (endpoint,) = site.backend().backend_info().endpoints
        said = site.backend().gridgate_endpoint_state(endpoint=endpoint, timeout=60)
        assert said is not None and said.max_walltime == 1800
        groups = [
            {"group": "long", "pilots": 1, "resources": {"walltime": 3600}},
            {"group": "short", "pilots": 1, "resources": {"walltime": 600}},
        ]
        doc = {
            "director": {"state_dir": str(tmp_path / "state"), "command_timeout": 60},
            "state": {"driver": "sqlite", "path": str(tmp_path / "state.db")},
            "backends": {"arc": site.section()},
            "demand": {"static": {"arc": groups}},
        }
        made = director_for(doc, clock=SYSTEM_CLOCK)
        try:
            summary = made.run_iteration()
        finally:
            made.close()
        outcomes = {(r.group, r.outcome, r.failure_kind) for r in summary.records}
        assert outcomes == {("long", "skipped", "config"), ("short", "submitted", "")}
        [note] = summary.notifications
        assert note.level == "error" and "a walltime of 3600 s (the queue allows 1800)" in note.body
        sent = [i for r in summary.records for i in r.job_ids]
        witness(ce).jobs("kill", sent)
    finally:
        ce.stop()
