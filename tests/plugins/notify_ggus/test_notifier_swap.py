"""Swapping notifiers by config alone: the same failure scenario through the director with
notifiers [log], [email], [email, ggus] and [ggus]; each gets what it should, nothing else."""

from __future__ import annotations

import contextlib

import pytest
from loguru import logger
from test_ggus_director import AlwaysFailing

from gridgate.core.testing import director_for


def notifiers(kind: str, port: int) -> dict:
    email = {
        "host": "127.0.0.1",
        "port": port,
        "from": "gridgate@example.org",
        "error_address": "ops@example.org",
        "alarm_address": "alarms@example.org",
        "send_thread": False,
        "timeout": 5,
    }
    ggus = {
        "vo": "lhcb",
        "sites": {"wms01.example.org": "CERN-PROD"},
        "deliver": ["spool"],
        "send_thread": False,
    }
    return {
        "log": {"log": {}},
        "email": {"email": email},
        "email+ggus": {"email": email, "ggus": ggus},
        "ggus": {"ggus": ggus},
    }[kind]


@pytest.mark.parametrize("kind", ["log", "email", "email+ggus", "ggus"])
def test_same_scenario_each_notifier_set_gets_exactly_its_share(
    kind, tmp_path, smtp_server
) -> None:
    doc = {
        "director": {
            "state_dir": str(tmp_path / "state"),
            "failing_expiry": 3600,
            "ticket_expiry": 3600,
            "stall_iterations": 1000,
        },  # one server, always failing: not a stall test
        "demand": {"static": {"testbed": 1}},
        "notifiers": notifiers(kind, smtp_server.port),
    }
    logged: list[str] = []
    sink = logger.add(lambda m: logged.append(m.record["message"]), level="ERROR")
    try:
        with contextlib.closing(director_for(doc, AlwaysFailing())) as director:
            levels = []
            for _ in range(3):  # error, then alarm, then alarm
                levels += [n.level for n in director.run_iteration().notifications]
                director.clock.advance(3601)
            for name in ("notifiers:email", "notifiers:ggus"):
                plugin = director.pm.get_plugin(name)
                if plugin is not None:
                    plugin.flush(10)
    finally:
        logger.remove(sink)
    assert levels == ["error", "alarm", "alarm"]
    mails = [r for m in smtp_server.handler.messages for r in m.rcpt_tos]
    tickets = sorted((tmp_path / "state" / "tickets").glob("*.txt"))
    # the log notifier is the built-in default: it always hears everything
    assert sum("wms01.example.org: error executing Job Submit" in m for m in logged) == 3
    if "email" in kind:
        assert sorted(mails) == ["alarms@example.org", "alarms@example.org", "ops@example.org"]
    else:
        assert mails == []
    if "ggus" in kind:
        assert len(tickets) == 1  # one ticket for the whole episode
    else:
        assert tickets == []
