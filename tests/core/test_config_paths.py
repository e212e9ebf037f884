"""Issue 24: relative paths in a config are taken from the config file's folder, not from the
working directory of the process that reads it (the state folder, the JDL folder, the
notifications folder and outbox, scripts and commands, secret files); the state folder follows
``state.path`` when only that is written. Real ``gridgate`` processes started in another folder
than the config's, against the stand-in gLite commands and a closed SMTP port."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.ports import free_port

from gridgate.core.config import (
    PATH_KEYWORD,
    ConfigError,
    compose_schema,
    config_folder,
    load_config,
    resolve_paths,
    validate_document,
)
from gridgate.core.devkit.docgen import render
from gridgate.plugins.wms_glite.sim import install_commands, read_calls, write_scenario

COMMANDS = (("submit", "submit"), ("list_match", "list-match"), ("status", "status"))


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """(the config's folder, another folder to run from); neither is the other's parent."""
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    site.mkdir()
    elsewhere.mkdir()
    return site, elsewhere


def write_config(folder: Path, doc: dict[str, Any], name: str = "site.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def glite_site(site: Path, calls: Path, **state: Any) -> dict[str, Any]:
    """A director config whose every path is relative: the stand-ins in ``bin/`` beside it."""
    install_commands(site / "bin")
    scenario = write_scenario(
        site / "scenario.json",
        {
            "state_dir": str(site / "simstate"),
            "calls_log": str(calls),
            "default": {"behaviour": "healthy"},
            "hosts": {"wms02.example.org": {"behaviour": "unreachable"}},
        },
    )
    return {
        "director": {"cycle_seconds": 0.1, "max_threads": 2, "command_timeout": 30},
        "state": {"driver": "sqlite", **state},
        "backends": {
            "wms_glite": {
                "servers": ["wms01.example.org", "wms02.example.org"],
                # relative, with a "/": taken from the config's folder, not looked up on PATH
                "commands": {n: f"bin/glite-wms-job-{c}" for n, c in COMMANDS},
                "list_match": False,
                "env": {"GRIDGATE_SIM_SCENARIO": str(scenario)},
            }
        },
        "demand": {"static": {"wms_glite": 4}},
        "selectors": {"round_robin": {}},
        "notifiers": {
            "files": {},  # "": <director.state_dir>/notifications
            "email": {
                "host": "127.0.0.1",
                "port": free_port(),  # nothing listens: the mail waits in the outbox
                "from": "gridgate@example.org",
                "error_address": "ops@example.org",
                "outbox": "mail-outbox",
            },
        },
    }


def run_once(gridgate_exe: str, config: str, cwd: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [gridgate_exe, "run", "--once", "--json", "-c", config],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        # a PATH without the stand-ins: only the config's relative commands can find them
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stdout.splitlines()
    return json.loads(line)


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_director_run_from_another_folder_keeps_its_files_beside_the_config(
    gridgate_exe: str, folders: tuple[Path, Path], tmp_path: Path
) -> None:
    site, elsewhere = folders
    calls = tmp_path / "calls.jsonl"
    write_config(site, glite_site(site, calls))
    summary = run_once(gridgate_exe, "../site/site.yaml", elsewhere)

    assert summary["pilots_submitted"] > 0  # the relative commands were found
    assert [n["level"] for n in summary["notifications"]] == ["error"]  # wms02 unreachable
    assert files_under(elsewhere) == []  # nothing in the working directory
    state = site / "gridgate-state"
    assert (state / "state.db").is_file()
    (note,) = (state / "notifications").iterdir()
    assert "wms02.example.org" in note.read_text(encoding="utf-8")
    assert len(list((site / "mail-outbox" / "queue").glob("*.json"))) == 1  # SMTP is closed
    # the JDL of every submission was written in the state folder's wms_glite-jdl
    submits = [c for c in read_calls(calls) if c.command == "glite-wms-job-submit"]
    assert submits
    for call in submits:
        assert call.argv[0] == str(site / "bin" / "glite-wms-job-submit")
        (jdl,) = [a for a in call.argv if a.endswith(".jdl")]
        assert Path(jdl).parent == state / "wms_glite-jdl"
    assert stat.S_IMODE((state / "wms_glite-jdl").stat().st_mode) == 0o700


def test_the_state_folder_follows_state_path_when_only_that_is_written(
    gridgate_exe: str, folders: tuple[Path, Path], tmp_path: Path
) -> None:
    site, elsewhere = folders
    calls = tmp_path / "calls.jsonl"
    write_config(site, glite_site(site, calls, path="var/state.db"))
    summary = run_once(gridgate_exe, str(site / "site.yaml"), elsewhere)

    assert summary["pilots_submitted"] > 0
    var = site / "var"
    assert (var / "state.db").is_file()
    assert (var / "notifications").is_dir() and (var / "wms_glite-jdl").is_dir()
    assert not (site / "gridgate-state").exists() and files_under(elsewhere) == []
    jdls = [a for c in read_calls(calls) for a in c.argv if a.endswith(".jdl")]
    assert jdls and {Path(a).parent for a in jdls} == {var / "wms_glite-jdl"}
    # the same from a config loaded in this process: state_dir follows, work_dir stays None
    config = load_config(site / "site.yaml")
    assert config.director["state_dir"] == str(var)
    assert config["backends"]["wms_glite"]["work_dir"] is None


def test_a_written_state_dir_is_not_moved_by_state_path(folders: tuple[Path, Path]) -> None:
    site, _ = folders
    doc = {"director": {"state_dir": "files"}, "state": {"path": "db/state.db"}}
    config = load_config(write_config(site, doc))
    assert config.director["state_dir"] == str(site / "files")
    assert config["state"]["path"] == str(site / "db" / "state.db")


def test_absolute_home_and_empty_values_are_kept_bare_commands_stay_names(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    site, elsewhere = folders
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("HOME", "/home/pilot")
    doc = {
        "director": {"state_dir": "/var/lib/gridgate", "paused": True},
        "state": {"driver": "sqlite", "path": "~/state.db"},
        "backends": {
            "slurm": {
                "partitions": ["debug"],
                "script": "pilots/../pilot.sh",
                "commands": {"sbatch": "sbatch", "squeue": "./bin/squeue", "scancel": "~/sc"},
            },
            "arc": {"endpoints": ["https://ce.example.org:443/arex"], "script": "/opt/pilot.sh"},
            "wms_glite": {"servers": ["wms01.example.org"], "config_file": "glite.conf"},
        },
        "credentials": {"x509_proxy": {"path": "proxy/x509up", "renew": ["bin/renew", "x"]}},
        "notifiers": {"email": {"from": "a@example.org", "error_address": "b@example.org"}},
    }
    config = load_config(write_config(site, doc))
    slurm = config["backends"]["slurm"]
    assert config.director["state_dir"] == "/var/lib/gridgate"  # absolute: kept
    assert config["state"]["path"] == "/home/pilot/state.db"  # ~: expanded, not joined
    assert slurm["script"] == str(site / "pilot.sh")
    assert slurm["commands"] == {
        "sbatch": "sbatch",  # a name: looked up on PATH as before
        "squeue": str(site / "bin" / "squeue"),
        "scancel": "/home/pilot/sc",
        "scontrol": "scontrol",  # not given: its default name
        "sinfo": "sinfo",
    }
    assert config["backends"]["arc"]["script"] == "/opt/pilot.sh"
    assert config["backends"]["arc"]["commands"]["arcsub"] == "arcsub"
    assert config["backends"]["wms_glite"]["config_file"] == str(site / "glite.conf")
    assert config["backends"]["wms_glite"]["work_dir"] is None  # null: the default folder
    proxy = config["credentials"]["x509_proxy"]
    assert proxy["path"] == str(site / "proxy" / "x509up")
    assert proxy["renew"] == [str(site / "bin" / "renew"), "x"]  # the program, not its args
    assert config["notifiers"]["email"]["outbox"] == ""  # "": <state_dir>/outbox, unchanged


def test_a_linked_config_takes_paths_from_the_folder_its_name_is_in(
    folders: tuple[Path, Path],
) -> None:
    site, elsewhere = folders
    real = write_config(elsewhere, {"director": {"state_dir": "state", "paused": True}})
    (site / "site.yaml").symlink_to(real)
    assert load_config(site / "site.yaml").director["state_dir"] == str(site / "state")


def test_a_config_that_is_no_file_keeps_paths_relative_to_the_working_directory(
    tmp_path: Path,
) -> None:
    doc = {"director": {"paused": True}, "state": {"path": "db/s.db"}}
    text = yaml.safe_dump(doc)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(text, encoding="utf-8"))
    writer.start()
    try:
        assert config_folder(fifo) is None
        config = load_config(fifo)
    finally:
        writer.join(timeout=30)
    assert config.director["state_dir"] == "db"  # follows state.path, still relative
    # a file given as stdin is named /dev/stdin: its folder is not /dev
    (tmp_path / "site.yaml").write_text(text, encoding="utf-8")
    with open(tmp_path / "site.yaml", encoding="utf-8") as handle:
        assert config_folder(f"/proc/self/fd/{handle.fileno()}") is None
    assert config_folder(tmp_path / "site.yaml") == tmp_path
    assert config["state"]["path"] == "db/s.db"
    # a document validated without a file (tests, make_config) is left as written too
    written = {
        "director": {"state_dir": "here", "paused": True},
        "demand": {"file": {"path": "d.yaml"}},
    }
    checked = validate_document(written)
    assert checked.director["state_dir"] == "here"
    assert checked["demand"]["file"]["path"] == "d.yaml"


def test_errors_still_name_the_file_line_and_key_and_secret_files_are_found(
    gridgate_exe: str, folders: tuple[Path, Path]
) -> None:
    site, elsewhere = folders
    secret = site / "smtp-password"
    secret.write_text("s3cret\n", encoding="utf-8")
    secret.chmod(0o644)
    text = (
        "director: {paused: true}\n"
        "notifiers:\n"
        "  email:\n"
        "    from: a@example.org\n"
        "    error_address: b@example.org\n"
        "    username: gridgate\n"
        "    password: {file: smtp-password}\n"
        "backends:\n"
        "  wms_glite:\n"
        "    servers: [wms01.example.org]\n"
        "    work_dir: 5\n"
    )
    (site / "site.yaml").write_text(text, encoding="utf-8")

    def validate() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [gridgate_exe, "config", "validate", "../site/site.yaml"],
            cwd=elsewhere,
            capture_output=True,
            text=True,
            timeout=120,
        )

    bad = validate()
    assert bad.returncode == 2
    assert "../site/site.yaml:11: backends.wms_glite.work_dir: 5 is not of type" in bad.stderr
    (site / "site.yaml").write_text(text.replace("work_dir: 5", "work_dir: jdl"), "utf-8")
    # the secret file is the one beside the config (found from elsewhere, and refused)
    refused = validate()
    assert refused.returncode == 2, refused.stderr
    assert (
        f"../site/site.yaml:7: notifiers.email.password.file: secret file {secret} has mode 0644"
        in refused.stderr
    )
    secret.chmod(0o600)
    good = validate()
    assert good.returncode == 0, good.stderr
    with pytest.raises(ConfigError) as caught:
        load_config(site / "nowhere.yaml")
    assert str(caught.value).startswith(f"{site / 'nowhere.yaml'}:0: $: cannot read")


def _schemas() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for group in entry_points().groups:
        if not group.startswith("gridgate."):
            continue
        for ep in entry_points(group=group):
            schema = getattr(ep.load(), "config_schema", None)
            if isinstance(schema, dict):
                found.append((f"{group}:{ep.name}", schema))
    return found


#: Path-looking keys that are not paths on this machine: they name files where the job runs
#: (bsub -o/-e), or are a socket path or host:port (resolved by their own rules).
NOT_LOCAL = {"output", "error", "address", "socket_mode", "input_sandbox", "output_sandbox"}
LOOKS_LIKE_A_PATH = ("path", "file", "dir", "folder", "script", "outbox", "spool", "socket")


def _unmarked(schema: Any, where: str, out: list[str]) -> None:
    if not isinstance(schema, dict):
        return
    for name, sub in (schema.get("properties") or {}).items():
        if not isinstance(sub, dict):
            continue
        kinds = sub.get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        looks = any(word in name for word in LOOKS_LIKE_A_PATH) and name not in NOT_LOCAL
        if looks and "string" in kinds and not sub.get(PATH_KEYWORD):
            out.append(f"{where}.{name}")
        _unmarked(sub, f"{where}.{name}", out)
        if name == "commands":
            for command, spec in (sub.get("properties") or {}).items():
                if spec.get(PATH_KEYWORD) != "command":
                    out.append(f"{where}.commands.{command}")
    for key in ("items", "additionalProperties"):
        _unmarked(schema.get(key), f"{where}[]", out)
    for key in ("oneOf", "anyOf", "allOf"):
        for branch in schema.get(key) or []:
            _unmarked(branch, where, out)


def test_every_path_valued_key_of_every_plugin_is_marked() -> None:
    """A new plugin's ``script``, ``*_file``, ``*_dir`` or ``commands`` key without the mark
    would be taken from the working directory again: the newcomer's first trap."""
    unmarked: list[str] = []
    schemas = _schemas()
    assert len(schemas) > 20
    for name, schema in schemas:
        _unmarked(schema, name, unmarked)
    core, _classes, _problems = compose_schema({})
    _unmarked(core, "core", unmarked)
    assert unmarked == []


def test_resolve_paths_follows_lists_branches_and_mappings(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {
            "files": {"type": "array", "items": {"type": "string", PATH_KEYWORD: True}},
            "either": {
                "oneOf": [
                    {"type": "integer"},
                    {"type": "object", "properties": {"p": {"type": "string", PATH_KEYWORD: 1}}},
                ]
            },
            "named": {
                "type": "object",
                "additionalProperties": {"type": "string", PATH_KEYWORD: 1},
            },
        },
    }
    doc = {"files": ["a", "/b"], "either": {"p": "c/d"}, "named": {"x": "e"}}
    assert resolve_paths(doc, schema, tmp_path) == {
        "files": [str(tmp_path / "a"), "/b"],
        "either": {"p": str(tmp_path / "c" / "d")},
        "named": {"x": str(tmp_path / "e")},
    }
    assert resolve_paths(doc, schema, tmp_path / "other") == doc  # idempotent
    assert resolve_paths({"either": 3}, schema, tmp_path) == {"either": 3}


def test_the_reference_says_which_keys_are_paths() -> None:
    text = render()
    assert "takes a\nrelative value from the folder of the config file" in text
    rows = [line for line in text.splitlines() if line.startswith("| `state_dir` ")]
    assert rows and "path, from the config file's folder" in rows[0]
    squeue = [line for line in text.splitlines() if line.startswith("| `commands.squeue` ")]
    assert squeue and "a name on PATH, or a path from the config file's folder" in squeue[0]


def test_every_env_says_its_values_are_passed_as_written() -> None:
    """Issue 42: the docs did not say whether `env` values (X509_CERT_DIR: ../ce/certificates)
    are taken from the config file's folder as `script` and `renew` are. They are not (a value
    need not be a path), and every backend's `env` says so in the reference."""
    from gridgate.core.backend import ENV_AS_WRITTEN
    from gridgate.core.plugins import CONFIG_GROUPS, entry_point_names, load_class

    for name in entry_point_names(CONFIG_GROUPS["backends"]):
        schema = load_class(CONFIG_GROUPS["backends"], name).config_schema
        env = schema["properties"].get("env")
        if env is not None:
            assert ENV_AS_WRITTEN in env["description"], name
    root = Path(__file__).resolve().parents[2]
    reference = (root / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = [line for line in reference.splitlines() if line.startswith("| `env` |")]
    assert rows and all(ENV_AS_WRITTEN in row for row in rows), rows
