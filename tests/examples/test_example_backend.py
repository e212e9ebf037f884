"""The out-of-tree example backend loads like any third-party plugin: installed (not editable)
into a private folder, found through its entry point, driven by config alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gridgate.core.testing import stand_in_command

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gridgate-example-backend"
DISTRIBUTION = "gridgate-example-backend"


def _pip_install(source: Path, target: Path) -> None:
    base = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-input",
        "--disable-pip-version-check",
        "--target",
        str(target),
    ]
    # Offline first (this environment's setuptools); when it cannot build a wheel (no
    # `wheel` package next to an old setuptools), let pip fetch the build backend.
    offline = subprocess.run(
        [*base, "--no-build-isolation", str(source)], capture_output=True, text=True, timeout=300
    )
    if offline.returncode == 0:
        return
    shutil.rmtree(target, ignore_errors=True)
    isolated = subprocess.run([*base, str(source)], capture_output=True, text=True, timeout=300)
    assert isolated.returncode == 0, (
        f"pip install failed\n--- without build isolation:\n{offline.stderr[-3000:]}"
        f"\n--- with build isolation:\n{isolated.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(site folder holding the installed package, copy of the example's sources)."""
    work = tmp_path_factory.mktemp("example-backend")
    source = work / "src-copy"
    # build from a copy: setuptools writes build/ and *.egg-info next to the sources
    shutil.copytree(
        EXAMPLE,
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"),
    )
    target = work / "site"
    _pip_install(source, target)
    assert (target / "gridgate_example_backend" / "backend.py").is_file()
    assert not (target / "gridgate_example_backend" / "__editable__").exists()
    return target, source


def _gridgate(
    exe: str, *args: str, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run ``gridgate``; if it hangs, fail with where its threads were (faulthandler on SIGABRT).

    Twice, with two full suites on the 2 cores, a call here printed its result and then did not
    exit within 60 s; this is how the next occurrence will say where it stood."""
    argv = [exe, *args]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONFAULTHANDLER": "1"},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = _proc_state(proc.pid)  # R running, S sleeping, D in the kernel (disk)
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(
            f"{argv} still running after {timeout} s (state {state}); "
            f"stdout so far: {out[-2000:]!r}\nits threads at SIGABRT:\n{err[-6000:]}"
        )
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _env(target: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if target is not None:
        env["PYTHONPATH"] = str(target)
    return env


def _site_config(tmp_path: Path, pilots: int = 4) -> Path:
    pilot = stand_in_command(tmp_path / "bin", "pilot", stdout="booting\nJOBID local-{call}\n")
    doc = {
        "director": {"state_dir": str(tmp_path / "state"), "command_timeout": 30, "max_threads": 2},
        "state": {"driver": "memory"},
        "backends": {
            "local": {
                "command": [str(pilot), "--slot", "{slot}", "--n", "{count}"],
                "servers": ["slot-a", "slot-b"],
            }
        },
        "demand": {"static": {"local": pilots}},
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def test_run_once_submits_through_the_installed_local_backend(
    installed, gridgate_exe, tmp_path
) -> None:
    target, _ = installed
    site = _site_config(tmp_path, pilots=4)
    done = _gridgate(gridgate_exe, "run", "--once", "--json", "-c", str(site), env=_env(target))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["failures"] == [] and summary["pilots_submitted"] == 4
    assert {s["backend"] for s in summary["submitted"]} == {"local"}
    assert {s["endpoint"] for s in summary["submitted"]} <= {"slot-a", "slot-b"}
    job_ids = sorted(i for s in summary["submitted"] for i in s["job_ids"])
    assert job_ids == ["local-1", "local-2", "local-3", "local-4"]
    calls = [
        json.loads(line)["argv"]
        for line in (tmp_path / "bin" / ".pilot.calls").read_text().splitlines()
    ]
    assert len(calls) == 4
    assert all(
        c[0] == "--slot" and c[1] in ("slot-a", "slot-b") and c[2:] == ["--n", "1"] for c in calls
    )


def test_plugins_lists_it_with_its_distribution(installed, gridgate_exe) -> None:
    target, _ = installed
    done = _gridgate(gridgate_exe, "plugins", "--json", env=_env(target))
    assert done.returncode == 0, done.stderr
    backends = {row["name"]: row for row in json.loads(done.stdout)["gridgate.backends"]}
    assert backends["local"]["distribution"] == DISTRIBUTION
    assert backends["local"]["version"] == "0.1.0"
    assert backends["local"]["target"] == "gridgate_example_backend.backend:LocalBackend"
    assert backends["local"]["default"] is False


def test_config_validate_checks_its_section_through_the_installed_schema(
    installed, gridgate_exe, tmp_path
) -> None:
    target, _ = installed
    site = _site_config(tmp_path)
    doc = yaml.safe_load(site.read_text())
    doc["backends"]["local"]["command"].append("{slott}")
    doc["backends"]["local"]["servers"] = "slot-a"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    ok = _gridgate(gridgate_exe, "config", "validate", str(site), env=_env(target))
    assert ok.returncode == 0, ok.stderr
    refused = _gridgate(gridgate_exe, "config", "validate", str(bad), env=_env(target))
    assert refused.returncode == 2
    assert "backends.local.servers" in refused.stderr


def test_without_it_installed_a_config_naming_it_fails_with_exit_2(
    installed, gridgate_exe, tmp_path
) -> None:
    site = _site_config(tmp_path)
    for argv in (["run", "--once", "--json", "-c", str(site)], ["config", "validate", str(site)]):
        done = _gridgate(gridgate_exe, *argv, env=_env(None), timeout=120)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "'local'" in done.stderr and "not installed" in done.stderr, done.stderr
        assert "backends.local" in done.stderr
        assert ": valid" not in done.stdout
    assert not (tmp_path / "bin" / ".pilot.calls").exists()  # nothing ran


#: The example's own test outcomes as measured on API 1.4, before the layout step of 1.5 moved
#: core's internals: a plugin written for an earlier 1.x must give the same results.
OUTCOMES = Path(__file__).with_name("example_backend_outcomes.txt")


def test_its_own_tests_pass_against_the_installed_package(installed, tmp_path) -> None:
    target, source = installed
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            str(source / "tests"),
        ],
        cwd=source,
        capture_output=True,
        text=True,
        env=_env(target),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
    outcomes = sorted(
        line.replace(str(source / "tests"), "tests").strip()
        for line in done.stdout.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "ERROR ", "SKIPPED "))
    )
    recorded = sorted(
        line
        for line in OUTCOMES.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    )
    assert outcomes == recorded
