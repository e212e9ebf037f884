"""``gridgate plugin new`` takes a name that is a lower-case identifier to its very end: a
trailing newline (which ``$`` let through) would name an entry point, a package and a folder
(issue 21, item 16)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridgate.core.devkit.scaffold import ScaffoldError, new_plugin


@pytest.mark.parametrize("name", ["evil\n", "ok\n", "a\nb"])
def test_a_plugin_name_with_a_newline_is_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match="use lower-case letters"):
        new_plugin("notifier", name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_plain_name_is_written(tmp_path: Path) -> None:
    assert new_plugin("notifier", "chat", tmp_path / "out")


def test_a_shape_is_a_backends_and_one_of_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match="shape of a backend"):
        new_plugin("notifier", "chat", tmp_path / "a", shape="batch")
    with pytest.raises(ScaffoldError, match="unknown shape 'cluster'"):
        new_plugin("backend", "mybatch", tmp_path / "b", shape="cluster")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_batch_shape_writes_three_commands_a_stand_in_and_a_venv_of_its_own(
    tmp_path: Path,
) -> None:
    written = new_plugin("backend", "mysched", tmp_path / "out", shape="batch")
    names = {p.relative_to(tmp_path / "out").as_posix() for p in written}
    assert {"stand-in/mysched-batch", "pilot.sh", "site.yaml", ".gitignore"} <= names
    backend = (tmp_path / "out" / "src" / "gridgate_mysched" / "backend.py").read_text()
    for key in ("submit_command", "status_command", "history_command", "cancel_command"):
        assert f'"{key}"' in backend
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "python3 -m venv .venv" in readme and ".venv/bin/pip install -e" in readme
    assert (tmp_path / "out" / "stand-in" / "mysched-batch").stat().st_mode & 0o111
