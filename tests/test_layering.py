"""The layering rules (CONTRIBUTING.md, "Layering rules, and why"), read from the source:

- no plugin imports another plugin: what two plugins share belongs to core;
- a plugin imports from gridgate.core only what docs/api.md lists as public (core/devkit/refdocs.py's
  ``API``): anything else may change in any release;
- core imports no plugin (it loads them by entry point, which is not an import);
- no module uses another gridgate file's underscore names;
- core's own layout (CONTRIBUTING.md, "Where things go"): the modules directly in core/ are the
  plugin API, each exactly its ``__all__``; the built-in plugins import only public names; the
  layers import only downwards (the top level no sub-package, stores the top level, the engine
  the top level and the stores, the built-ins the top level, nothing that runs a director the
  devkit); no two modules import each other, however (function-level, TYPE_CHECKING); no
  module is over 1,000 lines;
- and the lsf_proxy plugin's own layout (docs/proxyd.md, "Code layout").

Every rule reads the files with ``ast`` (imports inside functions count); a failure lists each
offending ``file:line``.
"""

from __future__ import annotations

import ast
import importlib
import tomllib
from collections.abc import Iterator, Mapping
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
    from gridgate.core.devkit import refdocs

    return {module: frozenset(names) for module, _, names in refdocs.api_names()}


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
        "it public: an entry in core/devkit/refdocs.py's API with a docstring):\n"
        + "\n".join(found)
    )


def test_the_public_api_rule_sees_a_private_import() -> None:
    """The rule above is not vacuous: it knows internal names from public ones."""
    path = ROOT / "plugins" / "probe.py"
    assert non_public(Import(path, 1, "gridgate.core.engine.director", "Director"))
    assert non_public(Import(path, 1, "gridgate.core.builtin.bans", "OperatorBans"))
    assert non_public(Import(path, 1, "gridgate.core.state", "check_key"))  # not in __all__
    assert non_public(Import(path, 1, "gridgate.core.plugins", "entry_point_names"))
    assert non_public(Import(path, 1, "gridgate.core.engine.iteration", None))
    assert non_public(Import(path, 1, "gridgate.core._moved", "moved_names"))
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
        "from gridgate.core.engine.director import _Iteration\n"
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
        "core/probe.py:1: from gridgate.core.engine.director import _Iteration",
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


def test_every_data_file_is_in_the_package_data() -> None:
    """A file of a package that is not Python (an example config, a template, the compiled
    shims' C source) is in a wheel only when ``[tool.setuptools.package-data]`` names it."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    missing = []
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            # the nearest folder with an __init__.py is the package that holds the file
            folder = path.parent
            while not (folder / "__init__.py").exists():
                folder = folder.parent
            globs = declared.get(module_of(folder / "__init__.py"), [])
            if not any(path.relative_to(folder).match(g) for g in globs):
                missing.append(str(path.relative_to(ROOT)))
    assert missing == []


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


def test_the_gate_code_signature_finds_the_files_it_watches() -> None:
    from gridgate.plugins.lsf_proxy.gate import gating

    sig = gating._code_sig()
    assert len(sig) == 3 and None not in sig


# --- core's layout -------------------------------------------------------------------------------

CORE = ROOT / "core"
#: What each layer of core may import, besides itself (a sub-package imports its own modules).
#: The top level is the plugin API and stands on nothing below it; ``testing`` alone reaches
#: the devkit (it is the testing kit's public face). The built-ins are held to the plugin rule
#: besides (public names only: test_builtins_import_only_public_core_names).
LAYERS: dict[str, frozenset[str]] = {
    "top": frozenset(),
    "stores": frozenset({"top"}),
    "engine": frozenset({"top", "stores"}),
    "builtin": frozenset({"top"}),
    "commands": frozenset({"top", "stores", "engine", "builtin"}),
    "devkit": frozenset({"top", "stores", "engine", "builtin", "commands"}),
}
#: (importer, layer it may import although LAYERS says no): the public testing kit is a face
#: of the devkit's.
LAYER_EXCEPTIONS = {("gridgate.core.testing", "devkit")}
MAX_LINES = 1000


def core_module_names() -> dict[str, Path]:
    return {module_of(path): path for path in sources("core")}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return "top" if len(parts) <= 3 else parts[2]


def core_target(imp: Import, known: Mapping[str, Path]) -> str | None:
    """The core module ``imp`` brings in: ``from gridgate.core.devkit import refdocs`` is the
    module refdocs, ``from gridgate.core.state import Pilot`` the module state; None for what
    is not core (the package itself, ``gridgate.core``, included: it holds only the API's
    marker and version)."""
    if imp.name is not None and f"{imp.module}.{imp.name}" in known:
        return f"{imp.module}.{imp.name}"
    if imp.module in known and imp.module != "gridgate.core":
        return imp.module
    return None


def core_graph(
    known: Mapping[str, Path] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, set[tuple[str, Import]]]:
    """Core module -> the core modules it imports, each with the import (every import: at the
    top, in functions, under TYPE_CHECKING). ``extra``: module -> source standing in for (or
    added as) that module's file, for the rules' own tests."""
    known = dict(known or core_module_names())
    sources_of = {module: tree(path) for module, path in known.items()}
    for module, text in (extra or {}).items():
        known.setdefault(module, CORE / "probe.py")
        sources_of[module] = ast.parse(text)
    graph: dict[str, set[tuple[str, Import]]] = {}
    for module, syntax in sources_of.items():
        path = known[module]
        edges = graph.setdefault(module, set())
        for imp in imports(path, syntax):
            if (
                imp.module == "gridgate.core"
                and imp.name
                and f"gridgate.core.{imp.name}" not in known
            ):
                continue
            target = core_target(imp, known)
            if target is not None and target != module:
                edges.add((target, imp))
    return graph


def layer_violations(graph: Mapping[str, set[tuple[str, Import]]]) -> list[str]:
    found = []
    for module, edges in sorted(graph.items()):
        mine = layer_of(module)
        for target, imp in sorted(edges, key=lambda e: (e[1].line, e[0])):
            theirs = layer_of(target)
            if theirs == mine or theirs in LAYERS[mine] or (module, theirs) in LAYER_EXCEPTIONS:
                continue
            found.append(f"{imp.where()} ({mine} -> {theirs})")
    return found


def two_way_pairs(graph: Mapping[str, set[tuple[str, Import]]]) -> list[str]:
    found = []
    for module, edges in sorted(graph.items()):
        for target, imp in sorted(edges, key=lambda e: e[1].line):
            back = [i for t, i in graph.get(target, ()) if t == module]
            if back and module < target:
                found.append(f"{imp.where()}  <->  {back[0].where()}")
    return found


def cycles(graph: Mapping[str, set[tuple[str, Import]]]) -> list[list[str]]:
    """The import cycles (strongly connected sets of two or more modules), Tarjan's way."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target, _imp in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def top_level_modules() -> set[str]:
    """The public modules directly in core/: all but a private one (``_moved``, the old paths'
    forwarding that the package imports)."""
    return {module_of(p) for p in CORE.glob("*.py") if not _private(p.stem)}


