"""The gLite WMS backend: submits pilot JDLs and list-matches through the gLite command line.

Every call names its server explicitly (``--endpoint``), runs under a hard deadline through
the core runner, and turns whatever came back into a result value; nothing here raises on a
server's misbehaviour. The JDL goes into a private file under the state folder (or the
configured ``work_dir``) and never near a shell; a folder that cannot take it (missing,
read-only, full) is a fault of this machine, reported as such, not a bad request.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import msgspec
from loguru import logger

from gridgate.core.backend import Backend
from gridgate.core.defaults import local_io_failure
from gridgate.core.documents import decode_json
from gridgate.core.files import ensure_private_dir
from gridgate.core.model import (
    CancelResult,
    CommandResult,
    Endpoint,
    Failure,
    ListMatchResult,
    OutputStream,
    PilotOutput,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import ConfigProblems, PluginContext
from gridgate.plugins.wms_glite import output
from gridgate.plugins.wms_glite.classify import Rule, classify
from gridgate.plugins.wms_glite.jdl import (
    RESERVED,
    JdlError,
    build_jdl,
    check_expression,
    literal,
    quote,
)
from gridgate.plugins.wms_glite.parse import is_no_match, parse_ce_ids, parse_job_ids
from gridgate.plugins.wms_glite.settings import (
    GLITE_SCHEMA,
    GliteSettings,
    glite_settings,
)
from gridgate.plugins.wms_glite.status import (
    cancel_pilots,
    process_alive,
    query_pilots,
    sibling_commands,
)

__all__ = ["GliteBackend", "build_jdl", "endpoint_for", "DEFAULT_PORT", "DEFAULT_PATH"]

DEFAULT_PORT = 7443
DEFAULT_PATH = "/glite_wms_wmproxy_server"
#: the patterns below are used with fullmatch: ``$`` would also take a trailing newline
HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*")
DELEGATION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: JDL files are named ``gridgate-<pid>-<random>.jdl``: the pid says whose they are, so the
#: files of a director that was killed can be told from those of one that is running.
JDL_PREFIX = "gridgate-"
JDL_NAME_RE = re.compile(r"gridgate-(\d+)-[^/]*\.jdl")
OPERATION_SUBMIT = "Job Submit"
OPERATION_LIST_MATCH = "List Match"


def endpoint_for(backend: str, server: str) -> Endpoint:
    """The endpoint of a ``servers`` entry: a host name, or a full ``https://`` URL."""
    server = server.strip()
    if "://" in server:
        host = urlsplit(server).hostname or server
        return Endpoint(backend, host, server)
    return Endpoint(backend, server, f"https://{server}:{DEFAULT_PORT}{DEFAULT_PATH}")


def _server_problem(server: str) -> str | None:
    text = server.strip()  # blanks around the name are forgiven: the endpoint is stripped too
    if any(ord(char) < 32 or ord(char) == 127 for char in text):
        # urlsplit drops tabs and newlines before it parses, so "https://host\n:7443/..." looked
        # valid while the raw text, newline and all, became the endpoint's URL
        return f"{server!r} holds a control character"
    if "://" in text:
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 -- raises ValueError on a bad port
        except ValueError as exc:
            return f"{server!r} is not a valid URL: {exc}"
        if parts.scheme != "https":
            return f"{server!r}: the WMProxy endpoint must be an https:// URL"
        if not parts.hostname or not HOST_RE.fullmatch(parts.hostname):
            return f"{server!r}: no valid host name in the URL"
        return None
    if not HOST_RE.fullmatch(text):
        return f"{server!r} is neither a host name nor an https:// URL"
    return None


class _CachedMatch(msgspec.Struct):
    """A list-match answer as :meth:`GliteBackend._cache_set` stores it."""

    resources: tuple[str, ...]
    time: float = 0.0


