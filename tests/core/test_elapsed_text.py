"""How long an episode has lasted, as the alarm and the GGUS ticket say it."""

from __future__ import annotations

import pytest

from gridgate.core.model import Escalation, elapsed_text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 seconds"),
        (1, "1 second"),
        (4, "4 seconds"),
        (59.9, "59 seconds"),
        (60, "1 minute"),
        (119, "1 minute"),
        (17 * 60 + 5, "17 minutes"),
        (3599, "59 minutes"),
        (3600, "1.0 hours"),
        (5399, "1.4 hours"),
        (5400, "1.5 hours"),
        (3 * 3600 + 600, "3.1 hours"),
        (26 * 3600, "26.0 hours"),
        (-5, "0 seconds"),
    ],
)
def test_elapsed_text_rounds_down_so_at_least_stays_true(seconds: float, text: str) -> None:
    assert elapsed_text(seconds) == text


def test_escalation_hours_are_the_real_time_not_clamped_to_one() -> None:
    escalation = Escalation(level="alarm", episode_start=1000.0)
    assert escalation.hours_failing(1004.0) == pytest.approx(4 / 3600)
    assert escalation.failing_for(1004.0) == "4 seconds"
    assert escalation.failing_for(1000.0 + 2 * 3600 + 1800) == "2.5 hours"
