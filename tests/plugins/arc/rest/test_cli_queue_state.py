"""What an ARC CE's queue says of itself through the ARC client (``interface: cli``,
``gridgate_endpoint_state``, issue 45): the real ``arcinfo -l -c URL`` of the private CE, one run
per CE and interval, compared with the CE's GLUE2 document read by the REST witness; a drained
CE; and the line decoder's refusals (the real output of A-REX 6.17's arcinfo is kept below)."""

from __future__ import annotations

import json

import pytest

from gridgate.core.documents import DocumentError
from gridgate.core.model import Endpoint
from gridgate.plugins.arc.documents import arcinfo_shares

pytestmark = pytest.mark.xdist_group("arc")

#: the client's PATH and a HOME of the test's own (the client must not write ~/.arc)
CLIENT_PATH = "/usr/bin:/bin"


def _cli(site, tmp_path, **extra):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": CLIENT_PATH, "HOME": str(home)}
    return site.backend(interface="cli", env=env, **extra), home


def _share(witness) -> dict:
    status, reason, body = witness.call("GET", "info")
    assert status == 200, (status, reason)
    service = json.loads(body)["Domains"]["AdminDomain"]["Services"]["ComputingService"]
    share = service["ComputingShare"]
    assert isinstance(share, dict), "the private CE has one share"
    return share


def test_arcinfo_gives_the_free_slots_and_serving_state(arc, rest_site, witness, tmp_path) -> None:
    backend, home = _cli(rest_site(arc), tmp_path, queue_state_interval=0)
    (endpoint,) = backend.backend_info().endpoints
    for _ in range(5):  # the document changes at each info-provider run (10 s)
        share = _share(witness(arc))
        said = backend.gridgate_endpoint_state(endpoint=endpoint, timeout=60)
        if _share(witness(arc)) == share:
            break
    assert said is not None and said.serving == share["ServingState"] == "production"
    assert said.free_slots == int(share["FreeSlots"])
    # arcinfo -l prints no job counts: not guessed
    assert (said.waiting, said.running, said.max_memory_mb, said.max_cores) == (None,) * 4
    assert said.max_walltime is None and "MaxWallTime" not in share  # the fork share has none
    assert said.source == "arcinfo -l share" and said.read_at > 0
    assert not (home / ".arc").exists(), "arcinfo wrote ~/.arc: -z missing"
    named = rest_site(arc, "named")
    by_queue, _ = _cli(named, tmp_path, endpoints=[{"url": arc.url, "queue": "fork"}])
    (fork,) = by_queue.backend_info().endpoints
    found = by_queue.gridgate_endpoint_state(endpoint=fork, timeout=60)
    assert found is not None and found.serving == "production" and found.free_slots is not None
    other, _ = _cli(rest_site(arc, "other"), tmp_path, endpoints=[{"url": arc.url, "queue": "x"}])
    (nosuch,) = other.backend_info().endpoints
    assert other.gridgate_endpoint_state(endpoint=nosuch, timeout=60) is None
    assert backend.gridgate_endpoint_state(endpoint=Endpoint("slurm", "x"), timeout=60) is None


def test_one_arcinfo_answers_for_every_queue_of_a_ce(arc, rest_site, tmp_path, monkeypatch):
    from gridgate.plugins.arc.cli import CliInterface

    asked: list[str] = []
    real = CliInterface.arcinfo

    def counted(self, ce, timeout):
        asked.append(ce.endpoint.url)
        return real(self, ce, timeout)

    monkeypatch.setattr(CliInterface, "arcinfo", counted)
    entries = [arc.url, {"url": arc.url, "queue": "fork"}, {"url": arc.url, "queue": "x"}]
    backend, _ = _cli(rest_site(arc), tmp_path, endpoints=entries)
    said = []
    for _ in range(3):
        for endpoint in backend.backend_info().endpoints:
            said.append(backend.gridgate_endpoint_state(endpoint=endpoint, timeout=60))
    assert asked == [arc.url] and [s is not None for s in said[:3]] == [True, True, False]
    asked.clear()
    quiet, _ = _cli(rest_site(arc, "quiet"), tmp_path, queue_state_interval=None)
    (endpoint,) = quiet.backend_info().endpoints
    assert quiet.gridgate_endpoint_state(endpoint=endpoint, timeout=60) is None and asked == []


def test_a_ce_that_does_not_answer_arcinfo_says_nothing(arc, rest_site, tmp_path) -> None:
    down = rest_site(arc, "down")
    backend, _ = _cli(down, tmp_path, endpoints=["https://localhost:1/arex"], command_timeout=20)
    (endpoint,) = backend.backend_info().endpoints
    assert backend.gridgate_endpoint_state(endpoint=endpoint, timeout=20) is None


