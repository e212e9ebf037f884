"""gridgate.core.outbox as a notifier of a third party uses it: its section's outbox keys (the
schema's properties and their defaults) make the retry policy, and a transport of its own
delivers (the email and ggus notifiers' own tests cover the queue in depth)."""

from __future__ import annotations

from pathlib import Path

import jsonschema

from gridgate.core.clock import FakeClock
from gridgate.core.config import apply_defaults
from gridgate.core.files import resolve_dir
from gridgate.core.outbox import (
    OUTBOX_SCHEMA_PROPERTIES,
    Delivery,
    Message,
    configured_outbox,
)


class Pager:
    """A transport of a notifier gridgate does not ship: refuses once, then takes everything."""

    def __init__(self) -> None:
        self.paged: list[str] = []
        self.refusals = 1

    def deliver(self, message: Message) -> Delivery:
        if self.refusals:
            self.refusals -= 1
            return Delivery("retry", "pager gateway busy")
        self.paged.append(message.payload["text"])
        return Delivery("sent", "paged")

    def finish(self) -> None:
        pass


SCHEMA = {"type": "object", "properties": {"to": {"type": "string"}, **OUTBOX_SCHEMA_PROPERTIES}}


def test_the_section_sets_the_retry_policy_and_a_missing_key_takes_the_schema_default(tmp_path):
    section = {"to": "+41 22 000", "retry_initial": 5, "max_age": 600, "send_thread": False}
    jsonschema.validate(section, SCHEMA)
    box = configured_outbox(tmp_path / "pager", {"pager": Pager()}, section, FakeClock(0.0))
    assert (box.retry_policy.initial, box.retry_policy.max_age) == (5, 600)
    filled: dict = {}
    apply_defaults(filled, SCHEMA)
    assert box.retry_policy.maximum == filled["retry_max"] == 1800
    assert box.poll_interval == filled["poll_interval"] == 5


def test_a_third_party_transport_is_retried_with_the_sections_backoff(tmp_path):
    clock = FakeClock(1000.0)
    pager = Pager()
    box = configured_outbox(
        resolve_dir("", tmp_path, "pager-outbox"), {"pager": pager}, {"retry_initial": 5}, clock
    )
    assert box.directory == Path(tmp_path) / "pager-outbox"
    box.enqueue("pager", {"text": "wms01 failing"}, summary="page")
    first = box.flush(10)
    assert (first.sent, first.retried, first.waiting) == (0, 1, 1)
    clock.advance(4.9)
    assert box.flush(10).sent == 0  # still backing off
    clock.advance(0.2)
    assert box.flush(10).sent == 1 and pager.paged == ["wms01 failing"]
    assert box.pending() == [] and box.dead() == []


def test_resolve_dir_keeps_a_configured_folder():
    assert resolve_dir("/var/spool/pager", Path("/state"), "pager") == Path("/var/spool/pager")
    assert resolve_dir("", Path("/state"), "pager") == Path("/state/pager")
