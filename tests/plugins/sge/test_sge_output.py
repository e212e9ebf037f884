"""`gridgate pilots output` and `pilots show` on the real Grid Engine cell: a done and a failed
pilot's stdout and stderr read where qsub's ``-o``/``-e`` put them (a path with pseudo
variables, a folder), the job's name and owner from qacct once it left qstat, a huge output cut
at the cap, ``--tail``, and a job the cell does not know.

Every ``gridgate`` runs as the cell's submit user (Grid Engine refuses root), as a site runs
its director under a service account; the commands read the files on this machine, which the
cell's one execution host shares.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from support.polling import until
from support.sge_site import BIN, SgeSite

from gridgate.core.model import Endpoint
from gridgate.core.testing import build_plugin
from gridgate.plugins.sge.backend import SgeBackend
from gridgate.plugins.sge.output import output_options, output_path

LINES = 300_000  # seq 1 300000: 1,988,895 bytes, past the 1 MiB default cap


@pytest.fixture(scope="module")
def ended(sge_cell):
    """A site whose registry holds a done pilot (first queue) and a failed one (second
    queue), polled by the director: (site, config path, {state: pilot id})."""
    sge_cell.reset()
    site = SgeSite(sge_cell, "output")
    out = site.folder / "out"
    out.mkdir(exist_ok=True)
    out.chmod(0o777)
    failing = sge_cell.queues[1]
    site.script = site.pilot(
        "pilot-output.sh",
        f'if [ "$QUEUE" = {failing} ]; then echo "payload broke on $JOB_ID" >&2; exit 3; fi\n'
        'echo "pilot $JOB_ID says hello"\n'
        "printf 'all \\033[2J good\\n'\n"
        'echo "a warning" >&2\n'
        f"seq 1 {LINES}\n",
    )
    options = ["-o", f"{out}/$JOB_NAME.$JOB_ID.out", "-e", f"{out}/"]
    doc = site.doc(pilots=2, qsub_options=options)
    doc["selectors"] = {"round_robin": {}}
    summary = site.run_once(doc)
    assert summary["pilots_submitted"] == 2, summary
    doc["director"]["paused"] = True

    def polled():
        site.run_once(doc)
        listed = gridgate(site, "pilots", "list", "-c", str(site.folder / "site.yaml"), "--json")
        pilots = {p["state"]: p["job_id"] for p in json.loads(listed.stdout)["pilots"]}
        return pilots if sorted(pilots) == ["done", "failed"] else None

    pilots = until(polled, timeout=120, pause=2)
    assert pilots, "the pilots did not end"
    return site, site.folder / "site.yaml", pilots


def gridgate(site: SgeSite, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(site.folder)}
    return subprocess.run(
        [*site.cell.submit_prefix, str(BIN / "gridgate"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=site.folder,
        env=env,
    )


def test_output_of_a_done_pilot_cut_at_the_cap_and_its_tail(ended) -> None:
    site, path, pilots = ended
    job = pilots["done"]
    out = gridgate(site, "pilots", "output", "-c", str(path), job)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:5] == [f"pilot {job} says hello", "all \\x1b[2J good", "1", "2", "3"]
    whole = len(f"pilot {job} says hello\nall \x1b[2J good\n") + sum(
        len(f"{i}\n") for i in range(1, LINES + 1)
    )
    assert lines[-1] == f"[cut at {1 << 20} bytes of {whole}: its start is above]"
    tail = gridgate(site, "pilots", "output", "-c", str(path), job, "--tail", "2")
    assert tail.stdout.splitlines()[1:] == [str(LINES - 1), str(LINES)], tail.stderr
    err = gridgate(site, "pilots", "output", "-c", str(path), job, "--stderr")
    assert (err.returncode, err.stdout) == (0, "a warning\n"), err.stderr


def test_output_of_a_failed_pilot_and_show(ended) -> None:
    site, path, pilots = ended
    job = pilots["failed"]
    err = gridgate(site, "pilots", "output", "-c", str(path), job, "--stderr", "--json")
    assert err.returncode == 0, err.stderr
    doc = json.loads(err.stdout)
    # -e names a folder: qsub puts NAME.eJOB in it; the name is the director's
    assert doc["text"] == f"payload broke on {job}\n"
    assert doc["where"].startswith(f"{site.folder}/out/gridgate-pilot-")
    assert doc["where"].endswith(f".e{job}")
    shown = gridgate(site, "pilots", "show", "-c", str(path), job)
    assert shown.returncode == 0, shown.stderr
    assert f"stderr:    {doc['where']}: still there ({len(doc['text'])} bytes)" in shown.stdout
    assert f".{job}.out: still there (0 bytes)" in shown.stdout


def test_a_job_the_cell_does_not_know_and_a_file_not_there(ended) -> None:
    site, path, pilots = ended
    backend = build_plugin(
        SgeBackend, site.section(qsub_options=["-o", "/nonexistent/$JOB_NAME.out"])
    )
    endpoint = Endpoint("sge", site.cell.queues[0])
    lost = backend.pilot_output(endpoint, "999999", "stdout", "", 10, False, 60)
    assert lost is not None and lost.ok and not lost.held
    assert lost.message == "the cell no longer knows job 999999 (qstat -j, qacct -j)"
    # the done pilot, as if its files had gone to a folder that is not there
    gone = backend.pilot_output(endpoint, pilots["done"], "stdout", "", 10, False, 60)
    assert gone is not None and gone.ok and not gone.held
    assert gone.message.startswith("file /nonexistent/gridgate-pilot-")
    unknown = gridgate(site, "pilots", "output", "-c", str(path), "999999")
    assert unknown.returncode == 1 and "999999: not a tracked pilot" in unknown.stderr


def test_output_path_as_qsub_reads_its_options(tmp_path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    plain = output_options(["-j", "y", "-P", "atlas"])
    assert output_path(plain, "stderr", "41.2", "pilot", "u", "/home/u") == (
        "/home/u/pilot.o41.2",
        "",
    )
    named = output_options(["-o", "$HOME/$USER/$JOB_NAME-$JOB_ID.$TASK_ID", "-wd", "/w"])
    assert output_path(named, "stdout", "41", "p", "u", "/h") == ("/h/u/p-41.undefined", "")
    assert output_path(named, "stderr", "41", "p", "u", "/h") == ("/w/p.e41", "")
    into = output_options(["-e", str(folder)])
    assert output_path(into, "stderr", "7", "p", "u", "/h") == (f"{folder}/p.e7", "")
    assert output_path(output_options(["-cwd"]), "stdout", "7", "p", "u", "/h")[1]
    assert "hosts" in output_path(output_options(["-o", "h1:/a"]), "stdout", "7", "p", "u", "/h")[1]
