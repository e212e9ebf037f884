"""Issue 21, items 2, 3 and 11, on the gLite backend: the status poll's id file lives under the
state folder (a full /tmp changes nothing), an id folder that cannot take it is one local fault
told once, a status output past gridgate's own cap is split (and never blamed on a server), and
the pilots of a server removed from the config leave the limits with a notice, are still polled,
and can be cancelled by endpoint. Real `gridgate` processes against the stand-in gLite commands;
the full file systems are real (a filled 4 KiB tmpfs)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gridgate.core.model import SubmitResult
from gridgate.plugins.wms_glite import status as glite_status
from gridgate.plugins.wms_glite.sim import commands_section, read_calls
from gridgate.plugins.wms_glite.sim.jobs import JobTable

H1, H2 = "wms01.example.org", "wms02.example.org"


def site(
    tmp_path: Path,
    sim_bin: Path,
    scenario_path: Path,
    *,
    servers: list[str],
    work_dir: Path | None = None,
    pilots: dict[str, Any] | None = None,
    demand: int = 6,
    **director: Any,
) -> Path:
    backend: dict[str, Any] = {
        "servers": servers,
        "commands": commands_section(sim_bin),
        "list_match": False,
        "env": {"GRIDGATE_SIM_SCENARIO": str(scenario_path)},
    }
    if work_dir is not None:
        backend["work_dir"] = str(work_dir)
    doc = {
        "director": {
            "cycle_seconds": 0.1,
            "max_threads": 2,
            "command_timeout": 30,
            "state_dir": str(tmp_path / "state"),
            "pilots": pilots or {},
            **director,
        },
        "state": {"driver": "sqlite", "path": str(tmp_path / "state" / "state.db")},
        "backends": {"wms_glite": backend},
        "demand": {"static": {"wms_glite": demand}},
        "selectors": {"round_robin": {}},
        "notifiers": {"files": {"folder": str(tmp_path / "notes")}},
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def run(exe: str, config: Path, *more: str, env: dict[str, str] | None = None) -> list[dict]:
    import os

    proc = subprocess.run(
        [exe, "run", "-c", str(config), "--json", *more],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def status_calls(log: Path) -> list[Any]:
    return [c for c in read_calls(log) if c.command == "glite-wms-job-status"]


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """``full(folder)`` mounts a 4 KiB tmpfs on ``folder`` and fills it (a real ENOSPC)."""
    mounted: list[Path] = []

    def full(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4k,mode=0700", "tmpfs", str(folder)], check=True
        )
        mounted.append(folder)
        with open(folder / "filler", "wb") as handle:
            try:
                handle.write(b"\0" * 65536)
                handle.flush()
            except OSError:
                pass  # ENOSPC: full, as wanted
        return folder

    yield full
    for folder in reversed(mounted):
        subprocess.run(["umount", str(folder)], check=True)


# --- item 2 -----------------------------------------------------------------------------------


def test_a_full_tmp_does_not_stop_the_status_poll_its_id_file_is_under_the_state_folder(
    tmp_path, sim_bin, scenario, calls_log, gridgate_exe, full_tmpfs
) -> None:
    """Before: the id file went to the system's temporary folder; with /tmp full the poll never
    ran (classified kind config: nobody told), the pilots froze and max_waiting held for ever."""
    tmp = full_tmpfs(tmp_path / "full-tmp")
    config = site(tmp_path, sim_bin, scenario(), servers=[H1], pilots={"max_waiting": 6})
    env = {"TMPDIR": str(tmp)}
    [first] = run(gridgate_exe, config, "--once", env=env)
    assert first["pilots_submitted"] == 6
    [second] = run(gridgate_exe, config, "--once", env=env)
    assert second["failures"] == [] and second["notifications"] == []
    assert [p["outcome"] for p in second["pilots"]["polls"]] == ["ok"]
    (call,) = status_calls(calls_log)
    id_file = Path(call.argv[call.argv.index("-i") + 1])
    assert id_file.parent == tmp_path / "state" / "wms_glite-jdl"
    assert not id_file.exists()  # removed after its command


def test_an_id_folder_that_cannot_be_written_is_one_local_fault_told_once(
    tmp_path, sim_bin, scenario, calls_log, gridgate_exe, full_tmpfs
) -> None:
    """Before: kind config, no server blamed but nobody told either; pilot states froze."""
    work = tmp_path / "work"
    work.mkdir()
    config = site(tmp_path, sim_bin, scenario(), servers=[H1], work_dir=work)
    [first] = run(gridgate_exe, config, "--once")
    assert first["pilots_submitted"] == 6
    full_tmpfs(work)
    docs = run(gridgate_exe, config, "--iterations", "3")
    assert status_calls(calls_log) == []  # nothing could be run
    for doc in docs:
        assert doc["excluded"] == []
        assert {f["kind"] for f in doc["failures"]} == {"local_io"}
    notes = [n for d in docs for n in d["notifications"]]
    assert [n["level"] for n in notes][:1] == ["error"]
    assert sum(1 for n in notes if "cannot write its files" in n["subject"]) == 1
    (text,) = [
        p.read_text() for p in (tmp_path / "notes").iterdir() if "cannot write" in p.read_text()
    ]
    assert "job id file" in text and str(work) in text and "No space left on device" in text


# --- item 11 ----------------------------------------------------------------------------------


def test_a_status_output_past_the_cap_is_split_and_no_server_is_blamed(
    tmp_path, sim_bin, scenario, calls_log, gridgate_exe
) -> None:
    """Before: one command for every pilot; its output passed max_output_bytes, and the cut
    poll was the server's failure (excluded, an error mail with a false reason)."""
    config = site(tmp_path, sim_bin, scenario(), servers=[H1], demand=20, max_output_bytes=1024)
    [first] = run(gridgate_exe, config, "--once")
    assert first["pilots_submitted"] == 20
    [second] = run(gridgate_exe, config, "--once")
    assert second["failures"] == [] and second["excluded"] == []
    assert [n for n in second["notifications"] if n["level"] != "info"] == []
    (poll,) = second["pilots"]["polls"]
    assert poll["outcome"] == "ok" and poll["pilots"] == 20 and poll["commands"] >= 10
    calls = status_calls(calls_log)
    assert sum(c.ids for c in calls) == 20 and max(c.ids for c in calls) <= 2


