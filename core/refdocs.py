"""Writes the plugin authors' references from the code itself, so they cannot drift from it:
docs/kinds.md (the failure-kind catalogue), docs/hooks.md (the hook specifications) and
docs/api.md (what a plugin may import).

Regenerate with ``python -m gridgate.core.refdocs``; check with
``python -m gridgate.core.refdocs --check`` (exit 1 when a file is stale).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

REGENERATE = "python -m gridgate.core.refdocs"
DOCS = Path(__file__).resolve().parent.parent / "docs"


def render_kinds() -> str:
    from gridgate.core import kinds

    lines = [
        "# Failure kinds",
        "",
        "<!-- generated from gridgate.core.kinds by `python -m gridgate.core.refdocs`; do not edit -->",
        "",
        "Every failed submission or list-match is given a **kind** by the classifiers (a",
        "backend's own first, the site's `rules` and the generic kinds last). The kind's flags",
        "decide what the director does:",
        "",
        "- **excluded**: the server is taken out of rotation for the rest of the iteration and the",
        "  escalation plugin is asked (the default `caches` puts it in the failing cache for",
        "  `failing_expiry` seconds);",
        "- **notified**: people are told: an error for the first failure of an episode;",
        "- **alarms**: a server that fails again within the tickets window raises an alarm",
        "  (\"Submit GGUS Ticket\"); only kinds that are excluded and notified can;",
        "- **retried elsewhere**: the submission is sent to another usable server in the same",
        "  iteration (`director.retries_per_pilot`, within `director.retry_within_seconds`);",
        "- **local**: the fault is on the director's machine or in the site's configuration: no",
        "  server is blamed, the backend is paused for the rest of the iteration, and one error per",
        "  `failing_expiry` names what to fix.",
        "",
        "The site can change whether a kind is notified with `director.notify_kinds`.",
        "",
        *kinds.markdown_table(),
        "",
        "Backends and classifiers build these with `gridgate.core.kinds.failure(kind, reason)`",
        "(or `KINDS[kind].failure(reason, notify=...)` to vary a flag), so their answers agree",
        "with this table. `gridgate plugins --kinds` prints it.",
        "",
        "## Kinds of your own",
        "",
        "A classifier may answer with a kind that is not in the catalogue (`quota`, `license`):",
        "it works. The director acts on that `Failure`'s own `exclude`, `notify`, `transient`",
        "and `local`, and the kind appears under its own name in accounting, metrics, `--json`",
        "and the notification subject. It is not listed by `gridgate plugins --kinds`. Prefer a",
        "catalogued kind when one fits, so that site rules (`notify_kinds`) and reports read",
        "the same across backends; the backend contract tests",
        "(`gridgate.core.testing.BackendContract`) ask for catalogued kinds unless the backend",
        "declares its own in `extra_kinds`.",
        "",
        "## Words in the accounting table that are not failures",
        "",
        "`failure_kind` of an attempt that reached no server is one of:",
        "",
        "| word | meaning |",
        "|---|---|",
        *(f"| `{word}` | {meaning} |" for word, meaning in kinds.OUTCOME_KINDS.items()),
        "",
    ]
    return "\n".join(lines)


#: file name -> renderer
RENDERERS: dict[str, Callable[[], str]] = {"kinds.md": render_kinds}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gridgate.core.refdocs [--check] [--docs DIR]``."""
    parser = argparse.ArgumentParser(prog="python -m gridgate.core.refdocs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the docs folder")
    args = parser.parse_args(argv)
    stale = []
    for name, render in RENDERERS.items():
        path = args.docs / name
        text = render()
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current == text:
            continue
        if args.check:
            stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; regenerate with: {REGENERATE}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
