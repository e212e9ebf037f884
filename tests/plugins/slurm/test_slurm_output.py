"""`gridgate pilots output` and `pilots show` on the real Slurm cluster: a done and a failed
pilot's stdout and stderr read from the paths scontrol gives (the cluster shares this machine's
file system), a huge output cut at the cap, ``--tail``, a file gone, a job the controller does
not hold, and bad input refused.

The director runs in this process on sqlite state (sbatch and squeue the real ones); the
commands run as the operator would run them, ``gridgate`` in another process on the same config.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.polling import until

from gridgate.core.clock import FakeClock
from gridgate.core.config import validate_document
from gridgate.core.engine.director import Director
from gridgate.core.model import Endpoint
from gridgate.core.state import Pilot
from gridgate.core.testing import Collector, build_plugin
from gridgate.plugins.slurm.backend import SlurmBackend
from gridgate.plugins.slurm.documents import output_paths

BIN = Path(sys.executable).parent
LINES = 300_000  # seq 1 300000: 1,988,895 bytes, past the 1 MiB default cap
#: the pilot of partition batch fails; the one of debug prints a screen-clearing line and more
SCRIPT = (
    r"""#!/bin/sh
if [ "$SLURM_JOB_PARTITION" = batch ]; then
    echo "payload broke on $SLURM_JOB_ID" >&2
    exit 3
