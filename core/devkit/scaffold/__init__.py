"""``gridgate plugin new``: writes a plugin package that installs with ``pip install -e`` and
whose own tests pass at once, for a backend, a notifier or a classifier.

The package has a ``pyproject.toml`` with the entry point, a ``src/`` layout, a plugin class
with a schema'd config section, tests written with :mod:`gridgate.core.testing` (a backend's
inherit the backend contract), and for a backend a stand-in of its commands and a
``site.yaml`` that drives it with ``gridgate run``. A backend has one of two shapes: one
submit command (``command``, the default), or submit, status and cancel commands with a
stand-in batch system whose jobs go from waiting to running to done or failed (``batch``).

Its README and the command line's next steps install it into a virtual environment of its
own, with gridgate from the checkout it runs from: never into the environment gridgate runs
in, which may be gridgate's development one.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from string import Template

from gridgate.core import API_VERSION, __version__

KINDS = ("backend", "notifier", "classifier")
#: The shapes of a backend: one submit command, or submit, status and cancel commands.
SHAPES = ("command", "batch")
GROUPS = {
    "backend": "gridgate.backends",
    "notifier": "gridgate.notifiers",
    "classifier": "gridgate.classifiers",
}
#: The templates of the files a new package gets, package data beside this module.
TEMPLATES = Path(__file__).resolve().parent / "templates"
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")  # fullmatch: "$" would take "evil\n"


class ScaffoldError(Exception):
    """The package cannot be written (bad name, folder not empty)."""


#: kind -> (module name, its source's template, its tests' template, class name suffix); the
#: templates are files of this package (``templates/*.tmpl``), filled with ``string.Template``
_KINDS = {
    "backend": ("backend", "backend.py", "test_backend.py", "Backend"),
    "notifier": ("notifier", "notifier.py", "test_notifier.py", "Notifier"),
    "classifier": ("classifier", "classifier.py", "test_classifier.py", "Classifier"),
}
_SECTIONS = {"backend": "backends", "notifier": "notifiers", "classifier": "classifiers"}


def _template(name: str) -> str:
    """The text of the template ``name`` (``templates/NAME.tmpl``, package data)."""
    return (TEMPLATES / f"{name}.tmpl").read_text(encoding="utf-8")


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def gridgate_source() -> tuple[str, str]:
    """What ``pip install -e`` takes to install this gridgate into a plugin's own venv, and
    where that is: the checkout this gridgate runs from, when it runs from one (an editable
    install of the sources), else the released package."""
    checkout = Path(__file__).resolve().parents[3]  # core/ is gridgate.core in a checkout
    pyproject = checkout / "pyproject.toml"
    if pyproject.is_file() and 'name = "gridgate"' in pyproject.read_text(encoding="utf-8"):
        return str(checkout), "from the checkout it runs from"
    return "gridgate", "from PyPI"


def new_plugin(
    kind: str, name: str, folder: Path | None = None, shape: str = "command"
) -> list[Path]:
    """Write the package of a ``kind`` plugin called ``name`` into ``folder`` (default
    ``./gridgate-NAME``, with ``-`` for ``_``); return the files written.

    A backend comes in one of :data:`SHAPES`: ``command`` (one submit command, no tracking)
    or ``batch`` (submit, status and cancel commands, and a history command for finished
    jobs, with a stand-in batch system whose jobs have lifecycles, for its tests and its
    ``site.yaml``).

    :raises ScaffoldError: for a name that is not a lower-case identifier, an unknown kind or
        shape (or a shape other than ``command`` for a kind that is not a backend), or a
        folder that exists and is not empty.
    """
    if kind not in _KINDS:
        raise ScaffoldError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    if shape not in SHAPES:
        raise ScaffoldError(f"unknown shape {shape!r} (one of {', '.join(SHAPES)})")
    if shape != "command" and kind != "backend":
        raise ScaffoldError(f"--shape {shape} is a shape of a backend, not of a {kind}")
    if not NAME_RE.fullmatch(name):
        raise ScaffoldError(
            f"plugin name {name!r}: use lower-case letters, digits and _ "
            "(it is the key a site writes in its YAML)"
        )
    dist = "gridgate-" + name.replace("_", "-")
    folder = Path(folder) if folder is not None else Path(dist)
    if folder.exists() and any(folder.iterdir()):
        raise ScaffoldError(f"{folder} exists and is not empty: nothing was written")
    module, source, tests, suffix = _KINDS[kind]
    batch = shape == "batch"
    if batch:
        source, tests = "batch_backend.py", "test_batch_backend.py"
    source_path, source_where = gridgate_source()
    values = {
        "name": name,
        "kind": kind,
        "dist": dist,
        "package": f"gridgate_{name}",
        "module": module,
        "cls": _camel(name) + suffix,
        "group": GROUPS[kind],
        "section": _SECTIONS[kind],
        "gridgate_version": ".".join(__version__.split(".")[:2]),
        "api_version": API_VERSION,
        "gridgate_source": source_path,
        "gridgate_where": source_where,
        "shape_text": (
            "\nIt submits, tracks and cancels with three commands (and a history command for "
            "finished jobs),\nand `stand-in/" + name + "-batch` plays a batch system for its "
            "tests and `site.yaml`."
            if batch
            else ""
        ),
        "run_line": _RUN_LINES[shape if kind == "backend" else "other"],
    }
    package = Path("src") / values["package"]
    files: dict[Path, str] = {
        Path("pyproject.toml"): "pyproject.toml",
        Path("README.md"): "README.md",
        Path(".gitignore"): "gitignore",
        package / "__init__.py": "__init__.py",
        package / f"{module}.py": source,
        package / "py.typed": "",
        Path("tests") / "conftest.py": "conftest.py",
        Path("tests") / f"test_{module}.py": tests,
    }
    programs: list[Path] = []
    if batch:
        programs.append(Path("stand-in") / f"{name}-batch")
        files[programs[-1]] = "batch-stand-in"
        files[Path("pilot.sh")] = "pilot.sh"
        files[Path("site.yaml")] = "batch-site.yaml"
    elif kind == "backend":
        programs.append(Path("stand-in") / f"{name}-submit")
        files[programs[-1]] = "backend-submit"
        files[Path("site.yaml")] = "site.yaml"
    written = []
    for relative, template in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        text = Template(_template(template)).substitute(values) if template else ""
        path.write_text(text, encoding="utf-8")
        written.append(path)
    for relative in [*programs, Path("pilot.sh")]:
        program = folder / relative
        if program.exists():
            program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return written


_RUN_LINES = {
    "command": ".venv/bin/gridgate run --once --json -c site.yaml   # drives the stand-in command",
    "batch": ".venv/bin/gridgate run --iterations 4 --json -c site.yaml   # submits, then tracks\n"
    ".venv/bin/gridgate pilots list -c site.yaml                 # their states",
    "other": ".venv/bin/gridgate config validate site.yaml   # once a site names it",
}


def next_steps(kind: str, folder: Path, shape: str = "command") -> str:
    """What to type next, for the command line: a venv of the plugin's own (never the one
    gridgate runs in, which may be its development one), gridgate and the plugin installed
    there, its tests."""
    source, _where = gridgate_source()
    lines = [
        f"cd {folder}",
        "python3 -m venv .venv",
        f".venv/bin/pip install -e {source}",
        ".venv/bin/pip install -e '.[test]'",
        ".venv/bin/pytest",
    ]
    if kind == "backend":
        lines += _RUN_LINES[shape].split("\n")
    return "\n".join(lines) + "\n"
