"""The files in deploy/ work together: the sample configs validate, the systemd units parse,
run existing gridgate sub-commands with the options they use, and agree with the configs on
paths and time limits; the logrotate snippet rotates the file the daemon writes."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = {
    "gridgate-director.service": ("run", "/etc/gridgate/site.yaml"),
    "gridgate-proxyd.service": ("lsfproxyd serve", "/etc/gridgate/proxyd.yaml"),
}
CONFIGS = {
    "/etc/gridgate/site.yaml": DEPLOY / "site.yaml",
    "/etc/gridgate/proxyd.yaml": DEPLOY / "proxyd.yaml",
}


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(
        interpolation=None, strict=True, comment_prefixes=("#", ";"), empty_lines_in_values=False
    )
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string((DEPLOY / "systemd" / name).read_text(encoding="utf-8"), source=name)
    return parser


def seconds(value: str) -> float:
    """systemd time spans as used here: 180s, 3min, 1min 30s, 90."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    for number, suffix in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[suffix]
    return total


def exec_words(parser: configparser.ConfigParser) -> tuple[str, list[str], list[str]]:
    """(program, sub-command words, their arguments) of ExecStart, global options dropped."""
    argv = shlex.split(parser["Service"]["ExecStart"])
    program, rest = argv[0], argv[1:]
    while rest and rest[0].startswith("-"):
        rest.pop(0)  # global options such as -v
    words = []
    while rest and not rest[0].startswith("-"):
        words.append(rest.pop(0))
    return program, words, rest


def test_sample_configs_validate(gridgate_exe: str) -> None:
    done = subprocess.run(
        [gridgate_exe, "config", "validate", *map(str, CONFIGS.values())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": valid") == 2


def test_site_config_has_eleven_wms_servers_email_and_ggus() -> None:
    from gridgate.core.config import load_config

    config = load_config(DEPLOY / "site.yaml")
    servers = config["backends"]["wms_glite"]["servers"]
    assert servers == [f"wms{i:02d}.example.org" for i in range(1, 12)]
    assert {"email", "ggus"} <= set(config["notifiers"])
    assert "mail" in config["notifiers"]["ggus"]["deliver"]  # so it leans on notifiers.email
    assert config["state"]["path"].startswith(config.director["state_dir"])


def test_site_config_admits_locally() -> None:
    from gridgate.core.config import load_config

    admission = load_config(DEPLOY / "site.yaml")["admission"]
    assert list(admission) == ["lsf_proxy"]
    assert admission["lsf_proxy"]["mode"] == "local"
    assert admission["lsf_proxy"]["categories"] == ["submission"]


@pytest.mark.parametrize("name", sorted(UNITS))
def test_unit_parses_and_runs_an_existing_sub_command(name: str, gridgate_exe: str) -> None:
    parser = unit(name)
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    program, words, args = exec_words(parser)
    assert Path(program).is_absolute() and Path(program).name == "gridgate"
    expected_words, config_path = UNITS[name]
    assert words == expected_words.split()
    assert args == ["-c", config_path]
    help_text = subprocess.run(
        [gridgate_exe, *words, "--help"], capture_output=True, text=True, timeout=60
    )
    assert help_text.returncode == 0, help_text.stderr
    assert "-c, --config" in help_text.stdout


@pytest.mark.parametrize("name", sorted(UNITS))
def test_unit_restart_policy_and_hardening(name: str) -> None:
    service = unit(name)["Service"]
    assert service["Restart"] == "on-failure" and seconds(service["RestartSec"]) > 0
    assert service["RestartPreventExitStatus"] == "2"  # a bad config does not fix itself
    assert service["KillMode"] == "mixed"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "User": "gridgate",
    }.items():
        assert service[key] == value, key
    assert service["User"] != "root"
    assert "/var/lib/gridgate" in service["ReadWritePaths"].split()


def test_director_stop_timeout_outlasts_the_commands_in_flight() -> None:
    from gridgate.core.config import load_config

    service = unit("gridgate-director.service")["Service"]
    config = load_config(DEPLOY / "site.yaml")
    backend = config["backends"]["wms_glite"]
    limit = backend.get("command_timeout") or config.director["command_timeout"]
    # one submission waits for its token, then runs list-match and submit: two commands,
    # each up to the limit
    commands = 2 if backend["list_match"] else 1
    token_wait = config["admission"]["lsf_proxy"]["token_wait_time"]
    demand = config["demand"]["static"]["wms_glite"]
    assert demand <= config.director["max_threads"]  # so one round of commands per iteration
    assert seconds(service["TimeoutStopSec"]) > token_wait + commands * limit + 30
    assert service["WorkingDirectory"] == config.director["state_dir"]


def test_proxyd_socket_and_logs_live_in_the_units_directories() -> None:
    from gridgate.core.config import load_config

    service = unit("gridgate-proxyd.service")["Service"]
    assert service["RuntimeDirectory"] == "gridgate" and service["RuntimeDirectoryMode"] == "0755"
    assert "RuntimeDirectory" not in unit("gridgate-director.service")["Service"]  # removed on stop
    section = load_config(DEPLOY / "proxyd.yaml")["proxyd"]
    writable = service["ReadWritePaths"].split()
    assert Path(section["socket"]).parent == Path("/run") / service["RuntimeDirectory"]
    assert Path(section["diagnose_file"]).parent == Path("/var/log") / service["LogsDirectory"]
    for key in ("socket", "diagnose_file", "blocklist_file"):
        assert any(Path(section[key]).is_relative_to(w) for w in writable), key
    assert service["ExecReload"].endswith("-HUP $MAINPID")


def test_logrotate_snippet_renames_the_diagnostic_log_and_reloads_the_daemon() -> None:
    from gridgate.core.config import load_config

    text = (DEPLOY / "logrotate" / "gridgate-proxyd").read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    match = re.search(r"^(\S+)\s*\{(.*?)^\}", body, re.M | re.S)
    assert match, "no 'PATH { ... }' block"
    path, directives = (
        match.group(1),
        {d.strip().split()[0] for d in match.group(2).splitlines() if d.strip()},
    )
    assert path == load_config(DEPLOY / "proxyd.yaml")["proxyd"]["diagnose_file"]
    # the daemon reopens its log on SIGHUP (test_proxyd_daemon::test_sighup_reopens_...), so
    # the file is renamed and the unit reloaded; copytruncate would lose lines
    assert "copytruncate" not in directives and "postrotate" in directives
    postrotate = re.search(r"postrotate\n(.*?)\n\s*endscript", match.group(2), re.S)
    assert postrotate and "systemctl reload gridgate-proxyd.service" in postrotate.group(1)
    assert (DEPLOY / "systemd" / "gridgate-proxyd.service").exists()
    assert {"rotate", "compress", "missingok"} <= directives


def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path, gridgate_exe: str) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze (Debian package systemd) is needed to verify the units"
    for name in UNITS:
        text = (DEPLOY / "systemd" / name).read_text(encoding="utf-8")
        # verify checks that ExecStart exists: point it at this environment's gridgate
        (tmp_path / name).write_text(text.replace("/opt/gridgate/bin/gridgate", gridgate_exe))
    done = subprocess.run(
        [analyze, "verify", *(str(tmp_path / n) for n in UNITS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
