"""The ARC CE backend: pilots to ARC CEs over A-REX's REST interface (``interface: rest``,
the default: :mod:`.rest`) or with the ARC client (``interface: cli``): ``arcsub -T arcrest`` to
submit, one bulk ``arcstat`` per CE to track, ``arckill`` to cancel, ``arcclean`` to clean
finished pilots off the CE. Everything else in the section means the same in both.

The rest of this docstring is the CLI path's. Each configured CE (URL, optionally with a queue) is an endpoint. The client keeps its memory
in a job list; gridgate gives every endpoint its own job list and client config under the state
folder (``-j``, ``-z``: never ``~/.arc``), since arcstat groups a list's jobs by host and two CEs
on one host would lose jobs in a shared list. It is written only against gridgate's public
plugin API (docs/plugins.md), as the Slurm backend is. The client's exit codes say little
(arcstat exits 0 when no job returned information; arcsub exits 0 for a job it could not
record), so every answer is read from the text (:mod:`.parse`); failures are read from the
client's messages (:mod:`.classify`).

The proxy comes from the director's managed credential (``credentials.x509_proxy``) when one
is configured: the backend says it needs an ``x509`` credential (``token`` with ``auth:
token``, REST only), so the director submits nothing here while that credential is expired or
missing, and no CE is blamed for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.backend import (
    Backend,
    Deadline,
    command_timeout_schema,
    commands_schema,
    env_schema,
)
from gridgate.core.files import atomic_write, ensure_private_dir
from gridgate.core.kinds import failure
from gridgate.core.model import (
    TERMINAL_STATES,
    BackendInfo,
    CancelResult,
    CommandResult,
    Endpoint,
    Failure,
    IterationInfo,
    IterationSummary,
    JobStatus,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import PluginContext
from gridgate.core.runner import argv_chunks
from gridgate.plugins.arc.classify import classify, classify_rest, clip, proxy_problem, vague
from gridgate.plugins.arc.parse import (
    ATTRIBUTE_RE,
    GMLOG,
    JOB_ID_RE,
    STDERR,
    STDOUT,
    cleaned_counts,
    killed_counts,
    not_in_list,
    parse_arcstat,
    submitted_ids,
    with_stderr,
    xrsl,
)
from gridgate.plugins.arc.rest.interface import SCRIPT_WHAT, RestPath
from gridgate.plugins.arc.stamps import add_stamps, read_stamps, write_stamps

OPERATION_SUBMIT = "Job Submit"
#: ``argv[:1]`` of a REST exchange's evidence (rest/client.py): the HTTP method.
HTTP_METHODS = frozenset({("GET",), ("POST",), ("PUT",), ("DELETE",), ("HEAD",)})
URL_RE = re.compile(r"https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%/-]*)?")
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
QUEUE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: xRSL attributes the backend writes itself (xRSL names are case-insensitive).
OWNED_ATTRIBUTES: dict[str, str] = {
    "executable": "the pilot is the script key",
    "inputfiles": "the backend uploads the pilot script",
    "jobname": "job_name names the job",
    "stdout": "the backend names the pilot's output files",
    "stderr": "the backend names the pilot's output files",
    "gmlog": "the backend names the pilot's output files",
    "queue": "the queue comes from the endpoint's queue",
    "join": "the backend names the pilot's output files (join would fold stderr into stdout)",
    "count": "resources.cores is written as count",
    "countpernode": "resources.cores is written as count and countpernode (one node)",
    "memory": "resources.memory_mb is written as memory (per core)",
    "walltime": "resources.walltime is written as walltime",
}
#: Seconds a final pilot that arcclean would not delete is tried again (a cancelled job is
#: deleted once the CE has killed it, ~30 s on fork).
CLEAN_GIVE_UP = 86400.0
COMMANDS = (
    ("arcsub", "submit"),
    ("arcstat", "status"),
    ("arckill", "cancel"),
    ("arcclean", "clean"),
    ("arcget", "output retrieval"),
)


@dataclass(frozen=True)
class CE:
    """One configured endpoint: the CE's URL, the queue (empty: the CE's default) and where
    its client files live."""

    endpoint: Endpoint
    queue: str
    folder: Path

    @property
    def client_conf(self) -> Path:
        return self.folder / "client.conf"

    @property
    def job_list(self) -> Path:
        return self.folder / "jobs.dat"

    @property
    def pending_clean(self) -> Path:
        return self.folder / "clean-pending.json"


def endpoint_entry(entry: str | Mapping[str, Any]) -> tuple[str, str, str]:
    """(url, queue, name) of one ``endpoints`` item: a URL, or ``{url, queue, name}``. The
    default name is the CE's host, with its port when that is not 443, and ``-queue``."""
    if isinstance(entry, str):
        url, queue, name = entry, "", ""
    else:
        url, queue, name = (
            str(entry.get("url", "")),
            str(entry.get("queue") or ""),
            str(entry.get("name") or ""),
        )
    if not name:
        parts = urlsplit(url)
        host = parts.hostname or url
        try:
            port = parts.port
        except ValueError:
            port = None
        name = host if port in (None, 443) else f"{host}:{port}"
        if queue:
            name = f"{name}-{queue}"
    return url, queue, name


