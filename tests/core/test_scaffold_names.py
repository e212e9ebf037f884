"""``gridgate plugin new`` takes a name that is a lower-case identifier to its very end: a
trailing newline (which ``$`` let through) would name an entry point, a package and a folder
(issue 21, item 16)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridgate.core.scaffold import ScaffoldError, new_plugin


@pytest.mark.parametrize("name", ["evil\n", "ok\n", "a\nb"])
def test_a_plugin_name_with_a_newline_is_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match="use lower-case letters"):
        new_plugin("notifier", name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_plain_name_is_written(tmp_path: Path) -> None:
    assert new_plugin("notifier", "chat", tmp_path / "out")
