"""The stand-in ``glite-wms-job-submit`` / ``glite-wms-job-list-match``: real processes that
print what the real client prints (formats.md) and misbehave as the scenario file says.

The program's identity comes from the basename of argv[0], like the real client's banners.
Behaviour is chosen per endpoint host, from the file named by ``GRIDGATE_SIM_SCENARIO``.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gridgate.plugins.wms_glite.parse import banner
from gridgate.plugins.wms_glite.sim import output, tracking
from gridgate.plugins.wms_glite.sim.jobs import JobTable
from gridgate.plugins.wms_glite.sim.jobs import now as jobs_now
from gridgate.plugins.wms_glite.sim.scenario import (
    CALLS_LOG_ENV,
    SCENARIO_ENV,
    STATE_ENV,
    ScenarioError,
    host_spec,
    load_scenario,
)

SUBMIT = "glite-wms-job-submit"
LIST_MATCH = "glite-wms-job-list-match"
LB_HOST = "lb01.example.org"
DEFAULT_CES = (
    "ce01.example.org:8443/cream-pbs-long",
    "ce02.example.org:2119/jobmanager-lcgpbs-grid",
)
RULE = "=" * 74
EXIT_USAGE = 255
LONG_HANG = 3600.0


class UsageError(Exception):
    """A bad command line: the real client prints it and exits -1 (255)."""

    def __init__(self, header: str, message: str) -> None:
        super().__init__(message)
        self.header, self.message = header, message


@dataclass
class Options:
    program: str
    endpoint: str = ""
    auto_delegation: bool = False
    delegation_id: str = ""
    config: str = ""
    output: str = ""
    nomsg: bool = False
    json: bool = False
    noint: bool = False
    resource: str = ""
    rank: bool = False
    jdl: str = ""
    argv: list[str] = field(default_factory=list)


def parse_args(program: str, args: Sequence[str]) -> Options:
    """The real client's options (formats.md); anything else is a usage error."""
    opts = Options(program=program, argv=list(args))
    with_value = {
        "-e": "endpoint",
        "--endpoint": "endpoint",
        "-d": "delegation_id",
        "--delegationid": "delegation_id",
        "-c": "config",
        "--config": "config",
        "-o": "output",
        "--output": "output",
        "-r": "resource",
        "--resource": "resource",
    }
    flags = {
        "-a": "auto_delegation",
        "--autm-delegation": "auto_delegation",
        "--noint": "noint",
        "--json": "json",
    }
    if program == SUBMIT:
        flags["--nomsg"] = "nomsg"
    else:
        flags["--rank"] = "rank"
    positional: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg.startswith("--") and "=" in arg:
            # getopt_long also takes --endpoint=URL.
            name, value = arg.split("=", 1)
            if name not in with_value:
                raise UsageError("Wrong Option", f"{program}: unrecognized option '{arg}'")
            setattr(opts, with_value[name], value)
            index += 1
            continue
        if arg in with_value:
            if index + 1 >= len(args):
                raise UsageError("Wrong Option", f"option '{arg}' requires an argument")
            setattr(opts, with_value[arg], args[index + 1])
            index += 2
            continue
        if arg in flags:
            setattr(opts, flags[arg], True)
        elif arg.startswith("-") and arg != "-":
            raise UsageError("Wrong Option", f"{program}: unrecognized option '{arg}'")
        else:
            positional.append(arg)
        index += 1
    if opts.auto_delegation and opts.delegation_id:
        raise UsageError(
            "Wrong Option",
            "The following options cannot be specified together:\n"
            "--autm-delegation, -a\n--delegationid, -d\t<id_string>",
        )
    if not opts.auto_delegation and not opts.delegation_id:
        raise UsageError(
            "Wrong Option",
            "A mandatory option is missing; specify one of these operations:\n"
            "--autm-delegation, -a\n--delegationid, -d\t<id_string>",
        )
    if len(positional) != 1:
        raise UsageError("Wrong Option", "Last argument of the command must be a JDL file")
    opts.jdl = positional[0]
    return opts


def usage_text(program: str) -> str:
    return (
        f"\nUsage: {program} <delegation-opts> [options]  <jdl_file>\n\n"
        "delegation-opts:\n\t--delegationid, -d\t<id_string>\n\t--autm-delegation, -a\n\n"
        "options:\n\t--endpoint, -e\t<service_URL>\n\t--config, -c\t<file_path>\n"
        "\t--output, -o\t<file_path>\n\t--noint\n\t--json\n"
        + ("\t--nomsg\n" if program == SUBMIT else "\t--rank\n")
    )


