"""The stand-in ``glite-wms-job-status`` and ``glite-wms-job-cancel``: they read the job table
the stand-in submit writes and print what the real clients print (formats.md, "Tracking
pilots"), byte for byte where the source or a capture says it.

The client's version is the scenario's ``ui``: ``glite`` (gLite 3.1/3.2, the default:
``Done (Success)``, trailing spaces after other states, errors on stderr) or ``emi``
(``Done(Success)``, no trailing space, warnings on stdout). Exit codes of the status command:
0 all answered, 255 some, 1 none or a bad option; of the cancel command: 0 or 1.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gridgate.plugins.wms_glite.sim.jobs import (
    Job,
    JobTable,
    Snapshot,
    now,
    parent_snapshot,
    snapshot,
)
from gridgate.plugins.wms_glite.sim.scenario import host_spec

STATUS = "glite-wms-job-status"
CANCEL = "glite-wms-job-cancel"
HEADER = "=" * 23 + f" {STATUS} Success " + "=" * 21
RULE = "=" * 74
CANCEL_HEADER = "=" * 29 + f" {CANCEL} Success " + "=" * 29
CANCEL_RULE = "=" * 88
LABEL = 20
LONG_HANG = 3600.0
#: What the LB answers for an id, per client version: (gLite 3.x line, EMI line).
LB_MESSAGES = {
    "unknown": (
        "edg_wll_JobStatus: No such file or directory: no matching jobs found",
        "No such file or directory - no matching jobs found",
    ),
    "purged": (
        "edg_wll_JobStatus: Identifier removed: matching job already purged",
        "Identifier removed - matching job already purged",
    ),
    "lb_down": (
        "edg_wll_JobStatus: Connection refused: edg_wll_ssl_connect()",
        "Connection refused - edg_wll_ssl_connect()",
    ),
}
#: States the client lets a cancel through in (Done only as Done (Failed)).
CANCELLABLE = ("Submitted", "Waiting", "Ready", "Scheduled", "Running", "Unknown")


class BadOption(Exception):
    pass


def parse(program: str, args: Sequence[str]) -> dict[str, Any]:
    """The options of the EMI status script / the C++ cancel client that matter here."""
    opts: dict[str, Any] = {
        "noint": False,
        "input": "",
        "verbosity": 1,
        "ids": [],
        "logfile": "",
        "nonodes": False,
        "config": "",
        "output": "",
    }
    with_value = {
        "-i": "input",
        "--input": "input",
        "-v": "verbosity",
        "--verbosity": "verbosity",
        "-c": "config",
        "--config": "config",
        "--logfile": "logfile",
        "-o": "output",
        "--output": "output",
    }
    if program == CANCEL:
        with_value.pop("-v")
        with_value.pop("--verbosity")
    flags = {"--noint": "noint", "--debug": "debug", "--nonodes": "nonodes"}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg in with_value:
            if index + 1 >= len(args):
                raise BadOption(f"option {arg} requires an argument")
            opts[with_value[arg]] = args[index + 1]
            index += 2
            continue
        if arg in flags:
            opts[flags[arg]] = True
        elif arg.startswith("-"):
            raise BadOption(f"{arg}: unrecognized option")
        else:
            opts["ids"].append(arg)
        index += 1
    if program == STATUS:
        level = str(opts["verbosity"])
        if not level.isdigit():
            raise BadOption(f"--verbosity: {level!r} is not a number")
        if int(level) > 3:
            raise BadOption("UI_ARG_OUT_OF_LIMIT: verbosity level out of limit (0-3)")
        opts["verbosity"] = int(level)
    return opts


def read_ids(opts: dict[str, Any]) -> list[str]:
    """The ids of the command line and of ``-i FILE`` (blank, ``#`` and ``//`` lines skipped)."""
    ids = list(opts["ids"])
    if opts["input"]:
        if not os.path.isfile(opts["input"]):
            raise BadOption(f"UI_FILE_NOT_FOUND: {opts['input']}: no such file")
        with open(opts["input"], encoding="utf-8", errors="replace") as handle:
            for line in handle:
                line = line.strip()
                if line and not line.startswith(("#", "//")):
                    ids.append(line)
    if not ids:
        raise BadOption("no job id specified")
    return list(dict.fromkeys(ids))


def _write(stream: Any, text: str) -> None:
    stream.write(text)
    stream.flush()


# --- status ---------------------------------------------------------------------------------------


def pilot_specs(scenario: Mapping[str, Any], jobs: Mapping[str, Job]) -> dict[str, dict[str, Any]]:
    """Each host's ``pilots`` spec; a host that list-matches nothing aborts its pilots unless
    told otherwise (its WMS accepted them but can never place them)."""
    specs: dict[str, dict[str, Any]] = {}
    for host in {job.host for job in jobs.values()}:
        spec = host_spec(scenario, host)
        pilots = dict(spec.get("pilots") or {})
        if spec.get("behaviour") == "no_match":
            pilots.setdefault("outcome", "aborted")
        specs[host] = pilots
    return specs


def state_text(snap: Snapshot, ui: str) -> str:
    """``Current Status`` as the client prints it."""
    if snap.state == "Done":
        code = {
            0: "Success" if not snap.exit_code else "Exit Code !=0",
            1: "Failed",
            2: "Cancelled",
        }.get(snap.done_code or 0, f"Unexpected done code: {snap.done_code} ")
        return f"Done({code})" if ui == "emi" else f"Done ({code})"
    return snap.state if ui == "emi" else f"{snap.state} "


def block(
    job_id: str, snap: Snapshot, ui: str, verbosity: int, indent: str = "", submitted: float = 0.0
) -> str:
    def line(label: str, value: str) -> str:
        return f"{indent}{(label + ':').ljust(LABEL)}{value}\n"

    out = f"{indent}Status info for the Job : {job_id}\n" + line(
        "Current Status", state_text(snap, ui)
    )
    if verbosity == 0:
        return out
    if snap.logged:
        out += f"{indent}Logged Reason(s):\n" + "".join(f"{indent}    - {r}\n" for r in snap.logged)
    if snap.state == "Done":
        out += line("Exit code", str(snap.exit_code if snap.exit_code is not None else 1))
    if snap.reason:
        out += line("Status Reason", snap.reason)
    if snap.destination:
        out += line("Destination", snap.destination)
    stamp = time.localtime(submitted)
    out += line("Submitted", f"{time.asctime(stamp)} {time.strftime('%Z', stamp)}")
    return out


def status_main(
    opts: dict[str, Any], scenario: Mapping[str, Any], ids: list[str], jobs: Mapping[str, Job]
) -> int:
    ui = str(scenario.get("ui", "glite"))
    at = now(scenario)
    verbosity = int(opts["verbosity"])
    specs = pilot_specs(scenario, jobs)
    slowest = max(
        (
            float(specs.get(jobs[j].host, {}).get("status_latency", 0) or 0)
            for j in ids
            if j in jobs
        ),
        default=0.0,
    )
    if any(specs.get(jobs[j].host, {}).get("status") == "hang" for j in ids if j in jobs):
        time.sleep(LONG_HANG)
    if slowest > 0:
        time.sleep(slowest)
    chunks: list[str] = []
    failures: list[tuple[str, str]] = []
    for job_id in ids:
        job = jobs.get(job_id)
        if job is None:
            failures.append((job_id, "unknown"))
            continue
        spec = specs.get(job.host, {})
        if spec.get("status") == "lb_down":
            failures.append((job_id, "lb_down"))
            continue
        snap = job_snapshot(job, jobs, specs, at)
        if snap.state == "Purged":
            failures.append((job_id, "purged"))
            continue
        text = block(job_id, snap, ui, verbosity, submitted=job.submitted)
        if job.nodes and not opts["nonodes"]:
            nodes = "".join(
                block(
                    node,
                    job_snapshot(jobs[node], jobs, specs, at),
                    ui,
                    verbosity,
                    "    ",
                    job.submitted,
                )
                + RULE
                + "\n\n"
                for node in job.nodes
            )
            text += RULE + "\n\n- Nodes information for: \n" + nodes
            chunks.append(
                ("\n" + HEADER + "\nBOOKKEEPING INFORMATION:\n\n" if verbosity else "") + text
            )
            continue
        chunks.append(
            ("\n" + HEADER + "\nBOOKKEEPING INFORMATION:\n\n" + text + RULE + "\n\n")
            if verbosity
            else text
        )
    if verbosity == 0 and chunks:
        _write(
            sys.stdout,
            "\n" + HEADER + "\nBOOKKEEPING INFORMATION:\n\n" + "".join(chunks) + RULE + "\n\n",
        )
    elif chunks:
        _write(sys.stdout, "".join(chunks))
    report_failures(failures, len(ids), ui, opts)
    if opts["logfile"]:
        _write(
            sys.stdout,
            "\n                           *** Log file created ***\n"
            "Possible Errors and Debug messages have been printed in the following file:\n"
            f"{opts['logfile']}\n\n",
        )
    if not failures:
        return 0
    return 255 if len(failures) < len(ids) else 1


def job_snapshot(
    job: Job, jobs: Mapping[str, Job], specs: Mapping[str, Mapping[str, Any]], at: float
) -> Snapshot:
    """What the LB says of ``job`` at ``at``: a parametric parent's state follows its nodes."""
    spec = specs.get(job.host, {})
    if not job.nodes:
        return snapshot(job, spec, at)
    return parent_snapshot([snapshot(jobs[n], spec, at) for n in job.nodes], job.submitted)


def report_failures(
    failures: list[tuple[str, str]], asked: int, ui: str, opts: dict[str, Any]
) -> None:
    """The per-id errors: gLite 3.x on stderr (with --noint, --logfile or --debug), EMI on
    stdout."""
    if not failures:
        return
    if ui == "emi":
        _write(
            sys.stdout,
            "".join(
                f"*** Warning: Unable to retrieve the status for: {job_id}\n"
                f"{LB_MESSAGES[kind][1]}\n"
                for job_id, kind in failures
            ),
        )
        return
    level = "Warning" if asked > 1 else "Error"
    text = "".join(
        f"\n**** {level}: API_NATIVE_ERROR ****  \n"
        'Error while calling the "Job:getStatus" native api \n'
        f"Unable to retrieve the status for: {job_id}\n{LB_MESSAGES[kind][0]}\n"
        for job_id, kind in failures
    )
    if asked > 1 and len(failures) == asked:
        text += (
            "\n**** Error: LB_API_OPEN_ALL ****  \nUnable to open connection with any LB supplied\n"
        )
    if opts["logfile"] and opts["logfile"] not in ("/dev/stderr", "/dev/stdout"):
        with open(opts["logfile"], "a", encoding="utf-8") as handle:
            handle.write(text)
    if opts["noint"] or opts["logfile"] or opts.get("debug"):
        _write(sys.stderr, text + "\n")


# --- cancel ---------------------------------------------------------------------------------------


def cancel_main(
    opts: dict[str, Any],
    scenario: Mapping[str, Any],
    ids: list[str],
    jobs: Mapping[str, Job],
    table: JobTable | None,
) -> int:
    at = now(scenario)
    if not opts["noint"]:
        _write(sys.stdout, "Are you sure you want to remove specified job(s) [y/n]y : ")
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("", "y", "yes"):
            _write(sys.stdout, "\n")
            return 0
    specs = pilot_specs(scenario, jobs)
    allowed: list[str] = []
    refusals: list[tuple[str, str]] = []
    for job_id in ids:
        job = jobs.get(job_id)
        if job is None:
            refusals.append((job_id, "Unable to retrieve the status for: " + job_id))
            continue
        if specs.get(job.host, {}).get("status") == "lb_down":
            refusals.append((job_id, "Unable to retrieve the status for: " + job_id))
            continue
        snap = job_snapshot(job, jobs, specs, at)
        if snap.state in CANCELLABLE or (snap.state == "Done" and snap.done_code == 1):
            allowed.append(job_id)
        else:
            name = "Done" if snap.state == "Done" else snap.state
            refusals.append((job_id, f"Current Job Status is {name}"))
    if len(ids) == 1 and refusals:
        _, detail = refusals[0]
        header = "Cancel not allowed" if detail.startswith("Current") else "Operation Failed"
        _write(sys.stderr, f"\nError - {header}\n{detail}\n\n")
        return 1
    for job_id, detail in refusals:
        header = "Cancel not allowed" if detail.startswith("Current") else "Operation Failed"
        # formats.md: with several ids the client only warns (its exact text is uncertain).
        _write(sys.stderr, f"\nWarning - {header}: {job_id}\n{detail}\n")
    if not allowed:
        _write(sys.stderr, "\nError - Operation Failed\nUnable to cancel any job\n\n")
        return 1
    if table is not None:
        table.cancel(allowed, at)
    endpoints = list(dict.fromkeys(jobs[j].endpoint for j in allowed))
    _write(
        sys.stdout,
        "".join(f"\nConnecting to the service {ep}\n" for ep in endpoints)
        + "\n\n"
        + CANCEL_HEADER
        + "\n\n"
        "The cancellation request has been successfully submitted for the following job(s):\n\n"
        + "".join(f"- {j}\n" for j in allowed)
        + "\n"
        + CANCEL_RULE
        + "\n\n\n",
    )
    return 0


def main(
    program: str, args: Sequence[str], scenario: Mapping[str, Any], state_dir: str, log: Any
) -> int:
    """Entry of both commands; ``log(entry)`` writes the calls log."""
    try:
        opts = parse(program, args)
        if opts["input"] and not opts["noint"] and program == STATUS:
            raise BadOption("-i without --noint opens an interactive menu; use --noint")
        ids = read_ids(opts)
    except BadOption as exc:
        _write(sys.stderr, f"\nError - Wrong Option\n{exc}\n\n")
        return 1
    table = JobTable.of(scenario, state_dir)
    jobs = table.load() if table is not None else {}
    hosts = sorted({jobs[j].host for j in ids if j in jobs})
    start = time.time()
    log(
        {
            "event": "start",
            "time": start,
            "pid": os.getpid(),
            "command": program,
            "host": ",".join(hosts),
            "hosts": hosts,
            "ids": len(ids),
            "behaviour": "",
            "effective": "",
            "call": 0,
            "argv": [program, *args],
        }
    )
    if program == STATUS:
        code = status_main(opts, scenario, ids, jobs)
    else:
        code = cancel_main(opts, scenario, ids, jobs, table)
    log(
        {
            "event": "end",
            "time": time.time(),
            "start": start,
            "pid": os.getpid(),
            "host": ",".join(hosts),
            "returncode": code,
        }
    )
    return code