class GliteBackend(Backend):
    """Submits to gLite WMS servers with ``glite-wms-job-submit``/``-list-match``."""

    name = "wms_glite"
    #: the config key that lists the endpoints: a section without any is a config error
    endpoints_key = "servers"
    pilots_key = "pilots_per_jdl"
    expresses = ("cores", "memory_mb", "walltime")

    config_schema: ClassVar[dict[str, Any]] = GLITE_SCHEMA
    settings_class = GliteSettings
    settings: GliteSettings

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> ConfigProblems:
        problems: ConfigProblems = list(super().config_errors(section))
        seen: dict[str, int] = {}
        for index, server in enumerate(section.get("servers") or []):
            problem = _server_problem(server)
            if problem:
                problems.append((("servers", index), problem))
                continue
            host = endpoint_for(cls.name, server).name.lower()
            if host in seen:
                problems.append(
                    (("servers", index), f"duplicate server {host!r} (also servers[{seen[host]}])")
                )
            seen.setdefault(host, index)
        delegation = glite_settings(section).delegation
        if delegation != "auto" and not DELEGATION_ID_RE.fullmatch(delegation):
            problems.append(
                (
                    ("delegation",),
                    f"delegation id {delegation!r} may only hold letters, digits, '.', '_' and '-'",
                )
            )
        for key in ("requirements", "rank"):
            if (section.get(key) or "").strip():
                try:
                    check_expression(section[key], key)
                except JdlError as exc:
                    problems.append(((key,), str(exc)))
        for key in ("executable", "arguments", "std_output", "std_error", "vo"):
            if isinstance(section.get(key), str):
                try:
                    quote(section[key], key)
                except JdlError as exc:
                    problems.append(((key,), str(exc)))
        for key in ("input_sandbox", "output_sandbox"):
            for index, item in enumerate(section.get(key) or []):
                try:
                    quote(item, key)
                except JdlError as exc:
                    problems.append(((key, index), str(exc)))
        for name, value in (section.get("extra_attributes") or {}).items():
            if name.lower() in RESERVED:
                problems.append(
                    (
                        ("extra_attributes", name),
                        f"{name} is written by gridgate itself; use its own key",
                    )
                )
                continue
            try:
                literal(value, name)
            except JdlError as exc:
                problems.append((("extra_attributes", name), str(exc)))
        return problems

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self.rules = tuple(Rule.from_settings(rule) for rule in self.settings.rules)
        self.removed_leftovers = remove_leftover_jdls(self.jdl_dir())

    def jdl_dir(self) -> Path:
        """The folder JDL files are written to."""
        configured = self.settings.work_dir
        return Path(configured) if configured else Path(self.context.state_dir) / f"{self.name}-jdl"

    # --- helpers ---------------------------------------------------------------------------

    def endpoints(self) -> tuple[Endpoint, ...]:
        """The configured servers as endpoints, in config order."""
        return tuple(endpoint_for(self.name, s) for s in self.settings.servers)

    def commands(self) -> Mapping[str, str]:
        """The commands by role (submit, list_match, status, cancel): the configured ones,
        status and cancel found beside a submit command given as a path."""
        configured = {k: v for k, v in self.settings.commands.items() if v}
        commands = {
            "submit": "glite-wms-job-submit",
            "list_match": "glite-wms-job-list-match",
            **configured,
        }
        commands.update(sibling_commands(commands["submit"], configured))
        return commands

    def argv(self, operation: str, endpoint: Endpoint, jdl_path: str) -> list[str]:
        """The argv of one call (no shell ever sees it)."""
        command = self.commands()["submit" if operation == OPERATION_SUBMIT else "list_match"]
        url = endpoint.url or endpoint_for(self.name, endpoint.name).url
        argv = [command, "--noint", "--endpoint", url]
        delegation = self.settings.delegation
        argv += ["-a"] if delegation == "auto" else ["-d", delegation]
        if self.settings.config_file:
            argv += ["-c", self.settings.config_file]
        if operation == OPERATION_SUBMIT:
            output_format = self.settings.output_format
            if output_format == "json":
                argv.append("--json")
            elif output_format == "nomsg":
                argv.append("--nomsg")
        argv.append(jdl_path)
        return argv

    def _run_with_jdl(
        self, operation: str, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> CommandResult | _NotRun:
        """Write the JDL privately, run the command, remove the file; a :class:`_NotRun`
        says why nothing could be run (a value that cannot go into a JDL, or, a fault of this
        machine, a JDL folder that is missing, not writable or full)."""
        try:
            text = build_jdl(self.settings, request)
        except JdlError as exc:
            return _NotRun(f"cannot build the JDL: {exc}")
        folder = self.jdl_dir()
        try:
            if not self.settings.work_dir:
                ensure_private_dir(folder)
            # mkstemp creates the file 0600 and exclusively: no other user can read the JDL or
            # swap it between writing and the command reading it.
            fd, path = tempfile.mkstemp(
                prefix=f"{JDL_PREFIX}{os.getpid()}-", suffix=".jdl", dir=folder
            )
        except OSError as exc:
            return _NotRun(f"cannot create a JDL file in {folder}: {_os_error(exc)}", local=True)
        try:
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(text)
            except OSError as exc:
                return _NotRun(
                    f"cannot write the JDL file {path} in {folder}: {_os_error(exc)}", local=True
                )
            argv = self.argv(operation, endpoint, path)
            logger.debug("{} on {}: {}", operation, endpoint.name, argv)
            return self.run(argv, self.deadline(timeout))
        finally:
            with contextlib.suppress(OSError):
                Path(path).unlink()

    def _cache_key(self, endpoint: Endpoint, request: SubmitRequest) -> str:
        requirements = request.requirements or self.settings.requirements
        digest = hashlib.sha256(requirements.encode("utf-8", "replace")).hexdigest()[:32]
        return f"{self.name}/list_match/{endpoint.name}/{digest}"

    def _cache_get(self, key: str) -> tuple[str, ...] | None:
        state = self.context.state
        if state is None or not self.settings.list_match_cache:
            return None
        try:
            raw = state.get(key)
            if raw is None:
                return None
            cached: _CachedMatch = decode_json(raw, _CachedMatch, kind="list-match cache entry")
            return cached.resources
        except Exception as exc:  # a broken cache must never stop a submission
            logger.warning("list-match cache read of {} failed: {}", key, exc)
            return None

    def _cache_set(self, key: str, resources: tuple[str, ...]) -> None:
        state = self.context.state
        ttl = self.settings.list_match_cache
        if state is None or not ttl:
            return
        try:
            value = json.dumps({"resources": list(resources), "time": self.context.clock.time()})
            state.set(key, value, ttl=float(ttl))
        except Exception as exc:
            logger.warning("list-match cache write of {} failed: {}", key, exc)

    # --- hooks -----------------------------------------------------------------------------

    def list_match(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> ListMatchResult:
        key = self._cache_key(endpoint, request)
        cached = self._cache_get(key)
        if cached is not None:
            return ListMatchResult(endpoint, ok=True, resources=cached, cached=True)
        outcome = self._run_with_jdl(OPERATION_LIST_MATCH, endpoint, request, timeout)
        if isinstance(outcome, _NotRun):
            logger.error("list-match on {} not run: {}", endpoint.name, outcome.reason)
            return ListMatchResult(
                endpoint, ok=False, local_fault=outcome.reason if outcome.local else ""
            )
        if not outcome.ok:
            return ListMatchResult(endpoint, ok=False, command=outcome)
        resources = parse_ce_ids(outcome.stdout)
        if not resources and not is_no_match(outcome.stdout):
            # Exit 0 with neither CEs nor the no-match banner: the answer is unreadable.
            return ListMatchResult(endpoint, ok=False, command=outcome)
        self._cache_set(key, resources)
        return ListMatchResult(endpoint, ok=True, resources=resources, command=outcome)

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        outcome = self._run_with_jdl(OPERATION_SUBMIT, endpoint, request, timeout)
        if isinstance(outcome, _NotRun):
            return SubmitResult(
                endpoint,
                ok=False,
                operation=OPERATION_SUBMIT,
                message=outcome.reason,
                local_fault=outcome.reason if outcome.local else "",
            )
        if outcome.ok:
            job_ids = parse_job_ids(outcome.stdout)
            if job_ids:
                return SubmitResult(
                    endpoint, ok=True, job_ids=job_ids, command=outcome, operation=OPERATION_SUBMIT
                )
            return SubmitResult(
                endpoint,
                ok=False,
                command=outcome,
                operation=OPERATION_SUBMIT,
                message="exit 0 but no job id in the output",
            )
        return SubmitResult(
            endpoint,
            ok=False,
            command=outcome,
            operation=OPERATION_SUBMIT,
            message=outcome.describe(),
        )

    def job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult:
        return query_pilots(self, endpoint, job_ids, timeout)

    def cancel(self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float) -> CancelResult:
        return cancel_pilots(self, endpoint, job_ids, timeout)

    def pilot_output(
        self,
        endpoint: Endpoint,
        job_id: str,
        stream: OutputStream,
        name: str,
        size: int,
        from_end: bool,
        timeout: float,
    ) -> PilotOutput | None:
        """The pilot's StdOutput, StdError or a file of its output sandbox, retrieved once
        with ``glite-wms-job-output`` and kept (:mod:`.output`)."""
        return output.pilot_output(self, endpoint, job_id, stream, name, size, from_end, timeout)

    def classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure:
        if result.local_fault:
            return local_io_failure(result.local_fault)
        expected = {OPERATION_LIST_MATCH: "CE list", "Job Status": "job status"}.get(
            result.operation, "job id"
        )
        return classify(result.command, self.rules, result.message, expected=expected)


@dataclass(frozen=True)
class _NotRun:
    """Why a command was not run; ``local`` when this machine is at fault, not the request."""

    reason: str
    local: bool = False


def _os_error(exc: OSError) -> str:
    return f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)


def remove_leftover_jdls(folder: Path) -> list[Path]:
    """Remove the JDL files of directors that are no longer running (killed with commands in
    flight); files of a live process, this one included, are left to it. Returns what went."""
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed  # no folder yet, or unreadable: the first write will say so
    for entry in entries:
        found = JDL_NAME_RE.fullmatch(entry.name)
        if found is None or process_alive(int(found.group(1))):
            continue
        with contextlib.suppress(OSError):
            entry.unlink()
            removed.append(entry)
    if removed:
        logger.info(
            "removed {} JDL file(s) left in {} by a director that was killed", len(removed), folder
        )
    return removed
