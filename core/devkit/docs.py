"""``gridgate docs [--check]``: every page generated from the code, written or checked in one go.

- docs/api.md, docs/hooks.md, docs/kinds.md: the plugin API, the hooks and the failure kinds
  (:mod:`.refdocs`);
- docs/configuration.md: the configuration reference, from the composed schema (:mod:`.docgen`);
- docs/notifications.md: its generated parts, the notifiers' keys and the messages as the real
  notifiers send them (:mod:`.samples`).

A page is rewritten only when it changed; ``--check`` writes nothing and names the stale ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gridgate.core.devkit import docgen, refdocs, samples

#: The repository's docs folder (beside core/): the default of ``--docs``.
DOCS = refdocs.DOCS


def pages() -> dict[str, Callable[[str], str]]:
    """File name in the docs folder -> a function of its current text giving its fresh text."""

    def whole(render: Callable[[], str]) -> Callable[[str], str]:
        return lambda _current: render()

    out = {name: whole(render) for name, render in refdocs.RENDERERS.items()}
    out["configuration.md"] = whole(docgen.render)
    out["notifications.md"] = lambda current: samples.render(current, samples.generate())
    return out


def regenerate(docs: Path = DOCS, check: bool = False) -> tuple[list[Path], list[Path]]:
    """Write (or with ``check`` only compare) every generated page under ``docs``.

    :return: the pages written, and the stale ones (``check``: those that would be written).
    """
    written: list[Path] = []
    stale: list[Path] = []
    for name, fresh_of in pages().items():
        path = docs / name
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        fresh = fresh_of(current)
        if fresh == current:
            continue
        stale.append(path)
        if not check:
            path.write_text(fresh, encoding="utf-8")
            written.append(path)
    return written, stale