fi
echo "pilot $SLURM_JOB_ID says hello"
printf 'all \033[2J good\n'
echo "a warning" >&2
"""
    + f"seq 1 {LINES}\n"
)


def gridgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gridgate"), *args], capture_output=True, text=True, timeout=120
    )


def squeue_states(cluster) -> dict[str, str]:
    out = cluster.command(["squeue", "-h", "-r", "-t", "all", "-o", "%i %T"])
    assert out.ok, out.stderr
    return dict(line.split() for line in out.stdout.splitlines() if line.strip())


@pytest.fixture(scope="module")
def finished(tmp_path_factory, slurm_cluster):
    """A site with one done pilot (partition debug) and one failed pilot (batch), both polled
    into the registry: (cluster, config path, {state: pilot})."""
    slurm = slurm_cluster
    slurm.resume_controller()
    slurm.ensure_running()
    for partition in slurm.partitions:
        slurm.set_partition_state(partition, "UP")
    slurm.cancel_all()
    folder = tmp_path_factory.mktemp("output")
    script = slurm.jobs_dir / f"pilot-output-{folder.name}.sh"
    script.write_text(SCRIPT, encoding="utf-8")
    script.chmod(0o755)
    state_dir = folder / "state"
    doc = {
        "director": {"state_dir": str(state_dir), "command_timeout": 60, "max_threads": 1},
        "state": {"driver": "sqlite", "path": str(state_dir / "state.db")},
        "backends": {
            "slurm": {
                "partitions": ["debug", "batch"],
                "script": str(script),
                "sbatch_options": [
                    f"--output={slurm.jobs_dir}/out-%j.txt",
                    f"--error={slurm.jobs_dir}/err-%j.txt",
                ],
                "env": dict(slurm.env),
            }
        },
        "demand": {"static": {"slurm": 2}},
        "selectors": {"round_robin": {}},
    }
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    clock = FakeClock()
    director = Director(validate_document(doc), clock=clock, extra_plugins=[Collector()])
    try:
        director.run_iteration()
        registry = director.state.pilot_registry()
        ids = [p.job_id for p in registry.query()]
        assert len(ids) == 2, ids
        ended = until(
            lambda: all(squeue_states(slurm).get(i) in ("COMPLETED", "FAILED") for i in ids),
            timeout=90,
        )
        assert ended, squeue_states(slurm)
        director.config.data["demand"]["static"]["slurm"] = 0
        clock.advance(600)
        director.run_iteration()
        pilots = {p.state: p for p in registry.query()}
        assert sorted(pilots) == ["done", "failed"], [(p.job_id, p.state) for p in registry.query()]
        # a pilot whose job the controller does not hold (never had: MinJobAge is an hour)
        registry.put([Pilot("999999", "slurm", "debug", state="done", submitted=1.0, changed=2.0)])
    finally:
        director.close()
    return slurm, path, pilots


def test_output_of_a_done_pilot_escaped_and_cut_at_the_default_cap(finished) -> None:
    cluster, path, pilots = finished
    done = pilots["done"]
    out = gridgate("pilots", "output", "-c", str(path), done.job_id)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"pilot {done.job_id} says hello"
    # the ESC the pilot printed reaches the terminal as the escape it is
    assert lines[1] == "all \\x1b[2J good" and "\x1b" not in out.stdout
    assert lines[2:5] == ["1", "2", "3"]
    whole = len(f"pilot {done.job_id} says hello\nall \x1b[2J good\n") + sum(
        len(f"{i}\n") for i in range(1, LINES + 1)
    )
    assert lines[-1] == f"[cut at {1 << 20} bytes of {whole}: its start is above]"
    # the text before the mark is the first 1 MiB, the ESC counted as the one byte it is
    assert len(out.stdout) - len(lines[-1]) - 1 <= (1 << 20) + 3 + 1


def test_tail_and_stderr_of_a_done_pilot(finished) -> None:
    cluster, path, pilots = finished
    done = pilots["done"]
    tail = gridgate("pilots", "output", "-c", str(path), done.job_id, "--tail", "3")
    assert tail.returncode == 0, tail.stderr
    # the end of a stream longer than the cap: the mark first, then the last lines
    assert tail.stdout.splitlines()[1:] == [str(LINES - 2), str(LINES - 1), str(LINES)]
    assert tail.stdout.startswith(f"[cut at {1 << 20} bytes of ")
    err = gridgate("pilots", "output", "-c", str(path), done.job_id, "--stderr")
    assert (err.returncode, err.stdout) == (0, "a warning\n")


def test_output_of_a_failed_pilot_and_a_small_cap(finished) -> None:
    cluster, path, pilots = finished
    failed = pilots["failed"]
    err = gridgate("pilots", "output", "-c", str(path), failed.job_id, "--stderr", "--json")
    assert err.returncode == 0, err.stderr
    doc = json.loads(err.stdout)
    assert doc["text"] == f"payload broke on {failed.job_id}\n"
    assert doc["where"] == str(cluster.jobs_dir / f"err-{failed.job_id}.txt")
    assert (doc["held"], doc["cut"], doc["stream"], doc["endpoint"]) == (
        True,
        False,
        "stderr",
        "batch",
    )
    small = gridgate(
        "pilots", "output", "-c", str(path), failed.job_id, "--stderr", "--max-bytes", "7"
    )
    size = len(f"payload broke on {failed.job_id}\n")
    assert small.stdout == f"payload\n[cut at 7 bytes of {size}: its start is above]\n"
    empty = gridgate("pilots", "output", "-c", str(path), failed.job_id)
    assert (empty.returncode, empty.stdout) == (0, "")


def test_show_says_where_the_output_is_and_that_it_is_still_there(finished) -> None:
    cluster, path, pilots = finished
    done = pilots["done"]
    shown = gridgate("pilots", "show", "-c", str(path), done.job_id)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "state:     done since" in text and "slurm/debug" in text
    out_path = cluster.jobs_dir / f"out-{done.job_id}.txt"
    assert f"stdout:    {out_path}: still there ({out_path.stat().st_size} bytes)" in text
    doc = json.loads(gridgate("pilots", "show", "-c", str(path), done.job_id, "--json").stdout)
    assert doc["state"] == "done" and doc["output"]["stderr"]["held"] is True
    assert doc["output"]["stderr"]["where"].endswith(f"err-{done.job_id}.txt")


def test_a_file_gone_and_a_job_the_controller_does_not_hold_say_so(finished) -> None:
    cluster, path, pilots = finished
    failed = pilots["failed"]
    (cluster.jobs_dir / f"out-{failed.job_id}.txt").unlink()
    gone = gridgate("pilots", "output", "-c", str(path), failed.job_id)
    assert gone.returncode == 3 and gone.stdout == ""
    where = cluster.jobs_dir / f"out-{failed.job_id}.txt"
    assert f"file {where} is not there" in gone.stderr
    shown = gridgate("pilots", "show", "-c", str(path), failed.job_id).stdout
    assert f"stdout:    {where}: no longer there: file {where} is not there" in shown

    lost = gridgate("pilots", "output", "-c", str(path), "999999")
    assert lost.returncode == 3, lost.stderr
    assert "the controller no longer holds job 999999" in lost.stderr


def test_bad_input_is_refused_with_a_clear_error(finished) -> None:
    cluster, path, pilots = finished
    done = pilots["done"]
    unknown = gridgate("pilots", "output", "-c", str(path), "424242")
    assert unknown.returncode == 1 and "424242: not a tracked pilot" in unknown.stderr
    assert gridgate("pilots", "show", "-c", str(path), "424242").returncode == 1
    for bad in ("../out.txt", "jobs/out.txt", ".."):
        refused = gridgate("pilots", "output", "-c", str(path), done.job_id, "--file", bad)
        assert refused.returncode == 2 and "--file" in refused.stderr, refused.stderr
    both = gridgate("pilots", "output", "-c", str(path), done.job_id, "--stderr", "--file", "x")
    assert both.returncode == 2
    no_files = gridgate("pilots", "output", "-c", str(path), done.job_id, "--file", "x.log")
    assert no_files.returncode == 1 and "cannot read a pilot's file" in no_files.stderr


def test_output_paths_read_from_scontrol_show_job() -> None:
    line = (
        "JobId=4 JobName=wrap UserId=root(0) Command=(null) WorkDir=/tmp/g "
        "StdErr=/tmp/g/err 4.txt StdIn=/dev/null StdOut=/tmp/g/slurm-4.out Power= \n"
    )
    assert output_paths(line) == {"stdout": "/tmp/g/slurm-4.out", "stderr": "/tmp/g/err 4.txt"}
    assert output_paths("") == {}
    assert output_paths("JobId=5 StdErr=(null) StdOut=/a\n") == {"stdout": "/a"}


def test_pilot_output_of_an_odd_id_asks_nothing(slurm_site) -> None:
    backend = build_plugin(SlurmBackend, slurm_site.doc()["backends"]["slurm"])
    out = backend.pilot_output(Endpoint("slurm", "debug"), "12;rm", "stdout", "", 10, False, 5)
    assert out is not None and not out.ok and out.command is None