def test_13000_pilots_at_the_default_cap_are_answered_in_two_commands(
    make_backend, scenario, tmp_path, calls_log
) -> None:
    pm, backend = make_backend(hosts={H1: {}})
    endpoint = backend.endpoints()[0]
    table = JobTable(tmp_path / "simstate")
    many = [f"https://lb01.example.org:9000/Bulk{n:018d}" for n in range(13000)]
    for job_id in many:
        table.add(endpoint.url, job_id, [], 1_800_000_000.0)
    result = pm.hook.gridgate_job_status(endpoint=endpoint, job_ids=many, timeout=120)
    assert result.ok, result.message
    assert len(result.statuses) == 13000 and result.commands == 2
    assert [c.ids for c in status_calls(calls_log)] == [8192, 4808]


def test_a_cut_output_is_asked_again_in_halves_and_a_block_past_the_cap_is_gridgates_cap(
    make_backend, tmp_path, calls_log, monkeypatch
) -> None:
    import dataclasses

    pm, backend = make_backend(hosts={H1: {}})
    endpoint = backend.endpoints()[0]
    table = JobTable(tmp_path / "simstate")
    ids = [f"https://lb01.example.org:9000/Half{n:018d}" for n in range(40)]
    for job_id in ids:
        table.add(endpoint.url, job_id, [], 1_800_000_000.0)
    # an estimate far too small: the first command's output is cut, then asked in halves
    monkeypatch.setattr(glite_status, "STATUS_BYTES_PER_JOB", 1)
    backend.context = dataclasses.replace(
        backend.context, config={"director": {"max_output_bytes": 4096}}
    )
    result = pm.hook.gridgate_job_status(endpoint=endpoint, job_ids=ids, timeout=120)
    assert result.ok and len(result.statuses) == 40
    sizes = [c.ids for c in status_calls(calls_log)]
    assert sizes[0] == 40 and result.commands == len(sizes) > 2
    # one id whose block alone passes the cap: gridgate's cap, a local fault, no server blamed
    backend.context = dataclasses.replace(
        backend.context, config={"director": {"max_output_bytes": 64}}
    )
    cut = pm.hook.gridgate_job_status(endpoint=endpoint, job_ids=ids[:1], timeout=60)
    assert not cut.ok and "gridgate's own output cap" in cut.local_fault
    failure = pm.hook.gridgate_classify_failure(
        endpoint=endpoint,
        result=SubmitResult(
            endpoint,
            ok=False,
            command=cut.command,
            operation=cut.operation,
            message=cut.message,
            local_fault=cut.local_fault,
        ),
    )
    assert failure.kind == "local_io" and failure.local and not failure.exclude


