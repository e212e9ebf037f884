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

Import it as ``from gridgate.core.testing import BackendContract`` (pytest is needed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from gridgate.core.clock import FakeClock
from gridgate.core.config import ConfigError
from gridgate.core.defaults import RuleClassifier
from gridgate.core.kinds import KINDS
from gridgate.core.model import BackendInfo, Endpoint, Failure, SubmitRequest, SubmitResult
from gridgate.core.state import MemoryState
from gridgate.core.testing import build_plugin, plugin_manager_with, section_for, stand_in_command

#: A program that does not exist, for the launch-failure check.
MISSING_PROGRAM = "/nonexistent/gridgate-contract/submit"


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie has: only its exit status remains)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


class BackendContract:
    """The backend contract as tests. Set the class attributes and :meth:`section`.

    Every check builds a fresh backend whose command is a stand-in program written in
    ``tmp_path`` (see :func:`~gridgate.core.testing.stand_in_command`).
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
    #: seconds given as the deadline in the deadline check
    deadline: ClassVar[float] = 3.0

    def section(self, program: str, tmp_path: Path) -> dict[str, Any]:
        """Your backend's config section with ``program`` as the command it runs."""
        raise NotImplementedError("give the section that makes your backend run `program`")

    def make_backend(
        self, program: str, tmp_path: Path, max_output_bytes: int | None = None
    ) -> Any:
        """Your backend built with :meth:`section` (override for more set-up)."""
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

    # --- helpers ------------------------------------------------------------------------------

    def _info(self, backend: Any) -> BackendInfo:
        info = backend.gridgate_backend_info(backend=self.name)
        assert isinstance(info, BackendInfo), f"gridgate_backend_info({self.name!r}) gave {info!r}"
        return info

    def _submit(self, backend: Any, timeout: float = 30.0) -> SubmitResult:
        endpoint = self._info(backend).endpoints[0]
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
        program = self._stand_in(tmp_path, stdout="started\n", sleep=600)
        backend = self.make_backend(str(program), tmp_path)
        result = self._submit(backend, timeout=self.deadline)
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
        program = self._stand_in(tmp_path, stdout="x" * 200_000 + "\n", exit_code=1)
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

    def stand_in_calls(self, tmp_path: Path) -> int:
        calls = tmp_path / "bin" / ".contract-command.calls"
        return len(calls.read_text(encoding="utf-8").splitlines()) if calls.exists() else 0


__all__ = ["MISSING_PROGRAM", "BackendContract"]
