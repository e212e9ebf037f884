"""The bypass audit's arithmetic (plugins/lsf_proxy/daemon/bypass.py), on readings of the
shape sdiag gives and tokens as the policy grants them: who is held to have gone around the
gate, and who never is (a token's cover carried into the next window, a restart, the exempt)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import prometheus_client
import pytest

from gridgate.core.scheduler import SchedulerRPCs
from gridgate.plugins.lsf_proxy.config import SECTION_SCHEMA, resolve_policies
from gridgate.plugins.lsf_proxy.daemon.bypass import (
    BypassAudit,
    bypass_line,
    old_acting,
)
from gridgate.plugins.lsf_proxy.daemon.metrics import DaemonMetrics
from gridgate.plugins.lsf_proxy.daemon.policy import PolicySettings, Token, TokenPolicy
from gridgate.plugins.lsf_proxy.schedulers import config_problems, load_scheduler
from gridgate.plugins.lsf_proxy.settings import BypassSettings, ProxydSettings

_ids = itertools.count(1)


def settings(**bypass) -> BypassSettings:
    chosen = ProxydSettings.of({"bypass": {"scheduler": "slurm", **bypass}}).bypass_audit
    assert chosen is not None
    return chosen


def reading(taken: float, since: float = 100.0, **by_user: int) -> SchedulerRPCs:
    return SchedulerRPCs("slurm", ok=True, taken=taken, since=since, by_user=by_user)


def tokens(audit: BypassAudit, user: str, count: int, opcode: str = "REQUEST_JOB_INFO") -> None:
    for _ in range(count):
        audit.granted(Token(f"t{next(_ids)}", "query", user, "h", False, 0.0, opcode=opcode))


def audit_of(tolerance: int = 2, exempt: tuple[str, ...] = ("root",)) -> BypassAudit:
    return BypassAudit(settings(audit={"tolerance": tolerance}), lambda u: u in exempt)


def test_no_scheduler_no_audit_and_the_settings_read_as_given() -> None:
    assert ProxydSettings.of({}).bypass_audit is None
    assert ProxydSettings.of({"bypass": {"scheduler": None}}).bypass_audit is None
    chosen = settings(audit={"costs": {"squeue": 5, "MY_OP": 0.5}}, **{"for": "30m"})
    assert chosen.cost("REQUEST_JOB_INFO") == 5, "a command's cost is its opcode's"
    assert chosen.cost("MY_OP") == 0.5
    assert chosen.cost("REQUEST_NODE_INFO") == 2, "the built-in upper bounds stay"
    assert chosen.cost("SOMETHING_ELSE") == 3
    assert chosen.hold == 1800 and chosen.action == "report" and chosen.interval == 10
    assert settings(**{"for": 90}).hold == 90 and settings(**{"for": "2h"}).hold == 7200


def test_a_gated_user_is_never_held_and_a_bypasser_is() -> None:
    audit = audit_of()
    assert audit.observe(reading(0, gated=0, rogue=0)) == [], "the first reading is a baseline"
    tokens(audit, "gated", 10)  # 10 squeues at most 3 RPCs each
    [found] = audit.observe(reading(10, gated=20, rogue=200))
    assert (found.user, found.rpcs, found.covered, found.excess) == ("rogue", 200, 0, 198)
    assert found.windows == 1 and (found.start, found.end) == (0, 10)
    assert audit.last == {"rogue": 198}
    assert "rogue made 200 scheduler RPCs" in found.describe(10)


def test_a_token_granted_late_in_a_window_covers_its_rpcs_in_the_next() -> None:
    audit = audit_of(tolerance=0)
    audit.observe(reading(0, late=0))
    tokens(audit, "late", 10)  # granted at the end of the window, run in the next
    assert audit.observe(reading(10, late=0)) == []
    assert audit.observe(reading(20, late=30)) == [], "the previous window's cover"
    # the cover is carried one window only: it cannot be saved up for a loop later
    [found] = audit.observe(reading(30, late=60))
    assert found.excess == 30


def test_a_restart_or_reset_of_the_counters_is_a_new_baseline_not_a_bypass() -> None:
    audit = audit_of()
    audit.observe(reading(0, user=500))
    assert audit.observe(reading(10, user=3)) == [], "counters dropped: slurmctld restarted"
    assert audit.baselines == 2 and "new baseline" in audit.skipped
    assert audit.observe(reading(20, since=999, user=4)) == [], "Data since moved: reset"
    assert audit.baselines == 3
    [found] = audit.observe(reading(30, since=999, user=100))
    assert found.rpcs == 96, "counted from the new baseline"


def test_the_exempt_a_disabled_category_and_an_unread_counter_hold_no_one() -> None:
    audit = audit_of(exempt=("root", "slurm"))
    audit.observe(reading(0, root=0, slurm=0, user=0))
    assert audit.observe(reading(10, root=900, slurm=900, user=0)) == []
    audit.disturb()  # a category disabled: its commands ran without tokens
    assert audit.observe(reading(20, root=900, slurm=900, user=300)) == []
    assert "disabled" in audit.skipped
    broken = SchedulerRPCs("slurm", ok=False, message="sdiag exit 1: Unable to contact")
    assert audit.observe(broken) == [] and "Unable to contact" in audit.problem
    [found] = audit.observe(reading(30, root=900, slurm=900, user=400))
    assert found.rpcs == 100 and audit.problem == "", "the baseline survived the bad read"


def test_windows_in_a_row_are_counted_and_start_again_after_a_clean_one() -> None:
    audit = audit_of()
    audit.observe(reading(0, u=0))
    assert [f.windows for f in audit.observe(reading(10, u=50))] == [1]
    assert [f.windows for f in audit.observe(reading(20, u=100))] == [2]
    assert audit.observe(reading(30, u=101)) == [] and audit.last == {}
    assert [f.windows for f in audit.observe(reading(40, u=200))] == [1]


def test_the_diagnostic_line_has_the_request_lines_columns() -> None:
    audit = audit_of()
    audit.observe(reading(1796300000, u=0))
    [found] = audit.observe(reading(1796300010, u=50))
    fields = bypass_line(found).split(" ", 4)[4].split(",")
    assert fields[:6] == ["BYPASS", "-", "u", "-", "48", "0"] and len(fields) == 8


@pytest.mark.parametrize(
    ("bypass", "where", "says"),
    [
        ({"scheduler": "nosuch"}, ("bypass", "scheduler"), "installed: slurm"),
        (
            {"scheduler": "slurm", "scheduler_options": {"partitions": "batch"}},
            ("bypass", "scheduler_options", "partitions"),
            "is not of type 'array'",
        ),
        (
            {"scheduler": "slurm", "scheduler_options": {"sdiag": "/bin/x"}},
            ("bypass", "scheduler_options"),
            "sdiag",
        ),
    ],
)
def test_a_wrong_scheduler_or_option_is_named(bypass, where, says) -> None:
    [(path, message)] = config_problems(bypass)
    assert path == where and says in message, message


def test_the_schema_pins_the_section() -> None:
    spec = SECTION_SCHEMA["properties"]["bypass"]["properties"]
    assert spec["action"]["enum"] == ["report", "block", "deny_partition"]
    assert spec["action"]["default"] == "report" and spec["for"]["default"] == "1h"
    assert spec["audit"]["properties"]["interval"]["default"] == 10


def test_the_metric_is_the_last_windows_excess_per_user_with_the_name_escaped() -> None:
    metrics = DaemonMetrics(TokenPolicy(PolicySettings(resolve_policies(None, None))))
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert "gridgate_bypass_rpcs" not in text, "no audit, no series"
    audit = audit_of()
    metrics.bypassing = lambda: audit.last
    audit.observe(reading(0, rogue=0, **{"odd\x1b[2Jname": 0}))
    audit.observe(reading(10, rogue=60, **{"odd\x1b[2Jname": 30}))
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert 'gridgate_bypass_rpcs{user="rogue"} 58.0' in text
    assert 'gridgate_bypass_rpcs{user="odd\\\\x1b[2Jname"} 28.0' in text, text
    audit.observe(reading(20, rogue=60, **{"odd\x1b[2Jname": 30}))
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert 'user="rogue"' not in text, "a clean window clears it"


def test_the_peers_grants_cover_their_users_once_their_heartbeat_reaches_past_the_window() -> None:
    audit = audit_of(tolerance=0)
    peer = {"pb": {"at": 0.0, "covered": {"gated": 0.0}}}
    audit.observe(reading(0, gated=0, rogue=0), peer)
    # 10 tokens of squeue given by pb, 20 RPCs served; pb's heartbeat is from before the read
    assert audit.observe(reading(10, gated=20, rogue=100), {"pb": {"at": 5.0, "covered": {}}}) == []
    assert "waiting for the peers' grants" in audit.skipped and audit.windows == 0
    [found] = audit.observe(
        reading(20, gated=40, rogue=200), {"pb": {"at": 21.0, "covered": {"gated": 60.0}}}
    )
    assert (found.user, found.rpcs, found.start, found.end) == ("rogue", 200, 0, 20)
    # pb restarted: its cumulative cover began again from 0
    assert (
        audit.observe(
            reading(30, gated=49, rogue=200), {"pb": {"at": 31.0, "covered": {"gated": 9.0}}}
        )
        == []
    )


def test_a_daemon_that_is_not_first_keeps_a_baseline_without_judging() -> None:
    audit = audit_of()
    audit.follow(reading(0, rogue=0), "audited by pa, the first live daemon")
    audit.follow(reading(10, rogue=500), "audited by pa, the first live daemon")
    assert audit.windows == 0 and "audited by pa" in audit.skipped
    [found] = audit.observe(reading(20, rogue=600))  # pa stopped: this one takes over
    assert found.rpcs == 100, "from its last baseline, not from the start"


def test_the_schedulers_command_paths_are_taken_from_the_config_files_folder(tmp_path) -> None:
    manager = load_scheduler(
        "slurm", {"commands": {"sdiag": "bin/sdiag"}}, tmp_path, Path("/etc/gridgate")
    )
    [plugin] = [p for p in manager.get_plugins() if getattr(p, "name", "") == "slurm"]
    assert plugin.config["commands"] == {"sdiag": "/etc/gridgate/bin/sdiag", "scontrol": "scontrol"}


def test_a_fifo_or_a_broken_record_where_the_undo_is_kept_is_refused_not_waited_on(
    tmp_path,
) -> None:
    """What the audit must undo, and what the slurm plugin changed, are read as the other
    state files are: a FIFO put there would have blocked the daemon's start in open()."""
    fifo = tmp_path / "bypass.pa.json"
    os.mkfifo(fifo)
    assert old_acting(fifo) == {}
    broken = tmp_path / "bypass.pb.json"
    broken.write_text('{"u": {"action": "block", "until": 1')  # cut short
    assert old_acting(broken) == {}
    manager = load_scheduler("slurm", {}, tmp_path)
    [plugin] = [p for p in manager.get_plugins() if getattr(p, "name", "") == "slurm"]
    os.mkfifo(plugin.denied_file)
    os.mkfifo(plugin.trace_file)
    told = plugin.gridgate_scheduler_deny(scheduler="slurm", user="nobody", deny=False, timeout=5)
    assert told.ok and "was not denied" in told.message
    told = plugin.gridgate_scheduler_requests(scheduler="slurm", timeout=5)
    assert not told.ok and "no request trace" in told.message