# --- item 3 -----------------------------------------------------------------------------------


def test_a_server_removed_from_the_config_frees_max_total_with_a_notice_and_is_cancellable(
    tmp_path, sim_bin, scenario, calls_log, gridgate_exe
) -> None:
    """Before: wms02's 6 waiting pilots counted against max_total for ever (nothing submitted
    to wms01, no notice), were never polled, and `pilots cancel --endpoint` said the endpoint
    is no longer configured."""
    path = scenario()
    pilots = {"backends": {"wms_glite": {"max_total": 6}}}
    config = site(tmp_path, sim_bin, path, servers=[H2], pilots=pilots)
    [first] = run(gridgate_exe, config, "--once")
    assert first["pilots_submitted"] == 6
    config = site(tmp_path, sim_bin, path, servers=[H1], pilots=pilots)  # wms02 retired
    [second] = run(gridgate_exe, config, "--once")
    assert second["pilots_submitted"] == 6
    assert {s["endpoint"] for s in second["submitted"]} == {H1}
    notes = [n for n in second["notifications"] if "no longer configured" in n["subject"]]
    assert len(notes) == 1 and f"wms_glite/{H2}" in notes[0]["subject"]
    assert {p["endpoint"]: p["outcome"] for p in second["pilots"]["polls"]} == {H2: "ok"}
    [third] = run(gridgate_exe, config, "--once")
    assert not [n for n in third["notifications"] if "no longer configured" in n["subject"]]
    cancel = subprocess.run(
        [gridgate_exe, "pilots", "cancel", "-c", str(config), "--all", "--endpoint", H2, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    out = json.loads(cancel.stdout)
    assert out["failed"] == {} and len(out["cancelled"][f"wms_glite/{H2}"]) == 6


def test_limits_stuck_behind_failing_polls_raise_the_stall_error(
    tmp_path, sim_bin, scenario, calls_log, gridgate_exe
) -> None:
    """Item 2's last part: wms02's bookkeeping server is down (every poll of it fails, so it is
    out of rotation), wms01 is full (max_waiting) and its pilots never start (the stand-ins'
    clock stands still). Before: every iteration was trimmed to zero and no message ever said
    that the director had stopped submitting."""
    from gridgate.plugins.wms_glite.sim.jobs import set_clock

    clock = tmp_path / "simclock"
    set_clock(clock, 1_800_000_000.0)
    path = scenario(hosts={H1: {}, H2: {"pilots": {"status": "lb_down"}}}, clock_file=str(clock))
    config = site(
        tmp_path,
        sim_bin,
        path,
        servers=[H1, H2],
        demand=4,
        pilots={"max_waiting": 2},
        stall_iterations=2,
    )
    docs = run(gridgate_exe, config, "--iterations", "8")
    assert docs[0]["pilots_submitted"] == 4
    assert all(d["pilots_submitted"] == 0 for d in docs[1:])
    stalls = [
        n for d in docs for n in d["notifications"] if "has submitted no pilot" in n["subject"]
    ]
    assert [n["level"] for n in stalls] == ["error"]
    (text,) = [
        p.read_text()
        for p in (tmp_path / "notes").iterdir()
        if "has submitted no pilot" in p.read_text()
    ]
    assert "skipped/max_waiting" in text and "no pilot changed state" in text


def test_id_files_of_a_killed_director_are_removed_and_a_live_ones_kept(
    make_backend, tmp_path, calls_log
) -> None:
    """A director killed with a poll in flight leaves its id file: the next one removes it
    (before: `gridgate-ids-*.txt` files stayed for ever, in the system's temporary folder)."""
    import os

    pm, backend = make_backend(hosts={H1: {}})
    folder = backend.jdl_dir()
    folder.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = folder / f"gridgate-ids-{dead.pid}-abc.txt"
    mine = folder / f"gridgate-ids-{os.getpid()}-inflight.txt"
    left.write_text("x\n")
    mine.write_text("x\n")
    endpoint = backend.endpoints()[0]
    job = "https://lb01.example.org:9000/Left000000000000000001"
    JobTable(tmp_path / "simstate").add(endpoint.url, job, [], 1_800_000_000.0)
    assert pm.hook.gridgate_job_status(endpoint=endpoint, job_ids=[job], timeout=60).ok
    assert not left.exists() and mine.exists()
    (call,) = status_calls(calls_log)
    assert Path(call.argv[call.argv.index("-i") + 1]).name.startswith(
        f"gridgate-ids-{os.getpid()}-"
    )