@pytest.fixture
def drained_ce():
    """A CE of its own whose session folder is marked ``drain`` (A-REX publishes its
    endpoints draining) and whose queue has a wall-time limit of 90 minutes."""
    from gridgate.plugins.arc.ce import ArcCE, CEError

    ce = ArcCE(drain_sessions=True, tokens=False, max_walltime=5400)
    try:
        ce.start()
    except CEError as exc:
        ce.stop()
        pytest.fail(str(exc), pytrace=False)
    try:
        yield ce
    finally:
        ce.stop()


def test_a_drained_ce_is_drained_through_arcinfo(drained_ce, rest_site, tmp_path) -> None:
    from gridgate.core.clock import SYSTEM_CLOCK
    from gridgate.core.testing import director_for

    site = rest_site(drained_ce)
    backend, _ = _cli(site, tmp_path)
    (endpoint,) = backend.backend_info().endpoints
    said = backend.gridgate_endpoint_state(endpoint=endpoint, timeout=60)
    assert said is not None
    assert (said.serving, said.reason) == ("draining", "Serving state draining")
    assert said.max_walltime == 5400  # "Max wall-time: 1 hour 30 minutes"
    section = site.section(interface="cli", env={"PATH": CLIENT_PATH, "HOME": str(tmp_path)})
    doc = {
        "director": {"state_dir": str(tmp_path / "state"), "command_timeout": 60},
        "state": {"driver": "sqlite", "path": str(tmp_path / "state.db")},
        "backends": {"arc": section},
        "demand": {"static": {"arc": 2}},
    }
    made = director_for(doc, clock=SYSTEM_CLOCK)
    try:
        summary = made.run_iteration()
    finally:
        made.close()
    assert summary.failures == () and not [r for r in summary.records if r.outcome == "submitted"]
    assert {r.failure_kind for r in summary.records} == {"unavailable"}


# --- the decoder --------------------------------------------------------------------------------

#: arcinfo -l -c URL of the private fork CE (ARC 6.17, drain_sessions, max_walltime 3600), cut
#: to one endpoint of each serving state and the share
REAL = """Computing service:
  Name: localhost
  ID: urn:ogf:ComputingService:localhost:arex
  Type: org.nordugrid.arex

  6 Endpoints
  Endpoint Information:
    URL: https://localhost:18448/arex
    Interface: org.ogf.glue.emies.resourceinfo
    Health state: ok
    Serving state: production

  Endpoint Information:
    URL: https://localhost:18448/arex
    Interface: org.nordugrid.arcrest
    Interface versions:
      0.1
    Quality level: testing
    Health state: ok
    Serving state: draining
    Issuer CA: /DC=org/DC=nordugrid/DC=ARC/O=TestCA/CN=ARC TestCA gridgate

  Batch System Information:
    Resource manager: fork (0.9)
    Total slots: 2

  Share Information:
    Name: fork
    Mapping queue: fork
    Max wall-time: 1 hour
    Max running jobs: 1
    Doesn't support preemption
    Free slots: 2
    Free slots grouped according to time limits (limit: free slots):
      unspecified: 2
    Used slots: 3
    Requested slots: 0
"""


def test_the_arcinfo_decoder_reads_the_real_output() -> None:
    (share,) = arcinfo_shares(REAL)
    assert (share.name, share.queue, share.serving) == ("fork", "fork", "draining")
    assert (share.free_slots, share.max_walltime) == (2, 3600)
    assert (share.waiting, share.running, share.max_memory_mb) == (None, None, None)
    # only the REST endpoints' state counts: an EMI-ES one draining does not drain the share
    emies = REAL.replace("Serving state: draining", "Serving state: production").replace(
        "Serving state: production\n\n  Endpoint", "Serving state: closed\n\n  Endpoint", 1
    )
    assert arcinfo_shares(emies)[0].serving == "production"
    longer = REAL.replace("Max wall-time: 1 hour", "Max wall-time: 2 hours, 5 minutes 1 second")
    assert arcinfo_shares(longer)[0].max_walltime == 7501


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (REAL.replace("Serving state: draining", "Serving state: open"), "line 20: Serving state"),
        (REAL.replace("Free slots: 2", "Free slots: many"), "line 33: Free slots"),
        (REAL.replace("Free slots: 2", "Free slots: -1"), "line 33: Free slots"),
        (REAL.replace("1 hour", "1 fortnight"), "line 30: Max wall-time"),
        (REAL.replace("1 hour", "hour"), "line 30: Max wall-time"),
        ("ERROR: Failed to retrieve information\n", "line 1"),
        ("", "line 1"),
    ],
)
def test_the_arcinfo_decoder_refuses_what_arcinfo_does_not_print(text, says) -> None:
    with pytest.raises(DocumentError, match="arcinfo -l output") as caught:
        arcinfo_shares(text)
    assert says in str(caught.value)
