"""The lsf backend: bsub argv, job ids, failure classes from formats.md, bjobs queries, and
tokens from a real lsfproxyd around every command, against the stand-in LSF commands."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gridgate.core.model import CommandResult, Endpoint, SubmitRequest, SubmitResult
from gridgate.core.plugins import PluginContext
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector, director_for, section_for
from gridgate.plugins.lsf_proxy.director.backend import (
    LsfBackend,
    classify,
    parse_bjobs,
    parse_job_id,
)
from gridgate.plugins.lsf_proxy.sim import install_commands, write_scenario

NORMAL = Endpoint("lsf", "normal")


@pytest.fixture
def lsf_site(tmp_path):
    """(backend factory, scenario writer): stand-ins in tmp_path/bin, never on PATH."""
    bin_dir = install_commands(tmp_path / "bin")
    scenario_path = tmp_path / "scenario.json"
    write_scenario(scenario_path, {"state_dir": str(tmp_path / "lsf")})

    def scenario(**data):
        write_scenario(scenario_path, {"state_dir": str(tmp_path / "lsf"), **data})

    def backend(context: PluginContext | None = None, **section) -> LsfBackend:
        section = {
            "queues": ["normal", "short"],
            "tokens": False,
            "commands": {"bsub": str(bin_dir / "bsub"), "bjobs": str(bin_dir / "bjobs")},
            "env": {"GRIDGATE_LSF_SCENARIO": str(scenario_path)},
            **section,
        }
        return LsfBackend(section_for(LsfBackend, section), context or PluginContext())

    return backend, scenario


def test_parse_job_id_searches_past_banners() -> None:
    text = "Cannot connect to LSF. Please wait ...\nJob <4711> is submitted to queue <normal>.\n"
    assert parse_job_id(text) == "4711"
    assert parse_job_id("Job <12> is submitted to default queue <normal>.") == "12"
    assert parse_job_id("No such queue. Job not submitted.") is None
    assert parse_bjobs("1^RUN^hostA\n2^PEND^-\ngarbage\n", "Job <3> is not found\n") == (
        {"1": ("RUN", "hostA"), "2": ("PEND", "-")},
        ("3",),
    )


def test_bsub_argv_is_a_list_with_the_configured_options(lsf_site) -> None:
    make, _ = lsf_site
    backend = make(
        job_name="pilot",
        output="/logs/%J.out",
        error="/logs/%J.err",
        resources="select[mem>1000]",
        processors=2,
        extra_options=["-P", "vo"],
        command=["pilot.sh", "--vo", "x; rm -rf /"],
    )
    argv = backend.bsub_argv(NORMAL, SubmitRequest("lsf", count=3, requirements="rusage[mem=2]"))
    assert argv[1:] == [
        "-q",
        "normal",
        "-J",
        "pilot[1-3]",
        "-o",
        "/logs/%J.out",
        "-e",
        "/logs/%J.err",
        "-R",
        "rusage[mem=2]",
        "-n",
        "2",
        "-P",
        "vo",
        "pilot.sh",
        "--vo",
        "x; rm -rf /",
    ]
    info = backend.gridgate_backend_info(backend="lsf")
    assert [e.name for e in info.endpoints] == ["normal", "short"]
    assert backend.gridgate_backend_info(backend="wms_glite") is None


def test_gridgate_submit_parses_the_job_id(lsf_site) -> None:
    make, scenario = lsf_site
    scenario(queues={"normal": {"preamble": 1}})
    backend = make()
    result = backend.gridgate_submit(endpoint=NORMAL, request=SubmitRequest("lsf"), timeout=20)
    assert result.ok and result.job_ids == ("1001",)
    assert result.command.stdout.startswith("Cannot connect to LSF")
    assert (
        backend.gridgate_submit(
            endpoint=Endpoint("wms_glite", "x"), request=SubmitRequest("lsf"), timeout=20
        )
        is None
    )


@pytest.mark.parametrize(
    ("behaviour", "kind", "transient"),
    [
        ("too_many_processors", "usage", False),
        ("rusage_error", "usage", False),
        ("bad_resreq", "usage", False),
        ("non_lsf_host", "unreachable", True),
        ("lim_down", "daemon", True),
        ("master_lim_down", "daemon", True),
    ],
)
def test_gridgate_classify_failure_permanent_and_transient(
    lsf_site, behaviour, kind, transient
) -> None:
    make, scenario = lsf_site
    scenario(queues={"normal": {"behaviour": behaviour}})
    backend = make()
    result = backend.gridgate_submit(endpoint=NORMAL, request=SubmitRequest("lsf"), timeout=20)
    assert not result.ok and result.command.returncode == 255
    failure = backend.gridgate_classify_failure(endpoint=NORMAL, result=result)
    assert (failure.kind, failure.transient, failure.exclude) == (kind, transient, True)
    # permanent: told at once; transient: not on the first failure of an episode
    assert failure.notify is (not transient)


def test_gridgate_classify_failure_no_such_queue_is_the_sites_config(lsf_site) -> None:
    make, scenario = lsf_site
    scenario(queues={"normal": {"behaviour": "no_such_queue"}})
    backend = make()
    result = backend.gridgate_submit(endpoint=NORMAL, request=SubmitRequest("lsf"), timeout=20)
    failure = backend.gridgate_classify_failure(endpoint=NORMAL, result=result)
    # the queue in the site's config does not exist: set aside and told, never retried elsewhere
    assert (failure.kind, failure.local, failure.exclude, failure.notify, failure.transient) == (
        "config",
        False,
        True,
        True,
        False,
    )
    assert "the queue does not exist" in failure.reason


def test_a_hung_bsub_still_trying_is_daemon_trouble(lsf_site) -> None:
    make, scenario = lsf_site
    scenario(queues={"normal": {"behaviour": "daemon_not_responding"}})
    # 5 s: the stand-in must have started and printed before it is killed, loaded or not
    result = make().gridgate_submit(endpoint=NORMAL, request=SubmitRequest("lsf"), timeout=5.0)
    assert result.command.timed_out
    assert "still trying" in result.command.stderr
    failure = classify(result.command)
    assert failure.kind == "daemon" and failure.transient


def test_classify_other_outcomes() -> None:
    launch = CommandResult(("bsub",), None, launch_error="No such file or directory")
    assert classify(launch).kind == "launch"
    assert classify(CommandResult(("bsub",), 0, stdout="hello")).kind == "bad_output"
    assert classify(CommandResult(("bsub",), 3, stderr="odd\n")).kind == "error"
    assert classify(None, "why").kind == "config"


def test_transient_failures_are_told_only_when_they_persist(lsf_site, tmp_path) -> None:
    make, scenario = lsf_site
    scenario(queues={"normal": {"behaviour": "lim_down"}})
    section = make().config
    collector = Collector()
    director = director_for(
        {
            "director": {
                "cycle_seconds": 1,
                "failing_expiry": 60,
                "ticket_expiry": 600,
                "state_dir": str(tmp_path / "state"),
            },
            "backends": {"lsf": {**section, "queues": ["normal"]}},
            "demand": {"static": {"lsf": 1}},
        },
        collector,
    )
    try:
        first = director.run_iteration()
        assert [r.failure_kind for r in first.records] == ["daemon"]
        assert first.excluded == ("lsf/normal",) and collector.levels() == []
        director.clock.advance(61)  # the failing cache expires; the queue is tried again
        second = director.run_iteration()
        assert [r.failure_kind for r in second.records] == ["daemon"]
        assert collector.levels() == ["error"]
        assert "LIM is down" in collector.notes[0].body
    finally:
        director.close()


def test_query_reports_states_and_unknown_jobs(lsf_site) -> None:
    make, scenario = lsf_site
    scenario(job_stat="RUN")
    backend = make()
    ids = [
        backend.gridgate_submit(endpoint=NORMAL, request=SubmitRequest("lsf"), timeout=20).job_ids[
            0
        ]
        for _ in range(2)
    ]
    states = backend.query([*ids, "999"])
    assert states.ok
    assert {k: v[0] for k, v in states.states.items()} == dict.fromkeys(ids, "RUN")
    assert states.missing == ("999",)
    assert not backend.query(["1; rm -rf /"]).ok
    scenario(bjobs={"behaviour": "lim_down"})
    down = backend.query(ids)
    assert not down.ok and down.command.returncode == 255


# --- tokens from a real daemon ---------------------------------------------------------------


def test_every_command_takes_a_token_of_its_category(lsf_site, start_daemon, sockdir) -> None:
    make, _ = lsf_site
    log = sockdir / "diag.log"
    daemon = start_daemon({"diagnose": True, "diagnose_file": str(log)})
    backend = make(tokens=True, socket=daemon.socket)
    result = backend.gridgate_submit(endpoint=NORMAL, request=SubmitRequest("lsf"), timeout=20)
    assert result.ok
    assert backend.query(result.job_ids).ok
    backend.close()
    text = log.read_text()
    assert " SUBMISSION_REQ,BATCH_JOB_SUB," in text
    assert " QUERY_REQ,BATCH_JOB_QUERY," in text


def test_a_refused_token_is_not_a_queue_failure(
    lsf_site, start_daemon, cli, py_as, tmp_path
) -> None:
    make, _ = lsf_site
    daemon = start_daemon({})
    assert cli("block", "-u", "nobody", "--socket", daemon.socket).returncode == 0
    section = make(tokens=True, socket=daemon.socket, notoken_ntries=1).config
    code = f"""
