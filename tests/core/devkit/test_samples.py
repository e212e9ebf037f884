"""docs/notifications.md: its samples and config tables are what the code produces today, and
the messages in it are the ones core/engine/compose.py composes (not bodies written for the doc)."""

from __future__ import annotations

from pathlib import Path

from gridgate.core.devkit import samples

DOC = Path(__file__).resolve().parents[3] / "docs" / "notifications.md"


def test_docs_notifications_is_not_stale():
    current = DOC.read_text(encoding="utf-8")
    assert samples.render(current, samples.generate()) == current, (
        f"docs/notifications.md is stale: run {samples.REGENERATE}"
    )


def test_the_doc_shows_the_bodies_core_composes():
    text = DOC.read_text(encoding="utf-8")
    error, alarm = samples.server_failure()
    for note in (error, alarm, samples.local_fault(), samples.credential_error()):
        assert note.body.rstrip("\n") in text, note.subject
    assert "Submit GGUS Ticket for this error if not already opened" in text


def test_doc_shows_an_error_mail_an_alarm_a_credential_error_and_a_ticket():
    text = DOC.read_text(encoding="utf-8")
    for name, content in samples.generate().items():
        assert content in text, name
    assert "X-Gridgate-Level: error" in text and "X-Gridgate-Level: alarm" in text
    assert "Affected Site: CERN-PROD" in text and '"priority": "very urgent"' in text
    assert "[credential]" in text and "[launch]" in text
    # every config key of both notifiers (as loaded by entry-point name) is documented
    for cls in samples.notifier_classes().values():
        for key in cls.config_schema["properties"]:
            assert f"| `{key}` |" in text


def test_only_the_alarm_opens_a_ticket():
    mails, (txt_name, txt, _js_name, _js) = samples.sent()
    assert len(mails) == 4  # error, alarm, local fault, credential: all mailed
    assert "failing since" in txt and txt_name.endswith(".txt")  # one ticket: the alarm's
