"""A JDL folder this machine cannot write (missing, immutable, full) is a local fault: one
error naming the folder and the OS error, no server blamed; JDL files live under the state
folder and a killed director's leftovers go at the next start. Real `gridgate` processes
against the stand-in gLite commands; the folder faults are real (chattr +i, a full tmpfs)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.polling import until

HOSTS = ["wms01.example.org", "wms02.example.org", "wms03.example.org"]


def site(
    tmp_path: Path,
    sim_bin: Path,
    scenario_path: Path,
    *,
    work_dir: Path | None = None,
    list_match: bool = True,
    **director: object,
) -> Path:
    backend: dict[str, object] = {
        "servers": HOSTS,
        "commands": {
            "submit": str(sim_bin / "glite-wms-job-submit"),
            "list_match": str(sim_bin / "glite-wms-job-list-match"),
        },
        "list_match": list_match,
        "env": {"GRIDGATE_SIM_SCENARIO": str(scenario_path)},
    }
    if work_dir is not None:
        backend["work_dir"] = str(work_dir)
    doc = {
        # nothing here hangs: a healthy stand-in must not time out on a loaded machine
        "director": {
            "cycle_seconds": 0.1,
            "max_threads": 2,
            "command_timeout": 30,
            "state_dir": str(tmp_path / "state"),
            **director,
        },
        "state": {"driver": "sqlite", "path": str(tmp_path / "state" / "state.db")},
        "backends": {"wms_glite": backend},
        "demand": {"static": {"wms_glite": 6}},
        "notifiers": {"files": {"folder": str(tmp_path / "notes")}},
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def run(exe: str, config: Path, *more: str, verbose: bool = False) -> tuple[list[dict], str]:
    proc = subprocess.run(
        [exe, *(["-v"] if verbose else []), "run", "-c", str(config), "--json", *more],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()], proc.stderr


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "jdl-immutable"
    folder.mkdir()
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.fixture
def full(tmp_path: Path) -> Iterator[Path]:
    """A real file system with no space left: a 4 KiB tmpfs, filled."""
    folder = tmp_path / "jdl-full"
    folder.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4k,mode=0700", "tmpfs", str(folder)], check=True
    )
    try:
        with open(folder / "filler", "wb") as handle:
            try:
                handle.write(b"\0" * 65536)
                handle.flush()
            except OSError:
                pass  # ENOSPC: the 4 KiB tmpfs is full, which is what the test wants
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize(
    ("fault", "os_error"),
    [
        ("missing", "No such file or directory"),
        ("immutable", "Operation not permitted"),
        ("full", "No space left on device"),
    ],
)
@pytest.mark.parametrize("list_match", [True, False])
def test_an_unwritable_jdl_folder_is_one_local_fault_not_a_silent_bad_request(
    request, tmp_path, sim_bin, scenario, calls_log, gridgate_exe, fault, os_error, list_match
) -> None:
    folder = tmp_path / "no-such-folder" if fault == "missing" else request.getfixturevalue(fault)
    config = site(tmp_path, sim_bin, scenario(), work_dir=folder, list_match=list_match)
    docs, stderr = run(gridgate_exe, config, "--iterations", "2")
    assert [d["pilots_submitted"] for d in docs] == [0, 0]
    assert not calls_log.exists()  # nothing was run: no server was even asked
    for doc in docs:
        assert doc["excluded"] == []  # no server blamed
        assert {f["kind"] for f in doc["failures"]} == {"local_io"}
        assert len(doc["failures"]) <= 2  # then the backend is paused for the iteration
    notes = [n for d in docs for n in d["notifications"]]
    assert [n["level"] for n in notes] == ["error"]  # one per failing_expiry, not per iteration
    assert "cannot write its files" in notes[0]["subject"]
    (text,) = [p.read_text() for p in (tmp_path / "notes").iterdir()]
    assert str(folder) in text and os_error in text
    assert "not of any server" in text
    assert "cannot write its files" in stderr  # seen without -v, through the log notifier
    listing = subprocess.run(
        [gridgate_exe, "servers", "list", "-c", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = json.loads(listing.stdout)["servers"]
    assert [(r["server"], r["status"], r["kind"]) for r in rows] == [
        ("wms_glite (this machine)", "local_fault", "local_io")
    ]


def test_jdl_files_live_under_the_state_folder_by_default(
    tmp_path, sim_bin, scenario, calls_log, gridgate_exe
) -> None:
    config = site(tmp_path, sim_bin, scenario(), list_match=False)
    [doc], _ = run(gridgate_exe, config, "--once")
    assert doc["pilots_submitted"] == 6
    folder = tmp_path / "state" / "wms_glite-jdl"
    calls = [json.loads(line) for line in calls_log.read_text().splitlines()]
    jdls = [c["argv"][-1] for c in calls if c["event"] == "start"]
    assert len(jdls) == 6 and all(Path(j).parent == folder for j in jdls)
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert list(folder.iterdir()) == []  # each removed after its command


def test_jdl_files_of_a_killed_director_are_removed_at_the_next_start(
    tmp_path, sim_bin, scenario, calls_log, gridgate_exe
) -> None:
    config = site(
        tmp_path,
        sim_bin,
        scenario(default={"behaviour": "print_then_hang", "hang": 600}),
        list_match=False,
        command_timeout=300,
    )
    folder = tmp_path / "state" / "wms_glite-jdl"
    director = subprocess.Popen(
        [gridgate_exe, "run", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        if not until(
            lambda: calls_log.exists() and calls_log.read_text().count('"event": "start"') >= 2,
            timeout=60,
        ):
            pytest.fail("the stand-ins were never called")
    finally:
        os.kill(director.pid, signal.SIGKILL)
        director.wait(timeout=30)
    left = sorted(folder.glob("*.jdl"))
    assert len(left) == 2  # two threads, two commands in flight when the director was killed
    assert all(p.name.startswith(f"gridgate-{director.pid}-") for p in left)
    # a file of a live process (this test's) is not the next director's to remove
    mine = folder / f"gridgate-{os.getpid()}-inflight.jdl"
    mine.write_text("[]\n")
    scenario(default={"behaviour": "healthy"})
    [doc], stderr = run(gridgate_exe, config, "--once", verbose=True)
    assert doc["pilots_submitted"] == 6
    assert sorted(folder.iterdir()) == [mine]
    assert "removed 2 JDL file(s)" in stderr


def test_the_stall_count_survives_a_restart_of_the_director_process(
    tmp_path, sim_bin, scenario, gridgate_exe
) -> None:
    folder = tmp_path / "jdl-later"
    config = site(tmp_path, sim_bin, scenario(), work_dir=folder, list_match=False)
    docs, _ = run(gridgate_exe, config, "--iterations", "2")
    assert [[n["level"] for n in d["notifications"]] for d in docs] == [
        ["error"],
        [],
    ]  # local fault
    [third], _ = run(gridgate_exe, config, "--once")  # a new process: the 3rd stalled iteration
    assert [n["subject"] for n in third["notifications"]] == [
        f"gridgate: {socket.gethostname()}:{config.resolve()} has submitted no pilot for 3 iterations"
    ]
    folder.mkdir()
    [fixed], _ = run(gridgate_exe, config, "--once")  # and another one sees it end
    assert fixed["pilots_submitted"] == 6
    assert [(n["level"], n["subject"]) for n in fixed["notifications"]] == [
        ("info", f"gridgate: {socket.gethostname()}:{config.resolve()} is submitting again")
    ]