import json
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.plugins import PluginContext
from gridgate.plugins.lsf_proxy.director.backend import LsfBackend
backend = LsfBackend(json.loads({json.dumps(dict(section))!r}), PluginContext())
endpoint = Endpoint("lsf", "normal")
result = backend.gridgate_submit(endpoint=endpoint, request=SubmitRequest("lsf"), timeout=20)
failure = backend.gridgate_classify_failure(endpoint=endpoint, result=result)
print(json.dumps({{"ok": result.ok, "ran": result.command is not None, "kind": failure.kind,
                  "exclude": failure.exclude, "notify": failure.notify,
                  "message": result.message}}))
"""
    proc = py_as(code)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["ok"] is False and answer["ran"] is False
    assert (answer["kind"], answer["exclude"], answer["notify"]) == ("refused", False, False)
    assert "blocked" in answer["message"]
    assert not (tmp_path / "lsf" / "jobs.jsonl").exists()  # bsub never ran


def test_config_errors_name_the_queue() -> None:
    assert LsfBackend.config_errors({"queues": ["normal", "bad queue", "normal"]}) == [
        (("queues", 1), "'bad queue' is not an LSF queue name"),
        (("queues", 2), "queue 'normal' is listed twice"),
    ]


def test_state_is_optional_for_classification(lsf_site) -> None:
    make, _ = lsf_site
    backend = make()
    backend.context = PluginContext(state=MemoryState({}))
    result = SubmitResult(
        NORMAL,
        ok=False,
        command=CommandResult(("bsub",), 255, stderr="Request from non-LSF host rejected\n"),
    )
    assert backend.gridgate_classify_failure(endpoint=NORMAL, result=result).notify is False
    assert os.environ.get("GRIDGATE_LSF_SCENARIO") is None  # nothing leaked into this process
    assert Path(backend.config["commands"]["bsub"]).exists()


# --- extra_options cannot carry what the backend writes (issue 21, items 12 and 16) ---------


@pytest.mark.parametrize(
    "options",
    [["-q", "other"], ["-qother"], ["-J", "x[1-5]"], ["-Jx[1-5]"], ["-pack", "/tmp/jobs"]],
)
def test_extra_options_the_backend_writes_itself_are_refused(options) -> None:
    problems = LsfBackend.config_errors({"queues": ["normal"], "extra_options": options})
    assert [where for where, _ in problems] == [("extra_options", 0)]
    assert "is written by the backend" in problems[0][1]


def test_extra_options_of_the_site_are_accepted() -> None:
    section = {
        "queues": ["normal"],
        "extra_options": ["-P", "atlas", "-Jd", "pilot", "-We", "60", "-Q", "all"],
    }
    assert LsfBackend.config_errors(section) == []


def test_a_queue_name_with_a_trailing_newline_is_refused() -> None:
    problems = LsfBackend.config_errors({"queues": ["normal\n"]})
    assert problems == [(("queues", 0), "'normal\\n' is not an LSF queue name")]


# --- a key that does nothing is an error (issue 39) -----------------------------------------


@pytest.mark.parametrize(
    ("key", "value"), [("socket", "/run/other.sock"), ("token_user", "svc"), ("notoken_ntries", 5)]
)
def test_a_token_key_with_tokens_off_is_a_config_error(key: str, value: object) -> None:
    # tokens: false builds no token client: the key would be accepted and never read
    problems = LsfBackend.config_errors({"queues": ["normal"], "tokens": False, key: value})
    assert problems == [((key,), f"{key} is read only with tokens: true")]
    assert LsfBackend.config_errors({"queues": ["normal"], key: value}) == []
    assert LsfBackend.config_errors({"queues": ["normal"], "tokens": False}) == []


def test_the_client_sides_settings_match_their_schemas() -> None:
    # one field per property, none with a default: a key added to a schema without its
    # field (or the reverse) fails here, not at a site's first load
    from gridgate.core.settings import check_settings
    from gridgate.plugins.lsf_proxy.client.settings import CLIENT_SCHEMA, ClientSettings
    from gridgate.plugins.lsf_proxy.director.admission import ADMISSION_SCHEMA, AdmissionSettings
    from gridgate.plugins.lsf_proxy.director.backend import LSF_SCHEMA, LsfSettings

    for schema, cls in (
        (LSF_SCHEMA, LsfSettings),
        (ADMISSION_SCHEMA, AdmissionSettings),
        (CLIENT_SCHEMA, ClientSettings),
    ):
        check_settings(schema, cls)
        assert cls.section_schema is schema
    settings = ClientSettings.of({"hosts": [{"name": "a", "address": "a:7000"}]})
    assert settings.hosts[0].address == "a:7000" and settings.reply_timeout == 30.0
    assert LsfSettings.of({}).commands.bjobs == "bjobs"
