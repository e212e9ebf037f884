"""docs/kinds.md, docs/hooks.md and docs/api.md are generated from the code: they fail here
when stale, and every public name has its entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridgate.core import refdocs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(refdocs.RENDERERS))
def test_generated_reference_is_up_to_date(name: str) -> None:
    current = (ROOT / "docs" / name).read_text(encoding="utf-8")
    assert current == refdocs.RENDERERS[name](), (
        f"docs/{name} is stale; regenerate with: {refdocs.REGENERATE}")


def test_check_mode_finds_a_stale_file_and_regenerating_fixes_it(tmp_path: Path, capsys) -> None:
    for name in refdocs.RENDERERS:
        (tmp_path / name).write_text("# old\n", encoding="utf-8")
    assert refdocs.main(["--check", "--docs", str(tmp_path)]) == 1
    assert refdocs.REGENERATE in capsys.readouterr().err
    assert refdocs.main(["--docs", str(tmp_path)]) == 0
    assert refdocs.main(["--check", "--docs", str(tmp_path)]) == 0


def test_kinds_md_lists_every_catalogued_kind() -> None:
    from gridgate.core.kinds import KINDS

    text = refdocs.render_kinds()
    for kind in KINDS.values():
        assert f"| `{kind.name}` |" in text and kind.meaning in text
