"""GliteBackend through pluggy hooks against the stand-ins on a private PATH."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from gridgate.core.clock import FakeClock
from gridgate.core.config import apply_defaults
from gridgate.core.model import Endpoint, SubmitRequest, SubmitResult
from gridgate.plugins.wms_glite.backend import GliteBackend
from gridgate.plugins.wms_glite.sim import read_calls

H1, H2 = "wms01.example.org", "wms02.example.org"


def ep(host: str = H1) -> Endpoint:
    return Endpoint("wms_glite", host, f"https://{host}:7443/glite_wms_wmproxy_server")


def request(**kw: Any) -> SubmitRequest:
    return SubmitRequest("wms_glite", **kw)


def classify(pm: Any, result: SubmitResult) -> Any:
    return pm.hook.gridgate_classify_failure(endpoint=result.endpoint, result=result)


def jdl_files(tmp_path: Path) -> list[Path]:
    return list(tmp_path.glob("*.jdl"))


# --- gridgate_backend_info ---------------------------------------------------------------------


def test_gridgate_backend_info(make_backend: Any) -> None:
    pm, _ = make_backend(
        hosts={H1: {}},
        pilots_per_jdl=4,
        command_timeout=7.5,
        servers=[H1, "https://wms09.example.org:8443/custom_path"],
    )
    info = pm.hook.gridgate_backend_info(backend="wms_glite")
    assert info.pilots_per_submission == 4 and info.command_timeout == 7.5
    assert info.list_match is True
    assert info.endpoints == (
        Endpoint("wms_glite", H1, f"https://{H1}:7443/glite_wms_wmproxy_server"),
        Endpoint("wms_glite", "wms09.example.org", "https://wms09.example.org:8443/custom_path"),
    )
    assert pm.hook.gridgate_backend_info(backend="lsf") is None


def test_hooks_ignore_other_backends(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {}})
    other = Endpoint("lsf", "queue")
    assert pm.hook.gridgate_submit(endpoint=other, request=request(), timeout=2) is None
    assert pm.hook.gridgate_list_match(endpoint=other, request=request(), timeout=2) is None
    assert (
        pm.hook.gridgate_classify_failure(endpoint=other, result=SubmitResult(other, ok=False))
        is None
    )


# --- gridgate_submit ---------------------------------------------------------------------------


@pytest.mark.parametrize("output_format", ["text", "nomsg", "json"])
def test_gridgate_submit_success(
    make_backend: Any, calls_log: Path, tmp_path: Path, output_format: str
) -> None:
    pm, _ = make_backend(hosts={H1: {}}, output_format=output_format)
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=10)
    assert result.ok and result.operation == "Job Submit", result
    assert len(result.job_ids) == 1
    assert result.job_ids[0].startswith("https://lb01.example.org:9000/")
    assert len(result.job_ids[0].rsplit("/", 1)[1]) == 22
    (call,) = read_calls(calls_log)
    assert call.host == H1 and call.command == "glite-wms-job-submit"
    assert call.argv[1:5] == ("--noint", "--endpoint", ep().url, "-a")
    assert {"text": (), "nomsg": ("--nomsg",), "json": ("--json",)}[output_format] == call.argv[
        5:-1
    ]
    assert jdl_files(tmp_path) == []  # the private JDL is removed afterwards


def test_submit_uses_delegation_id_and_config_file(make_backend: Any, calls_log: Path) -> None:
    pm, _ = make_backend(hosts={H1: {}}, delegation="pilot-deleg.1", config_file="/etc/wms.conf")
    assert pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=10).ok
    (call,) = read_calls(calls_log)
    assert call.argv[4:8] == ("-d", "pilot-deleg.1", "-c", "/etc/wms.conf")
    assert "-a" not in call.argv


def test_endpoint_without_url_gets_the_default_one(make_backend: Any) -> None:
    _, backend = make_backend(hosts={H1: {}})
    argv = backend.argv("Job Submit", Endpoint("wms_glite", H1), "/x.jdl")
    assert argv[2:4] == ["--endpoint", f"https://{H1}:7443/glite_wms_wmproxy_server"]


def test_jdl_file_is_private_while_the_command_runs(
    make_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    pm, _ = make_backend(hosts={H1: {}})
    from gridgate.core import runner

    real_run = runner.run

    def spy(argv: Any, timeout: float, **kw: Any) -> Any:
        seen.append(stat.S_IMODE(os.stat(argv[-1]).st_mode))
        return real_run(argv, timeout, **kw)

    # Only observes the file; the stand-in still really runs.
    monkeypatch.setattr(runner, "run", spy)
    assert pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=10).ok
    assert seen == [0o600]


def test_parametric_submit_returns_children_with_json(make_backend: Any, calls_log: Path) -> None:
    pm, _ = make_backend(hosts={H1: {}}, output_format="json", pilots_per_jdl=3)
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(count=3), timeout=10)
    assert result.ok and len(result.job_ids) == 3 and len(set(result.job_ids)) == 3
    (call,) = read_calls(calls_log)
    assert 'JobType = "Parametric";' in call.jdl and "Parameters = 3;" in call.jdl


def test_parametric_submit_returns_the_parent_with_text(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {}})
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(count=3), timeout=10)
    assert result.ok and len(result.job_ids) == 1


def test_jdl_value_with_quotes_and_command_substitution_stays_literal(
    make_backend: Any, calls_log: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    nasty = f'x" ; $(touch {marker}) `touch {marker}` \\" {marker}'
    pm, _ = make_backend(hosts={H1: {}}, arguments=nasty, vo=f"$(touch {marker})")
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=10)
    assert result.ok
    assert not marker.exists()
    (call,) = read_calls(calls_log)
    assert f"$(touch {marker})" in call.jdl
    assert 'Arguments = "x\\" ; $(touch' in call.jdl


@pytest.mark.parametrize(
    ("behaviour", "kind", "notify"),
    [
        ("overloaded", "overload", False),
        ("drained", "drained", False),
        ("unreachable", "unreachable", True),
        ("auth", "auth", True),
        ("usage", "usage", True),
        ("garbage", "bad_output", True),
        ("error", "error", True),
    ],
)
def test_gridgate_classify_failure(
    make_backend: Any, behaviour: str, kind: str, notify: bool
) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": behaviour}})
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=10)
    assert not result.ok and result.command is not None and result.job_ids == ()
    failure = classify(pm, result)
    assert failure.kind == kind and failure.notify is notify and failure.exclude
    assert failure.reason


def test_hang_is_killed_at_the_deadline_with_partial_output(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": "print_then_hang"}})
    started = time.monotonic()
    # 4 s: long enough for the Python stand-in to start and print on a loaded 2-core machine
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=4.0)
    elapsed = time.monotonic() - started
    assert result.command.timed_out and not result.ok
    assert "Connecting to the service" in result.command.stdout
    assert elapsed < 4.0 + 2.0 + 10.0  # deadline + kill grace + generous slack, not 3600 s
    assert classify(pm, result).kind == "timeout"


def test_hang_before_print_is_a_timeout_without_output(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": "hang_before_print"}})
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=1.0)
    assert result.command.timed_out and result.command.stdout == ""
    failure = classify(pm, result)
    assert failure.kind == "timeout" and "no output" in failure.reason


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone for our purpose; read its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("parent_hangs", [True, False])
def test_grandchild_holding_the_pipes_does_not_hold_the_submission(
    make_backend: Any, calls_log: Path, parent_hangs: bool
) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": "grandchild", "parent_hangs": parent_hangs}})
    started = time.monotonic()
    # 5 s: the stand-in must start its grandchild and log it before the deadline, loaded or not
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=5.0)
    assert time.monotonic() - started < 5.0 + 2.0 + 10.0
    assert not result.ok
    (call,) = read_calls(calls_log)
    assert call.grandchild is not None
    deadline = time.monotonic() + 5
    while not _gone(call.grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL delivery is asynchronous; this polls, it is no expiry wait
    assert _gone(call.grandchild), "the grandchild outlived the submission"
    kind = classify(pm, result).kind
    assert kind == ("timeout" if parent_hangs else "bad_output")


def test_fifty_megabytes_of_garbage_is_capped_and_classified(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": "garbage", "garbage_bytes": 50 * 1024 * 1024}})
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=30)
    assert not result.ok and result.command.returncode == 0
    assert result.command.stdout_truncated
    assert len(result.command.stdout.encode("utf-8", "replace")) <= 3 * 4 * 1024 * 1024
    failure = classify(pm, result)
    assert failure.kind == "bad_output" and len(failure.reason) < 300


def test_missing_command_is_launch(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {}}, commands={"submit": "glite-wms-job-submit-nowhere"})
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=2)
    assert not result.ok and result.command.launch_error
    failure = classify(pm, result)
    assert failure.kind == "launch" and "glite-wms-job-submit-nowhere" in failure.reason


def test_site_rule_from_config(make_backend: Any) -> None:
    pm, _ = make_backend(
        hosts={H1: {"behaviour": "error", "message": "SOAP-ENV:Server: quota"}},
        rules=[
            {
                "kind": "quota",
                "pattern": r"SOAP-ENV:Server: quota",
                "stream": "stderr",
                "exclude": False,
                "notify": False,
            }
        ],
    )
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=10)
    failure = classify(pm, result)
    assert (failure.kind, failure.exclude, failure.notify) == ("quota", False, False)


def test_bad_request_requirements_run_nothing(make_backend: Any, calls_log: Path) -> None:
    pm, _ = make_backend(hosts={H1: {}})
    result = pm.hook.gridgate_submit(
        endpoint=ep(), request=request(requirements='true; Executable = "/bin/evil"'), timeout=10
    )
    assert not result.ok and result.command is None and "Requirements" not in result.message
    assert "request.requirements" in result.message
    assert read_calls(calls_log) == []
    failure = classify(pm, result)
    assert failure.kind == "config" and not failure.exclude


def test_backend_command_timeout_replaces_the_passed_one(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": "hang_before_print"}}, command_timeout=0.5)
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=60)
    assert result.command.timed_out and result.command.duration < 10


def test_no_time_left_is_a_timeout_not_an_exception(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": "hang_before_print"}})
    result = pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=0)
    assert not result.ok and result.command.timed_out


# --- gridgate_list_match -----------------------------------------------------------------------


def test_gridgate_list_match_is_cached_then_expires(
    make_backend: Any, calls_log: Path, clock: FakeClock
) -> None:
    pm, _ = make_backend(
        hosts={H1: {"ces": ["ce9.example.org:8443/cream-slurm-long"]}, H2: {}}, list_match_cache=900
    )
    first = pm.hook.gridgate_list_match(endpoint=ep(), request=request(), timeout=10)
    assert first.ok and not first.cached
    assert first.resources == ("ce9.example.org:8443/cream-slurm-long",)
    again = pm.hook.gridgate_list_match(endpoint=ep(), request=request(), timeout=10)
    assert again.cached and again.resources == first.resources
    assert len(read_calls(calls_log)) == 1
    # Another server, or other requirements, is another cache entry.
    assert not pm.hook.gridgate_list_match(endpoint=ep(H2), request=request(), timeout=10).cached
    other = request(requirements='other.GlueCEUniqueID == "x"')
    assert not pm.hook.gridgate_list_match(endpoint=ep(), request=other, timeout=10).cached
    assert len(read_calls(calls_log)) == 3
    clock.advance(899)
    assert pm.hook.gridgate_list_match(endpoint=ep(), request=request(), timeout=10).cached
    clock.advance(2)
    expired = pm.hook.gridgate_list_match(endpoint=ep(), request=request(), timeout=10)
    assert not expired.cached and expired.ok
    assert len(read_calls(calls_log)) == 4


def test_list_match_failures_are_never_cached(make_backend: Any, calls_log: Path) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": "unreachable"}})
    for _ in range(2):
        result = pm.hook.gridgate_list_match(endpoint=ep(), request=request(), timeout=10)
        assert not result.ok and not result.cached
    assert len(read_calls(calls_log)) == 2
    failure = classify(
        pm, SubmitResult(ep(), ok=False, command=result.command, operation="List Match")
    )
    assert failure.kind == "unreachable"


def test_no_match_is_not_a_failure(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": "no_match"}})
    result = pm.hook.gridgate_list_match(endpoint=ep(), request=request(), timeout=10)
    assert result.ok and result.resources == ()
    # A no-match host still takes submissions (the WMS matches again later).
    assert pm.hook.gridgate_submit(endpoint=ep(), request=request(), timeout=10).ok


def test_list_match_garbage_is_bad_output(make_backend: Any) -> None:
    pm, _ = make_backend(hosts={H1: {"behaviour": "garbage"}})
    result = pm.hook.gridgate_list_match(endpoint=ep(), request=request(), timeout=10)
    assert not result.ok and result.command.returncode == 0
    failure = classify(
        pm, SubmitResult(ep(), ok=False, command=result.command, operation="List Match")
    )
    assert failure.kind == "bad_output" and "CE list" in failure.reason


def test_list_match_default_is_exposed_for_the_director(make_backend: Any) -> None:
    _, backend = make_backend(hosts={H1: {}})
    assert backend.config["list_match"] is True
    pm, off = make_backend(hosts={H1: {}}, list_match=False)
    assert off.config["list_match"] is False
    assert pm.hook.gridgate_backend_info(backend="wms_glite").list_match is False


# --- config ------------------------------------------------------------------------------------


def test_config_defaults_and_schema() -> None:
    section: dict[str, Any] = {}
    apply_defaults(section, GliteBackend.config_schema)
    assert section["commands"] == {
        "submit": "glite-wms-job-submit",
        "list_match": "glite-wms-job-list-match",
        "status": None,
        "cancel": None,
        "output": None,
    }
    assert section["list_match_cache"] == 900 and section["delegation"] == "auto"
    for key, sub in GliteBackend.config_schema["properties"].items():
        assert sub.get("description"), key


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        (
            {"servers": ["wms01.example.org", "https://wms01.example.org:7443/x"]},
            ("servers", 1),
            "duplicate server",
        ),
        ({"servers": ["not a host"]}, ("servers", 0), "neither a host name"),
        ({"servers": ["http://wms01.example.org/x"]}, ("servers", 0), "https://"),
        ({"delegation": "bad id;rm"}, ("delegation",), "delegation id"),
        ({"requirements": 'true; Executable = "x"'}, ("requirements",), "would end the expression"),
        ({"arguments": "a\x01b"}, ("arguments",), "control character"),
        ({"extra_attributes": {"Executable": "x"}}, ("extra_attributes", "Executable"), "gridgate"),
        ({"rules": [{"kind": "x", "pattern": "("}]}, ("rules", 0, "pattern"), "invalid regex"),
    ],
)
def test_config_errors(section: dict[str, Any], path: tuple[Any, ...], message: str) -> None:
    problems = GliteBackend.config_errors(section)
    assert any(p == path and message in m for p, m in problems), problems


def test_config_errors_accept_a_good_section() -> None:
    assert (
        GliteBackend.config_errors(
            {
                "servers": [
                    "wms01.example.org",
                    "https://wms02.example.org:7443/glite_wms_wmproxy_server",
                ],
                "delegation": "pilot.deleg-1",
                "requirements": 'other.X == "a;b"',
                "extra_attributes": {"CPUTime": 1},
            }
        )
        == []
    )
