"""LSF pilot tracking: bjobs/bkill parsers on real captures (grid-control test.LSF.status1 and
test.LSF.cancel, aiida's LSF 9.1.3 rows), and the hooks against the stand-ins as real
processes, their lifecycles moved by a clock file, one bjobs per queue and poll."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridgate.core.clock import write_file_time
from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.plugins import PluginContext
from gridgate.core.testing import section_for
from gridgate.plugins.lsf_proxy.commands import opcode_of
from gridgate.plugins.lsf_proxy.director.backend import LsfBackend
from gridgate.plugins.lsf_proxy.director.tracking import normalise, parse_bkill, parse_status_rows
from gridgate.plugins.lsf_proxy.sim import install_commands, write_scenario

NORMAL, BROKEN = Endpoint("lsf", "normal"), Endpoint("lsf", "broken")
T0 = 1_800_000_000.0

# grid-control testsuite/backend/test.LSF.status1 (real output, CERN 2010), first rows
TABLE = """JOBID     USER    STAT  QUEUE      FROM_HOST   EXEC_HOST   JOB_NAME   SUBMIT_TIME
103506916 stober  PEND  8nm        lxplus235      -        GC81e0208d.0 Nov  4 20:07
103606918 stober  RUN   8nm        lxplus235   lxbsu0606   GC81e0208d.7 Nov  4 20:07
103606923 stober  DONE  8nm        lxplus235   lxbsq0620   GC81e0208d.5 Nov  4 20:07
103507052 stober  PEND  8nm        lxplus235      -        GC81e0208d.10 Nov  4 20:09
"""


def test_classic_table_real_capture() -> None:
    rows = parse_status_rows(TABLE, table=True)
    assert {j: r.stat for j, r in rows.items()} == {
        "103506916": "PEND",
        "103606918": "RUN",
        "103606923": "DONE",
        "103507052": "PEND",
    }
    assert rows["103606918"].exec_host == "lxbsu0606" and rows["103506916"].exec_host == ""


def test_custom_format_rows_with_dashes_and_a_reason_holding_colons() -> None:
    rows = parse_status_rows(
        "764213236^EXIT^b681e480bd^140^TERM_RUNLIMIT: job killed after reaching LSF run time limit\n"
        "764220165^PEND^-^-^-\n1^RUN^host\nnot a row\n"
    )
    assert rows["764213236"].reason == "TERM_RUNLIMIT: job killed after reaching LSF run time limit"
    assert rows["764213236"].exit_code == 140
    assert (rows["764220165"].exec_host, rows["764220165"].exit_code) == ("", None)
    assert rows["1"].stat == "RUN"  # the three-field format of formats.md reads too


def test_an_array_under_one_id_keeps_its_liveliest_row() -> None:
    rows = parse_status_rows("5^DONE^h^-^-\n5^RUN^h^-^-\n5^EXIT^h^1^-\n")
    assert rows["5"].stat == "RUN"


def test_states_normalise_as_formats_md_says() -> None:
    expected = {
        "PEND": "waiting",
        "PROV": "waiting",
        "PSUSP": "waiting",
        "WAIT": "waiting",
        "RUN": "running",
        "USUSP": "running",
        "SSUSP": "running",
        "DONE": "done",
        "EXIT": "failed",
        "UNKWN": "unknown",
        "ZOMBI": "unknown",
        "NEW": "unknown",
    }
    assert {s: normalise(s) for s in expected} == expected


def test_bkill_real_capture() -> None:
    # grid-control testsuite/backend/test.LSF.cancel
    out = parse_bkill(
        "Job <827766504>: Job has already finished\nJob <827766508> is being terminated\n"
    )
    assert out.terminated == ("827766508",) and out.finished == ("827766504",)
    assert parse_bkill("", "Job <22>: No matching job found\n").unknown == ("22",)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.booleans())
def test_parsers_never_raise(text: str, table: bool) -> None:
    parse_status_rows(text, table)
    parse_bkill(text, text)


# --- against the stand-ins ----------------------------------------------------------------------


@pytest.fixture
def site(tmp_path: Path):
    bin_dir = install_commands(tmp_path / "bin")
    path = tmp_path / "scenario.json"
    clock = tmp_path / "clock"
    calls = tmp_path / "calls.jsonl"

    def set_time(value: float) -> None:
        write_file_time(clock, value)

    def scenario(**data) -> None:
        write_scenario(
            path,
            {
                "state_dir": str(tmp_path / "lsf"),
                "clock_file": str(clock),
                "calls_log": str(calls),
                **data,
            },
        )

    def backend(context: PluginContext | None = None, **section) -> LsfBackend:
        section = {
            "queues": ["normal", "broken"],
            "tokens": False,
            "commands": {n: str(bin_dir / n) for n in ("bsub", "bjobs")},  # bkill: beside
            "env": {"GRIDGATE_LSF_SCENARIO": str(path)},
            **section,
        }
        return LsfBackend(section_for(LsfBackend, section), context or PluginContext())

    def bjobs_calls() -> list[dict]:
        if not calls.exists():
            return []
        return [
            e for e in map(json.loads, calls.read_text().splitlines()) if e["command"] == "bjobs"
        ]

    set_time(T0)
    scenario(
        queues={
            "normal": {"pilots": {"outcome": "done", "pend": 2, "run": 10, "clean_period": 600}},
            "broken": {"pilots": {"outcome": "exit", "exit_code": 2, "pend": 1, "run": 1}},
        }
    )
    return backend, scenario, set_time, bjobs_calls, tmp_path


def submit(backend: LsfBackend, endpoint: Endpoint) -> str:
    result = backend.gridgate_submit(endpoint=endpoint, request=SubmitRequest("lsf"), timeout=20)
    assert result.ok, result
    return result.job_ids[0]


@pytest.mark.parametrize("status_format", ["custom", "table"])
def test_lifecycle_pend_run_done_and_exit_on_a_failing_queue(site, status_format) -> None:
    make, _, set_time, _, _ = site
    backend = make(status_format=status_format)
    good, bad = submit(backend, NORMAL), submit(backend, BROKEN)

    def states(endpoint: Endpoint, job: str) -> tuple[str, str]:
        result = backend.gridgate_job_status(endpoint=endpoint, job_ids=[job], timeout=20)
        assert result.ok, result
        return result.statuses[job].state, result.statuses[job].native

    assert states(NORMAL, good) == ("waiting", "PEND")
    set_time(T0 + 3)
    assert states(NORMAL, good) == ("running", "RUN")
    assert states(BROKEN, bad) == ("failed", "EXIT")
    set_time(T0 + 20)
    assert states(NORMAL, good) == ("done", "DONE")
    if status_format == "custom":
        result = backend.gridgate_job_status(endpoint=BROKEN, job_ids=[bad], timeout=20)
        assert result.statuses[bad].exit_code == 2


def test_after_clean_period_bjobs_forgets_and_the_id_is_left_out(site) -> None:
    make, _, set_time, _, _ = site
    backend = make()
    old = submit(backend, NORMAL)
    set_time(T0 + 1000)  # finished at T0+12, forgotten 600 s later
    new = submit(backend, NORMAL)
    result = backend.gridgate_job_status(endpoint=NORMAL, job_ids=[old, new], timeout=20)
    assert result.ok and result.command.returncode == 255
    assert set(result.statuses) == {new}
    assert f"Job <{old}> is not found" in result.command.stderr
    only_old = backend.gridgate_job_status(endpoint=NORMAL, job_ids=[old], timeout=20)
    assert only_old.ok and dict(only_old.statuses) == {}


def test_daemon_trouble_fails_the_query(site) -> None:
    make, scenario, *_ = site
    backend = make()
    job = submit(backend, NORMAL)
    scenario(bjobs={"behaviour": "lim_down"})
    result = backend.gridgate_job_status(endpoint=NORMAL, job_ids=[job], timeout=20)
    assert not result.ok and result.command.returncode == 255
    scenario(bjobs={"behaviour": "hang"})
    hung = backend.gridgate_job_status(endpoint=NORMAL, job_ids=[job], timeout=1)
    assert not hung.ok and hung.command.timed_out


def test_one_bjobs_per_queue_for_1_or_5000_pilots(site) -> None:
    make, _, _, bjobs_calls, tmp_path = site
    backend = make()
    one = submit(backend, NORMAL)
    assert backend.gridgate_job_status(endpoint=NORMAL, job_ids=[one], timeout=20).ok
    # 5,000 more pilots written into the stand-in's job table (5,000 bsubs would only slow
    # the test); the query goes through the real stand-in bjobs.
    jobs = [
        {
            "id": 20000 + n,
            "user": "pilot",
            "queue": "normal",
            "name": "p",
            "stat": "PEND",
            "submitted": T0,
            "host": "h",
            "command": ["pilot.sh"],
        }
        for n in range(5000)
    ]
    with open(tmp_path / "lsf" / "jobs.jsonl", "a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(j) + "\n" for j in jobs)
    ids = [one, *(str(j["id"]) for j in jobs)]
    result = backend.gridgate_job_status(endpoint=NORMAL, job_ids=ids, timeout=60)
    assert result.ok and result.commands == 1 and len(result.statuses) == 5001
    assert [(c["queue"], c["ids"]) for c in bjobs_calls()] == [("normal", 1), ("normal", 5001)]


def test_a_long_id_list_is_split_only_as_the_argv_requires(site, monkeypatch) -> None:
    import gridgate.core.runner as runner

    make, _, _, bjobs_calls, _ = site
    backend = make()
    ids = [submit(backend, NORMAL) for _ in range(3)]
    original = runner.argv_chunks
    monkeypatch.setattr(
        runner,
        "argv_chunks",
        lambda prefix, items: original(prefix, items, limit=sum(len(w) + 1 for w in prefix) + 10),
    )
    result = backend.gridgate_job_status(endpoint=NORMAL, job_ids=ids, timeout=20)
    assert result.ok and result.commands == 2 and set(result.statuses) == set(ids)
    assert [c["ids"] for c in bjobs_calls()] == [2, 1]


def test_output_cut_at_the_size_limit_is_no_answer(site) -> None:
    make, *_ = site
    ids = [submit(make(), NORMAL) for _ in range(4)]
    backend = make(PluginContext(config={"director": {"max_output_bytes": 30}}))
    # 4 rows of 17 bytes, cut at 30
    result = backend.gridgate_job_status(endpoint=NORMAL, job_ids=ids, timeout=20)
    assert not result.ok and "max_output_bytes" in result.message


def test_bkill_terminates_live_jobs_and_finished_ones_are_not_reported_cancelled(site) -> None:
    make, _, set_time, _, _ = site
    backend = make()
    live, finished = submit(backend, NORMAL), submit(backend, BROKEN)
    set_time(T0 + 5)
    result = backend.gridgate_cancel(
        endpoint=NORMAL, job_ids=[live, finished, "424242"], timeout=20
    )
    assert result.ok and result.command.returncode == 255
    assert set(result.cancelled) == {live}  # finished: its poll says how it ended
    assert "1 had already finished" in result.message and "1 unknown to LSF" in result.message
    after = backend.gridgate_job_status(endpoint=NORMAL, job_ids=[live], timeout=20).statuses[live]
    assert (after.state, after.native) == ("failed", "EXIT")
    assert after.reason.startswith("TERM_OWNER")


def test_status_and_cancel_take_tokens_of_their_categories(site, start_daemon, sockdir) -> None:
    make, *_ = site
    log = sockdir / "diag.log"
    daemon = start_daemon({"diagnose": True, "diagnose_file": str(log)})
    backend = make(tokens=True, socket=daemon.socket)
    job = submit(backend, NORMAL)
    assert backend.gridgate_job_status(endpoint=NORMAL, job_ids=[job], timeout=20).ok
    assert backend.gridgate_cancel(endpoint=NORMAL, job_ids=[job], timeout=20).ok
    backend.close()
    # the diagnostic log names each request by category and batch opcode
    lines = log.read_text().splitlines()
    assert any(f"QUERY_REQ,{opcode_of('bjobs')}," in ln for ln in lines), lines
    assert any(f"OTHER_REQ,{opcode_of('bkill')}," in ln for ln in lines), lines


def test_bad_ids_and_other_backends(site) -> None:
    make, *_ = site
    backend = make()
    assert not backend.gridgate_job_status(endpoint=NORMAL, job_ids=["1; rm -rf /"], timeout=5).ok
    assert not backend.gridgate_cancel(endpoint=NORMAL, job_ids=["$(x)"], timeout=5).ok
    other = Endpoint("wms_glite", "wms01")
    assert backend.gridgate_job_status(endpoint=other, job_ids=["1"], timeout=5) is None
    assert backend.gridgate_cancel(endpoint=other, job_ids=["1"], timeout=5) is None
    assert backend.gridgate_job_status(endpoint=NORMAL, job_ids=[], timeout=5).commands == 0


def test_bkill_is_found_beside_bjobs_unless_configured() -> None:
    from gridgate.plugins.lsf_proxy.director.tracking import bkill_command

    def backend(commands: dict) -> LsfBackend:
        return LsfBackend(
            section_for(LsfBackend, {"queues": ["q"], "commands": commands}), PluginContext()
        )

    assert bkill_command(backend({"bjobs": "/opt/lsf/bin/bjobs"})) == "/opt/lsf/bin/bkill"
    assert bkill_command(backend({})) == "bkill"
    assert bkill_command(backend({"bjobs": "/x/bjobs", "bkill": "/y/bkill"})) == "/y/bkill"


# --- the backend and its tracking do not import each other (issue 39) -----------------------


def _lsf_imports(path: Path) -> set[str]:
    """The gridgate.plugins.lsf_proxy modules ``path`` imports anywhere (top, functions,
    TYPE_CHECKING), ``from package import module`` counted as the module."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("gridgate.plugins.lsf_proxy.")}


def test_no_two_modules_of_the_lsf_director_import_each_other() -> None:
    root = Path(__file__).resolve().parents[3] / "plugins" / "lsf_proxy"
    paths = {
        f"gridgate.plugins.lsf_proxy.director.{p.stem}": p
        for p in (root / "director").glob("*.py")
        if p.stem != "__init__"
    }
    paths["gridgate.plugins.lsf_proxy.documents"] = root / "documents.py"
    graph = {module: _lsf_imports(path) & set(paths) for module, path in paths.items()}
    pairs = sorted(
        (a, b) for a, targets in graph.items() for b in targets if a < b and a in graph[b]
    )
    assert pairs == []
    # the backend reaches its tracking, never the other way round, at any level
    assert (
        "gridgate.plugins.lsf_proxy.director.tracking"
        in graph["gridgate.plugins.lsf_proxy.director.backend"]
    )
