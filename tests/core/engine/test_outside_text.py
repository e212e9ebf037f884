"""Text from outside reaches people as the escapes it holds (issue 31, item 6): a pilot
submission whose stderr clears the screen, rings the bell and reverses text, through the real
director, a real process, the log notifier's sink, a GGUS ticket spooled and a files notifier;
a ban's reason shown by ``servers list``; a log line."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from click.testing import CliRunner
from support.director import BACKEND

from gridgate.core import hookimpl
from gridgate.core.engine.director import Director
from gridgate.core.model import BackendInfo, Endpoint, SubmitRequest, SubmitResult
from gridgate.core.runner import run
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector, make_config

HOSTILE = "\x1b[2J\x1b[H\x07All pilots running fine \u202eenod\u202c\r\x1b[1A"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


class HostileStderr:
    """One server whose submit command (a real process) fails printing HOSTILE on stderr."""

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        return BackendInfo(BACKEND, (Endpoint(BACKEND, "ce01"),)) if backend == BACKEND else None

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend != BACKEND:
            return None
        script = f"import sys; sys.stderr.write({HOSTILE!r}); sys.exit(1)"
        return SubmitResult(
            endpoint, ok=False, command=run([sys.executable, "-c", script], timeout=timeout)
        )


def test_a_pilots_escapes_reach_notifications_tickets_and_files_escaped(tmp_path: Path) -> None:
    collector = Collector()
    doc = {
        "director": {
            "cycle_seconds": 0.01,
            "command_timeout": 10,
            "state_dir": str(tmp_path / "state"),
        },
        "state": {"driver": "memory"},
        "demand": {"static": {BACKEND: 1}},
        "notifiers": {
            "ggus": {"vo": "lhcb", "deliver": ["spool"], "levels": ["error", "alarm"]},
            "files": {"folder": str(tmp_path / "notes")},
        },
    }
    director = Director(
        make_config(doc), extra_plugins=[HostileStderr(), collector], state=MemoryState()
    )
    try:
        director.run_iteration()
    finally:
        director.close()
    [note] = [n for n in collector.notes if n.endpoint is not None]
    assert note.command is not None and "\\x1b[2J" in note.command.stderr
    for text in (note.subject, note.body, note.command.stderr, note.failure.reason):
        assert not RAW.search(text), repr(text)
    assert "\\x1b[2J\\x1b[H\\x07All pilots running fine \\u202eenod\\u202c" in note.body
    written = [
        *(tmp_path / "state" / "tickets").glob("*.txt"),
        *(tmp_path / "state" / "tickets").glob("*.json"),
        *(tmp_path / "notes").glob("*.txt"),
    ]
    assert len(written) == 3, written
    for path in written:
        text = path.read_text(encoding="utf-8")
        assert not RAW.search(text.replace("\n", "").replace("\t", "")), (path, text)
        assert "All pilots running fine" in text


def test_a_log_line_shows_the_escapes_it_quotes(capfd) -> None:
    from loguru import logger

    from gridgate.core.commands.logs import configure_logging

    configure_logging(1, False)
    try:
        logger.info("submit to ce01 failed: {}", HOSTILE)
    finally:
        logger.remove()
    err = capfd.readouterr().err
    assert "submit to ce01 failed: \\x1b[2J\\x1b[H\\x07All pilots" in err, err
    assert not RAW.search(err.replace("\n", "")), repr(err)


def test_servers_list_shows_a_gocdb_description_escaped(tmp_path: Path) -> None:
    """A feed's description may hold bidi overrides and zero-width characters (XML allows
    them; it refuses ESC and BEL): ``servers list`` and the availability notice show them
    escaped. A ban's reason refuses them when it is given (core/builtin/bans.py)."""
    import time

    import yaml
    from support.director import TrackingBackend

    from gridgate.core.commands.app import cli
    from gridgate.core.config import load_config

    now = time.time()
    hostile = "storage \u202eenod\u202c\u2066 intervention\u200b\r"
    feed = tmp_path / "downtimes.xml"
    feed.write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<results><DOWNTIME ID="1" PRIMARY_KEY="1G0" '
        'CLASSIFICATION="SCHEDULED"><PRIMARY_KEY>1G0</PRIMARY_KEY><HOSTNAME>s0</HOSTNAME>'
        f"<SEVERITY>OUTAGE</SEVERITY><DESCRIPTION>{hostile}&#13;</DESCRIPTION>"
        f"<START_DATE>{int(now - 60)}</START_DATE><END_DATE>{int(now + 3600)}</END_DATE>"
        "</DOWNTIME></results>",
        encoding="utf-8",
    )
    doc = {
        "director": {"cycle_seconds": 0.01, "state_dir": str(tmp_path / "state")},
        "state": {"driver": "sqlite", "path": str(tmp_path / "state.db")},
        "demand": {"static": {BACKEND: 1}},
        "availability": {"gocdb": {"url": feed.as_uri(), "refresh": 1}},
    }
    config = tmp_path / "site.yaml"
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    collector = Collector()
    director = Director(load_config(config), extra_plugins=[TrackingBackend(2), collector])
    try:
        director.run_iteration()
    finally:
        director.close()
    [notice] = [n for n in collector.notes if "s0" in n.subject]
    assert "\\u202eenod\\u202c" in notice.body and not RAW.search(notice.subject + notice.body)
    listed = CliRunner().invoke(cli, ["servers", "list", "-c", str(config)])
    assert listed.exit_code == 0, listed.output
    assert "storage \\u202eenod\\u202c\\u2066 intervention\\u200b" in listed.output, listed.output
    assert not RAW.search(listed.output.replace("\n", "")), repr(listed.output)
