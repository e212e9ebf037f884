"""docs/notifications.md: its samples and config tables are what the code produces today."""

from __future__ import annotations

from pathlib import Path

from gridgate.plugins.notify_ggus import samples

DOC = Path(__file__).resolve().parents[3] / "docs" / "notifications.md"


def test_docs_notifications_is_not_stale():
    assert samples.main(["--check", str(DOC)]) == 0, (
        "docs/notifications.md is stale: run python -m gridgate.plugins.notify_ggus.samples"
    )


def test_stale_doc_is_detected_and_regenerated(tmp_path):
    original = DOC.read_text(encoding="utf-8")
    copy = tmp_path / "notifications.md"
    copy.write_text(original.replace("Priority: very urgent", "Priority: less urgent", 1))
    assert copy.read_text() != original
    assert samples.main(["--check", str(copy)]) == 1
    assert samples.main([str(copy)]) == 0
    assert copy.read_text() == original


def test_doc_shows_an_error_mail_an_alarm_and_a_ticket():
    text = DOC.read_text(encoding="utf-8")
    sections = samples.generate()
    for name, content in sections.items():
        assert content in text, name
    assert "X-Gridgate-Level: error" in text and "X-Gridgate-Level: alarm" in text
    assert "Affected Site: CERN-PROD" in text and '"priority": "very urgent"' in text
    # every config key of both notifiers is documented
    from gridgate.plugins.notify_email.notifier import EmailNotifier
    from gridgate.plugins.notify_ggus.notifier import GgusNotifier

    for cls in (EmailNotifier, GgusNotifier):
        for key in cls.config_schema["properties"]:
            assert f"| `{key}` |" in text
