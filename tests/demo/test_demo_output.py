"""What `gridgate demo` prints, read as a newcomer reads it: the per-server table shows the
aborting server's failures by kind, a legend under it says what the columns, the token policy
and the progress lines' "excluded now" mean, stderr carries nothing but the demo's own lines
(no tool chatter, no warnings, no traceback), and ``--png`` draws the run's report with the
data it was drawn from beside it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from gridgate.core.commands.report import draw, plotted, read_plotted
from gridgate.demo.demo import REMOTE_POLICY, legend
from gridgate.demo.pilots import ABORTING

#: Every line the demo may write on stderr: its header, its progress lines, the line of a server
#: that left rotation, and the director's log lines of errors, alarms and warnings.
STDERR_LINES = re.compile(
    r"gridgate demo: 11 simulated WMS servers, .*"
    r"|  iteration +\d+ .* excluded now: .*"
    r"|    wms\d\d\.example\.org: its last finished pilots failed; out of rotation"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (ERROR|CRITICAL|WARNING) +\S.*"
)


@pytest.mark.timeout(300)
def test_the_demo_output_as_a_newcomer_reads_it(tmp_path: Path, gridgate_exe: str) -> None:
    folder = tmp_path / "demo"
    png = tmp_path / "out" / "pilots.png"
    proc = subprocess.run(
        [gridgate_exe, "demo", "--duration", "12", "--dir", str(folder), "--png", str(png)],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"},
    )
    assert proc.returncode == 0, proc.stderr
    noise = [line for line in proc.stderr.splitlines() if not STDERR_LINES.fullmatch(line)]
    assert noise == [], "the demo printed lines a person does not need:\n" + "\n".join(noise)
    assert any(line.startswith("  iteration  2 ") for line in proc.stderr.splitlines())

    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("server "))
    kinds_at = lines[header].index("failures by kind")
    row = next(line for line in lines if line.startswith(ABORTING))
    kinds = row[kinds_at : kinds_at + 34].split(", ")
    assert [k.split()[0] for k in kinds] == ["aborted"], row
    assert kinds[0].split()[1] == "verdicts" and int(kinds[0].split()[2]) >= 1
    # the legend right under the table's closing rule, naming what a newcomer asked about
    closing = next(i for i in range(header + 2, len(lines)) if set(lines[i]) == {"-"})
    shown = legend({"mode": "remote", "policy": REMOTE_POLICY})
    assert lines[closing + 1 : closing + 1 + len(shown)] == shown
    text = "\n".join(shown)
    for term in ("failures by kind", "aborted", "tokens", "waited", "wait s", "refused"):
        assert term in text, term
    assert f"{REMOTE_POLICY}: at most 8 submissions at once; past 4 at once," in text
    assert "  one more per 20 ms" in text
    assert "excluded now (progress lines): servers that failed in that iteration" in text
    assert "for 12 s (failing_expiry" in text

    # --png: the run's report, drawn; its table beside it draws the same picture again
    assert f"report plot:           {png} (drawn from the .json beside it)" in lines
    shown_png = read_plotted(png)
    assert shown_png is not None
    table = json.loads(png.with_suffix(".json").read_text(encoding="utf-8"))
    assert plotted(draw(table)) == shown_png
    # submitted, finished, failures; and the pilots skipped by cause when a limit was full
    # (a loaded machine's slow polls leave more waiting: seen in a full run at load 12)
    skips = any(n for slot in (table.get("skipped") or {}).values() for n in slot.values())
    assert len(shown_png["panels"]) == (4 if skips else 3)
    failures = {s["label"]: sum(s["values"]) for s in shown_png["panels"][2]["series"]}
    assert failures["aborted: a server's pilots abort"] >= 1
