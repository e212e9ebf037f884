"""The stand-in ``bsub``, ``bjobs`` and ``bkill``: real processes that print what LSF prints (formats.md)
and behave as the scenario file says; the program's identity is the basename of argv[0].

The scenario (JSON or YAML) is named by ``GRIDGATE_LSF_SCENARIO``::

    state_dir: /tmp/x/lsf          # job counter and job table (needed for bjobs to see jobs)
    master: /tmp/x/master.sock     # stand-in master daemon to contact (or GRIDGATE_LSF_MASTER)
    default_queue: normal
    max_processors: 64             # bsub -n above this: "Too many processors requested"
    job_stat: PEND                 # state bjobs shows for submitted jobs
    default: {behaviour: ok}
    queues:
      normal: {behaviour: ok, latency: 0.1, preamble: 1}
      broken: {behaviour: lim_down}
    bjobs: {behaviour: ok}

bsub behaviours: ``ok``, ``no_such_queue``, ``too_many_processors``, ``rusage_error``,
``bad_resreq``, ``non_lsf_host``, ``lim_down``, ``master_lim_down``, ``daemon_not_responding``
(prints the "still trying" line forever), ``hang``. ``preamble: N`` prints N lines of
``Cannot connect to LSF. Please wait ...`` first. bjobs knows ``ok``, ``lim_down``,
``daemon_not_responding`` and ``hang``. Queues with a ``pilots`` spec give their jobs a
lifecycle (PEND, RUN, DONE or EXIT, forgotten after ``clean_period``; see ``lifecycle.py``
beside this file); ``calls_log`` names a file that gets one JSON line per bjobs/bkill call.
Only the standard library is imported: a swarm of these
is started in tests, and they may run under an interpreter without gridgate (any Python >= 3.10).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

SCENARIO_ENV = "GRIDGATE_LSF_SCENARIO"
MASTER_ENV = "GRIDGATE_LSF_MASTER"
EXIT_FAIL = 255
LONG_HANG = 3600.0
PREAMBLE = "Cannot connect to LSF. Please wait ..."
NOT_RESPONDING = "batch system daemon not responding ... still trying"
BSUB_BEHAVIOURS = (
    "ok",
    "no_such_queue",
    "too_many_processors",
    "rusage_error",
    "bad_resreq",
    "non_lsf_host",
    "lim_down",
    "master_lim_down",
    "daemon_not_responding",
    "hang",
)
BJOBS_BEHAVIOURS = ("ok", "lim_down", "daemon_not_responding", "hang")
#: Failure lines of bsub, as formats.md quotes them.
#: bsub -W: ``[hour:]minute`` with an optional ``/host`` (the stand-in refuses anything else;
#: its refusal's wording is its own, not checked against a real bsub)
RUN_LIMIT_RE = re.compile(r"(?:[0-9]+:)?[0-9]+(?:/\S+)?")
BSUB_FAILURES = {
    "no_such_queue": "No such queue. Job not submitted.",
    "too_many_processors": "Too many processors requested. Job not submitted.",
    "rusage_error": "Error in rusage section. Job not submitted.",
    "bad_resreq": "Bad resource requirement syntax. Job not submitted.",
    "non_lsf_host": "Request from non-LSF host rejected",
    "lim_down": "Failed in an LSF library call: LIM is down; try later. Job not submitted.",
    "master_lim_down": "Master LIM is down; try later",
}
#: The cluster the stand-in's job reports name.
CLUSTER = "gridgate-sim"
HEADER = ("JOBID", "USER", "STAT", "QUEUE", "FROM_HOST", "EXEC_HOST", "JOB_NAME", "SUBMIT_TIME")
WIDTHS = (8, 8, 6, 11, 12, 12, 11, 0)


class ScenarioError(ValueError):
    """The scenario cannot be read or names an unknown behaviour."""


def load_scenario(path: str | None) -> dict[str, Any]:
    """Read the scenario; no path means every call succeeds."""
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError:
        import yaml  # only for hand-written scenarios; tests write JSON

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ScenarioError(f"cannot parse scenario {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {path}: top level must be a mapping")
    for where, spec in [
        ("default", data.get("default") or {}),
        *((f"queues.{q}", s) for q, s in (data.get("queues") or {}).items()),
    ]:
        if spec.get("behaviour", "ok") not in BSUB_BEHAVIOURS:
            raise ScenarioError(f"scenario {where}: unknown bsub behaviour {spec['behaviour']!r}")
    bjobs = (data.get("bjobs") or {}).get("behaviour", "ok")
    if bjobs not in BJOBS_BEHAVIOURS:
        raise ScenarioError(f"scenario bjobs: unknown behaviour {bjobs!r}")
    for where, spec in [
        ("default", data.get("default") or {}),
        *((f"queues.{q}", s) for q, s in (data.get("queues") or {}).items()),
    ]:
        problem = _lifecycle().check(spec.get("pilots"), where)
        if problem:
            raise ScenarioError(problem)
    return data


_BY_PATH: dict[str, Any] = {}


def _by_path(name: str, path: Path) -> Any:
    """A standard-library-only module of gridgate, loaded by path like this one (the stand-in
    runs as users who cannot import gridgate from its venv); once per process."""
    if name not in _BY_PATH:
        import importlib.util

        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        _BY_PATH[name] = module
    return _BY_PATH[name]


def _lifecycle() -> Any:
    """The lifecycle module beside this file."""
    return _by_path("gridgate_lsf_lifecycle", Path(__file__).with_name("lifecycle.py"))


def _now(scenario: dict[str, Any]) -> float:
    """The stand-ins' time: :func:`gridgate.core.clock.file_time` of the scenario's
    ``clock_file`` (``core/clock.py`` is three folders up, in the source tree and installed)."""
    clock = _by_path("gridgate_core_clock", Path(__file__).parents[3] / "core" / "clock.py")
    return clock.file_time(scenario.get("clock_file"))


#: ``NAME[1-N]`` (or ``NAME[a-b]``) given to ``bsub -J``: a job array of elements a..b
ARRAY_RE = re.compile(r"(.*)\[([0-9]+)-([0-9]+)\]")


def _elements(job: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(id, job)`` of a job, or of each element of an array (``1234[k]``, named ``NAME[k]``,
    killed on its own or with the whole array), as LSF lists them."""
    if not job.get("array"):
        return [(str(job["id"]), job)]
    first, last = job["array"]
    killed = job.get("killed_elements") or {}
    return [
        (
            f"{job['id']}[{k}]",
            {
                **job,
                "index": k,
                "name": f"{job['name']}[{k}]",
                "killed": killed.get(str(k), job.get("killed")),
                **({"stat": "EXIT"} if str(k) in killed else {}),
            },
        )
        for k in range(first, last + 1)
    ]


