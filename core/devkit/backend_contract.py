"""The contract every backend is held to, as a pytest suite a backend inherits.

Subclass :class:`BackendContract` in a test module, in a class whose name starts with
``Test``, tell it how to configure your backend with a given program as its command, and
what that command prints when it submitted; pytest then runs every ``test_contract_*``
check against your backend, with real stand-in programs (no mocks):

.. code-block:: python

    from gridgate.core.testing import BackendContract
    from gridgate_mybackend.backend import MyBackend

    class TestMyBackendContract(BackendContract):
        backend_class = MyBackend
        name = "mybackend"
        submitted_output = "Submitted batch job {call}\\n"

        def section(self, program, tmp_path):
            return {"command": [program], "partitions": ["debug"]}

A backend that tracks its pilots (``job_status``) and cancels them (``cancel``) also tells
the contract what its commands print for a few situations, as :class:`Answer` values, so that
tracking is held to the same rules as submission (a deadline that kills, the site's output
cap, an id nobody knows, a partial answer, an empty id list, a cancel of finished jobs):

.. code-block:: python

    from gridgate.core.testing import Answer, BackendContract

    class TestMyBackendContract(BackendContract):
        ...
        def status_answer(self, known, unknown):
            # `known`: id -> "waiting" or "running"; `unknown`: ids nobody knows
            lines = "".join(f"{i} {'PENDING' if s == 'waiting' else 'RUNNING'}\\n"
                            for i, s in known.items())
            return Answer(stdout=lines, stderr="".join(f"{i}: no such job\\n" for i in unknown))

        def cancel_answer(self, cancelled, finished, unknown):
            return Answer(stdout="".join(f"cancelled {i}\\n" for i in cancelled)
                          + "".join(f"{i}: already finished\\n" for i in finished),
                          stderr="".join(f"{i}: no such job\\n" for i in unknown),
                          exit_code=1 if unknown else 0)

A backend that finds its pilots by name (``find_pilots``) sets ``job_name_base`` (the
``job_name`` its section gives :func:`~gridgate.core.backend.job_name`) and tells what its
listing command prints for some named jobs; the contract then checks that a submission is
found by its name and by its fleet, that an unknown name and another fleet's jobs are absent,
and that the ids found are ones ``job_status`` takes:

.. code-block:: python

        job_name_base = "gridgate-pilot"

        def found_answer(self, jobs):
            # `jobs`: job id -> (job name, "waiting" or "running")
            return Answer(stdout="".join(f"{i} {name} {'PENDING' if s == 'waiting' else 'RUNNING'}\n"
                                         for i, (name, s) in jobs.items()))

One stand-in program still plays every command of the section; an answer's ``when`` (argv words
it needs) lets a status command and an accounting command (``qstat`` / ``qacct -j``) print
different things. A backend that does not track (its ``job_status`` is the base class's) is
checked to answer None and run nothing, and needs neither method.

Import it as ``from gridgate.core.testing import BackendContract`` (pytest is needed).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from gridgate.core.backend import job_name
from gridgate.core.builtin.classifier import RuleClassifier
from gridgate.core.clock import FakeClock
from gridgate.core.config import ConfigError
from gridgate.core.devkit.testkit import (
    StandIn,
    build_plugin,
    plugin_manager_with,
    section_for,
    stand_in_command,
)
from gridgate.core.kinds import KINDS
from gridgate.core.model import (
    TERMINAL_STATES,
    BackendInfo,
    CancelResult,
    Endpoint,
    Failure,
    FoundPilots,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.stores.memory import MemoryState

#: A program that does not exist, for the launch-failure check.
MISSING_PROGRAM = "/nonexistent/gridgate-contract/submit"
#: What a flooding command prints in the output-cap checks (the site's cap is 1024 bytes).
FLOOD = "x" * 200_000 + "\n"
#: How long a hanging stand-in sleeps: far beyond any deadline of the checks.
HANG = 600.0

T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """What the stand-in command prints for one kind of call, in the tracking checks.

    It prints ``stdout`` (flushed), sleeps ``sleep`` seconds (a command that hangs), prints
    ``stderr`` and exits with ``exit_code``; ``{call}`` in either text becomes the call's
    number. ``when`` are argv words that must all be in the call's argv (after the program)
    for this answer to be the one printed; empty, the answer fits any call. Of several answers
    the first that fits is printed, and a call none fits prints nothing and exits 0: one stand-in
    plays every command of the section, and ``when`` tells them apart by their options
    (``Answer(stdout=..., when=("-j",))`` for ``qacct -j ID``, then one for ``qstat``).
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    sleep: float = 0.0
    when: tuple[str, ...] = ()


