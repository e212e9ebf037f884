"""`gridgate pilots output` and `pilots show` on the real private CE (A-REX 6.17) with the ARC
client (``interface: cli``): a done and a failed pilot's stdout and stderr printed by ``arccat``,
a huge output cut at the cap, ``--tail`` (its end from an ``arcget -k`` copy), another file of the
session, a file the session does not hold, and a job the CE no longer holds.

The pilots are submitted by the real backend once for the module, recorded in the site's sqlite
registry, then read as an operator would read them: ``gridgate`` in another process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.polling import until

from gridgate.core.clock import SYSTEM_CLOCK
from gridgate.core.model import SubmitRequest
from gridgate.core.state import Pilot, open_state
from gridgate.core.testing import build_plugin
from gridgate.plugins.arc.backend import ArcBackend

pytestmark = pytest.mark.xdist_group("arc")

BIN = Path(sys.executable).parent
LINES = 300_000  # seq 1 300000: 1,988,895 bytes, past the 1 MiB default cap
OK = (
    "#!/bin/sh\necho rest pilot says hello\nprintf 'all \\033[2J good\\n'\n"
    f"echo a warning >&2\nseq 1 {LINES}\n"
)
FAIL = "#!/bin/sh\necho payload broke >&2\nexit 3\n"
#: the commands' HOME: never the machine's (the ARC client must not write ~/.arc)
HOME = Path("/nonexistent")


def gridgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gridgate"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(HOME)},
    )


@pytest.fixture(scope="module")
def ended(arc_ce, tmp_path_factory):
    """A site whose registry holds a done and a failed pilot of the CE, as the backend
    submitted them: (site config path, {state: pilot}, CE)."""
    folder = tmp_path_factory.mktemp("cli-output")
    proxy = folder / "proxy.pem"
    shutil.copyfile(arc_ce.proxy, proxy)
    proxy.chmod(0o600)
    state_dir = folder / "state"
    docs = {}
    for name, body in (("ok", OK), ("fail", FAIL)):
        script = folder / name / "pilot.sh"
        script.parent.mkdir()
        script.write_text(body, encoding="utf-8")
        script.chmod(0o755)
        docs[name] = {
            "director": {"state_dir": str(state_dir), "command_timeout": 60},
            "state": {"driver": "sqlite", "path": str(state_dir / "state.db")},
            "backends": {
                "arc": {
                    "interface": "cli",
                    "endpoints": [arc_ce.url],
                    "script": str(script),
                    "env": {
                        "X509_CERT_DIR": str(arc_ce.certificates),
                        "X509_USER_PROXY": str(proxy),
                        "PATH": "/usr/bin:/bin",
                        "HOME": str(HOME),
                    },
                    "command_timeout": 60,
                }
            },
            "demand": {"static": {"arc": 0}},
        }
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(docs["ok"]), encoding="utf-8")
    state = open_state(docs["ok"], SYSTEM_CLOCK)
    backends = {
        name: build_plugin(
            ArcBackend,
            doc["backends"]["arc"],
            clock=SYSTEM_CLOCK,
            state=state,
            state_dir=state_dir,
            name="arc",
            config=doc,
        )
        for name, doc in docs.items()
    }
    try:
        (endpoint,) = backends["ok"].backend_info().endpoints
        ids = {}
        for name, backend in backends.items():
            result = backend.gridgate_submit(
                endpoint=endpoint, request=SubmitRequest("arc", count=1), timeout=60
            )
            assert result.ok, result.message
            ids[name] = result.job_ids[0]

        def final():
            answer = backends["ok"].gridgate_job_status(
                endpoint=endpoint, job_ids=list(ids.values()), timeout=60
            )
            states = {j: s.state for j, s in answer.statuses.items()}
            return states if set(states.values()) <= {"done", "failed"} and states else None

        states = until(final, timeout=240, pause=2)
        assert states == {ids["ok"]: "done", ids["fail"]: "failed"}, states
        pilots = {
            states[j]: Pilot(j, "arc", endpoint.name, state=states[j], submitted=1.0, changed=2.0)
            for j in ids.values()
        }
        state.pilot_registry().put(pilots.values())
    finally:
        for backend in backends.values():
            backend.close()
        state.close()
    return path, pilots, arc_ce


def test_cli_output_of_a_done_pilot_cut_at_the_default_cap(ended) -> None:
    path, pilots, _ce = ended
    out = gridgate("pilots", "output", "-c", str(path), pilots["done"].job_id)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:5] == ["rest pilot says hello", "all \\x1b[2J good", "1", "2", "3"]
    assert lines[-1].startswith(f"[cut at {1 << 20} bytes"), lines[-1]
    assert "\x1b" not in out.stdout


def test_cli_tail_stderr_and_a_file_of_the_session(ended) -> None:
    path, pilots, _ce = ended
    job = pilots["done"].job_id
    tail = gridgate("pilots", "output", "-c", str(path), job, "--tail", "2")
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.splitlines()[1:] == [str(LINES - 1), str(LINES)]
    err = gridgate("pilots", "output", "-c", str(path), job, "--stderr")
    assert (err.returncode, err.stdout) == (0, "a warning\n")
    named = gridgate("pilots", "output", "-c", str(path), job, "--file", "pilot.err")
    assert (named.returncode, named.stdout) == (0, "a warning\n")
    for name in ("pilot.sh", "nosuch.txt"):
        missing = gridgate("pilots", "output", "-c", str(path), job, "--file", name)
        assert missing.returncode == 3 and missing.stdout == "", missing
        assert f"holds no {name} in its session" in missing.stderr


def test_cli_output_of_a_failed_pilot_and_show(ended) -> None:
    path, pilots, _ce = ended
    job = pilots["failed"].job_id
    err = gridgate("pilots", "output", "-c", str(path), job, "--stderr", "--json")
    assert err.returncode == 0, err.stderr
    doc = json.loads(err.stdout)
    assert (doc["text"], doc["held"], doc["cut"], doc["size"]) == (
        "payload broke\n",
        True,
        False,
        14,
    )
    assert doc["where"] == f"pilot.err of {job} (arccat)"
    empty = gridgate("pilots", "output", "-c", str(path), job)
    assert (empty.returncode, empty.stdout) == (0, ""), empty.stderr
    shown = gridgate("pilots", "show", "-c", str(path), job)
    assert shown.returncode == 0, shown.stderr
    assert f"stderr:    {doc['where']}: still there" in shown.stdout, shown.stdout


def test_cli_a_job_the_ce_no_longer_holds_says_so(ended, witness) -> None:
    path, pilots, ce = ended
    job = pilots["failed"].job_id
    witness(ce).jobs("clean", [job])
    gone = until(
        lambda: (r := gridgate("pilots", "output", "-c", str(path), job)).returncode == 3 and r,
        timeout=90,
        pause=2,
    )
    assert gone, "the CE still gives the cleaned job's output"
    assert f"the CE no longer holds job {job.rsplit('/', 1)[-1]}" in gone.stderr
    shown = gridgate("pilots", "show", "-c", str(path), job).stdout
    assert "no longer there: the CE no longer holds job" in shown


def test_arccat_gone_reads_what_arccat_printed_for_a_job_no_longer_there() -> None:
    from gridgate.plugins.arc.documents import arccat_gone

    job = "https://localhost:18447/arex/rest/1.0/jobs/9HcLDmpRhuAoOSAtDmABFKDmABFKDmABFKDmnjKKDm"
    # ARC 6.17's arccat on the private CE: after arcclean (job list), after the CE dropped it
    cleaned = f"Warning: Job not found in job list: {job}\nNo jobs\n"
    assert arccat_gone(cleaned) == (
        f"the CE no longer holds job {job} (cleaned off it: not in the job list)"
    )
    dropped = "No jobs\nWARNING: Failed to process job: 9HcLDmpRhuAo - 404 Job not found\n"
    assert arccat_gone(dropped) == "the CE no longer holds job 9HcLDmpRhuAo"
    # a job not started yet, a file the session lacks, another failure: not "gone"
    for other in (
        f"WARNING: Job has not started yet: {job}\n",
        "ERROR: File download failed: Failed while reading from source: 404 - Not found\n",
        "WARNING: Failed to process job: 9HcLDmpRhuAo - 500 Internal error\n",
    ):
        assert arccat_gone(other) == ""
