"""mypy over the whole package under its real names, then over bench/: ``python -m
gridgate.core.devkit.typecheck [MYPY ARGS]`` (what ``bash dev.sh typecheck`` runs).

The package-dir mapping (core/ is gridgate.core, plugins/ is gridgate.plugins) and the editable
install's import hook hide the package from mypy, so each folder that pyproject.toml's
``[tool.setuptools] package-dir`` maps is linked as ``build/typecheck/gridgate/<name>``
(``[tool.mypy] mypy_path``), and the report names the real files (``core/x.py``). Silent and
exit 0 when clean; with arguments, only mypy with those.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

#: The checkout this module is part of (core/devkit/ -> the folder holding pyproject.toml).
CHECKOUT = Path(__file__).resolve().parents[2]
FARM = Path("build/typecheck")


def link_farm(root: Path = CHECKOUT) -> dict[str, str]:
    """Link ``build/typecheck/gridgate/<name>`` to each mapped folder; return the mapping."""
    mapping: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"]
    for package, folder in mapping.items():
        link = root / FARM / Path(*package.split("."))
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(root / folder, link.parent)
        if not link.is_symlink() or os.readlink(link) != target:
            if link.is_symlink():
                link.unlink()
            link.symlink_to(target, target_is_directory=True)
    return mapping


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    mapping = link_farm()
    # the package ([tool.mypy] packages), then the benchmarks that drive it; or what was asked
    # (the package's own errors are reported once: silent when bench/ imports it)
    runs = [args] if args else [[], ["--follow-imports=silent", "bench"]]
    failed = 0
    for run_args in runs:
        done = subprocess.run(
            [sys.executable, "-m", "mypy", *run_args], capture_output=True, text=True, cwd=CHECKOUT
        )
        if done.returncode != 0:
            out = done.stdout + done.stderr
            for package, folder in mapping.items():
                out = out.replace(f"{FARM}/{package.replace('.', '/')}/", f"{folder}/")
            sys.stdout.write(out)
            failed = failed or done.returncode
    return failed


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