_ANSWERING = """#!{python}
# gridgate contract stand-in {name!r}: written by gridgate.core.devkit.backend_contract
import fcntl, json, os, sys, time

SPEC = json.loads({spec!r})
with open(SPEC["calls"], "a+", encoding="utf-8") as log:
    fcntl.flock(log, fcntl.LOCK_EX)
    log.seek(0)
    call = sum(1 for _ in log) + 1
    log.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid()}}) + "\\n")
words = set(sys.argv[1:])
answer = next((a for a in SPEC["answers"] if set(a["when"]) <= words), None)
if answer is None:
    sys.exit(0)
def fill(text):
    return text.replace("{{call}}", str(call))
sys.stdout.write(fill(answer["stdout"]))
sys.stdout.flush()
if answer["sleep"] > 0:
    time.sleep(answer["sleep"])  # a command that hangs: it is killed, not waited for
sys.stderr.write(fill(answer["stderr"]))
sys.stderr.flush()
sys.exit(answer["exit_code"])
"""


def answering_stand_in(
    tmp_dir: str | os.PathLike[str], name: str, answers: Answer | Sequence[Answer]
) -> StandIn:
    """Write a real executable ``name`` in ``tmp_dir`` that prints, for each call, the first of
    ``answers`` whose ``when`` words are all in its argv; calls are recorded as by
    :func:`~gridgate.core.testing.stand_in_command` (:meth:`StandIn.calls`)."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"stand-in name must be a plain file name, got {name!r}")
    listed = [answers] if isinstance(answers, Answer) else list(answers)
    for answer in listed:
        if not isinstance(answer, Answer):
            raise TypeError(f"answers are Answer values, got {answer!r}")
        if not 0 <= answer.exit_code <= 255:
            raise ValueError(f"exit_code must be 0..255, got {answer.exit_code}")
    folder = Path(tmp_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    calls = folder / f".{name}.calls"
    spec = json.dumps(
        {
            "answers": [{**asdict(a), "when": list(a.when)} for a in listed],
            "calls": str(calls.resolve()),
        }
    )
    path.write_text(
        _ANSWERING.format(python=sys.executable, name=name, spec=spec), encoding="utf-8"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return StandIn(path=path, calls_file=calls)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie has: only its exit status remains)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def _kill_left(program: StandIn) -> list[int]:
    """Kill the stand-in's processes still running (a backend that did not), by their pids."""
    killed = []
    for call in program.calls():
        pid = int(call["pid"])
        if not _gone(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.append(pid)
    return killed


class BackendContract:
    """The backend contract as tests. Set the class attributes and :meth:`section`; for a
    backend that tracks or cancels, :meth:`status_answer` and :meth:`cancel_answer` too.

    Every check builds a fresh backend whose command is a stand-in program written in
    ``tmp_path`` (see :func:`~gridgate.core.testing.stand_in_command` and
    :func:`answering_stand_in`).
    """

    #: your backend's class
    backend_class: ClassVar[type]
    #: its entry-point name
    name: ClassVar[str] = ""
    #: what your command prints on stdout when it submitted (``{call}`` becomes the call
    #: number, so ids differ between calls)
    submitted_output: ClassVar[str] = ""
    #: what it prints on stderr, with exit code 1, when the server refuses
    refused_output: ClassVar[str] = "error: the server refused the request\n"
    #: kinds of your own your classifier may answer besides the catalogue's
    extra_kinds: ClassVar[frozenset[str]] = frozenset()
    #: pilots per submission in the checks
    pilots: ClassVar[int] = 1
    #: ``(changes to your section, path of the problem they cause)`` for ``config_errors``
    #: checks of your own; the misspelt-key check is always made
    bad_sections: ClassVar[Sequence[tuple[Mapping[str, Any], tuple[str | int, ...]]]] = ()
    #: seconds given as the deadline in the deadline checks
    deadline: ClassVar[float] = 3.0
    #: seconds past ``deadline`` a hook call may take before the deadline checks call its
    #: command unkilled (and kill it themselves): a bound for a loaded machine, not a timing
    deadline_grace: ClassVar[float] = 60.0
    #: three job ids in your backend's form for the tracking checks; empty: the first id of
    #: each of three submissions through a stand-in printing ``submitted_output``
    job_ids: ClassVar[tuple[str, ...]] = ()

    #: the ``job_name`` your section gives :func:`~gridgate.core.backend.job_name` (needed
    #: only when your backend finds its pilots by name)
    job_name_base: ClassVar[str] = ""
    #: whether your backend names one job per pilot (``job_name(base, request, i)``)
    names_per_pilot: ClassVar[bool] = False
    #: False when your backend has ``find_pilots`` but :meth:`section` configures it in a way
    #: that cannot list its jobs by name (ARC's ``interface: cli``): the contract then checks
    #: that it answers None and runs nothing, as a backend without the method does
    finds_pilots: ClassVar[bool] = True

    def section(self, program: str, tmp_path: Path) -> dict[str, Any]:
        """Your backend's config section with ``program`` as the command it runs (every
        command: submission, status, accounting and cancel alike)."""
        raise NotImplementedError("give the section that makes your backend run `program`")

    def make_backend(
        self, program: str, tmp_path: Path, max_output_bytes: int | None = None
    ) -> Any:
        """Your backend built with :meth:`section` (override for more set-up: a job list
        file your status command needs, for instance)."""
        director = {"max_output_bytes": max_output_bytes} if max_output_bytes else {}
        clock = FakeClock()
        return build_plugin(
            self.backend_class,
            self.section(program, tmp_path),
            clock=clock,
            state=MemoryState(clock=clock),
            state_dir=tmp_path / "state",
            name=self.name,
            config={"director": director},
        )

    def status_answer(
        self, known: Mapping[str, str], unknown: Sequence[str]
    ) -> Answer | Sequence[Answer]:
        """What your status command (and accounting command, if it runs one) prints when
        asked about the jobs in ``known`` (job id -> ``"waiting"`` or ``"running"``) and those
        in ``unknown``, which the batch system has never heard of (``Job <7> is not found``,
        exit 255; an accounting command that finds no record of them either).

        Needed only when your backend tracks (implements ``job_status``)."""
        raise NotImplementedError(
            f"{type(self).__name__}: {self.name!r} tracks its pilots: give "
            "status_answer(known, unknown), what its status command prints for those jobs"
        )

    def cancel_answer(
        self, cancelled: Sequence[str], finished: Sequence[str], unknown: Sequence[str]
    ) -> Answer | Sequence[Answer]:
        """What your cancel command prints when it cancelled the jobs ``cancelled``, found
        those in ``finished`` already finished, and knew nothing of those in ``unknown``
        (any of them may be empty).

        Needed only when your backend cancels (implements ``cancel``)."""
        raise NotImplementedError(
            f"{type(self).__name__}: {self.name!r} cancels: give cancel_answer(cancelled, "
            "finished, unknown), what its cancel command prints for them"
        )

    def found_answer(self, jobs: Mapping[str, tuple[str, str]]) -> Answer | Sequence[Answer]:
        """What your listing command (the one ``find_pilots`` runs) prints when the server
        holds the jobs ``jobs``: job id -> (job name, ``"waiting"`` or ``"running"``), the
        names made by :func:`~gridgate.core.backend.job_name` with ``job_name_base``.

        Needed only when your backend finds its pilots by name (implements ``find_pilots``)."""
        raise NotImplementedError(
            f"{type(self).__name__}: {self.name!r} finds its pilots by name: set "
            "job_name_base and give found_answer(jobs), what its listing command prints"
        )

    # --- helpers ------------------------------------------------------------------------------

    def _info(self, backend: Any) -> BackendInfo:
        info = backend.gridgate_backend_info(backend=self.name)
        assert isinstance(info, BackendInfo), f"gridgate_backend_info({self.name!r}) gave {info!r}"
        return info

    def _endpoint(self, backend: Any) -> Endpoint:
        return self._info(backend).endpoints[0]

    def _submit(self, backend: Any, timeout: float = 30.0) -> SubmitResult:
        endpoint = self._endpoint(backend)
        request = SubmitRequest(backend=self.name, group="contract", count=self.pilots)
        result = backend.gridgate_submit(endpoint=endpoint, request=request, timeout=timeout)
        assert isinstance(result, SubmitResult), (
            f"gridgate_submit gave {result!r}, not a SubmitResult"
        )
        return result

    def _classify(self, backend: Any, result: SubmitResult, tmp_path: Path) -> Failure:
        rules = build_plugin(RuleClassifier, {}, name="rules")
        with plugin_manager_with(rules, backend) as pm:
            failure = pm.hook.gridgate_classify_failure(endpoint=result.endpoint, result=result)
        assert isinstance(failure, Failure)
        return failure

    def _stand_in(self, tmp_path: Path, **behaviour: Any) -> Any:
        return stand_in_command(tmp_path / "bin", "contract-command", **behaviour)

    def _answering(self, tmp_path: Path, answers: Answer | Sequence[Answer]) -> StandIn:
        return answering_stand_in(tmp_path / "bin", "contract-command", answers)

    @staticmethod
    def _implements(backend: Any, method: str) -> bool:
        """Whether ``backend`` answers ``gridgate_<method>``: a :class:`Backend` subclass when
        it overrides ``method``, any other plugin when it has the hook method."""
        from gridgate.core.backend import Backend

        if isinstance(backend, Backend):
            return getattr(type(backend), method) is not getattr(Backend, method)
        return callable(getattr(backend, f"gridgate_{method}", None))

    def _ids(self, tmp_path: Path) -> tuple[str, str, str]:
        """Three job ids of this backend: ``job_ids``, or the first of each of three
        submissions through a stand-in printing ``submitted_output``."""
        if self.job_ids:
            assert len(self.job_ids) >= 3, "job_ids: give three ids (or none)"
            return (self.job_ids[0], self.job_ids[1], self.job_ids[2])
        folder = tmp_path / "submitted"
        program = stand_in_command(folder / "bin", "contract-command", stdout=self.submitted_output)
        backend = self.make_backend(str(program), folder)
        ids = []
        for _ in range(3):
            result = self._submit(backend)
            assert result.ok and result.job_ids, (
                f"the tracking checks take their ids from submissions printing "
                f"{self.submitted_output!r}, which failed: {result} (or set job_ids)"
            )
            ids.append(result.job_ids[0])
        assert len(set(ids)) == 3, f"three submissions gave the ids {ids}"
        return (ids[0], ids[1], ids[2])

    def _within(self, what: str, call: Callable[[], T], program: StandIn, deadline: float) -> T:
        """``call()``, which must return within ``deadline`` plus ``deadline_grace`` seconds.

        A call still running then has left its command unkilled: the check fails, and kills
        the stand-in's processes itself so that nothing is left behind."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = call()
            except BaseException as exc:  # re-raised in the test's thread
                box["error"] = exc

        thread = threading.Thread(target=target, name=f"contract {what}", daemon=True)
        thread.start()
        thread.join(deadline + self.deadline_grace)
        if thread.is_alive():
            killed = _kill_left(program)
            thread.join(30)
            raise AssertionError(
                f"{what} had not returned {deadline + self.deadline_grace:.0f} s after its "
                f"{deadline:g} s deadline began: its command was not killed at the deadline "
                f"(killed by the contract: pids {killed}). Run commands with "
                "self.run(argv, self.deadline(timeout)), or runner.run(argv, timeout, ...)"
            )
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _status(self, backend: Any, job_ids: Sequence[str], timeout: float = 30.0) -> Any:
        return backend.gridgate_job_status(
            endpoint=self._endpoint(backend), job_ids=list(job_ids), timeout=timeout
        )

    def _cancel(self, backend: Any, job_ids: Sequence[str], timeout: float = 30.0) -> Any:
        return backend.gridgate_cancel(
            endpoint=self._endpoint(backend), job_ids=list(job_ids), timeout=timeout
        )

    def _tracking(self, tmp_path: Path, answers: Answer | Sequence[Answer], **kw: Any) -> Any:
        program = self._answering(tmp_path, answers)
        return program, self.make_backend(str(program), tmp_path, **kw)

    # --- the contract -------------------------------------------------------------------------

    def test_contract_backend_info_names_its_own_endpoints(self, tmp_path: Path) -> None:
        info = self._info(self.make_backend(str(self._stand_in(tmp_path)), tmp_path))
        assert info.backend == self.name and info.endpoints, (
            "a backend describes at least one endpoint"
        )
        assert all(e.backend == self.name for e in info.endpoints), (
            "every Endpoint.backend is the entry-point name"
        )
        assert info.pilots_per_submission >= 1

    def test_contract_returns_none_for_what_is_not_its_own(self, tmp_path: Path) -> None:
        backend = self.make_backend(str(self._stand_in(tmp_path)), tmp_path)
        other = Endpoint("not-" + self.name, "elsewhere")
        request = SubmitRequest(backend=other.backend)
        assert backend.gridgate_backend_info(backend=other.backend) is None
        assert backend.gridgate_submit(endpoint=other, request=request, timeout=5) is None
        for hook, kwargs in (
            ("gridgate_list_match", {"endpoint": other, "request": request, "timeout": 5}),
            (
                "gridgate_classify_failure",
                {"endpoint": other, "result": SubmitResult(other, ok=False)},
            ),
            ("gridgate_job_status", {"endpoint": other, "job_ids": ("1",), "timeout": 5}),
            ("gridgate_cancel", {"endpoint": other, "job_ids": ("1",), "timeout": 5}),
            (
                "gridgate_find_pilots",
                {"endpoint": other, "names": ("abcdef-000000000001",), "fleet": "", "timeout": 5},
            ),
            (
                "gridgate_pilot_output",
                {
                    "endpoint": other,
                    "job_id": "1",
                    "stream": "stdout",
                    "name": "",
                    "size": 10,
                    "from_end": False,
                    "timeout": 5,
                },
            ),
        ):
            implementation = getattr(backend, hook, None)
            if callable(implementation):
                assert implementation(**kwargs) is None, (
                    f"{hook} answered for another backend's endpoint"
                )
        assert self.stand_in_calls(tmp_path) == 0, "nothing may run for another backend's endpoint"

    def test_contract_every_hook_method_is_a_hook_implementation(self, tmp_path: Path) -> None:
        backend = self.make_backend(str(self._stand_in(tmp_path)), tmp_path)
        for name in dir(type(backend)):
            method = getattr(backend, name, None)
            if name.startswith("gridgate_") and callable(method):
                # pluggy registers only marked methods: an override of a Backend hook method
                # without @hookimpl silently takes the hook away
                assert hasattr(method, "gridgate_impl"), f"{name} lacks @hookimpl: never called"

    def test_contract_job_ids_are_parsed_from_the_output(self, tmp_path: Path) -> None:
        program = self._stand_in(tmp_path, stdout=self.submitted_output)
        backend = self.make_backend(str(program), tmp_path)
        first, second = self._submit(backend), self._submit(backend)
        assert first.ok, f"the command printed {self.submitted_output!r} and exited 0, yet: {first}"
        assert len(first.job_ids) in (1, self.pilots), "one id per pilot, or one for the bulk"
        assert all(isinstance(j, str) and j for j in first.job_ids)
        assert set(first.job_ids).isdisjoint(second.job_ids), "each call's ids are its own"
        assert len(program.calls()) == 2

    def test_contract_a_launch_failure_is_a_result_and_a_local_fault(self, tmp_path: Path) -> None:
        backend = self.make_backend(MISSING_PROGRAM, tmp_path)
        result = self._submit(backend)
        assert not result.ok and result.command is not None and result.command.launch_error, (
            "a program that cannot start is a failed result carrying the runner's launch_error"
        )
        failure = self._classify(backend, result, tmp_path)
        assert failure.local and failure.kind == "launch"

    def test_contract_the_deadline_kills_its_command(self, tmp_path: Path) -> None:
        program = self._stand_in(tmp_path, stdout="started\n", sleep=HANG)
        backend = self.make_backend(str(program), tmp_path)
        result = self._within(
            "gridgate_submit",
            lambda: self._submit(backend, timeout=self.deadline),
            program,
            self.deadline,
        )
        assert not result.ok and result.command is not None and result.command.timed_out
        for call in program.calls():
            assert _gone(call["pid"]), f"the command (pid {call['pid']}) outlived its deadline"
        assert self._classify(backend, result, tmp_path).kind in set(KINDS) | self.extra_kinds

    def test_contract_every_failure_is_classified_to_a_catalogued_kind(
        self, tmp_path: Path
    ) -> None:
        outcomes: dict[str, dict[str, Any]] = {
            "refused": {"stderr": self.refused_output, "exit_code": 1},
            "no answer": {"stdout": "nothing useful\n"},
            "usage": {"stderr": "unknown option\n", "exit_code": 255},
            "crashed": {"exit_code": 137},
        }
        for what, behaviour in outcomes.items():
            folder = tmp_path / what.replace(" ", "_")
            program = stand_in_command(folder / "bin", "contract-command", **behaviour)
            backend = self.make_backend(str(program), folder)
            result = self._submit(backend)
            assert not result.ok, f"{what}: {result}"
            assert result.command is not None, f"{what}: a failed command is kept as evidence"
            kind = self._classify(backend, result, folder).kind
            assert kind in set(KINDS) | self.extra_kinds, (
                f"{what}: kind {kind!r} is not catalogued (gridgate.core.kinds) nor in extra_kinds"
            )

    def test_contract_output_is_capped_at_the_sites_max_output_bytes(self, tmp_path: Path) -> None:
        program = self._stand_in(tmp_path, stdout=FLOOD, exit_code=1)
        backend = self.make_backend(str(program), tmp_path, max_output_bytes=1024)
        result = self._submit(backend)
        assert result.command is not None and result.command.stdout_truncated, (
            "pass max_output=self.context.max_output_bytes to runner.run"
        )
        assert len(result.command.stdout.encode()) <= 1024

    def test_contract_config_errors_carry_paths(self, tmp_path: Path) -> None:
        good = self.section(str(self._stand_in(tmp_path)), tmp_path)
        section_for(self.backend_class, good)  # the section the other checks use is valid
        cases = [
            ({**good, "no_such_key": 1}, ("no_such_key",)),
            *(({**good, **changes}, tuple(path)) for changes, path in self.bad_sections),
        ]
        for section, path in cases:
            try:
                section_for(self.backend_class, section)
            except ConfigError as exc:
                assert path in [p.path for p in exc.problems], (
                    f"expected a problem at {path}, got {[str(p) for p in exc.problems]}"
                )
            else:
                raise AssertionError(f"{section!r} was accepted; expected a problem at {path}")

    # --- tracking and cancel ------------------------------------------------------------------

    def test_contract_no_ids_run_no_command(self, tmp_path: Path) -> None:
        """An empty id list is answered without a command (a status command given no ids
        lists every job of the user, a cancel command given none may cancel them all)."""
        program, backend = self._tracking(tmp_path, Answer(stdout="started\n"))
        status, cancel = self._status(backend, []), self._cancel(backend, [])
        if self._implements(backend, "job_status"):
            assert isinstance(status, StatusResult), f"job_status of no ids gave {status!r}"
            assert status.ok and not status.statuses, f"job_status of no ids: {status}"
        else:
            assert status is None, "a backend that does not track answers job_status with None"
        if self._implements(backend, "cancel"):
            assert isinstance(cancel, CancelResult), f"cancel of no ids gave {cancel!r}"
            assert cancel.ok and cancel.cancelled == (), f"cancel of no ids: {cancel}"
        else:
            assert cancel is None, "a backend that does not cancel answers cancel with None"
        assert program.calls() == [], f"no ids, yet commands ran: {program.calls()}"

    def test_contract_the_deadline_kills_a_hanging_status_command(self, tmp_path: Path) -> None:
        program, backend = self._tracking(tmp_path, Answer(stdout="started\n", sleep=HANG))
        if not self._implements(backend, "job_status"):
            assert self._status(backend, ["1"]) is None and program.calls() == []
            return
        ids = self._ids(tmp_path)
        result = self._within(
            "gridgate_job_status",
            lambda: self._status(backend, ids, timeout=self.deadline),
            program,
            self.deadline,
        )
        assert isinstance(result, StatusResult), f"job_status gave {result!r}"
        assert program.calls(), "job_status of three ids ran no command"
        assert not result.ok, (
            "a status command killed at its deadline is a failed poll (ok False: the pilots "
            f"keep their states), not an answer: {result}"
        )
        assert result.command is not None and result.command.timed_out, (
            f"the killed command is kept as evidence (command.timed_out): {result.command}"
        )
        for call in program.calls():
            assert _gone(call["pid"]), f"the command (pid {call['pid']}) outlived its deadline"

    def test_contract_the_deadline_kills_a_hanging_cancel_command(self, tmp_path: Path) -> None:
        program, backend = self._tracking(tmp_path, Answer(stdout="started\n", sleep=HANG))
        if not self._implements(backend, "cancel"):
            assert self._cancel(backend, ["1"]) is None and program.calls() == []
            return
        ids = self._ids(tmp_path)
        result = self._within(
            "gridgate_cancel",
            lambda: self._cancel(backend, ids, timeout=self.deadline),
            program,
            self.deadline,
        )
        assert isinstance(result, CancelResult), f"cancel gave {result!r}"
        assert not result.ok and result.cancelled == (), (
            f"a cancel command killed at its deadline cancelled nothing it can vouch for: {result}"
        )
        assert result.command is not None and result.command.timed_out, (
            f"the killed command is kept as evidence (command.timed_out): {result.command}"
        )
        for call in program.calls():
            assert _gone(call["pid"]), f"the command (pid {call['pid']}) outlived its deadline"

    def test_contract_status_output_is_capped_at_the_sites_max_output_bytes(
        self, tmp_path: Path
    ) -> None:
        program, backend = self._tracking(tmp_path, Answer(stdout=FLOOD), max_output_bytes=1024)
        if not self._implements(backend, "job_status"):
            assert self._status(backend, ["1"]) is None and program.calls() == []
            return
        result = self._status(backend, self._ids(tmp_path))
        assert isinstance(result, StatusResult), f"job_status gave {result!r}"
        assert result.command is not None and result.command.stdout_truncated, (
            "the status output passed the site's cap: run the command with "
            "max_output=self.context.max_output_bytes (self.run does) and return the cut "
            "command, so that core says 'output_cap' instead of losing the ids past the cut"
        )
        assert len(result.command.stdout.encode()) <= 1024
        assert not result.ok, f"a cut status output is no answer (ok False): {result}"

    def test_contract_cancel_output_is_capped_at_the_sites_max_output_bytes(
        self, tmp_path: Path
    ) -> None:
        program, backend = self._tracking(tmp_path, Answer(stdout=FLOOD), max_output_bytes=1024)
        if not self._implements(backend, "cancel"):
            assert self._cancel(backend, ["1"]) is None and program.calls() == []
            return
        result = self._cancel(backend, self._ids(tmp_path))
        assert isinstance(result, CancelResult), f"cancel gave {result!r}"
        assert result.command is not None and result.command.stdout_truncated, (
            "the cancel output passed the site's cap: run the command with "
            "max_output=self.context.max_output_bytes (self.run does) and keep it as evidence"
        )
        assert len(result.command.stdout.encode()) <= 1024

    def test_contract_ids_nobody_knows_are_reported_unknown(self, tmp_path: Path) -> None:
        probe, backend = self._tracking(tmp_path / "probe", Answer())
        if not self._implements(backend, "job_status"):
            assert self._status(backend, ["1"]) is None and probe.calls() == []
            return
        ids = self._ids(tmp_path)
        program, backend = self._tracking(tmp_path, self.status_answer({}, ids))
        result = self._status(backend, ids)
        assert isinstance(result, StatusResult), f"job_status gave {result!r}"
        assert result.ok, (
            "'none of these jobs is known' is an answer (ok True; core marks them unknown, "
            f"then lost), not a failed poll of the server: {result}"
        )
        invented = {j: s.state for j, s in result.statuses.items() if s.state != "unknown"}
        assert not invented, f"ids the batch system does not know were given states: {invented}"
        assert set(result.statuses) <= set(ids), f"ids never asked: {set(result.statuses)}"

    def test_contract_a_partial_answer_keeps_the_pilots_it_does_not_mention(
        self, tmp_path: Path
    ) -> None:
        probe, backend = self._tracking(tmp_path / "probe", Answer())
        if not self._implements(backend, "job_status"):
            assert self._status(backend, ["1"]) is None and probe.calls() == []
            return
        waiting, running, unmentioned = self._ids(tmp_path)
        program, backend = self._tracking(
            tmp_path,
            self.status_answer({waiting: "waiting", running: "running"}, (unmentioned,)),
        )
        result = self._status(backend, [waiting, running, unmentioned])
        assert isinstance(result, StatusResult) and result.ok, f"job_status gave {result!r}"
        states = {j: s.state for j, s in result.statuses.items()}
        assert states.get(waiting) == "waiting" and states.get(running) == "running", (
            f"asked {waiting} (waiting) and {running} (running), got {states}"
        )
        assert states.get(unmentioned, "unknown") == "unknown", (
            f"{unmentioned} was not mentioned: absent or unknown (core keeps it, then lost after "
            f"pilots.lost_after), never {states.get(unmentioned)!r}"
        )
        assert not TERMINAL_STATES & set(states.values())

    def test_contract_cancel_reports_only_the_jobs_it_cancelled(self, tmp_path: Path) -> None:
        probe, backend = self._tracking(tmp_path / "probe", Answer())
        if not self._implements(backend, "cancel"):
            assert self._cancel(backend, ["1"]) is None and probe.calls() == []
            return
        live, finished, unknown = self._ids(tmp_path)
        program, backend = self._tracking(
            tmp_path / "mixed", self.cancel_answer((live,), (finished,), (unknown,))
        )
        mixed = self._cancel(backend, [live, finished, unknown])
        assert isinstance(mixed, CancelResult), f"cancel gave {mixed!r}"
        assert set(mixed.cancelled) <= {live}, (
            f"only {live} was cancelled; {finished} had finished and {unknown} was unknown, so "
            f"neither is 'cancelled' (core would record a finished pilot as cancelled): {mixed}"
        )
        program, backend = self._tracking(
            tmp_path / "all", self.cancel_answer((live, finished, unknown), (), ())
        )
        every = self._cancel(backend, [live, finished, unknown])
        assert isinstance(every, CancelResult), f"cancel gave {every!r}"
        assert every.ok and set(every.cancelled) == {live, finished, unknown}, (
            f"all three were cancelled: {every}"
        )

    # --- finding pilots by name ---------------------------------------------------------------

    def _find(
        self, backend: Any, names: Sequence[str], fleet: str = "", timeout: float = 30.0
    ) -> Any:
        hook = getattr(backend, "gridgate_find_pilots", None)
        if hook is None:
            return None  # a plugin without the hook method does not answer it
        return hook(
            endpoint=self._endpoint(backend), names=tuple(names), fleet=fleet, timeout=timeout
        )

    def _finds(self, backend: Any) -> bool:
        return self.finds_pilots and self._implements(backend, "find_pilots")

    def _job_name(self, submission: str) -> str:
        assert self.job_name_base, "job_name_base: the job_name your section gives job_name()"
        request = SubmitRequest(backend=self.name, name=submission)
        return job_name(self.job_name_base, request, 0 if self.names_per_pilot else None)

    def test_contract_pilots_are_found_by_name_and_by_fleet(self, tmp_path: Path) -> None:
        probe, backend = self._tracking(tmp_path / "probe", Answer())
        if not self._finds(backend):
            assert self._find(backend, ["abcdef-000000000001"]) is None and probe.calls() == []
            return
        fleet, other = "3fa2c1", "77aa00"
        mine, also, stranger = f"{fleet}-{1:012x}", f"{fleet}-{2:012x}", f"{other}-{3:012x}"
        unknown = f"{fleet}-{99:012x}"
        first, second, third = self._ids(tmp_path)
        held = {
            first: (self._job_name(mine), "waiting"),
            second: (self._job_name(also), "running"),
            third: (self._job_name(stranger), "waiting"),
        }
        program, backend = self._tracking(tmp_path / "held", self.found_answer(held))
        by_name = self._find(backend, [mine, unknown])
        assert isinstance(by_name, FoundPilots) and by_name.ok, f"find_pilots gave {by_name!r}"
        ids = {n: sorted(s.job_id for s in found) for n, found in by_name.found.items()}
        assert ids == {mine: [first]}, (
            f"asked {mine} (job {first}) and {unknown} (nothing): only {mine} is found, with "
            f"its job; {also} was not asked. Got {ids}"
        )
        assert [s.state for s in by_name.found[mine]] == ["waiting"], by_name.found
        by_fleet = self._find(backend, [], fleet=fleet)
        assert isinstance(by_fleet, FoundPilots) and by_fleet.ok, f"find_pilots gave {by_fleet!r}"
        ids = {n: sorted(s.job_id for s in found) for n, found in by_fleet.found.items()}
        assert ids == {mine: [first], also: [second]}, (
            f"fleet {fleet}: its two submissions, not {stranger} of fleet {other}. Got {ids}"
        )
        assert program.calls(), "find_pilots ran no command"
        if not self._implements(backend, "job_status"):
            return
        found = {s.job_id: s.state for v in by_fleet.found.values() for s in v}
        program, backend = self._tracking(tmp_path / "polled", self.status_answer(found, ()))
        polled = self._status(backend, list(found))
        assert isinstance(polled, StatusResult) and polled.ok, f"job_status gave {polled!r}"
        states = {j: s.state for j, s in polled.statuses.items()}
        assert states == found, (
            f"the ids find_pilots gives are those job_status takes: polled {found}, got {states}"
        )

    def test_contract_a_listing_that_fails_is_no_answer(self, tmp_path: Path) -> None:
        program, backend = self._tracking(tmp_path, Answer(stdout="started\n", sleep=HANG))
        if not self._finds(backend):
            assert self._find(backend, ["abcdef-000000000001"]) is None and program.calls() == []
            return
        result = self._within(
            "gridgate_find_pilots",
            lambda: self._find(backend, ["abcdef-000000000001"], timeout=self.deadline),
            program,
            self.deadline,
        )
        assert isinstance(result, FoundPilots), f"find_pilots gave {result!r}"
        assert not result.ok, (
            "a listing killed at its deadline says nothing (ok False: core asks again later, "
            f"instead of giving the submission up as never made): {result}"
        )
        for call in program.calls():
            assert _gone(call["pid"]), f"the command (pid {call['pid']}) outlived its deadline"

    def stand_in_calls(self, tmp_path: Path) -> int:
        calls = tmp_path / "bin" / ".contract-command.calls"
        return len(calls.read_text(encoding="utf-8").splitlines()) if calls.exists() else 0


__all__ = ["FLOOD", "HANG", "MISSING_PROGRAM", "Answer", "BackendContract", "answering_stand_in"]
