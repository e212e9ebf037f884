"""`gridgate plugin new` writes a package that installs with `pip install -e` and whose own
tests pass at once: for each kind, created in a temp folder, installed editable into a fresh
venv that sees this project's packages, its tests run there; the backend also runs end to end
through its entry point with `gridgate run --once`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

GRIDGATE = str(Path(sys.executable).with_name("gridgate"))
CLI = "import sys; from gridgate.core.cli import main; sys.argv[0] = 'gridgate'; main()"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv without pip of its own whose site folder also reads this project's (gridgate,
    pytest, setuptools): installing a package there leaves the project's venv untouched."""
    folder = tmp_path_factory.mktemp("plugin-venv") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120
    )
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    host = sysconfig.get_paths()["purelib"]
    Path(site, "gridgate-host.pth").write_text(
        f"import site; site.addsitedir({host!r})\n", encoding="utf-8"
    )
    return python


def _install(python: Path, package: Path) -> None:
    base = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "--quiet",
        "--no-deps",
        "--no-input",
        "--disable-pip-version-check",
        "-e",
    ]
    offline = subprocess.run(
        [*base[:-1], "--no-build-isolation", "-e", str(package)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if offline.returncode == 0:
        return
    isolated = subprocess.run([*base, str(package)], capture_output=True, text=True, timeout=300)
    assert isolated.returncode == 0, (
        f"pip install -e failed\n--- without build isolation:\n{offline.stderr[-3000:]}"
        f"\n--- with build isolation:\n{isolated.stderr[-3000:]}"
    )


def _new(kind: str, name: str, folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GRIDGATE, "plugin", "new", "--kind", kind, name, str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("kind", ["backend", "notifier", "classifier"])
def test_the_new_package_installs_and_passes_its_own_tests(
    kind: str, venv: Path, tmp_path: Path
) -> None:
    package = tmp_path / f"gridgate-my{kind}"
    made = _new(kind, f"my{kind}", package)
    assert made.returncode == 0, made.stderr
    assert "pip install -e" in made.stdout
    _install(venv, package)
    tests = subprocess.run(
        [str(venv), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "0"],
        cwd=package,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    assert (
        " passed" in tests.stdout and "failed" not in tests.stdout and "skipped" not in tests.stdout
    )
    plugins = subprocess.run(
        [str(venv), "-c", CLI, "plugins", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    group = {
        "backend": "gridgate.backends",
        "notifier": "gridgate.notifiers",
        "classifier": "gridgate.classifiers",
    }[kind]
    [row] = [r for r in json.loads(plugins.stdout)[group] if r["name"] == f"my{kind}"]
    assert row["distribution"] == f"gridgate-my{kind}"


def test_the_new_backend_runs_its_stand_in_through_its_entry_point(
    venv: Path, tmp_path: Path
) -> None:
    package = tmp_path / "gridgate-mybatch"
    assert _new("backend", "mybatch", package).returncode == 0
    # the generated backend is written on core's base class: its typed methods, no raw hooks
    [source] = [
        p for p in package.rglob("*.py") if "class " in p.read_text() and "tests" not in p.parts
    ]
    text = source.read_text()
    assert "(Backend):" in text and "def submit(" in text and "@hookimpl" not in text
    _install(venv, package)
    done = subprocess.run(
        [str(venv), "-c", CLI, "run", "--once", "--json", "-c", "site.yaml"],
        cwd=package,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.splitlines()[-1])
    assert doc["pilots_submitted"] == 3 and doc["failures"] == []
    assert {s["endpoint"] for s in doc["submitted"]} <= {"queue1", "queue2"}
    assert all(len(s["job_ids"]) == 1 for s in doc["submitted"])


def test_a_bad_name_or_a_folder_in_use_writes_nothing(tmp_path: Path) -> None:
    bad = _new("backend", "My-Batch", tmp_path / "x")
    assert bad.returncode == 2 and "lower-case" in bad.stderr and not (tmp_path / "x").exists()
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine\n", encoding="utf-8")
    again = _new("notifier", "pager", used)
    assert again.returncode == 2 and "not empty" in again.stderr
    assert [p.name for p in used.iterdir()] == ["keep.txt"]
    shutil.rmtree(used)
