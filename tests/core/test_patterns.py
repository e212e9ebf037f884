"""Core's pattern table: the first pattern found decides, the line is quoted and clipped, and
what no pattern knows gets the catalogue's generic kinds. Commands run for real."""

from __future__ import annotations

import re
import sys

import pytest

from gridgate.core.model import CommandResult
from gridgate.core.patterns import MAX_QUOTE, Pattern, PatternTable, clip, first_line
from gridgate.core.runner import run

TABLE = PatternTable(
    (
        Pattern(
            "unreachable",
            re.compile(r"cannot contact the controller"),
            "the controller cannot be contacted",
            tags=frozenset({"cluster"}),
        ),
        Pattern(
            "config", re.compile(r"no such queue"), "the queue does not exist", transient=False
        ),
        Pattern("overload", re.compile(r"busy|no such"), "busy", notify=False),
    )
)


def said(stdout: str = "", stderr: str = "", code: int = 1) -> CommandResult:
    """What a real command printing ``stdout`` and ``stderr`` and exiting ``code`` did."""
    program = (
        f"import sys; sys.stdout.write({stdout!r}); sys.stderr.write({stderr!r}); sys.exit({code})"
    )
    return run([sys.executable, "-c", program], 30)


def test_the_first_pattern_of_the_table_decides_and_its_line_is_quoted() -> None:
    outcome = said(stdout="hello\n", stderr="error: no such queue 'q9'\n")
    failure = TABLE.classify(outcome)
    # "no such" also matches the later overload pattern: order decides
    assert (failure.kind, failure.transient) == ("config", False)
    assert failure.reason == "the queue does not exist: \"error: no such queue 'q9'\""
    pattern, line = TABLE.match_output(outcome) or (None, "")
    assert pattern is TABLE.patterns[1] and line == "error: no such queue 'q9'"


def test_flags_and_tags_are_the_patterns() -> None:
    failure = TABLE.classify(said(stderr="server busy\n"))
    assert (failure.kind, failure.exclude, failure.notify) == ("overload", True, False)
    found = TABLE.match_output(said(stderr="x: cannot contact the controller (connect)\n"))
    assert found is not None and "cluster" in found[0].tags


def test_what_no_pattern_knows_gets_the_generic_kinds() -> None:
    assert TABLE.classify(None, "bad request").kind == "config"
    assert TABLE.classify(None, "bad request").exclude is False
    missing = run(["/nonexistent/gridgate/submit"], 30)
    assert TABLE.classify(missing).kind == "launch"
    killed = run([sys.executable, "-c", "import time; time.sleep(600)"], 0.5)
    assert TABLE.classify(killed).kind == "timeout"
    assert TABLE.classify(said(stdout="nothing useful\n", code=0)).kind == "bad_output"
    failed = TABLE.classify(said(stdout="out\n", stderr="\n  first words  \nsecond\n", code=3))
    assert (failed.kind, failed.reason) == ("error", "exit code 3: 'first words'")


def test_the_backends_own_message_can_speak_first() -> None:
    outcome = said(stderr="server busy\n")
    assert TABLE.classify(outcome, "no such queue").kind == "overload"
    assert TABLE.classify(outcome, "no such queue", search_message=True).kind == "config"


def test_bad_output_and_said_are_the_backends_words() -> None:
    quiet = said(stdout="ok\n", code=0)
    assert TABLE.classify(quiet, bad_output="no CE list").reason == "no CE list"
    loud = said(stderr="INFO: a\nERROR: b\n", code=2)
    last = TABLE.classify(loud, said=lambda c: c.stderr.split("\n")[1])
    assert last.reason == "exit code 2: 'ERROR: b'"
    assert first_line(loud) == "INFO: a" and first_line(said(code=1)) == "no output"


def test_long_lines_are_clipped() -> None:
    assert clip("a   b\n c") == "a b c"
    long = clip("x" * 1000)
    assert len(long) == MAX_QUOTE and long.endswith("...")
    failure = TABLE.classify(said(stderr="server busy " + "y" * 1000 + "\n"))
    assert len(failure.reason) == MAX_QUOTE


def test_a_kind_outside_the_catalogue_is_refused() -> None:
    with pytest.raises(ValueError, match="not in the catalogue: nonsense"):
        PatternTable([Pattern("nonsense", re.compile("x"), "x")])
