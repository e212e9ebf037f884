"""``@hookimpl`` is typed for type checkers (pluggy's HookimplMarker): a plugin method decorated
with it, bare or with options, type-checks under ``mypy --strict`` and keeps its signature; the
twin, the same plugin behind an untyped decorator, is what a plugin author saw before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = """\
from __future__ import annotations

from gridgate.core import hookimpl
from gridgate.core.model import Endpoint, Notification


class Notifier:
    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        print(notification.subject)

    @hookimpl(trylast=True)
    def gridgate_select_endpoint(self, candidates: list[Endpoint]) -> Endpoint | None:
        return candidates[0] if candidates else None


def use(n: Notifier, note: Notification) -> None:
    n.gridgate_notify(note)
    reveal_type(Notifier.gridgate_select_endpoint)
"""


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    farm = tmp_path / "farm" / "gridgate"
    farm.mkdir(parents=True)
    (farm / "core").symlink_to(ROOT / "core", target_is_directory=True)
    plugin = tmp_path / "plugin.py"
    plugin.write_text(source, encoding="utf-8")
    env = {**os.environ, "MYPYPATH": str(tmp_path / "farm")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--follow-imports=silent",
            "--config-file=/dev/null",
            str(plugin),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_a_method_decorated_with_hookimpl_type_checks_under_strict(tmp_path: Path) -> None:
    done = _mypy(tmp_path, PLUGIN)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert errors == [], done.stdout
    # the decorator kept the method's own type
    assert (
        "def (self: plugin.Notifier, candidates: list[gridgate.core.model.Endpoint])" in done.stdout
    )


def test_the_same_plugin_behind_an_untyped_decorator_fails_strict(tmp_path: Path) -> None:
    untyped = PLUGIN.replace(
        "from gridgate.core import hookimpl\n",
        "def hookimpl(*args, **kwargs):  # untyped, as gridgate.core.hookimpl was in API 1.4\n"
        "    return args[0] if args else (lambda f: f)\n",
    )
    done = _mypy(tmp_path, untyped)
    assert "untyped-decorator" in done.stdout or "no-untyped-def" in done.stdout, done.stdout
