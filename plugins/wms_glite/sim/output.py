"""The stand-in ``glite-wms-job-output``: hands a Done job's output sandbox over once, into a
folder of its own under ``--dir``, and the WMS clears the job (``Cleared``, "user retrieved
output sandbox"), as the real client and WMProxy do.

What is known of the real client's answer: the line ``have been successfully retrieved and
stored in the directory:`` followed by the folder (scripts of CRAB and of sites read it so),
under ``/tmp/jobOutput`` without ``--dir``, in a folder ``<user>_<the id's last part>``. The
banner around it and the wording of a refusal are the stand-in's own (formats.md has no
capture of this command): the refusals follow the cancel client's (``Error - ... not
allowed`` / ``Current Job Status is ...``).

The sandbox holds the JDL's StdOutput and StdError (recorded at submission): nothing runs in
the stand-in, so they hold a line saying where the job ran and how it ended.
"""

from __future__ import annotations

import os
import pwd
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gridgate.plugins.wms_glite.sim.jobs import JobTable, now
from gridgate.plugins.wms_glite.sim.tracking import job_snapshot, pilot_specs

OUTPUT = "glite-wms-job-output"
DEFAULT_DIR = "/tmp/jobOutput"
RULE = "=" * 80
STORED = "have been successfully retrieved and stored in the directory:"


def _fail(header: str, detail: str) -> int:
    sys.stderr.write(f"\nError - {header}\n{detail}\n\n")
    return 1


def parse(args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``--noint``, ``--dir DIR``, ``-c``/``--config``, ``--logfile``, ``--debug``, the id.

    :raises ValueError: an option the stand-in does not know, or one without its value.
    """
    opts: dict[str, Any] = {"noint": False, "dir": "", "config": "", "logfile": ""}
    with_value = {"--dir": "dir", "-c": "config", "--config": "config", "--logfile": "logfile"}
    ids: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg in with_value:
            if index + 1 >= len(args):
                raise ValueError(f"option {arg} requires an argument")
            opts[with_value[arg]] = args[index + 1]
            index += 2
            continue
        if arg in ("--noint", "--debug"):
            opts["noint"] = opts["noint"] or arg == "--noint"
        elif arg.startswith("-"):
            raise ValueError(f"{arg}: unrecognized option")
        else:
            ids.append(arg)
        index += 1
    return opts, ids


def main(args: Sequence[str], scenario: Mapping[str, Any], state_dir: str, log: Any) -> int:
    """Entry of the stand-in; ``log(entry)`` writes the calls log."""
    try:
        opts, ids = parse(args)
    except ValueError as exc:
        return _fail("Wrong Option", str(exc))
    if len(ids) != 1:
        return _fail("Wrong Option", "one job id is needed")
    job_id = ids[0]
    table = JobTable.of(scenario, state_dir)
    jobs = table.load() if table is not None else {}
    job = jobs.get(job_id)
    start = time.time()
    host = job.host if job is not None else ""
    log(
        {
            "event": "start",
            "time": start,
            "pid": os.getpid(),
            "command": OUTPUT,
            "host": host,
            "hosts": [host] if host else [],
            "ids": 1,
            "behaviour": "",
            "effective": "",
            "call": 0,
            "argv": [OUTPUT, *args],
        }
    )
    code = _hand_over(opts, scenario, job_id, jobs, table)
    log(
        {
            "event": "end",
            "time": time.time(),
            "start": start,
            "pid": os.getpid(),
            "host": host,
            "returncode": code,
        }
    )
    return code


def _hand_over(
    opts: Mapping[str, Any],
    scenario: Mapping[str, Any],
    job_id: str,
    jobs: Mapping[str, Any],
    table: JobTable | None,
) -> int:
    job = jobs.get(job_id)
    if job is None or table is None:
        return _fail("Operation failed", f"Unable to retrieve the status for: {job_id}")
    at = now(scenario)
    specs = pilot_specs(scenario, jobs)
    if specs.get(job.host, {}).get("status") == "lb_down":
        return _fail("Operation failed", f"Unable to retrieve the status for: {job_id}")
    snap = job_snapshot(job, jobs, specs, at)
    if snap.state == "Cleared":
        return _fail("Output not allowed", "Output files already retrieved")
    if snap.state != "Done" or snap.done_code != 0 or job.nodes:
        name = "Done (Failed)" if snap.state == "Done" else snap.state
        return _fail("Output not allowed", f"Current Job Status is {name}")
    user = pwd.getpwuid(os.geteuid()).pw_name
    folder = Path(opts["dir"] or DEFAULT_DIR) / f"{user}_{job_id.rstrip('/').rsplit('/', 1)[-1]}"
    try:
        folder.mkdir(parents=True)
        stdout, stderr = job.outputs
        (folder / stdout).write_text(
            f"gridgate stand-in pilot {job_id} ran on {snap.destination}\n", encoding="utf-8"
        )
        code = snap.exit_code or 0
        (folder / stderr).write_text(
            f"pilot exited with code {code}\n" if code else "", encoding="utf-8"
        )
    except OSError as exc:
        return _fail("Unable to retrieve the output", f"{folder}: {exc.strerror or exc}")
    table.retrieve(job_id, at)
    sys.stdout.write(
        f"\nConnecting to the service {job.endpoint}\n\n\n{RULE}\n\n"
        "\t\t\tJOB GET OUTPUT OUTCOME\n\n"
        f"Output sandbox files for the job:\n{job_id}\n{STORED}\n{folder}\n\n{RULE}\n\n"
    )
    return 0
