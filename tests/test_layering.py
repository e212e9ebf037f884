"""The layering rules (CONTRIBUTING.md, "Layering rules, and why"), read from the source:

- no plugin imports another plugin: what two plugins share belongs to core;
- a plugin imports from gridgate.core only what docs/api.md lists as public (core/refdocs.py's
  ``API``): anything else may change in any release;
- core imports no plugin (it loads them by entry point, which is not an import);
- no module uses another gridgate file's underscore names;
- and the lsf_proxy plugin's own layout (docs/proxyd.md, "Code layout").

Every rule reads the files with ``ast`` (imports inside functions count); a failure lists each
offending ``file:line``.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: source folder -> the package it is installed as (pyproject's package-dir mapping)
PACKAGES = {"core": "gridgate.core", "plugins": "gridgate.plugins", "demo": "gridgate.demo"}
PLUGINS = ROOT / "plugins"
#: the third-party example plugin is held to the same rules as the built-in ones
EXAMPLES = sorted((ROOT / "examples").glob("*/src/*"))
#: attribute names of the standard library's that start with an underscore
STDLIB_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit"}


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str  # the module imported from (``from M import n``) or imported (``import M``)
    name: str | None  # ``n`` of ``from M import n``; None for ``import M``

    def where(self) -> str:
        what = f"from {self.module} import {self.name}" if self.name else f"import {self.module}"
        return f"{self.path.relative_to(ROOT)}:{self.line}: {what}"


def module_of(path: Path) -> str:
    """The dotted name a source file is imported as (an example plugin's: from its src/)."""
    top, *rest = path.relative_to(ROOT).with_suffix("").parts
    if top not in PACKAGES:  # examples/<dist>/src/<package>/...
        rest = rest[rest.index("src") + 1 :]
    parts = [PACKAGES[top], *rest] if top in PACKAGES else rest
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(*tops: str) -> list[Path]:
    return sorted(
        p for top in tops for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts
    )


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def imports(path: Path, module: ast.Module | None = None) -> Iterator[Import]:
    """Every import in ``path`` (or in ``module``, its syntax tree), relative ones resolved."""
    for node in ast.walk(module or tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, alias.name, None)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = module_of(path).split(".")
                keep = len(base) - node.level + (1 if path.name == "__init__.py" else 0)
                module = ".".join([*base[:keep], *([module] if module else [])])
            for alias in node.names:
                yield Import(path, node.lineno, module, alias.name)


def plugin_of(module: str) -> str | None:
    """``X`` for ``gridgate.plugins.X...``; None for anything else (``gridgate.plugins`` too)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["gridgate", "plugins"] and len(parts) > 2 else None


def plugin_files() -> list[tuple[str, Path]]:
    """(plugin, file) of every built-in plugin's file."""
    return [(p.relative_to(PLUGINS).parts[0], p) for p in sources("plugins") if p.parent != PLUGINS]


def example_files() -> list[Path]:
    return sorted(p for src in EXAMPLES for p in src.rglob("*.py"))


# --- plugins and core ------------------------------------------------------------------------


def other_plugin(plugin: str, imp: Import) -> bool:
    """True when ``imp``, in a file of ``plugin``, imports another plugin (or the demo, an
    application of the plugins)."""
    if imp.module.split(".")[:2] == ["gridgate", "demo"]:
        return True
    target = plugin_of(imp.module)
    if target is None and imp.module == "gridgate.plugins" and imp.name:
        target = imp.name  # from gridgate.plugins import X
    return target is not None and target != plugin


def imports_in(path: Path, source: str) -> list[Import]:
    """The imports of ``source`` as if it were the file ``path`` (the rules' own tests)."""
    return list(imports(path, ast.parse(source)))


def test_no_plugin_imports_another_plugin() -> None:
    found = [
        imp.where()
        for plugin, path in plugin_files()
        for imp in imports(path)
        if other_plugin(plugin, imp)
    ]
    assert found == [], "a plugin imports another plugin (move what they share to core):\n" + (
        "\n".join(found)
    )


def test_the_plugin_rule_sees_an_import_of_another_plugin() -> None:
    path = PLUGINS / "notify_ggus" / "notifier.py"
    source = (
        "import gridgate.plugins\n"
        "from gridgate.plugins.notify_ggus.ticket import GgusTicket\n"
        "from . import rest\n"
        "def f():\n"
        "    from gridgate.plugins.notify_email.notifier import EmailNotifier\n"
        "    from gridgate.plugins import slurm\n"
        "    from ..notify_email import outbox\n"
        "    import gridgate.demo.pilots\n"
    )
    found = [imp.where() for imp in imports_in(path, source) if other_plugin("notify_ggus", imp)]
    assert found == [
        "plugins/notify_ggus/notifier.py:5: from gridgate.plugins.notify_email.notifier import "
        "EmailNotifier",
        "plugins/notify_ggus/notifier.py:6: from gridgate.plugins import slurm",
        "plugins/notify_ggus/notifier.py:7: from gridgate.plugins.notify_email import outbox",
        "plugins/notify_ggus/notifier.py:8: import gridgate.demo.pilots",
    ]


@cache
def public_api() -> dict[str, frozenset[str]]:
    """Public module -> its public names, as docs/api.md lists them (refdocs.api_names: the
    names given, or the module's ``__all__`` when the entry lists none)."""
    from gridgate.core import refdocs

    return {module: frozenset(names) for module, _, _, names in refdocs.api_names()}


def non_public(imp: Import) -> bool:
    api = public_api()
    if imp.module != "gridgate.core" and not imp.module.startswith("gridgate.core."):
        return False
    if imp.name is None:  # import gridgate.core.m: the module itself must be public
        return imp.module not in api
    if imp.module == "gridgate.core" and f"gridgate.core.{imp.name}" in api:
        return False  # from gridgate.core import m, a public module
    return imp.name not in api.get(imp.module, frozenset())


#: The plugins checked one by one (and the example plugin), so that a failure says whose
#: files they are.
PLUGIN_AREAS = [*sorted(p.name for p in PLUGINS.iterdir() if (p / "__init__.py").exists())]


@pytest.mark.parametrize("plugin", [*PLUGIN_AREAS, "examples"])
def test_plugins_import_only_public_core_names(plugin: str) -> None:
    files = example_files() if plugin == "examples" else sources(f"plugins/{plugin}")
    found = [imp.where() for path in files for imp in imports(path) if non_public(imp)]
    assert found == [], (
        "a plugin imports a core name docs/api.md does not list (use a public one, or make "
        "it public: an entry in core/refdocs.py's API with a docstring):\n" + "\n".join(found)
    )


def test_the_public_api_rule_sees_a_private_import() -> None:
    """The rule above is not vacuous: it knows internal names from public ones."""
    path = ROOT / "core" / "director.py"
    assert non_public(Import(path, 1, "gridgate.core.director", "Director"))
    assert non_public(Import(path, 1, "gridgate.core.plugins", "load_class"))
    assert non_public(Import(path, 1, "gridgate.core.iteration", None))
    assert not non_public(Import(path, 1, "gridgate.core.model", "Notification"))
    assert not non_public(Import(path, 1, "gridgate.core", "hookimpl"))
    assert not non_public(Import(path, 1, "gridgate.core.outbox", "Outbox"))


def imports_a_plugin(imp: Import) -> bool:
    return imp.module.split(".")[:2] in (["gridgate", "plugins"], ["gridgate", "demo"])


def test_core_imports_no_plugin() -> None:
    found = [
        imp.where() for path in sources("core") for imp in imports(path) if imports_a_plugin(imp)
    ]
    assert found == [], "core imports a plugin (load it by entry point):\n" + "\n".join(found)


def test_the_core_rule_sees_an_import_of_a_plugin() -> None:
    source = (
        "import gridgate.plugins.slurm.backend\n"
        "from gridgate.core.model import Endpoint\n"
        "def f():\n"
        "    from gridgate.demo.demo import demo_command\n"
    )
    found = [
        imp.line for imp in imports_in(ROOT / "core" / "x.py", source) if imports_a_plugin(imp)
    ]
    assert found == [1, 4]


# --- underscore names ------------------------------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in STDLIB_UNDERSCORE


def defined_names(path: Path, module: ast.Module | None = None) -> set[str]:
    """The underscore names a file defines: functions, classes, assigned names and
    attributes (``self._x = ...``), parameters, import aliases."""
    names: set[str] = set()
    for node in ast.walk(module or tree(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[-1])
    return {n for n in names if _private(n)}


def all_gridgate_files() -> list[Path]:
    return sources("core", "plugins", "demo")


@cache
def defined_elsewhere() -> dict[str, frozenset[Path]]:
    """Underscore name -> the gridgate files that define it."""
    where: dict[str, set[Path]] = {}
    for path in all_gridgate_files():
        for name in defined_names(path):
            where.setdefault(name, set()).add(path)
    return {name: frozenset(paths) for name, paths in where.items()}


def _own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: an object's own (or inherited) attributes."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def underscore_uses(
    path: Path,
    module: ast.Module | None = None,
    elsewhere: dict[str, frozenset[Path]] | None = None,
) -> list[str]:
    """Where ``path`` uses another gridgate file's underscore names: ``from gridgate... import
    _x``, and ``obj._x`` when obj is not self/cls/super() and ``_x`` is defined in another
    gridgate file but not in this one. ``module`` and ``elsewhere`` stand in for the file's
    syntax tree and :func:`defined_elsewhere` (the rule's own test)."""
    module = module or tree(path)
    elsewhere = defined_elsewhere() if elsewhere is None else elsewhere
    own = defined_names(path, module)
    found = [
        imp.where()
        for imp in imports(path, module)
        if imp.module.startswith("gridgate.") and imp.name and _private(imp.name)
    ]
    for node in ast.walk(module):
        if not isinstance(node, ast.Attribute) or not _private(node.attr) or _own(node.value):
            continue
        if node.attr in own or not (elsewhere.get(node.attr, frozenset()) - {path}):
            continue
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


#: The areas checked one by one, so that a failure says whose files they are: each core
#: module, the demo, each plugin.
AREAS = [
    *(str(p.relative_to(ROOT)) for p in sources("core")),
    "demo",
    *PLUGIN_AREAS,
]


def area_files(area: str) -> list[Path]:
    if area.startswith("core/"):
        return [ROOT / area]
    return sources(area if area == "demo" else f"plugins/{area}")


@pytest.mark.parametrize("area", AREAS)
def test_no_module_uses_another_files_underscore_names(area: str) -> None:
    found = [where for path in area_files(area) for where in underscore_uses(path)]
    assert found == [], (
        "these use another file's underscore names (make the name public where it is "
        "defined, or pass what is needed):\n" + "\n".join(found)
    )


def test_the_underscore_rule_sees_a_use_across_files() -> None:
    """The rule above is not vacuous: an underscore name defined in another gridgate file is
    found when imported or used on another object; one the file defines itself, one used on
    self, and the standard library's are not."""
    probe = ROOT / "core" / "probe.py"  # parsed from the text below, never written
    source = (
        "from gridgate.core.director import _Iteration\n"
        "def f(director, thing):\n"
        "    thing._mine = 2\n"
        "    return director._account, self._account, thing._mine, thing._replace()\n"
    )
    elsewhere = {
        "_account": frozenset({ROOT / "core" / "director.py"}),
        "_mine": frozenset({ROOT / "core" / "other.py"}),
        "_Iteration": frozenset({ROOT / "core" / "director.py"}),
    }
    found = underscore_uses(probe, ast.parse(source), elsewhere)
    assert found == [
        "core/probe.py:1: from gridgate.core.director import _Iteration",
        "core/probe.py:4: director._account",
    ]


# --- packaging --------------------------------------------------------------------------------


def test_every_package_is_in_the_packages_list() -> None:
    """A folder with an ``__init__.py`` under core/, plugins/ or demo/ that pyproject does not
    list would be missing from a wheel (the editable install finds it anyway)."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {module_of(init) for top in PACKAGES for init in (ROOT / top).rglob("__init__.py")}
    assert found - listed == set()


# --- the lsf_proxy plugin's layout (docs/proxyd.md, "Code layout") -----------------------------

LSF_PROXY = PLUGINS / "lsf_proxy"
LSF_PACKAGE = "gridgate.plugins.lsf_proxy"


def _imported(path: Path) -> set[str]:
    return {imp.module for imp in imports(path)}


def test_the_lsf_proxy_top_level_imports_no_sub_package() -> None:
    subs = {init.parent.name for init in LSF_PROXY.glob("*/__init__.py")}
    for module in LSF_PROXY.glob("*.py"):
        inward = {
            n
            for n in _imported(module)
            if n.startswith(LSF_PACKAGE + ".") and n.split(".")[3] in subs
        }
        assert inward == set(), module.name


@pytest.mark.parametrize("package", ["client", "gate"])
def test_the_gate_run_time_path_passes_through_package_files_that_import_nothing(package) -> None:
    assert _imported(LSF_PROXY / package / "__init__.py") == set()


def test_the_gate_code_signature_finds_both_files_it_watches() -> None:
    from gridgate.plugins.lsf_proxy.gate import gating

    sig = gating._code_sig()
    assert len(sig) == 2 and None not in sig
