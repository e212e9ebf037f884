"""The suite's shared helpers stay shared (CONTRIBUTING.md, "Tests"): read from the source.

- no test module edits ``sys.path``: tests/support/ is on pytest's ``pythonpath``;
- the real-uid prefix and the free-port probe are defined once, in tests/support/;
- no test folder keeps its own copy of the public kit's notifier (``gridgate.core.testing``);
- the loopback HTTP servers are defined in tests/support/ (``support.web`` for GETs).

Each failure lists the offending ``file:line``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(TESTS.rglob("*.py")):
        if "fixtures" in path.relative_to(TESTS).parts:
            continue  # data for tests (a broken plugin distribution), not test code
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(TESTS.parent)}:{getattr(node, 'lineno', 0)}"


def _sys_path_edits(tree: ast.Module) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"insert", "append", "extend"}
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "path"
            and isinstance(node.func.value.value, ast.Name)
            and node.func.value.value.id == "sys"
        ):
            yield node


def _definitions(tree: ast.Module, names: set[str]) -> Iterator[tuple[str, ast.AST]]:
    """Top-level or nested assignments and defs of ``names`` (not imports of them)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
            yield node.name, node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in names:
                    yield target.id, node


def _http_classes(tree: ast.Module) -> Iterator[ast.ClassDef]:
    """Classes deriving from http.server's handler or server (by the base's last name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {
                b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases
            }
            if bases & {"BaseHTTPRequestHandler", "HTTPServer", "ThreadingHTTPServer"}:
                yield node


def test_no_test_module_edits_sys_path() -> None:
    found = [_where(p, call) for p, tree in _modules() for call in _sys_path_edits(tree)]
    assert not found, (
        "sys.path edited (tests/support/ is importable as `support` through pyproject's "
        "pythonpath): " + ", ".join(found)
    )


def test_the_uid_prefix_and_the_port_probe_are_defined_once() -> None:
    home = {"AS_NOBODY": SUPPORT / "uids.py", "free_port": SUPPORT / "ports.py"}
    copies = [
        f"{name} at {_where(path, node)}"
        for path, tree in _modules()
        for name, node in _definitions(tree, {"AS_NOBODY", "free_port", "_free_port"})
        if home.get(name.lstrip("_")) != path
    ]
    assert not copies, (
        "copies of shared helpers (import them from support.uids / support.ports): "
        + ", ".join(copies)
    )


def test_no_private_copy_of_the_kits_collector() -> None:
    copies = [
        _where(path, node)
        for path, tree in _modules()
        for _name, node in _definitions(tree, {"Collector"})
    ]
    assert not copies, (
        "a Collector defined in the tests: use gridgate.core.testing.Collector (extend the "
        "kit if it lacks something a plugin author would need too): " + ", ".join(copies)
    )


def test_the_http_test_servers_live_in_support() -> None:
    copies = [
        _where(path, node)
        for path, tree in _modules()
        if SUPPORT not in path.parents
        for node in _http_classes(tree)
    ]
    assert not copies, (
        "an HTTP server defined in a test module: use support.web.WebServer (its Answers "
        "set status, body, headers, hang or trickle; extend it if a test needs more): "
        + ", ".join(copies)
    )


def test_the_checks_see_what_they_look_for() -> None:
    """The rules above find nothing today; this proves they would find the real thing."""
    sample = ast.parse(
        "import sys\n"
        "sys.path.insert(0, 'x')\n"
        "AS_NOBODY = ['setpriv']\n"
        "def _free_port():\n    pass\n"
        "class Collector:\n    pass\n"
        "class H(http.server.BaseHTTPRequestHandler):\n    pass\n"
        "class S(ThreadingHTTPServer):\n    pass\n"
    )
    assert len(list(_sys_path_edits(sample))) == 1
    found = {name for name, _ in _definitions(sample, {"AS_NOBODY", "_free_port", "Collector"})}
    assert found == {"AS_NOBODY", "_free_port", "Collector"}
    assert [c.name for c in _http_classes(sample)] == ["H", "S"]
