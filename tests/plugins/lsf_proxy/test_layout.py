"""The plugin's layout (docs/proxyd.md "Code layout"): every sub-package is installed, the top
level imports no sub-package, the package files on the gate's run-time path import nothing,
and the gate's code signature still finds the files it watches."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from gridgate.plugins.lsf_proxy.gate import gating

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "plugins" / "lsf_proxy"
PACKAGE = "gridgate.plugins.lsf_proxy"


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_every_sub_package_is_in_the_packages_list() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join([PACKAGE, *init.parent.relative_to(PLUGIN).parts])
        for init in PLUGIN.rglob("__init__.py")
    }
    assert found - listed == set()


def test_the_top_level_imports_no_sub_package() -> None:
    subs = {init.parent.name for init in PLUGIN.glob("*/__init__.py")}
    for module in PLUGIN.glob("*.py"):
        inward = {
            n for n in _imported(module) if n.startswith(PACKAGE + ".") and n.split(".")[3] in subs
        }
        assert inward == set(), module.name


@pytest.mark.parametrize("package", ["client", "gate"])
def test_the_run_time_path_passes_through_package_files_that_import_nothing(package) -> None:
    assert _imported(PLUGIN / package / "__init__.py") == set()


def test_the_gate_code_signature_finds_both_files_it_watches() -> None:
    sig = gating._code_sig()
    assert len(sig) == 2 and None not in sig
