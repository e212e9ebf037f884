"""Both notifiers configured by plain config under the real director: a server that keeps
failing gives an error mail, then alarms; the alarms open one GGUS ticket for the episode."""

from __future__ import annotations

import contextlib

from gridgate.core import hookimpl
from gridgate.core.model import BackendInfo, CommandResult, Endpoint, SubmitRequest, SubmitResult
from gridgate.core.testing import director_for

SERVER = Endpoint(
    "testbed", "wms01.example.org", "https://wms01.example.org:7443/glite_wms_wmproxy_server"
)


class AlwaysFailing:
    """A backend with one server that answers every submission with a gLite error."""

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        return BackendInfo("testbed", (SERVER,)) if backend == "testbed" else None

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend != "testbed":
            return None
        command = CommandResult(
            ("glite-wms-job-submit", "-a", "pilot.jdl"),
            1,
            "",
            "\nError - Operation failed\nUnable to submit the job\n",
        )
        return SubmitResult(endpoint, ok=False, command=command)


def test_director_drives_email_and_ggus_from_config(tmp_path, smtp_server):
    doc = {
        "director": {
            "state_dir": str(tmp_path / "state"),
            "failing_expiry": 3600,
            "ticket_expiry": 7200,
            "stall_iterations": 1000,
        },  # one server failing: not a stall test
        "demand": {"static": {"testbed": 1}},
        "notifiers": {
            "email": {
                "host": "127.0.0.1",
                "port": smtp_server.port,
                "from": "gridgate@example.org",
                "error_address": "ops@example.org",
                "alarm_address": "alarms@example.org",
                "send_thread": False,
                "timeout": 5,
            },
            "ggus": {
                "vo": "lhcb",
                "sites": {"wms01.example.org": "CERN-PROD"},
                "deliver": ["spool", "mail"],
                "mail": {"to": "shifter@example.org"},
                "send_thread": False,
            },
        },
    }
    with contextlib.closing(director_for(doc, AlwaysFailing())) as director:
        email = director.pm.get_plugin("notifiers:email")
        ggus = director.pm.get_plugin("notifiers:ggus")
        levels = []
        for _ in range(4):
            summary = director.run_iteration()
            levels += [n.level for n in summary.notifications]
            director.clock.advance(3601)  # past the failing cache, inside the tickets cache
        email.flush(10)
        ggus.flush(10)
    assert levels[0] == "error" and "alarm" in levels
    by_rcpt: dict[str, int] = {}
    for m in smtp_server.handler.messages:
        for r in m.rcpt_tos:
            by_rcpt[r] = by_rcpt.get(r, 0) + 1
    assert by_rcpt["ops@example.org"] == levels.count("error")
    assert by_rcpt["alarms@example.org"] == levels.count("alarm")
    assert by_rcpt["shifter@example.org"] == 1  # one ticket for the whole episode
    tickets = list((tmp_path / "state" / "tickets").glob("*.txt"))
    assert len(tickets) == 1
    text = tickets[0].read_text()
    assert "Affected Site: CERN-PROD" in text and "Unable to submit the job" in text
