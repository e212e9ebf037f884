"""The `arc` backend's ARC client interface (``interface: cli``): ``arcsub -T arcrest`` to
submit, one bulk ``arcstat`` per CE to track, ``arckill`` to cancel, ``arcclean`` to clean
finished pilots off the CE, ``arcget -k`` for the stderr of failed ones.

Each configured CE (URL, optionally with a queue) is an endpoint. The client keeps its memory
in a job list; gridgate gives every endpoint its own job list and client config under the state
folder (``-j``, ``-z``: never ``~/.arc``), since arcstat groups a list's jobs by host and two CEs
on one host would lose jobs in a shared list. The client's exit codes say little (arcstat exits
0 when no job returned information; arcsub exits 0 for a job it could not record), so every
answer is read from the text (:mod:`.documents`); failures are read from the client's messages
(:mod:`.classify`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from loguru import logger

from gridgate.core import runner
from gridgate.core.backend import Deadline
from gridgate.core.files import atomic_write, ensure_private_dir
from gridgate.core.model import (
    TERMINAL_STATES,
    CancelResult,
    CommandResult,
    Failure,
    JobStatus,
    OutputStream,
    PilotOutput,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import PluginContext
from gridgate.core.runner import argv_chunks
from gridgate.plugins.arc.ces import CE, CleanList, environment
from gridgate.plugins.arc.classify import by_exchange, classify, clip, proxy_problem, vague
from gridgate.plugins.arc.describe import Descriptions
from gridgate.plugins.arc.documents import (
    arccat_gone,
    arcstat_report,
    cleaned_counts,
    killed_counts,
    not_in_list,
    submitted_ids,
)
from gridgate.plugins.arc.parse import STDERR, STDOUT, with_stderr
from gridgate.plugins.arc.settings import ArcSettings

__all__ = ["OPERATION_SUBMIT", "CliInterface"]

OPERATION_SUBMIT = "Job Submit"
#: The least arccat output kept (stderr's reason when the file is not read: ``pilots show``)
ARCCAT_MIN_KEEP = 64 * 1024


class CliInterface:
    """The ARC client's way to the CEs.

    :param settings: the section.
    :param context: the plugin context (clock, output cap, credentials).
    :param descriptions: writes the pilots' xRSL.
    :param finals: the pilots to clean, where final pilots are noted.
    """

    def __init__(
        self,
        settings: ArcSettings,
        context: PluginContext,
        descriptions: Descriptions,
        finals: CleanList,
    ) -> None:
        self.settings = settings
        self.context = context
        self.descriptions = descriptions
        self.finals = finals
        self._prepared: set[str] = set()

    def close(self) -> None:
        """Nothing to close: every call is its own process."""

    def services(self, ces: Sequence[CE]) -> list[str]:
        return []  # the client makes its own delegation per job: none of gridgate's is in use

    def classify(self, command: CommandResult | None, message: str) -> Failure:
        return by_exchange(command, message, classify)

    # --- running the client ----------------------------------------------------------------

    def run(
        self, argv: Sequence[str], deadline: Deadline, *, cwd: Path | None = None
    ) -> CommandResult:
        """Run ``argv``, killed at ``deadline``, its output capped at the site's limit."""
        # through the module, as Backend.run does: a test may watch runner.run
        return runner.run(
            list(argv),
            deadline.left(),
            env=environment(self.settings, self.context),
            cwd=cwd,
            max_output=self.context.max_output_bytes,
        )

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

    def client(self, which: str, ce: CE) -> list[str]:
        """The argv prefix of client command ``which`` for ``ce`` (its config and job list)."""
        return [self.settings.program(which), "-z", str(ce.client_conf), "-j", str(ce.job_list)]

    def arcsub_argv(self, ce: CE, files: Sequence[Path], *, verbose: bool = False) -> list[str]:
        return [
            *self.client("arcsub", ce),
            "-C",
            ce.endpoint.url,
            "-T",
            "arcrest",
            *(["-d", "VERBOSE"] if verbose else []),
            *(str(f) for f in files),
        ]

    # --- submission ------------------------------------------------------------------------

    def submit(self, ce: CE, request: SubmitRequest, timeout: float) -> SubmitResult:
        endpoint = ce.endpoint
        problem = self._prepare(ce)
        files: list[Path] = []
        if not problem:
            try:
                for _pilot in range(request.count):
                    path = ce.folder / f"pilot-{uuid.uuid4().hex}.xrsl"
                    text = self.descriptions.description(ce, request)
                    atomic_write(path, text.encode(), durable=False)
                    files.append(path)
            except OSError as exc:
                problem = f"cannot write a job description in {ce.folder}: {exc}"
        if problem:
            _remove(files)
            return SubmitResult(
                endpoint, ok=False, operation=OPERATION_SUBMIT, local_fault=problem, message=problem
            )
        deadline = self.settings.deadline(timeout)
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
            _remove(files)
        return self._submitted(ce, request, outcome)

    @staticmethod
    def _submitted(ce: CE, request: SubmitRequest, outcome: CommandResult) -> SubmitResult:
        """The result of the arcsub call ``outcome``: the ids it printed."""
        endpoint = ce.endpoint
        ids = submitted_ids(outcome.stdout)
        if not ids:
            return SubmitResult(
                endpoint,
                ok=False,
                command=outcome,
                operation=OPERATION_SUBMIT,
                message=outcome.describe()
                if not outcome.ok
                else "arcsub exited 0 but printed no 'Job submitted with jobid:' line",
            )
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

    # --- tracking ---------------------------------------------------------------------------

    def job_status(self, ce: CE, ids: Sequence[str], timeout: float) -> StatusResult:
        endpoint = ce.endpoint
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
        deadline = self.settings.deadline(timeout)
        prefix = self.client("arcstat", ce)
        chunks = argv_chunks(prefix, list(ids))
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
            report = arcstat_report(outcome.stdout, outcome.stderr)
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
                problem = proxy_problem(
                    environment(self.settings, self.context), self.context.clock.time()
                )
                return StatusResult(
                    endpoint,
                    ok=False,
                    command=outcome,
                    commands=len(chunks),
                    message=problem or _status_problem(outcome, report.failed),
                )
            statuses.update(report.statuses)
            failed.update(report.failed)
        for job_id, why in failed.items():  # the CE answered for others but not for these
            statuses.setdefault(job_id, JobStatus(job_id=job_id, state="unknown", reason=clip(why)))
        statuses = {k: v for k, v in statuses.items() if k in set(ids)}
        self._sample_stderr(ce, statuses, deadline)
        self.finals.note(ce, [k for k, v in statuses.items() if v.state in TERMINAL_STATES])
        return StatusResult(
            endpoint, ok=True, statuses=statuses, command=last, commands=len(chunks)
        )

    def _sample_stderr(self, ce: CE, statuses: dict[str, JobStatus], deadline: Deadline) -> None:
        """Add the end of a few failed pilots' stderr (arcget -k: kept on the CE) to their reason."""
        keep = self.settings.stderr_bytes
        failed = [s for s in statuses.values() if s.state == "failed"][
            : self.settings.stderr_samples
        ]
        if not failed or keep <= 0:
            return
        try:
            download = Path(tempfile.mkdtemp(prefix="arcget-", dir=ce.folder))
        except OSError as exc:
            logger.warning("{}: no folder for arcget: {}", ce.endpoint.key, exc)
            return
        try:
            argv = [
                *self.client("arcget", ce),
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

    # --- what the CE says ---------------------------------------------------------------------

    def arcinfo(self, ce: CE, timeout: float) -> CommandResult:
        """``arcinfo -l -c URL``: the CE's endpoints and shares (:mod:`.arcinfo` reads it)."""
        problem = self._prepare(ce)
        if problem:
            return CommandResult(argv=("arcinfo",), returncode=None, launch_error=problem)
        argv = [
            self.settings.program("arcinfo"),
            "-z",
            str(ce.client_conf),
            "-l",
            "-c",
            ce.endpoint.url,
        ]
        return self.run(argv, self.settings.deadline(timeout))

    def pilot_output(
        self,
        ce: CE,
        job_id: str,
        stream: OutputStream,
        name: str,
        size: int,
        from_end: bool,
        timeout: float,
    ) -> PilotOutput:
        """One stream of a pilot printed by ``arccat`` (``-o``, ``-e``, ``-f NAME``: its
        session's ``pilot.out``, ``pilot.err`` or another file), which prints the whole file:
        the start is kept by the output cap; the end of a file longer than the site's
        ``director.max_output_bytes`` is read from an ``arcget -k`` copy."""
        label = name if stream == "file" else ""
        which = {"stdout": ["-o"], "stderr": ["-e"]}.get(stream) or ["-f", name]
        argv = [*self.client("arccat", ce), *which, job_id]
        # stderr says why nothing came (a 404, a job not in the list): never capped to nothing
        keep = max(size, self.context.max_output_bytes if from_end else ARCCAT_MIN_KEEP)
        deadline = self.settings.deadline(timeout)
        outcome = runner.run(
            argv, deadline.left(), env=environment(self.settings, self.context), max_output=keep
        )
        said = outcome.stdout + outcome.stderr
        file = name if stream == "file" else (STDOUT if stream == "stdout" else STDERR)
        where = f"{file} of {job_id} (arccat)"
        gone = arccat_gone(said)
        if gone:
            return PilotOutput(
                job_id, stream, held=False, where=where, name=label, command=outcome, message=gone
            )
        if not outcome.ok:
            missing = "File download failed" in outcome.stderr and "404" in outcome.stderr
            if missing:
                return PilotOutput(
                    job_id,
                    stream,
                    held=False,
                    where=where,
                    name=label,
                    command=outcome,
                    message=f"job {job_id} holds no {file} in its session",
                )
            last = outcome.stderr.strip().splitlines()[-1:] or [outcome.describe()]
            return PilotOutput(
                job_id, stream, ok=False, name=label, command=outcome, message=clip(last[0])
            )
        data = outcome.stdout.encode("utf-8", "surrogateescape")
        if from_end:
            if outcome.stdout_truncated:
                # longer than the cap: its end is read from a copy (arcget -k: finished jobs)
                return self._tail_by_arcget(ce, job_id, stream, file, size, where, deadline)
            part = data[-size:] if size else b""
            return PilotOutput(
                job_id,
                stream,
                where=where,
                text=part.decode("utf-8", "replace"),
                cut=len(part) < len(data),
                size=len(data),
                from_end=True,
                name=label,
            )
        part = data[:size]
        return PilotOutput(
            job_id,
            stream,
            where=where,
            text=part.decode("utf-8", "replace"),
            cut=outcome.stdout_truncated or len(part) < len(data),
            size=None if outcome.stdout_truncated else len(data),
            name=label,
        )

    def _tail_by_arcget(
        self,
        ce: CE,
        job_id: str,
        stream: OutputStream,
        file: str,
        size: int,
        where: str,
        deadline: Deadline,
    ) -> PilotOutput:
        """The last ``size`` bytes of ``file`` of a finished pilot, from a copy of its session
        that ``arcget -k`` (the job stays on the CE) downloads into a private folder, removed
        after."""
        label = file if stream == "file" else ""
        try:
            download = Path(tempfile.mkdtemp(prefix="arcget-", dir=ce.folder))
        except OSError as exc:
            return PilotOutput(job_id, stream, ok=False, name=label, message=str(exc))
        try:
            argv = [*self.client("arcget", ce), "-k", "-D", str(download), job_id]
            outcome = self.run(argv, deadline)
            path = download / job_id.rsplit("/", 1)[-1] / file
            try:
                with path.open("rb") as handle:
                    total = handle.seek(0, os.SEEK_END)
                    handle.seek(max(0, total - size))
                    data = handle.read(size)
            except OSError:
                last = outcome.stderr.strip().splitlines()[-1:] or [outcome.describe()]
                return PilotOutput(
                    job_id,
                    stream,
                    ok=False,
                    name=label,
                    command=outcome,
                    message=clip(
                        f"{file} is longer than director.max_output_bytes and arcget -k "
                        f"gave no copy of it: {last[0]}"
                    ),
                )
        finally:
            shutil.rmtree(download, ignore_errors=True)
        return PilotOutput(
            job_id,
            stream,
            where=where,
            text=data.decode("utf-8", "replace"),
            cut=len(data) < total,
            size=total,
            from_end=True,
            name=label,
        )

    # --- cancel and clean -------------------------------------------------------------------

    def cancel(self, ce: CE, ids: Sequence[str], timeout: float) -> CancelResult:
        endpoint = ce.endpoint
        cancelled: list[str] = []
        left: list[str] = []
        last: CommandResult | None = None
        prefix = self.client("arckill", ce)
        deadline = self.settings.deadline(timeout)
        for argv in argv_chunks(prefix, list(ids)):
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
        self.finals.note(ce, cancelled)
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

    def clean(self, ce: CE, ids: Sequence[str], timeout: float) -> list[str]:
        """arcclean deletes only jobs the CE has finished: a pilot cancelled a moment ago is
        still being killed there (``Jobs processed: 1, deleted: 0``), so it stays to be cleaned
        at a later iteration."""
        prefix = self.client("arcclean", ce)
        deadline = self.settings.deadline(timeout)
        done: list[str] = []
        for argv in argv_chunks(prefix, list(ids)):
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


def _status_problem(outcome: CommandResult, failed: Mapping[str, str]) -> str:
    if not outcome.ok and (outcome.timed_out or outcome.launch_error):
        return outcome.describe()
    why = next(iter(failed.values()), "")
    return clip(f"arcstat: no job returned information{f' ({why})' if why else ''}")


def _remove(files: Sequence[Path]) -> None:
    for path in files:
        with contextlib.suppress(FileNotFoundError):  # already gone is what we want
            path.unlink()


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
