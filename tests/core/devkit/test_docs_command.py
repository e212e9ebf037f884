"""``gridgate docs``: the one command that writes every generated page, run for real on a copy of
the docs folder: ``--check`` names the stale pages and exits 1, a run rewrites them to what the
repository holds, and ``--check`` is then quiet."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from gridgate.core.devkit import docs

ROOT = Path(__file__).resolve().parents[3]
GRIDGATE = str(Path(sys.executable).parent / "gridgate")
PAGES = sorted(docs.pages())


def gridgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GRIDGATE, *args], capture_output=True, text=True, timeout=300)


def test_every_generated_page_is_up_to_date() -> None:
    written, stale = docs.regenerate(ROOT / "docs", check=True)
    assert (written, stale) == ([], []), (
        f"stale: {', '.join(p.name for p in stale)}; regenerate with: gridgate docs"
    )


def test_check_names_the_stale_pages_and_a_run_rewrites_them(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", folder)
    (folder / "api.md").write_text("# old\n", encoding="utf-8")
    (folder / "configuration.md").write_text("# old\n", encoding="utf-8")
    notifications = folder / "notifications.md"
    notifications.write_text(
        notifications.read_text(encoding="utf-8").replace(
            "Priority: very urgent", "Priority: less urgent", 1
        ),
        encoding="utf-8",
    )
    done = gridgate("docs", "--check", "--docs", str(folder))
    assert done.returncode == 1, done.stderr
    assert "api.md" in done.stderr and "configuration.md" in done.stderr
    assert "notifications.md" in done.stderr and "regenerate with: gridgate docs" in done.stderr
    assert "hooks.md" not in done.stderr  # what is fresh is not named
    assert (folder / "api.md").read_text(encoding="utf-8") == "# old\n"  # --check writes nothing

    done = gridgate("docs", "--docs", str(folder))
    assert done.returncode == 0, done.stderr
    assert sorted(line.rsplit("/", 1)[-1] for line in done.stdout.splitlines()) == [
        "api.md",
        "configuration.md",
        "notifications.md",
    ]
    for name in PAGES:
        assert (folder / name).read_bytes() == (ROOT / "docs" / name).read_bytes(), name
    assert gridgate("docs", "--check", "--docs", str(folder)).returncode == 0