@pytest.mark.filterwarnings("ignore:.*in gridgate's API 1.5:DeprecationWarning")  # X509Proxy
def test_the_top_level_of_core_is_the_plugin_api() -> None:
    """Every module directly in core/ is on docs/api.md (refdocs.API) and nothing else is, and
    each one's ``__all__`` is its part of the page: names that exist, none twice."""
    from gridgate.core.devkit import refdocs

    listed = {module for module, _purpose in refdocs.API}
    assert top_level_modules() == listed, (
        "a module directly in core/ is public: list it in core/devkit/refdocs.py's API, or "
        "move it into the sub-package of its role (engine, builtin, stores, commands, devkit)"
    )
    for module_name in sorted(listed):
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None)
        assert names, f"{module_name} has no __all__: its part of the API is what it lists"
        assert len(set(names)) == len(names), f"{module_name}.__all__ lists a name twice"
        for name in names:
            assert hasattr(module, name), f"{module_name}.__all__ names {name!r}, which is missing"


def test_the_top_level_rule_sees_a_module_docs_api_md_does_not_list() -> None:
    from gridgate.core.devkit import refdocs

    listed = {module for module, _purpose in refdocs.API}
    assert top_level_modules() | {"gridgate.core.tracking"} != listed
    assert "gridgate.core.engine.director" not in listed  # a sub-package's module is not API
    assert "gridgate.core._moved" not in top_level_modules()  # private, though at the top


def builtin_imports_not_public(path: Path, syntax: ast.Module | None = None) -> list[str]:
    """The imports of a built-in plugin's file that are neither a public core name nor the
    built-ins' own (core/builtin is one plugin package, as plugins/lsf_proxy is)."""
    return [
        imp.where()
        for imp in imports(path, syntax)
        if not imp.module.startswith("gridgate.core.builtin") and non_public(imp)
    ]


@pytest.mark.parametrize("path", sources("core/builtin"), ids=lambda p: p.name)
def test_builtins_import_only_public_core_names(path: Path) -> None:
    found = builtin_imports_not_public(path)
    assert found == [], (
        "a built-in plugin imports a core name docs/api.md does not list (the built-ins are "
        "held to the plugin rule: make it public, or keep it in the built-ins):\n"
        + "\n".join(found)
    )


def test_the_builtin_rule_sees_an_engine_import() -> None:
    source = (
        "from gridgate.core.model import Endpoint\n"
        "from gridgate.core.builtin.waiting import WaitingGauges\n"
        "def f():\n"
        "    from gridgate.core.engine.runtime import Runtime\n"
        "    from gridgate.core.state import check_key\n"
    )
    found = builtin_imports_not_public(CORE / "builtin" / "probe.py", ast.parse(source))
    assert [line.split(":")[1] for line in found] == ["4", "5"]