def _living(jobs: dict[str, dict[str, Any]], scenario: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The jobs bjobs still knows by id (an array's elements by theirs, ``1234[k]``), each in
    its state of now (queues with ``pilots``)."""
    lifecycle = _lifecycle()
    at = _now(scenario)
    out = {}
    for job in jobs.values():
        for key, element in _elements(job):
            current = lifecycle.state(element, scenario, at)
            if current is not None:
                out[key] = current
    return out


def output_path(spec: str, job_id: str, cwd: str) -> str:
    """``bsub -o``/``-e`` ``spec`` for job ``job_id`` (``1234`` or an element ``1234[k]``):
    ``%J`` the job's id, ``%I`` the element's index (0 outside an array), relative to the
    submission folder ``cwd``, as LSF names the file."""
    base, _, index = job_id.partition("[")
    path = spec.replace("%J", base).replace("%I", index.rstrip("]") or "0")
    return path if path.startswith("/") else os.path.join(cwd, path)


def _write_outputs(living: dict[str, dict[str, Any]], state_dir: Path | None) -> None:
    """What LSF does when a job ends: its ``-o`` file (the job's report, then its output;
    its stderr too when no ``-e`` was given) and its ``-e`` file, written once (a mark in the
    state folder), the way the stand-in's jobs end: nothing runs, so the output is a line
    saying so. Not while the job pends or runs (mbatchd spools it until the end)."""
    if state_dir is None:
        return
    marks = state_dir / "outputs"
    for key, job in living.items():
        if job["stat"] not in ("DONE", "EXIT") or not job.get("output"):
            continue
        mark = marks / key
        if mark.exists():
            continue
        cwd = str(job.get("cwd") or "/")
        out = output_path(str(job["output"]), key, cwd)
        err = output_path(str(job["error"]), key, cwd) if job.get("error") else ""
        text = _report(key, job) + f"gridgate stand-in: job {key} ended {job['stat']}\n"
        if err:
            text += f"\n\nPS:\n\nRead file <{err}> for stderr output of this job.\n\n"
        else:
            text += f"gridgate stand-in: job {key} wrote nothing to stderr\n"
        try:
            for path, body in ((out, text), (err, f"stand-in stderr of job {key}\n")):
                if path:
                    with open(path, "a", encoding="utf-8") as f:  # LSF appends to a file there
                        f.write(body)
        except OSError as exc:  # LSF mails the output instead; the stand-in says so
            _out(sys.stderr, f"stand-in: cannot write the output of job {key}: {exc}")
        marks.mkdir(exist_ok=True)
        mark.touch()


def _report(key: str, job: dict[str, Any]) -> str:
    """The job report LSF puts at the head of a ``-o`` file (formats.md, LSF output file)."""
    host, user, queue = job["host"], job["user"], job["queue"]
    done = job["stat"] == "DONE"
    lines = [
        f"Sender: LSF System <lsfadmin@{host}>",
        f"Subject: Job {key}: <{job['name']}> in cluster <{CLUSTER}> "
        + ("Done" if done else "Exited"),
        "",
        f"Job <{job['name']}> was submitted from host <{host}> by user <{user}> in cluster "
        f"<{CLUSTER}>.",
        f"Job was executed on host(s) <{host}>, in queue <{queue}>, as user <{user}> in "
        f"cluster <{CLUSTER}>.",
        "------------------------------------------------------------",
        "# LSBATCH: User input",
        " ".join(job.get("command") or []),
        "------------------------------------------------------------",
        "",
        "Successfully completed."
        if done
        else f"Exited with exit code {job.get('exit_code', '-')}.",
        "",
        "The output (if any) follows:",
        "",
    ]
    return "\n".join(lines) + "\n"


def _matching(job_id: str, living: dict[str, dict[str, Any]]) -> list[str]:
    """The keys ``job_id`` names: itself, or every element of the array it is the id of."""
    if job_id in living:
        return [job_id]
    return [k for k in living if k.startswith(f"{job_id}[")]


def _log_call(
    scenario: dict[str, Any], command: str, ids: list[str], jobs: dict[str, dict[str, Any]]
) -> None:
    """One line per command in the scenario's ``calls_log``: which queues its ids are in."""
    path = scenario.get("calls_log")
    if not path:
        return
    queues = sorted({str(jobs[j]["queue"]) for j in ids if j in jobs})
    line = (
        json.dumps(
            {
                "time": time.time(),
                "pid": os.getpid(),
                "command": command,
                "queue": ",".join(queues),
                "ids": len(ids),
            }
        )
        + "\n"
    )
    fd = os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def bkill(args: list[str], scenario: dict[str, Any]) -> int:
    """``bkill <id>...``: terminate pending or running jobs (formats.md's lines, exit 255
    when any id could not be killed)."""
    ids = [a for a in args if not a.startswith("-")]
    if not ids:
        _out(sys.stderr, "bkill: no job id specified")
        return EXIT_FAIL
    if not _contact_master(scenario, "bkill"):
        _out(sys.stderr, "LSF daemon (LIM) not responding ... still trying")
        _out(sys.stderr, "Failed in an LSF library call: LIM is down; try later.")
        return EXIT_FAIL
    state_dir = Path(scenario["state_dir"]) if scenario.get("state_dir") else None
    recorded = {str(job["id"]): job for job in _read_jobs(state_dir)}
    living = _living(recorded, scenario)
    _write_outputs(living, state_dir)
    _log_call(scenario, "bkill", ids, recorded)
    status = 0
    at = _now(scenario)
    for job_id in ids:
        keys = _matching(job_id, living)
        live = [k for k in keys if living[k]["stat"] not in ("DONE", "EXIT")]
        if not keys:
            _out(sys.stderr, f"Job <{job_id}>: No matching job found")
            status = EXIT_FAIL
        elif not live:
            _out(sys.stderr, f"Job <{job_id}>: Job has already finished")
            status = EXIT_FAIL
        else:
            base = job_id.split("[")[0]
            job = recorded[base]
            if "[" in job_id:  # one element of an array
                killed = {**(job.get("killed_elements") or {}), job_id[len(base) + 1 : -1]: at}
                recorded[base] = {**job, "killed_elements": killed}
            else:
                recorded[base] = {**job, "killed": at, "stat": "EXIT"}
            _record_job(state_dir, recorded[base])
            _out(sys.stdout, f"Job <{job_id}> is being terminated")
    return status


def write_scenario(path: Path, scenario: dict[str, Any]) -> Path:
    """Write a scenario as JSON (readable by everyone: gated commands may run as other users)."""
    path = Path(path)
    path.write_text(json.dumps(scenario, indent=2), encoding="utf-8")
    path.chmod(0o644)
    return path


def _out(stream: Any, line: str) -> None:
    stream.write(line + "\n")
    stream.flush()


def _contact_master(scenario: dict[str, Any], command: str) -> bool:
    """One request to the master daemon, if there is one; False when it does not answer."""
    path = os.environ.get(MASTER_ENV) or scenario.get("master")
    if not path:
        return True
    try:
        return bool(call(str(path), {"op": "request", "command": command}).get("ok"))
    except (OSError, ValueError):
        return False


def call(path: str, message: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Send one message to a master daemon and return its answer.

    :raises OSError: the master does not answer.
    """
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(message).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        raise ConnectionError("the master closed the connection without answering")
    return json.loads(data)


def _hang_forever(line: str | None) -> int:
    while True:
        if line:
            _out(sys.stderr, line)
        time.sleep(1.0 if line else LONG_HANG)


def _locked(path: Path) -> Any:
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - closed by the caller
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _next_job_id(state_dir: Path | None) -> int:
    if state_dir is None:
        return os.getpid()
    state_dir.mkdir(parents=True, exist_ok=True)
    with _locked(state_dir / "counter") as handle:
        handle.seek(0)
        text = handle.read().strip()
        value = int(text) + 1 if text.isdigit() else 1001
        handle.seek(0)
        handle.truncate()
        handle.write(str(value))
    return value


def _record_job(state_dir: Path | None, job: dict[str, Any]) -> None:
    if state_dir is None:
        return
    with _locked(state_dir / "jobs.jsonl") as handle:
        handle.write(json.dumps(job) + "\n")


def _read_jobs(state_dir: Path | None) -> list[dict[str, Any]]:
    if state_dir is None:
        return []
    try:
        text = (state_dir / "jobs.jsonl").read_text(encoding="utf-8")
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def bsub(args: list[str], scenario: dict[str, Any]) -> int:
    options: dict[str, str] = {}
    #: every -R given: bsub takes several and merges them (a select, a span, a rusage)
    resreqs: list[str] = []
    command: list[str] = []
    takes_value = {"-q", "-J", "-o", "-e", "-R", "-n", "-W", "-M", "-P", "-G", "-u", "-app", "-m"}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in takes_value:
            if i + 1 >= len(args):
                _out(sys.stderr, f"bsub: option requires an argument -- {arg[1:]}")
                return EXIT_FAIL
            options[arg] = args[i + 1]
            if arg == "-R":
                resreqs.append(args[i + 1])
            i += 2
        elif arg.startswith("-") and not command:
            i += 1  # flags such as -K, -I, -B are accepted and ignored
        else:
            command = args[i:]
            break
    queue = options.get("-q") or scenario.get("default_queue", "normal")
    spec = {
        "behaviour": "ok",
        **(scenario.get("default") or {}),
        **((scenario.get("queues") or {}).get(queue) or {}),
    }
    for _ in range(int(spec.get("preamble", 0))):
        _out(sys.stdout, PREAMBLE)
        time.sleep(float(spec.get("preamble_delay", 0.0)))
    time.sleep(float(spec.get("latency", 0.0)))
    behaviour = spec["behaviour"]
    if behaviour == "hang":
        return _hang_forever(None)
    if behaviour == "daemon_not_responding":
        return _hang_forever(NOT_RESPONDING)
    if not _contact_master(scenario, "bsub"):
        _out(sys.stderr, NOT_RESPONDING)
        _out(sys.stderr, BSUB_FAILURES["lim_down"])
        return EXIT_FAIL
    if behaviour in BSUB_FAILURES:
        _out(sys.stderr, BSUB_FAILURES[behaviour])
        return EXIT_FAIL
    # checks a real mbatchd makes of the request itself
    known = scenario.get("known_queues")
    if known is not None and queue not in known:
        _out(sys.stderr, BSUB_FAILURES["no_such_queue"])
        return EXIT_FAIL
    if "-n" in options:
        if not options["-n"].isdigit() or int(options["-n"]) < 1:
            _out(sys.stderr, "Bad argument for option -n. Job not submitted.")
            return EXIT_FAIL
        if int(options["-n"]) > int(scenario.get("max_processors", 64)):
            _out(sys.stderr, BSUB_FAILURES["too_many_processors"])
            return EXIT_FAIL
    if "-W" in options and not RUN_LIMIT_RE.fullmatch(options["-W"]):
        _out(sys.stderr, f"{options['-W']}: Bad RUNLIMIT specification. Job not submitted.")
        return EXIT_FAIL
    for resreq in resreqs:
        if resreq and not _balanced(resreq):
            _out(sys.stderr, BSUB_FAILURES["bad_resreq"])
            return EXIT_FAIL
        if "rusage[" in resreq and "rusage[]" in resreq.replace(" ", ""):
            _out(sys.stderr, BSUB_FAILURES["rusage_error"])
            return EXIT_FAIL
    name = options.get("-J") or (command[0] if command else "NONAME")
    array = None
    whole = ARRAY_RE.fullmatch(name)
    if whole is not None:
        name, array = whole[1], [int(whole[2]), int(whole[3])]
        if not name or array[0] < 1 or array[1] < array[0]:
            _out(sys.stderr, f"{options['-J']}: Bad job array index list. Job not submitted.")
            return EXIT_FAIL
    state_dir = Path(scenario["state_dir"]) if scenario.get("state_dir") else None
    job_id = _next_job_id(state_dir)
    _record_job(
        state_dir,
        {
            "id": job_id,
            "user": _user(),
            "queue": queue,
            "name": name,
            "array": array,
            "stat": scenario.get("job_stat", "PEND"),
            "submitted": _now(scenario),
            "host": os.uname().nodename.split(".")[0],
            "command": command,
            # what the job asked of its slots, as bjobs -l would show it
            "processors": int(options.get("-n", "1")),
            "resreq": resreqs,
            "run_limit": options.get("-W", ""),
            # bsub copies the submission environment into the job, as sbatch does
            "env": dict(os.environ),
            # where the job's output goes when it ends (-o, -e; relative to the submission
            # folder), as mbatchd writes it
            "output": options.get("-o", ""),
            "error": options.get("-e", ""),
            "cwd": os.getcwd(),
        },
    )
    where = "queue" if "-q" in options else "default queue"
    _out(sys.stdout, f"Job <{job_id}> is submitted to {where} <{queue}>.")
    return 0


def _row(values: tuple[str, ...]) -> str:
    # -w cuts nothing: a value wider than its column pushes the next one, a blank between
    return "".join(
        (v.ljust(w) if len(v) < w else v + " ") if w else v
        for v, w in zip(values, WIDTHS, strict=True)
    ).rstrip()


def bjobs(args: list[str], scenario: dict[str, Any]) -> int:
    spec = {"behaviour": "ok", **(scenario.get("bjobs") or {})}
    time.sleep(float(spec.get("latency", 0.0)))
    if spec["behaviour"] == "hang":
        return _hang_forever(None)
    if spec["behaviour"] == "daemon_not_responding":
        return _hang_forever(NOT_RESPONDING)
    if spec["behaviour"] == "lim_down" or not _contact_master(scenario, "bjobs"):
        _out(sys.stderr, "LSF daemon (LIM) not responding ... still trying")
        _out(sys.stderr, "Failed in an LSF library call: LIM is down; try later.")
        return EXIT_FAIL
    noheader, fmt, ids, show_all, queue, user = False, "", [], False, "", ""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-noheader":
            noheader = True
        elif arg in ("-o", "-q", "-u"):
            if i + 1 >= len(args):
                _out(sys.stderr, f"bjobs: option requires an argument -- {arg[1:]}")
                return EXIT_FAIL
            value = args[i + 1]
            if arg == "-o":
                fmt = value
            elif arg == "-q":
                queue = value
            else:
                user = value
            i += 1
        elif arg in ("-a", "-aw", "-wa"):
            show_all = True
        elif not arg.startswith("-"):
            ids.append(arg)
        i += 1
    state_dir = Path(scenario["state_dir"]) if scenario.get("state_dir") else None
    recorded = {str(job["id"]): job for job in _read_jobs(state_dir)}
    _log_call(scenario, "bjobs", ids, recorded)
    jobs = _living(recorded, scenario)
    _write_outputs(jobs, state_dir)
    status = 0
    if ids:
        selected = []
        for job_id in ids:
            keys = _matching(job_id, jobs)
            if keys:
                selected += [jobs[k] for k in keys]
            else:
                _out(sys.stderr, f"Job <{job_id}> is not found")
                status = EXIT_FAIL
    else:
        selected = [
            j
            for j in jobs.values()
            if (show_all or j["stat"] not in ("DONE", "EXIT"))
            and (not queue or j["queue"] == queue)
            and (not user or user == "all" or j["user"] == user)
        ]
        if not selected:
            _out(sys.stderr, "No job found" if show_all else "No unfinished job found")
            return 0
    if fmt:
        fields, delimiter = _parse_format(fmt)
        for job in selected:
            _out(sys.stdout, delimiter.join(_field(job, f) for f in fields))
        return status
    if selected and not noheader:
        _out(sys.stdout, _row(HEADER))
    for job in selected:
        when = time.strftime("%b %d %H:%M", time.localtime(job["submitted"]))
        _out(
            sys.stdout,
            _row(
                (
                    str(job["id"]),
                    job["user"],
                    job["stat"],
                    job["queue"],
                    job["host"],
                    _field(job, "exec_host"),
                    job["name"],
                    when,
                )
            ),
        )
    return status


def _parse_format(fmt: str) -> tuple[list[str], str]:
    delimiter = " "
    fields = []
    for word in fmt.split():
        if word.startswith("delimiter="):
            delimiter = word[len("delimiter=") :].strip("'\"")
        else:
            fields.append(word.split(":")[0])
    return fields, delimiter


def _field(job: dict[str, Any], name: str) -> str:
    if name == "jobid":
        return str(job["id"])
    if name == "exec_host":
        ran = job.get("ran", job["stat"] not in ("PEND", "PSUSP", "WAIT"))
        return job["host"] if ran else "-"
    if name in ("exit_code", "exit_reason"):
        return str(job.get(name, "-"))
    if name in ("stat", "queue", "user", "name"):
        return str(job[name])
    if name == "job_name":
        return str(job["name"])
    return "-"


def main() -> int:
    program = os.path.basename(sys.argv[0])
    try:
        scenario = load_scenario(os.environ.get(SCENARIO_ENV))
    except ScenarioError as exc:
        _out(sys.stderr, f"{program} (stand-in): {exc}")
        return 2
    if program == "bsub":
        return bsub(sys.argv[1:], scenario)
    if program == "bjobs":
        return bjobs(sys.argv[1:], scenario)
    if program == "bkill":
        return bkill(sys.argv[1:], scenario)
    _out(sys.stderr, f"stand-in: unknown program {program!r} (bsub, bjobs, bkill)")
    return 2