def resource_attributes(request: SubmitRequest) -> list[tuple[str, Any]]:
    """The xRSL of ``request.resources``: ``count`` and ``countpernode`` (all cores on one
    node, as a pilot runs), ``memory`` in MB **per core** (xRSL's meaning: the whole pilot's
    memory divided by its cores, rounded up) and ``walltime`` in seconds with xRSL's unit
    (``3601 seconds``, exact: no rounding); none for what is not asked."""
    resources = request.resources
    if resources is None:
        return []
    attributes: list[tuple[str, Any]] = []
    if resources.cores != 1:
        attributes += [("count", str(resources.cores)), ("countpernode", str(resources.cores))]
    if resources.memory_mb is not None:
        attributes.append(("memory", str(math.ceil(resources.memory_mb / resources.cores))))
    if resources.walltime is not None:
        attributes.append(("walltime", f"{resources.walltime} seconds"))
    return attributes


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def owned_attribute(name: str) -> str | None:
    """The owned attribute ``name`` is a spelling of, if any: xRSL names are compared without
    case, and RSL parsers drop underscores from them (``job_name`` is ``jobname``); refusing
    such a spelling costs nothing where a parser keeps it, as it is then no attribute at all."""
    lowered = name.lower().replace("_", "")
    return lowered if lowered in OWNED_ATTRIBUTES else None


