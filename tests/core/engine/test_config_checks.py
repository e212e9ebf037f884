"""Config checks across sections, refusals a running director makes on reload, the notice of
every accepted change, and a real config cut at every byte."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from support.director import ScriptedBackend

from gridgate.core.commands.app import cli
from gridgate.core.config import ConfigError, load_config
from gridgate.core.engine.config_checks import checked_config
from gridgate.core.engine.director import Director
from gridgate.core.engine.reload import ConfigSource
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector
from gridgate.plugins.wms_glite.sim import install_commands, write_scenario

EXAMPLE = Path(__file__).resolve().parents[3] / "core" / "commands" / "example.yaml"


def validate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["config", "validate", str(path)])
    return result.exit_code, result.output


# --- references across sections -----------------------------------------------------------


def test_demand_naming_a_backend_that_is_not_configured_is_an_error_at_its_line(write) -> None:
    path = write(
        "site.yaml",
        "backends:\n  wms_glite:\n    servers: [wms01.example.org]\n"
        "demand:\n  static:\n    wms_glite: 2\n    lsf: 3\n",
    )
    code, output = validate(path)
    assert code == 2
    assert (
        f"{path}:7: demand.static.lsf: names backend 'lsf', which is not configured under "
        "backends (configured: wms_glite)"
    ) in output


def test_a_configured_backend_without_servers_is_an_error_at_its_line(write) -> None:
    path = write(
        "site.yaml",
        "director: {cycle_seconds: 5}\nbackends:\n  wms_glite:\n"
        "    list_match: false\ndemand: {static: {wms_glite: 2}}\n",
    )
    code, output = validate(path)
    assert code == 2
    assert f"{path}:3: backends.wms_glite.servers: backend 'wms_glite' has no servers" in output


def test_a_mail_notifier_with_every_address_empty_is_a_warning(write) -> None:
    path = write(
        "site.yaml",
        "state: {driver: memory}\nnotifiers:\n  email:\n    host: localhost\n"
        "    from: gridgate@example.org\n    error_address: ''\n"
        "    alarm_address: ''\n",
    )
    code, output = validate(path)
    assert code == 0 and f"{path}: valid" in output
    assert (
        f"{path}:3: notifiers.email: warning: error_address and alarm_address are both empty"
        in output
    )
    path.write_text(path.read_text().replace("error_address: ''", "error_address: ops@example.org"))
    code, output = validate(path)
    assert code == 0 and "warning" not in output  # one level disabled is the seed's way: fine


# --- nothing to submit ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "where", "why"),
    [
        ("director: {cycle_seconds: 60}\n", 1, "demand", "no demand plugin is configured"),
        (
            "director: {cycle_seconds: 60}\ndemand:\n  static:\n",
            3,
            "demand.static",
            "the static demand asks for no pilot",
        ),
        (
            "backends:\n  wms_glite: {servers: [wms01.example.org]}\ndemand: {static: {wms_glite: 0}}\n",
            3,
            "demand.static",
            "the static demand asks for no pilot",
        ),
    ],
)
def test_a_director_config_that_would_submit_nothing_does_not_validate(
    write, text, line, where, why
) -> None:
    path = write("site.yaml", text)
    code, output = validate(path)
    assert code == 2, output
    assert f"{path}:{line}: {where}: {why}" in output and "director.paused: true" in output
    path.write_text(
        "director: {paused: true}\n" + text.replace("director: {cycle_seconds: 60}\n", "")
    )
    code, output = validate(path)
    assert (code, output.strip()) == (0, f"{path}: valid")  # said on purpose: fine


def test_a_file_without_director_sections_need_not_submit(write) -> None:
    path = write("proxyd-only.yaml", "state: {driver: memory}\n")  # e.g. a token daemon's
    assert validate(path) == (0, f"{path}: valid\n")


def test_run_refuses_to_start_on_a_config_that_would_submit_nothing(write, gridgate_exe) -> None:
    import subprocess

    path = write("site.yaml", "state: {driver: memory}\n")
    done = subprocess.run(
        [gridgate_exe, "run", "-c", str(path), "--once"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and f"{path}:1: demand: no demand plugin" in done.stderr


def test_run_refuses_to_start_on_a_file_cut_inside_its_last_line(write, gridgate_exe) -> None:
    """A file without its final newline (``max_waiting: 100`` cut to ``1`` still validates)
    is refused at the start as a running director refuses it on reload."""
    import subprocess

    path = write("site.yaml", "state: {driver: memory}\ndemand: {static: {testbed: 1}}")
    done = subprocess.run(
        [gridgate_exe, "run", "-c", str(path), "--once"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout
    assert f"{path}:2: $: the file does not end with a newline" in done.stderr


# --- what a running director does with a reload ---------------------------------------------


def running(write, text: str) -> tuple[Director, Collector, ScriptedBackend, Path]:
    path = write("site.yaml", text)
    backend, collector = ScriptedBackend(2), Collector()
    director = Director(ConfigSource(path), extra_plugins=[backend, collector], state=MemoryState())
    return director, collector, backend, path


BASE = "state: {driver: memory}\ndirector: {max_threads: 2, cycle_seconds: 60}\n"


def test_a_reload_that_would_submit_nothing_is_refused_unless_paused(write) -> None:
    director, notes, _, path = running(write, BASE + "demand: {static: {testbed: 2}}\n")
    assert len(director.run_iteration().records) == 2
    path.write_text(BASE + "demand: {static: {testbed: 0}}\n")
    summary = director.run_iteration()
    assert "demand.static: the static demand asks for no pilot" in summary.config_error
    assert [r.outcome for r in summary.records] == ["submitted"] * 2  # last good config
    assert [n.level for n in notes.notes] == ["error"] and "refused" in notes.notes[0].subject
    path.write_text(
        BASE.replace("max_threads: 2", "max_threads: 2, paused: true")
        + "demand: {static: {testbed: 0}}\n"
    )
    summary = director.run_iteration()
    assert summary.config_error is None and summary.records == ()
    assert notes.notes[-1].level == "info"
    assert notes.notes[-1].subject == (
        "gridgate: config changed: demand.static.testbed 2 -> 0, director.paused false -> true"
    )
    for _ in range(4):  # paused on purpose: no demand, so no stall alarm either
        assert director.run_iteration().records == ()
    assert [n.level for n in notes.notes] == ["error", "info"]
    director.close()


def test_every_accepted_change_is_notified_with_what_changed_and_what_needs_a_restart(
    write,
) -> None:
    director, notes, _, path = running(write, BASE + "demand: {static: {testbed: 2}}\n")
    director.run_iteration()
    path.write_text(
        BASE.replace("cycle_seconds: 60", "cycle_seconds: 30") + "demand: {static: {testbed: 2}}\n"
    )
    summary = director.run_iteration()
    (note,) = notes.notes
    assert note in summary.notifications and note.level == "info"
    assert note.subject == "gridgate: config changed: director.cycle_seconds 60 -> 30"
    assert "new settings take effect now.\n" in note.body
    path.write_text(
        BASE.replace("cycle_seconds: 60", "cycle_seconds: 30").replace(
            "{driver: memory}", f"{{driver: sqlite, path: {path.parent / 'state' / 'x.db'}}}"
        )
        + "demand: {static: {testbed: 2}}\n"
    )
    director.run_iteration()
    note = notes.notes[-1]
    # the sqlite driver's own defaults come along with it, and the state folder follows the
    # file (director.state_dir is not written)
    assert note.subject == (
        "gridgate: config changed: director.state_dir changed, state.busy_timeout added, "
        "state.driver changed, state.path added, state.prune_interval added"
    )
    assert (
        "new settings take effect now, except state.busy_timeout, state.driver, state.path, "
        "state.prune_interval, read only at start: restart the director for them"
    ) in note.body
    assert "- state.path: added\n" in note.body
    director.close()


def test_a_missing_config_file_is_said_once_not_at_every_iteration(write, tmp_path) -> None:
    notes_dir = tmp_path / "notes"
    director, notes, _, path = running(
        write,
        BASE + "demand: {static: {testbed: 1}}\n"
        f"notifiers: {{files: {{folder: {notes_dir}}}}}\n",
    )
    director.run_iteration()
    os.unlink(path)
    for _ in range(5):
        assert len(director.run_iteration().records) == 1  # the last good config stays
    assert len(list(notes_dir.iterdir())) == 1
    (text,) = [p.read_text() for p in notes_dir.iterdir()]
    assert "cannot read" in text and "No such file or directory" in text
    director.close()


# --- YAML syntax errors ---------------------------------------------------------------------


def test_an_unclosed_bracket_is_reported_where_it_started_and_where_the_parser_gave_up(
    write,
) -> None:
    path = write(
        "site.yaml",
        "director:\n  cycle_seconds: 60\nbackends:\n  wms_glite:\n"
        "    servers: [wms01.example.org,\n      wms02.example.org\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = [(p.line, p.message) for p in info.value.problems]
    assert lines[0][0] == 5 and "flow sequence started here and is not closed" in lines[0][1]
    assert lines[1][0] == 7 and "that started at line 5" in lines[1][1]


# --- a real config cut at every byte --------------------------------------------------------


def test_the_example_config_cut_at_every_byte_is_refused_or_still_submits(
    tmp_path, monkeypatch
) -> None:
    """Each prefix of core/commands/example.yaml either does not validate or, run for one iteration
    against the stand-in gLite commands, submits pilots: never a config that validates and
    silently submits nothing."""
    text = EXAMPLE.read_text(encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    sim_bin = install_commands(tmp_path / "bin")  # the gLite stand-ins, all servers healthy
    monkeypatch.setenv("PATH", f"{sim_bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(
        "GRIDGATE_SIM_SCENARIO",
        str(
            write_scenario(
                tmp_path / "scenario.json",
                {
                    "state_dir": str(tmp_path / "sim"),
                    "hosts": {},
                    "default": {"behaviour": "healthy"},
                },
            )
        ),
    )
    path = tmp_path / "site.yaml"
    refused = 0
    valid: dict[str, int] = {}  # distinct documents among the cuts that validate -> a cut
    # the checks depend on the document and on whether the text ends its last line (a cut
    # inside a line is refused as cut short): one check of each
    verdicts: dict[tuple[str, bool], bool] = {}
    for cut in range(len(text.encode("utf-8")) + 1):
        prefix = text.encode("utf-8")[:cut].decode("utf-8", errors="ignore")
        whole = prefix.endswith("\n") or not prefix.strip()
        try:
            document = yaml.safe_dump(yaml.safe_load(prefix))
        except yaml.YAMLError:
            document = None
        key = (document or "", whole)
        if document is None or key not in verdicts:
            try:
                checked_config(path, text=prefix)
                ok = True
            except ConfigError:
                ok = False
            if document is None:
                assert not ok  # a prefix YAML cannot parse never validates
            else:
                verdicts[key] = ok
        if document is None or not verdicts.get(key, False):
            refused += 1
            continue
        assert whole  # a cut inside a line never validates
        valid.setdefault(document, cut)
    assert refused > 0 and valid
    for document, cut in valid.items():
        config = load_config(path, text=text.encode("utf-8")[:cut].decode("utf-8", errors="ignore"))
        director = Director(config, state=MemoryState())
        try:
            summary = director.run_iteration()
        finally:
            director.close()
        submitted = sum(r.pilots for r in summary.records if r.outcome == "submitted")
        assert submitted > 0, f"cut at byte {cut} validates and submits nothing:\n{document}"
    print(
        f"{len(text)} bytes: {refused} cuts refused, {len(text) + 1 - refused} validate "
        f"({len(valid)} distinct documents), every one of them submits; "
        f"{len(verdicts)} distinct documents checked"
    )


# --- a file cut inside a mapping, and limits lowered on reload (issue 21, item 10) ----------

CUT_BASE = (
    "state: {driver: memory}\ndirector:\n  max_threads: 2\n  cycle_seconds: 60\n"
    "  pilots:\n    max_waiting: 100\ndemand: {static: {testbed: 2}}\n"
)


def test_a_reload_cut_inside_a_value_is_refused(write) -> None:
    director, notes, _, path = running(write, CUT_BASE)
    director.run_iteration()
    # the last line cut short: "max_waiting: 100" became "max_waiting: 1", and YAML cannot tell
    cut = (
        "state: {driver: memory}\ndemand: {static: {testbed: 2}}\ndirector:\n  max_threads: 2\n"
        "  cycle_seconds: 60\n  pilots:\n    max_waiting: 1"
    )
    path.write_text(cut)
    summary = director.run_iteration()
    assert (
        summary.config_error is not None and "does not end with a newline" in summary.config_error
    )
    assert director.config.director["pilots"]["max_waiting"] == 100  # the last good config
    assert [n.level for n in notes.notes] == ["error"]
    path.write_text(cut + "00\n")  # the writer finished: the same file, whole, is taken
    summary = director.run_iteration()
    assert summary.config_error is None
    assert director.config.director["pilots"]["max_waiting"] == 100
    director.close()


def test_a_limit_lowered_on_reload_is_named_in_a_warning(write) -> None:
    director, notes, _, path = running(write, CUT_BASE)
    director.run_iteration()
    path.write_text(
        CUT_BASE.replace("max_waiting: 100", "max_waiting: 1").replace(
            "max_threads: 2", "max_threads: 1"
        )
    )
    summary = director.run_iteration()
    assert summary.config_error is None and director.config.director["pilots"]["max_waiting"] == 1
    (note,) = notes.notes
    assert note.level == "error"  # reaches the error address, not only the log
    assert note.subject == (
        "gridgate: config changed, limits lowered: director.max_threads 2 -> 1, "
        "director.pilots.max_waiting 100 -> 1"
    )
    assert "- director.pilots.max_waiting: 100 -> 1 (lowered)\n" in note.body
    path.write_text(CUT_BASE.replace("cycle_seconds: 60", "cycle_seconds: 30"))
    director.run_iteration()
    assert notes.notes[-1].level == "info"  # raising limits back, or a shorter cycle, is no warning
    director.close()


def test_a_fifo_put_in_place_of_the_config_is_refused_on_reload_without_hanging(write) -> None:
    """Issue 31, item 1: the re-read of every iteration opened the file blocking; a FIFO in its
    place hung the loop. It is refused once (the last good config runs on)."""
    import os

    director, notes, _, path = running(write, BASE + "demand: {static: {testbed: 2}}\n")
    assert len(director.run_iteration().records) == 2
    path.unlink()
    os.mkfifo(path)
    got: list[Any] = []
    worker = threading.Thread(target=lambda: got.append(director.run_iteration()), daemon=True)
    worker.start()
    worker.join(60)
    try:
        assert not worker.is_alive(), "the config re-read blocked on a FIFO"
        (summary,) = got
        assert "is a FIFO, not a regular file" in (summary.config_error or "")
        assert [r.outcome for r in summary.records] == ["submitted"] * 2  # last good config
    finally:
        if worker.is_alive():
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        director.close()