def test_core_layers_import_only_downwards() -> None:
    found = layer_violations(core_graph())
    assert found == [], (
        "an import against the layers of core (LAYERS; CONTRIBUTING.md, 'Layering rules'):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    "module, source, expected",
    [
        (
            "gridgate.core.config",
            "from gridgate.core.engine.limits import PILOTS_SCHEMA\n",
            "top -> engine",
        ),
        (
            "gridgate.core.stores.redis",
            "def f():\n    from gridgate.core.engine import runtime\n",
            "stores -> engine",
        ),
        (
            "gridgate.core.engine.director",
            "from gridgate.core.builtin.bans import OperatorBans\n",
            "engine -> builtin",
        ),
        (
            "gridgate.core.builtin.gocdb",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gridgate.core.stores.sqlite import SqliteState\n",
            "builtin -> stores",
        ),
        (
            "gridgate.core.commands.app",
            "def docs():\n    from gridgate.core.devkit import refdocs\n",
            "commands -> devkit",
        ),
        (
            "gridgate.core.engine.director",
            "from gridgate.core.devkit.testkit import Collector\n",
            "engine -> devkit",
        ),
    ],
)
def test_the_layer_rule_sees_a_planted_violation(module: str, source: str, expected: str) -> None:
    found = layer_violations(core_graph(extra={module: source}))
    assert len(found) == 1 and found[0].endswith(f"({expected})"), found


def test_the_layer_rule_lets_testing_reach_the_devkit_and_nothing_else() -> None:
    source = "from gridgate.core.devkit.testkit import Collector\n"
    assert layer_violations(core_graph(extra={"gridgate.core.testing": source})) == []
    assert layer_violations(core_graph(extra={"gridgate.core.cli": source})) != []


def test_no_two_core_modules_import_each_other_nor_any_cycle() -> None:
    graph = core_graph()
    pairs = two_way_pairs(graph)
    assert pairs == [], "two modules import each other:\n" + "\n".join(pairs)
    assert cycles(graph) == [], "core modules import each other in a cycle"


def test_the_pair_and_cycle_rules_see_a_function_level_or_type_checking_import() -> None:
    # engine.limits imports nothing of the tracker; planted: a function-level import of it, and
    # a TYPE_CHECKING import of the failure path from the runtime
    graph = core_graph(
        extra={
            "gridgate.core.engine.limits": (CORE / "engine" / "limits.py").read_text(
                encoding="utf-8"
            )
            + "\ndef f():\n    from gridgate.core.engine.tracking import PilotTracker\n",
        }
    )
    assert any("import PilotTracker" in pair for pair in two_way_pairs(graph))
    typed = core_graph(
        extra={
            "gridgate.core.engine.runtime": (CORE / "engine" / "runtime.py").read_text(
                encoding="utf-8"
            )
            + "\nif TYPE_CHECKING:\n    from gridgate.core.engine.iteration import IterationRunner\n",
        }
    )
    assert any("gridgate.core.engine.runtime" in c for c in cycles(typed))


def test_no_module_in_core_is_over_1000_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in sources("core")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these by role (each at most {MAX_LINES} lines): {long}"


def plugin_graph(extra: Mapping[str, str] | None = None) -> dict[str, set[tuple[str, Import]]]:
    """Plugin module -> the modules of the same plugin it imports (every import, as in
    :func:`core_graph`); ``extra``: module -> source standing in for that module's file."""
    known = {module_of(path): path for path in sources("plugins")}
    syntaxes = {module: tree(path) for module, path in known.items()}
    for module, text in (extra or {}).items():
        syntaxes[module] = ast.parse(text)
    graph: dict[str, set[tuple[str, Import]]] = {}
    for module, syntax in syntaxes.items():
        edges = graph.setdefault(module, set())
        for imp in imports(known[module], syntax):
            target = f"{imp.module}.{imp.name}" if imp.name else imp.module
            if target not in known:
                target = imp.module
            if target in known and target != module and known[target].name != "__init__.py":
                edges.add((target, imp))
    return graph


def test_no_two_plugin_modules_import_each_other_nor_any_cycle() -> None:
    graph = plugin_graph()
    pairs = two_way_pairs(graph)
    assert pairs == [], "two modules import each other:\n" + "\n".join(pairs)
    assert cycles(graph) == [], f"plugin modules import each other in a cycle: {cycles(graph)}"


def test_the_plugin_cycle_rule_sees_a_function_level_import() -> None:
    # the gLite JDL module imports nothing of the backend; planted: a function-level import of it
    jdl = PLUGINS / "wms_glite" / "jdl.py"
    planted = jdl.read_text(encoding="utf-8") + (
        "\ndef f():\n    from gridgate.plugins.wms_glite.backend import GliteBackend\n"
    )
    graph = plugin_graph(extra={"gridgate.plugins.wms_glite.jdl": planted})
    assert any("import GliteBackend" in pair for pair in two_way_pairs(graph))
