"""`gridgate plugin new` writes a package that installs with `pip install -e` into a virtual
environment of its own and whose own tests pass there at once: for each kind (and both shapes
of a backend), created in a temp folder, installed as its README says, its tests run there,
`gridgate plugins` of that environment lists it and the development venv never sees it; both
backends also run end to end through their entry points with `gridgate run`, from another
working directory (the config's relative paths are the config file's).

The plugin's venv: `python -m venv --without-pip`, then this checkout's gridgate and the new
package installed into it editable with `pip --python VENV install --no-deps
--no-build-isolation -e`, the two installs the README names. Their dependencies (click,
pluggy, jsonschema, pytest, setuptools...) come from the development venv's site folder, named
as a plain path in a `.pth` file: offline and a few seconds, where installing them from PyPI
would need the network and a minute. `--system-site-packages` cannot do this: a venv made
from the development venv's python is based on the base interpreter, so the "system" it would
see is /usr's, not the development venv's. A plain path line (not `site.addsitedir`) leaves the
`.pth` files of that folder unread, so the development venv's own editable gridgate is not
imported: gridgate comes from the plugin venv's install only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GRIDGATE = str(Path(sys.executable).with_name("gridgate"))
GROUPS = {
    "backend": "gridgate.backends",
    "notifier": "gridgate.notifiers",
    "classifier": "gridgate.classifiers",
}


def _install(python: Path, *packages: Path) -> None:
    """``pip install -e`` each of ``packages`` into the venv of ``python`` (not this one)."""
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
    ]
    editable = [word for package in packages for word in ("-e", str(package))]
    offline = subprocess.run(
        [*base, "--no-build-isolation", *editable], capture_output=True, text=True, timeout=300
    )
    if offline.returncode == 0:
        return
    # this environment's setuptools could not build: let pip fetch a build backend
    isolated = subprocess.run([*base, *editable], capture_output=True, text=True, timeout=300)
    assert isolated.returncode == 0, (
        f"pip install -e failed\n--- without build isolation:\n{offline.stderr[-3000:]}"
        f"\n--- with build isolation:\n{isolated.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv of the plugins' own, with this checkout's gridgate installed in it
    (see the module's docstring for how, and why so)."""
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
    Path(site, "gridgate-dependencies.pth").write_text(f"{host}\n", encoding="utf-8")
    _install(python, ROOT)
    assert (folder / "bin" / "gridgate").is_file(), "gridgate's console script in the venv"
    return python


def _new(kind: str, name: str, folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GRIDGATE, "plugin", "new", "--kind", kind, *options, name, str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _in_venv(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The venv's own ``gridgate`` console script."""
    return subprocess.run(
        [str(venv.with_name("gridgate")), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("kind", "shape"),
    [("backend", "command"), ("backend", "batch"), ("notifier", None), ("classifier", None)],
)
def test_the_new_package_installs_in_its_own_venv_and_passes_its_own_tests(
    kind: str, shape: str | None, venv: Path, tmp_path: Path
) -> None:
    name = f"my{shape or kind}"
    package = tmp_path / f"gridgate-{name}"
    made = _new(kind, name, package, *(("--shape", shape) if shape else ()))
    assert made.returncode == 0, made.stderr
    # what to type next: a venv of the plugin's own, never the one this gridgate runs in
    steps = made.stdout.splitlines()
    assert "python3 -m venv .venv" in steps and f".venv/bin/pip install -e {ROOT}" in steps
    assert ".venv/bin/pip install -e '.[test]'" in steps and sys.executable not in made.stdout
    readme = (package / "README.md").read_text(encoding="utf-8")
    assert "python3 -m venv .venv" in readme and f".venv/bin/pip install -e {ROOT}" in readme
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
    listed = _in_venv(venv, "plugins", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    [row] = [r for r in json.loads(listed.stdout)[GROUPS[kind]] if r["name"] == name]
    assert row["distribution"] == f"gridgate-{name}"
    # the development venv is untouched: it does not have the plugin
    here = subprocess.run(
        [GRIDGATE, "plugins", "--json"], capture_output=True, text=True, timeout=120, check=True
    )
    assert name not in [r["name"] for r in json.loads(here.stdout)[GROUPS[kind]]]


def test_the_new_backend_runs_its_stand_in_through_its_entry_point(
    venv: Path, tmp_path: Path
) -> None:
    package = tmp_path / "gridgate-myrun"
    assert _new("backend", "myrun", package).returncode == 0
    # the generated backend is written on core's base class: its typed methods, no raw hooks
    [source] = [
        p for p in package.rglob("*.py") if "class " in p.read_text() and "tests" not in p.parts
    ]
    text = source.read_text()
    assert "(Backend):" in text and "def submit(" in text and "@hookimpl" not in text
    assert 'name = "myrun"' in text and 'endpoints_key = "endpoints"' in text
    assert '"command_timeout": command_timeout_schema()' in text
    _install(venv, package)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # from another folder: the stand-in and the state folder are site.yaml's neighbours
    done = _in_venv(
        venv, "run", "--once", "--json", "-c", str(package / "site.yaml"), cwd=elsewhere
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.splitlines()[-1])
    assert doc["pilots_submitted"] == 3 and doc["failures"] == []
    assert {s["endpoint"] for s in doc["submitted"]} <= {"queue1", "queue2"}
    assert all(len(s["job_ids"]) == 1 for s in doc["submitted"])
    assert list(elsewhere.iterdir()) == []


def test_the_batch_backend_submits_tracks_and_sees_its_jobs_finish(
    venv: Path, tmp_path: Path
) -> None:
    package = tmp_path / "gridgate-mysched"
    assert _new("backend", "mysched", package, "--shape", "batch").returncode == 0
    text = (package / "src" / "gridgate_mysched" / "backend.py").read_text(encoding="utf-8")
    assert 'name = "mysched"' in text and 'endpoints_key = "queues"' in text
    assert text.count("self.run(") == 3 and text.count("self.deadline(timeout)") == 3
    _install(venv, package)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    site = str(package / "site.yaml")
    ran = _in_venv(venv, "run", "--iterations", "4", "--json", "-c", site, cwd=elsewhere)
    assert ran.returncode == 0, ran.stderr[-3000:]
    last = json.loads(ran.stdout.splitlines()[-1])
    states: dict[str, int] = {}
    for counts in last["pilots"]["states"].values():
        for state, n in counts.items():
            states[state] = states.get(state, 0) + n
    # each job waits one poll, runs one, then finishes; every third fails
    assert states["done"] >= 1 and states["failed"] >= 1 and states["running"] >= 1, states
    assert states["unknown"] == states["lost"] == 0 and last["failures"] == []
    listed = _in_venv(venv, "pilots", "list", "--json", "-c", site, cwd=elsewhere)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert (package / "gridgate-state" / "state.db").is_file() and list(elsewhere.iterdir()) == []


def test_a_bad_name_a_shape_of_no_backend_or_a_folder_in_use_writes_nothing(
    tmp_path: Path,
) -> None:
    bad = _new("backend", "My-Batch", tmp_path / "x")
    assert bad.returncode == 2 and "lower-case" in bad.stderr and not (tmp_path / "x").exists()
    shape = _new("notifier", "pager", tmp_path / "y", "--shape", "batch")
    assert shape.returncode == 2 and "shape of a backend" in shape.stderr
    assert not (tmp_path / "y").exists()
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine\n", encoding="utf-8")
    again = _new("notifier", "pager", used)
    assert again.returncode == 2 and "not empty" in again.stderr
    assert [p.name for p in used.iterdir()] == ["keep.txt"]
    shutil.rmtree(used)
