"""The classifier reads the stand-ins' real output, run as real processes by the core runner."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridgate.core.model import CommandResult
from gridgate.core.runner import run
from gridgate.plugins.wms_glite.classify import Rule, classify

HOST = "wms01.example.org"
EP = f"https://{HOST}:7443/glite_wms_wmproxy_server"


@pytest.fixture
def run_sim(
    tmp_path: Path, scenario: Callable[..., Path], sim_bin: Path
) -> Callable[..., CommandResult]:
    jdl = tmp_path / "job.jdl"
    jdl.write_text('[\n  Executable = "pilot.sh";\n]\n')

    def go(
        spec: dict[str, Any],
        command: str = "glite-wms-job-submit",
        extra: tuple[str, ...] = (),
        timeout: float = 10.0,
    ) -> CommandResult:
        path = scenario(hosts={HOST: spec})
        env = {**os.environ, "GRIDGATE_SIM_SCENARIO": str(path)}
        argv = [str(sim_bin / command), "--noint", "--endpoint", EP, "-a", *extra, str(jdl)]
        return run(argv, timeout, env=env, kill_grace=0.5)

    return go


@pytest.mark.parametrize(
    ("spec", "command", "kind", "exclude", "notify", "quoted"),
    [
        (
            {"behaviour": "overloaded"},
            "glite-wms-job-submit",
            "overload",
            True,
            False,
            "Detected value for Load Average(15 min): 23.51",
        ),
        (
            {"behaviour": "overloaded"},
            "glite-wms-job-list-match",
            "overload",
            True,
            False,
            "System load is too high:",
        ),
        (
            {"behaviour": "drained"},
            "glite-wms-job-submit",
            "drained",
            True,
            False,
            "temporarily drained",
        ),
        (
            {"behaviour": "unreachable"},
            "glite-wms-job-submit",
            "unreachable",
            True,
            True,
            "WMProxy unreachable",
        ),
        (
            {"behaviour": "auth"},
            "glite-wms-job-submit",
            "auth",
            True,
            True,
            "No path to valid proxy file has been found",
        ),
        (
            {"behaviour": "auth", "auth": "delegation"},
            "glite-wms-job-list-match",
            "auth",
            True,
            True,
            "Unable to delegate the credential",
        ),
        (
            {"behaviour": "usage"},
            "glite-wms-job-submit",
            "usage",
            True,
            True,
            "unrecognized option",
        ),
        ({"behaviour": "garbage"}, "glite-wms-job-submit", "bad_output", True, True, "exit 0"),
        (
            {"behaviour": "error", "message": "SOAP-ENV:Server: boom"},
            "glite-wms-job-submit",
            "error",
            True,
            True,
            "glite_wms_wmproxy_server / SOAP-ENV:Server: boom",
        ),
    ],
)
def test_each_behaviour_is_classified(
    run_sim: Callable[..., CommandResult],
    spec: dict[str, Any],
    command: str,
    kind: str,
    exclude: bool,
    notify: bool,
    quoted: str,
) -> None:
    result = run_sim(spec, command)
    assert not result.ok or kind == "bad_output"
    failure = classify(result)
    assert (failure.kind, failure.exclude, failure.notify) == (kind, exclude, notify), failure
    assert quoted in failure.reason
    assert "\n" not in failure.reason


def test_exit_codes_match_the_real_client(run_sim: Callable[..., CommandResult]) -> None:
    assert run_sim({"behaviour": "overloaded"}).returncode == 1
    assert run_sim({"behaviour": "usage"}).returncode == 255
    assert run_sim({"behaviour": "garbage"}).returncode == 0
    both = run_sim({"behaviour": "healthy"}, extra=("-d", "mydeleg"))
    assert both.returncode == 255
    assert "cannot be specified together" in both.stderr
    assert classify(both).kind == "usage"


def test_hang_is_a_timeout_with_partial_output(run_sim: Callable[..., CommandResult]) -> None:
    # 4 s: long enough for the Python stand-in to start and print on a loaded 2-core machine
    result = run_sim({"behaviour": "print_then_hang"}, timeout=4.0)
    assert result.timed_out and f"Connecting to the service {EP}" in result.stdout
    failure = classify(result)
    assert failure.kind == "timeout" and failure.notify and failure.exclude
    assert "Success" in failure.reason  # the last line it printed before hanging is quoted


def test_missing_command_is_launch() -> None:
    result = run(["/nonexistent/glite-wms-job-submit", "--noint"], 2.0)
    failure = classify(result)
    assert failure.kind == "launch" and not failure.transient
    assert "glite-wms-job-submit" in failure.reason


def test_site_rules_come_first(run_sim: Callable[..., CommandResult]) -> None:
    result = run_sim({"behaviour": "overloaded"})
    rules = [
        Rule(
            "site_overload",
            re.compile(r"Load Average"),
            stream="stderr",
            returncode=1,
            exclude=False,
            notify=True,
        )
    ]
    failure = classify(result, rules)
    assert (failure.kind, failure.exclude, failure.notify) == ("site_overload", False, True)
    assert failure.reason.startswith("site rule:")
    # Same pattern on the wrong stream or the wrong exit code does not match.
    assert (
        classify(result, [Rule("x", re.compile("Load Average"), stream="stdout")]).kind
        == "overload"
    )
    assert (
        classify(result, [Rule("x", re.compile("Load Average"), returncode=2)]).kind == "overload"
    )


def test_no_command_is_the_sites_config_and_keeps_the_server() -> None:
    failure = classify(None, message="cannot build the JDL: arguments: control character")
    assert failure.kind == "config" and not failure.exclude
    assert "control character" in failure.reason


def test_long_lines_are_clipped() -> None:
    result = CommandResult(("x",), 1, stderr="\nError - Operation failed\n" + "y" * 5000 + "\n\n")
    failure = classify(result)
    assert failure.kind == "error" and len(failure.reason) < 300


_text = st.one_of(
    st.text(),
    st.binary().map(lambda b: b.decode("utf-8", errors="replace")),
    st.sampled_from(
        ["\nError - Operation failed\n", "System load is too high:\n", "Error - x", ":", ""]
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    stdout=_text,
    stderr=_text,
    returncode=st.one_of(st.none(), st.integers(-300, 300)),
    timed_out=st.booleans(),
    launch=st.one_of(st.none(), st.text(max_size=20)),
)
def test_classify_never_raises_and_reason_is_one_line(
    stdout: str, stderr: str, returncode: int | None, timed_out: bool, launch: str | None
) -> None:
    result = CommandResult(
        ("glite-wms-job-submit",),
        returncode,
        stdout,
        stderr,
        timed_out=timed_out,
        launch_error=launch,
    )
    rules = [Rule("site", re.compile("x{3}"), stream="any")]
    failure = classify(result, rules)
    assert failure.kind and failure.reason
    assert "\n" not in failure.reason and len(failure.reason) < 500
