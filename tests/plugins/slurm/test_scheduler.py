"""The Slurm controller as the token daemon reads and changes it (plugins/slurm/scheduler.py):
sdiag's counters on the private cluster, and a user taken out of the partitions' AllowGroups
and put back, checked with real sbatch calls as real users."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path

from support.uids import as_user, real_user

from gridgate.core.config import apply_defaults
from gridgate.core.plugins import PluginContext
from gridgate.plugins.slurm.scheduler import SlurmScheduler, parse_protocol_lines, parse_sdiag


def scheduler(slurm, state: Path, **options) -> SlurmScheduler:
    config = {
        "commands": {c: shutil.which(c, path="/usr/bin:/bin") for c in ("sdiag", "scontrol")},
        "env": dict(slurm.env),
        **options,
    }
    apply_defaults(config, SlurmScheduler.config_schema)
    return SlurmScheduler(config, PluginContext(state_dir=state))


def allow_groups(slurm, partition: str) -> str:
    shown = slurm.scontrol("-o", "show", "partition", partition)
    fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
    return fields["AllowGroups"]


def open_partitions(slurm) -> None:
    """Every partition open to every group again, whatever a test left."""
    for partition in slurm.partitions:
        slurm.scontrol("update", f"PartitionName={partition}", "AllowGroups=ALL")


def sbatch_as(slurm, user: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *as_user(user),
            shutil.which("sbatch", path="/usr/bin:/bin"),
            "--parsable",
            "-p",
            "batch",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm.client_env(),
        cwd="/",
    )


def squeue_as(slurm, user: str, times: int) -> None:
    """``squeue`` run ``times`` times as ``user``, each successfully."""
    squeue = shutil.which("squeue", path="/usr/bin:/bin")
    for _ in range(times):
        done = subprocess.run(
            [*as_user(user), squeue],
            capture_output=True,
            timeout=60,
            env=slurm.client_env(),
            cwd="/",
        )
        assert done.returncode == 0, done.stderr


def test_gridgate_scheduler_rpcs_is_sdiags_count_of_each_users_requests(slurm, tmp_path) -> None:
    plugin = scheduler(slurm, tmp_path)
    assert plugin.gridgate_scheduler_rpcs(scheduler="lsf", timeout=10) is None, "not its own"
    with real_user("ggsd") as user:
        before = plugin.gridgate_scheduler_rpcs(scheduler="slurm", timeout=30)
        assert before.ok, before.message
        squeue_as(slurm, user, 5)
        after = plugin.gridgate_scheduler_rpcs(scheduler="slurm", timeout=30)
    # "Data since" is 0 ("Jan 01 1970") on a controller that has not reset its counters yet
    assert after.ok and after.since == before.since and after.taken >= before.taken > 0
    # squeue asks for job and partition info: 2 RPCs each on 22.05, at least 1
    assert after.by_user.get(user, 0) - before.by_user.get(user, 0) >= 5, after.by_user
    jobs = after.by_type["REQUEST_JOB_INFO"]
    assert jobs.count >= 5 and jobs.average_ms > 0
    assert after.load["server_threads"] >= 1
    assert after.command is not None and after.command.ok


def test_a_login_of_16_characters_or_more_is_counted_as_itself(slurm, tmp_path) -> None:
    # sdiag prints the user column as %-16s(%8u): a login of 16 characters or more fills it
    # and leaves no blank before "(uid)", and a reading split on blanks lost the row
    plugin = scheduler(slurm, tmp_path)
    with real_user("ggsdiaglongname") as user:
        assert len(user) > 16
        squeue_as(slurm, user, 3)
        after = plugin.gridgate_scheduler_rpcs(scheduler="slurm", timeout=30)
    assert after.ok, after.message
    assert after.by_user.get(user, 0) >= 3, after.by_user


def sdiag_row(name: str, width: int, number: int, count: int, total: int) -> str:
    """A row as sdiag prints it: ``\\t%-16s(%8u) count:%-6u ave_time:%-6u total_time:%u``
    (the user table; the type table is ``%-40s(%5u)``)."""
    digits = 8 if width == 16 else 5
    average = total // count
    return (
        f"\t{name:<{width}}({number:>{digits}}) count:{count:<6} ave_time:{average:<6} "
        f"total_time:{total}\n"
    )


def test_sdiags_rows_are_read_by_its_formats() -> None:
    # as slurmctld 22.05's sdiag prints them (src/sdiag/sdiag.c), 16-character logins too
    text = (
        "sdiag output at Fri Dec 04 21:00:00 2026 (1796418000)\n"
        "Data since      Fri Dec 04 20:00:00 2026 (1796414400)\n"
        "Server thread count:  3\n"
        "Remote Procedure Call statistics by message type\n"
        + sdiag_row("REQUEST_PARTITION_INFO", 40, 2009, 12, 1800)
        + "\nRemote Procedure Call statistics by user\n"
        + sdiag_row("root", 16, 0, 40, 3600)
        + sdiag_row("firstname.lastna", 16, 20001, 7, 700)
        + sdiag_row("firstname.lastname", 16, 20002, 5, 500)
    )
    read = parse_sdiag(text)
    assert read.ok, read.message
    assert read.by_user == {"root": 40, "firstname.lastna": 7, "firstname.lastname": 5}
    assert read.by_type["REQUEST_PARTITION_INFO"].total_ms == 1.8
    assert (read.taken, read.since) == (1796418000, 1796414400)
    bad = parse_sdiag(text.replace("count:5 ", "count:x "))
    assert not bad.ok and "not sdiag's output" in bad.message


def test_what_is_not_sdiags_output_is_not_read_as_counters() -> None:
    told = parse_sdiag("sdiag: error: Unable to contact slurm controller (connect failure)\n")
    assert not told.ok and "not sdiag's output" in told.message
    assert not parse_sdiag("").ok


def test_a_controller_that_does_not_answer_is_a_failed_reading(slurm, tmp_path) -> None:
    plugin = scheduler(slurm, tmp_path)
    slurm.stop_controller()
    try:
        told = plugin.gridgate_scheduler_rpcs(scheduler="slurm", timeout=20)
    finally:
        slurm.start_controller()
    assert not told.ok and "sdiag" in told.message, told


def test_gridgate_scheduler_deny_refuses_a_users_jobs_and_puts_back_exactly(
    slurm, tmp_path
) -> None:
    plugin = scheduler(slurm, tmp_path)
    try:
        with real_user("ggdn") as user, real_user("ggok") as other:
            listed = f"{user},{other}"
            for partition in slurm.partitions:  # a list: ALL is never written out
                slurm.scontrol("update", f"PartitionName={partition}", f"AllowGroups={listed}")
            assert sbatch_as(slurm, user).returncode == 0
            denied = plugin.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=True, timeout=30
            )
            assert denied.ok and set(denied.changed) == set(slurm.partitions), denied
            refused = sbatch_as(slurm, user)
            assert refused.returncode != 0
            assert "not permitted to use this partition" in refused.stderr
            assert sbatch_as(slurm, other).returncode == 0, "only the denied user is refused"
            assert user not in allow_groups(slurm, "batch").split(",")
            # a daemon restarted in between: what to put back is in the state folder
            again = scheduler(slurm, tmp_path)
            admitted = again.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=False, timeout=30
            )
            assert admitted.ok, admitted
            assert allow_groups(slurm, "batch") == listed, "exactly what was there"
            assert sbatch_as(slurm, user).returncode == 0
            assert (
                "was not denied"
                in again.gridgate_scheduler_deny(
                    scheduler="slurm", user=user, deny=False, timeout=30
                ).message
            )
    finally:
        open_partitions(slurm)


def test_a_partition_changed_meanwhile_gets_back_only_the_groups_taken(slurm, tmp_path) -> None:
    plugin = scheduler(slurm, tmp_path, partitions=["batch"])
    try:
        with real_user("ggch") as user, real_user("ggkp") as kept:
            slurm.scontrol("update", "PartitionName=batch", f"AllowGroups={user},{kept}")
            assert plugin.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=True, timeout=30
            ).ok
            assert allow_groups(slurm, "batch") == kept
            assert allow_groups(slurm, "debug") == "ALL", "only the partitions named"
            # an operator narrowed it further meanwhile: that stays, the taken group returns
            slurm.scontrol("update", "PartitionName=batch", f"AllowGroups={kept},root")
            assert plugin.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=False, timeout=30
            ).ok
            assert allow_groups(slurm, "batch").split(",") == [kept, "root", user]
    finally:
        open_partitions(slurm)


def test_a_denial_refused_by_a_later_partition_puts_back_the_earlier_ones(slurm, tmp_path) -> None:
    # issue 40 item 1: batch allows ALL, debug only the user's one group; batch is narrowed,
    # debug refused, and batch must not stay narrowed
    plugin = scheduler(slurm, tmp_path, partitions=["batch", "debug"])
    try:
        with real_user("gghf") as user:
            slurm.scontrol("update", "PartitionName=batch", f"AllowGroups={user},root")
            slurm.scontrol("update", "PartitionName=debug", f"AllowGroups={user}")
            told = plugin.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=True, timeout=30
            )
            assert not told.ok and "debug: " in told.message, told
            assert "groups are all it allows" in told.message
            assert "batch put back" in told.message and told.changed == ()
            assert allow_groups(slurm, "batch") == f"{user},root", "exactly the list it had"
            assert allow_groups(slurm, "debug") == user
            assert sbatch_as(slurm, user).returncode == 0
            assert plugin.journal(30).changes() == [], "nothing left to undo"
    finally:
        open_partitions(slurm)


def test_a_partition_open_to_all_groups_is_left_as_it_is(slurm, tmp_path) -> None:
    """Issue 40 item 2: narrowing ALL meant writing every group out (getgrall(): on an
    LDAP/SSSD site without enumeration the remote groups, and groups created meanwhile, were
    refused; two overlapping denials left the list for good). A partition open to ALL is left
    as it is, and a denial with nothing else to narrow is refused saying why."""
    plugin = scheduler(slurm, tmp_path)
    try:
        with real_user("ggal") as user:
            told = plugin.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=True, timeout=30
            )
            assert not told.ok and "allow ALL groups" in told.message, told
            assert [allow_groups(slurm, p) for p in slurm.partitions] == ["ALL"] * len(
                slurm.partitions
            )
            slurm.scontrol("update", "PartitionName=batch", f"AllowGroups={user},root")
            denied = plugin.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=True, timeout=30
            )
            assert denied.ok and denied.changed == ("batch",), denied
            assert "debug: ALL groups, left as they are" in denied.message
            assert allow_groups(slurm, "batch") == "root" and allow_groups(slurm, "debug") == "ALL"
            again = plugin.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=True, timeout=30
            )  # an overlapping second denial
            assert again.ok and allow_groups(slurm, "debug") == "ALL"
            assert plugin.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=False, timeout=30
            ).ok
            assert allow_groups(slurm, "batch") == f"{user},root", "exactly what was there"
            assert allow_groups(slurm, "debug") == "ALL"
    finally:
        open_partitions(slurm)


def test_a_denial_kept_in_the_file_of_an_older_version_is_put_back(slurm, tmp_path) -> None:
    with real_user("ggmg") as user, real_user("ggm2") as kept:
        slurm.scontrol("update", "PartitionName=batch", f"AllowGroups={kept}")
        old = {user: {"batch": {"before": "ALL", "removed": [user], "set": kept}}}
        (tmp_path / "denied.slurm.json").write_text(json.dumps(old))
        try:
            plugin = scheduler(slurm, tmp_path, partitions=["batch"])
            admitted = plugin.gridgate_scheduler_deny(
                scheduler="slurm", user=user, deny=False, timeout=30
            )
            assert admitted.ok and admitted.changed == ("batch",), admitted
            assert allow_groups(slurm, "batch") == "ALL"
            assert not (tmp_path / "denied.slurm.json").exists(), "read once, into the journal"
        finally:
            open_partitions(slurm)


def test_groups_shared_with_others_are_not_taken_unless_allowed(slurm, tmp_path) -> None:
    plugin = scheduler(slurm, tmp_path)
    try:
        with real_user("ggsh") as user:
            with real_user("ggmate", group=user) as mate:
                told = plugin.gridgate_scheduler_deny(
                    scheduler="slurm", user=user, deny=True, timeout=30
                )
                assert (
                    not told.ok and mate in told.message and "allow_shared_groups" in (told.message)
                )
                assert allow_groups(slurm, "batch") == "ALL", "nothing changed"
                slurm.scontrol("update", "PartitionName=batch", f"AllowGroups={user},root")
                loose = scheduler(slurm, tmp_path, allow_shared_groups=True)
                taken = loose.gridgate_scheduler_deny(
                    scheduler="slurm", user=user, deny=True, timeout=30
                )
                assert taken.ok and f"also refused: {mate}" in taken.message
                assert loose.gridgate_scheduler_deny(
                    scheduler="slurm", user=user, deny=False, timeout=30
                ).ok
    finally:
        open_partitions(slurm)


def test_an_unknown_partition_is_refused_by_name(slurm, tmp_path) -> None:
    missing = "nosuchpartition"
    plugin = scheduler(slurm, tmp_path, partitions=[missing])
    with real_user("ggun") as user:
        told = plugin.gridgate_scheduler_deny(scheduler="slurm", user=user, deny=True, timeout=30)
    assert not told.ok and missing in told.message


def debug_flags(slurm) -> str:
    shown = slurm.scontrol("show", "config")
    return next(
        line.split("=", 1)[1].strip()
        for line in shown.stdout.splitlines()
        if line.startswith("DebugFlags")
    )


def test_gridgate_scheduler_trace_logs_each_request_and_puts_the_flags_back(
    slurm, tmp_path
) -> None:
    plugin = scheduler(slurm, tmp_path)
    assert "Protocol" not in debug_flags(slurm)
    told = plugin.gridgate_scheduler_requests(scheduler="slurm", timeout=30)
    assert not told.ok and "no request trace" in told.message
    try:
        with real_user("ggtr") as user:
            on = plugin.gridgate_scheduler_trace(scheduler="slurm", on=True, timeout=30)
            assert on.ok and on.changed == ("DebugFlags",), on
            assert "Protocol" in debug_flags(slurm)
            squeue = shutil.which("squeue", path="/usr/bin:/bin")
            for _ in range(3):
                subprocess.run(
                    [*as_user(user), squeue],
                    capture_output=True,
                    timeout=60,
                    env=slurm.client_env(),
                    cwd="/",
                    check=True,
                )
            # a plugin made again (a restarted daemon) reads on from where the trace started
            again = scheduler(slurm, tmp_path)
            got = again.gridgate_scheduler_requests(scheduler="slurm", timeout=30)
            assert got.ok, got.message
            mine = [r for r in got.requests if r.user == user]
            assert [r.opcode for r in mine].count("REQUEST_JOB_INFO") == 3, got.requests
            assert all(r.host == "127.0.0.1" and abs(r.at - time.time()) < 120 for r in mine)
            later = again.gridgate_scheduler_requests(scheduler="slurm", timeout=30)
            assert not [r for r in later.requests if r.user == user], "each line read once"
            off = again.gridgate_scheduler_trace(scheduler="slurm", on=False, timeout=30)
            assert off.ok and "Protocol" not in debug_flags(slurm)
    finally:
        slurm.scontrol("setdebugflags", "-protocol")


def test_a_trace_an_operator_had_on_stays_on(slurm, tmp_path) -> None:
    plugin = scheduler(slurm, tmp_path)
    slurm.scontrol("setdebugflags", "+protocol")
    try:
        on = plugin.gridgate_scheduler_trace(scheduler="slurm", on=True, timeout=30)
        assert on.ok and on.changed == () and "had Protocol already" in on.message
        off = plugin.gridgate_scheduler_trace(scheduler="slurm", on=False, timeout=30)
        assert off.ok and "Protocol" in debug_flags(slurm)
    finally:
        slurm.scontrol("setdebugflags", "-protocol")


def test_gridgate_scheduler_requests_reads_the_protocol_lines_and_nothing_else() -> None:
    text = (
        "[2026-12-03T13:37:03.250] Set DebugFlags to Protocol\n"
        "[2026-12-03T13:37:05.743] slurmctld_req: received opcode REQUEST_JOB_INFO from "
        "127.0.0.1:35678 uid 0\n"
        "[2026-12-03T13:37:05.745] slurmctld_req: received opcode REQUEST_PARTITION_INFO from "
        "[::1]:35692 uid 4294967\n"
        "[2026-13-03T13:37:05.745] slurmctld_req: received opcode X from 1.2.3.4:1 uid 0\n"
    )
    first, second = parse_protocol_lines(text)
    assert (first.user, first.opcode, first.host) == ("root", "REQUEST_JOB_INFO", "127.0.0.1")
    assert first.at == datetime(2026, 12, 3, 13, 37, 5, 743000).timestamp()
    assert (second.user, second.host) == ("4294967", "::1"), "no name: the uid"


def test_which_partition_limits_slurm_enforces_without_accounting(slurm) -> None:
    """Issue 40 item 2, measured on the private Slurm 22.05 cluster (no slurmdbd:
    ``AccountingStorageType=accounting_storage/none``, ``EnforcePartLimits=ALL``): which forms
    of a denial refuse a user's ``sbatch``. ``DenyAccounts`` (naming the user's login, the
    account it would have) and ``DenyQos=normal`` are accepted by scontrol and not enforced;
    ``AllowAccounts`` refuses every job (none has an account); ``AllowGroups`` is enforced.
    docs/proxyd-limits.md says what that leaves a denial."""
    sbatch = [shutil.which("sbatch"), "-p", "debug", "-o", "/dev/null", "--wrap", "true"]

    def submits(user: str, *update: str) -> bool:
        slurm.scontrol("update", "PartitionName=debug", *update)
        done = subprocess.run(
            [*as_user(user), *sbatch],
            capture_output=True,
            text=True,
            env=slurm.client_env(),
            cwd="/",
        )
        return done.returncode == 0

    try:
        with real_user("ggme") as user:
            assert submits(user, "AllowGroups=ALL")
            assert submits(user, f"DenyAccounts={user}"), "not enforced without accounting"
            assert submits(user, "DenyAccounts=", "DenyQos=normal"), "no QOS without accounting"
            assert not submits(user, "DenyQos=", "AllowAccounts=root"), "refuses every job"
            assert not submits(user, "AllowAccounts=ALL", "AllowGroups=root")
    finally:
        for reset in ("DenyAccounts=", "DenyQos=", "AllowAccounts=ALL", "AllowGroups=ALL"):
            slurm.scontrol("update", "PartitionName=debug", reset)


def test_request_lines_forged_through_a_partition_name_are_not_taken(slurm, tmp_path) -> None:
    """Issue 40 item 7: slurmctld logs ``sbatch -p NAME``'s NAME as given, newlines and all;
    a NAME holding a line shaped like a request (root's, from another host) is not taken
    for one: it is not where slurmctld writes its records (its time is out of order)."""
    plugin = scheduler(slurm, tmp_path)
    forged = (
        "x\n[2026-01-01T00:00:00.000] slurmctld_req: received opcode REQUEST_JOB_INFO "
        "from 10.9.9.9:5 uid 0\n\n[2026-01-01T00:00:00.001] slurmctld_req: received opcode "
        "REQUEST_JOB_INFO from 10.9.9.9:6 uid 0"
    )
    try:
        with real_user("ggfg") as user:
            assert plugin.gridgate_scheduler_trace(scheduler="slurm", on=True, timeout=30).ok
            sbatch = shutil.which("sbatch", path="/usr/bin:/bin")
            done = subprocess.run(
                [*as_user(user), sbatch, "-p", forged, "-o", "/dev/null", "--wrap", "true"],
                capture_output=True,
                text=True,
                timeout=60,
                env=slurm.client_env(),
                cwd="/",
            )
            assert done.returncode != 0 and "invalid partition" in done.stderr.lower()
            got = plugin.gridgate_scheduler_requests(scheduler="slurm", timeout=30)
            assert got.ok, got.message
            assert [r.opcode for r in got.requests if r.user == user] == [
                "REQUEST_SUBMIT_BATCH_JOB"
            ], got.requests
            assert not [r for r in got.requests if r.host == "10.9.9.9"], got.requests
    finally:
        plugin.gridgate_scheduler_trace(scheduler="slurm", on=False, timeout=30)
        slurm.scontrol("setdebugflags", "-protocol")


def test_a_request_line_is_taken_only_in_its_order_and_place() -> None:
    # the log as slurmctld 22.05 wrote it for `sbatch -p NAME` with a forged line in NAME
    text = (
        "[2026-12-04T23:07:35.867] slurmctld_req: received opcode REQUEST_SUBMIT_BATCH_JOB "
        "from 127.0.0.1:56056 uid 25404\n"
        "[2026-12-04T23:07:35.867] _get_job_parts: invalid partition specified: x\n"
        "[2026-12-04T23:00:00.000] slurmctld_req: received opcode REQUEST_JOB_INFO from "
        "1.2.3.4:5 uid 0\n"
        "[2026-12-04T23:07:35.867] _slurm_rpc_submit_batch_job: Invalid partition name\n"
        "a message's second line\n"
        "[2026-12-04T23:07:35.868] slurmctld_req: received opcode REQUEST_JOB_INFO from "
        "1.2.3.4:5 uid 0\n"
        "[2026-12-04T23:07:35.871] slurmctld_req: received opcode REQUEST_JOB_INFO from "
        "127.0.0.1:56070 uid 25404\n"
        "[2026-12-04T23:07:35.999] slurmctld_req: received opcode REQUEST_JOB_INFO from "
        "1.2.3.4:5 uid 0\n"
        "[2026-12-04T23:07:35.872] slurmctld_req: received opcode REQUEST_PARTITION_INFO from "
        "127.0.0.1:56086 uid 25404\n"
    )
    taken = [(r.opcode, r.host) for r in parse_protocol_lines(text)]
    assert taken == [
        ("REQUEST_SUBMIT_BATCH_JOB", "127.0.0.1"),
        ("REQUEST_JOB_INFO", "127.0.0.1"),
        ("REQUEST_PARTITION_INFO", "127.0.0.1"),
    ]