# --- output helpers ---------------------------------------------------------------------------


class Out:
    """Writes like the client and flushes at once, so a kill keeps what was printed."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts

    def info(self, text: str) -> None:
        if not (self.opts.nomsg or self.opts.json):
            self.raw(text)

    def raw(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def error(self, header: str, message: str) -> None:
        sys.stderr.write(f"\nError - {header}\n{message}\n\n")
        sys.stderr.flush()

    def warning(self, text: str) -> None:
        sys.stderr.write(f"\nWarning - {text}\n")
        sys.stderr.flush()


def new_job_id() -> str:
    token = base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")
    return f"https://{LB_HOST}:9000/{token}"


def jdl_parameters(jdl: str) -> int:
    """How many pilots a parametric JDL asks for (1 for a plain job)."""
    if not re.search(r'JobType\s*=\s*"Parametric"', jdl, re.I):
        return 1
    found = re.search(r"\bParameters\s*=\s*(\d+)\s*;", jdl)
    return max(1, int(found.group(1))) if found else 1


def jdl_string(jdl: str, attribute: str, default: str) -> str:
    """The string value of ``attribute`` in ``jdl`` (``StdOutput = "std.out";``), else
    ``default``."""
    found = re.search(rf'^\s*{attribute}\s*=\s*"([^"]*)"\s*;', jdl, re.M | re.I)
    return found[1] if found else default


# --- per-host call counting -------------------------------------------------------------------


def next_call_number(state_dir: str, host: str) -> int:
    """Count this call for ``host`` (1, 2, 3...) in a file shared by concurrent stand-ins."""
    if not state_dir:
        return 1
    directory = Path(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "_"
    with open(directory / f"{safe}.calls", "a+", encoding="ascii") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read().strip()
        number = (int(text) if text.isdigit() else 0) + 1
        handle.seek(0)
        handle.truncate()
        handle.write(str(number))
        handle.flush()
    return number


def effective_behaviour(spec: Mapping[str, Any], call: int, now: float) -> tuple[str, float]:
    """(behaviour to act out, latency) for this call of a host with ``spec``."""
    behaviour = spec.get("behaviour", "healthy")
    latency = float(spec.get("latency", 0) or 0)
    if behaviour == "flapping":
        every = max(1, int(spec.get("every", 2)))
        if call % every == 0:
            return _failure_of(spec)
        return "healthy", latency
    if behaviour == "slow_then_recover":
        calls = spec.get("calls")
        until = spec.get("until")
        failing = (calls is not None and call <= int(calls)) or (
            until is not None and now < float(until)
        )
        if calls is None and until is None:
            failing = call <= 1
        if failing:
            return _failure_of(spec, default="slow")
        return "healthy", latency
    return behaviour, latency


def _failure_of(spec: Mapping[str, Any], default: str = "unreachable") -> tuple[str, float]:
    fail_as = spec.get("fail_as", default)
    if fail_as == "slow":
        return "healthy", float(spec.get("slow_latency", 5.0))
    return fail_as, float(spec.get("fail_latency", spec.get("latency", 0)) or 0)


# --- calls log --------------------------------------------------------------------------------


_CALLS_LOG = ""
#: The job table submissions are recorded in, and the scenario (for its clock).
_JOBS: tuple[JobTable | None, Mapping[str, Any]] = (None, {})


def _calls_log_path() -> str:
    return _CALLS_LOG


def log_event(path: str, entry: Mapping[str, Any]) -> None:
    if not path:
        return
    line = (json.dumps(dict(entry)) + "\n").encode("utf-8")
    # One O_APPEND write per line: concurrent stand-ins never interleave within a line.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


# --- behaviours -------------------------------------------------------------------------------


def connecting(out: Out, endpoint: str) -> None:
    out.info(f"\nConnecting to the service {endpoint}\n\n")


def fail_reason(opts: Options, endpoint: str, lines: str) -> str:
    if opts.program == SUBMIT:
        return f"Unable to submit the job to the service: {endpoint}\n{lines}"
    return f"Unable to perform the operation: {lines}"


def act(behaviour: str, opts: Options, spec: Mapping[str, Any], jdl: str) -> tuple[int, int | None]:
    """Print and exit as ``behaviour``; returns (exit code, grandchild pid)."""
    out = Out(opts)
    endpoint = opts.endpoint
    program = opts.program
    hang = float(spec.get("hang", LONG_HANG))
    if behaviour == "hang_before_print":
        time.sleep(hang)
        behaviour = "healthy"
    if behaviour == "print_then_hang":
        connecting(out, endpoint)
        if program == SUBMIT:
            out.info("\n" + banner(program, "Success") + "\n\n")
        time.sleep(hang)
        return 1, None
    if behaviour == "grandchild":
        connecting(out, endpoint)
        # The grandchild inherits stdout and stderr and outlives us: whoever waits for EOF on
        # the pipes waits for it, exactly like a client that left a helper process behind.
        child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({hang!r})"])
        if spec.get("parent_hangs"):
            log_event(
                _calls_log_path(),
                {
                    "event": "grandchild",
                    "time": time.time(),
                    "pid": os.getpid(),
                    "grandchild": child.pid,
                },
            )
            time.sleep(hang)
        return int(spec.get("exit_code", 0)), child.pid
    if behaviour == "overloaded":
        connecting(out, endpoint)
        detail = (
            "System load is too high:\nThreshold for Load Average(15 min): 10 => "
            f"Detected value for Load Average(15 min): {spec.get('load', 23.51)}"
        )
        out.error("Operation failed", fail_reason(opts, endpoint, detail))
        return 1, None
    if behaviour == "drained":
        connecting(out, endpoint)
        out.error(
            "Operation failed",
            fail_reason(opts, endpoint, "Unavailable service (the server is temporarily drained)"),
        )
        return 1, None
    if behaviour == "unreachable":
        connecting(out, endpoint)
        out.warning(
            f"WMProxy unreachable: {endpoint}\nWMProxy Server may be down (or wrong server name)"
        )
        out.error("Operation failed", "Unable to contact any specified enpoint")
        return 1, None
    if behaviour == "auth":
        if spec.get("auth") == "delegation":
            connecting(out, endpoint)
            out.error(
                "Operation failed",
                f"Unable to delegate the credential to the endpoint: {endpoint}\n"
                "Proxy is expired or not valid",
            )
        else:
            out.error("Proxy File Not Found", "No path to valid proxy file has been found")
        return 1, None
    if behaviour == "usage":
        sys.stderr.write(f"{program}: unrecognized option '--noint'\n" + usage_text(program))
        sys.stderr.flush()
        return EXIT_USAGE, None
    if behaviour == "error":
        connecting(out, endpoint)
        out.error(
            "Operation failed",
            fail_reason(
                opts, endpoint, spec.get("message", "SOAP-ENV:Server: internal server error")
            ),
        )
        return 1, None
    if behaviour == "garbage":
        # Exit 0 without a job id: junk, invalid UTF-8, and the :7443 endpoint (which a sloppy
        # parser would take for a job id).
        sys.stdout.buffer.write(b"\nConnecting to the service " + endpoint.encode() + b"\n\n")
        remaining = int(spec.get("garbage_bytes", 256))
        while remaining > 0:
            # Written in chunks so that 50 MB of garbage does not need 50 MB of memory.
            junk = os.urandom(min(remaining, 1 << 20)).replace(b":9000/", b":9001/")
            sys.stdout.buffer.write(junk)
            remaining -= len(junk)
        sys.stdout.buffer.write(b"\n\xff\xfe half a line")
        sys.stdout.flush()
        return 0, None
    if program == LIST_MATCH:
        return list_match_answer(out, endpoint, spec, no_match=behaviour == "no_match"), None
    # healthy submit (a "no_match" host still accepts submissions: the WMS matches later).
    return submit_answer(out, opts, jdl), None


def list_match_answer(out: Out, endpoint: str, spec: Mapping[str, Any], no_match: bool) -> int:
    connecting(out, endpoint)
    if no_match:
        out.raw(
            banner(LIST_MATCH, "failure") + "\n\n"
            "No Computing Element matching your job requirements has been found!\n\n"
            + RULE
            + "\n\n\n"
        )
        return 0
    ces = spec.get("ces") or list(DEFAULT_CES)
    listing = "".join(f" - {ce}\n" for ce in ces)
    out.raw(
        RULE + "\n\n\t\t     COMPUTING ELEMENT IDs LIST \n"
        " The following CE(s) matching your job requirements have been found:\n\n"
        "\t*CEId*\n" + listing + "\n" + RULE + "\n\n\n"
    )
    return 0


def submit_answer(out: Out, opts: Options, jdl: str) -> int:
    pilots = jdl_parameters(jdl)
    parent = new_job_id()
    children = {f"Node_{i}": new_job_id() for i in range(pilots)} if pilots > 1 else {}
    table, scenario = _JOBS
    if table is not None:  # the status and cancel stand-ins give it a lifecycle
        table.add(
            opts.endpoint,
            parent,
            list(children.values()),
            jobs_now(scenario),
            (jdl_string(jdl, "StdOutput", "std.out"), jdl_string(jdl, "StdError", "std.err")),
        )
    if opts.output:
        try:
            Path(opts.output).write_text(f"###Submitted Job Ids###\n{parent}\n", encoding="utf-8")
        except OSError as exc:
            out.error("Output File Error", f"unable to write the output file {opts.output}: {exc}")
            return 1
    if opts.json:
        answer: dict[str, Any] = {"result": "success", "endpoint": opts.endpoint}
        if children:
            answer.update(parent=parent, children=children)
        else:
            answer["jobid"] = parent
        out.raw(json.dumps(answer) + "\n")
        return 0
    if opts.nomsg:
        out.raw(parent + "\n")
        return 0
    connecting(out, opts.endpoint)
    out.info(
        "\n" + banner(opts.program, "Success") + "\n\n"
        "The job has been successfully submitted to the WMProxy\n"
        "Your job identifier is:\n\n"
        f"{parent}\n\n" + RULE + "\n\n\n"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the stand-ins; the basename of argv[0] says which one this is."""
    argv = list(sys.argv if argv is None else argv)
    program = os.path.basename(argv[0]) if argv else SUBMIT
    if program in (tracking.STATUS, tracking.CANCEL, output.OUTPUT):
        return _tracking_main(program, argv[1:])
    if program not in (SUBMIT, LIST_MATCH):
        program = LIST_MATCH if "list-match" in program else SUBMIT
    try:
        opts = parse_args(program, argv[1:])
    except UsageError as exc:
        sys.stderr.write(f"\nError - {exc.header}\n{exc.message}\n" + usage_text(program))
        return EXIT_USAGE
    try:
        scenario = load_scenario(os.environ.get(SCENARIO_ENV))
    except ScenarioError as exc:
        sys.stderr.write(f"\nError - Stand-in Scenario Error\n{exc}\n\n")
        return 1
    # Without -e the real client takes the endpoint from this variable (formats.md).
    opts.endpoint = opts.endpoint or os.environ.get("GLITE_WMS_WMPROXY_ENDPOINT", "")
    host = ""
    if opts.endpoint:
        try:
            host = urlsplit(opts.endpoint).hostname or opts.endpoint
        except ValueError:
            host = opts.endpoint
    spec = host_spec(scenario, host)
    state_dir = str(scenario.get("state_dir") or os.environ.get(STATE_ENV, ""))
    calls_log = str(scenario.get("calls_log") or os.environ.get(CALLS_LOG_ENV, ""))
    global _CALLS_LOG, _JOBS
    _CALLS_LOG = calls_log
    _JOBS = (JobTable.of(scenario, state_dir), scenario)
    call = next_call_number(state_dir, host) if state_dir else 1
    start = time.time()
    behaviour, latency = effective_behaviour(spec, call, start)
    try:
        jdl = Path(opts.jdl).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        Out(opts).error("Invalid JDL File", f"Unable to read the JDL file {opts.jdl}: {exc}")
        return 1
    record = {
        "event": "start",
        "time": start,
        "pid": os.getpid(),
        "command": program,
        "host": host,
        "behaviour": spec.get("behaviour", "healthy"),
        "effective": behaviour,
        "call": call,
        "argv": argv,
        "jdl": jdl,
    }
    log_event(calls_log, record)
    if not opts.endpoint:
        Out(opts).error("Operation failed", "Unable to contact any specified enpoint")
        code, grandchild = 1, None
    else:
        if latency > 0:
            time.sleep(latency)
        code, grandchild = act(behaviour, opts, spec, jdl)
    log_event(
        calls_log,
        {
            "event": "end",
            "time": time.time(),
            "start": start,
            "pid": os.getpid(),
            "host": host,
            "returncode": code,
            "grandchild": grandchild,
        },
    )
    return code


def _tracking_main(program: str, args: list[str]) -> int:
    try:
        scenario = load_scenario(os.environ.get(SCENARIO_ENV))
    except ScenarioError as exc:
        sys.stderr.write(f"\nError - Stand-in Scenario Error\n{exc}\n\n")
        return 1
    state_dir = str(scenario.get("state_dir") or os.environ.get(STATE_ENV, ""))
    calls_log = str(scenario.get("calls_log") or os.environ.get(CALLS_LOG_ENV, ""))

    def log(entry: Mapping[str, Any]) -> None:
        log_event(calls_log, entry)

    if program == output.OUTPUT:
        return output.main(args, scenario, state_dir, log)
    return tracking.main(program, args, scenario, state_dir, log)


if __name__ == "__main__":  # pragma: no cover - the installed wrappers call main()
    sys.exit(main())