class ArcBackend(Backend):
    """Submits pilots to ARC CEs over A-REX's REST interface or with the ARC client; polls,
    cancels and cleans them."""

    name = "arc"
    endpoints_key = "endpoints"
    credentials = ("x509",)
    expresses = ("cores", "memory_mb", "walltime")

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "description": "ARC CE backend: CEs (one endpoint each, optionally a queue), the pilot "
        "script, extra xRSL; over A-REX's REST interface or the ARC client.",
        "properties": {
            "interface": {
                "enum": ["rest", "cli"],
                "default": "rest",
                "description": "How the CEs are reached: `rest`, A-REX's REST interface "
                "directly (one delegation per CE, bulk calls; docs/arc.md), or `cli`, the ARC "
                "client (arcsub, arcstat, arckill, arcclean, arcget: `commands`) for a CE "
                "without REST.",
            },
            "auth": {
                "enum": ["x509", "token"],
                "default": "x509",
                "description": "What the REST calls authenticate with: `x509`, the proxy "
                "(credentials.x509_proxy, else X509_USER_PROXY) as client certificate, and "
                "one delegation of it per CE for the pilots; `token`, a WLCG bearer token "
                "(credentials.bearer_token, else the WLCG discovery order) as "
                "`Authorization: Bearer`, no client certificate and no delegation. "
                "`token` needs `interface: rest`.",
            },
            "endpoints": {
                "type": "array",
                "default": [],
                "description": "CEs to submit to; each is an endpoint. A URL "
                "(`https://ce.example.org:443/arex`), or {url, queue, name}: "
                "`queue` submits to that queue (xRSL `queue`), `name` is how "
                "gridgate shows it (default: the host, `:port` when not 443, "
                "`-queue`).",
                "items": {
                    "oneOf": [
                        {"type": "string", "minLength": 1},
                        {
                            "type": "object",
                            "required": ["url"],
                            "additionalProperties": False,
                            "properties": {
                                "url": {"type": "string", "minLength": 1},
                                "queue": {"type": "string", "minLength": 1},
                                "name": {"type": "string", "minLength": 1},
                            },
                        },
                    ]
                },
            },
            "script": {
                "type": "string",
                "x-gridgate-path": True,
                "default": "",
                "description": "The pilot, sent as the job's executable (uploaded "
                "with it; a path on this machine, relative to the "
                "config file's folder).",
            },
            "job_name": {
                "type": "string",
                "minLength": 1,
                "default": "gridgate-pilot",
                "description": "xRSL jobname.",
            },
            "xrsl": {
                "type": "object",
                "default": {},
                "additionalProperties": {
                    "oneOf": [
                        {"type": ["string", "number"]},
                        {"type": "array", "items": {"type": ["string", "number"]}, "minItems": 1},
                    ]
                },
                "description": "More xRSL attributes, name: value (a list for multi-valued "
                'ones), e.g. {cputime: "2 hours", runtimeenvironment: '
                "[ENV/PROXY]}. Attributes the backend writes itself "
                "(executable, inputfiles, jobname, stdout, stderr, gmlog, "
                "queue; count, countpernode, memory and walltime from a demand "
                "group's resources) are refused.",
            },
            "pilots_per_submission": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "default": 1,
                "description": "Pilots per submission: > 1 sends that many job "
                "descriptions in one REST POST (one delegation for all), or in one arcsub "
                "call with `interface: cli` (which still delegates once per job: it saves "
                "only process starts).",
            },
            "keep_on_ce": {
                "type": "boolean",
                "default": False,
                "description": "Leave finished pilots on the CE. By default a pilot "
                "recorded done, failed or cancelled is removed with "
                "arcclean at the end of the iteration (CEs' session "
                "folders fill up with jobs nobody cleans).",
            },
            "stderr_samples": {
                "type": "integer",
                "minimum": 0,
                "maximum": 50,
                "default": 3,
                "description": "Failed pilots per poll whose stderr is fetched "
                "(from the job's session over REST, with arcget -k over the client; it feeds "
                "the reasons the `aborted` notification quotes); 0 fetches none.",
            },
            "stderr_bytes": {
                "type": "integer",
                "minimum": 0,
                "maximum": 65536,
                "default": 1000,
                "description": "Bytes of a failed pilot's stderr kept (its end).",
            },
            "commands": commands_schema(
                "Names (looked up on PATH) or paths of the ARC client commands (`interface: cli`).",
                COMMANDS,
            ),
            "command_timeout": command_timeout_schema(
                "Seconds; replaces the director's limit for "
                "these commands (or for each hook call's REST calls together) when set "
                "(one arcsub takes 0.5-5 s on a healthy CE, a REST submission of 10 "
                "pilots well under 1 s)."
            ),
            "env": env_schema(
                "Extra environment variables for the commands and the REST calls (e.g. "
                "X509_CERT_DIR, the CA folder both verify the CE against). X509_USER_PROXY "
                "comes from credentials.x509_proxy when that is configured."
            ),
        },
        "additionalProperties": False,
    }

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        names: set[str] = set()
        lists: set[tuple[str, str]] = set()
        for index, entry in enumerate(section.get("endpoints") or []):
            url, queue, name = endpoint_entry(entry)
            where: tuple[str | int, ...] = (
                ("endpoints", index) if isinstance(entry, str) else ("endpoints", index, "url")
            )
            if not URL_RE.fullmatch(url):
                problems.append((where, f"{url!r} is not an ARC CE URL (https://host[:port]/path)"))
                continue
            if queue and not QUEUE_RE.fullmatch(queue):
                problems.append((("endpoints", index, "queue"), f"{queue!r} is not a queue name"))
            if not NAME_RE.fullmatch(name):
                problems.append((("endpoints", index, "name"), f"{name!r} is not an endpoint name"))
            elif name in names:
                problems.append(
                    (
                        ("endpoints", index),
                        f"endpoint name {name!r} is used twice (give one of them a name)",
                    )
                )
            elif (url, queue) in lists:
                problems.append(
                    (("endpoints", index), f"{url} {queue or '(default queue)'} is listed twice")
                )
            names.add(name)
            lists.add((url, queue))
        if section.get("auth") == "token" and section.get("interface") == "cli":
            problems.append(
                (
                    ("auth",),
                    "auth: token needs interface: rest (the ARC client of this backend "
                    "authenticates with the proxy only)",
                )
            )
        if section.get("endpoints") and not section.get("script"):
            problems.append((("script",), "a pilot script is needed to submit to the CEs"))
        for name in section.get("xrsl") or {}:
            if not ATTRIBUTE_RE.fullmatch(name):
                problems.append((("xrsl", name), f"{name!r} is not an xRSL attribute name"))
            elif owned_attribute(name):
                why = OWNED_ATTRIBUTES[owned_attribute(name) or ""]
                problems.append((("xrsl", name), f"{name} is written by the backend ({why})"))
        return problems

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._programs = {k: str(v) for k, v in (config.get("commands") or {}).items() if v}
        root = Path(context.state_dir) / "arc"
        self._ces: dict[str, CE] = {}
        for entry in config.get("endpoints") or []:
            url, queue, name = endpoint_entry(entry)
            self._ces[name] = CE(Endpoint(self.name, name, url), queue, root / _safe(name))
        self._locks = {name: threading.Lock() for name in self._ces}
        #: endpoints no longer configured whose pilots are still here (see _ce)
        self._retired: dict[str, CE] = {}
        self._retired_lock = threading.Lock()
        self._prepared: set[str] = set()
        #: the REST path (``interface: rest``), None for the ARC client's; the delegations
        #: left by an earlier REST configuration are deleted through it in either case
        self._sweeper = RestPath(self)
        self.rest = self._sweeper if self.interface == "rest" else None

    @property
    def interface(self) -> str:
        return str(self.config.get("interface") or "rest")

    def backend_info(self) -> BackendInfo:
        info = super().backend_info()
        if self.config.get("auth") == "token":
            return dataclasses.replace(info, credentials=("token",))
        return info

    def environment(self) -> dict[str, str]:
        """The director's environment with the section's ``env`` and the managed credential's
        variables (the proxy's, or with ``auth: token`` the token's), always a mapping
        (:func:`proxy_problem` reads it)."""
        env = super().environment() or dict(os.environ)
        if self.config.get("auth") == "token":
            env.update(self.context.credential_env("token"))
        return env

    def lock(self, ce: CE) -> threading.Lock:
        """The lock of ``ce``'s files (pilots to clean, pilots to look for)."""
        with self._retired_lock:
            return self._locks.setdefault(ce.endpoint.name, threading.Lock())

    # --- helpers ----------------------------------------------------------------------------

    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(ce.endpoint for ce in self._ces.values())

    def _ce(self, endpoint: Endpoint) -> CE | None:
        """The endpoint's CE; for an endpoint removed from the config whose job list (CLI) or
        REST marker (``rest.json``: its URL) is still here, a CE without URL: its pilots can
        still be polled, cancelled and cleaned (their ids are URLs, so the client needs no
        -C). None for an endpoint of neither kind (the base class calls this backend for its
        own endpoints only)."""
        ce = self._ces.get(endpoint.name)
        if ce is None:
            folder = Path(self.context.state_dir) / "arc" / _safe(endpoint.name)
            if (folder / "jobs.dat").exists() or (folder / "rest.json").exists():
                ce = CE(endpoint, "", folder)
                with self._retired_lock:
                    self._retired.setdefault(endpoint.name, ce)
                    self._locks.setdefault(endpoint.name, threading.Lock())
                    ce = self._retired[endpoint.name]
        return ce

    def _command(self, which: str) -> str:
        return self._programs.get(which) or which

    def script_path(self) -> Path:
        """The pilot script's absolute path (a relative ``script`` is the config file's
        folder's)."""
        script = Path(str(self.config.get("script") or ""))
        if not script.is_absolute() and self.context.config_path is not None:
            script = Path(self.context.config_path).parent / script
        # absolute: arcsub runs in the endpoint's folder, where a relative path means nothing
        return Path(os.path.abspath(script))

    def _prepare(self, ce: CE) -> str:
        """Make the CE's private folder and empty client config; the OS error when it cannot."""
        if ce.endpoint.name in self._prepared and ce.client_conf.exists():
            return ""
        try:
            ensure_private_dir(ce.folder)
            if not ce.client_conf.exists():
                # an empty client config: -z keeps the client from creating ~/.arc/client.conf
                atomic_write(ce.client_conf, b"", durable=False)
        except OSError as exc:
            return f"cannot prepare {ce.folder}: {exc}"
        self._prepared.add(ce.endpoint.name)
        return ""

    def _client(self, which: str, ce: CE) -> list[str]:
        return [self._command(which), "-z", str(ce.client_conf), "-j", str(ce.job_list)]

    def description(
        self, ce: CE, request: SubmitRequest, *, name: str = "", delegation: str = ""
    ) -> str:
        """The xRSL of one pilot: for arcsub, which uploads the script from its path; with a
        ``name`` (REST), for a job whose script is uploaded into its session afterwards,
        named ``name``, naming the ``delegation``, and whose output files are declared (A-REX
        keeps only declared outputs: arcsub declares them itself)."""
        script = self.script_path()
        site = {str(k): v for k, v in (self.config.get("xrsl") or {}).items()}
        attributes: list[tuple[str, Any]] = [("executable", script.name)]
        if name:
            outputs: list[list[Any]] = [[STDOUT, ""], [STDERR, ""], [f"{GMLOG}/", ""]]
            for key in [k for k in site if k.lower().replace("_", "") == "outputfiles"]:
                value = site.pop(key)
                outputs.insert(0, list(value) if isinstance(value, list) else [value, ""])
            attributes += [("inputfiles", [[script.name, ""]]), ("outputfiles", outputs)]
        else:
            attributes.append(("inputfiles", [[script.name, str(script)]]))
        attributes += [
            ("jobname", name or str(self.config.get("job_name") or "gridgate-pilot")),
            ("stdout", STDOUT),
            ("stderr", STDERR),
            ("gmlog", GMLOG),
        ]
        if ce.queue:
            attributes.append(("queue", ce.queue))
        attributes += resource_attributes(request)
        attributes += list(site.items())
        if delegation:
            attributes.append(("delegationid", delegation))
        return xrsl(attributes)

    def arcsub_argv(self, ce: CE, files: Sequence[Path], *, verbose: bool = False) -> list[str]:
        return [
            *self._client("arcsub", ce),
            "-C",
            ce.endpoint.url,
            "-T",
            "arcrest",
            *(["-d", "VERBOSE"] if verbose else []),
            *(str(f) for f in files),
        ]

    # --- hooks ------------------------------------------------------------------------------

    def submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        ce = self._ce(endpoint)
        if ce is None:
            return None
        if self.rest is not None:
            return self.rest.submit(ce, request, timeout)
        problem = self._prepare(ce)
        files: list[Path] = []
        if not problem:
            try:
                for _pilot in range(request.count):
                    path = ce.folder / f"pilot-{uuid.uuid4().hex}.xrsl"
                    atomic_write(path, self.description(ce, request).encode(), durable=False)
                    files.append(path)
            except OSError as exc:
                problem = f"cannot write a job description in {ce.folder}: {exc}"
        if problem:
            self._remove(files)
            return SubmitResult(
                endpoint, ok=False, operation=OPERATION_SUBMIT, local_fault=problem, message=problem
            )
        deadline = self.deadline(timeout)
        try:
            outcome = self.run(self.arcsub_argv(ce, files), deadline, cwd=ce.folder)
            if vague(outcome) and not deadline.passed():
                # arcsub prints the same one ERROR line for an untrusted CA, an unknown DN, a
                # queue not offered and a wrong path (nothing was submitted); its VERBOSE lines
                # tell them apart, so the call is made once more with them (classify.py)
                outcome = self.run(
                    self.arcsub_argv(ce, files, verbose=True), deadline, cwd=ce.folder
                )
        finally:
            self._remove(files)
        ids = [i for i in submitted_ids(outcome.stdout) if JOB_ID_RE.match(i)]
        if ids:
            if len(ids) < request.count:
                logger.warning(
                    "{}: arcsub submitted {} of {} pilots: {}",
                    endpoint.key,
                    len(ids),
                    request.count,
                    clip(outcome.stderr.strip().splitlines()[-1] if outcome.stderr.strip() else ""),
                )
            if (
                "Job list file cannot be created" in outcome.stderr
                or "Unable to open job list file" in outcome.stderr
            ):
                logger.error(
                    "{}: arcsub could not record its jobs in {}; they are tracked by id only",
                    endpoint.key,
                    ce.job_list,
                )
            return SubmitResult(
                endpoint, ok=True, job_ids=tuple(ids), command=outcome, operation=OPERATION_SUBMIT
            )
        return SubmitResult(
            endpoint,
            ok=False,
            command=outcome,
            operation=OPERATION_SUBMIT,
            message=outcome.describe()
            if not outcome.ok
            else "arcsub exited 0 but printed no 'Job submitted with jobid:' line",
        )

    @staticmethod
    def _remove(files: Sequence[Path]) -> None:
        for path in files:
            with contextlib.suppress(FileNotFoundError):  # already gone is what we want
                path.unlink()

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure | None:
        if self._ce(endpoint) is None:
            return None
        if result.local_fault.startswith(SCRIPT_WHAT):
            return failure("missing_input", result.local_fault)
        if result.local_fault:
            return None  # core's default says local_io for a file this machine could not write
        over_rest = (result.command is None if self.rest is not None else False) or (
            result.command is not None and result.command.argv[:1] in HTTP_METHODS
        )
        if over_rest:
            return classify_rest(result.command, result.message)
        return classify(result.command, result.message)

    def job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        ce = self._ce(endpoint)
        if ce is None:
            return None
        ids, bad = _checked_ids(job_ids)
        if bad:
            return StatusResult(endpoint, ok=False, commands=0, message=bad)
        if not ids:
            return StatusResult(endpoint, ok=True, commands=0)
        if self.rest is not None:
            return self.rest.job_status(ce, ids, timeout)
        if not ce.job_list.exists():
            # the client's only memory of these jobs is gone: it would ask the CE about none
            logger.error(
                "{}: job list {} is missing; its {} pilot(s) are unknown to the client",
                endpoint.key,
                ce.job_list,
                len(ids),
            )
            return StatusResult(
                endpoint, ok=True, commands=0, message=f"job list {ce.job_list} is missing"
            )
        deadline = self.deadline(timeout)
        prefix = self._client("arcstat", ce)
        chunks = argv_chunks(prefix, ids)
        statuses: dict[str, JobStatus] = {}
        failed: dict[str, str] = {}
        last: CommandResult | None = None
        for argv in chunks:
            outcome = self.run(argv, deadline)
            last = outcome
            if outcome.stdout_truncated or outcome.stderr_truncated:
                # gridgate's own cap cut the answer: core names it (kind output_cap) and keeps
                # every pilot's state, rather than this chunk's ids going unknown, then lost
                return StatusResult(
                    endpoint,
                    ok=False,
                    command=outcome,
                    commands=len(chunks),
                    message="arcstat's output passed director.max_output_bytes",
                )
            report = parse_arcstat(outcome.stdout, outcome.stderr)
            asked = argv[len(prefix) :]
            answered = bool(report.statuses) or bool(report.gone)
            # arcstat exits 0 when no job returned information (CE down, proxy refused): with
            # pilots asked and none answered nor known gone, the poll failed
            if outcome.timed_out or outcome.launch_error or not answered:
                none_in_list = (
                    outcome.returncode == 1 and "No jobs found" in outcome.stdout + outcome.stderr
                )
                if none_in_list and set(not_in_list(outcome.stdout + outcome.stderr)) >= set(asked):
                    continue  # none of them is in the job list: all unknown, an answer
                # arcstat says nothing of an expired proxy ("wrong response: <garbage>"): so
                # that no CE is blamed for our proxy, the file is read here (classify.py)
                problem = proxy_problem(self.environment(), self.context.clock.time())
                return StatusResult(
                    endpoint,
                    ok=False,
                    command=outcome,
                    commands=len(chunks),
                    message=problem or self._status_problem(outcome, report.failed),
                )
            statuses.update(report.statuses)
            failed.update(report.failed)
        for job_id, why in failed.items():  # the CE answered for others but not for these
            statuses.setdefault(job_id, JobStatus(job_id=job_id, state="unknown", reason=clip(why)))
        statuses = {k: v for k, v in statuses.items() if k in set(ids)}
        self._sample_stderr(ce, statuses, deadline)
        self.note_terminal(ce, [k for k, v in statuses.items() if v.state in TERMINAL_STATES])
        return StatusResult(
            endpoint, ok=True, statuses=statuses, command=last, commands=len(chunks)
        )

    @staticmethod
    def _status_problem(outcome: CommandResult, failed: Mapping[str, str]) -> str:
        if not outcome.ok and (outcome.timed_out or outcome.launch_error):
            return outcome.describe()
        why = next(iter(failed.values()), "")
        return clip(f"arcstat: no job returned information{f' ({why})' if why else ''}")

    def _sample_stderr(self, ce: CE, statuses: dict[str, JobStatus], deadline: Deadline) -> None:
        """Add the end of a few failed pilots' stderr (arcget -k: kept on the CE) to their reason."""
        samples = int(self.config.get("stderr_samples", 3))
        keep = int(self.config.get("stderr_bytes", 1000))
        failed = [s for s in statuses.values() if s.state == "failed"][:samples]
        if not failed or keep <= 0:
            return
        try:
            download = Path(tempfile.mkdtemp(prefix="arcget-", dir=ce.folder))
        except OSError as exc:
            logger.warning("{}: no folder for arcget: {}", ce.endpoint.key, exc)
            return
        try:
            argv = [
                *self._client("arcget", ce),
                "-k",
                "-D",
                str(download),
                *(s.job_id for s in failed),
            ]
            outcome = self.run(argv, deadline)
            if not outcome.ok:
                logger.info(
                    "{}: arcget of failed pilots' stderr: {}", ce.endpoint.key, outcome.describe()
                )
            for status in failed:
                tail = _tail(download / status.job_id.rsplit("/", 1)[-1] / STDERR, keep)
                if tail:
                    statuses[status.job_id] = with_stderr(status, tail)
        finally:
            shutil.rmtree(download, ignore_errors=True)

    # --- cleaning ---------------------------------------------------------------------------

    def note_terminal(self, ce: CE, job_ids: Sequence[str]) -> None:
        """Remember pilots seen in a final state; they are cleaned once recorded (at the end of
        the iteration), so a crash before the registry wrote them loses no state."""
        if not job_ids or self.config.get("keep_on_ce"):
            return
        with self._locks[ce.endpoint.name]:
            add_stamps(ce.pending_clean, job_ids, self.context.clock.time(), "pilots to clean")

    @staticmethod
    def _pending(ce: CE) -> dict[str, float]:
        """Pilot id -> when it was first noted for cleaning."""
        return read_stamps(ce.pending_clean, JOB_ID_RE)

    @staticmethod
    def _write_pending(ce: CE, pending: Mapping[str, float]) -> None:
        write_stamps(ce.pending_clean, pending, "pilots to clean")

    def clean(self, ce: CE, timeout: float) -> list[str]:
        """Clean the pilots recorded final off the CE; returns those removed (or already gone).

        arcclean deletes only jobs the CE has finished: a pilot cancelled a moment ago is still
        being killed there (``Jobs processed: 1, deleted: 0``), so it stays to be cleaned at a
        later iteration, for at most ``CLEAN_GIVE_UP`` seconds. Over REST, a pilot is done
        when the CE answers that it no longer has it (404): a queued clean is asked again."""
        with self._locks[ce.endpoint.name]:
            pending = self._pending(ce)
            if not pending:
                return []
            if self.rest is not None:
                done, problem = self.rest.clean(ce, list(pending), timeout)
                if problem:
                    logger.info(
                        "{}: cleaning failed ({}); {} pilot(s) stay to clean",
                        ce.endpoint.key,
                        clip(problem),
                        len(pending),
                    )
            else:
                done = self._arcclean(ce, list(pending), self.deadline(timeout))
            now = self.context.clock.time()
            left = {i: t for i, t in pending.items() if i not in set(done)}
            stale = [i for i, t in left.items() if now - t > CLEAN_GIVE_UP]
            if stale:
                logger.warning(
                    "{}: {} pilot(s) could not be cleaned off the CE for {:.0f} h; given up: {}",
                    ce.endpoint.key,
                    len(stale),
                    CLEAN_GIVE_UP / 3600,
                    " ".join(stale[:5]),
                )
            self._write_pending(ce, {i: t for i, t in left.items() if i not in set(stale)})
            return done

    def _arcclean(self, ce: CE, pending: Sequence[str], deadline: Deadline) -> list[str]:
        prefix = self._client("arcclean", ce)
        done: list[str] = []
        for argv in argv_chunks(prefix, list(pending)):
            outcome = self.run(argv, deadline)
            asked = argv[len(prefix) :]
            gone = set(not_in_list(outcome.stdout + outcome.stderr))
            counts = cleaned_counts(outcome.stdout)
            done += [i for i in asked if i in gone]  # cleaned earlier, or by someone else
            if outcome.ok and counts is not None and counts[1] >= len(asked) - len(gone):
                done += [i for i in asked if i not in gone]
                continue
            # some were not deleted (not finished there yet) or the call failed: those
            # deleted now are "not in the job list" at the next call, the rest are tried again
            if not outcome.ok and not gone:
                logger.info(
                    "{}: arcclean failed ({}); {} pilot(s) stay to clean",
                    ce.endpoint.key,
                    outcome.describe(),
                    len(asked),
                )
                break
        return done

    def _timeout(self) -> float:
        return float(
            self.config.get("command_timeout")
            or (self.context.config.get("director") or {}).get("command_timeout")
            or 120
        )

    @hookimpl
    def gridgate_iteration_started(self, iteration: IterationInfo) -> None:
        self._sweeper.delegations.new_iteration()

    @hookimpl
    def gridgate_iteration_finished(self, summary: IterationSummary) -> None:
        timeout = self._timeout()
        if not self.config.get("keep_on_ce"):
            for ce in [*self._ces.values(), *self._retired.values()]:
                if ce.pending_clean.exists():
                    cleaned = self.clean(ce, timeout)
                    if cleaned:
                        logger.debug(
                            "{}: cleaned {} finished pilot(s) off the CE",
                            ce.endpoint.key,
                            len(cleaned),
                        )
        if self.config.get("auth") != "token" and self._sweeper.delegations.records():
            # delegations of CEs no endpoint here reaches over REST any more (removed from the
            # config, or interface: cli now), once no director has used them for a while
            services = (
                [ce.endpoint.url.rstrip("/") for ce in self._ces.values()] if self.rest else []
            )
            self._sweeper.sweep(services, timeout)

    def close(self) -> None:
        """Close the REST path's kept-alive connections."""
        self._sweeper.close()

    # --- cancel -----------------------------------------------------------------------------

    def cancel(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> CancelResult | None:
        ce = self._ce(endpoint)
        if ce is None:
            return None
        ids, bad = _checked_ids(job_ids)
        if bad:
            return CancelResult(endpoint, ok=False, message=bad)
        if self.rest is not None:
            return self.rest.cancel(ce, ids, timeout) if ids else CancelResult(endpoint, ok=True)
        cancelled: list[str] = []
        left: list[str] = []
        last: CommandResult | None = None
        prefix = self._client("arckill", ce)
        deadline = self.deadline(timeout)
        for argv in argv_chunks(prefix, ids):
            outcome = self.run(argv, deadline)
            last = outcome
            asked = argv[len(prefix) :]
            gone = set(not_in_list(outcome.stdout + outcome.stderr))
            counts = killed_counts(outcome.stdout)
            if counts is None and len(gone) < len(asked):
                # "No jobs" with a connection error, a 404 or no answer: the CE did not take it
                return CancelResult(
                    endpoint,
                    ok=False,
                    cancelled=tuple(cancelled),
                    command=outcome,
                    message=outcome.describe() if not outcome.ok else "arckill printed no summary",
                )
            # arckill skips a job that has already finished and counts only those it killed
            # (``Jobs processed: 0`` for a finished one), naming none: when it killed fewer than
            # it was given, which ones it skipped is unknown, so none of this command's ids is
            # reported cancelled; their next poll says how each ended (Killed is cancelled)
            candidates = [i for i in asked if i not in gone]
            if counts is not None and counts[1] >= len(candidates):
                cancelled += candidates
            else:
                left += candidates
        # a cancelled pilot is final and never polled again: it is cleaned like one seen final
        # (arcclean takes it once the CE has killed it)
        self.note_terminal(ce, cancelled)
        return CancelResult(
            endpoint,
            ok=True,
            cancelled=tuple(cancelled),
            command=last,
            message=f"arckill skipped some of {len(left)} job(s) as already finished; their "
            "next poll says how each ended"
            if left
            else "",
        )


def _checked_ids(job_ids: Sequence[str]) -> tuple[list[str], str]:
    """The ids as text, and a complaint naming those that are no ARC job id ("" if none): an id
    reaches an argv, so only the form arcsub printed is passed on."""
    ids = [str(j) for j in job_ids]
    bad = [j for j in ids if not JOB_ID_RE.match(j)]
    return ids, f"not ARC job ids: {bad[:5]}" if bad else ""


def _tail(path: Path, size: int) -> str:
    """The last ``size`` bytes of a text file, on one line; "" when it is missing or empty."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            length = handle.tell()
            handle.seek(max(0, length - size))
            data = handle.read(size)
    except OSError:
        return ""
    return " ".join(data.decode("utf-8", "replace").split())
